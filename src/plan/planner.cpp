// The planner's scheduling half: builds each wave's tasks with their waits and arrivals, deals them
// to the SMs, and records counter totals and the attention items' dynamic arrivals for the validator.
#include <algorithm>
#include <numeric>
#include <set>
#include <utility>

#include "core/check.h"
#include "plan/planner_internal.h"

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

// n tiles of contiguous row blocks [rb0, rb0 + n_rbs): tile i = [rb0 + n_rbs*i/n, rb0 + n_rbs*(i+1)/n).
std::vector<std::pair<int, int>> cut(int rb0, int n_rbs, int n) {
  std::vector<std::pair<int, int>> out;
  for (int i = 0; i < n; ++i)
    out.push_back({rb0 + static_cast<int>(int64_t(n_rbs) * i / n), rb0 + static_cast<int>(int64_t(n_rbs) * (i + 1) / n)});
  return out;
}

// Attention items on SMs: largest first, each to the SM with the fewest attention key positions so
// far (ties: the first SM after `cursor`), so SMs finish their items together.
std::vector<int> place_items(const std::vector<AttnItem>& items, int n_sms, int cursor) {
  std::vector<int> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  auto len = [&](int i) { return items[i].pos_end - items[i].pos_begin; };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return len(a) > len(b); });
  std::vector<int64_t> load(n_sms, 0);
  std::vector<int> sm_of(items.size());
  for (int i : order) {
    int best = -1;
    for (int k = 0; k < n_sms; ++k) {
      const int sm = (cursor + k) % n_sms;
      if (best < 0 || load[sm] < load[best]) best = sm;
    }
    sm_of[i] = best;
    load[best] += len(i);
  }
  return sm_of;
}

void layer_waves(const PlanShape& s, const CounterLayout& c, const std::vector<AttnItem>& items, int L,
                 std::vector<WaveBuild>& out) {
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

  WaveBuild attn{Op::kAttn, L, {}, {}};
  for (int i = 0; i < static_cast<int>(items.size()); ++i)
    attn.tasks.push_back(make_task(Op::kAttn, L, {i}, {{C(c.qkv_done + items[i].group), per_group}}, {}));
  out.push_back(std::move(attn));

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
    up.tasks.push_back(make_task(Op::kExpertUp, L, {sm, s.n_sms},
                                 {{C(c.oproj_done), s.n_oproj_tasks}, {C(c.router_done), s.n_router_tasks}},
                                 {{C(c.up_done), 1}}));
    up.sm.push_back(sm);
    down.tasks.push_back(make_task(Op::kExpertDown, L, {sm, s.n_sms}, {{C(c.up_done), s.n_sms}}, {{C(c.down_done), 1}}));
    down.sm.push_back(sm);
  }
  out.push_back(std::move(up));
  out.push_back(std::move(down));
}

void final_waves(const PlanShape& s, const CounterLayout& c, std::vector<WaveBuild>& out) {
  if (!s.lm_head) return;
  WaveBuild lm{Op::kLmHead, -1, {}, {}};
  const Wait after_moe{layer_counter(c, s.n_layers - 1, c.down_done), s.n_sms};
  for (const auto& [a, b] : cut(0, (s.vocab + 15) / 16, s.n_lm_tasks))
    lm.tasks.push_back(make_task(Op::kLmHead, -1, {a, b}, {after_moe}, {{c.lm_head_done, 1}}));
  out.push_back(std::move(lm));
  if (!s.sample) return;
  WaveBuild sample{Op::kSample, -1, {}, {}};
  for (int t = 0; t < s.batch; ++t)
    sample.tasks.push_back(make_task(Op::kSample, -1, {t, t + 1}, {{c.lm_head_done, s.n_lm_tasks}}, {{c.sample_done, 1}}));
  out.push_back(std::move(sample));
}

// Under grid-sync every task of wave w waits on all of wave w-1 instead of its own producers, and
// also arrives on wave w's counter.
void grid_sync(const CounterLayout& c, std::vector<WaveBuild>& waves) {
  for (size_t w = 0; w < waves.size(); ++w)
    for (Task& t : waves[w].tasks) {
      t.n_waits = 0;
      if (w > 0) t.wait[t.n_waits++] = {c.wave_done + static_cast<int32_t>(w) - 1, static_cast<int32_t>(waves[w - 1].tasks.size())};
      MD_CHECK(t.n_arrives < kMaxArrives, "grid-sync: no room for the wave arrival");
      t.arrive[t.n_arrives++] = {c.wave_done + static_cast<int32_t>(w), 1};
    }
}

// Round-robin dealing continues where the previous wave ended; placed tasks go where they say.
void deal(const PlanShape& s, const std::vector<WaveBuild>& waves, const std::vector<AttnItem>& items, Plan& plan) {
  std::vector<std::vector<std::pair<Task, int>>> lists(s.n_sms);
  int cursor = 0;
  for (size_t w = 0; w < waves.size(); ++w) {
    const WaveBuild& wave = waves[w];
    plan.waves.push_back({wave.op, wave.layer, static_cast<int>(wave.tasks.size())});
    const int n = static_cast<int>(wave.tasks.size());
    if (wave.op == Op::kAttn) {
      const std::vector<int> sm_of = place_items(items, s.n_sms, cursor);
      for (int k = 0; k < n; ++k) lists[sm_of[k]].push_back({wave.tasks[k], static_cast<int>(w)});
      continue;
    }
    if (!wave.sm.empty()) {
      for (int k = 0; k < n; ++k) lists[wave.sm[k]].push_back({wave.tasks[k], static_cast<int>(w)});
      continue;
    }
    for (int k = 0; k < n; ++k) lists[(cursor + k) % s.n_sms].push_back({wave.tasks[k], static_cast<int>(w)});
    cursor = (cursor + n) % s.n_sms;
  }
  plan.list_begin.push_back(0);
  for (const auto& list : lists) {
    for (const auto& [task, wave] : list) {
      plan.tasks.push_back(task);
      plan.task_wave.push_back(wave);
    }
    plan.list_begin.push_back(static_cast<int32_t>(plan.tasks.size()));
  }
}

// Counter names and totals, and the arrivals the attention items make at run time.
void describe_counters(const PlanShape& s, const CounterLayout& c, Plan& plan) {
  plan.counters.assign(c.n_counters, CounterInfo{});
  auto set = [&](int32_t idx, CounterKind kind, int layer, int index) {
    plan.counters[idx].kind = kind;
    plan.counters[idx].layer = layer;
    plan.counters[idx].index = index;
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
    for (size_t w = 0; w < plan.waves.size(); ++w) set(c.wave_done + static_cast<int32_t>(w), CounterKind::kWaveDone, -1, static_cast<int>(w));

  for (const Task& t : plan.tasks)
    for (int j = 0; j < t.n_arrives; ++j) plan.counters[t.arrive[j].counter].total += t.arrive[j].amount;

  // The attention items' arrivals: each (seq, g)'s splits count into its split counter, and the
  // last of them arrives on attn_done.
  std::vector<std::vector<std::vector<int32_t>>> by_pair(s.n_layers, std::vector<std::vector<int32_t>>(s.batch * G));
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const Task& t = plan.tasks[i];
    if (t.op != static_cast<uint8_t>(Op::kAttn)) continue;
    const AttnItem& it = plan.attn_items[t.arg[0]];
    by_pair[t.layer][it.seq * G + it.group].push_back(static_cast<int32_t>(i));
  }
  for (int L = 0; L < s.n_layers; ++L) {
    std::vector<int32_t> all;
    for (int q = 0; q < s.batch * G; ++q) {
      const int32_t ctr = layer_counter(c, L, c.attn_split + q);
      const int n = static_cast<int>(by_pair[L][q].size());
      plan.dynamic_arrivals.push_back({ctr, n, by_pair[L][q]});
      plan.counters[ctr].total += n;
      all.insert(all.end(), by_pair[L][q].begin(), by_pair[L][q].end());
    }
    const int32_t done = layer_counter(c, L, c.attn_done);
    plan.dynamic_arrivals.push_back({done, s.batch * G, std::move(all)});
    plan.counters[done].total += s.batch * G;
  }
}

}  // namespace

Plan make_plan(const ModelConfig& config, const BatchState& batch, const Policy& policy, const PlanOptions& options) {
  check_plannable(config, batch, policy, options);
  check_batch(batch);
  Plan plan;
  plan.policy = policy.name;
  PlanShape s = plan_shape(config, batch, policy, options);
  plan.attn_items = plan_attention_items(config, batch, policy);
  s.n_attn_items = static_cast<int32_t>(plan.attn_items.size());

  const int n_waves = s.n_layers * 6 + (s.lm_head ? 1 : 0) + (s.sample ? 1 : 0);
  const CounterLayout c = counter_layout(s, n_waves);
  std::vector<WaveBuild> waves;
  for (int L = 0; L < s.n_layers; ++L) layer_waves(s, c, plan.attn_items, L, waves);
  final_waves(s, c, waves);
  MD_CHECK(static_cast<int>(waves.size()) == n_waves);
  if (policy.grid_sync) grid_sync(c, waves);
  deal(s, waves, plan.attn_items, plan);

  plan.params.shape = s;
  plan.params.counters = c;
  plan.params.buffers = buffer_layout(s);
  describe_counters(s, c, plan);
  return plan;
}

}  // namespace megadecode
