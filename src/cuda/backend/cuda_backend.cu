// CudaBackend: per step, the path (engine/decode_path.h for `cuda`; fixed for the others), the rows
// checked once (engine/decode_rows.h), then the megakernel step (megakernel_step.h: plan, upload,
// one launch or one graph of waves, the error word) or the batched step (cuda/batched/batched_step.h:
// one upload, one graph launch, tokens back), enqueued; collect() waits for it. The host's part of a
// step it finishes at once (penalised rows, routing capture) is in cuda_backend_host.cu.
#include "cuda/backend/cuda_backend.h"

#include <algorithm>

#include "core/check.h"
#include "core/log.h"
#include "cuda/backend/device_fault.h"
#include "cuda/batched/batched_plan.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_info.h"
#include "engine/decode_rows.h"
#include "sampling/params.h"

namespace megadecode::cuda {

CudaBackend::CudaBackend(std::shared_ptr<const DeviceWeights> weights, const BackendOptions& options)
    : weights_(std::move(weights)), options_(options) {
  MD_REQUIRE(weights_ != nullptr, "CudaBackend needs weights");
  const std::string& b = options_.backend;
  MD_REQUIRE(b == "cuda" || b == "cuda-mk" || b == "cuda-ops" || b == "cuda-batched",
             "CudaBackend runs cuda, cuda-mk, cuda-ops or cuda-batched, not \"", b, "\"");
  check_backend_options(options_);
  const Policy policy = policy_by_name(options_.policy);
  const ModelConfig& c = config();
  check_supported(c);  // what the device paths run of the model
  last_path_ = b == "cuda-batched" ? DecodePath::kBatched : DecodePath::kMegakernel;
  // Before the KV cache is sized, so the prefill and batched workspaces count as used memory.
  if (options_.prefill_chunk > 0)
    prefill_ = std::make_unique<prefill::PrefillRunner>(c, weights_->view(), weights_->layers(), options_.prefill_chunk);
  if (b == "cuda" || b == "cuda-batched") {
    // Mixed steps carry prompt pieces beside the decode rows, up to the batched step's row limit
    // (not for cohere2_moe: the pieces' attention has no sliding window in the work-list mode a mixed
    // step runs; its prompts go through prefill() before the decode step, Backend::decode_mixed).
    const int prompt_rows =
        options_.prefill_chunk > 0 && c.block == BlockKind::kSequential
            ? std::max(0, std::min(options_.prefill_chunk,
                                   batched::BatchedStep::kMaxRows - batched::row_bucket(options_.max_batch)))
            : 0;
    batched_ = std::make_unique<batched::BatchedStep>(c, weights_->view(), weights_->layers(), options_.max_batch,
                                                      prompt_rows);
  }
  const int sms = sm_count();
  n_sms_ = options_.n_sms > 0 ? std::min(options_.n_sms, sms) : sms;
  if (b != "cuda-batched") {
    megakernel_ = std::make_unique<MegakernelStep>(
        c, weights_->view(), policy,
        MegakernelOptions{.name = b, .n_sms = n_sms_, .per_op = b == "cuda-ops",
                          .wait_timeout_ms = options_.wait_timeout_ms, .kernel_flags = options_.kernel_flags});
  }
  allocate_kv();
  const int chain_rows = std::max(options_.max_batch, MegakernelStep::kMaxBatch);
  CUDA_CHECK(cudaMalloc(&chain_, chain_rows * sizeof(int32_t)));
  CUDA_CHECK(cudaMemset(chain_, 0, chain_rows * sizeof(int32_t)));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // The memsets of allocate_kv ran on the legacy stream, which stream_ (non-blocking) does not wait for.
  CUDA_CHECK(cudaDeviceSynchronize());
  fault_step_ = device_fault_step_from_env();
  if (fault_step_ >= 0)
    log_warn(name(), ": test hook MEGADECODE_TEST_DEVICE_FAULT_STEP: decode step ", fault_step_, " faults");
}

CudaBackend::~CudaBackend() {
  if (stream_) CUDA_CHECK_NOTHROW(cudaStreamSynchronize(stream_));  // steps never collected
  megakernel_.reset();
  batched_.reset();
  prefill_.reset();
  CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
  CUDA_CHECK_NOTHROW(cudaFree(kv_));
  CUDA_CHECK_NOTHROW(cudaFree(kv_ring_));
  CUDA_CHECK_NOTHROW(cudaFree(chain_));
}

void CudaBackend::set_routing_capture(RoutingLog* log) {
  const ModelConfig& c = config();
  MD_REQUIRE(log == nullptr || (log->n_layers() == c.n_layers && log->top_k() == c.n_experts_per_tok),
             "routing capture: a log of ", log ? log->n_layers() : 0, " layers x ", log ? log->top_k() : 0,
             " experts for a model of ", c.n_layers, " x ", c.n_experts_per_tok);
  routing_log_ = log;
  if (prefill_) prefill_->set_routing_capture(log != nullptr);
  if (batched_) batched_->set_routing_capture(log != nullptr);
  if (megakernel_) megakernel_->set_routing_capture(log != nullptr);
}

void CudaBackend::prefill(const SeqChunk& chunk, std::span<float> last_logits) {
  MD_REQUIRE(!chunk.tokens.empty(), "prefill: empty chunk");
  if (ring_len_ == 0) require_no_ring_table(chunk, name());
  MD_REQUIRE(last_logits.empty() || last_logits.size() == static_cast<size_t>(config().vocab_size),
             "prefill: last_logits has ", last_logits.size(), " floats, vocab is ", config().vocab_size);
  if (prefill_) {
    const int n = static_cast<int>(chunk.tokens.size()), piece = options_.prefill_chunk;
    const prefill::KvCacheView kv = kv_view();
    // All of it, the ring table included, before any piece runs.
    (void)prefill_->check(chunk.tokens, chunk.start_pos, chunk.block_table, kv, chunk.ring_table);
    for (int i = 0; i < prefill::prefill_n_pieces(n, piece); ++i) {
      const int b = prefill::prefill_piece_begin(i, piece), len = prefill::prefill_piece_length(i, n, piece);
      const bool last = b + len == n;
      prefill_->run(chunk.tokens.subspan(b, len), chunk.start_pos + b, chunk.block_table, kv,
                    last ? last_logits : std::span<float>(), stream_, chunk.ring_table);
      if (routing_log_) {
        std::vector<int32_t> ids;
        std::vector<float> w;
        prefill_->read_routing(len, ids, w);
        record_routing(chunk.seq_id, chunk.start_pos + b, len, ids.data(), w.data());
      }
    }
    return;
  }
  // The decode path one token at a time (prefill_chunk = 0).
  DecodeResult r;
  for (size_t i = 0; i < chunk.tokens.size(); ++i) {
    DecodeSeq s;
    s.chunk.seq_id = chunk.seq_id;
    s.chunk.tokens = chunk.tokens.subspan(i, 1);
    s.chunk.start_pos = chunk.start_pos + static_cast<int>(i);
    s.chunk.block_table = chunk.block_table;
    s.chunk.ring_table = chunk.ring_table;
    s.sampling.temperature = 0.0f;
    const bool last = i + 1 == chunk.tokens.size();
    decode(std::span<const DecodeSeq>(&s, 1), last && !last_logits.empty(), r);
    if (last && !last_logits.empty()) std::copy(r.logits.begin(), r.logits.end(), last_logits.begin());
  }
}

int CudaBackend::max_decode_batch() const {
  return batched_ ? options_.max_batch : std::min(MegakernelStep::kMaxBatch, options_.max_batch);
}

void CudaBackend::decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) {
  collect(decode_async(seqs, want_logits), result);
}

int CudaBackend::max_mixed_prompt_rows() const { return batched_ ? batched_->max_prompt_rows() : 0; }

void CudaBackend::decode_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, bool want_logits,
                               DecodeResult& result) {
  collect(decode_async_mixed(prompts, seqs, want_logits), result);
}

DecodeTicket CudaBackend::decode_async_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs,
                                             bool want_logits) {
  MD_REQUIRE(!seqs.empty() && static_cast<int>(seqs.size()) <= max_decode_batch(), "decode: batch of ", seqs.size(),
             " sequences; ", name(), " runs 1..", max_decode_batch());
  const bool mixed = !prompts.empty() && max_mixed_prompt_rows() > 0;
  if (!prompts.empty() && !mixed) {  // no mixed steps here: the pieces first, as Backend::decode_mixed
    for (const SeqChunk& p : prompts) prefill(p, {});
    prompts = {};
  }
  for (const SeqChunk& p : prompts) require_no_ring_table(p, name());
  bool host_finishes = routing_log_ != nullptr, want_logprobs = false;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DecodeSeq& s = seqs[i];
    host_finishes |= s.sampling.has_penalties();
    want_logprobs |= s.logprobs >= 0;
    MD_REQUIRE(s.logprobs <= kMaxTopLogprobs, "decode: row ", i, " asks for ", s.logprobs,
               " top logprobs; the device gives at most ", kMaxTopLogprobs);
    if (mixed) require_no_ring_table(s.chunk, name());
    if (s.prev_row < 0) continue;
    MD_REQUIRE(s.prev_row < chain_rows_, "decode: row ", i, " takes row ", s.prev_row, " of the previous step, which had ",
               chain_rows_);
    MD_REQUIRE(!s.sampling.has_penalties(), "decode: row ", i,
               " is chained to the previous step but has penalties (its history would lack that token)");
  }
  const int B = static_cast<int>(seqs.size());
  // A mixed step runs on the batched step whatever the batch.
  const DecodePath path = !batched_ ? DecodePath::kMegakernel
                          : !megakernel_ || mixed ? DecodePath::kBatched
                                                  : path_policy_.choose(B);
  if (host_finishes)  // the host reads this step's device state after it: every older step first
    for (Pending& p : pending_)
      if (!p.finished) finish(p);
  maybe_fault();
  launch_step(path, prompts, seqs, want_logits, want_logprobs);
  last_path_ = path;
  chain_rows_ = B;
  Pending& step = pending_.emplace_back();
  step.id = next_ticket_++;
  step.path = path;
  if (want_logprobs)
    for (const DecodeSeq& s : seqs) step.logprobs.push_back(s.logprobs);
  DecodeTicket ticket{step.id, {}};
  if (path == DecodePath::kMegakernel) {
    ticket.times.plan_s = megakernel_->last_plan_seconds();
    ticket.times.stage_s = megakernel_->last_stage_seconds();
  }
  if (host_finishes) complete_on_host(prompts, seqs, step);
  return ticket;
}

int CudaBackend::max_device_logprobs() const { return kMaxTopLogprobs; }

void CudaBackend::launch_step(DecodePath path, std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs,
                              bool want_logits, bool want_logprobs) {
  const BatchState batch = check_decode_rows(seqs, config(), n_kv_blocks_, options_.kv_block_size,
                                             RingPoolShape{ring_len_, n_ring_blocks_});
  if (path == DecodePath::kMegakernel) {
    megakernel_->launch(seqs, batch, kv_view(), stream_, chain_, want_logits, want_logprobs);
    return;
  }
  std::vector<batched::PromptPiece> pieces;
  for (const SeqChunk& p : prompts) pieces.push_back(batched::PromptPiece{p.tokens, p.start_pos, p.block_table});
  std::vector<batched::StepRow> rows(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DecodeSeq& s = seqs[i];
    rows[i] = batched::StepRow{s.prev_row >= 0 ? 0 : s.chunk.tokens[0], s.chunk.start_pos, s.chunk.block_table,
                               s.sampling, s.chunk.ring_table, s.allowed, s.prev_row};
  }
  batched_->launch(rows, pieces, kv_view(), stream_, chain_, want_logits, want_logprobs);
}

void CudaBackend::finish(Pending& step) {
  step.finished = true;
  std::vector<RowLogprobs> lp;
  try {
    if (step.path == DecodePath::kBatched) {
      batched_->finish(step.result.tokens, step.result.logits, lp);
    } else {
      megakernel_->finish(step.result.tokens, step.result.logits, lp);
    }
  } catch (...) {
    step.error = std::current_exception();  // collect() rethrows it for this step's ticket
    return;
  }
  step.result.logprobs.clear();
  if (step.logprobs.empty()) return;
  MD_CHECK(lp.size() == step.logprobs.size());
  step.result.logprobs.resize(lp.size());
  for (size_t i = 0; i < lp.size(); ++i) {
    if (step.logprobs[i] < 0) continue;
    TokenLogprob& t = step.result.logprobs[i];
    t.token = lp[i].token;
    t.logprob = lp[i].logprob;
    for (int k = 0; k < step.logprobs[i]; ++k) t.top.push_back(TopLogprob{lp[i].ids[k], lp[i].logprobs[k]});
  }
}

void CudaBackend::collect(DecodeTicket ticket, DecodeResult& result) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.id == ticket.id; });
  MD_REQUIRE(it != pending_.end(), "collect: ticket ", ticket.id, " is not a step in flight");
  for (auto older = pending_.begin(); older != it; ++older)  // the device finishes them first anyway
    if (!older->finished) finish(*older);
  Pending step = std::move(*it);
  pending_.erase(it);
  if (!step.finished) finish(step);
  if (step.error) std::rethrow_exception(step.error);
  result = std::move(step.result);
}

void CudaBackend::maybe_fault() {
  if (fault_step_ >= 0 && n_decode_steps_++ == fault_step_) launch_illegal_address_write(stream_);
}

}  // namespace megadecode::cuda
