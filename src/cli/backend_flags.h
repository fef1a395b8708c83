// Flags shared by the commands that build a backend (generate, serve).
#pragma once

#include <cstdint>

#include <string>

#include "core/args.h"
#include "core/check.h"
#include "cuda/backend/attention_choice.h"

namespace megadecode {

// --prefill-chunk N: tokens per prefill kernel pass on the GPU backends (0: the decode step one
// token at a time); absent: the backend's default (-1).
inline int prefill_chunk_flag(const Args& args) {
  if (!args.has("prefill-chunk")) return -1;
  const int64_t n = args.get_int("prefill-chunk", 0);
  MD_REQUIRE(n >= 0 && n <= 65536, "--prefill-chunk must be in [0, 65536], got ", n);
  return static_cast<int>(n);
}

// --attention NAME: the CUDA backends' attention item, checked here so a typo is the first error
// (not a missing GPU); absent: "" (the backend's default).
inline std::string attention_flag(const Args& args) {
  const std::string name = args.get("attention", "");
  if (!name.empty()) cuda::parse_attention(name);
  return name;
}

}  // namespace megadecode
