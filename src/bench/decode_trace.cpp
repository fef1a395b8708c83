// Chrome/Perfetto trace export of one megakernel step (decode_trace.h).
#include "bench/decode_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "bench/results.h"
#include "core/check.h"
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
  return op == -3 ? "arrive" : "op" + std::to_string(op);
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

nlohmann::json trace_to_chrome(std::span<const TraceRecord> records, const Plan& plan, int64_t dropped,
                               const nlohmann::json& meta, TraceSummary* summary) {
  const int n_sms = plan.n_sms();
  std::vector<std::vector<const TraceRecord*>> by_sm(n_sms);
  for (const TraceRecord& r : records) {
    MD_REQUIRE(r.sm >= 0 && r.sm < n_sms, "trace record of SM ", r.sm, " outside the plan's ", n_sms, " SMs");
    MD_REQUIRE(r.kind == kTraceWork || r.kind == kTraceWait, "trace record of unknown kind ", r.kind);
    by_sm[r.sm].push_back(&r);
  }
  TraceSummary s;
  s.n_sms = n_sms;
  s.dropped = dropped;
  std::vector<std::vector<Slice>> work(n_sms), wait(n_sms);
  double t_min = std::numeric_limits<double>::max(), t_max = std::numeric_limits<double>::lowest();
  int64_t gran = 0;
  for (int sm = 0; sm < n_sms; ++sm) {
    const ClockMap map = fit_clock(by_sm[sm]);
    for (const TraceRecord* r : by_sm[sm]) {
      double t0 = map(r->c_begin, r->g_begin), t1 = map(r->c_end, r->g_end);
      if (t1 < t0) t1 = t0;
      (r->kind == kTraceWork ? work : wait)[sm].push_back({t0, t1, r});
      t_min = std::min(t_min, t0);
      t_max = std::max(t_max, t1);
      const int64_t dg = r->g_end - r->g_begin;
      if (dg > 0 && (gran == 0 || dg < gran)) gran = dg;
    }
    for (auto* v : {&work[sm], &wait[sm]})
      std::sort(v->begin(), v->end(), [](const Slice& x, const Slice& y) { return x.t0 < y.t0; });
  }
  if (records.empty()) t_min = t_max = 0;
  s.timer_granularity_ns = static_cast<double>(gran);
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
  meta_event(0, -1, "process_name", "SMs: work (op Lx) and counter waits between work");
  meta_event(1, -1, "process_name", "producer waits (all, including those hidden behind work)");
  double busy = 0, stalled = 0;
  for (int sm = 0; sm < n_sms; ++sm) {
    for (int pid = 0; pid < 2; ++pid) {
      meta_event(pid, sm, "thread_name", "SM " + std::to_string(sm));
      ev.push_back({{"ph", "M"}, {"pid", pid}, {"tid", sm}, {"name", "thread_sort_index"}, {"args", {{"sort_index", sm}}}});
    }
    // Work slices; the gaps between them (and before the first) are where waits can show.
    std::vector<std::pair<double, double>> gaps;
    double prev_end = t_min;
    for (const Slice& w : work[sm]) {
      if (w.r->op == -3) continue;  // a drain task's own arrival: no work of its own
      ev.push_back({{"ph", "X"}, {"pid", 0}, {"tid", sm}, {"name", work_name(*w.r)}, {"cat", op_label(w.r->op)},
                    {"ts", us(w.t0)}, {"dur", round_ns(w.t1 - w.t0)}, {"args", work_args(*w.r, plan)}});
      busy += w.t1 - w.t0;
      s.busy_us[op_label(w.r->op)] += (w.t1 - w.t0) * 1e-3;
      ++s.n_work;
      if (w.t0 > prev_end) gaps.push_back({prev_end, w.t0});
      prev_end = std::max(prev_end, w.t1);
    }
    for (const Slice& w : wait[sm]) {
      ++s.n_wait;
      const std::string counter = counter_name(plan, w.r->arg0);
      const nlohmann::json args = {{"target", w.r->arg1}, {"first_seen", w.r->arg2}, {"task", w.r->task},
                                   {"for", work_name(*w.r)}};
      ev.push_back({{"ph", "X"}, {"pid", 1}, {"tid", sm}, {"name", "wait " + counter}, {"cat", "wait"},
                    {"ts", us(w.t0)}, {"dur", round_ns(w.t1 - w.t0)}, {"args", args}});
      for (const auto& [g0, g1] : gaps) {  // the part of the wait that left the SM idle
        const double a = std::max(g0, w.t0), b = std::min(g1, w.t1);
        if (b <= a) continue;
        ev.push_back({{"ph", "X"}, {"pid", 0}, {"tid", sm}, {"name", "wait " + counter}, {"cat", "wait"},
                      {"ts", us(a)}, {"dur", round_ns(b - a)}, {"args", args}});
        stalled += b - a;
        s.stall_us[op_label(w.r->op)] += (b - a) * 1e-3;
      }
    }
  }
  std::vector<WorkSlice> slices;
  for (const auto& sm : work)
    for (const Slice& w : sm) slices.push_back({w.r->op, w.r->layer, w.t0 * 1e-3, w.t1 * 1e-3});
  LayerTimeline timeline = layer_timeline(slices);
  s.layer_us = timeline.layer_us;
  s.layer_timeline = std::move(timeline.waves);
  const double sm_time = static_cast<double>(n_sms) * (t_max - t_min);
  if (sm_time > 0) {
    s.busy_frac = busy / sm_time;
    s.wait_frac = stalled / sm_time;
    s.idle_frac = std::max(0.0, 1.0 - s.busy_frac - s.wait_frac);
  }
  nlohmann::json other = meta;
  other["dropped_records"] = dropped;
  other["step_us"] = s.step_us;
  other["busy_frac"] = s.busy_frac;
  other["wait_frac"] = s.wait_frac;
  other["idle_frac"] = s.idle_frac;
  other["globaltimer_granularity_ns"] = s.timer_granularity_ns;
  other["layer_us"] = s.layer_us;
  other["layer_timeline"] = layer_timeline_json(s);
  if (summary) *summary = s;
  return {{"traceEvents", std::move(ev)}, {"displayTimeUnit", "ns"}, {"otherData", other}};
}

nlohmann::json layer_timeline_json(const TraceSummary& s) { return wave_timings_json(s.layer_timeline); }

std::string format_trace_summary(const TraceSummary& s) {
  char line[256];
  std::string out;
  std::snprintf(line, sizeof line,
                "trace: step %.1f us on %d SMs: busy %.1f%%, waiting on counters %.1f%%, other idle %.1f%% "
                "(%lld work, %lld waits, %lld dropped, globaltimer step %.0f ns)\n",
                s.step_us, s.n_sms, 100 * s.busy_frac, 100 * s.wait_frac, 100 * s.idle_frac,
                static_cast<long long>(s.n_work), static_cast<long long>(s.n_wait), static_cast<long long>(s.dropped),
                s.timer_granularity_ns);
  out += line;
  std::vector<std::pair<double, std::string>> ops;
  for (const auto& [op, t] : s.busy_us) ops.push_back({t, op});
  std::sort(ops.rbegin(), ops.rend());
  const double sm_us = s.step_us * s.n_sms;
  for (const auto& [t, op] : ops) {
    const auto st = s.stall_us.find(op);
    std::snprintf(line, sizeof line, "  %-12s busy %9.1f SM-us (%5.1f%%)   stalled before it %9.1f SM-us (%5.1f%%)\n",
                  op.c_str(), t, sm_us > 0 ? 100 * t / sm_us : 0.0, st == s.stall_us.end() ? 0.0 : st->second,
                  sm_us > 0 && st != s.stall_us.end() ? 100 * st->second / sm_us : 0.0);
    out += line;
  }
  if (!s.layer_timeline.empty()) out += format_layer_timeline({s.layer_us, s.layer_timeline});
  return out;
}

}  // namespace megadecode
