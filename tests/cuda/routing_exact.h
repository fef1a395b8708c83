// The routing-exact verdict shared by every GPU test that compares a CUDA path with cpu-ref or
// with transformers (model/routing.h explains why): the reference runs with the device's captured
// routing forced on it, so every row must meet the plain tolerance, and every (token, layer) where
// the reference's own choice would have differed must be a near-tie of the reference.
#pragma once

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "model/routing.h"
#include "ref/ref_backend.h"

namespace megadecode::test {

// Expects `audit` (a forced reference run) to have forced exactly `expected_forced` decisions and
// every routing difference to be below `near_tie`; prints the count and the largest gap.
inline void expect_routing_exact(const RoutingAudit& audit, int64_t expected_forced, double near_tie,
                                 const std::string& what) {
  std::printf("%s: %s\n", what.c_str(), audit.summary().c_str());
  EXPECT_EQ(audit.n_forced, expected_forced) << what << ": the reference did not run on the device's routing for "
                                             << "every token and layer";
  const std::vector<RouteDiff> bad = audit.beyond(near_tie);
  for (size_t i = 0; i < bad.size() && i < 10; ++i)
    std::printf("  routing bug? seq %lld pos %d layer %d: the device's experts differ where the reference's tie gap is "
                "%.3g (near-tie bound %.3g)\n",
                static_cast<long long>(bad[i].seq), bad[i].pos, bad[i].layer, bad[i].gap, near_tie);
  EXPECT_TRUE(bad.empty()) << what << ": " << bad.size() << " routing differences beyond a near-tie";
}

}  // namespace megadecode::test
