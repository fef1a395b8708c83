// NullBackend: cuda-mk's host work per decode step, without the device (see null_backend.h).
#include "bench/null_backend.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/check.h"
#include "core/stopwatch.h"
#include "engine/decode_rows.h"
#include "plan/planner.h"
#include "plan/step_upload.h"

namespace megadecode {

NullBackend::NullBackend(const ModelConfig& config, const BackendOptions& options, const NullBackendOptions& null)
    : config_(config),
      block_size_(options.kv_block_size),
      n_kv_blocks_(options.n_kv_blocks),
      null_(null),
      policy_(policy_by_name(null.policy)),
      planner_(config, policy_, PlanOptions{.n_sms = null.n_sms}) {
  check_backend_options(options);
  MD_REQUIRE(n_kv_blocks_ > 0, "the null backend needs n_kv_blocks > 0");
  MD_REQUIRE(null_.device_us >= 0.0, "device time must be >= 0 us, got ", null_.device_us);
  MD_REQUIRE(!null_.token_cycle.empty(), "the null backend needs tokens to return");
  for (int32_t t : null_.token_cycle)
    MD_REQUIRE(t >= 0 && t < config_.vocab_size, "null backend: token ", t, " outside the vocabulary");
}

void NullBackend::prefill(const SeqChunk& chunk, std::span<float> last_logits) {
  MD_REQUIRE(!chunk.tokens.empty(), "prefill: empty chunk");
  require_no_ring_table(chunk, name());
  const size_t need = (static_cast<size_t>(chunk.start_pos) + chunk.tokens.size() + block_size_ - 1) / block_size_;
  MD_REQUIRE(chunk.block_table.size() >= need, "prefill: the block table covers ", chunk.block_table.size(),
             " blocks, ", need, " needed");
  std::fill(last_logits.begin(), last_logits.end(), 0.0f);
}

void NullBackend::decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) {
  collect(decode_async(seqs, want_logits), result);
}

DecodeTicket NullBackend::decode_async(std::span<const DecodeSeq> seqs, bool want_logits) {
  MD_REQUIRE(!seqs.empty(), "decode: no sequences");
  MD_REQUIRE(in_flight_.size() < 2, "null backend: more than two steps in flight");
  DecodeTicket ticket{next_ticket_++, {}};
  const BatchState batch = check_rows(seqs);
  if (seqs.size() <= static_cast<size_t>(kMaxMegakernelBatch)) {
    stage_megakernel_step(batch, ticket.times);
  } else {
    const Stopwatch stage;
    stage_batched_step(batch);
    ticket.times.stage_s = stage.seconds();
  }
  // The launch: the device starts the step when it is free and the inputs are there.
  Step step{ticket.id, {}, {}, want_logits};
  const Time now = std::chrono::steady_clock::now();
  const auto run = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::micro>(null_.device_us));
  device_free_at_ = std::max(now, device_free_at_) + run;
  step.done_at = device_free_at_;
  step.tokens.resize(seqs.size());
  const size_t n = null_.token_cycle.size();
  for (size_t i = 0; i < seqs.size(); ++i) {
    step.tokens[i] = null_.token_cycle[static_cast<size_t>(seqs[i].chunk.start_pos + 1) % n];
    step.logprobs.push_back(seqs[i].logprobs);
  }
  in_flight_.push_back(std::move(step));
  return ticket;
}

void NullBackend::collect(DecodeTicket ticket, DecodeResult& result) {
  MD_REQUIRE(!in_flight_.empty() && in_flight_.front().ticket == ticket.id, "collect: ticket ", ticket.id,
             " is not the oldest step in flight");
  Step step = std::move(in_flight_.front());
  in_flight_.pop_front();
  // The one copy back: wait for the device, then the tokens (and logits) arrive.
  if (std::chrono::steady_clock::now() < step.done_at) std::this_thread::sleep_until(step.done_at);
  result.tokens = std::move(step.tokens);
  result.logits.clear();
  if (step.want_logits) {
    const size_t V = static_cast<size_t>(config_.vocab_size);
    result.logits.assign(result.tokens.size() * V, 0.0f);
    for (size_t i = 0; i < result.tokens.size(); ++i) result.logits[i * V + static_cast<size_t>(result.tokens[i])] = 1.0f;
  }
  // The device's logprobs as CudaBackend hands them over: the token's and its top ones a row.
  result.logprobs.clear();
  if (null_.device_logprobs < 0) return;
  if (std::none_of(step.logprobs.begin(), step.logprobs.end(), [](int k) { return k >= 0; })) return;
  result.logprobs.resize(result.tokens.size());
  for (size_t i = 0; i < result.tokens.size(); ++i) {
    if (step.logprobs[i] < 0) continue;
    TokenLogprob& t = result.logprobs[i];
    t.token = result.tokens[i];
    t.logprob = -0.5f;
    for (int k = 0; k < step.logprobs[i]; ++k) t.top.push_back(TopLogprob{k == 0 ? t.token : k, -1.0f - k});
  }
}

BatchState NullBackend::check_rows(std::span<const DecodeSeq> seqs) {
  tokens_.resize(seqs.size());
  sampling_.resize(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    tokens_[i] = seqs[i].prev_row >= 0 ? -1 - seqs[i].prev_row : seqs[i].chunk.tokens[0];
    sampling_[i] = seqs[i].sampling;
  }
  return check_decode_rows(seqs, config_, n_kv_blocks_, block_size_);
}

void NullBackend::stage_megakernel_step(const BatchState& batch, DecodeTimes& times) {
  const Stopwatch plan_time;
  const Plan* plan = nullptr;
  bool lists_changed = true;
  if (null_.patch_plan) {
    plan = &planner_.plan(batch);
    lists_changed = planner_.last_update().lists_changed;
  } else {
    fresh_ = make_plan(config_, batch, policy_, PlanOptions{.n_sms = null_.n_sms});
    plan = &fresh_;
    // What cuda-mk does with a fresh plan: compare the task lists with what the device holds.
    lists_changed = device_tasks_.size() != plan->tasks.size() ||
                    std::memcmp(device_tasks_.data(), plan->tasks.data(), plan->tasks.size() * sizeof(Task)) != 0;
  }
  times.plan_s = plan_time.seconds();

  const Stopwatch stage;
  std::vector<uint8_t>& buf = staging_[next_staging_];
  next_staging_ ^= 1;
  buf.resize(step_inputs_bytes(*plan));
  pack_step_inputs(*plan, batch, tokens_, sampling_, buf);
  if (lists_changed || !null_.patch_plan) {
    // cuda-mk recomputes the launch ranges every step; patched plans only when the lists changed.
    device_ranges_ = launch_ranges(*plan);
  }
  if (lists_changed) device_tasks_ = plan->tasks;  // the task upload
  times.stage_s = stage.seconds();
}

// The batched path's host work: per row its token, position, block table row and sampling
// parameters, packed for one upload; nothing else (its kernels take the batch as it comes).
void NullBackend::stage_batched_step(const BatchState& batch) {
  const size_t n = batch.seqs.size();
  size_t max_blocks = 1;
  for (const SeqState& q : batch.seqs) max_blocks = std::max(max_blocks, q.block_table.size());
  std::vector<uint8_t>& buf = staging_[next_staging_];
  next_staging_ ^= 1;
  const size_t tok_at = 0, pos_at = n * 4, bt_at = 2 * n * 4, sp_at = (2 + max_blocks) * n * 4;
  buf.assign(sp_at + n * sizeof(SamplingParams), 0);
  std::memcpy(buf.data() + tok_at, tokens_.data(), n * 4);
  for (size_t i = 0; i < n; ++i) {
    const int32_t pos = batch.seqs[i].n_ctx - 1;
    std::memcpy(buf.data() + pos_at + i * 4, &pos, 4);
    std::memcpy(buf.data() + bt_at + i * max_blocks * 4, batch.seqs[i].block_table.data(),
                batch.seqs[i].block_table.size() * 4);
  }
  std::memcpy(buf.data() + sp_at, sampling_.data(), n * sizeof(SamplingParams));
}

}  // namespace megadecode
