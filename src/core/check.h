// Errors and checks used everywhere.
//   megadecode::Error   - bad input (files, requests, flags): caught and reported, never a crash.
//   MD_REQUIRE(c, msg)  - validates input; throws Error(msg) when c is false.
//   MD_CHECK(c)         - an internal invariant; prints the condition and file:line, then aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace megadecode {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] void check_failed(const char* condition, const char* file, int line, const std::string& message);

// Concatenates any streamable values into one string: cat("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace megadecode

#define MD_REQUIRE(cond, ...)                                     \
  do {                                                            \
    if (!(cond)) throw ::megadecode::Error(::megadecode::cat(__VA_ARGS__)); \
  } while (0)

#define MD_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond)) ::megadecode::check_failed(#cond, __FILE__, __LINE__, ::megadecode::cat("" __VA_OPT__(,) __VA_ARGS__)); \
  } while (0)
