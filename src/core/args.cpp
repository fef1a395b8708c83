#include "core/args.h"

#include <charconv>
#include <cstdint>

#include "core/check.h"

namespace megadecode {
namespace {

int64_t parse_int(const std::string& name, const std::string& text) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  MD_REQUIRE(ec == std::errc() && ptr == text.data() + text.size(), "--", name, ": expected an integer, got \"",
             text, "\"");
  return v;
}

}  // namespace

Args::Args(int argc, char** argv, const std::set<std::string>& value_flags, const std::set<std::string>& bool_flags) {
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.size() > 2 && a.rfind("--", 0) == 0) {
      std::string name = a.substr(2);
      std::optional<std::string> value;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      if (bool_flags.count(name) != 0) {
        MD_REQUIRE(!value, "--", name, " takes no value");
        bools_.insert(name);
      } else if (value_flags.count(name) != 0) {
        if (!value) {
          MD_REQUIRE(i + 1 < argc, "--", name, " needs a value");
          value = argv[++i];
        }
        values_[name] = *value;
      } else {
        throw Error(cat("unknown flag --", name));
      }
    } else {
      positional_.push_back(a);
    }
  }
}

bool Args::has(const std::string& name) const { return values_.count(name) != 0 || bools_.count(name) != 0; }

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string Args::require(const std::string& name) const {
  auto it = values_.find(name);
  MD_REQUIRE(it != values_.end(), "missing required flag --", name);
  return it->second;
}

int64_t Args::get_int(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : parse_int(name, it->second);
}

int Args::get_int32(const std::string& name, int fallback) const {
  const int64_t v = get_int(name, fallback);
  MD_REQUIRE(v >= INT32_MIN && v <= INT32_MAX, "--", name, ": ", v, " is out of range");
  return static_cast<int>(v);
}

double Args::get_double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  try {
    size_t used = 0;
    double v = std::stod(it->second, &used);
    MD_REQUIRE(used == it->second.size(), "--", name, ": expected a number, got \"", it->second, "\"");
    return v;
  } catch (const std::logic_error&) {
    throw Error(cat("--", name, ": expected a number, got \"", it->second, "\""));
  }
}

std::vector<std::string> Args::get_list(const std::string& name, const std::vector<std::string>& fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  std::vector<std::string> out;
  std::string item;
  for (size_t i = 0; i <= it->second.size(); ++i) {
    if (i == it->second.size() || it->second[i] == ',') {
      MD_REQUIRE(!item.empty(), "--", name, ": empty item in \"", it->second, "\"");
      out.push_back(item);
      item.clear();
    } else {
      item += it->second[i];
    }
  }
  return out;
}

std::vector<int64_t> Args::get_int_list(const std::string& name, const std::vector<int64_t>& fallback) const {
  if (!has(name)) return fallback;
  std::vector<int64_t> out;
  for (const std::string& item : get_list(name, {})) out.push_back(parse_int(name, item));
  return out;
}

}  // namespace megadecode
