// The planner's scheduling half: builds each wave's tasks with their waits and arrivals and deals
// the static waves (every wave but ATTN) to the SMs: the skeleton that planner_assemble.cpp
// completes with the step's attention items. make_plan is skeleton + items + assembly.
#include <algorithm>
#include <set>
#include <utility>

#include "core/check.h"
#include "plan/planner_internal.h"
#include "plan/tile_cut.h"

namespace megadecode {
namespace {

struct WaveBuild {
  Op op;
  int layer;
  std::vector<Task> tasks;
  std::vector<int> sm;  // where each task goes (-1: dealt round-robin)
};

Task make_task(Op op, int layer, std::initializer_list<int32_t> args, std::initializer_list<Wait> waits,
               std::initializer_list<Arrive> arrives) {
  Task t{};
  t.op = static_cast<uint8_t>(op);
  t.layer = static_cast<int16_t>(layer);
  int i = 0;
  for (int32_t a : args) t.arg[i++] = a;
  for (const Wait& w : waits) t.wait[t.n_waits++] = w;
  for (const Arrive& a : arrives) t.arrive[t.n_arrives++] = a;
  return t;
}

// n tiles of contiguous row blocks [rb0, rb0 + n_rbs): tile i = [rb0 + n_rbs*i/n, rb0 + n_rbs*(i+1)/n).
std::vector<std::pair<int, int>> cut(int rb0, int n_rbs, int n) {
  std::vector<std::pair<int, int>> out;
  for (int i = 0; i < n; ++i) out.push_back({tile_begin(rb0, n_rbs, n, i), tile_begin(rb0, n_rbs, n, i + 1)});
  return out;
}

void layer_waves(const PlanShape& s, const CounterLayout& c, int L, std::vector<WaveBuild>& out) {
  auto C = [&](int32_t offset) { return layer_counter(c, L, offset); };
  const int G = s.n_kv_heads;
  const Wait after_prev_layer{L > 0 ? layer_counter(c, L - 1, c.down_done) : -1, s.n_sms};

  WaveBuild qkv{Op::kQkv, L, {}, {}};
  const int per_group = s.n_qkv_tasks / G, group_rbs = s.qkv_group_rows / 16;
  for (int g = 0; g < G; ++g)
    for (const auto& [a, b] : cut(g * group_rbs, group_rbs, per_group)) {
      Task t = make_task(Op::kQkv, L, {a, b}, {}, {{C(c.qkv_done + g), 1}});
      if (L > 0) t.wait[t.n_waits++] = after_prev_layer;
      qkv.tasks.push_back(t);
    }
  out.push_back(std::move(qkv));

  out.push_back(WaveBuild{Op::kAttn, L, {}, {}});  // its tasks come with the step's items (attention_task)

  WaveBuild oproj{Op::kOProj, L, {}, {}};
  for (const auto& [a, b] : cut(0, s.hidden / 16, s.n_oproj_tasks))
    oproj.tasks.push_back(make_task(Op::kOProj, L, {a, b}, {{C(c.attn_done), s.batch * G}}, {{C(c.oproj_done), 1}}));
  out.push_back(std::move(oproj));

  WaveBuild router{Op::kRouter, L, {}, {}};
  for (const auto& [a, b] : cut(0, (s.n_experts + 15) / 16, s.n_router_tasks))
    router.tasks.push_back(
        make_task(Op::kRouter, L, {a, b}, {{C(c.oproj_done), s.n_oproj_tasks}}, {{C(c.router_done), 1}}));
  out.push_back(std::move(router));

  WaveBuild up{Op::kExpertUp, L, {}, {}}, down{Op::kExpertDown, L, {}, {}};
  for (int sm = 0; sm < s.n_sms; ++sm) {
    // The up share's prologue normalises h (after every O-proj tile), its routing reads every
    // router tile's logits.
    up.tasks.push_back(make_task(Op::kExpertUp, L, {sm, sm + 1, s.n_sms},
                                 {{C(c.oproj_done), s.n_oproj_tasks}, {C(c.router_done), s.n_router_tasks}},
                                 {{C(c.up_done), 1}}));
    up.sm.push_back(sm);
    down.tasks.push_back(
        make_task(Op::kExpertDown, L, {sm, sm + 1, s.n_sms}, {{C(c.up_done), s.n_sms}}, {{C(c.down_done), 1}}));
    down.sm.push_back(sm);
  }
  out.push_back(std::move(up));
  out.push_back(std::move(down));
}

// A parallel block (op_table.h): QKV and router tiles (and up shares) read the layer input; the
// routed or dense FFN's up half runs beside attention; O-proj stores o after the layer's attention;
// the down shares, which wait on every up share and every O-proj tile, write the residual
// x = (x + o) + F (a routed share meets the O-proj wait only at that write: kLastWaitAtWrite), and
// the next layer's first waves wait on every down share. Waves: QKV, ROUTER,
// ATTN, EXPERT_UP, O_PROJ, EXPERT_DOWN: an SM that finishes its up share early runs its O-proj tile
// while the down shares wait for the last up share, and O-proj's weight pages stream while the up
// share computes (router-after-attn: QKV, ATTN, ROUTER, ...; a dense layer: QKV, ATTN, DENSE_UP,
// O_PROJ, DENSE_DOWN).
void parallel_layer_waves(const PlanShape& s, const CounterLayout& c, int L, bool dense, std::vector<WaveBuild>& out) {
  auto C = [&](int32_t offset) { return layer_counter(c, L, offset); };
  const int G = s.n_kv_heads;
  const Wait after_prev_layer{L > 0 ? layer_counter(c, L - 1, c.down_done) : -1, s.n_sms};
  auto input_task = [&](Op op, std::initializer_list<int32_t> args, int32_t arrive) {
    Task t = make_task(op, L, args, {}, {{arrive, 1}});
    if (L > 0) t.wait[t.n_waits++] = after_prev_layer;
    return t;
  };

  WaveBuild qkv{Op::kQkv, L, {}, {}};
  const int per_group = s.n_qkv_tasks / G, group_rbs = s.qkv_group_rows / 16;
  for (int g = 0; g < G; ++g)
    for (const auto& [a, b] : cut(g * group_rbs, group_rbs, per_group))
      qkv.tasks.push_back(input_task(Op::kQkv, {a, b}, C(c.qkv_done + g)));
  out.push_back(std::move(qkv));

  WaveBuild router{Op::kRouter, L, {}, {}};
  if (!dense)
    for (const auto& [a, b] : cut(0, (s.n_experts + 15) / 16, s.n_router_tasks)) {
      Task t = input_task(Op::kRouter, {a, b}, C(c.router_done));
      if (s.router_after_attn) t.wait[t.n_waits++] = {C(c.attn_done), s.batch * G};
      router.tasks.push_back(t);
    }
  if (!dense && !s.router_after_attn) out.push_back(std::move(router));
  out.push_back(WaveBuild{Op::kAttn, L, {}, {}});  // its tasks come with the step's items
  if (!dense && s.router_after_attn) out.push_back(std::move(router));

  const Op up_op = dense ? Op::kDenseUp : Op::kExpertUp, down_op = dense ? Op::kDenseDown : Op::kExpertDown;
  WaveBuild up{up_op, L, {}, {}}, down{down_op, L, {}, {}};
  for (int sm = 0; sm < s.n_sms; ++sm) {
    // Routed up shares normalise the layer input (after the previous layer: the fill can run before
    // the routing is known, as in sequential blocks after O-proj), then read the router tiles'
    // logits (their last wait); dense up shares only the layer input.
    Task u = input_task(up_op, {sm, sm + 1, s.n_sms}, C(c.up_done));
    if (!dense) u.wait[u.n_waits++] = {C(c.router_done), s.n_router_tasks};
    up.tasks.push_back(u);
    up.sm.push_back(sm);
    Task d = make_task(down_op, L, {sm, sm + 1, s.n_sms}, {{C(c.up_done), s.n_sms}, {C(c.oproj_done), s.n_oproj_tasks}},
                       {{C(c.down_done), 1}});
    if (!dense) d.flags = kLastWaitAtWrite;  // the O-proj wait, at the combine
    down.tasks.push_back(d);
    down.sm.push_back(sm);
  }
  out.push_back(std::move(up));

  WaveBuild oproj{Op::kOProj, L, {}, {}};
  for (const auto& [a, b] : cut(0, s.hidden / 16, s.n_oproj_tasks))
    oproj.tasks.push_back(make_task(Op::kOProj, L, {a, b}, {{C(c.attn_done), s.batch * G}}, {{C(c.oproj_done), 1}}));
  out.push_back(std::move(oproj));
  out.push_back(std::move(down));
}

int layer_wave_count(const PlanShape& s, const std::vector<LayerSpec>& layers, int L) {
  return s.parallel && layers[L].ffn == FfnKind::kDense ? 5 : 6;
}

void final_waves(const PlanShape& s, const CounterLayout& c, std::vector<WaveBuild>& out) {
  if (!s.lm_head) return;
  WaveBuild lm{Op::kLmHead, -1, {}, {}};
  const Wait after_moe{layer_counter(c, s.n_layers - 1, c.down_done), s.n_sms};  // the final x
  for (const auto& [a, b] : cut(0, (s.vocab + 15) / 16, s.n_lm_tasks))
    lm.tasks.push_back(make_task(Op::kLmHead, -1, {a, b}, {after_moe}, {{c.lm_head_done, 1}}));
  out.push_back(std::move(lm));
  if (!s.sample) return;
  WaveBuild sample{Op::kSample, -1, {}, {}};
  for (int t = 0; t < s.batch; ++t)
    sample.tasks.push_back(make_task(Op::kSample, -1, {t, t + 1}, {{c.lm_head_done, s.n_lm_tasks}}, {{c.sample_done, 1}}));
  out.push_back(std::move(sample));
}

// Under grid-sync every task of wave w waits on all of wave w-1 (prev_tasks of them) instead of
// its own producers, and also arrives on wave w's counter.
void grid_sync_task(const CounterLayout& c, int w, int32_t prev_tasks, Task& t) {
  t.n_waits = 0;
  t.flags &= static_cast<uint8_t>(~kLastWaitAtWrite);  // its one wait is the fill's too
  if (w > 0) t.wait[t.n_waits++] = {c.wave_done + w - 1, prev_tasks};
  MD_CHECK(t.n_arrives < kMaxArrives, "grid-sync: no room for the wave arrival");
  t.arrive[t.n_arrives++] = {c.wave_done + w, 1};
}

void grid_sync(const CounterLayout& c, std::vector<WaveBuild>& waves) {
  for (size_t w = 0; w < waves.size(); ++w)
    for (Task& t : waves[w].tasks)
      grid_sync_task(c, static_cast<int>(w), w > 0 ? static_cast<int32_t>(waves[w - 1].tasks.size()) : 0, t);
}

// Round-robin dealing continues where the previous wave ended; routed shares go where they say;
// the ATTN waves (empty here) cut each SM's list into segments and leave the cursor alone.
void deal_static(const std::vector<WaveBuild>& waves, PlanSkeleton& sk) {
  const int n_sms = sk.shape.n_sms;
  std::vector<std::vector<std::pair<Task, int>>> lists(n_sms);
  std::vector<std::vector<int32_t>> cuts(n_sms);
  int cursor = 0;
  for (size_t w = 0; w < waves.size(); ++w) {
    const WaveBuild& wave = waves[w];
    sk.waves.push_back({wave.op, wave.layer, static_cast<int>(wave.tasks.size())});
    const int n = static_cast<int>(wave.tasks.size());
    if (wave.op == Op::kAttn) {
      sk.attn_wave.push_back(static_cast<int>(w));
      sk.attn_cursor.push_back(cursor);
      for (int m = 0; m < n_sms; ++m) cuts[m].push_back(static_cast<int32_t>(lists[m].size()));
      continue;
    }
    if (!wave.sm.empty()) {
      for (int k = 0; k < n; ++k) lists[wave.sm[k]].push_back({wave.tasks[k], static_cast<int>(w)});
      continue;
    }
    for (int k = 0; k < n; ++k) lists[(cursor + k) % n_sms].push_back({wave.tasks[k], static_cast<int>(w)});
    cursor = (cursor + n) % n_sms;
  }
  for (int m = 0; m < n_sms; ++m) {
    const int32_t base = static_cast<int32_t>(sk.static_tasks.size());
    sk.seg_begin.push_back(base);
    for (int32_t cut : cuts[m]) sk.seg_begin.push_back(base + cut);
    for (const auto& [task, wave] : lists[m]) {
      sk.static_tasks.push_back(task);
      sk.static_wave.push_back(wave);
    }
  }
  sk.seg_begin.push_back(static_cast<int32_t>(sk.static_tasks.size()));
}

// Counter kinds, and the totals of the static tasks' arrivals (assemble_plan adds the attention's).
void describe_counters(const PlanShape& s, const CounterLayout& c, PlanSkeleton& sk) {
  std::vector<CounterInfo>& info = sk.counter_info;
  info.assign(c.n_counters, CounterInfo{});
  auto set = [&](int32_t idx, CounterKind kind, int layer, int index) {
    info[idx].kind = kind;
    info[idx].layer = layer;
    info[idx].index = index;
  };
  const int G = s.n_kv_heads;
  for (int L = 0; L < s.n_layers; ++L) {
    auto C = [&](int32_t offset) { return layer_counter(c, L, offset); };
    for (int g = 0; g < G; ++g) set(C(c.qkv_done + g), CounterKind::kQkvDone, L, g);
    for (int i = 0; i < s.batch * G; ++i) set(C(c.attn_split + i), CounterKind::kAttnSplit, L, i);
    set(C(c.attn_done), CounterKind::kAttnDone, L, 0);
    set(C(c.oproj_done), CounterKind::kOprojDone, L, 0);
    set(C(c.router_done), CounterKind::kRouterDone, L, 0);
    set(C(c.up_done), CounterKind::kUpDone, L, 0);
    set(C(c.down_done), CounterKind::kDownDone, L, 0);
  }
  set(c.lm_head_done, CounterKind::kLmHeadDone, -1, 0);
  set(c.sample_done, CounterKind::kSampleDone, -1, 0);
  if (c.wave_done >= 0)
    for (size_t w = 0; w < sk.waves.size(); ++w)
      set(c.wave_done + static_cast<int32_t>(w), CounterKind::kWaveDone, -1, static_cast<int>(w));
  for (const Task& t : sk.static_tasks)
    for (int j = 0; j < t.n_arrives; ++j) info[t.arrive[j].counter].total += t.arrive[j].amount;
}

}  // namespace

void check_batch(const BatchState& batch) {
  std::set<std::pair<int32_t, int>> new_slots;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqState& q = batch.seqs[i];
    MD_REQUIRE(q.n_ctx >= 1, "sequence ", i, ": context length ", q.n_ctx, " < 1");
    const size_t need = (static_cast<size_t>(q.n_ctx) + batch.kv_block_size - 1) / batch.kv_block_size;
    MD_REQUIRE(q.block_table.size() >= need, "sequence ", i, ": block table has ", q.block_table.size(),
               " blocks, context ", q.n_ctx, " needs ", need);
    for (size_t b = 0; b < need; ++b)
      MD_REQUIRE(q.block_table[b] >= 0, "sequence ", i, ": block table entry ", b, " is ", q.block_table[b]);
    const int pos = q.n_ctx - 1;
    auto slot = std::make_pair(q.block_table[pos / batch.kv_block_size], pos % batch.kv_block_size);
    MD_REQUIRE(new_slots.insert(slot).second, "sequence ", i, ": its new token's KV slot (block ", slot.first,
               ", offset ", slot.second, ") is also another sequence's new slot");
  }
}

void check_ring_tables(const BatchState& batch, int ring_len) {
  std::set<std::pair<int32_t, int>> new_slots;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqState& q = batch.seqs[i];
    if (ring_len == 0) {
      MD_REQUIRE(q.ring_table.empty(), "sequence ", i, ": a ring table of ", q.ring_table.size(),
                 " blocks for a model without sliding-window layers");
      continue;
    }
    const size_t need = std::min<size_t>(ring_len, (static_cast<size_t>(q.n_ctx) + batch.kv_block_size - 1) / batch.kv_block_size);
    MD_REQUIRE(q.ring_table.size() >= need && q.ring_table.size() <= static_cast<size_t>(ring_len), "sequence ", i,
               ": ring table of ", q.ring_table.size(), " blocks, context ", q.n_ctx, " needs ", need, " (at most ",
               ring_len, ")");
    for (size_t b = 0; b < need; ++b)
      MD_REQUIRE(q.ring_table[b] >= 0, "sequence ", i, ": ring table entry ", b, " is ", q.ring_table[b]);
    const int pos = q.n_ctx - 1;
    auto slot = std::make_pair(q.ring_table[(pos / batch.kv_block_size) % ring_len], pos % batch.kv_block_size);
    MD_REQUIRE(new_slots.insert(slot).second, "sequence ", i, ": its new token's ring slot (block ", slot.first,
               ", offset ", slot.second, ") is also another sequence's new slot");
  }
}

PlanSkeleton plan_skeleton(const PlanShape& s, const std::vector<LayerSpec>& layers, const Policy& policy) {
  MD_CHECK(static_cast<int>(layers.size()) == s.n_layers);
  MD_REQUIRE(policy.up_balance_tokens_per_unit >= 0, "policy ", policy.name, ": up_balance_tokens_per_unit ",
             policy.up_balance_tokens_per_unit, " < 0");
  PlanSkeleton sk;
  sk.shape = s;
  sk.up_balance_tokens_per_unit = s.parallel ? policy.up_balance_tokens_per_unit : 0.0;
  int n_waves = (s.lm_head ? 1 : 0) + (s.sample ? 1 : 0);
  for (int L = 0; L < s.n_layers; ++L) n_waves += layer_wave_count(s, layers, L);
  sk.counters = counter_layout(s, n_waves);
  std::vector<WaveBuild> waves;
  for (int L = 0; L < s.n_layers; ++L) {
    if (s.parallel)
      parallel_layer_waves(s, sk.counters, L, layers[L].ffn == FfnKind::kDense, waves);
    else
      layer_waves(s, sk.counters, L, waves);
    uint8_t flags = 0;
    if (s.parallel && layers[L].sliding_window > 0) flags |= kAttnSliding;
    if (s.parallel && !layers[L].use_rope) flags |= kAttnNoRope;
    sk.attn_flags.push_back(flags);
  }
  final_waves(s, sk.counters, waves);
  MD_CHECK(static_cast<int>(waves.size()) == n_waves);
  if (s.grid_sync) grid_sync(sk.counters, waves);
  deal_static(waves, sk);
  describe_counters(s, sk.counters, sk);
  return sk;
}

Task attention_task(const PlanSkeleton& sk, int layer, int item, int group) {
  const PlanShape& s = sk.shape;
  const CounterLayout& c = sk.counters;
  const int32_t per_group = s.n_qkv_tasks / s.n_kv_heads;
  Task t = make_task(Op::kAttn, layer, {item}, {{layer_counter(c, layer, c.qkv_done + group), per_group}}, {});
  t.flags = sk.attn_flags[layer];
  if (s.grid_sync) {
    const int w = sk.attn_wave[layer];
    grid_sync_task(c, w, sk.waves[w - 1].n_tasks, t);
  }
  return t;
}

Plan make_plan(const ModelConfig& config, const BatchState& batch, const Policy& policy, const PlanOptions& options) {
  check_plannable(config, batch, policy, options);
  check_batch(batch);
  Plan plan;
  plan.policy = policy.name;
  PlanShape s = plan_shape(config, batch, policy, options);
  check_ring_tables(batch, s.ring_len);
  plan.attn_items = plan_attention_items(config, batch, policy);
  s.n_full_items = s.parallel ? count_full_items(config, batch, policy) : 0;
  const PlanSkeleton sk = plan_skeleton(s, config.layers, policy);
  assemble_plan(sk, plan.attn_items, s.n_full_items, place_attention_sets(plan.attn_items, s.n_full_items, s.n_sms), plan);
  s.n_attn_items = static_cast<int32_t>(plan.attn_items.size());
  plan.params.shape = s;
  plan.params.counters = sk.counters;
  plan.params.buffers = buffer_layout(s);
  return plan;
}

}  // namespace megadecode
