// CudaBackend: per step, the path (engine/decode_path.h for `cuda`; fixed for the others), then
// either the megakernel — plan (src/plan) → upload inputs and task lists → zero counters and the
// error word → one megakernel launch (cuda-mk) or one launch per wave in a CUDA graph (cuda-ops)
// → check the device error word (naming the counter on a timeout) → read tokens and logits — or
// the batched step (cuda/batched/batched_step.h: one upload, one graph launch, tokens back).
#include "cuda/backend/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "cuda/batched/batched_plan.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_marks.h"
#include "cuda/common/device_info.h"
#include "cuda/megakernel/launch.h"
#include "kv/kv_cache.h"
#include "engine/kv_pools.h"
#include "plan/planner.h"
#include "sampling/host_sampler.h"
#include "sampling/params.h"

namespace megadecode::cuda {
namespace {

constexpr size_t kActivationReserve = size_t(512) << 20;  // arena, plan and staging headroom
constexpr int kMkMaxBatch = 64;  // sequences per megakernel step (its token groups)

template <typename T>
void grow(T*& ptr, size_t& capacity, size_t need) {
  if (need <= capacity) return;
  CUDA_CHECK(cudaFree(ptr));
  CUDA_CHECK(cudaMalloc(&ptr, need * sizeof(T)));
  capacity = need;
}

}  // namespace

CudaBackend::CudaBackend(std::shared_ptr<const DeviceWeights> weights, const BackendOptions& options)
    : weights_(std::move(weights)),
      options_(options),
      per_op_(options.backend == "cuda-ops"),
      has_megakernel_(options.backend != "cuda-batched"),
      has_batched_(options.backend == "cuda" || options.backend == "cuda-batched"),
      policy_(policy_by_name(options.policy)) {
  MD_REQUIRE(weights_ != nullptr, "CudaBackend needs weights");
  MD_REQUIRE(options_.backend == "cuda" || options_.backend == "cuda-mk" || per_op_ || options_.backend == "cuda-batched",
             "CudaBackend runs cuda, cuda-mk, cuda-ops or cuda-batched, not \"", options_.backend, "\"");
  check_backend_options(options_);
  check_supported(weights_->config());  // what the device paths run of the model
  last_path_ = has_megakernel_ ? DecodePath::kMegakernel : DecodePath::kBatched;
  // Before the KV cache is sized, so the prefill and batched workspaces count as used memory.
  if (options_.prefill_chunk > 0) {
    prefill_ = std::make_unique<prefill::PrefillRunner>(weights_->config(), weights_->view(), weights_->layers(),
                                                        options_.prefill_chunk);
  }
  if (has_batched_) {
    // Mixed steps carry prompt pieces beside the decode rows, up to the batched step's row limit
    // (not for cohere2_moe: the pieces' attention has no sliding window in the work-list mode a mixed
    // step runs; its prompts go through prefill() before the decode step, Backend::decode_mixed).
    const int prompt_rows =
        options_.prefill_chunk > 0 && weights_->config().block == BlockKind::kSequential
            ? std::max(0, std::min(options_.prefill_chunk,
                                   batched::BatchedStep::kMaxRows - batched::row_bucket(options_.max_batch)))
            : 0;
    batched_ = std::make_unique<batched::BatchedStep>(weights_->config(), weights_->view(), weights_->layers(),
                                                      options_.max_batch, prompt_rows);
  }
  const ModelConfig& c = config();
  const int sms = sm_count();
  n_sms_ = options_.n_sms > 0 ? std::min(options_.n_sms, sms) : sms;
  planner_ = std::make_unique<StepPlanner>(c, policy_, PlanOptions{.n_sms = n_sms_});
  // Sliding-window layers keep their K/V in a ring pool (cpu-ref's layout: kv/kv_cache.h), the
  // full-attention layers in the full pool; each pool has a slice for its own layers only
  // (MkLayerWeights::kv_full_index, kv_ring_index). engine/kv_pools.h sizes them: the ring pool gets
  // min(full blocks, max_decode_batch() rings) unless --n-ring-blocks says otherwise.
  const KvPoolShape pools = kv_pool_shape(c, options_.kv_block_size, 2);
  n_full_layers_ = pools.n_full_layers;
  n_ring_layers_ = pools.n_ring_layers;
  ring_len_ = pools.ring_length;
  MD_REQUIRE(n_full_layers_ > 0, "model_type ", c.model_type, " has no full-attention layer (every layer has a sliding "
             "window): the CUDA backends need at least one; use backend cpu-ref");
  double budget = 0.0;
  if (options_.n_kv_blocks == 0) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    budget = options_.gpu_memory_utilization * static_cast<double>(total_b) - static_cast<double>(total_b - free_b) -
             static_cast<double>(kActivationReserve);
    // The smallest useful pool: a full block for each sequence of the largest batch, and a ring
    // block for each (at least one whole ring).
    const double minimal = static_cast<double>(pools.full_block_bytes) * max_decode_batch() +
                           static_cast<double>(pools.ring_block_bytes) *
                               (options_.n_ring_blocks > 0 ? options_.n_ring_blocks
                                                           : std::max(max_decode_batch(), pools.ring_length));
    MD_REQUIRE(budget >= minimal, "the KV cache does not fit: the model and workspaces leave ",
               static_cast<int64_t>(std::max(budget, 0.0)) >> 20, " MiB of the ",
               static_cast<int64_t>(options_.gpu_memory_utilization * static_cast<double>(total_b)) >> 20,
               " MiB --gpu-memory-utilization ", options_.gpu_memory_utilization, " allows (", free_b >> 20,
               " MiB free of ", total_b >> 20, "); a minimal pool (one block per sequence of ", max_decode_batch(),
               ") needs ", static_cast<int64_t>(minimal) >> 20, " MiB: raise --gpu-memory-utilization or lower "
               "--max-num-seqs or --block-size");
  }
  const KvPoolSizes sizes =
      size_kv_pools(pools, budget, max_decode_batch(), options_.n_kv_blocks, options_.n_ring_blocks);
  n_kv_blocks_ = static_cast<int>(sizes.n_blocks);
  MD_REQUIRE(n_kv_blocks_ >= 1, "the KV cache has no block");
  CUDA_CHECK(cudaMalloc(&kv_, static_cast<size_t>(pools.full_block_bytes) * n_kv_blocks_));
  CUDA_CHECK(cudaMemset(kv_, 0, static_cast<size_t>(pools.full_block_bytes) * n_kv_blocks_));
  if (n_ring_layers_ > 0) {
    n_ring_blocks_ = static_cast<int>(sizes.n_ring_blocks);
    MD_REQUIRE(n_ring_blocks_ >= ring_len_, "the KV ring pool of ", n_ring_blocks_, " blocks is smaller than one ring (",
               ring_len_, " blocks of ", options_.kv_block_size, " tokens for the sliding window of ",
               c.max_sliding_window(), ")");
    CUDA_CHECK(cudaMalloc(&kv_ring_, static_cast<size_t>(pools.ring_block_bytes) * n_ring_blocks_));
    CUDA_CHECK(cudaMemset(kv_ring_, 0, static_cast<size_t>(pools.ring_block_bytes) * n_ring_blocks_));
  }
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMalloc(&error_, sizeof(MkError)));
  CUDA_CHECK(cudaMallocHost(&error_host_, sizeof(MkError)));
  // The memsets above ran on the legacy stream, which stream_ (non-blocking) does not wait for.
  CUDA_CHECK(cudaDeviceSynchronize());
}

CudaBackend::~CudaBackend() {
  if (bench_exec_) cudaGraphExecDestroy(bench_exec_);
  cudaFree(trace_);
  cudaFree(trace_counts_);
  if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
  if (graph_) cudaGraphDestroy(graph_);
  cudaStreamDestroy(stream_);
  cudaFree(kv_);
  cudaFree(kv_ring_);
  cudaFree(arena_);
  cudaFree(counters_);
  cudaFree(tasks_);
  cudaFree(ranges_);
  cudaFree(error_);
  cudaFreeHost(error_host_);
  cudaFreeHost(staging_);
  cudaFree(route_ids_);
  cudaFree(route_w_);
}

void CudaBackend::set_routing_capture(RoutingLog* log) {
  const ModelConfig& c = config();
  MD_REQUIRE(log == nullptr || (log->n_layers() == c.n_layers && log->top_k() == c.n_experts_per_tok),
             "routing capture: a log of ", log ? log->n_layers() : 0, " layers x ", log ? log->top_k() : 0,
             " experts for a model of ", c.n_layers, " x ", c.n_experts_per_tok);
  routing_log_ = log;
  if (prefill_) prefill_->set_routing_capture(log != nullptr);
  if (batched_) batched_->set_routing_capture(log != nullptr);
  if (log != nullptr && route_ids_ == nullptr) {
    const size_t n = static_cast<size_t>(kMkMaxBatch) * c.n_layers * c.n_experts_per_tok;
    CUDA_CHECK(cudaMalloc(&route_ids_, n * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&route_w_, n * sizeof(float)));
    // The megakernel writes no capture for a dense layer (the host records it as expert -1, weight
    // 0 after the copy): defined bytes, so that copying them reads nothing uninitialised.
    CUDA_CHECK(cudaMemset(route_ids_, 0, n * sizeof(int32_t)));
    CUDA_CHECK(cudaMemset(route_w_, 0, n * sizeof(float)));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void CudaBackend::record_routing(int64_t seq, int first_pos, int n_tokens, const int32_t* experts,
                                 const float* weights) {
  const size_t per = static_cast<size_t>(config().n_layers) * config().n_experts_per_tok;
  for (int i = 0; i < n_tokens; ++i)
    routing_log_->record(seq, first_pos + i, std::span(experts + i * per, per), std::span(weights + i * per, per));
}

size_t CudaBackend::kv_cache_elements() const {
  const ModelConfig& c = config();
  return static_cast<size_t>(n_full_layers_) * 2 * n_kv_blocks_ * c.n_kv_heads * options_.kv_block_size * c.head_dim;
}

size_t CudaBackend::kv_ring_elements() const {
  const ModelConfig& c = config();
  return static_cast<size_t>(n_ring_layers_) * 2 * n_ring_blocks_ * c.n_kv_heads * options_.kv_block_size * c.head_dim;
}

void CudaBackend::check_ring_table(const SeqChunk& chunk) const {
  if (ring_len_ == 0) require_no_ring_table(chunk, name());
}

void CudaBackend::prefill(const SeqChunk& chunk, std::span<float> last_logits) {
  MD_REQUIRE(!chunk.tokens.empty(), "prefill: empty chunk");
  check_ring_table(chunk);
  MD_REQUIRE(last_logits.empty() || last_logits.size() == static_cast<size_t>(config().vocab_size),
             "prefill: last_logits has ", last_logits.size(), " floats, vocab is ", config().vocab_size);
  if (prefill_) {
    const int n = static_cast<int>(chunk.tokens.size()), piece = options_.prefill_chunk;
    const prefill::KvCacheView kv{kv_, n_kv_blocks_, options_.kv_block_size, kv_ring_, n_ring_blocks_, ring_len_};
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

int CudaBackend::max_decode_batch() const { return has_batched_ ? options_.max_batch : std::min(kMkMaxBatch, options_.max_batch); }

void CudaBackend::decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) {
  MD_REQUIRE(!seqs.empty() && static_cast<int>(seqs.size()) <= max_decode_batch(), "decode: batch of ", seqs.size(),
             " sequences; ", name(), " runs 1..", max_decode_batch());
  for (const DecodeSeq& s : seqs) check_ring_table(s.chunk);
  const int B = static_cast<int>(seqs.size());
  const DecodePath path = !has_batched_    ? DecodePath::kMegakernel
                          : !has_megakernel_ ? DecodePath::kBatched
                                             : path_policy_.choose(B);
  last_path_ = path;
  if (path == DecodePath::kBatched) {
    decode_batched({}, seqs, want_logits, result);
  } else {
    decode_megakernel(seqs, want_logits, result);
  }
}

int CudaBackend::max_mixed_prompt_rows() const { return batched_ ? batched_->max_prompt_rows() : 0; }

void CudaBackend::decode_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, bool want_logits,
                               DecodeResult& result) {
  if (max_mixed_prompt_rows() == 0 || prompts.empty()) return Backend::decode_mixed(prompts, seqs, want_logits, result);
  for (const SeqChunk& p : prompts) require_no_ring_table(p, name());
  for (const DecodeSeq& s : seqs) require_no_ring_table(s.chunk, name());
  MD_REQUIRE(!seqs.empty() && static_cast<int>(seqs.size()) <= max_decode_batch(), "decode: batch of ", seqs.size(),
             " sequences; ", name(), " runs 1..", max_decode_batch());
  last_path_ = DecodePath::kBatched;  // a mixed step runs on the batched step whatever the batch
  decode_batched(prompts, seqs, want_logits, result);
}

void CudaBackend::decode_batched(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, bool want_logits,
                                 DecodeResult& result) {
  const ModelConfig& c = config();
  const int B = static_cast<int>(seqs.size());
  std::vector<batched::PromptPiece> pieces;
  int prompt_rows = 0;
  for (const SeqChunk& p : prompts) {
    pieces.push_back(batched::PromptPiece{p.tokens, p.start_pos, p.block_table});
    prompt_rows += static_cast<int>(p.tokens.size());
  }
  std::vector<batched::StepRow> rows(B);
  for (int i = 0; i < B; ++i) {
    const DecodeSeq& s = seqs[i];
    MD_REQUIRE(s.chunk.tokens.size() == 1, "decode: sequence ", i, " has ", s.chunk.tokens.size(), " tokens, expected 1");
    rows[i] = batched::StepRow{s.chunk.tokens[0], s.chunk.start_pos, s.chunk.block_table, s.sampling,
                               s.chunk.ring_table};
  }
  result.tokens.assign(B, 0);
  if (want_logits) {
    result.logits.assign(static_cast<size_t>(B) * c.vocab_size, 0.0f);
  } else {
    result.logits.clear();
  }
  const prefill::KvCacheView kv{kv_, n_kv_blocks_, options_.kv_block_size, kv_ring_, n_ring_blocks_, ring_len_};
  batched_->run(rows, pieces, kv, result.tokens, result.logits, stream_);
  if (routing_log_) {
    std::vector<int32_t> ids;
    std::vector<float> w;
    const int row0 = batched::BatchedStep::prompt_row0(B);  // the pieces' rows follow the decode rows' bucket
    batched_->read_routing(row0 + prompt_rows, ids, w);
    const size_t per = static_cast<size_t>(c.n_layers) * c.n_experts_per_tok;
    for (int i = 0; i < B; ++i)
      record_routing(seqs[i].chunk.seq_id, seqs[i].chunk.start_pos, 1, ids.data() + i * per, w.data() + i * per);
    size_t row = row0;
    for (const SeqChunk& p : prompts) {
      record_routing(p.seq_id, p.start_pos, static_cast<int>(p.tokens.size()), ids.data() + row * per,
                     w.data() + row * per);
      row += p.tokens.size();
    }
  }
  const size_t V = static_cast<size_t>(c.vocab_size);
  resample_penalised(seqs, result, [&](size_t i, std::vector<float>& row) {
    row.resize(V);
    CUDA_CHECK(cudaMemcpy(row.data(), batched_->logits_row(static_cast<int>(i)), V * sizeof(float),
                          cudaMemcpyDeviceToHost));
  });
}

void CudaBackend::decode_megakernel(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) {
  const ModelConfig& c = config();
  MD_REQUIRE(seqs.size() <= static_cast<size_t>(kMkMaxBatch), "decode: batch of ", seqs.size(),
             " sequences; the megakernel runs 1..", kMkMaxBatch);
  BatchState batch;
  batch.kv_block_size = options_.kv_block_size;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DecodeSeq& s = seqs[i];
    MD_REQUIRE(s.chunk.tokens.size() == 1, "decode: sequence ", i, " has ", s.chunk.tokens.size(), " tokens, expected 1");
    MD_REQUIRE(s.chunk.tokens[0] >= 0 && s.chunk.tokens[0] < c.vocab_size, "decode: sequence ", i, ": token ",
               s.chunk.tokens[0], " outside the vocabulary");
    MD_REQUIRE(s.chunk.start_pos >= 0 && s.chunk.start_pos < c.max_position_embeddings, "decode: sequence ", i,
               ": position ", s.chunk.start_pos, " outside [0, ", c.max_position_embeddings, ")");
    sampling::validate(s.sampling);
    const int n_ctx = s.chunk.start_pos + 1;
    const size_t need = (static_cast<size_t>(n_ctx) + batch.kv_block_size - 1) / batch.kv_block_size;
    MD_REQUIRE(s.chunk.block_table.size() >= need, "decode: sequence ", i, ": block table covers ",
               s.chunk.block_table.size(), " blocks, position ", s.chunk.start_pos, " needs ", need);
    for (size_t b = 0; b < need; ++b)
      MD_REQUIRE(s.chunk.block_table[b] >= 0 && s.chunk.block_table[b] < n_kv_blocks_, "decode: sequence ", i,
                 ": block ", s.chunk.block_table[b], " outside the cache's ", n_kv_blocks_, " blocks");
    // The ring blocks the step reads and appends to (plan/planner.cpp check_ring_tables).
    const size_t ring_need =
        prefill::check_ring_table(s.chunk.ring_table, need, ring_len_, n_ring_blocks_, cat("decode: sequence ", i));
    batch.seqs.push_back(SeqState{n_ctx, s.chunk.block_table.first(need), s.chunk.ring_table.first(ring_need)});
  }
  run_step(batch, seqs);
  const int B = static_cast<int>(seqs.size());
  if (routing_log_) {
    const size_t per = static_cast<size_t>(c.n_layers) * c.n_experts_per_tok;
    std::vector<int32_t> ids(B * per);
    std::vector<float> w(B * per);
    CUDA_CHECK(cudaMemcpy(ids.data(), route_ids_, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(w.data(), route_w_, w.size() * sizeof(float), cudaMemcpyDeviceToHost));
    // A dense layer routes nothing: the capture holds whatever an earlier step left there. Recorded
    // as cpu-mk records it (expert -1, weight 0), so logs of repeated runs compare equal.
    for (int L = 0; L < c.n_layers; ++L) {
      if (c.is_moe_layer(L)) continue;
      for (int i = 0; i < B; ++i)
        for (int k = 0; k < c.n_experts_per_tok; ++k) {
          const size_t at = i * per + static_cast<size_t>(L) * c.n_experts_per_tok + k;
          ids[at] = -1;
          w[at] = 0.0f;
        }
    }
    for (int i = 0; i < B; ++i)
      record_routing(seqs[i].chunk.seq_id, seqs[i].chunk.start_pos, 1, ids.data() + i * per, w.data() + i * per);
  }
  result.tokens.assign(B, 0);
  CUDA_CHECK(cudaMemcpy(result.tokens.data(), arena_ + plan_.params.buffers.out_tokens.offset, B * 4,
                        cudaMemcpyDeviceToHost));
  if (want_logits) {
    result.logits.assign(static_cast<size_t>(B) * c.vocab_size, 0.0f);
    CUDA_CHECK(cudaMemcpy(result.logits.data(), arena_ + plan_.params.buffers.logits.offset,
                          result.logits.size() * 4, cudaMemcpyDeviceToHost));
  } else {
    result.logits.clear();
  }
  const size_t V = static_cast<size_t>(c.vocab_size);
  resample_penalised(seqs, result, [&](size_t i, std::vector<float>& row) {
    row.resize(V);
    CUDA_CHECK(cudaMemcpy(row.data(), arena_ + plan_.params.buffers.logits.offset + i * V * sizeof(float),
                          V * sizeof(float), cudaMemcpyDeviceToHost));
  });
}

// Presence/frequency/repetition penalties need each sequence's token history, which the device
// sampler does not have: such sequences (rare in serving) read their logits row back and are
// sampled by the host sampler (sampling/host_sampler.h, the cpu backends' own, vLLM's order), replacing
// the device's token. Costs one 4*vocab-byte copy per penalised sequence.
void CudaBackend::resample_penalised(std::span<const DecodeSeq> seqs, DecodeResult& result,
                                     const std::function<void(size_t, std::vector<float>&)>& read_row) {
  const size_t V = static_cast<size_t>(config().vocab_size);
  std::vector<float> row;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DecodeSeq& s = seqs[i];
    if (!s.sampling.has_penalties()) continue;
    if (!result.logits.empty()) {
      row.assign(result.logits.begin() + i * V, result.logits.begin() + (i + 1) * V);
    } else {
      read_row(i, row);
    }
    MD_REQUIRE(s.history_prompt_len <= s.history.size(), "decode: sequence ", i, ": history_prompt_len ",
               s.history_prompt_len, " beyond its history of ", s.history.size());
    const sampling::TokenHistory h{s.history.first(s.history_prompt_len), s.history.subspan(s.history_prompt_len)};
    result.tokens[i] = sampling::sample_token(row, s.sampling, s.chunk.start_pos + 1, h);
  }
}

void CudaBackend::ensure_capacity(const Plan& plan) {
  check_megakernel_shape(plan.params.shape);  // what the kernel assumes of the model and the batch
  check_megakernel_tasks(plan.tasks);         // and of the ops: none it would have to refuse on the device
  grow(arena_, arena_bytes_, plan.params.buffers.total_bytes);
  grow(counters_, counters_bytes_, static_cast<size_t>(plan.params.counters.n_counters) * kCounterStrideBytes);
  grow(tasks_, tasks_capacity_, plan.tasks.size());
  grow(ranges_, ranges_capacity_, (plan.waves.size() + 1) * 2 * static_cast<size_t>(n_sms_));
}

void CudaBackend::upload_inputs(std::span<const DecodeSeq> seqs) {
  const PlanShape& s = plan_.params.shape;
  const BufferLayout& b = plan_.params.buffers;
  const int B = s.batch;
  // Host inputs, packed into one pinned buffer laid out like the arena's first buffers; the ring
  // tables (placed after the step's buffers in the arena) follow them in the staging buffer.
  const size_t need = b.attn_items.offset + b.attn_items.bytes;
  const size_t total = need + b.ring_tables.bytes;
  if (total > staging_bytes_) {
    CUDA_CHECK(cudaFreeHost(staging_));
    CUDA_CHECK(cudaMallocHost(&staging_, total));
    staging_bytes_ = total;
  }
  std::memset(staging_, 0, need);
  auto* tok = reinterpret_cast<int32_t*>(staging_ + b.token_ids.offset);
  auto* len = reinterpret_cast<int32_t*>(staging_ + b.seq_len.offset);
  auto* bt = reinterpret_cast<int32_t*>(staging_ + b.block_tables.offset);
  auto* sp = reinterpret_cast<SamplingParams*>(staging_ + b.sampling.offset);
  for (int i = 0; i < B; ++i) {
    const DecodeSeq& q = seqs[i];
    tok[i] = q.chunk.tokens[0];
    len[i] = q.chunk.start_pos + 1;
    const size_t nb = std::min<size_t>(q.chunk.block_table.size(), s.max_blocks_per_seq);
    for (size_t j = 0; j < nb; ++j) bt[static_cast<size_t>(i) * s.max_blocks_per_seq + j] = q.chunk.block_table[j];
    sp[i] = q.sampling;
  }
  std::memcpy(staging_ + b.attn_items.offset, plan_.attn_items.data(), plan_.attn_items.size() * sizeof(AttnItem));
  CUDA_CHECK(cudaMemcpyAsync(arena_, staging_, need, cudaMemcpyHostToDevice, stream_));
  if (s.ring_len > 0) {
    // [B, ring_len]: a sequence's ring blocks, -1 past the ones it holds yet (as cpu-mk fills them).
    auto* rt = reinterpret_cast<int32_t*>(staging_ + need);
    std::fill(rt, rt + b.ring_tables.bytes / 4, -1);
    for (int i = 0; i < B; ++i) {
      const std::span<const int32_t> ring = seqs[i].chunk.ring_table;
      const size_t nr = std::min<size_t>(ring.size(), s.ring_len);
      std::copy(ring.begin(), ring.begin() + nr, rt + static_cast<size_t>(i) * s.ring_len);
    }
    CUDA_CHECK(cudaMemcpyAsync(arena_ + b.ring_tables.offset, rt, b.ring_tables.bytes, cudaMemcpyHostToDevice, stream_));
  }
  // The planner validated the item count against the capacity; check the bytes anyway.
  MD_CHECK(plan_.attn_items.size() * sizeof(AttnItem) <= b.attn_items.bytes);
}

void CudaBackend::run_step(const BatchState& batch, std::span<const DecodeSeq> seqs) {
  plan_ = planner_->plan(batch);  // make_plan's plan, patched from the last step's (microseconds, not milliseconds)
  ensure_capacity(plan_);
  if (stuck_task_ >= 0 && stuck_task_ < static_cast<int>(plan_.tasks.size()) && plan_.tasks[stuck_task_].n_waits > 0)
    plan_.tasks[stuck_task_].wait[0].target += 1;
  if (poison_) CUDA_CHECK(cudaMemsetAsync(arena_, 0xff, plan_.params.buffers.total_bytes, stream_));  // NaN
  upload_inputs(seqs);
  if (uploaded_tasks_.size() != plan_.tasks.size() ||
      std::memcmp(uploaded_tasks_.data(), plan_.tasks.data(), plan_.tasks.size() * sizeof(Task)) != 0) {
    CUDA_CHECK(cudaMemcpyAsync(tasks_, plan_.tasks.data(), plan_.tasks.size() * sizeof(Task), cudaMemcpyHostToDevice,
                               stream_));
    uploaded_tasks_ = plan_.tasks;
  }
  // Launch ranges: launch 0 = whole lists (cuda-mk); launch 1 + w = wave w (cuda-ops).
  const size_t n_waves = plan_.waves.size();
  std::vector<int32_t> ranges((n_waves + 1) * 2 * n_sms_, 0);
  for (int sm = 0; sm < n_sms_; ++sm) {
    ranges[sm] = plan_.list_begin[sm];
    ranges[n_sms_ + sm] = plan_.list_begin[sm + 1];
    int t = plan_.list_begin[sm];
    for (size_t w = 0; w < n_waves; ++w) {
      int32_t* r = ranges.data() + (w + 1) * 2 * n_sms_;
      r[sm] = t;
      while (t < plan_.list_begin[sm + 1] && plan_.task_wave[t] == static_cast<int>(w)) ++t;
      r[n_sms_ + sm] = t;
    }
    MD_CHECK(t == plan_.list_begin[sm + 1], "plan lists are not sorted by wave");
  }
  CUDA_CHECK(cudaMemcpyAsync(ranges_, ranges.data(), ranges.size() * 4, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // pageable `ranges` must be consumed before it goes away
  launch(stream_);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  check_error();
}

void CudaBackend::launch(cudaStream_t stream) {
  MkParams p{};
  p.plan = plan_.params;
  p.tasks = tasks_;
  p.counters = counters_;
  p.arena = arena_;
  p.kv = kv_;
  const ModelConfig& c = config();
  p.kv_layer_stride = static_cast<int64_t>(2) * n_kv_blocks_ * c.n_kv_heads * options_.kv_block_size * c.head_dim;
  p.kv_v_offset = p.kv_layer_stride / 2;
  if (kv_ring_ != nullptr) {
    p.kv_ring = kv_ring_;
    p.kv_ring_layer_stride =
        static_cast<int64_t>(2) * n_ring_blocks_ * c.n_kv_heads * options_.kv_block_size * c.head_dim;
    p.kv_ring_v_offset = p.kv_ring_layer_stride / 2;
  }
  p.w = weights_->view();
  p.error = error_;
  p.timeout_ns = options_.wait_timeout_ms * 1000000;
  p.flags = options_.kernel_flags;
  p.route_ids = routing_log_ ? route_ids_ : nullptr;
  p.route_w = routing_log_ ? route_w_ : nullptr;
  p.trace = trace_;
  p.trace_counts = trace_counts_;
  p.trace_capacity = trace_capacity_;
  const size_t trace_count_bytes = static_cast<size_t>(n_sms_) * kTraceRoles * sizeof(int32_t);
  const size_t counter_bytes = static_cast<size_t>(plan_.params.counters.n_counters) * kCounterStrideBytes;
  if (!per_op_) {
    CUDA_CHECK(cudaMemsetAsync(counters_, 0, counter_bytes, stream));
    CUDA_CHECK(cudaMemsetAsync(error_, 0, sizeof(MkError), stream));
    if (trace_) CUDA_CHECK(cudaMemsetAsync(trace_counts_, 0, trace_count_bytes, stream));
    p.list_begin = ranges_;
    p.list_end = ranges_ + n_sms_;
    launch_megakernel(p, stream);
    return;
  }
  // cuda-ops: every wave is its own launch of the same kernel; captured, then replayed as a graph.
  (void)megakernel_shape(plan_.params.shape.batch);  // one-time kernel configuration outside the capture
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CUDA_CHECK(cudaMemsetAsync(counters_, 0, counter_bytes, stream));
  CUDA_CHECK(cudaMemsetAsync(error_, 0, sizeof(MkError), stream));
  if (trace_) CUDA_CHECK(cudaMemsetAsync(trace_counts_, 0, trace_count_bytes, stream));
  for (size_t w = 0; w < plan_.waves.size(); ++w) {
    p.list_begin = ranges_ + (w + 1) * 2 * n_sms_;
    p.list_end = p.list_begin + n_sms_;
    launch_megakernel(p, stream);
  }
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  bool updated = false;
  if (graph_exec_) {
    cudaGraphExecUpdateResultInfo info{};
    updated = cudaGraphExecUpdate(graph_exec_, graph, &info) == cudaSuccess;
    if (!updated) {
      (void)cudaGetLastError();
      CUDA_CHECK(cudaGraphExecDestroy(graph_exec_));
      graph_exec_ = nullptr;
    }
  }
  if (!updated) CUDA_CHECK(cudaGraphInstantiate(&graph_exec_, graph, 0));
  if (graph_) CUDA_CHECK(cudaGraphDestroy(graph_));
  graph_ = graph;
  CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream));
}

void CudaBackend::check_error() {
  CUDA_CHECK(cudaMemcpy(error_host_, error_, sizeof(MkError), cudaMemcpyDeviceToHost));
  const MkError& e = *error_host_;
  if (e.code == kMkOk) return;
  const std::string where = e.task >= 0 && e.task < static_cast<int>(plan_.tasks.size())
                                ? describe_task(plan_, e.task)
                                : cat("SM ", e.sm);
  switch (e.code) {
    case kMkWaitTimeout: {
      // The first SM to time out may be downstream of the real culprit: name the unsatisfied wait
      // of the earliest wave instead (every earlier wait was satisfied, so that one is stuck).
      const std::vector<int32_t> v = read_counters();
      std::vector<std::pair<int, int>> order;  // (wave, task)
      for (size_t t = 0; t < plan_.tasks.size(); ++t) order.push_back({plan_.task_wave[t], static_cast<int>(t)});
      std::sort(order.begin(), order.end());
      for (const auto& [wave, t] : order) {
        const Task& task = plan_.tasks[t];
        for (int i = 0; i < task.n_waits; ++i)
          if (v[task.wait[i].counter] < task.wait[i].target)
            throw Error(cat(name(), ": decode step abandoned: counter ", counter_name(plan_, task.wait[i].counter),
                            " stuck at ", v[task.wait[i].counter], ", target ", task.wait[i].target, " (",
                            describe_task(plan_, t), "; waited ", options_.wait_timeout_ms, " ms)"));
      }
      throw Error(cat(name(), ": decode step abandoned: counter ", counter_name(plan_, e.counter), " stuck at ",
                      e.value, ", target ", e.target, " (", where, ", waited ", options_.wait_timeout_ms, " ms)"));
    }
    case kMkBarrierTimeout:
      throw Error(cat(name(), ": decode step abandoned: an in-SM handshake (", e.detail, ") timed out on SM ", e.sm));
    case kMkBadInput:
      throw Error(cat(name(), ": decode step abandoned: an input out of range (value ", e.value, ", limit ", e.target,
                      ", detail ", e.detail, e.detail == -2 ? ": the router's top-k chose no expert, non-finite logits?" : "",
                      ") in ", where));
    case kMkBadShape:
      if (e.detail == kMkDetailUnknownOp)
        throw Error(cat(name(), ": decode step abandoned: ",
                        e.value >= 0 && e.value < kNumOps ? op_name(static_cast<Op>(e.value)) : "an unknown op",
                        e.target != kNumOps ? cat(" with flags ", e.target) : std::string(),
                        " is not run by the megakernel (", where, ")"));
      throw Error(cat(name(), ": decode step abandoned: the kernel cannot run this shape (", e.value, ", ", e.target,
                      ") in ", where));
    default:
      throw Error(cat(name(), ": decode step abandoned: device error ", e.code, " in ", where));
  }
}

std::vector<int32_t> CudaBackend::read_counters() const {
  const int n = plan_.params.counters.n_counters;
  std::vector<int32_t> raw(static_cast<size_t>(n) * kCounterStrideBytes / 4);
  CUDA_CHECK(cudaMemcpy(raw.data(), counters_, raw.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) out[i] = raw[static_cast<size_t>(i) * kCounterStrideBytes / 4];
  return out;
}

std::string CudaBackend::check_counter_totals() const {
  const std::vector<int32_t> v = read_counters();
  std::string bad;
  for (size_t i = 0; i < v.size(); ++i) {
    const CounterInfo& info = plan_.counters[i];
    if (info.kind == CounterKind::kUnused) continue;
    const bool ok = v[i] == info.total;
    if (!ok && bad.size() < 2000)
      bad += cat(counter_name(plan_, static_cast<int32_t>(i)), " = ", v[i], " (planned ", info.total, "); ");
  }
  return bad;
}

// ---- benchmark hooks ----

std::vector<float> CudaBackend::time_last_step(int warmup, int reps) {
  if (last_path_ == DecodePath::kBatched) return batched_->time_last_step(warmup, reps, stream_);
  MD_REQUIRE(!plan_.tasks.empty(), name(), ": time_last_step needs a decode step first");
  MD_REQUIRE(warmup >= 0 && reps >= 1, "time_last_step: warmup ", warmup, ", reps ", reps);
  cudaGraphExec_t exec = graph_exec_;
  if (!per_op_) {
    // The step's memsets + launch as one graph, captured for the current plan.
    if (bench_exec_) CUDA_CHECK(cudaGraphExecDestroy(bench_exec_));
    bench_exec_ = nullptr;
    (void)megakernel_shape(plan_.params.shape.batch);  // kernel configuration outside the capture
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    launch(stream_);
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&bench_exec_, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    exec = bench_exec_;
  }
  MD_CHECK(exec != nullptr, "no step graph to replay");
  cudaEvent_t a = nullptr, b = nullptr;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  ms.reserve(reps);
  for (int i = 0; i < warmup + reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream_));
    CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    CUDA_CHECK(cudaEventRecord(b, stream_));
    CUDA_CHECK(cudaEventSynchronize(b));
    check_error();  // throws naming the counter; the events are leaked only on that path
    float t = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= warmup) ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return ms;
}

std::vector<std::pair<std::string, double>> CudaBackend::profile_last_step() {
  if (last_path_ != DecodePath::kBatched) return {};
  return batched_->profile_last_step(stream_);
}

std::vector<std::pair<std::string, double>> CudaBackend::profile_prefill(const SeqChunk& chunk) {
  MD_REQUIRE(prefill_ != nullptr, "profile_prefill: this backend has no prefill runner (prefill chunk 0)");
  KernelMarks marks(stream_);
  prefill_->set_kernel_marks(&marks);
  try {
    prefill(chunk, {});
  } catch (...) {
    prefill_->set_kernel_marks(nullptr);
    throw;
  }
  prefill_->set_kernel_marks(nullptr);
  return marks.collect();
}

std::vector<uint8_t> CudaBackend::read_buffer(const BufferSpan& span) const {
  MD_REQUIRE(arena_ != nullptr && span.offset + span.bytes <= arena_bytes_, "read_buffer: span outside the arena");
  std::vector<uint8_t> out(span.bytes);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  CUDA_CHECK(cudaMemcpy(out.data(), arena_ + span.offset, span.bytes, cudaMemcpyDeviceToHost));
  return out;
}

void CudaBackend::enable_trace(int capacity_per_sm) {
  MD_REQUIRE(capacity_per_sm >= 0, "trace capacity must be >= 0");
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  // Captured steps refer to the old trace buffers: drop them (the next decode() captures again).
  if (bench_exec_) CUDA_CHECK(cudaGraphExecDestroy(bench_exec_));
  if (graph_exec_) CUDA_CHECK(cudaGraphExecDestroy(graph_exec_));
  if (graph_) CUDA_CHECK(cudaGraphDestroy(graph_));
  bench_exec_ = nullptr;
  graph_exec_ = nullptr;
  graph_ = nullptr;
  plan_ = Plan{};  // time_last_step needs a decode() with the new setting first
  CUDA_CHECK(cudaFree(trace_));
  CUDA_CHECK(cudaFree(trace_counts_));
  trace_ = nullptr;
  trace_counts_ = nullptr;
  trace_capacity_ = capacity_per_sm;
  if (capacity_per_sm == 0) return;
  const size_t slots = static_cast<size_t>(n_sms_) * kTraceRoles;
  CUDA_CHECK(cudaMalloc(&trace_, slots * capacity_per_sm * sizeof(TraceRecord)));
  CUDA_CHECK(cudaMalloc(&trace_counts_, slots * sizeof(int32_t)));
  CUDA_CHECK(cudaMemset(trace_counts_, 0, slots * sizeof(int32_t)));
  CUDA_CHECK(cudaDeviceSynchronize());  // before stream_ (non-blocking) uses them
}

std::vector<TraceRecord> CudaBackend::read_trace(int64_t* dropped) const {
  MD_REQUIRE(trace_ != nullptr, "read_trace: tracing is off (enable_trace first)");
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  const size_t slots = static_cast<size_t>(n_sms_) * kTraceRoles;
  std::vector<int32_t> counts(slots);
  CUDA_CHECK(cudaMemcpy(counts.data(), trace_counts_, slots * sizeof(int32_t), cudaMemcpyDeviceToHost));
  std::vector<TraceRecord> all(slots * trace_capacity_);
  CUDA_CHECK(cudaMemcpy(all.data(), trace_, all.size() * sizeof(TraceRecord), cudaMemcpyDeviceToHost));
  std::vector<TraceRecord> out;
  int64_t lost = 0;
  for (size_t s = 0; s < slots; ++s) {
    const int n = std::min(counts[s], trace_capacity_);
    lost += counts[s] - n;
    out.insert(out.end(), all.begin() + static_cast<int64_t>(s) * trace_capacity_,
               all.begin() + static_cast<int64_t>(s) * trace_capacity_ + n);
  }
  if (dropped) *dropped = lost;
  return out;
}

}  // namespace megadecode::cuda
