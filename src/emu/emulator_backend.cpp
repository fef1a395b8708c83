#include "emu/emulator_backend.h"

#include <algorithm>

#include "core/check.h"
#include "plan/planner.h"
#include "plan/validator.h"
#include "sampling/host_sampler.h"
#include "sampling/token_mask.h"

namespace megadecode::emu {
namespace {

// The ring pool's blocks (models with sliding-window layers), cpu-ref's default.
int ring_blocks(const ModelConfig& config, const BackendOptions& options) {
  if (config.max_sliding_window() == 0) return 0;
  return options.n_ring_blocks > 0 ? options.n_ring_blocks : options.n_kv_blocks;
}

}  // namespace

CpuMkBackend::CpuMkBackend(const ModelConfig& config, const ModelWeights& weights,
                           std::shared_ptr<const void> weights_owner, const BackendOptions& options,
                           const EmulatorOptions& emulator)
    : config_((check_model_plannable(config), config)),
      weights_(weights),
      weights_owner_(std::move(weights_owner)),
      n_sms_(options.n_threads == 0 ? kDefaultSms : options.n_threads),
      emulator_options_(emulator),
      policy_(policy_by_name(options.policy)),
      kv_(config, options.kv_block_size, options.n_kv_blocks, ring_blocks(config, options)),
      emulator_(config_, weights_, kv_) {
  MD_REQUIRE(n_sms_ >= 1 && n_sms_ <= 132, "cpu-mk: emulated SMs (--threads) must be in 1..132, got ", n_sms_);
  // Several tiles of each op per emulated SM, and short attention splits: a CPU-sized model still
  // runs every path of the plan.
  policy_.tiles_per_sm = 3;
  policy_.attn_min_split_tokens = 64;
}

Plan CpuMkBackend::plan_step(const BatchState& batch, bool lm_head, bool sample) const {
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqState& q = batch.seqs[i];
    const size_t need = (static_cast<size_t>(q.n_ctx) + kv_.block_size() - 1) / kv_.block_size();
    for (size_t j = 0; j < std::min(need, q.block_table.size()); ++j)
      MD_REQUIRE(q.block_table[j] >= 0 && q.block_table[j] < kv_.n_blocks(), "cpu-mk: sequence ", i,
                 " block table entry ", j, " is ", q.block_table[j], ", outside [0, ", kv_.n_blocks(), ")");
    for (size_t j = 0; j < q.ring_table.size(); ++j)
      MD_REQUIRE(q.ring_table[j] >= 0 && q.ring_table[j] < kv_.n_ring_blocks(), "cpu-mk: sequence ", i,
                 " ring table entry ", j, " is ", q.ring_table[j], ", outside [0, ", kv_.n_ring_blocks(), ")");
  }
  PlanOptions o;
  o.n_sms = n_sms_;
  o.lm_head = lm_head;
  o.sample = sample;
  Plan plan = make_plan(config_, batch, policy_, o);
  validate_plan(plan);
  return plan;
}

void CpuMkBackend::set_routing_record(RoutingLog* log) {
  MD_REQUIRE(log == nullptr || (log->n_layers() == config_.n_layers && log->top_k() == config_.n_experts_per_tok),
             "cpu-mk: a routing record of ", log ? log->n_layers() : 0, " layers x ", log ? log->top_k() : 0,
             " experts for a model of ", config_.n_layers, " x ", config_.n_experts_per_tok);
  routing_record_ = log;
}

void CpuMkBackend::record_routing(const StepOutput& out, std::span<const std::pair<int64_t, int>> rows) {
  if (routing_record_ == nullptr) return;
  const size_t per_row = static_cast<size_t>(config_.n_layers) * config_.n_experts_per_tok;
  MD_CHECK(out.route_experts.size() == rows.size() * per_row);
  for (size_t i = 0; i < rows.size(); ++i)
    routing_record_->record(rows[i].first, rows[i].second,
                            std::span<const int32_t>(out.route_experts.data() + i * per_row, per_row),
                            std::span<const float>(out.route_weights.data() + i * per_row, per_row));
}

void CpuMkBackend::prefill(const SeqChunk& chunk, std::span<float> last_logits) {
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  MD_REQUIRE(last_logits.empty() || last_logits.size() == vocab, "prefill: last_logits holds ", last_logits.size(),
             " floats, expected 0 or vocab ", vocab);
  MD_REQUIRE(!chunk.tokens.empty(), "sequence ", chunk.seq_id, ": empty chunk");
  MD_REQUIRE(chunk.start_pos >= 0, "sequence ", chunk.seq_id, ": negative start position ", chunk.start_pos);
  for (int32_t t : chunk.tokens)
    MD_REQUIRE(t >= 0 && t < config_.vocab_size, "sequence ", chunk.seq_id, ": token id ", t,
               " outside the vocabulary [0, ", config_.vocab_size, ")");
  kv_.check_tables(chunk);  // both pools cover the chunk; no ring table without a ring pool
  StepOutput out;
  for (size_t i = 0; i < chunk.tokens.size(); ++i) {
    BatchState batch{kv_.block_size(), {{chunk.start_pos + static_cast<int>(i) + 1, chunk.block_table, chunk.ring_table}}};
    const bool last = i + 1 == chunk.tokens.size() && !last_logits.empty();
    const Plan plan = plan_step(batch, last, false);
    StepInput in;
    in.tokens = chunk.tokens.subspan(i, 1);
    in.batch = &batch;
    in.record_routing = routing_record_ != nullptr;
    emulator_.run(plan, in, emulator_options_, out);
    const std::pair<int64_t, int> row{chunk.seq_id, chunk.start_pos + static_cast<int>(i)};
    record_routing(out, {&row, 1});
    if (last) std::copy(out.logits.begin(), out.logits.end(), last_logits.begin());
  }
}

void CpuMkBackend::decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) {
  MD_REQUIRE(!seqs.empty(), "decode: no sequences");
  BatchState batch{kv_.block_size(), {}};
  std::vector<int32_t> tokens;
  std::vector<SamplingParams> sampling;
  for (const DecodeSeq& s : seqs) {
    MD_REQUIRE(s.chunk.tokens.size() == 1, "decode: sequence ", s.chunk.seq_id, " has ", s.chunk.tokens.size(),
               " tokens, expected exactly 1");
    MD_REQUIRE(s.chunk.tokens[0] >= 0 && s.chunk.tokens[0] < config_.vocab_size, "decode: sequence ",
               s.chunk.seq_id, ": token id ", s.chunk.tokens[0], " outside the vocabulary");
    MD_REQUIRE(s.chunk.start_pos >= 0, "decode: sequence ", s.chunk.seq_id, ": negative position");
    MD_REQUIRE(s.history_prompt_len <= s.history.size(), "decode: sequence ", s.chunk.seq_id,
               ": history_prompt_len ", s.history_prompt_len, " exceeds the history of ", s.history.size());
    sampling::validate(s.sampling);
    sampling::check_token_mask(s.allowed, static_cast<size_t>(config_.vocab_size));
    kv_.check_tables(s.chunk);
    batch.seqs.push_back({s.chunk.start_pos + 1, s.chunk.block_table, s.chunk.ring_table});
    tokens.push_back(s.chunk.tokens[0]);
    sampling.push_back(s.sampling);
  }
  const Plan plan = plan_step(batch, true, true);
  StepInput in;
  in.tokens = tokens;
  in.batch = &batch;
  in.sampling = sampling;
  in.sampler = [&seqs](int t, std::span<const float> logits) {
    const DecodeSeq& s = seqs[t];
    const sampling::TokenHistory history{s.history.first(s.history_prompt_len), s.history.subspan(s.history_prompt_len)};
    // The sampled token takes the position after the one just run.
    return sampling::sample_token(logits, s.sampling, s.chunk.start_pos + 1, history, s.allowed);
  };
  in.record_routing = routing_record_ != nullptr;
  StepOutput out;
  emulator_.run(plan, in, emulator_options_, out);
  std::vector<std::pair<int64_t, int>> rows;
  for (const DecodeSeq& s : seqs) rows.push_back({s.chunk.seq_id, s.chunk.start_pos});
  record_routing(out, rows);
  result.tokens = std::move(out.tokens);
  result.logits.clear();
  if (want_logits) result.logits = std::move(out.logits);
}

}  // namespace megadecode::emu
