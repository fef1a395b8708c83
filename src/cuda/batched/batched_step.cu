// BatchedStep: workspace, host checks of a step's rows, the inputs upload and the per-layer launch
// sequence, captured once per shape (row buckets, table stride) as a CUDA graph.
#include "cuda/batched/batched_step.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "engine/decode_rows.h"
#include "cuda/batched/batched_plan.h"
#include "cuda/batched/decode_attention.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_marks.h"
#include "cuda/common/workspace_carver.h"
#include "cuda/common/device_info.h"
#include "cuda/common/graph_timing.h"
#include "cuda/common/kernels.h"
#include "cuda/common/moe.cuh"
#include "cuda/gemm/gemm.h"
#include "cuda/prefill/prefill_kernels.h"
#include "kv/kv_cache.h"
#include "sampling/token_mask.h"

namespace megadecode::cuda::batched {

// Byte offsets of one step's inputs (host staging and device copy alike).
struct BatchedStep::Inputs {
  size_t tokens = 0, positions = 0, table_offsets = 0, seq_lens = 0, split_begin = 0, sample_pos = 0, sampling = 0,
         mask_slots = 0, tables = 0, ring_offsets = 0, ring_split_begin = 0, ring_tables = 0, n_work = 0, work = 0,
         merge = 0, prompt_tables = 0, bytes = 0;
  int work_capacity = 0;
  // rows: every row (tokens, positions, table offsets); decode rows: the decode fields and tables,
  // and with sliding layers (ring_len > 0) the ring tables, their offsets and the windowed splits;
  // the rest: the prompt attention's work list (work_capacity items) and merge rows.
  Inputs(int rows, int decode_rows, int stride, int ring_len, int work_items, int prompt_table_entries)
      : work_capacity(work_items) {
    size_t off = 0;
    auto take = [&](size_t n) {
      const size_t at = off;
      off += (n + 255) / 256 * 256;
      return at;
    };
    tokens = take(rows * sizeof(int32_t));
    positions = take(rows * sizeof(int32_t));
    table_offsets = take(rows * sizeof(int32_t));
    seq_lens = take(decode_rows * sizeof(int32_t));
    split_begin = take((decode_rows + 1) * sizeof(int32_t));
    sample_pos = take(decode_rows * sizeof(int64_t));
    sampling = take(decode_rows * sizeof(SamplingParams));
    mask_slots = take(decode_rows * sizeof(int32_t));
    tables = take(static_cast<size_t>(decode_rows) * stride * sizeof(int32_t));
    ring_offsets = take(ring_len > 0 ? rows * sizeof(int32_t) : 0);
    ring_split_begin = take(ring_len > 0 ? (decode_rows + 1) * sizeof(int32_t) : 0);
    ring_tables = take(static_cast<size_t>(decode_rows) * ring_len * sizeof(int32_t));
    n_work = take(sizeof(int32_t));
    work = take(static_cast<size_t>(work_items) * sizeof(prefill::AttnWork));
    merge = take(static_cast<size_t>(rows - decode_rows) * sizeof(prefill::AttnMergeRow));
    prompt_tables = take(static_cast<size_t>(prompt_table_entries) * sizeof(int32_t));  // last
    bytes = off;
  }
};

BatchedStep::Inputs BatchedStep::inputs(const Shape& shape, int prompt_table_entries) const {
  const int prompt_rows = shape.rows - shape.decode_rows;
  const int work = prompt_rows == 0 ? 0
                                    : prefill::attn_work_capacity(prompt_rows, config_.group_size(),
                                                                  config_.n_kv_heads, piece_attn_ctas_);
  return Inputs(shape.rows, shape.decode_rows, shape.stride, shape.ring_len, work, prompt_table_entries);
}

namespace {

struct Dims {
  int64_t R, H, qkv_rows, nq, E, K, I, V;
  int64_t hidden_per_row;  // the FFN's SiLU(gate) * up elements a row: K experts', or a dense layer's
  Dims(const ModelConfig& c, int rows)
      : R(rows), H(c.hidden_size), qkv_rows(int64_t{c.n_kv_heads} * (c.group_size() + 2) * c.head_dim),
        nq(c.q_size()), E(c.n_experts), K(c.n_experts_per_tok), I(c.moe_intermediate_size), V(c.vocab_size),
        hidden_per_row(c.ffn_act_per_token()) {}
};

// Token groups of the step's expert tiles: about twice the mean rows per expert of the bucket.
int expert_token_groups(const ModelConfig& c, int bucket) {
  return gemm::grouped_token_groups(bucket * c.n_experts_per_tok, c.n_experts);
}
int expert_tile_capacity(const ModelConfig& c, int rows) {
  int cap = 0;  // the largest over the buckets up to `rows` (smaller tiles need more of them)
  for (int b = 8; b <= rows; b = row_bucket(b + 1))
    cap = std::max(cap, gemm::moe_tile_capacity(b * c.n_experts_per_tok, c.n_experts, 8 * expert_token_groups(c, b)));
  return cap;
}

// The dense GEMMs that split K (their splits: the weight shape and the SM count only).
struct DenseSplits {
  int qkv, o, router;
  explicit DenseSplits(const ModelConfig& c) {
    const Dims d(c, 1);
    const int sms = sm_count();
    qkv = gemm::dense_k_splits(static_cast<int>(d.qkv_rows), c.hidden_size, sms);
    o = gemm::dense_k_splits(c.hidden_size, c.q_size(), sms);
    router = gemm::dense_k_splits(c.n_experts, c.hidden_size, sms);
  }
};
size_t split_workspace_floats(const ModelConfig& c, int rows, size_t* semaphores) {
  const Dims d(c, 1);
  const DenseSplits s(c);
  size_t ws = 0, sem = 0;
  const int sms = sm_count();
  for (int b = 8; b <= rows; b = row_bucket(b + 1)) {
    for (auto [n, splits] : {std::pair<int, int>{static_cast<int>(d.qkv_rows), s.qkv}, {c.hidden_size, s.o},
                             {c.n_experts, s.router}}) {
      const int tg = gemm::dense_tile_groups(n, b, splits, sms);
      ws = std::max(ws, gemm::workspace_floats(b, n, tg, splits));
      sem = std::max(sem, gemm::semaphore_count(b, n, tg));
    }
  }
  *semaphores = sem;
  return ws;
}

}  // namespace

size_t BatchedStep::workspace_bytes(const ModelConfig& config, int max_rows, int max_prompt_rows) {
  const int R_dec = row_bucket(max_rows), R = row_bucket(R_dec + max_prompt_rows);
  const Dims s(config, R);
  size_t n_sem = 0;
  const size_t n_ws = split_workspace_floats(config, R, &n_sem);
  WorkspaceCarver c(nullptr);
  c.take<int32_t>(4);
  c.take<float>(s.R * s.H);
  c.take<float>(s.R * s.H);
  c.take<uint16_t>(s.R * s.H);
  c.take<float>(s.R * s.qkv_rows);
  c.take<uint16_t>(s.R * s.nq);
  c.take<uint16_t>(s.R * s.nq);
  c.take<float>(s.R * s.E);
  c.take<int32_t>(s.R * s.K);
  c.take<float>(s.R * s.K);
  c.take<int32_t>(s.R * s.K);
  c.take<int32_t>(s.R * s.K);
  c.take<int32_t>(s.E);
  c.take<int32_t>(s.E + 1);
  c.take<int32_t>(1);
  c.take<gemm::MoeTile>(expert_tile_capacity(config, R));
  c.take<uint16_t>(s.R * s.hidden_per_row);
  c.take<float>(s.R * s.K * s.H);
  c.take<uint16_t>(R_dec * s.H);
  c.take<float>(R_dec * s.V);
  c.take<int32_t>(R_dec);
  c.take<float>(static_cast<int64_t>(n_ws));
  c.take<int32_t>(static_cast<int64_t>(n_sem));
  return c.bytes();
}

BatchedStep::BatchedStep(const ModelConfig& config, const MkModelWeights& view, std::span<const MkLayerWeights> layers,
                         int max_rows, int max_prompt_rows)
    : config_(config), view_(view), layers_(layers.begin(), layers.end()) {
  const ModelConfig& c = config_;
  MD_REQUIRE(max_rows >= 1 && max_rows <= kMaxRows, "batched step: max rows ", max_rows, " outside 1..", kMaxRows);
  MD_REQUIRE(max_prompt_rows >= 0 && row_bucket(row_bucket(max_rows) + max_prompt_rows) <= kMaxRows,
             "batched step: ", max_rows, " decode rows (a bucket of ", row_bucket(max_rows), ") and ", max_prompt_rows,
             " prompt rows exceed ", kMaxRows, " rows");
  MD_REQUIRE(layers_.size() == static_cast<size_t>(c.n_layers), "batched step: ", layers_.size(),
             " layers of weights for a model of ", c.n_layers);
  MD_REQUIRE(c.hidden_size % 16 == 0 && c.q_size() % 16 == 0 && c.moe_intermediate_size % 16 == 0,
             "batched step: the hidden, q and expert widths must be multiples of 16");
  MD_REQUIRE((c.head_dim == 32 || c.head_dim == 64 || c.head_dim == 128) && c.group_size() >= 1 &&
                 c.group_size() <= 8,
             "batched step: attention needs a head dim of 32, 64 or 128 and <= 8 q heads per KV head; the model has ",
             c.head_dim, " and ", c.group_size());
  MD_REQUIRE(c.n_experts <= kRouterMaxExperts && c.n_experts_per_tok <= kRouterMaxTopK,
             "batched step: routing needs <= ", kRouterMaxExperts, " experts and top-k <= ", kRouterMaxTopK,
             "; the model has ", c.n_experts, " and ", c.n_experts_per_tok);
  n_ring_layers_ = c.n_sliding_layers();
  MD_REQUIRE(c.block == BlockKind::kSequential || max_prompt_rows == 0, "batched step: ", c.model_type,
             " runs decode rows only (its prompt pieces would need the prefill kernels, which lack parallel blocks "
             "and sliding-window attention); got ", max_prompt_rows, " prompt rows");
  for (int l = 0; l < c.n_layers; ++l)
    MD_REQUIRE(c.is_moe_layer(l) ? layers_[l].router != nullptr : layers_[l].dense_up != nullptr,
               "batched step: layer ", l, " has no ", c.is_moe_layer(l) ? "router" : "dense FFN", " weights");
  max_rows_ = row_bucket(max_rows);
  max_prompt_rows_ = max_prompt_rows;
  max_all_rows_ = row_bucket(max_rows_ + max_prompt_rows);
  const DenseSplits splits(c);
  qkv_splits_ = splits.qkv;
  o_splits_ = splits.o;
  router_splits_ = splits.router;
  tile_capacity_ = expert_tile_capacity(c, max_all_rows_);
  const Dims s(c, max_all_rows_);
  const int64_t R_dec = max_rows_;
  size_t n_sem = 0;
  const size_t n_ws = split_workspace_floats(c, max_all_rows_, &n_sem);
  arena_bytes_ = workspace_bytes(c, max_rows, max_prompt_rows);
  CUDA_CHECK(cudaMalloc(&arena_, arena_bytes_));
  WorkspaceCarver v(arena_);
  error_ = v.take<int32_t>(4);
  x_ = v.take<float>(s.R * s.H);
  h_ = v.take<float>(s.R * s.H);
  xn_ = v.take<uint16_t>(s.R * s.H);
  qkv_ = v.take<float>(s.R * s.qkv_rows);
  q_ = v.take<uint16_t>(s.R * s.nq);
  attn_ = v.take<uint16_t>(s.R * s.nq);
  router_ = v.take<float>(s.R * s.E);
  topk_ids_ = v.take<int32_t>(s.R * s.K);
  topk_w_ = v.take<float>(s.R * s.K);
  rank_ = v.take<int32_t>(s.R * s.K);
  token_slot_ = v.take<int32_t>(s.R * s.K);
  counts_ = v.take<int32_t>(s.E);
  offsets_ = v.take<int32_t>(s.E + 1);
  n_tiles_ = v.take<int32_t>(1);
  tiles_ = v.take<gemm::MoeTile>(tile_capacity_);
  hidden_ = v.take<uint16_t>(s.R * s.hidden_per_row);
  down_ = v.take<float>(s.R * s.K * s.H);
  xf_ = v.take<uint16_t>(R_dec * s.H);
  logits_ = v.take<float>(R_dec * s.V);
  out_tokens_ = v.take<int32_t>(R_dec);
  split_ws_ = v.take<float>(static_cast<int64_t>(n_ws));
  split_sem_ = v.take<int32_t>(static_cast<int64_t>(n_sem));
  MD_CHECK(v.bytes() == arena_bytes_, "batched step workspace layout drifted from workspace_bytes");
  CUDA_CHECK(cudaMemset(split_sem_, 0, std::max<size_t>(n_sem, 1) * sizeof(int32_t)));
  for (Slot& slot : slots_) CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
  if (max_prompt_rows_ > 0) {  // a small piece at a long position splits its keys over the SMs
    piece_attn_ctas_ = sm_count();  // one persistent attention CTA an SM: its ring fills shared memory
    CUDA_CHECK(cudaMalloc(&piece_part_o_, static_cast<size_t>(piece_attn_ctas_) * prefill::kAttnRows * c.head_dim * 4));
    CUDA_CHECK(cudaMalloc(&piece_part_ml_, static_cast<size_t>(piece_attn_ctas_) * prefill::kAttnRows * 2 * 4));
  }
  CUDA_CHECK(cudaDeviceSynchronize());  // the semaphores' memset, before any stream (non-blocking ones too) uses them
}

BatchedStep::~BatchedStep() {
  drop_graphs();
  CUDA_CHECK_NOTHROW(cudaFree(arena_));
  CUDA_CHECK_NOTHROW(cudaFree(inputs_));
  for (Slot& slot : slots_) CUDA_CHECK_NOTHROW(cudaEventDestroy(slot.done));
  CUDA_CHECK_NOTHROW(cudaFree(masks_));
  CUDA_CHECK_NOTHROW(cudaFree(logprobs_));
  CUDA_CHECK_NOTHROW(cudaFree(part_o_));
  CUDA_CHECK_NOTHROW(cudaFree(part_ml_));
  CUDA_CHECK_NOTHROW(cudaFree(route_ids_));
  CUDA_CHECK_NOTHROW(cudaFree(route_w_));
  CUDA_CHECK_NOTHROW(cudaFree(piece_part_o_));
  CUDA_CHECK_NOTHROW(cudaFree(piece_part_ml_));
}

void BatchedStep::drop_graphs() {
  for (auto& [key, exec] : graphs_) CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(exec));  // also from the destructor
  graphs_.clear();
  seen_.clear();
}

void BatchedStep::check_rows(std::span<const StepRow> rows, const prefill::KvCacheView& kv) const {
  const ModelConfig& c = config_;
  MD_REQUIRE(!rows.empty() && static_cast<int>(rows.size()) <= max_rows_, "batched step: ", rows.size(),
             " rows outside 1..", max_rows_);
  MD_REQUIRE(kv.data != nullptr && kv.block_size >= 1 && kv.n_blocks >= 1, "batched step: no KV cache");
  const int ring_len = n_ring_layers_ > 0 ? kv_ring_length(c.max_sliding_window(), kv.block_size) : 0;
  if (ring_len > 0)
    MD_REQUIRE(kv.ring != nullptr && kv.ring_len == ring_len && kv.n_ring_blocks >= ring_len, "batched step: the ",
               n_ring_layers_, " sliding-window layers need a ring pool of rings of ", ring_len,
               " blocks; the cache has ", kv.n_ring_blocks, " ring blocks, rings of ", kv.ring_len);
  for (size_t r = 0; r < rows.size(); ++r) {
    const StepRow& row = rows[r];
    MD_REQUIRE(row.prev_row >= 0 || (row.token >= 0 && row.token < c.vocab_size), "batched step: row ", r,
               ": token ", row.token, " outside the vocabulary [0, ", c.vocab_size, ")");
    MD_REQUIRE(row.position >= 0 && row.position < view_.rope_positions, "batched step: row ", r, ": position ",
               row.position, " outside [0, ", view_.rope_positions, ")");
    const size_t need = static_cast<size_t>(row.position / kv.block_size) + 1;
    MD_REQUIRE(row.block_table.size() >= need, "batched step: row ", r, ": block table covers ",
               row.block_table.size(), " blocks, position ", row.position, " needs ", need);
    for (size_t b = 0; b < need; ++b)
      MD_REQUIRE(row.block_table[b] >= 0 && row.block_table[b] < kv.n_blocks, "batched step: row ", r, ": block ",
                 row.block_table[b], " outside the cache's ", kv.n_blocks, " blocks");
    check_ring_table(row.ring_table, need, ring_len, kv.n_ring_blocks, cat("batched step: row ", r));
    sampling::validate(row.sampling);
    sampling::check_token_mask(row.allowed, static_cast<size_t>(c.vocab_size));
  }
}

void BatchedStep::ensure_capacity(const Shape& shape, int prompt_table_entries, int total_splits) {
  const Inputs in = inputs(shape, prompt_table_entries);
  if (in.bytes > inputs_capacity_) {  // graphs hold the old pointers
    drop_graphs();
    CUDA_CHECK(cudaFree(inputs_));
    inputs_ = nullptr;
    const size_t cap = std::max(in.bytes, inputs_capacity_ * 3 / 2);
    CUDA_CHECK(cudaMalloc(&inputs_, cap));
    inputs_capacity_ = cap;
  }
  if (total_splits > split_capacity_) {
    drop_graphs();
    CUDA_CHECK(cudaFree(part_o_));
    CUDA_CHECK(cudaFree(part_ml_));
    part_o_ = nullptr;
    part_ml_ = nullptr;
    const int cap = std::max(total_splits, split_capacity_ * 3 / 2);
    const size_t heads = static_cast<size_t>(config_.n_heads);
    CUDA_CHECK(cudaMalloc(&part_o_, static_cast<size_t>(cap) * heads * config_.head_dim * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&part_ml_, static_cast<size_t>(cap) * heads * 2 * sizeof(float)));
    split_capacity_ = cap;
  }
}

void BatchedStep::launch(std::span<const StepRow> rows, std::span<const PromptPiece> prompts,
                         const prefill::KvCacheView& kv, cudaStream_t stream, int32_t* chain, bool want_logits,
                         bool want_logprobs) {
  const ModelConfig& c = config_;
  check_rows(rows, kv);
  MD_CHECK(in_flight() < 2, "batched step: a third step launched before the first was finished");
  const int n = static_cast<int>(rows.size());
  bool chained = false;
  for (const StepRow& r : rows) chained |= r.prev_row >= 0;
  MD_REQUIRE(!chained || chain != nullptr, "batched step: chained rows, and no tokens of a previous step");
  Slot& slot = slots_[n_launched_ % 2];
  const int ring_len = n_ring_layers_ > 0 ? kv.ring_len : 0;
  const int window = c.max_sliding_window();
  int max_blocks = 1, full_splits = 0, ring_splits = 0;
  for (const StepRow& r : rows) {
    max_blocks = std::max(max_blocks, r.position / kv.block_size + 1);
    full_splits += decode_splits(r.position + 1).n;
    ring_splits += decode_splits(decode_row_keys(r.position + 1, window).n).n;
  }
  const int total_splits = ring_len > 0 ? std::max(full_splits, ring_splits) : full_splits;  // one layer's at a time
  MD_REQUIRE(ring_len == 0 || prompts.empty(), "batched step: no prompt pieces with sliding-window layers");
  // row_bucket(n) decode rows (padding included), then the pieces' rows, padded to a bucket.
  Shape shape{prompt_row0(n), prompt_row0(n), table_stride(max_blocks), ring_len};
  std::vector<prefill::AttnPieceDesc> pieces;
  int prompt_rows = 0, prompt_table_entries = 0;
  for (const PromptPiece& p : prompts) {
    const int len = static_cast<int>(p.tokens.size());
    const int need = static_cast<int>(prefill::check_prompt_piece(c, p.tokens, p.start_pos, p.block_table, kv));
    MD_REQUIRE(p.start_pos + len <= view_.rope_positions, "batched step: prompt positions up to ", p.start_pos + len,
               " past the model's RoPE table of ", view_.rope_positions);
    pieces.push_back({shape.decode_rows + prompt_rows, len, p.start_pos, prompt_table_entries});
    prompt_rows += len;
    prompt_table_entries += need;
  }
  MD_REQUIRE(prompt_rows <= max_prompt_rows_, "batched step: ", prompt_rows,
             " prompt tokens in one step; this step takes at most ", max_prompt_rows_);
  if (prompt_rows > 0) shape.rows = row_bucket(shape.decode_rows + prompt_rows);
  ensure_capacity(shape, prompt_table_entries, total_splits);

  // The inputs, padding rows included, through one pinned buffer and one copy.
  const Inputs in = inputs(shape, prompt_table_entries);
  uint8_t* staging = slot.staging.reserve(in.bytes);
  std::memset(staging, 0, in.bytes);
  auto* tok = reinterpret_cast<int32_t*>(staging + in.tokens);
  auto* pos = reinterpret_cast<int32_t*>(staging + in.positions);
  auto* toff = reinterpret_cast<int32_t*>(staging + in.table_offsets);
  auto* len = reinterpret_cast<int32_t*>(staging + in.seq_lens);
  auto* sb = reinterpret_cast<int32_t*>(staging + in.split_begin);
  auto* spos = reinterpret_cast<int64_t*>(staging + in.sample_pos);
  auto* sp = reinterpret_cast<SamplingParams*>(staging + in.sampling);
  auto* slots = reinterpret_cast<int32_t*>(staging + in.mask_slots);
  auto* bt = reinterpret_cast<int32_t*>(staging + in.tables);
  auto* pt = reinterpret_cast<int32_t*>(staging + in.prompt_tables);
  const int prompt_table0 = static_cast<int>((in.prompt_tables - in.tables) / sizeof(int32_t));
  std::fill(pos, pos + shape.rows, -1);  // padding unless a row below says otherwise
  std::fill(slots, slots + shape.decode_rows, -1);
  const size_t mask_words = token_mask_words(c.vocab_size);
  int n_masked = 0;
  for (const StepRow& row : rows) n_masked += row.allowed.empty() ? 0 : 1;
  if (n_masked > 0 && masks_ == nullptr) {  // the first constrained step: room for every row's mask
    drop_graphs();  // they launch the sampler without masks
    CUDA_CHECK(cudaMalloc(&masks_, static_cast<size_t>(max_rows_) * mask_words * sizeof(uint32_t)));
  }
  uint32_t* masks_host =
      n_masked > 0 ? reinterpret_cast<uint32_t*>(slot.masks.reserve(n_masked * mask_words * sizeof(uint32_t)))
                   : nullptr;
  int splits = 0, next_slot = 0;
  for (int r = 0; r < shape.decode_rows; ++r) {
    sb[r] = splits;
    toff[r] = r * shape.stride;
    if (r >= n) {  // padding
      spos[r] = -1;
      sp[r] = SamplingParams{};
      continue;
    }
    const StepRow& row = rows[r];
    tok[r] = row.prev_row >= 0 ? -1 - row.prev_row : row.token;  // resolved on the device below
    pos[r] = row.position;
    len[r] = row.position + 1;
    spos[r] = row.position + 1;  // the position the sampled token takes (the megakernel's seq_len)
    sp[r] = row.sampling;
    if (!row.allowed.empty()) {  // the constrained rows' masks, compacted in row order
      slots[r] = next_slot;
      std::copy(row.allowed.begin(), row.allowed.end(), masks_host + static_cast<size_t>(next_slot++) * mask_words);
    }
    const size_t used = static_cast<size_t>(row.position / kv.block_size) + 1;
    std::memcpy(bt + static_cast<size_t>(r) * shape.stride, row.block_table.data(), used * sizeof(int32_t));
    splits += decode_splits(row.position + 1).n;
  }
  sb[shape.decode_rows] = splits;
  if (ring_len > 0) {  // the sliding layers' ring tables (-1 past the blocks a row holds yet) and splits
    auto* roff = reinterpret_cast<int32_t*>(staging + in.ring_offsets);
    auto* rsb = reinterpret_cast<int32_t*>(staging + in.ring_split_begin);
    auto* rt = reinterpret_cast<int32_t*>(staging + in.ring_tables);
    std::fill(rt, rt + static_cast<size_t>(shape.decode_rows) * ring_len, -1);
    int rs = 0;
    for (int r = 0; r < shape.decode_rows; ++r) {
      rsb[r] = rs;
      roff[r] = r * ring_len;
      if (r >= n) continue;
      const size_t held = std::min<size_t>(rows[r].position / kv.block_size + 1, ring_len);  // as check_rows
      std::copy_n(rows[r].ring_table.begin(), held, rt + static_cast<size_t>(r) * ring_len);
      rs += decode_splits(decode_row_keys(rows[r].position + 1, window).n).n;
    }
    rsb[shape.decode_rows] = rs;
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    prefill::AttnPieceDesc& piece = pieces[i];
    for (int t = 0; t < piece.n_tokens; ++t) {
      tok[piece.row0 + t] = prompts[i].tokens[t];
      pos[piece.row0 + t] = piece.start_pos + t;  // >= 0: routed (prefill::MoeListArgs)
      toff[piece.row0 + t] = prompt_table0 + piece.table;
    }
    const int need = (piece.start_pos + piece.n_tokens - 1) / kv.block_size + 1;
    std::memcpy(pt + piece.table, prompts[i].block_table.data(), need * sizeof(int32_t));
    piece.table += prompt_table0;  // the work list's tables are entries past the decode tables' base
  }
  if (shape.rows > shape.decode_rows) {
    *reinterpret_cast<int32_t*>(staging + in.n_work) = prefill::attn_work_list(
        pieces, config_.group_size(), config_.n_kv_heads, piece_attn_ctas_, shape.decode_rows,
        std::span(reinterpret_cast<prefill::AttnWork*>(staging + in.work), in.work_capacity),
        std::span(reinterpret_cast<prefill::AttnMergeRow*>(staging + in.merge), shape.rows - shape.decode_rows));
  }
  CUDA_CHECK(cudaMemcpyAsync(inputs_, staging, in.bytes, cudaMemcpyHostToDevice, stream));
  if (chained) resolve_chained_tokens(reinterpret_cast<int32_t*>(inputs_ + in.tokens), n, chain, stream);
  if (n_masked > 0)
    CUDA_CHECK(cudaMemcpyAsync(masks_, masks_host, static_cast<size_t>(n_masked) * mask_words * sizeof(uint32_t),
                               cudaMemcpyHostToDevice, stream));
  if (poison_) {  // NaN everywhere but the semaphores (the last buffer of the arena)
    const size_t upto = reinterpret_cast<uint8_t*>(split_sem_) - arena_;
    CUDA_CHECK(cudaMemsetAsync(arena_, 0xff, upto, stream));
    CUDA_CHECK(cudaMemsetAsync(part_o_, 0xff, static_cast<size_t>(split_capacity_) * config_.n_heads * config_.head_dim * 4, stream));
    CUDA_CHECK(cudaMemsetAsync(part_ml_, 0xff, static_cast<size_t>(split_capacity_) * config_.n_heads * 2 * 4, stream));
  }

  // The first step of a shape runs eagerly (it also configures every kernel, outside any capture);
  // the second captures the step's graph, which later steps of the shape replay.
  if (graphs_.count(shape.key()) != 0 || !seen_.insert(shape.key()).second) {
    CUDA_CHECK(cudaGraphLaunch(graph_for(shape, kv, stream), stream));
  } else {
    enqueue_step(shape, kv, stream);
  }
  // The outputs: the error word, the tokens (to the host, and to `chain` for a chained next step),
  // the logits when asked.
  slot.tail = StepOutputTail{n, c.vocab_size, want_logits, want_logprobs};
  const size_t at_tail = (1 + static_cast<size_t>(max_rows_)) * sizeof(int32_t);
  uint8_t* out = slot.outputs.reserve(at_tail + slot.tail.bytes());
  CUDA_CHECK(cudaMemcpyAsync(out, error_, sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemcpyAsync(out + sizeof(int32_t), out_tokens_, n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  if (want_logprobs && logprobs_ == nullptr) CUDA_CHECK(cudaMalloc(&logprobs_, max_rows_ * sizeof(RowLogprobs)));
  slot.tail.enqueue(out + at_tail, logits_, out_tokens_, logprobs_, stream);
  if (chain != nullptr)
    CUDA_CHECK(cudaMemcpyAsync(chain, out_tokens_, n * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
  CUDA_CHECK(cudaEventRecord(slot.done, stream));
  slot.rows = n;
  ++n_launched_;
  last_rows_ = n;
  last_shape_ = shape;
  last_kv_ = kv;
}

void BatchedStep::finish(std::vector<int32_t>& tokens, std::vector<float>& logits, std::vector<RowLogprobs>& logprobs) {
  MD_CHECK(in_flight() > 0, "batched step: finish() with no step in flight");
  const Slot& slot = slots_[n_finished_ % 2];
  ++n_finished_;  // whatever happens: the slot is free again
  CUDA_CHECK(cudaEventSynchronize(slot.done));
  const int32_t* out = slot.outputs.as<int32_t>();
  MD_REQUIRE(out[0] == 0, "batched step: the device reported error ", out[0],
             " (a token outside the vocabulary, an expert id out of range, e.g. NaN router logits, or an "
             "expert tile list over capacity)");
  tokens.assign(out + 1, out + 1 + slot.rows);
  slot.tail.unpack(reinterpret_cast<const uint8_t*>(out + 1 + max_rows_), logits, logprobs);
}

cudaGraphExec_t BatchedStep::graph_for(const Shape& shape, const prefill::KvCacheView& kv, cudaStream_t stream) {
  auto found = graphs_.find(shape.key());
  if (found != graphs_.end()) return found->second;
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue_step(shape, kv, stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphDestroy(graph));
  graphs_.emplace(shape.key(), exec);
  last_kv_ = kv;
  return exec;
}

const float* BatchedStep::logits_row(int r) const {
  MD_REQUIRE(r >= 0 && r < last_rows_, "batched step: logits of row ", r, " of a step of ", last_rows_);
  return logits_ + static_cast<int64_t>(r) * config_.vocab_size;
}

void BatchedStep::enqueue_step(const Shape& shape, const prefill::KvCacheView& kv, cudaStream_t stream) {
  const ModelConfig& c = config_;
  const Inputs in = inputs(shape);
  const int bucket = shape.decode_rows;  // the final norm, LM head and sampler: decode rows only
  CUDA_CHECK(cudaMemsetAsync(error_, 0, sizeof(int32_t), stream));
  for (int l = 0; l < c.n_layers; ++l) enqueue_layer(l, shape, kv, stream);

  // The last layer's MoE residual, the final norm, the LM head and the sampler.
  prefill::ResidualNormArgs fn;
  fn.layer_output(c.is_moe_layer(c.n_layers - 1), h_, down_, token_slot_, topk_w_, c.n_experts_per_tok, x_);
  fn.n_tokens = bucket;
  fn.hidden = c.hidden_size;
  fn.norm_w = view_.final_norm;
  fn.eps = view_.rms_eps;
  fn.out = xf_;
  prefill::residual_norm(fn, stream);
  if (marks_) marks_->mark("final_norm");
  gemm::GemmArgs head;
  head.w = view_.lm_head;
  head.n_rows = c.vocab_size;
  head.k = c.hidden_size;
  head.x = xf_;
  head.x_stride = c.hidden_size;
  head.n_tokens = bucket;
  head.y = logits_;
  head.y_stride = c.vocab_size;
  gemm::gemm(head, gemm::Epilogue::kStore, stream);
  if (c.logit_scale != 1.0f) scale_floats(logits_, static_cast<int64_t>(bucket) * c.vocab_size, c.logit_scale, stream);
  if (marks_) marks_->mark("lm_head_gemm");
  sample_tokens(logits_, c.vocab_size, bucket, c.vocab_size,
                reinterpret_cast<const SamplingParams*>(inputs_ + in.sampling),
                reinterpret_cast<const int64_t*>(inputs_ + in.sample_pos), out_tokens_, 1024, stream,
                masks_ != nullptr ? reinterpret_cast<const int32_t*>(inputs_ + in.mask_slots) : nullptr, masks_);
  if (marks_) marks_->mark("sample");
}

void BatchedStep::enqueue_layer(int l, const Shape& shape, const prefill::KvCacheView& kv, cudaStream_t stream) {
  const ModelConfig& c = config_;
  const MkModelWeights& w = view_;
  const MkLayerWeights& lw = layers_[l];
  const Inputs in = inputs(shape);
  const int bucket = shape.rows, stride = shape.stride;  // every row: GEMMs, norms, expert lists
  const auto* positions = reinterpret_cast<const int32_t*>(inputs_ + in.positions);
  const auto* tables = reinterpret_cast<const int32_t*>(inputs_ + in.tables);
  const int H = c.hidden_size, G = c.n_kv_heads, gs = c.group_size(), D = c.head_dim, E = c.n_experts,
            K = c.n_experts_per_tok, I = c.moe_intermediate_size, nq = c.q_size(), qkv_rows = G * (gs + 2) * D;
  // A sliding layer's K/V: its slice of the ring pool, through the rows' ring tables; the others'
  // their slice of the full pool (engine/kv_pools.h).
  const bool ring = shape.ring_len > 0 && lw.kv_ring_index >= 0;
  MD_CHECK(ring == (c.layers[l].sliding_window > 0), "batched step: layer ", l, " with a window of ",
           c.layers[l].sliding_window, " keys ", ring ? "in" : "outside", " the ring pool");
  MD_CHECK(ring || lw.kv_full_index >= 0, "batched step: layer ", l, " has no slice of the full KV pool");
  const bool parallel = c.block == BlockKind::kParallel;
  const int64_t layer_elems = int64_t{2} * (ring ? kv.n_ring_blocks : kv.n_blocks) * G * kv.block_size * D;
  uint16_t* k_cache = (ring ? kv.ring + lw.kv_ring_index * layer_elems : kv.data + lw.kv_full_index * layer_elems);
  uint16_t* v_cache = k_cache + layer_elems / 2;
  const int32_t* kv_tables = ring ? reinterpret_cast<const int32_t*>(inputs_ + in.ring_tables) : tables;

  // x = embedding (layer 0) or the previous layer's MoE residual; xn = input norm.
  prefill::ResidualNormArgs rn;
  if (l == 0) {
    rn.tokens = reinterpret_cast<const int32_t*>(inputs_ + in.tokens);
    rn.embed = w.embed;
    rn.vocab = c.vocab_size;
  } else {
    rn.layer_output(c.is_moe_layer(l - 1), h_, down_, token_slot_, topk_w_, K, x_);
  }
  rn.n_tokens = bucket;
  rn.hidden = H;
  rn.norm_w = lw.input_norm;
  rn.eps = w.rms_eps;
  rn.x = x_;
  rn.out = xn_;
  rn.error = error_;
  prefill::residual_norm(rn, stream);
  if (marks_) marks_->mark("input_norm");

  gemm::GemmArgs dense;  // the fields every dense GEMM of the step shares
  dense.n_tokens = bucket;
  dense.workspace = split_ws_;
  dense.semaphores = split_sem_;

  gemm::GemmArgs qkv = dense;
  qkv.w = lw.qkv;
  qkv.n_rows = qkv_rows;
  qkv.k = H;
  qkv.x = xn_;
  qkv.x_stride = H;
  qkv.y = qkv_;
  qkv.y_stride = qkv_rows;
  qkv.k_splits = qkv_splits_;
  gemm::gemm(qkv, gemm::Epilogue::kStore, stream);
  if (marks_) marks_->mark("qkv_gemm");

  prefill::QkRopeArgs qr;
  qr.qkv = qkv_;
  qr.q_norm = lw.q_norm;  // nullptr (cohere2_moe): none
  qr.k_norm = lw.k_norm;
  qr.rope = w.rope;
  qr.rope_positions = w.rope_positions;
  qr.use_rope = c.layers[l].use_rope;
  qr.rope_interleaved = w.rope_interleaved != 0;
  qr.block_table = kv_tables;
  qr.positions = positions;
  qr.table_offsets = reinterpret_cast<const int32_t*>(inputs_ + (ring ? in.ring_offsets : in.table_offsets));
  qr.ring_len = ring ? shape.ring_len : 0;
  qr.n_tokens = bucket;  // decode and prompt rows (padding skipped)
  qr.n_kv_heads = G;
  qr.group_size = gs;
  qr.head_dim = D;
  qr.block_size = kv.block_size;
  qr.eps = w.rms_eps;
  qr.q = q_;
  qr.k_cache = k_cache;
  qr.v_cache = v_cache;
  prefill::qk_norm_rope_store(qr, stream);
  if (marks_) marks_->mark("qk_norm_rope_kv");

  DecodeAttnArgs at;
  at.q = q_;
  at.k_cache = k_cache;
  at.v_cache = v_cache;
  at.block_tables = kv_tables;
  at.table_stride = ring ? shape.ring_len : stride;
  at.seq_lens = reinterpret_cast<const int32_t*>(inputs_ + in.seq_lens);
  at.split_begin = reinterpret_cast<const int32_t*>(inputs_ + (ring ? in.ring_split_begin : in.split_begin));
  at.window = c.layers[l].sliding_window;
  at.ring_len = ring ? shape.ring_len : 0;
  at.n_rows = shape.decode_rows;
  at.n_kv_heads = G;
  at.group_size = gs;
  at.head_dim = D;
  at.block_size = kv.block_size;
  at.scale = w.attn_scale;
  at.part_o = part_o_;
  at.part_ml = part_ml_;
  at.split_capacity = split_capacity_;
  at.out = attn_;
  decode_attention(at, stream);
  if (shape.rows > shape.decode_rows) {  // the pieces: causal over each piece and its prompt's earlier keys
    prefill::AttnArgs pa;
    pa.q = q_;
    pa.k_cache = k_cache;
    pa.v_cache = v_cache;
    pa.block_table = tables;
    pa.n_kv_heads = G;
    pa.group_size = gs;
    pa.head_dim = D;
    pa.block_size = kv.block_size;
    pa.kv_blocks = kv.n_blocks;
    pa.scale = w.attn_scale;
    pa.out = attn_;
    pa.part_o = piece_part_o_;
    pa.part_ml = piece_part_ml_;
    pa.work = reinterpret_cast<const prefill::AttnWork*>(inputs_ + in.work);
    pa.n_work = reinterpret_cast<const int32_t*>(inputs_ + in.n_work);
    pa.work_ctas = std::max(1, piece_attn_ctas_ / G);
    pa.merge = reinterpret_cast<const prefill::AttnMergeRow*>(inputs_ + in.merge);
    pa.merge_row0 = shape.decode_rows;
    pa.merge_rows = shape.rows - shape.decode_rows;
    prefill::attention(pa, stream);
  }
  if (marks_) marks_->mark("attention");

  gemm::GemmArgs o = dense;  // h = x + O-proj(attn)
  o.w = lw.o_proj;
  o.n_rows = H;
  o.k = nq;
  o.x = attn_;
  o.x_stride = nq;
  o.y = h_;
  o.y_stride = H;
  o.residual = x_;
  o.residual_stride = H;
  o.k_splits = o_splits_;
  gemm::gemm(o, gemm::Epilogue::kResidual, stream);
  if (marks_) marks_->mark("o_proj_gemm");

  // The FFN's input: a parallel block's input norm (xn_ as QKV read it), else the post norm of h.
  if (!parallel) {
    rms_norm(h_, H, lw.post_norm, xn_, H, bucket, H, w.rms_eps, stream);
    if (marks_) marks_->mark("post_norm");
  }
  if (!c.is_moe_layer(l)) {
    enqueue_dense_ffn(l, shape, stream);
    return;
  }

  gemm::GemmArgs router = dense;
  router.w = lw.router;
  router.n_rows = E;
  router.k = H;
  router.x = xn_;
  router.x_stride = H;
  router.y = router_;
  router.y_stride = E;
  router.k_splits = router_splits_;
  gemm::gemm(router, gemm::Epilogue::kStore, stream);
  if (marks_) marks_->mark("router_gemm");
  router_topk(router_, E, bucket, E, K, w.norm_topk != 0, topk_ids_, topk_w_, stream, w.router_sigmoid != 0);
  if (marks_) marks_->mark("router_topk");
  if (route_ids_) {  // routing capture: row r's K choices of layer l at [r][l][*]
    const size_t row = static_cast<size_t>(c.n_layers) * K;
    CUDA_CHECK(cudaMemcpy2DAsync(route_ids_ + static_cast<size_t>(l) * K, row * sizeof(int32_t), topk_ids_,
                                 K * sizeof(int32_t), K * sizeof(int32_t), bucket, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemcpy2DAsync(route_w_ + static_cast<size_t>(l) * K, row * sizeof(float), topk_w_, K * sizeof(float),
                                 K * sizeof(float), bucket, cudaMemcpyDeviceToDevice, stream));
  }

  const int tg = expert_token_groups(c, row_bucket(bucket));  // the capacity's tile size for this many rows
  prefill::MoeListArgs ml;
  ml.topk_ids = topk_ids_;
  ml.positions = positions;
  ml.n_tokens = bucket;
  ml.top_k = K;
  ml.n_experts = E;
  ml.tile_tokens = 8 * tg;
  ml.rank = rank_;
  ml.counts = counts_;
  ml.offsets = offsets_;
  ml.token_slot = token_slot_;
  ml.tiles = tiles_;
  ml.n_tiles = n_tiles_;
  ml.tile_capacity = tile_capacity_;
  ml.error = error_;
  // The normed rows in slot order, in down_'s memory (bf16 [R*K][H], half of it): the gate/up GEMM
  // reads them before the down GEMM overwrites them (one stream).
  uint16_t* x_slots = reinterpret_cast<uint16_t*>(down_);
  ml.copy_rows(xn_, H, x_slots);
  prefill::moe_lists(ml, stream);
  if (marks_) marks_->mark("moe_lists");

  gemm::GemmArgs up;  // hidden[slot] = SiLU(gate) * up of the slot's row, per expert tile
  up.w = lw.experts_up;
  up.w_expert_stride = lw.expert_up_elems;
  up.n_experts = E;
  up.n_rows = 2 * I;
  up.k = H;
  up.x = x_slots;
  up.x_stride = H;
  up.x_rows = bucket * K;
  up.tiles = tiles_;
  up.n_tiles = n_tiles_;
  up.tile_capacity = tile_capacity_;
  up.token_groups = tg;
  up.y = hidden_;
  up.y_stride = I;
  gemm::gemm(up, gemm::Epilogue::kSwiGlu, stream);
  if (marks_) marks_->mark("expert_up_gemm");

  gemm::GemmArgs down = up;  // down[slot] = W_down(expert) hidden[slot]
  down.w = lw.experts_down;
  down.w_expert_stride = lw.expert_down_elems;
  down.n_rows = H;
  down.k = I;
  down.x = hidden_;
  down.x_stride = I;
  down.x_rows = bucket * K;
  down.y = down_;
  down.y_stride = H;
  gemm::gemm(down, gemm::Epilogue::kStore, stream);
  if (marks_) marks_->mark("expert_down_gemm");
}

void BatchedStep::enqueue_dense_ffn(int l, const Shape& shape, cudaStream_t stream) {
  const ModelConfig& c = config_;
  const MkLayerWeights& lw = layers_[l];
  const int H = c.hidden_size, Id = c.intermediate_size, K = c.n_experts_per_tok;
  if (route_ids_) capture_dense_routing(route_ids_, route_w_, l, c.n_layers, K, shape.rows, stream);
  // hidden = SiLU(gate) * up of every row, then down = W_down hidden, fp32 [R][H]: the next norm adds it to h.
  gemm::swiglu_mlp(lw.dense_up, lw.dense_down, H, Id, H, xn_, H, shape.rows, hidden_, down_, stream);
  if (marks_) marks_->mark("dense_ffn_gemms");
}

std::vector<std::pair<std::string, double>> BatchedStep::profile_last_step(cudaStream_t stream) {
  MD_REQUIRE(last_rows_ > 0, "batched step: profile_last_step needs a step first");
  KernelMarks marks(stream);
  marks_ = &marks;
  enqueue_step(last_shape_, last_kv_, stream);  // eagerly, an event after each launch
  marks_ = nullptr;
  return marks.collect();
}

std::vector<float> BatchedStep::time_last_step(int warmup, int reps, cudaStream_t stream) {
  MD_REQUIRE(last_rows_ > 0 && in_flight() == 0, "batched step: time_last_step needs a step first, and none in flight");
  MD_REQUIRE(warmup >= 0 && reps >= 1, "time_last_step: warmup ", warmup, ", reps ", reps);
  const cudaGraphExec_t exec = graph_for(last_shape_, last_kv_, stream);
  return time_graph_replays(exec, warmup, reps, stream, [&] {
    int32_t error = 0;
    CUDA_CHECK(cudaMemcpy(&error, error_, sizeof(int32_t), cudaMemcpyDeviceToHost));
    MD_REQUIRE(error == 0, "batched step: the device reported error ", error);
  });
}

void BatchedStep::set_routing_capture(bool on) {
  if (on == (route_ids_ != nullptr)) return;
  drop_graphs();  // the graphs do (or do not) copy the routing
  if (!on) {
    CUDA_CHECK(cudaFree(route_ids_));
    CUDA_CHECK(cudaFree(route_w_));
    route_ids_ = nullptr;
    route_w_ = nullptr;
    return;
  }
  const size_t n = static_cast<size_t>(max_all_rows_) * config_.n_layers * config_.n_experts_per_tok;
  CUDA_CHECK(cudaMalloc(&route_ids_, n * sizeof(int32_t)));
  CUDA_CHECK(cudaMalloc(&route_w_, n * sizeof(float)));
}

void BatchedStep::read_routing(int n_rows, std::vector<int32_t>& experts, std::vector<float>& weights) const {
  MD_REQUIRE(route_ids_ != nullptr, "batched step: routing capture is off");
  MD_REQUIRE(n_rows >= 1 && n_rows <= max_all_rows_, "batched step: routing of ", n_rows, " rows outside 1..",
             max_all_rows_);
  const size_t n = static_cast<size_t>(n_rows) * config_.n_layers * config_.n_experts_per_tok;
  experts.resize(n);
  weights.resize(n);
  CUDA_CHECK(cudaMemcpy(experts.data(), route_ids_, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(weights.data(), route_w_, n * sizeof(float), cudaMemcpyDeviceToHost));
}

}  // namespace megadecode::cuda::batched
