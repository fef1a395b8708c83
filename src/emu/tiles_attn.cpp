// The attention item of an ATTN task (sequence, KV group, split). An item applies q_norm and RoPE
// to its group's query heads, and (when it holds the sequence's last position) k_norm + RoPE to the
// new key and appends K/V to the paged cache; then computes, per query head, the split's running
// max m, sum of exp l and unnormalised output o over its positions. The split that finishes last
// (elected by an acq_rel fetch_add on attn_split[seq, g]) merges all splits by log-sum-exp in split
// order, writes attn_out and arrives on attn_done. A one-split sequence is its own last split.
// The softmax state and the merge are the kernels' own arithmetic (cuda/common/attention_state.cuh,
// log2 domain), each split one tile of fp32 scores from the reference dot product.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "cuda/common/attention_state.cuh"
#include "emu/tiles.h"
#include "ref/math.h"

namespace megadecode::emu {
namespace {

// Where position `pos` of sequence `seq` lives in layer L: a sliding layer's ring (when the store
// keeps one: ring block (pos / B) mod R of the ring table), else the block table.
ref::KvStore::Slot locate(const StepView& v, int L, bool sliding, int seq, int pos) {
  const PlanShape& s = v.shape();
  if (sliding && v.kv->in_ring(L)) {
    MD_REQUIRE(s.ring_len == v.kv->ring_length(), "cpu-mk: plan for rings of ", s.ring_len, " blocks, the store has ",
               v.kv->ring_length());
    return v.kv->locate_ring({v.ring_tables + static_cast<size_t>(seq) * s.ring_len, static_cast<size_t>(s.ring_len)}, pos);
  }
  return v.kv->locate({v.block_tables + static_cast<size_t>(seq) * s.max_blocks_per_seq,
                       static_cast<size_t>(s.max_blocks_per_seq)},
                      pos);
}

// Position `pos` of `x` [head_dim] normed (when the model has q/k norms) and rotated (unless NoPE).
void norm_rope(const StepView& v, const std::vector<float>& norm, bool rope, const float* in, int pos, float* out) {
  const int D = v.shape().head_dim;
  std::copy(in, in + D, out);
  if (v.config->qk_norm) ref::rms_norm(out, norm.data(), v.config->rms_norm_eps, D, out);
  if (rope) ref::apply_rope(out, D, pos, v.norms->inv_freq, v.config->rope_style);
}

void attn_split(const StepView& v, int L, uint8_t flags, const AttnItem& it, int index) {
  const PlanShape& s = v.shape();
  const int D = s.head_dim, gs = s.group_size, g = it.group;
  const int n_ctx = v.seq_len[it.seq];
  MD_REQUIRE(it.pos_end <= n_ctx, "attention item ", index, " reaches position ", it.pos_end, " past context ", n_ctx);
  const int pos = n_ctx - 1;
  const bool sliding = flags & kAttnSliding, rope = !(flags & kAttnNoRope);
  MD_REQUIRE(!sliding || (s.sliding_window > 0 && it.pos_end - it.pos_begin <= s.sliding_window &&
                          it.pos_begin >= n_ctx - s.sliding_window),
             "attention item ", index, " of sliding L", L, " reads positions ", it.pos_begin, "..", it.pos_end,
             " outside the window of ", s.sliding_window, " before ", n_ctx);
  const float* raw = v.qkv + (static_cast<size_t>(it.seq) * s.n_kv_heads + g) * s.qkv_group_rows;
  if (it.pos_end == n_ctx) {  // this split holds the new token: append its K/V
    const ref::KvStore::Slot here = locate(v, L, sliding, it.seq, pos);
    norm_rope(v, v.norms->k[L], rope, raw + gs * D, pos, v.kv->key(L, here) + g * D);
    std::copy(raw + (gs + 1) * D, raw + (gs + 2) * D, v.kv->value(L, here) + g * D);
  }
  const int n = it.pos_end - it.pos_begin;
  const float scale_log2 = cuda::attn_scale_log2(v.norms->attn_scale);
  std::vector<float> q(D), scores(n);
  std::vector<const float*> values(n);
  auto score = [&](int i) -> float& { return scores[i]; };
  for (int h = 0; h < gs; ++h) {
    norm_rope(v, v.norms->q[L], rope, raw + h * D, pos, q.data());
    for (int j = it.pos_begin; j < it.pos_end; ++j) {
      const ref::KvStore::Slot sl = locate(v, L, sliding, it.seq, j);
      scores[j - it.pos_begin] = ref::dot(q.data(), v.kv->key(L, sl) + g * D, D);
      values[j - it.pos_begin] = v.kv->value(L, sl) + g * D;
    }
    float m = -INFINITY, l = 0.0f;
    const float tile_max = cuda::attn_scale_mask(n, score, scale_log2, [](int) { return true; });
    cuda::attn_online_step(m, l, tile_max, n, score, cuda::AttnIdentity{}, cuda::AttnIdentity{});
    float* o = v.attn_part_o + (static_cast<size_t>(index) * gs + h) * D;
    std::fill(o, o + D, 0.0f);
    for (int j = 0; j < n; ++j)
      for (int d = 0; d < D; ++d) o[d] += scores[j] * values[j][d];
    float* ml = v.attn_part_ml + (static_cast<size_t>(index) * gs + h) * 2;
    ml[0] = m;
    ml[1] = l;
  }
}

void merge_splits(const StepView& v, const AttnItem& it) {
  const PlanShape& s = v.shape();
  const int D = s.head_dim, gs = s.group_size;
  for (int h = 0; h < gs; ++h) {
    auto part = [&](int i) { return static_cast<size_t>(it.part_base + i) * gs + h; };
    float* out = v.attn_out + static_cast<size_t>(it.seq) * s.n_heads * D + (static_cast<size_t>(it.group) * gs + h) * D;
    for (int d = 0; d < D; ++d) {
      float m, l;
      const float o = cuda::attn_merge(
          it.n_splits, [&](int i) { return v.attn_part_ml[part(i) * 2]; },
          [&](int i) {
            const float* ml = v.attn_part_ml + part(i) * 2;
            return cuda::AttnPartial{ml[0], ml[1], v.attn_part_o[part(i) * D + d]};
          },
          m, l);
      out[d] = cuda::attn_normalise(o, l);
    }
  }
}

}  // namespace

void tile_attn(const StepView& v, Sync& sync, const Task& task) {
  const PlanShape& s = v.shape();
  const CounterLayout& c = v.counters();
  const int L = task.layer, i = task.arg[0];
  MD_REQUIRE(i >= 0 && i < s.n_attn_items, "attention task names item ", i, " of ", s.n_attn_items);
  const AttnItem& it = v.items()[i];
  attn_split(v, L, task.flags, it, i);
  sync.pause();
  const int32_t before = sync.fetch_add(layer_counter(c, L, c.attn_split + it.seq * s.n_kv_heads + it.group), 1);
  MD_REQUIRE(before < it.n_splits, "attention item ", i, ": split counter of seq ", it.seq, " g", it.group,
             " passed its ", it.n_splits, " splits");
  if (before == it.n_splits - 1) {
    merge_splits(v, it);
    sync.arrive(layer_counter(c, L, c.attn_done), 1);
  }
}

}  // namespace megadecode::emu
