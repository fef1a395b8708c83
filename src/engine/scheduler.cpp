// Scheduler: admission, chunked prefill, preemption, events (see scheduler.h); the decode steps
// and their overlap are in scheduler_decode.cpp.
#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"
#include "core/log.h"
#include "core/stopwatch.h"
#include "engine/logits.h"
#include "engine/sequence.h"

namespace megadecode {

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The block tables over the backend's two pools: full-attention layers' blocks, and for a model
// with sliding-window layers the rings (kv/kv_cache.h).
KvCache make_kv_cache(const Backend& backend, bool prefix_caching) {
  const int window = backend.config().max_sliding_window();
  const int ring_length = kv_ring_length(window, backend.kv_block_size());
  MD_REQUIRE((backend.n_ring_blocks() > 0) == (window > 0), "backend ", backend.name(), " stores ",
             backend.n_ring_blocks(), " ring blocks for a model whose largest sliding window is ", window,
             " keys (", backend.config().model_type, "): a model with sliding-window layers needs a ring pool, "
             "and one without needs none");
  return KvCache(backend.n_kv_blocks(), backend.kv_block_size(), prefix_caching, backend.n_ring_blocks(), ring_length);
}
}  // namespace

Scheduler::Scheduler(Backend& backend, const SchedulerConfig& config, TextDecoderFactory decoders,
                     EngineMetrics* metrics)
    : backend_(backend),
      config_(config),
      decoders_(std::move(decoders)),
      metrics_(metrics),
      kv_(make_kv_cache(backend, config.prefix_caching)),
      logits_(static_cast<size_t>(backend.config().vocab_size)),
      prompt_share_(PromptShare::Params{.ratio = config.mixed_itl_ratio}) {
  MD_REQUIRE(config_.max_num_seqs >= 1, "max_num_seqs must be at least 1, got ", config_.max_num_seqs);
  MD_REQUIRE(config_.max_prefill_tokens >= 1, "the prefill chunk must be at least 1 token, got ",
             config_.max_prefill_tokens);
  MD_REQUIRE(config_.mixed_itl_ratio > 1.0 && config_.mixed_itl_ratio <= 100.0,
             "the mixed steps' ITL ratio must be in (1, 100], got ", config_.mixed_itl_ratio);
  MD_CHECK(decoders_ != nullptr);
}

Scheduler::~Scheduler() { drain(); }

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
  drain();
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
  const Stopwatch iteration;
  times_ = StepTimes{.step = times_.step + 1};
  if (chain()) {
    ++n_chained_;
  } else {
    finish_in_flight();
    admit();
    prefill();  // prompts that do not ride in the decode step (rides_mixed)
    decode();
  }
  // The prompt share's estimates, from iterations that ran one decode step and no prefill call.
  if (times_.batch > 0 && times_.prefill_s == 0.0) {
    if (times_.mixed_tokens > 0) {
      prompt_share_.mixed_step(iteration.seconds(), times_.mixed_tokens);
    } else {
      prompt_share_.plain_step(iteration.seconds());
    }
  }
  // Scheduling is what the iteration spent outside the measured phases.
  times_.schedule_s = std::max(0.0, iteration.seconds() - times_.plan_s - times_.stage_s - times_.launch_s -
                                        times_.compute_s - times_.output_s - times_.wait_s - times_.prefill_s);
  const bool decoded = times_.batch > 0 || times_.n_processed > 0;
  if (decoded && config_.log_steps) log_info(step_line(times_));
  if (decoded && metrics_ != nullptr) metrics_->record_step(times_);
  publish_gauges();
  return true;
}

void Scheduler::publish_gauges() {
  if (metrics_ == nullptr) return;
  metrics_->n_running = n_running();
  metrics_->n_waiting = n_waiting();
  metrics_->kv_blocks_used = kv_.n_used();
  metrics_->kv_blocks_total = kv_.n_blocks();
  metrics_->kv_ring_blocks_used = kv_.n_ring_used();
  metrics_->kv_ring_blocks_total = kv_.n_ring_blocks();
}

KvAdmission Scheduler::head_admission() const {
  const Sequence& s = *waiting_.front();
  const int n = static_cast<int>(s.tokens.size());
  // The last token is always computed by decode; prompt logprobs need every prompt position's
  // logits, so such a prompt takes nothing from the cache.
  const bool want_prompt_lp = s.req.prompt_logprobs && !s.first_token_done;
  return kv_.plan_admission(s.tokens, want_prompt_lp ? 0 : n - 1, n);
}

void Scheduler::admit() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    KvAdmission plan = head_admission();
    if (!kv_.fits(plan)) break;  // FIFO: later requests do not overtake the head
    const int cached = kv_.admit(s.id, plan);
    s.n_computed = cached;
    if (!s.admitted_once) {
      s.admitted_once = true;
      s.n_cached = cached;
      if (metrics_ != nullptr) {
        metrics_->prefix_cache_queries += s.n_prompt;
        metrics_->prefix_cache_hits += cached;
      }
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    checkpoint();
  }
}

bool Scheduler::mixing() const { return config_.mixed_steps && backend_.max_mixed_prompt_rows() > 0; }

std::optional<Clock::time_point> Scheduler::oldest_stream() const {
  std::optional<Clock::time_point> oldest;
  for (const auto& s : running_)
    if (s->ready_to_decode() && s->first_token_done && (!oldest || s->first_token_time < *oldest))
      oldest = s->first_token_time;
  return oldest;
}

bool Scheduler::rides_mixed(const Sequence& s, std::optional<Clock::time_point> oldest) const {
  // Prompt logprobs need each position's logits, which a mixed step does not return.
  return mixing() && oldest && *oldest < s.req.arrival && !(s.req.prompt_logprobs && !s.first_token_done);
}

void Scheduler::prefill() {
  int budget = config_.max_prefill_tokens;
  const std::optional<Clock::time_point> oldest = oldest_stream();
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& s = *running_[i];
    const int target = static_cast<int>(s.tokens.size()) - 1;
    if (rides_mixed(s, oldest)) {
      ++i;
      continue;
    }
    bool failed = false;
    while (s.n_computed < target && budget > 0) {
      s.start(metrics_);
      const bool want_lp = s.req.prompt_logprobs && !s.first_token_done;
      // Prompt logprobs need each position's logits; prefill reports only the chunk's last.
      const int chunk = want_lp ? 1 : std::min(target - s.n_computed, budget);
      SeqChunk c{s.id, std::span<const int32_t>(s.tokens).subspan(s.n_computed, chunk), s.n_computed, kv_.table(s.id),
                 kv_.ring_table(s.id)};
      const Stopwatch prefill_time;
      try {
        backend_.prefill(c, want_lp ? std::span<float>(logits_) : std::span<float>());
        times_.prefill_s += prefill_time.seconds();
      } catch (const std::exception& e) {
        times_.prefill_s += prefill_time.seconds();
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

void Scheduler::preempt(size_t running_index) {
  MD_CHECK(running_[running_index]->n_in_flight == 0, "preempting a sequence with a step in flight");
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
      metrics_->request_prefill_time.observe(seconds(now - s.start_time));
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
    if (!s.first_token_done) s.first_token_time = now;
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
  remove_running(running_index);
}

void Scheduler::remove_running(size_t running_index) {
  std::unique_ptr<Sequence> s = std::move(running_[running_index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  s->ended = true;
  // A step in flight still holds a row of it: keep the record until that step is processed.
  if (s->n_in_flight > 0) retired_.push_back(std::move(s));
}

size_t Scheduler::running_index(const Sequence& seq) const {
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == &seq; });
  MD_CHECK(it != running_.end(), "sequence ", seq.id, " is not running");
  return static_cast<size_t>(it - running_.begin());
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
    MD_CHECK(kv_.ring_blocks_for(s->n_computed) <= static_cast<int>(kv_.ring_table(s->id).size()));
    MD_CHECK(!s->ended, "running sequence ", s->id, " has ended");
  }
  for (const auto& s : waiting_) MD_CHECK(!kv_.has(s->id) && s->n_in_flight == 0, "waiting sequence ", s->id, " holds blocks or a row in flight");
  for (const auto& s : retired_)
    MD_CHECK(s->ended && !kv_.has(s->id) && s->n_in_flight > 0, "retired sequence ", s->id, " is not an ended one in flight");
  // The step in flight writes each live row's position tokens.size() - 1: its block is held.
  if (in_flight_)
    for (const Sequence* s : in_flight_->rows) {
      MD_CHECK(s->n_in_flight >= 1, "sequence ", s->id, " in flight counts no step");
      if (s->ended) continue;
      MD_CHECK(s->ready_to_decode(), "sequence ", s->id, " in flight is not at its last token");
      MD_CHECK(kv_.blocks_for(static_cast<int>(s->tokens.size())) <= static_cast<int>(kv_.table(s->id).size()),
               "sequence ", s->id, "'s step in flight writes past its block table");
      MD_CHECK(kv_.ring_blocks_for(static_cast<int>(s->tokens.size())) <= static_cast<int>(kv_.ring_table(s->id).size()),
               "sequence ", s->id, "'s step in flight writes past its ring");
    }
}

}  // namespace megadecode
