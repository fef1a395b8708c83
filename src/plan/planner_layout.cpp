// The planner's layout half: tile counts (PlanShape), counter indices (CounterLayout), the buffer
// arena (BufferLayout) and the attention split of the step.
#include "plan/planner_internal.h"

#include <algorithm>

#include "core/check.h"
#include "kv/kv_cache.h"
#include "sampling/params.h"
#include "sampling/token_mask.h"

namespace megadecode {

namespace {

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

}  // namespace

void check_model_plannable(const ModelConfig& c) {
  MD_REQUIRE(c.n_layers > 0 && static_cast<int>(c.layers.size()) == c.n_layers, "config has no layers");
  if (c.block == BlockKind::kSequential) {
    MD_REQUIRE(c.router == RouterKind::kSoftmaxTopK && c.qk_norm && c.norm == NormKind::kRms &&
                   c.shared_intermediate_size == 0 && c.logit_scale == 1.0f,
               "the decode planner (cpu-mk and the megakernel) runs sequential blocks as qwen3_moe has them (q/k "
               "norms, softmax top-k router, RMSNorm); model_type ", c.model_type, " is not supported there: use "
               "backend cpu-ref");
    for (int l = 0; l < c.n_layers; ++l) {
      MD_REQUIRE(c.layers[l].ffn == FfnKind::kMoe, "the decode planner needs MoE layers in sequential blocks; layer ",
                 l, " is dense");
      MD_REQUIRE(c.layers[l].sliding_window == 0 && c.layers[l].use_rope,
                 "the decode planner supports full-attention RoPE layers only in sequential blocks (layer ", l, ")");
    }
    return;
  }
  // Parallel blocks (cohere2_moe): sliding and NoPE layers, dense layers, shared experts, LayerNorm
  // (the tiles' norm), sigmoid routing and logit_scale are plan ops; what is not is refused by name.
  MD_REQUIRE(c.shared_intermediate_size % 16 == 0, "the decode planner needs the shared experts' width to be a "
             "multiple of 16, got ", c.shared_intermediate_size);
  const int w = c.max_sliding_window();
  for (int l = 0; l < c.n_layers; ++l) {
    MD_REQUIRE(c.layers[l].sliding_window == 0 || c.layers[l].sliding_window == w,
               "the decode planner needs one sliding window for every sliding layer; layer ", l, " has ",
               c.layers[l].sliding_window, ", another ", w);
    if (c.layers[l].ffn == FfnKind::kDense)
      MD_REQUIRE(c.intermediate_size > 0 && c.intermediate_size % 16 == 0, "the decode planner needs the dense FFN's "
                 "intermediate_size to be a positive multiple of 16, got ", c.intermediate_size, " (layer ", l, ")");
  }
}

void check_plannable(const ModelConfig& c, const BatchState& batch, const Policy& policy, const PlanOptions& opt) {
  check_model_plannable(c);
  MD_REQUIRE(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads");
  MD_REQUIRE(c.n_experts > 0 && c.n_experts < 65536 && c.n_experts_per_tok > 0 && c.n_experts_per_tok <= c.n_experts,
             "bad expert counts");
  MD_REQUIRE(opt.n_sms >= 1 && opt.n_sms <= 4096, "--sms must be in 1..4096, got ", opt.n_sms);
  MD_REQUIRE(!opt.sample || opt.lm_head, "sampling needs the LM head");
  MD_REQUIRE(!batch.seqs.empty(), "a decode step needs at least one sequence");
  MD_REQUIRE(batch.seqs.size() <= 4096, "batch of ", batch.seqs.size(), " sequences is larger than 4096");
  MD_REQUIRE(batch.kv_block_size >= 1, "KV block size must be >= 1");
  MD_REQUIRE(policy.tiles_per_sm >= 1 && policy.attn_min_split_tokens >= 1 && policy.attn_max_splits >= 1,
             "policy ", policy.name, " has a non-positive size");
  MD_REQUIRE(policy.tiles_per_sm <= 4096, "policy ", policy.name, ": ", policy.tiles_per_sm,
             " tiles per SM, at most 4096");
  MD_REQUIRE((c.n_heads / c.n_kv_heads + 2) * c.head_dim % 16 == 0 && c.hidden_size % 16 == 0 &&
                 c.moe_intermediate_size % 16 == 0 && c.head_dim % 16 == 0,
             "the decode planner needs the fused QKV rows of a KV group, the hidden size, the MoE intermediate size "
             "and the head dim to be multiples of 16");
}

PlanShape plan_shape(const ModelConfig& c, const BatchState& batch, const Policy& p, const PlanOptions& opt) {
  PlanShape s{};
  s.batch = static_cast<int32_t>(batch.seqs.size());
  s.n_sms = opt.n_sms;
  s.n_layers = c.n_layers;
  s.hidden = c.hidden_size;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.group_size = c.group_size();
  s.n_experts = c.n_experts;
  s.top_k = c.n_experts_per_tok;
  s.moe_inter = c.moe_intermediate_size;
  s.vocab = c.vocab_size;
  s.kv_block_size = batch.kv_block_size;
  int max_blocks = 1;
  for (const SeqState& q : batch.seqs) max_blocks = std::max(max_blocks, ceil_div(q.n_ctx, batch.kv_block_size));
  s.max_blocks_per_seq = max_blocks;

  // Tiles are sized to the SM count: each op's row blocks in min(blocks, tiles_per_sm * SMs)
  // contiguous tiles (QKV: per KV group, so that a tile feeds one group's attention).
  const int max_tiles = p.tiles_per_sm * s.n_sms;
  s.qkv_group_rows = (s.group_size + 2) * s.head_dim;
  const int qkv_group_rbs = s.qkv_group_rows / 16;
  s.n_qkv_tasks = s.n_kv_heads * std::clamp(max_tiles / s.n_kv_heads, 1, qkv_group_rbs);
  s.n_oproj_tasks = std::min(max_tiles, ceil_div(s.hidden, 16));
  s.n_router_tasks = std::min(max_tiles, ceil_div(s.n_experts, 16));
  s.n_lm_tasks = std::min(max_tiles, ceil_div(s.vocab, 16));
  s.up_units = s.moe_inter / 8;
  s.down_rbs = s.hidden / 16;
  s.lm_head = opt.lm_head ? 1 : 0;
  s.sample = opt.sample ? 1 : 0;
  s.grid_sync = p.grid_sync ? 1 : 0;
  s.logit_scale = c.logit_scale;
  if (c.block == BlockKind::kParallel) {
    s.parallel = 1;
    s.sliding_window = c.max_sliding_window();
    s.ring_len = s.sliding_window > 0 ? kv_ring_length(s.sliding_window, batch.kv_block_size) : 0;
    for (const LayerSpec& l : c.layers)
      if (l.ffn == FfnKind::kDense) s.dense_inter = c.intermediate_size;
    s.dense_units = s.dense_inter / 8;
    s.shared_inter = c.shared_intermediate_size;
    s.shared_units = s.shared_inter / 8;
    s.shared_average = c.shared_intermediate_size > 0 && c.shared_combine == SharedCombine::kAverage ? 1 : 0;
    s.router_after_attn = p.router_after_attn ? 1 : 0;
  }
  return s;
}

// A sequence's split geometry is a function of its own context length only, never of the rest of
// the batch: the merge's reduction order then does not change with batch composition, which is
// what makes a sequence's logits bitwise identical alone and inside any batch (batch invariance).
// Splits of attn_min_split_tokens (256: 128 KiB of K+V per KV head, ~4 us of one SM's share of
// HBM) give batch 1 at 8K context 32 splits x 4 KV heads = 128 items for 132 SMs; long contexts
// stop at attn_max_splits and grow the split instead.
AttnSplit attn_split_for(int n_ctx, const Policy& p, int kv_block_size) {
  // floor: every split but the last holds at least the minimum; lengths are then balanced.
  int n = static_cast<int>(std::clamp<int64_t>(n_ctx / p.attn_min_split_tokens, 1, p.attn_max_splits));
  const int len = static_cast<int>(round_up(ceil_div(n_ctx, n), kv_block_size));
  n = ceil_div(n_ctx, len);  // rounding to whole blocks may leave the last split empty: drop it
  return {n, len};
}

namespace {

bool has_layer(const ModelConfig& c, bool sliding) {
  for (const LayerSpec& l : c.layers)
    if ((l.sliding_window > 0) == sliding) return true;
  return false;
}

// One set of items, group-major: each sequence's keys [first, n_ctx) with first = 0 (full layers)
// or max(0, n_ctx - window) (sliding layers), cut by its own length alone.
void append_item_set(const BatchState& batch, const Policy& p, int n_groups, int window, std::vector<AttnItem>& items) {
  std::vector<AttnSplit> per_seq;
  std::vector<int> first;
  for (const SeqState& q : batch.seqs) {
    first.push_back(window > 0 ? std::max(0, q.n_ctx - window) : 0);
    per_seq.push_back(attn_split_for(q.n_ctx - first.back(), p, batch.kv_block_size));
  }
  // Group-major: group 0's QKV tiles finish first, so its items come first.
  for (int g = 0; g < n_groups; ++g)
    for (int s = 0; s < static_cast<int>(batch.seqs.size()); ++s) {
      const AttnSplit& ss = per_seq[s];
      const int base = static_cast<int>(items.size());
      for (int j = 0; j < ss.n_splits; ++j) {
        AttnItem it{};
        it.seq = s;
        it.group = g;
        it.split = j;
        it.n_splits = ss.n_splits;
        it.pos_begin = first[s] + j * ss.len;
        it.pos_end = std::min(batch.seqs[s].n_ctx, first[s] + (j + 1) * ss.len);
        it.part_base = base;
        items.push_back(it);
      }
    }
}

}  // namespace

int count_full_items(const ModelConfig& c, const BatchState& batch, const Policy& p) {
  if (!has_layer(c, false)) return 0;
  int n = 0;
  for (const SeqState& q : batch.seqs) n += attn_split_for(q.n_ctx, p, batch.kv_block_size).n_splits;
  return n * c.n_kv_heads;
}

std::vector<AttnItem> plan_attention_items(const ModelConfig& c, const BatchState& batch, const Policy& p) {
  std::vector<AttnItem> items;
  if (has_layer(c, false)) append_item_set(batch, p, c.n_kv_heads, 0, items);
  if (has_layer(c, true)) append_item_set(batch, p, c.n_kv_heads, c.max_sliding_window(), items);
  return items;
}

CounterLayout counter_layout(const PlanShape& s, int n_waves) {
  CounterLayout c{};
  c.stride_bytes = kCounterStrideBytes;
  int32_t off = 0;
  auto take = [&off](int32_t n) {
    int32_t at = off;
    off += n;
    return at;
  };
  c.qkv_done = take(s.n_kv_heads);
  c.attn_split = take(s.batch * s.n_kv_heads);
  c.attn_done = take(1);
  c.oproj_done = take(1);
  c.router_done = take(1);
  c.up_done = take(1);
  c.down_done = take(1);
  c.layer_base = 0;
  c.layer_stride = off;
  int32_t next = c.layer_base + s.n_layers * c.layer_stride;
  c.lm_head_done = next++;
  c.sample_done = next++;
  c.wave_done = s.grid_sync ? next : -1;
  if (s.grid_sync) next += n_waves;
  c.n_counters = next;
  return c;
}

BufferLayout buffer_layout(const PlanShape& s) {
  const uint64_t b = s.batch, h = s.hidden, g = s.n_kv_heads, gs = s.group_size, d = s.head_dim, e = s.n_experts,
                 k = s.top_k, inter = s.moe_inter, v = s.vocab, a = s.n_attn_items;
  BufferLayout L{};
  uint64_t off = 0;
  auto place = [&off](uint64_t bytes) {
    BufferSpan span{off, bytes};
    off += (bytes + 255) / 256 * 256;
    return span;
  };
  L.token_ids = place(b * 4);
  L.seq_len = place(b * 4);
  L.block_tables = place(b * static_cast<uint64_t>(s.max_blocks_per_seq) * 4);
  L.sampling = place(b * sizeof(SamplingParams));
  L.attn_items = place(a * sizeof(AttnItem));
  L.x = place(b * h * 4);
  L.qkv = place(b * g * (gs + 2) * d * 4);
  L.attn_part_o = place(a * gs * d * 4);
  L.attn_part_ml = place(a * gs * 2 * 4);
  L.attn_out = place(b * s.n_heads * d * 4);
  L.h = place(s.parallel ? 0 : b * h * 4);
  L.router_logits = place(b * e * 4);
  L.act = place(std::max(b * k * inter, b * static_cast<uint64_t>(s.dense_inter)) * 4);
  L.logits = place(s.lm_head ? b * v * 4 : 0);
  L.out_tokens = place(b * 4);
  L.ring_tables = place(b * static_cast<uint64_t>(s.ring_len) * 4);
  L.o_out = place(s.parallel ? b * h * 4 : 0);
  L.shared_act = place(b * static_cast<uint64_t>(s.shared_inter) * 4);
  L.lm_best = place(s.lm_head ? b * static_cast<uint64_t>(s.n_lm_tasks) * sizeof(LogitBest) : 0);
  L.token_masks = place(s.sample ? b * (1 + token_mask_words(s.vocab)) * 4 : 0);
  L.total_bytes = off;
  return L;
}

}  // namespace megadecode
