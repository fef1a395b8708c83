// The flags every command that builds a backend takes (generate, serve), read into the one
// BackendOptions: --backend, --block-size, --threads, --gpu-memory-utilization, --prefill-chunk.
// A flag that is not given keeps the BackendOptions default; n_kv_blocks is the command's to set
// (it depends on what the command runs).
#pragma once

#include <string>

#include "core/args.h"
#include "engine/backend.h"

namespace megadecode {

// Error naming the flag for a value out of range (check_backend_options, here so that a typo is
// the first error, not a missing GPU).
BackendOptions backend_options_from(const Args& args, const std::string& default_backend);

}  // namespace megadecode
