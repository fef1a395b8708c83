// OutputProcessor: stop conditions and stop-string hold-back (see output_processor.h).
#include "engine/output_processor.h"

#include <algorithm>

#include "core/check.h"

namespace megadecode {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "error";
}

OutputProcessor::OutputProcessor(const StopConditions& stop, std::unique_ptr<TextDecoder> decoder)
    : stop_(stop), decoder_(std::move(decoder)) {
  MD_CHECK(decoder_ != nullptr);
  MD_CHECK(stop_.max_tokens >= 1);
  std::erase_if(stop_.stop, [](const std::string& s) { return s.empty(); });
  for (const std::string& s : stop_.stop) max_stop_bytes_ = std::max(max_stop_bytes_, s.size());
}

bool OutputProcessor::is_end_token(int32_t token) const {
  if (std::find(stop_.stop_token_ids.begin(), stop_.stop_token_ids.end(), token) != stop_.stop_token_ids.end())
    return true;
  return !stop_.ignore_eos &&
         std::find(stop_.eos_token_ids.begin(), stop_.eos_token_ids.end(), token) != stop_.eos_token_ids.end();
}

OutputProcessor::Step OutputProcessor::push(int32_t token, bool ends) {
  Step step;
  ++n_generated_;
  // The n-th token may end the sequence once n-1 >= min_tokens (vLLM: min_tokens tokens come
  // before any end token).
  if ((n_generated_ > stop_.min_tokens || ends) && is_end_token(token)) {
    step.finished = true;
    step.reason = FinishReason::kStop;
    if (std::find(stop_.stop_token_ids.begin(), stop_.stop_token_ids.end(), token) != stop_.stop_token_ids.end())
      step.stop_token = token;
    pending_ += decoder_->flush();
    if (!match_stop(step)) release(step, true);
    return step;
  }
  pending_ += decoder_->push(token);
  if (match_stop(step)) return step;
  if (ends || n_generated_ >= stop_.max_tokens) {
    pending_ += decoder_->flush();
    step.finished = true;
    step.reason = ends ? FinishReason::kStop : FinishReason::kLength;
    if (match_stop(step)) return step;
    release(step, true);
    return step;
  }
  release(step, false);
  return step;
}

bool OutputProcessor::match_stop(Step& step) {
  if (max_stop_bytes_ == 0) return false;
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  // Released text never holds the start of a match (it is at most max_stop_bytes - 1 behind the
  // end when released), so searching the held-back text finds every match.
  for (const std::string& s : stop_.stop) {
    size_t at = pending_.find(s);
    if (at < best) {
      best = at;
      which = &s;
    }
  }
  if (which == nullptr) return false;
  pending_.resize(best + (stop_.include_stop_str_in_output ? which->size() : 0));
  step.finished = true;
  step.reason = FinishReason::kStop;
  step.stop_string = *which;
  step.stop_token.reset();
  release(step, true);
  return true;
}

void OutputProcessor::release(Step& step, bool all) {
  size_t cut = pending_.size();
  if (!all) {
    const size_t hold = max_stop_bytes_ > 0 ? max_stop_bytes_ - 1 : 0;
    cut = pending_.size() > hold ? pending_.size() - hold : 0;
    // Never split a UTF-8 character: back up over continuation bytes.
    while (cut > 0 && cut < pending_.size() && (static_cast<unsigned char>(pending_[cut]) & 0xC0) == 0x80) --cut;
  }
  step.text += pending_.substr(0, cut);
  pending_.erase(0, cut);
}

}  // namespace megadecode
