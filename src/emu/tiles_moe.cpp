// MoE tiles.
//   DISPATCH: per token softmax → top-k → renormalise (ref::route); tokens per expert, prefix
//     offsets, slot lists (expert-major, then token order); the layer's up and down item queues
//     (active experts ascending); then credits up_done of every inactive expert and down_done for
//     the inactive experts' blocks, so consumers' targets stay static.
//   EXPERT_UP drain: item (e, column block): act[slot, cols] = silu(gate·hn) * (up·hn) for every
//     slot of expert e; arrives up_done[e].
//   EXPERT_DOWN drain: item (e, row block): waits up_done[e], down_out[slot, rows] = down·act[slot];
//     arrives down_done.
#include <string>
#include <vector>

#include "core/check.h"
#include "emu/tiles.h"
#include "ref/math.h"

namespace megadecode::emu {

void tile_dispatch(const StepView& v, Sync& sync, const Task& task) {
  const PlanShape& s = v.shape();
  const CounterLayout& c = v.counters();
  const int L = task.layer, E = s.n_experts, K = s.top_k;
  std::vector<int32_t> count(E, 0);
  for (int t = 0; t < s.batch; ++t) {
    const auto routes = ref::route(v.router_logits + static_cast<size_t>(t) * E, *v.config);
    MD_CHECK(static_cast<int>(routes.size()) == K);
    for (int k = 0; k < K; ++k) {
      v.topk_ids[t * K + k] = routes[k].first;
      v.topk_w[t * K + k] = routes[k].second;
      ++count[routes[k].first];
    }
  }
  v.expert_offset[0] = 0;
  for (int e = 0; e < E; ++e) {
    v.expert_count[e] = count[e];
    v.expert_offset[e + 1] = v.expert_offset[e] + count[e];
  }
  std::vector<int32_t> fill(E, 0);
  for (int t = 0; t < s.batch; ++t)
    for (int k = 0; k < K; ++k) {
      const int e = v.topk_ids[t * K + k];
      const int32_t slot = v.expert_offset[e] + fill[e]++;
      v.expert_tokens[slot] = t;
      v.token_slot[t * K + k] = slot;
    }
  int32_t n_up = 0, n_down = 0, n_active = 0;
  for (int e = 0; e < E; ++e) {
    if (count[e] == 0) continue;
    ++n_active;
    MD_REQUIRE(n_up + s.up_blocks <= s.up_capacity && n_down + s.down_blocks <= s.down_capacity, "L", L,
               " dispatch: expert items overflow the queues (up capacity ", s.up_capacity, ", down capacity ",
               s.down_capacity, ")");
    for (int j = 0; j < s.up_blocks; ++j) v.up_items[n_up++] = pack_moe_item(e, j);
    for (int j = 0; j < s.down_blocks; ++j) v.down_items[n_down++] = pack_moe_item(e, j);
  }
  v.moe_n_items[L * 2] = n_up;
  v.moe_n_items[L * 2 + 1] = n_down;
  for (int e = 0; e < E; ++e)
    if (count[e] == 0) sync.arrive(layer_counter(c, L, c.up_done + e), s.up_blocks);
  if (n_active < E) sync.arrive(layer_counter(c, L, c.down_done), (E - n_active) * s.down_blocks);
}

namespace {

// The slots [begin, end) of expert e, checked against the tables (a missing dependency shows as
// unwritten tables, which must be an error, not a wild read).
std::pair<int32_t, int32_t> expert_slots(const StepView& v, int e) {
  const PlanShape& s = v.shape();
  const int32_t begin = v.expert_offset[e], end = v.expert_offset[e + 1];
  MD_REQUIRE(begin >= 0 && begin <= end && end <= s.batch * s.top_k, "expert ", e, " has slots ", begin, "..", end,
             " (routing tables not written: missing dependency?)");
  return {begin, end};
}

int32_t checked_item(const StepView& v, const int32_t* items, int32_t index, int blocks) {
  const int32_t item = items[index];
  MD_REQUIRE(item >= 0 && moe_item_expert(item) < v.shape().n_experts && moe_item_block(item) < blocks,
             "MoE item ", index, " is ", item, " (queue not written: missing dependency?)");
  return item;
}

int32_t n_items(const StepView& v, int L, int which, int32_t capacity) {
  const int32_t n = v.moe_n_items[L * 2 + which];
  MD_REQUIRE(n >= 0 && n <= capacity, "L", L, " MoE item count ", n, " outside [0, ", capacity, "]");
  return n;
}

}  // namespace

void tile_expert_up(const StepView& v, Sync& sync, const Task& task) {
  const PlanShape& s = v.shape();
  const CounterLayout& c = v.counters();
  const int L = task.layer, H = s.hidden, I = s.moe_inter;
  const int32_t n = n_items(v, L, 0, s.up_capacity);
  std::vector<float> gate_row(H), up_row(H);
  for (;;) {
    const int32_t i = sync.claim(layer_counter(c, L, c.up_head));
    if (i >= n) break;
    sync.pause();
    const int32_t item = checked_item(v, v.up_items, i, s.up_blocks);
    const int e = moe_item_expert(item), j = moe_item_block(item);
    const ExpertWeights& w = v.weights->layers[L].experts[e];
    const auto [begin, end] = expert_slots(v, e);
    for (int col = j * s.up_cols; col < std::min(I, (j + 1) * s.up_cols); ++col) {
      ref::load_row(w.gate, col, gate_row.data());
      ref::load_row(w.up, col, up_row.data());
      for (int32_t slot = begin; slot < end; ++slot) {
        const float* x = v.hn + static_cast<size_t>(v.expert_tokens[slot]) * H;
        v.act[static_cast<size_t>(slot) * I + col] = ref::silu(ref::dot(gate_row.data(), x, H)) * ref::dot(up_row.data(), x, H);
      }
    }
    sync.arrive(layer_counter(c, L, c.up_done + e), 1);
  }
}

void tile_expert_down(const StepView& v, Sync& sync, const Task& task) {
  const PlanShape& s = v.shape();
  const CounterLayout& c = v.counters();
  const int L = task.layer, H = s.hidden, I = s.moe_inter;
  const int32_t n = n_items(v, L, 1, s.down_capacity);
  std::vector<float> row(I);
  for (;;) {
    const int32_t i = sync.claim(layer_counter(c, L, c.down_head));
    if (i >= n) break;
    sync.pause();
    const int32_t item = checked_item(v, v.down_items, i, s.down_blocks);
    const int e = moe_item_expert(item), j = moe_item_block(item);
    sync.wait(layer_counter(c, L, c.up_done + e), s.up_blocks);
    const ExpertWeights& w = v.weights->layers[L].experts[e];
    const auto [begin, end] = expert_slots(v, e);
    for (int r = j * s.down_rows; r < std::min(H, (j + 1) * s.down_rows); ++r) {
      ref::load_row(w.down, r, row.data());
      for (int32_t slot = begin; slot < end; ++slot)
        v.down_out[static_cast<size_t>(slot) * H + r] = ref::dot(row.data(), v.act + static_cast<size_t>(slot) * I, I);
    }
    sync.arrive(layer_counter(c, L, c.down_done), 1);
  }
}

}  // namespace megadecode::emu
