// Scheduler: admission, chunked prefill, batched decode, preemption (see scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"
#include "core/log.h"
#include "engine/logits.h"

namespace megadecode {

struct Scheduler::Sequence {
  Sequence(int64_t seq_id, SequenceRequest&& r, std::unique_ptr<TextDecoder> decoder)
      : id(seq_id), req(std::move(r)), tokens(req.prompt), n_prompt(static_cast<int>(req.prompt.size())),
        out(req.stop, std::move(decoder)) {
    for (int32_t t : req.stop.stop_token_ids) banned.push_back(t);
    if (!req.stop.ignore_eos)
      for (int32_t t : req.stop.eos_token_ids) banned.push_back(t);
    if (req.prompt_logprobs) prompt_lp.assign(n_prompt, std::nullopt);
  }
  int64_t id;
  SequenceRequest req;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int n_prompt;
  int n_computed = 0;  // tokens whose KV is written; the last token is always uncomputed
  int n_cached = 0;    // prompt tokens served from the prefix cache at the first admission
  bool admitted_once = false;
  bool first_token_done = false;
  OutputProcessor out;
  std::vector<int32_t> banned;  // end tokens, kept from sampling before min_tokens
  std::vector<std::optional<TokenLogprob>> prompt_lp;  // [n_prompt] with prompt_logprobs
  Clock::time_point last_token_time;

  bool ready_to_decode() const { return n_computed == static_cast<int>(tokens.size()) - 1; }
  bool has_penalties() const { return req.sampling.has_penalties(); }
};

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

Scheduler::Scheduler(Backend& backend, const SchedulerConfig& config, TextDecoderFactory decoders,
                     EngineMetrics* metrics)
    : backend_(backend),
      config_(config),
      decoders_(std::move(decoders)),
      metrics_(metrics),
      kv_(backend.n_kv_blocks(), backend.kv_block_size(), config.prefix_caching),
      logits_(static_cast<size_t>(backend.config().vocab_size)) {
  MD_REQUIRE(config_.max_num_seqs >= 1, "max_num_seqs must be at least 1, got ", config_.max_num_seqs);
  MD_REQUIRE(config_.max_prefill_tokens >= 1, "the prefill chunk must be at least 1 token, got ",
             config_.max_prefill_tokens);
  MD_CHECK(decoders_ != nullptr);
}

Scheduler::~Scheduler() = default;

void Scheduler::add(SequenceRequest request) {
  MD_CHECK(!request.prompt.empty(), "empty prompt reached the scheduler");
  std::unique_ptr<TextDecoder> decoder = decoders_(request.stop.skip_special_tokens);
  auto seq = std::make_unique<Sequence>(next_seq_id_++, std::move(request), std::move(decoder));
  waiting_.push_back(std::move(seq));
  publish_gauges();
  checkpoint();
}

void Scheduler::abort(uint64_t request_id) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->req.request_id == request_id) {
      end_sequence(**it, FinishReason::kAbort, "");
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  for (size_t i = 0; i < running_.size();) {
    if (running_[i]->req.request_id == request_id)
      finish_running(i, FinishReason::kAbort, "");
    else
      ++i;
  }
  publish_gauges();
  checkpoint();
}

void Scheduler::abort_all(FinishReason reason, const std::string& message) {
  while (!running_.empty()) finish_running(running_.size() - 1, reason, message);
  while (!waiting_.empty()) {
    end_sequence(*waiting_.front(), reason, message);
    waiting_.pop_front();
  }
  publish_gauges();
  checkpoint();
}

bool Scheduler::step() {
  if (idle()) {
    publish_gauges();
    return false;
  }
  admit();
  prefill();
  decode();
  publish_gauges();
  return true;
}

void Scheduler::publish_gauges() {
  if (metrics_ == nullptr) return;
  metrics_->n_running = n_running();
  metrics_->n_waiting = n_waiting();
  metrics_->kv_blocks_used = kv_.n_used();
  metrics_->kv_blocks_total = kv_.n_blocks();
}

void Scheduler::admit() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    const int n = static_cast<int>(s.tokens.size());
    // The last token is always computed by decode; prompt logprobs need every prompt position's
    // logits, so such a prompt takes nothing from the cache.
    const bool want_prompt_lp = s.req.prompt_logprobs && !s.first_token_done;
    KvAdmission plan = kv_.plan_admission(s.tokens, want_prompt_lp ? 0 : n - 1, n);
    if (!kv_.fits(plan)) break;  // FIFO: later requests do not overtake the head
    const int cached = kv_.admit(s.id, plan);
    s.n_computed = cached;
    if (!s.admitted_once) {
      s.admitted_once = true;
      s.n_cached = cached;
      if (metrics_ != nullptr) {
        metrics_->request_queue_time.observe(seconds(Clock::now() - s.req.arrival));
        metrics_->prefix_cache_queries += s.n_prompt;
        metrics_->prefix_cache_hits += cached;
      }
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    checkpoint();
  }
}

void Scheduler::prefill() {
  int budget = config_.max_prefill_tokens;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& s = *running_[i];
    const int target = static_cast<int>(s.tokens.size()) - 1;
    bool failed = false;
    while (s.n_computed < target && budget > 0) {
      const bool want_lp = s.req.prompt_logprobs && !s.first_token_done;
      // Prompt logprobs need each position's logits; prefill reports only the chunk's last.
      const int chunk = want_lp ? 1 : std::min(target - s.n_computed, budget);
      SeqChunk c{s.id, std::span<const int32_t>(s.tokens).subspan(s.n_computed, chunk), s.n_computed, kv_.table(s.id)};
      try {
        backend_.prefill(c, want_lp ? std::span<float>(logits_) : std::span<float>());
      } catch (const std::exception& e) {
        log_error("prefill of sequence ", s.id, " failed: ", e.what());
        finish_running(i, FinishReason::kError, e.what());
        failed = true;
        break;
      }
      if (want_lp) {
        const int next = s.n_computed + 1;
        s.prompt_lp[next] = token_logprob(logits_, s.tokens[next], std::max(0, s.req.logprobs));
      }
      s.n_computed += chunk;
      budget -= chunk;
      kv_.commit(s.id, s.tokens, s.n_computed);
      checkpoint();
    }
    if (!failed) ++i;
  }
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

  std::vector<Sequence*> batch;
  std::vector<DecodeSeq> seqs;
  bool want_logits = false;
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (!s.ready_to_decode()) continue;
    DecodeSeq d;
    const int pos = static_cast<int>(s.tokens.size()) - 1;
    d.chunk = SeqChunk{s.id, std::span<const int32_t>(s.tokens).subspan(pos, 1), pos, kv_.table(s.id)};
    d.sampling = s.req.sampling;
    if (s.has_penalties()) {
      d.history = s.tokens;
      d.history_prompt_len = static_cast<size_t>(s.n_prompt);
    }
    want_logits |= s.req.logprobs >= 0 || (s.out.end_tokens_banned() && !s.banned.empty());
    batch.push_back(&s);
    seqs.push_back(d);
  }
  if (batch.empty()) return;

  DecodeResult result;
  try {
    backend_.decode(seqs, want_logits, result);
  } catch (const std::exception& e) {
    log_error("decode step of ", batch.size(), " sequences failed: ", e.what());
    for (Sequence* s : batch) {
      auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == s; });
      finish_running(static_cast<size_t>(it - running_.begin()), FinishReason::kError, e.what());
    }
    return;
  }
  const size_t vocab = logits_.size();
  MD_CHECK(result.tokens.size() == batch.size(), "backend returned ", result.tokens.size(), " tokens for ",
           batch.size(), " sequences");
  MD_CHECK(!want_logits || result.logits.size() == batch.size() * vocab, "backend returned ", result.logits.size(),
           " logits for ", batch.size(), " x ", vocab);

  std::vector<Sequence*> done;
  for (size_t b = 0; b < batch.size(); ++b) {
    Sequence& s = *batch[b];
    int32_t token = result.tokens[b];
    MD_CHECK(token >= 0 && static_cast<size_t>(token) < vocab, "backend sampled token ", token);
    std::span<const float> row;
    if (want_logits) row = std::span<const float>(result.logits).subspan(b * vocab, vocab);
    if (s.out.end_tokens_banned() && s.out.is_end_token(token)) {
      const int32_t again = sample_with_bans(row, s.req.sampling, static_cast<int64_t>(s.tokens.size()), s.tokens,
                                             static_cast<size_t>(s.n_prompt), s.banned);
      if (again >= 0) token = again;
    }
    s.n_computed = static_cast<int>(s.tokens.size());
    kv_.commit(s.id, s.tokens, s.n_computed);
    s.tokens.push_back(token);
    std::vector<TokenLogprob> lps;
    if (s.req.logprobs >= 0) lps.push_back(token_logprob(row, token, s.req.logprobs));
    OutputProcessor::Step step;
    std::string error;
    try {
      step = s.out.push(token);
    } catch (const std::exception& e) {
      // Detokenization failed for this sequence only: end it, keep the batch going.
      step = OutputProcessor::Step{};
      step.finished = true;
      step.reason = FinishReason::kError;
      error = e.what();
    }
    const bool finished = step.finished;
    emit(s, std::move(step), {token}, std::move(lps), error);
    if (finished) done.push_back(&s);
  }
  for (Sequence* s : done) {
    kv_.free(s->id);
    std::erase_if(running_, [&](const auto& p) { return p.get() == s; });
  }
  checkpoint();
}

void Scheduler::preempt(size_t running_index) {
  std::unique_ptr<Sequence> s = std::move(running_[running_index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  kv_.free(s->id);
  s->n_computed = 0;
  ++n_preemptions_;
  if (metrics_ != nullptr) ++metrics_->preemptions;
  log_debug("preempted sequence ", s->id, " at ", s->tokens.size(), " tokens");
  waiting_.push_front(std::move(s));
  checkpoint();
}

void Scheduler::emit(Sequence& s, OutputProcessor::Step&& step, std::vector<int32_t> tokens,
                     std::vector<TokenLogprob> logprobs, const std::string& error) {
  const Clock::time_point now = Clock::now();
  if (metrics_ != nullptr && !tokens.empty()) {
    if (!s.first_token_done) {
      metrics_->time_to_first_token.observe(seconds(now - s.req.arrival));
      metrics_->prompt_tokens += s.n_prompt;
    } else {
      metrics_->inter_token_latency.observe(seconds(now - s.last_token_time));
    }
    metrics_->generation_tokens += tokens.size();
  }
  SeqOutput o;
  o.request_id = s.req.request_id;
  o.index = s.req.index;
  if (!tokens.empty()) {
    if (!s.first_token_done && s.req.prompt_logprobs) o.prompt_logprobs = std::move(s.prompt_lp);
    s.first_token_done = true;
    s.last_token_time = now;
  }
  o.tokens = std::move(tokens);
  o.text = std::move(step.text);
  o.logprobs = std::move(logprobs);
  o.finished = step.finished;
  o.finish_reason = step.reason;
  o.stop_string = std::move(step.stop_string);
  o.stop_token = step.stop_token;
  o.error = error;
  o.n_prompt_tokens = s.n_prompt;
  o.n_cached_tokens = s.n_cached;
  o.n_completion_tokens = s.out.n_generated();
  if (o.finished && metrics_ != nullptr) {
    ++metrics_->finished[static_cast<size_t>(o.finish_reason)];
    metrics_->e2e_request_latency.observe(seconds(now - s.req.arrival));
    metrics_->request_prompt_tokens.observe(s.n_prompt);
    metrics_->request_generation_tokens.observe(s.out.n_generated());
  }
  if (s.req.sink) s.req.sink->on_output(std::move(o));
}

void Scheduler::end_sequence(Sequence& s, FinishReason reason, const std::string& error) {
  OutputProcessor::Step step;
  step.finished = true;
  step.reason = reason;
  emit(s, std::move(step), {}, {}, error);
}

void Scheduler::finish_running(size_t running_index, FinishReason reason, const std::string& error) {
  Sequence& s = *running_[running_index];
  kv_.free(s.id);
  end_sequence(s, reason, error);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
}

void Scheduler::check_invariants() const {
  kv_.check_invariants();
  MD_CHECK(static_cast<int>(running_.size()) <= config_.max_num_seqs);
  MD_CHECK(kv_.n_seqs() == running_.size(), "KV holds ", kv_.n_seqs(), " tables for ", running_.size(),
           " running sequences");
  for (const auto& s : running_) {
    MD_CHECK(kv_.has(s->id), "running sequence ", s->id, " holds no blocks");
    MD_CHECK(s->n_computed < static_cast<int>(s->tokens.size()), "sequence ", s->id, " computed its last token");
    MD_CHECK(kv_.blocks_for(s->n_computed) <= static_cast<int>(kv_.table(s->id).size()));
  }
  for (const auto& s : waiting_) MD_CHECK(!kv_.has(s->id), "waiting sequence ", s->id, " holds blocks");
}

}  // namespace megadecode
