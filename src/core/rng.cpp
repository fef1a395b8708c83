#include "core/rng.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

namespace megadecode {

float SplitMix64::normal() {
  float u1 = (static_cast<float>(next() >> 40) + 1.0f) * (1.0f / 16777216.0f);
  float u2 = unit();
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
}

uint64_t test_seed() {
  if (const char* env = std::getenv("MEGADECODE_SEED"); env != nullptr && *env != '\0') {
    return std::stoull(env, nullptr, 0);
  }
  return mix64(static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count()));
}

}  // namespace megadecode
