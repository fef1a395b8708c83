// The planner's layout half: tile sizes (PlanShape), counter indices (CounterLayout), the buffer
// arena (BufferLayout) and the attention split of the step.
#include "plan/planner_internal.h"

#include <algorithm>

#include "core/check.h"
#include "sampling/params.h"

namespace megadecode {

namespace {

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

}  // namespace

int tile_rows(int64_t k, int64_t weight_bytes, int align, int dim) {
  MD_REQUIRE(k > 0 && weight_bytes > 0 && align > 0 && dim > 0, "tile_rows: bad arguments");
  int64_t rows = weight_bytes / (k * 2) / align * align;
  rows = std::max<int64_t>(rows, align);
  return static_cast<int>(std::min<int64_t>(rows, dim));
}

void check_plannable(const ModelConfig& c, const BatchState& batch, const Policy& policy, const PlanOptions& opt) {
  MD_REQUIRE(c.block == BlockKind::kSequential && c.router == RouterKind::kSoftmaxTopK,
             "the decode planner supports qwen3_moe models (sequential blocks, softmax top-k router); model_type ",
             c.model_type, " is not supported");
  MD_REQUIRE(c.n_layers > 0 && static_cast<int>(c.layers.size()) == c.n_layers, "config has no layers");
  for (int l = 0; l < c.n_layers; ++l) {
    MD_REQUIRE(c.layers[l].ffn == FfnKind::kMoe, "the decode planner needs MoE layers; layer ", l, " is dense");
    MD_REQUIRE(c.layers[l].sliding_window == 0 && c.layers[l].use_rope,
               "the decode planner supports full-attention RoPE layers only (layer ", l, ")");
  }
  MD_REQUIRE(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads");
  MD_REQUIRE(c.n_experts > 0 && c.n_experts < 65536 && c.n_experts_per_tok > 0 && c.n_experts_per_tok <= c.n_experts,
             "bad expert counts");
  MD_REQUIRE(opt.n_sms >= 1 && opt.n_sms <= 4096, "--sms must be in 1..4096, got ", opt.n_sms);
  MD_REQUIRE(!opt.sample || opt.lm_head, "sampling needs the LM head");
  MD_REQUIRE(!batch.seqs.empty(), "a decode step needs at least one sequence");
  MD_REQUIRE(batch.seqs.size() <= 4096, "batch of ", batch.seqs.size(), " sequences is larger than 4096");
  MD_REQUIRE(batch.kv_block_size >= 1, "KV block size must be >= 1");
  MD_REQUIRE(policy.tile_weight_bytes > 0 && policy.lm_tile_weight_bytes > 0 && policy.row_align >= 1 &&
                 policy.norm_tokens >= 1 && policy.attn_min_split_tokens >= 1 && policy.attn_max_splits >= 1,
             "policy ", policy.name, " has a non-positive size");
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

  s.qkv_group_rows = (s.group_size + 2) * s.head_dim;
  s.qkv_rows = tile_rows(s.hidden, p.tile_weight_bytes, p.row_align, s.qkv_group_rows);
  s.qkv_tiles_per_group = ceil_div(s.qkv_group_rows, s.qkv_rows);
  s.o_rows = tile_rows(static_cast<int64_t>(s.group_size) * s.head_dim, p.tile_weight_bytes, p.row_align, s.hidden);
  s.o_row_blocks = ceil_div(s.hidden, s.o_rows);
  s.router_rows = tile_rows(s.hidden, p.tile_weight_bytes, p.row_align, s.n_experts);
  s.router_tiles = ceil_div(s.n_experts, s.router_rows);
  s.up_cols = tile_rows(2LL * s.hidden, p.tile_weight_bytes, p.row_align, s.moe_inter);
  s.up_blocks = ceil_div(s.moe_inter, s.up_cols);
  s.down_rows = tile_rows(s.moe_inter, p.tile_weight_bytes, p.row_align, s.hidden);
  s.down_blocks = ceil_div(s.hidden, s.down_rows);
  MD_REQUIRE(s.up_blocks < 65536 && s.down_blocks < 65536, "MoE blocks do not fit the item encoding");
  s.lm_rows = tile_rows(s.hidden, p.lm_tile_weight_bytes, p.row_align, s.vocab);
  s.lm_tiles = ceil_div(s.vocab, s.lm_rows);
  s.norm_tokens = std::min(p.norm_tokens, s.batch);
  s.n_norm_tasks = ceil_div(s.batch, s.norm_tokens);

  const int active_max = std::min(s.n_experts, s.batch * s.top_k);
  s.up_capacity = active_max * s.up_blocks;
  s.down_capacity = active_max * s.down_blocks;
  s.lm_head = opt.lm_head ? 1 : 0;
  s.sample = opt.sample ? 1 : 0;
  s.grid_sync = p.grid_sync ? 1 : 0;
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

std::vector<AttnItem> plan_attention_items(const ModelConfig& c, const BatchState& batch, const Policy& p) {
  const int n_groups = c.n_kv_heads;
  std::vector<AttnSplit> per_seq;
  for (const SeqState& q : batch.seqs) per_seq.push_back(attn_split_for(q.n_ctx, p, batch.kv_block_size));

  std::vector<AttnItem> items;
  auto add = [&](int seq, int g) {
    const AttnSplit& ss = per_seq[seq];
    const int base = static_cast<int>(items.size());
    for (int j = 0; j < ss.n_splits; ++j) {
      AttnItem it{};
      it.seq = seq;
      it.group = g;
      it.split = j;
      it.n_splits = ss.n_splits;
      it.pos_begin = j * ss.len;
      it.pos_end = std::min(batch.seqs[seq].n_ctx, (j + 1) * ss.len);
      it.part_base = base;
      items.push_back(it);
    }
  };
  const int n_seqs = static_cast<int>(batch.seqs.size());
  if (p.order == TileOrder::kReadyFirst) {
    for (int g = 0; g < n_groups; ++g)  // group 0's QKV tiles finish first: its items come first
      for (int s = 0; s < n_seqs; ++s) add(s, g);
  } else {
    for (int s = 0; s < n_seqs; ++s)
      for (int g = 0; g < n_groups; ++g) add(s, g);
  }
  return items;
}

int attn_capacity(const PlanShape& s, const Policy& p) {
  // Worst case: every sequence long enough for the most splits.
  return s.batch * s.n_kv_heads * p.attn_max_splits;
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
  c.norm_done = take(1);
  c.qkv_done = take(s.n_kv_heads);
  c.attn_split = take(s.batch * s.n_kv_heads);
  c.attn_done = take(s.n_kv_heads);
  c.oproj_done = take(1);
  c.moe_norm_done = take(1);
  c.router_done = take(1);
  c.dispatch_done = take(1);
  c.up_done = take(s.n_experts);
  c.down_done = take(1);
  c.attn_head = take(1);
  c.up_head = take(1);
  c.down_head = take(1);
  c.layer_base = 0;
  c.layer_stride = off;
  int32_t next = c.layer_base + s.n_layers * c.layer_stride;
  c.final_norm_done = next++;
  c.lm_head_done = next++;
  c.sample_done = next++;
  c.wave_done = s.grid_sync ? next : -1;
  if (s.grid_sync) next += n_waves;
  c.n_counters = next;
  return c;
}

BufferLayout buffer_layout(const PlanShape& s) {
  const uint64_t b = s.batch, h = s.hidden, g = s.n_kv_heads, gs = s.group_size, d = s.head_dim, e = s.n_experts,
                 k = s.top_k, inter = s.moe_inter, v = s.vocab, a = s.attn_capacity;
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
  L.xn = place(b * h * 4);
  L.qkv = place(b * g * (gs + 2) * d * 4);
  L.attn_part_o = place(a * gs * d * 4);
  L.attn_part_ml = place(a * gs * 2 * 4);
  L.attn_out = place(b * s.n_heads * d * 4);
  L.o_part = place(g * b * h * 4);
  L.h = place(b * h * 4);
  L.hn = place(b * h * 4);
  L.router_logits = place(b * e * 4);
  L.topk_ids = place(b * k * 4);
  L.topk_w = place(b * k * 4);
  L.token_slot = place(b * k * 4);
  L.expert_count = place(e * 4);
  L.expert_offset = place((e + 1) * 4);
  L.expert_tokens = place(b * k * 4);
  L.up_items = place(static_cast<uint64_t>(s.up_capacity) * 4);
  L.down_items = place(static_cast<uint64_t>(s.down_capacity) * 4);
  L.moe_n_items = place(static_cast<uint64_t>(s.n_layers) * 2 * 4);
  L.act = place(b * k * inter * 4);
  L.down_out = place(b * k * h * 4);
  L.xf = place(b * h * 4);
  L.logits = place(s.lm_head ? b * v * 4 : 0);
  L.out_tokens = place(b * 4);
  L.total_bytes = off;
  return L;
}

}  // namespace megadecode
