// The `--attention` choice of the CUDA backends, plain C++ so the CLI checks it without CUDA:
// "scalar" (the megakernel's scalar item), "tc" (tensor cores, q and P as 3 bf16 terms:
// fp32-faithful) and "tc2" (tensor cores, 2 terms: ~16 mantissa bits, the first version). The
// default is BackendOptions::attention (engine/backend.h).
#pragma once

#include <cstdint>
#include <string>

#include "core/check.h"
#include "cuda/megakernel/types.h"

namespace megadecode::cuda {

struct AttentionChoice {
  int32_t impl = kMkAttnScalar;  // MkAttnImpl
  int32_t terms = 3;             // bf16 terms of q and P (tensor-core item only)
};

inline const char* const kAttentionNames = "scalar, tc, tc2";

// Error naming the known choices for anything else.
inline AttentionChoice parse_attention(const std::string& name) {
  if (name == "scalar") return {kMkAttnScalar, 3};
  if (name == "tc") return {kMkAttnTc, 3};
  if (name == "tc2") return {kMkAttnTc, 2};
  throw Error(cat("--attention: unknown attention \"", name, "\" (known: ", kAttentionNames, ")"));
}

}  // namespace megadecode::cuda
