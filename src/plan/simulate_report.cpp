// Simulation output and the comparison with a measured trace (simulate_report.h).
#include "plan/simulate_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#ifdef MEGADECODE_HAVE_ZLIB
#include <zlib.h>
#endif

#include "core/check.h"

namespace megadecode {
namespace {

// The file's bytes, decompressed when it is gzip (zlib reads plain files through unchanged).
std::string read_maybe_gzip(const std::string& path) {
  std::ifstream probe(path, std::ios::binary);
  MD_REQUIRE(probe, "cannot open trace ", path);
  unsigned char magic[2] = {0, 0};
  probe.read(reinterpret_cast<char*>(magic), 2);
  const bool gz = probe.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  if (!gz) {
    std::ostringstream all;
    probe.seekg(0);
    all << probe.rdbuf();
    return all.str();
  }
#ifdef MEGADECODE_HAVE_ZLIB
  gzFile f = gzopen(path.c_str(), "rb");
  MD_REQUIRE(f, "cannot open trace ", path);
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  int err = 0;
  const char* msg = n < 0 ? gzerror(f, &err) : nullptr;
  gzclose(f);
  MD_REQUIRE(n == 0, "trace ", path, ": gzip error: ", msg ? msg : "?");
  return out;
#else
  throw Error(cat("trace ", path, " is gzip-compressed and this build has no zlib: gunzip it first"));
#endif
}

}  // namespace

MeasuredTimeline read_measured_timeline(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_maybe_gzip(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("trace ", path, " is not JSON: ", e.what()));
  }
  const nlohmann::json& d = j.is_object() && j.contains("otherData") ? j["otherData"] : j;
  MD_REQUIRE(d.is_object() && d.contains("layer_timeline"), "trace ", path,
             " has no per-layer timeline (\"otherData\".\"layer_timeline\", written by bench decode --trace)");
  MeasuredTimeline m;
  m.timeline.waves = wave_timings_from_json(d["layer_timeline"]);
  m.timeline.layer_us = d.value("layer_us", 0.0);
  // A whole trace: the timeline from its events, so a trace written before the waves were cut at
  // the tasks' waits reads the same way as the simulation.
  if (j.contains("traceEvents"))
    if (const auto slices = trace_work_slices(j["traceEvents"])) m.timeline = layer_timeline(*slices);
  m.step_us = d.value("step_us", 0.0);
  for (const char* key : {"backend", "attention", "batch", "context", "device", "policy"})
    if (d.contains(key)) m.meta[key] = d[key];
  return m;
}

SimParams read_sim_params(const std::string& path, const SimParams& base) {
  std::ifstream in(path);
  MD_REQUIRE(in, "cannot open sim params ", path);
  try {
    return sim_params_from_json(nlohmann::json::parse(in), base);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("sim params ", path, " is not JSON: ", e.what()));
  }
}

double error_pct(double predicted, double measured) {
  return 100.0 * (predicted - measured) / std::max(std::abs(measured), 1.0);
}

TimelineComparison compare_timelines(const SimResult& predicted, const MeasuredTimeline& measured) {
  TimelineComparison c;
  const auto& pw = predicted.timeline.waves;
  auto worst = [&](double e) { c.worst_abs_pct = std::max(c.worst_abs_pct, std::abs(e)); };
  for (const WaveTiming& m : measured.timeline.waves) {
    WaveError e;
    e.op = m.op;
    e.start_measured = m.start_us;
    e.end_measured = m.end_us;
    const auto p = std::find_if(pw.begin(), pw.end(), [&](const WaveTiming& w) { return w.op == m.op; });
    if (p == pw.end()) {
      e.missing = true;
      worst(100);
    } else {
      e.start_predicted = p->start_us;
      e.end_predicted = p->end_us;
      e.start_err_pct = error_pct(p->start_us, m.start_us);
      e.end_err_pct = error_pct(p->end_us, m.end_us);
      worst(e.start_err_pct);
      worst(e.end_err_pct);
    }
    c.waves.push_back(e);
  }
  for (const WaveTiming& p : pw) {
    if (std::none_of(c.waves.begin(), c.waves.end(), [&](const WaveError& e) { return e.op == p.op; })) {
      c.waves.push_back({p.op, p.start_us, 0, p.end_us, 0, 0, 0, true});
      worst(100);
    }
  }
  c.layer_err_pct = error_pct(predicted.timeline.layer_us, measured.timeline.layer_us);
  worst(c.layer_err_pct);
  if (measured.step_us > 0) c.step_err_pct = error_pct(predicted.step_us, measured.step_us);
  return c;
}

std::string format_simulation(const SimResult& r, const TimelineComparison* cmp) {
  char line[256];
  std::snprintf(line, sizeof line,
                "simulated step: %.1f us on %zu SMs: busy %.1f%%, waiting on counters %.1f%%, other idle %.1f%%\n"
                "  bytes: %.1f MB from HBM (%.0f GB/s over the step), %.1f MB of ring pages from L2; %lld events\n",
                r.step_us, r.sms.size(), 100 * r.busy_frac, 100 * r.wait_frac, 100 * r.idle_frac, r.hbm_bytes * 1e-6,
                r.step_us > 0 ? static_cast<double>(r.hbm_bytes) / r.step_us * 1e-3 : 0.0, r.l2_bytes * 1e-6,
                static_cast<long long>(r.events));
  std::string out = line;
  out += format_layer_timeline(r.timeline);
  if (!cmp) return out;
  std::snprintf(line, sizeof line, "measured vs simulated (us from the layer start; error in %% of measured)\n  %-12s %17s %8s %17s %8s\n",
                "op", "start meas/sim", "err", "end meas/sim", "err");
  out += line;
  for (const WaveError& e : cmp->waves) {
    if (e.missing) {
      std::snprintf(line, sizeof line, "  %-12s only in one of the two timelines\n", e.op.c_str());
    } else {
      std::snprintf(line, sizeof line, "  %-12s %8.2f/%8.2f %+7.1f%% %8.2f/%8.2f %+7.1f%%\n", e.op.c_str(),
                    e.start_measured, e.start_predicted, e.start_err_pct, e.end_measured, e.end_predicted,
                    e.end_err_pct);
    }
    out += line;
  }
  std::snprintf(line, sizeof line, "  layer %+.1f%%, step %+.1f%%; worst wave error %.1f%%\n", cmp->layer_err_pct,
                cmp->step_err_pct, cmp->worst_abs_pct);
  out += line;
  return out;
}

nlohmann::json simulation_json(const SimResult& r, const SimParams& params, const TimelineComparison* cmp) {
  nlohmann::json busy = nlohmann::json::array(), wait = nlohmann::json::array();
  for (const SimSmTime& s : r.sms) {
    busy.push_back(s.busy_us);
    wait.push_back(s.wait_us);
  }
  nlohmann::json j = {{"step_us", r.step_us},
                      {"busy_frac", r.busy_frac},
                      {"wait_frac", r.wait_frac},
                      {"idle_frac", r.idle_frac},
                      {"hbm_bytes", r.hbm_bytes},
                      {"l2_bytes", r.l2_bytes},
                      {"events", r.events},
                      {"layer_us", r.timeline.layer_us},
                      {"layer_timeline", wave_timings_json(r.timeline.waves)},
                      {"sm_busy_us", busy},
                      {"sm_wait_us", wait},
                      {"params", sim_params_json(params)}};
  if (cmp) {
    nlohmann::json waves = nlohmann::json::array();
    for (const WaveError& e : cmp->waves) {
      nlohmann::json w = {{"op", e.op}, {"missing", e.missing}};
      if (!e.missing)
        w.update({{"start_measured_us", e.start_measured}, {"start_simulated_us", e.start_predicted},
                  {"start_err_pct", e.start_err_pct}, {"end_measured_us", e.end_measured},
                  {"end_simulated_us", e.end_predicted}, {"end_err_pct", e.end_err_pct}});
      waves.push_back(w);
    }
    j["comparison"] = {{"waves", waves},
                       {"layer_err_pct", cmp->layer_err_pct},
                       {"step_err_pct", cmp->step_err_pct},
                       {"worst_abs_pct", cmp->worst_abs_pct}};
  }
  return j;
}

}  // namespace megadecode
