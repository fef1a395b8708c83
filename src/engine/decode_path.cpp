#include "engine/decode_path.h"

#include "core/check.h"

namespace megadecode {

int DecodePathPolicy::crossover_from(std::span<const double> megakernel_ms, std::span<const double> batched_ms) {
  MD_REQUIRE(!megakernel_ms.empty() && megakernel_ms.size() == batched_ms.size(), "decode path: step times of ",
             megakernel_ms.size(), " megakernel and ", batched_ms.size(), " batched batches");
  const int n = static_cast<int>(megakernel_ms.size());
  for (int i = 0; i < n; ++i)
    MD_REQUIRE(megakernel_ms[i] > 0 && batched_ms[i] > 0, "decode path: batch ", i + 1, " step times ",
               megakernel_ms[i], " / ", batched_ms[i], " ms (must be positive)");
  int from = n + 1;
  for (int b = n; b >= 1 && batched_ms[b - 1] < megakernel_ms[b - 1]; --b) from = b;
  return from;
}

}  // namespace megadecode
