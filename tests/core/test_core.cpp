// Tests for src/core: bf16/fp16 rounding, counter-based random numbers, flag parsing.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "core/args.h"
#include "core/bf16.h"
#include "core/check.h"
#include "core/rng.h"

namespace megadecode {
namespace {

// Reference bf16 rounding done in double: the nearest representable value, ties to even.
float bf16_round_reference(float f) {
  if (std::isnan(f) || std::isinf(f)) return f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  // Past the largest finite bf16, "hi" is infinity, which rounding treats as 2^128.
  double hi_value = std::isinf(fhi) ? std::copysign(std::ldexp(1.0, 128), f) : static_cast<double>(fhi);
  double dlo = std::fabs(static_cast<double>(f) - flo), dhi = std::fabs(hi_value - f);
  if (dlo < dhi) return flo;
  if (dhi < dlo) return fhi;
  return ((lo >> 16) & 1u) ? fhi : flo;
}

TEST(Bf16, RoundsToNearestEven) {
  uint64_t seed = test_seed();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng.next());
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(round_bf16(f)));
      continue;
    }
    ASSERT_EQ(round_bf16(f), bf16_round_reference(f)) << "bits=" << bits;
  }
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(bf16_bits_to_float(0xc000), -2.0f);
}

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = fp16_bits_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_fp16_bits(f), h) << "h=" << h;
  }
  EXPECT_EQ(fp16_bits_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(float_to_fp16_bits(65520.0f), 0x7c00);  // rounds to inf
}

TEST(Rng, UniformAtIsDeterministicAndInRange) {
  double sum = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    float u = uniform_at(7, 3, i);
    ASSERT_GE(u, -1.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_EQ(u, uniform_at(7, 3, i));
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.0, 0.01);
  EXPECT_NE(uniform_at(7, 3, 0), uniform_at(7, 4, 0));
}

TEST(Rng, PhiloxKnownAnswer) {
  // Random123 known-answer vector for philox4x32-10 with all-ones counter and key.
  Philox4 r = philox4x32(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
}

TEST(Args, ParsesFlagsAndRejectsUnknown) {
  const char* argv[] = {"pos", "--batch", "1,2,4", "--ctx=97", "--json"};
  Args args(5, const_cast<char**>(argv), {"batch", "ctx"}, {"json"});
  EXPECT_EQ(args.get_int_list("batch", {}), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(args.get_list("batch", {}), (std::vector<std::string>{"1", "2", "4"}));
  EXPECT_EQ(args.get_list("missing", {"x"}), (std::vector<std::string>{"x"}));
  const char* holes[] = {"--names", "a,,b"};
  Args a3(2, const_cast<char**>(holes), {"names"}, {});
  EXPECT_THROW(a3.get_list("names", {}), Error);
  EXPECT_EQ(args.get_int("ctx", 0), 97);
  EXPECT_TRUE(args.flag("json"));
  EXPECT_EQ(args.positional().size(), 1u);
  const char* bad[] = {"--nope"};
  EXPECT_THROW(Args(1, const_cast<char**>(bad), {}, {}), Error);
  const char* bad_int[] = {"--ctx", "12x"};
  Args a2(2, const_cast<char**>(bad_int), {"ctx"}, {});
  EXPECT_THROW(a2.get_int("ctx", 0), Error);
}

}  // namespace
}  // namespace megadecode
