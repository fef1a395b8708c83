// Counter-based random numbers, identical on host and device.
//   mix64/uniform_at: stateless hash of (seed, stream, index); used for synthetic weights so that
//   `make-model` files and weights generated on the GPU (--random-weights) hold the same values.
//   Philox4x32-10: the sampling generator; (seed, position) picks the counter, so the same request
//   seed and position give the same random numbers whatever the batch.
//   SplitMix64: a small sequential generator for tests and host-side shuffles.
#pragma once

#include <cstdint>

#include "core/bf16.h"

namespace megadecode {

MD_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform float in [-1, 1) from (seed, stream, index); 24 random bits, exact in fp32.
MD_HOST_DEVICE inline float uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t h = mix64(mix64(seed ^ mix64(stream)) + index);
  return static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) * (1.0f / static_cast<float>(1 << 23));
}

struct Philox4 {
  uint32_t v[4];
};

MD_HOST_DEVICE inline Philox4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                         uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kW0;
    k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  // Uniform float in [0, 1).
  float unit() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  // Standard normal (Box-Muller).
  float normal();

 private:
  uint64_t state_;
};

// The seed for a randomized test: $MEGADECODE_SEED when set, else fresh from the clock. Tests print it.
uint64_t test_seed();

}  // namespace megadecode
