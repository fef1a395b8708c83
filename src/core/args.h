// Command-line flags for the subcommands: `--name value`, `--name=value`, boolean `--flag`, and
// positional arguments. Each subcommand declares the flags it accepts; an unknown flag, a missing
// value or a malformed number is an Error with the flag's name.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace megadecode {

class Args {
 public:
  // value_flags take a value; bool_flags do not. Names are given without the leading dashes.
  Args(int argc, char** argv, const std::set<std::string>& value_flags, const std::set<std::string>& bool_flags);

  bool has(const std::string& name) const;
  std::string get(const std::string& name, const std::string& fallback) const;
  std::string require(const std::string& name) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  // get_int for a field of type int: a value outside int's range is an Error naming the flag.
  int get_int32(const std::string& name, int fallback) const;
  double get_double(const std::string& name, double fallback) const;
  bool flag(const std::string& name) const { return bools_.count(name) != 0; }
  const std::vector<std::string>& positional() const { return positional_; }
  // A comma-separated list, e.g. --switches a,b (an empty item is an Error naming the flag).
  std::vector<std::string> get_list(const std::string& name, const std::vector<std::string>& fallback) const;
  // A comma-separated list of integers, e.g. --batch 1,2,4.
  std::vector<int64_t> get_int_list(const std::string& name, const std::vector<int64_t>& fallback) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> bools_;
  std::vector<std::string> positional_;
};

}  // namespace megadecode
