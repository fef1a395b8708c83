// Per-layer timeline of a decode step from work slices (layer_timeline.h).
#include "plan/layer_timeline.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/stats.h"
#include "plan/op_table.h"

namespace megadecode {
namespace {

std::string op_label(int op) { return op >= 0 && op < kNumOps ? op_name(static_cast<Op>(op)) : "op" + std::to_string(op); }

}  // namespace

LayerTimeline layer_timeline(std::span<const WorkSlice> slices) {
  struct Wave {
    double first = std::numeric_limits<double>::max(), last = std::numeric_limits<double>::lowest();
    std::vector<double> dur;
  };
  std::map<int, std::map<int, Wave>> layers;  // layer -> op -> wave
  for (const WorkSlice& w : slices) {
    if (w.op < 0 || w.layer < 0) continue;  // arrivals, and the work after the last layer
    Wave& wv = layers[w.layer][w.op];
    wv.first = std::min(wv.first, w.t0_us);
    wv.last = std::max(wv.last, w.t1_us);
    wv.dur.push_back(w.t1_us - w.t0_us);
  }
  LayerTimeline t;
  if (layers.empty()) return t;
  std::vector<int> ids;
  for (const auto& [l, _] : layers) ids.push_back(l);
  // The middle layers: the first starts cold and the last feeds the LM head.
  const size_t lo = ids.size() >= 3 ? 1 : 0, hi = ids.size() >= 3 ? ids.size() - 1 : ids.size();
  std::map<int, std::vector<double>> start, end, p50, mx, count;
  std::vector<double> layer_len;
  auto layer_start = [&](int layer) {
    double l0 = std::numeric_limits<double>::max();
    for (const auto& [op, wv] : layers[layer]) l0 = std::min(l0, wv.first);
    return l0;
  };
  for (size_t i = lo; i < hi; ++i) {
    const double l0 = layer_start(ids[i]);
    if (i + 1 < ids.size() && ids[i + 1] == ids[i] + 1) layer_len.push_back(layer_start(ids[i + 1]) - l0);
    for (const auto& [op, wv] : layers[ids[i]]) {
      start[op].push_back(wv.first - l0);
      end[op].push_back(wv.last - l0);
      p50[op].push_back(median(wv.dur));
      mx[op].push_back(*std::max_element(wv.dur.begin(), wv.dur.end()));
      count[op].push_back(static_cast<double>(wv.dur.size()));
    }
  }
  t.layer_us = median(layer_len);
  for (const auto& [op, v] : start)
    t.waves.push_back({op_label(op), median(v), median(end[op]), 0, median(p50[op]), median(mx[op]),
                       static_cast<int>(median(count[op]))});
  std::sort(t.waves.begin(), t.waves.end(), [](const WaveTiming& a, const WaveTiming& b) { return a.start_us < b.start_us; });
  for (size_t i = 1; i < t.waves.size(); ++i) t.waves[i].gap_us = t.waves[i].start_us - t.waves[i - 1].end_us;
  return t;
}

namespace {

// trace_work_slices without the JSON type errors turned into Errors.
std::optional<std::vector<WorkSlice>> work_slices_of(const nlohmann::json& events) {
  auto is_slice = [](const nlohmann::json& e, int pid) {
    return e.is_object() && e.value("ph", "") == "X" && e.value("pid", -1) == pid && e.contains("tid") &&
           e.contains("ts") && e.contains("dur") && e.contains("args") && e["args"].contains("task");
  };
  auto key = [](const nlohmann::json& e) {
    return std::pair<int64_t, int64_t>(e["tid"].get<int64_t>(), e["args"]["task"].get<int64_t>());
  };
  std::map<std::pair<int64_t, int64_t>, double> wait_end;  // (SM, task) -> end of its last wait
  for (const nlohmann::json& e : events) {
    if (!is_slice(e, 1) || e.value("cat", "") != "wait") continue;
    double& end = wait_end.try_emplace(key(e), 0.0).first->second;
    end = std::max(end, e["ts"].get<double>() + e["dur"].get<double>());
  }
  std::vector<WorkSlice> slices;
  for (const nlohmann::json& e : events) {
    if (!is_slice(e, 0) || !e.contains("name") || !e["name"].is_string()) continue;
    const std::string name = e["name"].get<std::string>();
    const size_t at = name.find(" L");
    const int i = op_index(std::string_view(name).substr(0, at));
    if (i == kNumOps) return std::nullopt;
    int layer = -1;
    if (at != std::string::npos) {
      try {
        layer = std::stoi(name.substr(at + 2));
      } catch (const std::exception&) {
        throw Error(cat("trace: task \"", name, "\" has no layer number after \" L\""));
      }
    }
    const double t0 = e["ts"].get<double>(), t1 = t0 + e["dur"].get<double>();
    const auto w = wait_end.find(key(e));
    slices.push_back({i, layer, std::clamp(w == wait_end.end() ? t0 : w->second, t0, t1), t1});
  }
  return slices;
}

}  // namespace

std::optional<std::vector<WorkSlice>> trace_work_slices(const nlohmann::json& events) {
  MD_REQUIRE(events.is_array(), "trace: \"traceEvents\" must be an array");
  try {
    return work_slices_of(events);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("trace: a malformed event (", e.what(), ")"));
  }
}

nlohmann::json wave_timings_json(const std::vector<WaveTiming>& waves) {
  nlohmann::json j = nlohmann::json::array();
  for (const WaveTiming& w : waves)
    j.push_back({{"op", w.op}, {"start_us", w.start_us}, {"end_us", w.end_us}, {"gap_us", w.gap_us},
                 {"item_p50_us", w.item_p50_us}, {"item_max_us", w.item_max_us}, {"items", w.items}});
  return j;
}

std::vector<WaveTiming> wave_timings_from_json(const nlohmann::json& j) {
  MD_REQUIRE(j.is_array(), "layer timeline: expected an array of waves");
  std::vector<WaveTiming> waves;
  for (const nlohmann::json& w : j) {
    MD_REQUIRE(w.is_object() && w.contains("op") && w["op"].is_string() && w.contains("start_us") &&
                   w["start_us"].is_number() && w.contains("end_us") && w["end_us"].is_number(),
               "layer timeline: a wave needs \"op\", \"start_us\" and \"end_us\": ", w.dump());
    WaveTiming t;
    t.op = w["op"].get<std::string>();
    t.start_us = w["start_us"].get<double>();
    t.end_us = w["end_us"].get<double>();
    t.gap_us = w.value("gap_us", 0.0);
    t.item_p50_us = w.value("item_p50_us", 0.0);
    t.item_max_us = w.value("item_max_us", 0.0);
    t.items = w.value("items", 0);
    waves.push_back(t);
  }
  return waves;
}

std::string format_layer_timeline(const LayerTimeline& t) {
  char line[256];
  std::snprintf(line, sizeof line,
                "  one layer (medians over the middle layers): %.1f us\n"
                "  %-12s %8s %8s %8s %9s %9s %6s\n",
                t.layer_us, "op", "start", "end", "gap", "item p50", "item max", "items");
  std::string out = line;
  for (const WaveTiming& w : t.waves) {
    std::snprintf(line, sizeof line, "  %-12s %8.2f %8.2f %8.2f %9.2f %9.2f %6d\n", w.op.c_str(), w.start_us, w.end_us,
                  w.gap_us, w.item_p50_us, w.item_max_us, w.items);
    out += line;
  }
  return out;
}

}  // namespace megadecode
