#include "core/json_file.h"

#include <fstream>

#include "core/check.h"

namespace megadecode {

void write_json(const std::string& path, const nlohmann::json& j, int indent) {
  std::ofstream out(path);
  MD_REQUIRE(out.good(), "cannot write ", path);
  out << j.dump(indent) << "\n";
  MD_REQUIRE(out.good(), "error writing ", path);
}

}  // namespace megadecode
