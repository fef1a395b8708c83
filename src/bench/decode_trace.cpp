// Chrome/Perfetto trace export of one megakernel step (decode_trace.h).
#include "bench/decode_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "core/check.h"
#include "core/stats.h"
#include "plan/op_table.h"

namespace megadecode {
namespace {

// Maps an SM's clock64 onto globaltimer: g ~ a + b * c fitted over every begin/end pair.
struct ClockMap {
  double a = 0, b = 0;
  bool use_clock = false;
  double operator()(int64_t c, int64_t g) const { return use_clock ? a + b * static_cast<double>(c) : static_cast<double>(g); }
};

ClockMap fit_clock(std::span<const TraceRecord* const> recs) {
  double n = 0, sc = 0, sg = 0;
  int64_t cmin = std::numeric_limits<int64_t>::max(), cmax = std::numeric_limits<int64_t>::min();
  int64_t g0 = recs.empty() ? 0 : recs.front()->g_begin;
  for (const TraceRecord* r : recs)
    for (auto [c, g] : {std::pair{r->c_begin, r->g_begin}, std::pair{r->c_end, r->g_end}}) {
      n += 1;
      sc += static_cast<double>(c);
      sg += static_cast<double>(g - g0);
      cmin = std::min(cmin, c);
      cmax = std::max(cmax, c);
    }
  ClockMap m;
  if (n < 4 || cmax - cmin < 1000) return m;  // too little to fit: globaltimer as is
  const double mc = sc / n, mg = sg / n;
  double cov = 0, var = 0;
  for (const TraceRecord* r : recs)
    for (auto [c, g] : {std::pair{r->c_begin, r->g_begin}, std::pair{r->c_end, r->g_end}}) {
      const double dc = static_cast<double>(c) - mc;
      cov += dc * (static_cast<double>(g - g0) - mg);
      var += dc * dc;
    }
  if (var <= 0 || cov <= 0) return m;
  m.b = cov / var;  // ns per cycle
  m.a = static_cast<double>(g0) + mg - m.b * mc;
  m.use_clock = true;
  return m;
}

std::string op_label(int32_t op) {
  if (op >= 0 && op < kNumOps) return op_name(static_cast<Op>(op));
  return "op" + std::to_string(op);
}

struct Slice {
  double t0, t1;  // ns, absolute (mapped)
  const TraceRecord* r;
};

std::string work_name(const TraceRecord& r) {
  std::string n = op_label(r.op);
  if (r.layer >= 0) n += " L" + std::to_string(r.layer);
  return n;
}

// Kept small: a step at batch 64 has ~10^5 slices and the file must stay well under 16 MiB.
nlohmann::json work_args(const TraceRecord& r, const Plan& plan) {
  nlohmann::json a = {{"task", r.task}};
  if (r.op == static_cast<int32_t>(Op::kAttn)) {
    a["item"] = r.arg0;
    if (r.arg0 >= 0 && r.arg0 < static_cast<int32_t>(plan.attn_items.size())) {
      const AttnItem& it = plan.attn_items[r.arg0];
      a["seq"] = it.seq;
      a["group"] = it.group;
      a["split"] = it.split;
      a["keys"] = {it.pos_begin, it.pos_end};
    }
  } else if (r.op == static_cast<int32_t>(Op::kExpertUp) || r.op == static_cast<int32_t>(Op::kExpertDown)) {
    a["expert"] = r.arg0;
    a["block"] = r.arg1;
  } else {
    a["arg"] = {r.arg0, r.arg1, r.arg2};  // the task's args (task.h): group / rows / tokens
  }
  return a;
}

}  // namespace

const char* trace_phase_name(int32_t phase) {
  switch (phase) {
    case kPhasePage: return "pages";
    case kPhaseFill: return "fill";
    case kPhaseRouting: return "routing";
    case kPhaseAttnPrologue: return "attn prologue";
    case kPhaseAttnMerge: return "attn merge";
    case kPhaseCombine: return "combine";
    default: return "phase?";
  }
}

const char* loader_phase_name(int32_t phase) {
  switch (phase) {
    case kLoaderRouterWait: return "loader: router wait";
    case kLoaderRouting: return "loader: routing";
    case kLoaderSlotWait: return "loader: ring wait";
    default: return "loader?";
  }
}

nlohmann::json trace_to_chrome(std::span<const TraceRecord> records, const Plan& plan, int64_t dropped,
                               const nlohmann::json& meta, TraceSummary* summary) {
  const int n_sms = plan.n_sms();
  std::vector<std::vector<const TraceRecord*>> by_sm(n_sms);
  for (const TraceRecord& r : records) {
    MD_REQUIRE(r.sm >= 0 && r.sm < n_sms, "trace record of SM ", r.sm, " outside the plan's ", n_sms, " SMs");
    MD_REQUIRE(r.kind == kTraceWork || r.kind == kTraceWait || r.kind == kTracePhase || r.kind == kTraceLoader,
               "trace record of unknown kind ", r.kind);
    MD_REQUIRE(r.op >= 0 && r.op < kNumOps, "trace record of unknown op ", r.op);
    MD_REQUIRE(r.kind != kTracePhase || (r.arg0 >= 0 && r.arg0 < kNumTracePhases), "trace record of unknown phase ",
               r.arg0);
    MD_REQUIRE(r.kind != kTraceLoader || (r.arg0 >= 0 && r.arg0 < kNumLoaderPhases),
               "trace record of unknown loader phase ", r.arg0);
    by_sm[r.sm].push_back(&r);
  }
  TraceSummary s;
  s.n_sms = n_sms;
  s.dropped = dropped;
  std::vector<std::vector<Slice>> work(n_sms), parts(n_sms), loader(n_sms);
  double t_min = std::numeric_limits<double>::max(), t_max = std::numeric_limits<double>::lowest();
  int64_t gran = 0;
  std::vector<double> ghz;
  for (int sm = 0; sm < n_sms; ++sm) {
    const ClockMap map = fit_clock(by_sm[sm]);
    if (map.use_clock && map.b > 0) ghz.push_back(1.0 / map.b);
    for (const TraceRecord* r : by_sm[sm]) {
      double t0 = map(r->c_begin, r->g_begin), t1 = map(r->c_end, r->g_end);
      if (t1 < t0) t1 = t0;
      (r->kind == kTraceWork ? work : (r->kind == kTraceLoader ? loader : parts))[sm].push_back({t0, t1, r});
      t_min = std::min(t_min, t0);
      t_max = std::max(t_max, t1);
      const int64_t dg = r->g_end - r->g_begin;
      if (dg > 0 && (gran == 0 || dg < gran)) gran = dg;
    }
    for (auto* v : {&work[sm], &parts[sm], &loader[sm]})
      std::sort(v->begin(), v->end(), [](const Slice& x, const Slice& y) { return x.t0 < y.t0; });
  }
  if (records.empty()) t_min = t_max = 0;
  s.timer_granularity_ns = static_cast<double>(gran);
  if (!ghz.empty()) s.sm_clock_ghz = median(ghz);
  s.step_us = (t_max - t_min) * 1e-3;
  // Microseconds rounded to the nanosecond (short numbers in the JSON).
  auto round_ns = [](double ns) { return std::round(ns) / 1000.0; };
  auto us = [&](double t) { return round_ns(t - t_min); };

  nlohmann::json ev = nlohmann::json::array();
  auto meta_event = [&](int pid, int tid, const char* what, const std::string& name) {
    nlohmann::json e = {{"ph", "M"}, {"pid", pid}, {"name", what}, {"args", {{"name", name}}}};
    if (tid >= 0) e["tid"] = tid;
    ev.push_back(e);
  };
  meta_event(0, -1, "process_name", "SMs: tasks (op Lx)");
  meta_event(1, -1, "process_name", "SMs: counter waits and phases inside the tasks");
  meta_event(2, -1, "process_name", "SMs: the loader warp (router waits, routing, ring waits)");
  double in_tasks = 0, waits = 0, pages = 0;
  for (int sm = 0; sm < n_sms; ++sm) {
    for (int pid = 0; pid < 3; ++pid) {
      meta_event(pid, sm, "thread_name", "SM " + std::to_string(sm));
      ev.push_back({{"ph", "M"}, {"pid", pid}, {"tid", sm}, {"name", "thread_sort_index"}, {"args", {{"sort_index", sm}}}});
    }
    for (const Slice& w : work[sm]) {
      ev.push_back({{"ph", "X"}, {"pid", 0}, {"tid", sm}, {"name", work_name(*w.r)}, {"cat", op_label(w.r->op)},
                    {"ts", us(w.t0)}, {"dur", round_ns(w.t1 - w.t0)}, {"args", work_args(*w.r, plan)}});
      TraceOpTime& o = s.ops[op_label(w.r->op)];
      ++o.n_tasks;
      o.task_us += (w.t1 - w.t0) * 1e-3;
      in_tasks += w.t1 - w.t0;
      ++s.n_work;
    }
    for (const Slice& w : parts[sm]) {
      TraceOpTime& o = s.ops[op_label(w.r->op)];
      const double d = w.t1 - w.t0;
      nlohmann::json args = {{"task", w.r->task}, {"for", work_name(*w.r)}};
      std::string name;
      if (w.r->kind == kTraceWait) {
        ++s.n_wait;
        name = "wait " + counter_name(plan, w.r->arg0);
        args["target"] = w.r->arg1;
        args["first_seen"] = w.r->arg2;
        o.wait_us += d * 1e-3;
        waits += d;
      } else {
        ++s.n_phase;
        name = trace_phase_name(w.r->arg0);
        o.phase_us[w.r->arg0] += d * 1e-3;
        if (w.r->arg0 == kPhasePage) pages += d;
      }
      ev.push_back({{"ph", "X"}, {"pid", 1}, {"tid", sm}, {"name", name},
                    {"cat", w.r->kind == kTraceWait ? "wait" : "phase"}, {"ts", us(w.t0)}, {"dur", round_ns(d)},
                    {"args", args}});
    }
    for (const Slice& w : loader[sm]) {
      ++s.n_loader;
      s.loader_us[w.r->arg0] += (w.t1 - w.t0) * 1e-3;
      ev.push_back({{"ph", "X"}, {"pid", 2}, {"tid", sm}, {"name", loader_phase_name(w.r->arg0)}, {"cat", "loader"},
                    {"ts", us(w.t0)}, {"dur", round_ns(w.t1 - w.t0)},
                    {"args", {{"task", w.r->task}, {"at", work_name(*w.r)}}}});
    }
  }
  // The timeline from the events just written (its waves start after the tasks' counter waits).
  const auto slices = trace_work_slices(ev);
  MD_CHECK(slices.has_value(), "trace: a task of an op the plan does not know");  // (refused above)
  LayerTimeline timeline = layer_timeline(*slices);
  s.layer_us = timeline.layer_us;
  s.layer_timeline = std::move(timeline.waves);
  const double sm_time = static_cast<double>(n_sms) * (t_max - t_min);
  if (sm_time > 0) {
    s.busy_frac = std::max(0.0, in_tasks - waits - pages) / sm_time;
    s.wait_frac = waits / sm_time;
    s.page_frac = pages / sm_time;
    s.idle_frac = std::max(0.0, 1.0 - in_tasks / sm_time);
  }
  nlohmann::json other = meta;
  other["dropped_records"] = dropped;
  other["step_us"] = s.step_us;
  other["busy_frac"] = s.busy_frac;
  other["wait_frac"] = s.wait_frac;
  other["page_frac"] = s.page_frac;
  other["loader_us_per_sm"] = {{"router_wait", s.loader_us[kLoaderRouterWait] / std::max(1, n_sms)},
                               {"routing", s.loader_us[kLoaderRouting] / std::max(1, n_sms)},
                               {"ring_wait", s.loader_us[kLoaderSlotWait] / std::max(1, n_sms)}};
  other["idle_frac"] = s.idle_frac;
  other["globaltimer_granularity_ns"] = s.timer_granularity_ns;
  other["sm_clock_ghz"] = s.sm_clock_ghz;
  other["layer_us"] = s.layer_us;
  other["layer_timeline"] = layer_timeline_json(s);
  other["ops"] = trace_ops_json(s);
  if (summary) *summary = s;
  return {{"traceEvents", std::move(ev)}, {"displayTimeUnit", "ns"}, {"otherData", other}};
}

nlohmann::json trace_ops_json(const TraceSummary& s) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [op, o] : s.ops) {
    nlohmann::json j = {{"tasks", o.n_tasks}, {"task_us", o.task_us}, {"wait_us", o.wait_us}};
    for (int ph = 0; ph < kNumTracePhases; ++ph) j[std::string(trace_phase_name(ph)) + "_us"] = o.phase_us[ph];
    out[op] = j;
  }
  return out;
}

nlohmann::json layer_timeline_json(const TraceSummary& s) { return wave_timings_json(s.layer_timeline); }

std::string format_trace_summary(const TraceSummary& s) {
  char line[320];
  std::string out;
  std::snprintf(line, sizeof line,
                "trace: step %.1f us on %d SMs: working %.1f%%, waiting on counters %.1f%%, waiting for pages %.1f%%, "
                "outside tasks %.1f%% (%lld tasks, %lld waits, %lld phases, %lld dropped, globaltimer step %.0f ns, "
                "SM clock %.2f GHz)\n",
                s.step_us, s.n_sms, 100 * s.busy_frac, 100 * s.wait_frac, 100 * s.page_frac, 100 * s.idle_frac,
                static_cast<long long>(s.n_work), static_cast<long long>(s.n_wait), static_cast<long long>(s.n_phase),
                static_cast<long long>(s.dropped), s.timer_granularity_ns, s.sm_clock_ghz);
  out += line;
  std::snprintf(line, sizeof line, "  %-12s %6s %7s | mean us per task: %7s %7s %7s %7s %7s %7s %7s %7s\n", "op", "tasks",
                "step %", "task", "waits", "pages", "fill", "routing", "prolog", "merge", "combine");
  out += line;
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [op, o] : s.ops) order.push_back({o.task_us, op});
  std::sort(order.rbegin(), order.rend());
  const double sm_us = s.step_us * s.n_sms;
  for (const auto& [t, op] : order) {
    const TraceOpTime& o = s.ops.at(op);
    const double n = o.n_tasks > 0 ? static_cast<double>(o.n_tasks) : 1.0;
    std::snprintf(line, sizeof line,
                  "  %-12s %6lld %6.1f%% |                   %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f\n",
                  op.c_str(), static_cast<long long>(o.n_tasks), sm_us > 0 ? 100 * t / sm_us : 0.0, o.task_us / n,
                  o.wait_us / n, o.phase_us[kPhasePage] / n, o.phase_us[kPhaseFill] / n, o.phase_us[kPhaseRouting] / n,
                  o.phase_us[kPhaseAttnPrologue] / n, o.phase_us[kPhaseAttnMerge] / n, o.phase_us[kPhaseCombine] / n);
    out += line;
  }
  if (s.n_loader > 0) {
    std::snprintf(line, sizeof line,
                  "  loader warps: %lld records; us per SM over the step: router waits %.1f, routing %.1f, ring waits %.1f\n",
                  static_cast<long long>(s.n_loader), s.loader_us[kLoaderRouterWait] / s.n_sms,
                  s.loader_us[kLoaderRouting] / s.n_sms, s.loader_us[kLoaderSlotWait] / s.n_sms);
    out += line;
  }
  if (!s.layer_timeline.empty()) out += format_layer_timeline({s.layer_us, s.layer_timeline});
  return out;
}

}  // namespace megadecode
