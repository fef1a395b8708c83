// Wall-clock time on the steady clock, the one timer of every host-side measurement (benchmarks,
// load and generation times): elapsed time since construction or the last restart().
#pragma once

#include <chrono>

namespace megadecode {

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  void restart() { start_ = std::chrono::steady_clock::now(); }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  double ms() const { return seconds() * 1e3; }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace megadecode
