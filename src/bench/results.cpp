#include "bench/results.h"

#include <algorithm>
#include <fstream>

#include "core/check.h"

namespace megadecode {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

void write_json(const std::string& path, const nlohmann::json& j, int indent) {
  std::ofstream out(path);
  MD_REQUIRE(out.good(), "cannot write ", path);
  out << j.dump(indent) << "\n";
  MD_REQUIRE(out.good(), "error writing ", path);
}

}  // namespace megadecode
