// Matrix-vector tiles: a task owns a block of weight rows and computes them for every token of the
// batch (each weight row is read once per step, as on the GPU). Rows are widened to fp32 and
// dotted with ref::dot, so QKV, router and LM-head outputs are bitwise the reference's; O-proj
// tiles dot only their KV group's slice of each row (the reduction over groups is MOE_NORM's).
#include <vector>

#include "core/check.h"
#include "emu/tiles.h"
#include "ref/math.h"

namespace megadecode::emu {

void tile_qkv(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const LayerWeights& w = v.weights->layers[task.layer];
  const int g = task.arg[0], H = s.hidden, D = s.head_dim, gs = s.group_size;
  std::vector<float> row(H);
  for (int r = task.arg[1]; r < task.arg[2]; ++r) {
    // Fused rows of group g: its gs q heads, then its k head, then its v head.
    if (r < gs * D) {
      ref::load_row(w.q_proj, static_cast<int64_t>(g) * gs * D + r, row.data());
    } else if (r < (gs + 1) * D) {
      ref::load_row(w.k_proj, static_cast<int64_t>(g) * D + (r - gs * D), row.data());
    } else {
      ref::load_row(w.v_proj, static_cast<int64_t>(g) * D + (r - (gs + 1) * D), row.data());
    }
    for (int t = 0; t < s.batch; ++t) {
      const size_t out = (static_cast<size_t>(t) * s.n_kv_heads + g) * s.qkv_group_rows + r;
      v.qkv[out] = ref::dot(row.data(), v.xn + static_cast<size_t>(t) * H, H);
    }
  }
}

void tile_o_proj(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const TensorView& w = v.weights->layers[task.layer].o_proj;
  const int g = task.arg[0], H = s.hidden, q_size = s.n_heads * s.head_dim;
  const int k0 = g * s.group_size * s.head_dim, k = s.group_size * s.head_dim;
  std::vector<float> row(q_size);
  for (int r = task.arg[1]; r < task.arg[2]; ++r) {
    ref::load_row(w, r, row.data());
    for (int t = 0; t < s.batch; ++t) {
      const float* a = v.attn_out + static_cast<size_t>(t) * q_size + k0;
      v.o_part[(static_cast<size_t>(g) * s.batch + t) * H + r] = ref::dot(row.data() + k0, a, k);
    }
  }
}

void tile_router(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const TensorView& w = v.weights->layers[task.layer].router;
  std::vector<float> row(s.hidden);
  for (int e = task.arg[0]; e < task.arg[1]; ++e) {
    ref::load_row(w, e, row.data());
    for (int t = 0; t < s.batch; ++t)
      v.router_logits[static_cast<size_t>(t) * s.n_experts + e] = ref::dot(row.data(), v.hn + static_cast<size_t>(t) * s.hidden, s.hidden);
  }
}

void tile_lm_head(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  std::vector<float> row(s.hidden);
  for (int r = task.arg[0]; r < task.arg[1]; ++r) {
    ref::load_row(v.weights->lm_head, r, row.data());
    for (int t = 0; t < s.batch; ++t)
      v.logits[static_cast<size_t>(t) * s.vocab + r] = ref::dot(row.data(), v.xf + static_cast<size_t>(t) * s.hidden, s.hidden);
  }
}

}  // namespace megadecode::emu
