// MoE tiles (plan/moe_split.h). Every share first derives the layer's routing from the router
// logits (softmax, top-k, renormalise: ref::route) and the slot numbering; then
//   EXPERT_UP share: its up units (expert, 8 gate + 8 up columns): act[slot, cols] =
//     silu(gate . hn) * (up . hn) for every slot of the unit's expert, hn = RMSNorm(h) recomputed;
//   EXPERT_DOWN share: its hidden rows over every active expert: x[t, rows] = h[t, rows] +
//     sum_k w_k * (down_k . act[slot(t, k)]), the sum in top-k order from zero (the reference's).
// Shared experts (parallel blocks): the up shares' units after the routed ones are the shared MLP's
// (shared_act[t, cols] for every token), and the down shares add its down rows to the routed sum,
// F = routed + shared_down . shared_act[t], halved when averaged: cpu-ref's order, bit for bit.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/check.h"
#include "emu/tiles.h"
#include "plan/moe_split.h"
#include "ref/math.h"

namespace megadecode::emu {
namespace {

struct LayerRouting {
  std::vector<int32_t> ids;        // [B, K] experts of token t in top-k order
  std::vector<float> w;            // [B, K] their weights
  std::vector<int32_t> slot;       // [B, K] slot of (t, k): expert-major, tokens in order
  std::vector<int32_t> offset;     // [E + 1] first slot of each expert
  std::vector<int32_t> active;     // experts with a token, ascending
  std::vector<int32_t> slot_token;  // [B * K]
};

LayerRouting route_layer(const StepView& v) {
  const PlanShape& s = v.shape();
  const int B = s.batch, K = s.top_k, E = s.n_experts;
  LayerRouting r;
  r.ids.resize(B * K);
  r.w.resize(B * K);
  std::vector<int32_t> count(E, 0);
  for (int t = 0; t < B; ++t) {
    const float* logits = v.router_logits + static_cast<size_t>(t) * E;
    for (int e = 0; e < E; ++e)
      MD_REQUIRE(std::isfinite(logits[e]), "router logit ", e, " of token ", t,
                 " is not finite (router tiles not run: missing dependency?)");
    const auto routes = ref::route(logits, *v.config);
    MD_CHECK(static_cast<int>(routes.size()) == K);
    for (int k = 0; k < K; ++k) {
      r.ids[t * K + k] = routes[k].first;
      r.w[t * K + k] = routes[k].second;
      ++count[routes[k].first];
    }
  }
  r.offset.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    r.offset[e + 1] = r.offset[e] + count[e];
    if (count[e] > 0) r.active.push_back(e);
  }
  r.slot.resize(B * K);
  r.slot_token.resize(B * K);
  std::vector<int32_t> fill(E, 0);
  for (int t = 0; t < B; ++t)
    for (int k = 0; k < K; ++k) {
      const int e = r.ids[t * K + k];
      const int32_t slot = r.offset[e] + fill[e]++;
      r.slot[t * K + k] = slot;
      r.slot_token[slot] = t;
    }
  return r;
}

}  // namespace

void tile_expert_up(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const int L = task.layer, H = s.hidden, I = s.moe_inter;
  const LayerRouting r = route_layer(v);
  const std::vector<std::vector<float>> hn = ffn_input(v, L);
  const int32_t routed_units = static_cast<int32_t>(r.active.size()) * s.up_units;
  const MoeShare share = moe_share(routed_units + s.shared_units, task.arg[0], task.arg[1], task.arg[2]);
  std::vector<float> gate_row(H), up_row(H);
  for (int32_t u = share.begin; u < share.end; ++u) {
    if (u >= routed_units) {  // a unit of the shared experts' MLP: every token
      const int S = s.shared_inter, j = u - routed_units;
      const ExpertWeights& w = v.weights->layers[L].shared;
      for (int col = j * 8; col < std::min(S, (j + 1) * 8); ++col) {
        ref::load_row(w.gate, col, gate_row.data());
        ref::load_row(w.up, col, up_row.data());
        for (int t = 0; t < s.batch; ++t)
          v.shared_act[static_cast<size_t>(t) * S + col] =
              ref::silu(ref::dot(gate_row.data(), hn[t].data(), H)) * ref::dot(up_row.data(), hn[t].data(), H);
      }
      continue;
    }
    const int e = r.active[u / s.up_units], j = u % s.up_units;
    const ExpertWeights& w = v.weights->layers[L].experts[e];
    for (int col = j * 8; col < std::min(I, (j + 1) * 8); ++col) {
      ref::load_row(w.gate, col, gate_row.data());
      ref::load_row(w.up, col, up_row.data());
      for (int32_t slot = r.offset[e]; slot < r.offset[e + 1]; ++slot) {
        const std::vector<float>& x = hn[r.slot_token[slot]];
        v.act[static_cast<size_t>(slot) * I + col] =
            ref::silu(ref::dot(gate_row.data(), x.data(), H)) * ref::dot(up_row.data(), x.data(), H);
      }
    }
  }
}

void tile_expert_down(const StepView& v, Sync& sync, const Task& task) {
  const PlanShape& s = v.shape();
  const int L = task.layer, H = s.hidden, I = s.moe_inter, K = s.top_k;
  const LayerRouting r = route_layer(v);
  const MoeShare rbs = moe_share(s.down_rbs, task.arg[0], task.arg[1], task.arg[2]);
  if (v.route_experts != nullptr && task.arg[0] == 0)  // share 0 records the layer's routing
    for (int t = 0; t < s.batch; ++t)
      for (int k = 0; k < K; ++k) {
        const size_t at = (static_cast<size_t>(t) * s.n_layers + L) * K + k;
        v.route_experts[at] = r.ids[t * K + k];
        v.route_weights[at] = r.w[t * K + k];
      }
  const int S = s.shared_inter;
  std::vector<float> row(I), shared_row(S);
  const std::vector<float> emb = s.parallel && L == 0 ? embedding(v) : std::vector<float>{};
  // F first, from the up shares' activations and the weights only; with kLastWaitAtWrite the last
  // wait (the O-proj tiles) comes after it, before x is read and written (ops.cuh op_gemm).
  const int r0 = rbs.begin * 16, r1 = std::min(H, rbs.end * 16);
  std::vector<float> ffn(static_cast<size_t>(std::max(r1 - r0, 0)) * s.batch);
  for (int rr = r0; rr < r1; ++rr) {
    if (S > 0) ref::load_row(v.weights->layers[L].shared.down, rr, shared_row.data());
    for (int t = 0; t < s.batch; ++t) {
      float moe = 0.0f;
      for (int k = 0; k < K; ++k) {
        ref::load_row(v.weights->layers[L].experts[r.ids[t * K + k]].down, rr, row.data());
        const float* a = v.act + static_cast<size_t>(r.slot[t * K + k]) * I;
        moe += r.w[t * K + k] * ref::dot(row.data(), a, I);
      }
      if (S > 0) {
        const float sum = moe + ref::dot(shared_row.data(), v.shared_act + static_cast<size_t>(t) * S, S);
        moe = s.shared_average ? sum * 0.5f : sum;
      }
      ffn[static_cast<size_t>(rr - r0) * s.batch + t] = moe;
    }
  }
  if (task.flags & kLastWaitAtWrite) {
    sync.pause();
    sync.wait(task.wait[task.n_waits - 1].counter, task.wait[task.n_waits - 1].target);
  }
  for (int rr = r0; rr < r1; ++rr)
    for (int t = 0; t < s.batch; ++t) {
      const float moe = ffn[static_cast<size_t>(rr - r0) * s.batch + t];
      const size_t at = static_cast<size_t>(t) * H + rr;
      if (s.parallel)
        v.x[at] = ((L == 0 ? emb[at] : v.x[at]) + v.o_out[at]) + moe;  // cpu-ref's order: (x + o) + F
      else
        v.x[at] = v.h[at] + moe;
    }
}

// The dense FFN (parallel blocks' dense layers): up share s of S takes the units
// moe_share(dense_units, a0, a1, T) of the MLP's gate/up rows (8 + 8 columns each):
// act[t, col] = silu(gate . xn) * (up . xn); down share s takes the hidden row blocks
// moe_share(down_rbs, a0, a1, T): x[t, r] = (x[t, r] + o[t, r]) + down_r . act[t] (cpu-ref's swiglu and
// order, bit for bit).
void tile_dense_up(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const int L = task.layer, H = s.hidden, I = s.dense_inter;
  MD_REQUIRE(I > 0 && v.config->layers[L].ffn == FfnKind::kDense, "dense up share at L", L, ", not a dense layer");
  const std::vector<std::vector<float>> xn = ffn_input(v, L);
  const LayerWeights& w = v.weights->layers[L];
  const MoeShare share = moe_share(s.dense_units, task.arg[0], task.arg[1], task.arg[2]);
  std::vector<float> gate_row(H), up_row(H);
  for (int col = share.begin * 8; col < std::min(I, share.end * 8); ++col) {
    ref::load_row(w.mlp_gate, col, gate_row.data());
    ref::load_row(w.mlp_up, col, up_row.data());
    for (int t = 0; t < s.batch; ++t)
      v.act[static_cast<size_t>(t) * I + col] =
          ref::silu(ref::dot(gate_row.data(), xn[t].data(), H)) * ref::dot(up_row.data(), xn[t].data(), H);
  }
}

void tile_dense_down(const StepView& v, Sync&, const Task& task) {
  const PlanShape& s = v.shape();
  const int L = task.layer, H = s.hidden, I = s.dense_inter;
  MD_REQUIRE(I > 0 && s.parallel, "dense down share at L", L, " of a plan without parallel dense layers");
  const MoeShare rbs = moe_share(s.down_rbs, task.arg[0], task.arg[1], task.arg[2]);
  std::vector<float> row(I);
  const std::vector<float> emb = L == 0 ? embedding(v) : std::vector<float>{};
  for (int rr = rbs.begin * 16; rr < std::min(H, rbs.end * 16); ++rr) {
    ref::load_row(v.weights->layers[L].mlp_down, rr, row.data());
    for (int t = 0; t < s.batch; ++t) {
      const size_t at = static_cast<size_t>(t) * H + rr;
      v.x[at] = ((L == 0 ? emb[at] : v.x[at]) + v.o_out[at]) + ref::dot(row.data(), v.act + static_cast<size_t>(t) * I, I);
    }
  }
}

}  // namespace megadecode::emu
