// Scheduler: the decode steps — the plain step (launch, collect, process), the chained step of the
// overlapped loop (launch step N+1, then collect and process step N), and output processing.
#include <algorithm>

#include "core/check.h"
#include "core/log.h"
#include "core/stopwatch.h"
#include "engine/logits.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"

namespace megadecode {

bool Scheduler::overlapping() const {
  return config_.overlap == Overlap::kAlways || (config_.overlap == Overlap::kAuto && backend_.runs_async());
}

void Scheduler::decode() {
  // Every sequence about to decode needs a block for its next position; take them from the
  // newest running sequences when the pool is dry.
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    if (!s.ready_to_decode()) continue;
    while (!kv_.ensure(s.id, static_cast<int>(s.tokens.size()))) {
      const size_t victim = running_.size() - 1;
      preempt(victim);
      if (victim == i) break;
    }
    checkpoint();
  }

  std::vector<Sequence*> rows;
  std::vector<DecodeSeq> seqs;
  bool want_logits = false;
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (!s.ready_to_decode()) continue;
    s.start(metrics_);
    DecodeSeq d;
    const int pos = static_cast<int>(s.tokens.size()) - 1;
    d.chunk = SeqChunk{s.id, std::span<const int32_t>(s.tokens).subspan(pos, 1), pos, kv_.table(s.id),
                       kv_.ring_table(s.id)};
    d.sampling = s.req.sampling;
    if (s.has_penalties()) {
      d.history = s.tokens;
      d.history_prompt_len = static_cast<size_t>(s.n_prompt);
    }
    if (s.constrained()) {  // the tokens this step may sample: the constraint's mask after every token so far
      s.mask.assign(token_mask_words(static_cast<int>(logits_.size())), 0u);
      s.req.constraint->fill_mask(s.mask);
      d.allowed = s.mask;
    }
    d.logprobs = s.req.logprobs;
    want_logits |= s.req.logprobs > backend_.max_device_logprobs() || s.host_may_resample();
    rows.push_back(&s);
    seqs.push_back(d);
  }
  if (rows.empty()) return;
  std::vector<std::pair<Sequence*, int>> pieces = prompt_pieces(rows);  // none unless mixing (rides_mixed)

  std::string error;
  in_flight_ = launch(rows, seqs, want_logits, error, pieces);
  if (!in_flight_) {
    for (Sequence* s : rows) finish_running(running_index(*s), FinishReason::kError, error);
    for (auto [s, n] : pieces)
      if (!s->ended) finish_running(running_index(*s), FinishReason::kError, error);
    return;
  }
  if (!overlapping()) finish_in_flight();
}

std::vector<std::pair<Scheduler::Sequence*, int>> Scheduler::prompt_pieces(const std::vector<Sequence*>& rows) {
  std::vector<std::pair<Sequence*, int>> pieces;
  // Prompts that arrived while a stream was generating (rides_mixed), first come, first served, as
  // many tokens as keep the step within the ITL bound (PromptShare).
  const std::optional<Clock::time_point> oldest = oldest_stream();
  int share = prompt_share_.tokens(std::min(config_.max_prefill_tokens, backend_.max_mixed_prompt_rows()));
  for (auto& sp : running_) {  // admission order
    if (share <= 0) break;
    Sequence& s = *sp;
    const int target = static_cast<int>(s.tokens.size()) - 1;
    if (s.ended || s.n_computed >= target || !rides_mixed(s, oldest)) continue;
    if (std::find(rows.begin(), rows.end(), &s) != rows.end()) continue;
    const int n = std::min(target - s.n_computed, share);
    s.start(metrics_);
    pieces.push_back({&s, n});
    share -= n;
  }
  return pieces;
}

// Step N+1 over the rows of step N (in flight), each taking the token step N sampled for it.
bool Scheduler::chain() {
  if (!in_flight_ || !overlapping()) return false;
  const std::vector<Sequence*>& rows = in_flight_->rows;
  // The batch stays: every running sequence is a live row (none ended, none being prefilled) ...
  if (rows.size() != running_.size()) return false;
  // A constrained row's mask depends on the token step N samples: it never chains either.
  for (const Sequence* s : rows)
    if (s->ended || s->has_penalties() || s->host_may_resample() || s->constrained()) return false;
  // ... and nothing waiting could be admitted now.
  if (!waiting_.empty() && static_cast<int>(running_.size()) < config_.max_num_seqs && kv_.fits(head_admission()))
    return false;
  // Step N+1 writes position tokens.size() (step N's token) of every row.
  for (const Sequence* s : rows)
    if (!kv_.ensure(s->id, static_cast<int>(s->tokens.size()) + 1)) return false;
  checkpoint();

  std::vector<DecodeSeq> seqs(rows.size());
  bool want_logits = false;
  for (size_t r = 0; r < rows.size(); ++r) {
    const Sequence& s = *rows[r];
    DecodeSeq& d = seqs[r];
    d.chunk = SeqChunk{s.id, {}, static_cast<int>(s.tokens.size()), kv_.table(s.id), kv_.ring_table(s.id)};
    d.sampling = s.req.sampling;
    d.prev_row = static_cast<int>(r);
    d.logprobs = s.req.logprobs;
    want_logits |= s.req.logprobs > backend_.max_device_logprobs();
  }
  std::string error;
  std::optional<InFlight> next = launch(rows, seqs, want_logits, error);
  times_.chained = next.has_value();
  InFlight previous = std::move(*in_flight_);
  in_flight_ = std::move(next);
  complete(previous);
  if (!in_flight_) {
    // The launch failed: step N's tokens are out; its rows that still run end with the error.
    for (Sequence* s : previous.rows)
      if (!s->ended) finish_running(running_index(*s), FinishReason::kError, error);
  }
  return true;
}

std::optional<Scheduler::InFlight> Scheduler::launch(std::vector<Sequence*> rows, std::span<const DecodeSeq> seqs,
                                                     bool want_logits, std::string& error,
                                                     std::vector<std::pair<Sequence*, int>> pieces) {
  const Stopwatch call;
  InFlight step;
  try {
    if (pieces.empty()) {
      step.ticket = backend_.decode_async(seqs, want_logits);
    } else {
      std::vector<SeqChunk> prompts;
      for (auto [s, n] : pieces)
        prompts.push_back(SeqChunk{s->id, std::span<const int32_t>(s->tokens).subspan(s->n_computed, n), s->n_computed,
                                   kv_.table(s->id), kv_.ring_table(s->id)});
      step.ticket = backend_.decode_async_mixed(prompts, seqs, want_logits);
    }
  } catch (const std::exception& e) {
    times_.launch_s += call.seconds();
    log_error("decode step of ", rows.size(), " sequences failed: ", e.what());
    error = e.what();
    return std::nullopt;
  }
  const DecodeTimes& t = step.ticket.times;
  times_.plan_s += t.plan_s;
  times_.stage_s += t.stage_s;
  times_.compute_s += t.compute_s;
  times_.launch_s += std::max(0.0, call.seconds() - t.plan_s - t.stage_s - t.compute_s);
  times_.batch = static_cast<int>(rows.size());
  for (Sequence* s : rows) ++s->n_in_flight;
  for (auto [s, n] : pieces) {
    ++s->n_in_flight;
    times_.mixed_tokens += n;
  }
  step.rows = std::move(rows);
  step.pieces = std::move(pieces);
  return step;
}

void Scheduler::finish_in_flight() {
  if (!in_flight_) return;
  InFlight step = std::move(*in_flight_);
  in_flight_.reset();
  complete(step);
}

// Collects the step and processes its tokens; its rows are released whatever happens.
void Scheduler::complete(InFlight& step) {
  struct Release {
    Scheduler* self;
    const InFlight& step;
    ~Release() { self->release(step); }
  } release{this, step};
  DecodeResult result;
  const Stopwatch wait;
  try {
    backend_.collect(step.ticket, result);
  } catch (const std::exception& e) {
    times_.wait_s += wait.seconds();
    log_error("decode step of ", step.rows.size(), " sequences failed: ", e.what());
    for (Sequence* s : step.rows)
      if (!s->ended) finish_running(running_index(*s), FinishReason::kError, e.what());
    for (auto [s, n] : step.pieces)
      if (!s->ended) finish_running(running_index(*s), FinishReason::kError, e.what());
    return;
  }
  times_.wait_s += wait.seconds();
  const Stopwatch output;
  // The prompt pieces' K/V is written: their sequences advance (unless they ended meanwhile).
  for (auto [s, n] : step.pieces) {
    if (s->ended) continue;
    s->n_computed += n;
    kv_.commit(s->id, s->tokens, s->n_computed);
  }
  process(step, result);
  times_.output_s += output.seconds();
}

void Scheduler::process(const InFlight& step, const DecodeResult& result) {
  const std::vector<Sequence*>& rows = step.rows;
  const size_t vocab = logits_.size();
  MD_CHECK(result.tokens.size() == rows.size(), "backend returned ", result.tokens.size(), " tokens for ",
           rows.size(), " sequences");
  const bool have_logits = !result.logits.empty();
  MD_CHECK(!have_logits || result.logits.size() == rows.size() * vocab, "backend returned ", result.logits.size(),
           " logits for ", rows.size(), " x ", vocab);
  MD_CHECK(result.logprobs.empty() || result.logprobs.size() == rows.size(), "backend returned ",
           result.logprobs.size(), " logprobs for ", rows.size(), " sequences");

  std::vector<Sequence*> done;
  for (size_t b = 0; b < rows.size(); ++b) {
    Sequence& s = *rows[b];
    if (s.ended) continue;  // stopped or aborted after this step was launched: the token is discarded
    ++times_.n_processed;
    int32_t token = result.tokens[b];
    MD_CHECK(token >= 0 && static_cast<size_t>(token) < vocab, "backend sampled token ", token);
    std::span<const float> row;
    if (have_logits) row = std::span<const float>(result.logits).subspan(b * vocab, vocab);
    if (s.out.end_tokens_banned() && s.out.is_end_token(token)) {
      // With a constraint, only among the tokens its mask allows; when it allows nothing but the
      // banned end tokens, the end token stays (and ends the sequence below) rather than hang.
      MD_CHECK(have_logits, "sequence ", s.id, " needs its logits to resample a banned end token");
      const std::span<const uint32_t> allowed = s.constrained() ? s.mask : std::span<const uint32_t>();
      const int32_t again = sample_with_bans(row, s.req.sampling, static_cast<int64_t>(s.tokens.size()), s.tokens,
                                             static_cast<size_t>(s.n_prompt), s.banned, allowed);
      if (again >= 0) token = again;
    }
    bool ends = false;  // the constraint ends the sequence with this token
    if (s.constrained()) {
      std::string refused;
      if (!advance_constraint(s, token, ends, refused)) {
        finish_running(running_index(s), FinishReason::kError, refused);
        continue;
      }
    }
    s.n_computed = static_cast<int>(s.tokens.size());
    kv_.commit(s.id, s.tokens, s.n_computed);
    s.tokens.push_back(token);
    std::vector<TokenLogprob> lps;
    if (s.req.logprobs >= 0) {
      // The backend's, unless the host sampled another token (a banned end token: the logits came).
      if (b < result.logprobs.size() && result.logprobs[b].token == token) {
        lps.push_back(result.logprobs[b]);
      } else {
        MD_CHECK(have_logits, "sequence ", s.id, " asked for logprobs; the step returned neither them nor logits");
        lps.push_back(token_logprob(row, token, s.req.logprobs));
      }
    }
    OutputProcessor::Step out;
    std::string error;
    try {
      out = s.out.push(token, ends);
    } catch (const std::exception& e) {
      // Detokenization failed for this sequence only: end it, keep the batch going.
      out = OutputProcessor::Step{};
      out.finished = true;
      out.reason = FinishReason::kError;
      error = e.what();
    }
    const bool finished = out.finished;
    emit(s, std::move(out), {token}, std::move(lps), error);
    if (finished) done.push_back(&s);
  }
  for (Sequence* s : done) {
    kv_.free(s->id);
    remove_running(running_index(*s));
  }
  checkpoint();
}

// A constrained sequence's sampled token: an end token ends it (allowed by its mask: the text is
// complete, or the mask allowed nothing else); any other goes to accept(), and ends the sequence
// when the constraint is finished after it. False, with `error` naming the backend, when the token
// is one the mask did not allow (a backend bug).
bool Scheduler::advance_constraint(Sequence& s, int32_t token, bool& ends, std::string& error) {
  const bool allowed = token_mask_allows(s.mask.data(), token);
  if (s.out.is_end_token(token) && allowed) {
    ends = true;
    return true;
  }
  if (!allowed || !s.req.constraint->accept(token)) {
    error = cat("backend ", backend_.name(), " sampled token ", token, " for sequence ", s.id,
                ", which its token constraint does not allow");
    log_error(error);
    return false;
  }
  ends = s.req.constraint->finished();
  return true;
}

void Scheduler::release(const InFlight& step) {
  for (Sequence* s : step.rows) --s->n_in_flight;
  for (auto [s, n] : step.pieces) --s->n_in_flight;
  std::erase_if(retired_, [](const auto& s) { return s->n_in_flight == 0; });
}

// Collects the step in flight and drops its tokens (shutdown: every sequence is about to end).
void Scheduler::drain() {
  if (!in_flight_) return;
  InFlight step = std::move(*in_flight_);
  in_flight_.reset();
  DecodeResult ignored;
  try {
    backend_.collect(step.ticket, ignored);
  } catch (const std::exception& e) {
    log_warn("decode step in flight at shutdown failed: ", e.what());
  }
  release(step);
}

}  // namespace megadecode
