// Decode benchmark records and tables (decode_report.h).
#include "bench/decode_report.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "core/check.h"
#include "core/stats.h"

namespace megadecode {
namespace {

double quantile(std::vector<float> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

}  // namespace

nlohmann::json decode_record(const DecodePoint& p) {
  MD_REQUIRE(!p.step_ms.empty(), "decode_record: no timed steps for ", p.options.backend, " batch ", p.batch);
  MD_REQUIRE(p.ceiling_gbps > 0, "decode_record: ceiling of ", p.ceiling_gbps, " GB/s");
  std::vector<float> sorted = p.step_ms;
  std::sort(sorted.begin(), sorted.end());
  const double med = median(std::vector<double>(sorted.begin(), sorted.end()));
  MD_REQUIRE(med > 0, "decode_record: median step of ", med, " ms");
  const int64_t bytes = p.bytes.total();
  const double gbps = static_cast<double>(bytes) / (med * 1e-3) / 1e9;
  const double floor_ms = static_cast<double>(bytes) / (p.ceiling_gbps * 1e9) * 1e3;
  const double distinct_total = std::accumulate(p.distinct_experts.begin(), p.distinct_experts.end(), 0.0);
  nlohmann::json kernels = nlohmann::json::object();
  for (const auto& [name, ms] : p.kernel_ms) kernels[name] = ms;
  return {{"backend", p.options.backend},
          {"kernel_ms", kernels},
          {"path", p.path},
          {"policy", p.options.policy},
          {"ablation", p.ablation},
          {"kernel_flags", p.options.kernel_flags},
          {"batch", p.batch},
          {"context", p.context},
          {"n_sms", p.n_sms},
          {"steps", p.step_ms.size()},
          {"step_ms", med},
          {"step_ms_p10", quantile(p.step_ms, 0.1)},
          {"step_ms_p90", quantile(p.step_ms, 0.9)},
          {"step_ms_min", sorted.front()},
          {"tok_s", p.batch / (med * 1e-3)},
          {"bytes_per_step", bytes},
          {"bytes", {{"attention", p.bytes.attention}, {"router", p.bytes.router}, {"experts", p.bytes.experts},
                     {"lm_head", p.bytes.lm_head}, {"embed", p.bytes.embed}, {"kv", p.bytes.kv}}},
          {"achieved_gbps", gbps},
          {"ceiling_gbps", p.ceiling_gbps},
          {"floor_ms", floor_ms},
          {"pct_of_floor", 100.0 * gbps / p.ceiling_gbps},
          {"distinct_experts", p.distinct_experts.empty() ? 0.0 : distinct_total / p.distinct_experts.size()},
          {"distinct_experts_per_layer", p.distinct_experts},
          {"chained_ms", p.chained_ms}};
}

std::string format_decode_table(const std::string& title, std::span<const nlohmann::json> records) {
  std::string out = title + "\n";
  char line[320];
  std::snprintf(line, sizeof line, "%-14s %-12s %-10s %5s %7s %9s %9s %9s %9s %8s %7s %8s %7s\n", "variant", "backend",
                "path", "batch",
                "context", "step ms", "p10..p90", "tok/s", "MB/step", "GB/s", "%floor", "floor ms", "experts");
  out += line;
  for (const nlohmann::json& r : records) {
    // (the main sweep under --switches: its policy marked with a '+')
    const std::string main = r.value("policy", std::string("default")) + (r.value("kernel_flags", 0u) != 0 ? "+" : "");
    const std::string variant =
        r.value("ablation", std::string()).empty() ? main : r.value("ablation", std::string());
    char spread[32];
    std::snprintf(spread, sizeof spread, "%.3f..%.3f", r.value("step_ms_p10", 0.0), r.value("step_ms_p90", 0.0));
    std::snprintf(line, sizeof line, "%-14s %-12s %-10s %5d %7d %9.3f %9s %9.1f %9.1f %8.1f %6.1f%% %8.3f %7.1f\n",
                  variant.c_str(), r.value("backend", std::string()).c_str(), r.value("path", std::string()).c_str(),
                  r.value("batch", 0),
                  r.value("context", 0), r.value("step_ms", 0.0), spread, r.value("tok_s", 0.0),
                  static_cast<double>(r.value("bytes_per_step", int64_t{0})) / 1e6, r.value("achieved_gbps", 0.0),
                  r.value("pct_of_floor", 0.0), r.value("floor_ms", 0.0), r.value("distinct_experts", 0.0));
    out += line;
  }
  return out;
}

std::vector<std::pair<int, int>> parse_points(const std::string& text) {
  std::vector<std::pair<int, int>> out;
  MD_REQUIRE(text.empty() || text.back() != ',', "--points \"", text, "\" ends with an empty entry");
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    const size_t colon = item.find(':');
    MD_REQUIRE(colon != std::string::npos && colon > 0 && colon + 1 < item.size(), "--points entry \"", item,
               "\" is not CONTEXT:BATCH");
    auto number = [&](const std::string& s) {
      MD_REQUIRE(!s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos,
                 "--points entry \"", item, "\": \"", s, "\" is not a positive integer");
      return std::stoi(s);
    };
    out.push_back({number(item.substr(0, colon)), number(item.substr(colon + 1))});
    pos = end + 1;
  }
  return out;
}

}  // namespace megadecode
