// The planner's scheduling half: builds each wave's tasks with their waits and arrivals, deals them
// to the SMs per policy, and records counter totals, queues and dynamic arrivals for the validator.
#include <algorithm>
#include <set>
#include <utility>

#include "core/check.h"
#include "plan/planner_internal.h"

namespace megadecode {
namespace {

struct WaveBuild {
  Op op;
  int layer;
  std::vector<Task> tasks;  // static waves: in dealing order; drain waves: empty (one per SM)
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

// The tasks of one layer's waves, in the policy's tile order.
void layer_waves(const PlanShape& s, const CounterLayout& c, const Policy& p, int L, std::vector<WaveBuild>& out) {
  auto C = [&](int32_t offset) { return layer_counter(c, L, offset); };
  const int G = s.n_kv_heads;

  WaveBuild norm{Op::kAttnNorm, L, {}};
  for (int t = 0; t < s.batch; t += s.norm_tokens) {
    Task task = make_task(Op::kAttnNorm, L, {t, std::min(s.batch, t + s.norm_tokens)}, {}, {{C(c.norm_done), 1}});
    // Layer 0 reads the embedding; later layers combine the previous layer's experts.
    if (L > 0) task.wait[task.n_waits++] = {layer_counter(c, L - 1, c.down_done), s.n_experts * s.down_blocks};
    norm.tasks.push_back(task);
  }
  out.push_back(std::move(norm));

  WaveBuild qkv{Op::kQkv, L, {}};
  const Wait after_norm{C(c.norm_done), s.n_norm_tasks};
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < s.qkv_group_rows; r += s.qkv_rows)
      qkv.tasks.push_back(make_task(Op::kQkv, L, {g, r, std::min(s.qkv_group_rows, r + s.qkv_rows)}, {after_norm},
                                    {{C(c.qkv_done + g), 1}}));
  if (p.order == TileOrder::kRowMajor) {
    // Plain weight-row order: all q rows, then k, then v (a group is complete only at the end).
    const int qrows = s.group_size * s.head_dim;
    auto key = [&](const Task& t) {
      const int m = t.arg[1] < qrows ? 0 : t.arg[1] < qrows + s.head_dim ? 1 : 2;
      return std::make_tuple(m, t.arg[0], t.arg[1]);
    };
    std::stable_sort(qkv.tasks.begin(), qkv.tasks.end(), [&](const Task& a, const Task& b) { return key(a) < key(b); });
  }
  out.push_back(std::move(qkv));

  out.push_back({Op::kAttn, L, {}});

  WaveBuild oproj{Op::kOProj, L, {}};
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < s.hidden; r += s.o_rows)
      oproj.tasks.push_back(make_task(Op::kOProj, L, {g, r, std::min(s.hidden, r + s.o_rows)},
                                      {{C(c.attn_done + g), s.batch}}, {{C(c.oproj_done), 1}}));
  if (p.order == TileOrder::kRowMajor)
    std::stable_sort(oproj.tasks.begin(), oproj.tasks.end(), [](const Task& a, const Task& b) {
      return std::make_pair(a.arg[1], a.arg[0]) < std::make_pair(b.arg[1], b.arg[0]);
    });
  out.push_back(std::move(oproj));

  WaveBuild moe_norm{Op::kMoeNorm, L, {}};
  for (int t = 0; t < s.batch; t += s.norm_tokens)
    moe_norm.tasks.push_back(make_task(Op::kMoeNorm, L, {t, std::min(s.batch, t + s.norm_tokens)},
                                       {{C(c.oproj_done), G * s.o_row_blocks}}, {{C(c.moe_norm_done), 1}}));
  out.push_back(std::move(moe_norm));

  WaveBuild router{Op::kRouter, L, {}};
  for (int e = 0; e < s.n_experts; e += s.router_rows)
    router.tasks.push_back(make_task(Op::kRouter, L, {e, std::min(s.n_experts, e + s.router_rows)},
                                     {{C(c.moe_norm_done), s.n_norm_tasks}}, {{C(c.router_done), 1}}));
  out.push_back(std::move(router));

  WaveBuild dispatch{Op::kDispatch, L, {}};
  dispatch.tasks.push_back(
      make_task(Op::kDispatch, L, {}, {{C(c.router_done), s.router_tiles}}, {{C(c.dispatch_done), 1}}));
  out.push_back(std::move(dispatch));

  out.push_back({Op::kExpertUp, L, {}});
  out.push_back({Op::kExpertDown, L, {}});
}

void final_waves(const PlanShape& s, const CounterLayout& c, std::vector<WaveBuild>& out) {
  if (!s.lm_head) return;
  WaveBuild norm{Op::kFinalNorm, -1, {}};
  const Wait after_moe{layer_counter(c, s.n_layers - 1, c.down_done), s.n_experts * s.down_blocks};
  for (int t = 0; t < s.batch; t += s.norm_tokens)
    norm.tasks.push_back(make_task(Op::kFinalNorm, -1, {t, std::min(s.batch, t + s.norm_tokens)}, {after_moe},
                                   {{c.final_norm_done, 1}}));
  out.push_back(std::move(norm));
  WaveBuild lm{Op::kLmHead, -1, {}};
  for (int v = 0; v < s.vocab; v += s.lm_rows)
    lm.tasks.push_back(make_task(Op::kLmHead, -1, {v, std::min(s.vocab, v + s.lm_rows)},
                                 {{c.final_norm_done, s.n_norm_tasks}}, {{c.lm_head_done, 1}}));
  out.push_back(std::move(lm));
  if (!s.sample) return;
  WaveBuild sample{Op::kSample, -1, {}};
  for (int t = 0; t < s.batch; t += s.norm_tokens)
    sample.tasks.push_back(make_task(Op::kSample, -1, {t, std::min(s.batch, t + s.norm_tokens)},
                                     {{c.lm_head_done, s.lm_tiles}}, {{c.sample_done, 1}}));
  out.push_back(std::move(sample));
}

// Drain waves become one drain task per SM. Under grid-sync every task of wave w waits on all of
// wave w-1 instead of its own producers, and also arrives on wave w's counter.
void finish_waves(const PlanShape& s, const CounterLayout& c, const Policy& p, std::vector<WaveBuild>& waves) {
  for (size_t w = 0; w < waves.size(); ++w) {
    WaveBuild& wave = waves[w];
    if (op_is_drain(wave.op)) {
      for (int sm = 0; sm < s.n_sms; ++sm) {
        Task t = make_task(wave.op, wave.layer, {}, {}, {});
        if (wave.op != Op::kAttn) t.wait[t.n_waits++] = {layer_counter(c, wave.layer, c.dispatch_done), 1};
        wave.tasks.push_back(t);
      }
    }
    if (!p.grid_sync) continue;
    for (Task& t : wave.tasks) {
      t.n_waits = 0;
      if (w > 0) t.wait[t.n_waits++] = {c.wave_done + static_cast<int32_t>(w) - 1, static_cast<int32_t>(waves[w - 1].tasks.size())};
      t.arrive[t.n_arrives++] = {c.wave_done + static_cast<int32_t>(w), 1};
    }
  }
}

void deal(const PlanShape& s, const Policy& p, const std::vector<WaveBuild>& waves, Plan& plan) {
  std::vector<std::vector<std::pair<Task, int>>> lists(s.n_sms);
  int cursor = 0;
  for (size_t w = 0; w < waves.size(); ++w) {
    const WaveBuild& wave = waves[w];
    plan.waves.push_back({wave.op, wave.layer, static_cast<int>(wave.tasks.size())});
    if (op_is_drain(wave.op)) {
      for (int sm = 0; sm < s.n_sms; ++sm) lists[sm].push_back({wave.tasks[sm], static_cast<int>(w)});
      continue;
    }
    const int start = p.deal == WaveDeal::kRotate ? cursor : 0;
    const int n = static_cast<int>(wave.tasks.size());
    for (int k = 0; k < n; ++k) lists[(start + k) % s.n_sms].push_back({wave.tasks[k], static_cast<int>(w)});
    cursor = (start + n) % s.n_sms;
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

// Counter names and totals, queues, and the arrivals that happen at run time.
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
    set(C(c.norm_done), CounterKind::kNormDone, L, 0);
    for (int g = 0; g < G; ++g) set(C(c.qkv_done + g), CounterKind::kQkvDone, L, g);
    for (int i = 0; i < s.batch * G; ++i) set(C(c.attn_split + i), CounterKind::kAttnSplit, L, i);
    for (int g = 0; g < G; ++g) set(C(c.attn_done + g), CounterKind::kAttnDone, L, g);
    set(C(c.oproj_done), CounterKind::kOprojDone, L, 0);
    set(C(c.moe_norm_done), CounterKind::kMoeNormDone, L, 0);
    set(C(c.router_done), CounterKind::kRouterDone, L, 0);
    set(C(c.dispatch_done), CounterKind::kDispatchDone, L, 0);
    for (int e = 0; e < s.n_experts; ++e) set(C(c.up_done + e), CounterKind::kUpDone, L, e);
    set(C(c.down_done), CounterKind::kDownDone, L, 0);
    set(C(c.attn_head), CounterKind::kAttnHead, L, 0);
    set(C(c.up_head), CounterKind::kUpHead, L, 0);
    set(C(c.down_head), CounterKind::kDownHead, L, 0);
  }
  set(c.final_norm_done, CounterKind::kFinalNormDone, -1, 0);
  set(c.lm_head_done, CounterKind::kLmHeadDone, -1, 0);
  set(c.sample_done, CounterKind::kSampleDone, -1, 0);
  if (c.wave_done >= 0)
    for (size_t w = 0; w < plan.waves.size(); ++w) set(c.wave_done + static_cast<int32_t>(w), CounterKind::kWaveDone, -1, static_cast<int>(w));

  for (const Task& t : plan.tasks)
    for (int j = 0; j < t.n_arrives; ++j) plan.counters[t.arrive[j].counter].total += t.arrive[j].amount;

  // Queues and dynamic arrivals, layer by layer.
  std::vector<int> n_splits(s.batch, 0);
  for (const AttnItem& it : plan.attn_items) n_splits[it.seq] = it.n_splits;
  std::vector<int> dispatch_task(s.n_layers, -1);
  for (size_t i = 0; i < plan.tasks.size(); ++i)
    if (plan.tasks[i].op == static_cast<uint8_t>(Op::kDispatch)) dispatch_task[plan.tasks[i].layer] = static_cast<int>(i);
  auto dyn = [&](int32_t counter, int32_t max_amount, int32_t queue, int32_t task, int32_t total) {
    plan.dynamic_arrivals.push_back({counter, max_amount, queue, task});
    if (total >= 0) plan.counters[counter].total += total;
  };
  const int32_t up_total = s.up_blocks, down_total = s.n_experts * s.down_blocks;
  for (int L = 0; L < s.n_layers; ++L) {
    auto C = [&](int32_t offset) { return layer_counter(c, L, offset); };
    const int32_t qa = static_cast<int32_t>(plan.queues.size());
    QueueInfo attn{Op::kAttn, L, C(c.attn_head), s.attn_capacity, s.n_attn_items, s.n_attn_items, {}};
    for (int g = 0; g < G; ++g) attn.item_waits.push_back({C(c.qkv_done + g), s.qkv_tiles_per_group});
    plan.queues.push_back(attn);
    for (int q = 0; q < s.batch; ++q)
      for (int g = 0; g < G; ++g) dyn(C(c.attn_split + q * G + g), n_splits[q], qa, -1, n_splits[q]);
    for (int g = 0; g < G; ++g) dyn(C(c.attn_done + g), s.batch, qa, -1, s.batch);
    dyn(C(c.attn_head), s.attn_capacity + s.n_sms, qa, -1, s.n_attn_items + s.n_sms);

    const int32_t qu = qa + 1, qd = qa + 2;
    plan.queues.push_back({Op::kExpertUp, L, C(c.up_head), s.up_capacity, -1, s.up_capacity, {}});
    QueueInfo down{Op::kExpertDown, L, C(c.down_head), s.down_capacity, -1, s.down_capacity, {}};
    for (int e = 0; e < s.n_experts; ++e) down.item_waits.push_back({C(c.up_done + e), s.up_blocks});
    plan.queues.push_back(down);
    for (int e = 0; e < s.n_experts; ++e) {
      dyn(C(c.up_done + e), s.up_blocks, qu, -1, up_total);
      dyn(C(c.up_done + e), s.up_blocks, -1, dispatch_task[L], -1);
    }
    dyn(C(c.down_done), s.down_capacity, qd, -1, down_total);
    dyn(C(c.down_done), down_total, -1, dispatch_task[L], -1);
    dyn(C(c.up_head), s.up_capacity + s.n_sms, qu, -1, s.n_sms);
    dyn(C(c.down_head), s.down_capacity + s.n_sms, qd, -1, s.n_sms);
    plan.counters[C(c.up_head)].exact = false;
    plan.counters[C(c.down_head)].exact = false;
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
  s.attn_capacity = attn_capacity(s, policy);
  s.n_attn_items = static_cast<int32_t>(plan.attn_items.size());

  const int n_waves = s.n_layers * 9 + (s.lm_head ? 2 : 0) + (s.sample ? 1 : 0);
  const CounterLayout c = counter_layout(s, n_waves);
  std::vector<WaveBuild> waves;
  for (int L = 0; L < s.n_layers; ++L) layer_waves(s, c, policy, L, waves);
  final_waves(s, c, waves);
  MD_CHECK(static_cast<int>(waves.size()) == n_waves);
  finish_waves(s, c, policy, waves);
  deal(s, policy, waves, plan);

  plan.params.shape = s;
  plan.params.counters = c;
  plan.params.buffers = buffer_layout(s);
  describe_counters(s, c, plan);
  return plan;
}

}  // namespace megadecode
