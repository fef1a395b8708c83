// PrefillRunner: workspace layout, host-side checks of a piece, and the per-layer launch sequence
// (prefill_kernels.h). One host sync per piece, at the end (logits and the device error word).
#include "cuda/prefill/prefill_runner.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "engine/decode_rows.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_marks.h"
#include "cuda/common/workspace_carver.h"
#include "cuda/common/kernels.h"
#include "cuda/gemm/gemm.h"
#include "cuda/prefill/prefill_kernels.h"
#include "kv/kv_cache.h"

namespace megadecode::cuda::prefill {
namespace {

struct Shape {
  int64_t C, H, qkv_rows, nq, E, K, I, V;
  int64_t hidden_per_row;  // the FFN's SiLU(gate) * up elements a token: K experts', or a dense layer's
  explicit Shape(const ModelConfig& c, int max_chunk)
      : C(max_chunk), H(c.hidden_size), qkv_rows(int64_t{c.n_kv_heads} * (c.group_size() + 2) * c.head_dim),
        nq(c.q_size()), E(c.n_experts), K(c.n_experts_per_tok), I(c.moe_intermediate_size), V(c.vocab_size),
        hidden_per_row(c.ffn_act_per_token()) {}
};

// Prompt pieces take the engine's largest tiles (128 slots): at 2K tokens an expert has ~128 rows.
constexpr int kExpertTokenGroups = gemm::kMaxTokenGroups;
int tile_capacity(const Shape& s) {
  return gemm::moe_tile_capacity(static_cast<int>(s.C * s.K), static_cast<int>(s.E), 8 * kExpertTokenGroups);
}

}  // namespace

size_t PrefillRunner::workspace_bytes(const ModelConfig& config, int max_chunk) {
  const Shape s(config, max_chunk);
  WorkspaceCarver c(nullptr);
  c.take<int32_t>(s.C);
  c.take<int32_t>(4);
  c.take<float>(s.C * s.H);
  c.take<float>(s.C * s.H);
  c.take<uint16_t>(s.C * s.H);
  c.take<float>(s.C * s.qkv_rows);
  c.take<uint16_t>(s.C * s.nq);
  c.take<uint16_t>(s.C * s.nq);
  c.take<float>(s.C * s.E);
  c.take<int32_t>(s.C * s.K);
  c.take<float>(s.C * s.K);
  c.take<int32_t>(s.C * s.K);
  c.take<int32_t>(s.C * s.K);
  c.take<int32_t>(s.E);
  c.take<int32_t>(s.E + 1);
  c.take<int32_t>(1);
  c.take<gemm::MoeTile>(tile_capacity(s));
  c.take<uint16_t>(s.C * s.hidden_per_row);
  c.take<float>(s.C * s.K * s.H);
  c.take<uint16_t>(s.H);
  c.take<float>(s.V);
  return c.bytes();
}

PrefillRunner::PrefillRunner(const ModelConfig& config, const MkModelWeights& view,
                             std::span<const MkLayerWeights> layers, int max_chunk)
    : config_(config), view_(view), layers_(layers.begin(), layers.end()), max_chunk_(max_chunk) {
  const ModelConfig& cfg = config_;
  MD_REQUIRE(layers_.size() == static_cast<size_t>(cfg.n_layers), "PrefillRunner: ", layers_.size(),
             " layers of weights for a model of ", cfg.n_layers);
  MD_REQUIRE(max_chunk >= 1 && max_chunk <= 65536, "prefill chunk size ", max_chunk, " outside 1..65536");
  MD_REQUIRE(int64_t{max_chunk} * cfg.n_experts_per_tok <= (int64_t{1} << 24),
             "prefill chunk size ", max_chunk, " x top-k is too large");
  MD_REQUIRE(cfg.hidden_size % 16 == 0 && cfg.q_size() % 16 == 0, "prefill: hidden and q widths must be multiples of 16");
  n_ring_layers_ = cfg.n_sliding_layers();
  for (int l = 0; l < cfg.n_layers; ++l) {
    MD_REQUIRE(cfg.is_moe_layer(l) ? layers_[l].router != nullptr : layers_[l].dense_up != nullptr, "prefill: layer ",
               l, " has no ", cfg.is_moe_layer(l) ? "router" : "dense FFN", " weights");
  }
  const Shape s(cfg, max_chunk);
  tile_capacity_ = tile_capacity(s);
  arena_bytes_ = workspace_bytes(cfg, max_chunk);
  CUDA_CHECK(cudaMalloc(&arena_, arena_bytes_));
  WorkspaceCarver c(arena_);
  tokens_ = c.take<int32_t>(s.C);
  error_ = c.take<int32_t>(4);
  x_ = c.take<float>(s.C * s.H);
  h_ = c.take<float>(s.C * s.H);
  xn_ = c.take<uint16_t>(s.C * s.H);
  qkv_ = c.take<float>(s.C * s.qkv_rows);
  q_ = c.take<uint16_t>(s.C * s.nq);
  attn_ = c.take<uint16_t>(s.C * s.nq);
  router_ = c.take<float>(s.C * s.E);
  topk_ids_ = c.take<int32_t>(s.C * s.K);
  topk_w_ = c.take<float>(s.C * s.K);
  rank_ = c.take<int32_t>(s.C * s.K);
  token_slot_ = c.take<int32_t>(s.C * s.K);
  counts_ = c.take<int32_t>(s.E);
  offsets_ = c.take<int32_t>(s.E + 1);
  n_tiles_ = c.take<int32_t>(1);
  tiles_ = c.take<gemm::MoeTile>(tile_capacity_);
  hidden_ = c.take<uint16_t>(s.C * s.hidden_per_row);
  down_ = c.take<float>(s.C * s.K * s.H);
  xf_ = c.take<uint16_t>(s.H);
  logits_ = c.take<float>(s.V);
  MD_CHECK(c.bytes() == arena_bytes_, "prefill workspace layout drifted from workspace_bytes");
  CUDA_CHECK(cudaMallocHost(&error_host_, sizeof(int32_t)));
}

PrefillRunner::~PrefillRunner() {
  CUDA_CHECK_NOTHROW(cudaFree(arena_));
  CUDA_CHECK_NOTHROW(cudaFree(block_table_));
  CUDA_CHECK_NOTHROW(cudaFreeHost(staging_));
  CUDA_CHECK_NOTHROW(cudaFreeHost(error_host_));
  CUDA_CHECK_NOTHROW(cudaFree(route_ids_));
  CUDA_CHECK_NOTHROW(cudaFree(route_w_));
  CUDA_CHECK_NOTHROW(cudaFree(ring_table_));
  CUDA_CHECK_NOTHROW(cudaFree(scratch_));
  CUDA_CHECK_NOTHROW(cudaFree(scratch_table_));
}

void PrefillRunner::ensure_scratch(int block_size) {
  const ModelConfig& c = config_;
  const int blocks = sliding_scratch_blocks(c.max_sliding_window(), block_size, max_chunk_);
  if (block_size == scratch_block_size_ && blocks <= scratch_blocks_) return;
  CUDA_CHECK(cudaDeviceSynchronize());  // an earlier piece may still read the old scratch
  CUDA_CHECK(cudaFree(scratch_));
  CUDA_CHECK(cudaFree(scratch_table_));
  scratch_ = nullptr;
  scratch_table_ = nullptr;
  const size_t elems = static_cast<size_t>(blocks) * c.n_kv_heads * block_size * c.head_dim;
  CUDA_CHECK(cudaMalloc(&scratch_, 2 * elems * sizeof(uint16_t)));
  CUDA_CHECK(cudaMemset(scratch_, 0, 2 * elems * sizeof(uint16_t)));  // finite from the start (no row is read unwritten)
  std::vector<int32_t> identity(blocks);
  for (int i = 0; i < blocks; ++i) identity[i] = i;
  CUDA_CHECK(cudaMalloc(&scratch_table_, blocks * sizeof(int32_t)));
  CUDA_CHECK(cudaMemcpy(scratch_table_, identity.data(), blocks * sizeof(int32_t), cudaMemcpyHostToDevice));
  // The memset and a copy from pageable memory may still be in flight when they return, and the
  // runner's stream does not wait for the legacy stream they ran on.
  CUDA_CHECK(cudaDeviceSynchronize());
  scratch_blocks_ = blocks;
  scratch_block_size_ = block_size;
}

size_t check_prompt_piece(const ModelConfig& c, std::span<const int32_t> tokens, int start_pos,
                          std::span<const int32_t> block_table, const KvCacheView& kv) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  MD_REQUIRE(T >= 1, "prefill: empty chunk");
  MD_REQUIRE(kv.data != nullptr && kv.block_size >= 1 && kv.n_blocks >= 1, "prefill: no KV cache");
  MD_REQUIRE(start_pos >= 0 && start_pos + T <= c.max_position_embeddings, "prefill: positions [", start_pos, ", ",
             start_pos + T, ") outside [0, ", c.max_position_embeddings, ")");
  for (int64_t i = 0; i < T; ++i)
    MD_REQUIRE(tokens[i] >= 0 && tokens[i] < c.vocab_size, "prefill: token ", tokens[i], " at position ",
               start_pos + i, " outside the vocabulary [0, ", c.vocab_size, ")");
  const size_t need = static_cast<size_t>((start_pos + T + kv.block_size - 1) / kv.block_size);
  MD_REQUIRE(block_table.size() >= need, "prefill: block table covers ", block_table.size(), " blocks, positions up to ",
             start_pos + T - 1, " need ", need);
  for (size_t b = 0; b < need; ++b)
    MD_REQUIRE(block_table[b] >= 0 && block_table[b] < kv.n_blocks, "prefill: block ", block_table[b],
               " outside the cache's ", kv.n_blocks, " blocks");
  return need;
}

int PrefillRunner::ring_length(const KvCacheView& kv) const {
  return n_ring_layers_ > 0 ? kv_ring_length(config_.max_sliding_window(), kv.block_size) : 0;
}

size_t PrefillRunner::check(std::span<const int32_t> tokens, int start_pos, std::span<const int32_t> block_table,
                            const KvCacheView& kv, std::span<const int32_t> ring_table) const {
  const size_t need = check_prompt_piece(config_, tokens, start_pos, block_table, kv);
  const int ring_len = ring_length(kv);
  if (ring_len > 0)
    MD_REQUIRE(kv.ring != nullptr && kv.ring_len == ring_len && kv.n_ring_blocks >= ring_len, "prefill: the ",
               n_ring_layers_, " sliding-window layers need a ring pool of rings of ", ring_len, " blocks; the cache has ",
               kv.n_ring_blocks, " ring blocks, rings of ", kv.ring_len);
  check_ring_table(ring_table, need, ring_len, kv.n_ring_blocks,
                   cat("prefill: positions up to ", start_pos + static_cast<int>(tokens.size()) - 1));
  return need;
}

void PrefillRunner::run(std::span<const int32_t> tokens, int start_pos, std::span<const int32_t> block_table,
                        const KvCacheView& kv, std::span<float> last_logits, cudaStream_t stream,
                        std::span<const int32_t> ring_table) {
  const ModelConfig& c = config_;
  const int T = static_cast<int>(tokens.size());
  MD_REQUIRE(T >= 1 && T <= max_chunk_, "prefill: piece of ", tokens.size(), " tokens outside 1..", max_chunk_);
  MD_REQUIRE(last_logits.empty() || last_logits.size() == static_cast<size_t>(c.vocab_size), "prefill: last_logits has ",
             last_logits.size(), " floats, vocab is ", c.vocab_size);
  const size_t need = check(tokens, start_pos, block_table, kv, ring_table);
  const int ring_len = ring_length(kv);
  const size_t ring_need = std::min<size_t>(need, ring_len);

  // Inputs: tokens, the block table and the ring table through one pinned buffer.
  const size_t staging_need = (static_cast<size_t>(T) + need + ring_len) * sizeof(int32_t);
  if (staging_need > staging_bytes_) {
    CUDA_CHECK(cudaStreamSynchronize(stream));  // the old buffer may still feed a copy
    CUDA_CHECK(cudaFreeHost(staging_));
    staging_ = nullptr;
    CUDA_CHECK(cudaMallocHost(&staging_, staging_need));
    staging_bytes_ = staging_need;
  }
  if (need > block_table_capacity_) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaFree(block_table_));
    block_table_ = nullptr;
    CUDA_CHECK(cudaMalloc(&block_table_, need * sizeof(int32_t)));
    block_table_capacity_ = need;
  }
  if (ring_len > ring_table_capacity_) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaFree(ring_table_));
    ring_table_ = nullptr;
    CUDA_CHECK(cudaMalloc(&ring_table_, ring_len * sizeof(int32_t)));
    ring_table_capacity_ = ring_len;
  }
  if (ring_len > 0) ensure_scratch(kv.block_size);
  std::memcpy(staging_, tokens.data(), T * sizeof(int32_t));
  std::memcpy(staging_ + T * sizeof(int32_t), block_table.data(), need * sizeof(int32_t));
  if (ring_len > 0) {  // entries past the ones the piece reaches: -1 (never read)
    auto* rt = reinterpret_cast<int32_t*>(staging_ + (T + need) * sizeof(int32_t));
    std::fill(rt, rt + ring_len, -1);
    std::copy_n(ring_table.begin(), ring_need, rt);
    CUDA_CHECK(cudaMemcpyAsync(ring_table_, rt, ring_len * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  }
  CUDA_CHECK(cudaMemcpyAsync(tokens_, staging_, T * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(block_table_, staging_ + T * sizeof(int32_t), need * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemsetAsync(error_, 0, sizeof(int32_t), stream));

  for (int l = 0; l < c.n_layers; ++l) enqueue_layer(l, T, start_pos, kv, stream);

  // The last layer's output (MoE residual, or a dense layer's) of the last token, final norm, LM head.
  const MkModelWeights& w = view_;
  ResidualNormArgs fn;
  fn.layer_output(c.is_moe_layer(c.n_layers - 1), h_, down_, token_slot_, topk_w_, c.n_experts_per_tok, x_);
  fn.token_begin = T - 1;
  fn.n_tokens = T;
  fn.hidden = c.hidden_size;
  fn.norm_w = w.final_norm;
  fn.eps = w.rms_eps;
  fn.out = xf_;
  residual_norm(fn, stream);
  if (marks_) marks_->mark("final_norm");
  if (!last_logits.empty()) {
    gemm::GemmArgs g;
    g.w = w.lm_head;
    g.x = xf_;
    g.y = logits_;
    g.n_rows = c.vocab_size;
    g.k = c.hidden_size;
    g.n_tokens = 1;
    g.x_stride = c.hidden_size;
    g.y_stride = c.vocab_size;
    gemm::gemm(g, gemm::Epilogue::kStore, stream);
    if (c.logit_scale != 1.0f) scale_floats(logits_, c.vocab_size, c.logit_scale, stream);
    if (marks_) marks_->mark("lm_head_gemm");
  }
  CUDA_CHECK(cudaMemcpyAsync(error_host_, error_, sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  if (!last_logits.empty())
    CUDA_CHECK(cudaMemcpyAsync(last_logits.data(), logits_, last_logits.size() * sizeof(float),
                               cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  MD_REQUIRE(*error_host_ == 0, "prefill: the device reported error ", *error_host_,
             " (1: an expert id out of range, e.g. NaN router logits; 2: MoE tile list over capacity)");
}

void PrefillRunner::set_routing_capture(bool on) {
  if (on == (route_ids_ != nullptr)) return;
  if (!on) {
    CUDA_CHECK(cudaFree(route_ids_));
    CUDA_CHECK(cudaFree(route_w_));
    route_ids_ = nullptr;
    route_w_ = nullptr;
    return;
  }
  const size_t n = static_cast<size_t>(max_chunk_) * config_.n_layers * config_.n_experts_per_tok;
  CUDA_CHECK(cudaMalloc(&route_ids_, n * sizeof(int32_t)));
  CUDA_CHECK(cudaMalloc(&route_w_, n * sizeof(float)));
}

void PrefillRunner::read_routing(int n_tokens, std::vector<int32_t>& experts, std::vector<float>& weights) const {
  MD_REQUIRE(route_ids_ != nullptr, "prefill: routing capture is off");
  MD_REQUIRE(n_tokens >= 1 && n_tokens <= max_chunk_, "prefill: routing of ", n_tokens, " tokens outside 1..", max_chunk_);
  const size_t n = static_cast<size_t>(n_tokens) * config_.n_layers * config_.n_experts_per_tok;
  experts.resize(n);
  weights.resize(n);
  CUDA_CHECK(cudaMemcpy(experts.data(), route_ids_, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(weights.data(), route_w_, n * sizeof(float), cudaMemcpyDeviceToHost));
}

void PrefillRunner::enqueue_layer(int l, int T, int start_pos, const KvCacheView& kv, cudaStream_t stream) {
  const ModelConfig& c = config_;
  const MkModelWeights& w = view_;
  const MkLayerWeights& lw = layers_[l];
  const int H = c.hidden_size, G = c.n_kv_heads, gs = c.group_size(), D = c.head_dim, K = c.n_experts_per_tok,
            nq = c.q_size(), qkv_rows = G * (gs + 2) * D;
  // A sliding layer: the piece runs in the scratch (prefill_index.h sliding_piece), its window's
  // earlier keys copied in from the sequence's ring first, its last positions written back after.
  // A full-attention layer: its slice of the full pool (engine/kv_pools.h).
  const int window = c.layers[l].sliding_window;
  const bool sliding = window > 0;
  MD_CHECK(!sliding || (lw.kv_ring_index >= 0 && kv.ring != nullptr && ring_table_ != nullptr),
           "prefill: sliding layer ", l, " without its ring (run() checks the ring pool first)");
  MD_CHECK(sliding || lw.kv_full_index >= 0, "prefill: layer ", l, " has no slice of the full KV pool");
  const int64_t layer_elems = int64_t{2} * kv.n_blocks * G * kv.block_size * D;
  uint16_t* k_cache = sliding ? nullptr : kv.data + lw.kv_full_index * layer_elems;
  uint16_t* v_cache = sliding ? nullptr : k_cache + layer_elems / 2;
  const int ring_len = sliding ? kv.ring_len : 0;
  const SlidingPiece sp = sliding ? sliding_piece(start_pos, T, window, kv.block_size, ring_len) : SlidingPiece{0, 0, 0};
  RingCopyArgs rc;
  if (sliding) {
    const int64_t ring_elems = int64_t{2} * kv.n_ring_blocks * G * kv.block_size * D;
    const int64_t scratch_elems = static_cast<int64_t>(scratch_blocks_) * G * kv.block_size * D;
    MD_CHECK(sp.positions <= scratch_blocks_ * kv.block_size, "prefill: the sliding scratch is too small");
    rc.ring_k = kv.ring + lw.kv_ring_index * ring_elems;
    rc.ring_v = rc.ring_k + ring_elems / 2;
    rc.ring_table = ring_table_;
    rc.ring_len = ring_len;
    rc.scratch_k = scratch_;
    rc.scratch_v = scratch_ + scratch_elems;
    rc.base = sp.base;
    rc.n_kv_heads = G;
    rc.block_size = kv.block_size;
    rc.head_dim = D;
    k_cache = rc.scratch_k;
    v_cache = rc.scratch_v;
  }
  const int32_t* kv_table = sliding ? scratch_table_ : block_table_;

  // x = embedding (layer 0) or the previous layer's output; xn = input norm.
  ResidualNormArgs rn;
  if (l == 0) {
    rn.tokens = tokens_;
    rn.embed = w.embed;
    rn.vocab = c.vocab_size;
  } else {
    rn.layer_output(c.is_moe_layer(l - 1), h_, down_, token_slot_, topk_w_, K, x_);
  }
  rn.n_tokens = T;
  rn.hidden = H;
  rn.norm_w = lw.input_norm;
  rn.eps = w.rms_eps;
  rn.x = x_;
  rn.out = xn_;
  rn.error = error_;
  residual_norm(rn, stream);
  if (marks_) marks_->mark("input_norm");

  gemm::GemmArgs qkv;
  qkv.w = lw.qkv;
  qkv.n_rows = qkv_rows;
  qkv.k = H;
  qkv.x = xn_;
  qkv.x_stride = H;
  qkv.n_tokens = T;
  qkv.y = qkv_;
  qkv.y_stride = qkv_rows;
  gemm::gemm(qkv, gemm::Epilogue::kStore, stream);
  if (marks_) marks_->mark("qkv_gemm");

  if (sliding) {  // the window's keys before the piece: ring -> scratch
    rc.begin = sp.base;
    rc.end = start_pos;
    rc.to_ring = false;
    ring_copy(rc, stream);
  }
  QkRopeArgs qr;
  qr.qkv = qkv_;
  qr.q_norm = lw.q_norm;  // nullptr (cohere2_moe): none
  qr.k_norm = lw.k_norm;
  qr.rope = w.rope;
  qr.rope_positions = w.rope_positions;
  qr.use_rope = c.layers[l].use_rope;
  qr.rope_interleaved = w.rope_interleaved != 0;
  qr.block_table = kv_table;
  qr.cache_pos_offset = sp.base;
  qr.start_pos = start_pos;
  qr.n_tokens = T;
  qr.n_kv_heads = G;
  qr.group_size = gs;
  qr.head_dim = D;
  qr.block_size = kv.block_size;
  qr.eps = w.rms_eps;
  qr.q = q_;
  qr.k_cache = k_cache;
  qr.v_cache = v_cache;
  qk_norm_rope_store(qr, stream);
  if (marks_) marks_->mark("qk_norm_rope_kv");

  AttnArgs at;
  at.q = q_;
  at.k_cache = k_cache;
  at.v_cache = v_cache;
  at.block_table = kv_table;
  at.start_pos = start_pos - sp.base;  // the scratch's positions for a sliding layer
  at.n_tokens = T;
  at.n_kv_heads = G;
  at.group_size = gs;
  at.head_dim = D;
  at.block_size = kv.block_size;
  at.kv_blocks = sliding ? scratch_blocks_ : kv.n_blocks;
  at.window = sliding ? window : 0;
  at.scale = w.attn_scale;
  at.out = attn_;
  attention(at, stream);
  if (sliding) {  // the positions of the ring's last ring_len blocks: scratch -> ring
    rc.begin = sp.write_begin;
    rc.end = start_pos + T;
    rc.to_ring = true;
    ring_copy(rc, stream);
  }
  if (marks_) marks_->mark("attention");

  enqueue_o_proj(l, T, stream);
  if (!c.is_moe_layer(l)) {  // a dense layer: down_ = its FFN of every token, [T][H]
    if (route_ids_) capture_dense_routing(route_ids_, route_w_, l, c.n_layers, K, T, stream);
    gemm::swiglu_mlp(lw.dense_up, lw.dense_down, H, c.intermediate_size, H, xn_, H, T, hidden_, down_, stream);
    if (marks_) marks_->mark("dense_ffn_gemms");
    return;
  }
  enqueue_moe(l, T, stream);
}

void PrefillRunner::enqueue_o_proj(int l, int T, cudaStream_t stream) {
  const ModelConfig& c = config_;
  const MkModelWeights& w = view_;
  const MkLayerWeights& lw = layers_[l];
  const int H = c.hidden_size, nq = c.q_size();

  // h = x + O-proj(attn). A sequential block: the GEMM stores O-proj(attn) in h, the post norm adds
  // x in place (the GEMM's residual epilogue stalled its MMAs on the residual's loads: 381 against
  // 248 us at 8192 tokens in bench gemm; the norm reads the two rows for ~30 us more). A parallel
  // block has no post norm (its FFN reads the input norm, xn_): the residual epilogue adds x.
  const bool parallel = c.block == BlockKind::kParallel;
  gemm::GemmArgs o;
  o.w = lw.o_proj;
  o.n_rows = H;
  o.k = nq;
  o.x = attn_;
  o.x_stride = nq;
  o.n_tokens = T;
  o.y = h_;
  o.y_stride = H;
  if (parallel) {
    o.residual = x_;
    o.residual_stride = H;
  }
  gemm::gemm(o, parallel ? gemm::Epilogue::kResidual : gemm::Epilogue::kStore, stream);
  if (marks_) marks_->mark("o_proj_gemm");
  if (parallel) return;

  ResidualNormArgs pn;
  pn.h = x_;
  pn.add = h_;
  pn.n_tokens = T;
  pn.hidden = H;
  pn.norm_w = lw.post_norm;
  pn.eps = w.rms_eps;
  pn.x = h_;
  pn.out = xn_;
  residual_norm(pn, stream);
  if (marks_) marks_->mark("post_norm");
}

// The MoE FFN of xn_ (the post norm, or a parallel block's input norm) into down_, per slot.
void PrefillRunner::enqueue_moe(int l, int T, cudaStream_t stream) {
  const ModelConfig& c = config_;
  const MkModelWeights& w = view_;
  const MkLayerWeights& lw = layers_[l];
  const int H = c.hidden_size, E = c.n_experts, K = c.n_experts_per_tok, I = c.moe_intermediate_size;

  gemm::GemmArgs router;
  router.w = lw.router;
  router.n_rows = E;
  router.k = H;
  router.x = xn_;
  router.x_stride = H;
  router.n_tokens = T;
  router.y = router_;
  router.y_stride = E;
  gemm::gemm(router, gemm::Epilogue::kStore, stream);
  if (marks_) marks_->mark("router_gemm");
  router_topk(router_, E, T, E, K, w.norm_topk != 0, topk_ids_, topk_w_, stream, w.router_sigmoid != 0);
  if (marks_) marks_->mark("router_topk");
  if (route_ids_) {  // routing capture: token t's K choices of layer l at [t][l][*]
    const size_t row = static_cast<size_t>(c.n_layers) * K;
    CUDA_CHECK(cudaMemcpy2DAsync(route_ids_ + static_cast<size_t>(l) * K, row * sizeof(int32_t), topk_ids_,
                                 K * sizeof(int32_t), K * sizeof(int32_t), T, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemcpy2DAsync(route_w_ + static_cast<size_t>(l) * K, row * sizeof(float), topk_w_, K * sizeof(float),
                                 K * sizeof(float), T, cudaMemcpyDeviceToDevice, stream));
  }

  MoeListArgs ml;
  ml.topk_ids = topk_ids_;
  ml.n_tokens = T;
  ml.top_k = K;
  ml.n_experts = E;
  ml.rank = rank_;
  ml.counts = counts_;
  ml.offsets = offsets_;
  ml.token_slot = token_slot_;
  ml.tiles = tiles_;
  ml.n_tiles = n_tiles_;
  ml.tile_tokens = 8 * kExpertTokenGroups;
  ml.tile_capacity = tile_capacity_;
  ml.error = error_;
  // The normed rows in slot order, in down_'s memory (bf16 [C*K][H], half of it): the gate/up
  // GEMM reads them before the down GEMM overwrites them (one stream).
  uint16_t* x_slots = reinterpret_cast<uint16_t*>(down_);
  ml.copy_rows(xn_, H, x_slots);
  moe_lists(ml, stream);
  if (marks_) marks_->mark("moe_lists");

  gemm::GemmArgs up;  // hidden[slot] = SiLU(gate) * up of the slot's token, per expert tile
  up.w = lw.experts_up;
  up.w_expert_stride = lw.expert_up_elems;
  up.n_experts = E;
  up.n_rows = 2 * I;
  up.k = H;
  up.x = x_slots;
  up.x_stride = H;
  up.x_rows = T * K;
  up.tiles = tiles_;
  up.n_tiles = n_tiles_;
  up.tile_capacity = tile_capacity_;
  up.token_groups = kExpertTokenGroups;
  up.y = hidden_;
  up.y_stride = I;
  gemm::gemm(up, gemm::Epilogue::kSwiGlu, stream);
  if (marks_) marks_->mark("expert_up_gemm");

  gemm::GemmArgs down;  // down[slot] = W_down(expert) hidden[slot]
  down.w = lw.experts_down;
  down.w_expert_stride = lw.expert_down_elems;
  down.n_experts = E;
  down.n_rows = H;
  down.k = I;
  down.x = hidden_;
  down.x_stride = I;
  down.tiles = tiles_;
  down.n_tiles = n_tiles_;
  down.tile_capacity = tile_capacity_;
  down.token_groups = kExpertTokenGroups;
  down.x_rows = T * K;
  down.y = down_;
  down.y_stride = H;
  gemm::gemm(down, gemm::Epilogue::kStore, stream);
  if (marks_) marks_->mark("expert_down_gemm");
}

}  // namespace megadecode::cuda::prefill
