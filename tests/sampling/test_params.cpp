// Tests of the sampling contract (sampling/params.h): validate() accepts each range's edges and
// rejects the values just outside and NaN, naming the field; greedy() is the one greedy rule.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "sampling/params.h"

namespace megadecode::sampling {
namespace {

// The field validate() names for p, or "" when p is valid.
std::string rejected_field(const SamplingParams& p) {
  try {
    validate(p);
  } catch (const ParamError& e) {
    EXPECT_NE(std::string(e.what()).find(e.field()), std::string::npos) << e.what();
    return e.field();
  }
  return "";
}

struct Range {
  const char* field;
  std::function<void(SamplingParams&, float)> set;
  float lo, hi;
  bool lo_open;
};

TEST(SamplingParams, ValidateAcceptsTheEdgesAndRejectsJustOutside) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Range ranges[] = {
      {"temperature", [](SamplingParams& p, float v) { p.temperature = v; }, 0.0f, 100.0f, false},
      {"top_p", [](SamplingParams& p, float v) { p.top_p = v; }, 0.0f, 1.0f, true},
      {"min_p", [](SamplingParams& p, float v) { p.min_p = v; }, 0.0f, 1.0f, false},
      {"presence_penalty", [](SamplingParams& p, float v) { p.presence_penalty = v; }, -2.0f, 2.0f, false},
      {"frequency_penalty", [](SamplingParams& p, float v) { p.frequency_penalty = v; }, -2.0f, 2.0f, false},
      {"repetition_penalty", [](SamplingParams& p, float v) { p.repetition_penalty = v; }, 0.0f, 100.0f, true}};
  EXPECT_EQ(rejected_field(SamplingParams{}), "");
  for (const Range& r : ranges) {
    SCOPED_TRACE(r.field);
    auto with = [&](float v) {
      SamplingParams p;
      r.set(p, v);
      return rejected_field(p);
    };
    EXPECT_EQ(with(r.hi), "");
    EXPECT_EQ(with(std::nextafter(r.hi, INFINITY)), r.field);
    EXPECT_EQ(with(r.lo), r.lo_open ? r.field : "");
    EXPECT_EQ(with(std::nextafter(r.lo, r.lo_open ? INFINITY : -INFINITY)), r.lo_open ? "" : r.field);
    EXPECT_EQ(with(nan), r.field);
    EXPECT_EQ(with(INFINITY), r.field);
  }
  for (int k : {-1, 0, 1, 1 << 30}) EXPECT_EQ(rejected_field(SamplingParams{.top_k = k}), "") << k;
  EXPECT_EQ(rejected_field(SamplingParams{.top_k = -2}), "top_k");
  // The first field out of range is the one named.
  EXPECT_EQ(rejected_field(SamplingParams{.temperature = -1.0f, .top_p = 2.0f}), "temperature");
}

TEST(SamplingParams, GreedyBelowTheOneThreshold) {
  EXPECT_TRUE(SamplingParams{.temperature = 0.0f}.greedy());
  EXPECT_TRUE(SamplingParams{.temperature = std::nextafter(kGreedyTemperature, 0.0f)}.greedy());
  EXPECT_FALSE(SamplingParams{.temperature = kGreedyTemperature}.greedy());
  EXPECT_FALSE(SamplingParams{}.greedy());
}

}  // namespace
}  // namespace megadecode::sampling
