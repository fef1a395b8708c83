#include "cli/backend_flags.h"

#include <cstdint>

#include "core/check.h"

namespace megadecode {

BackendOptions backend_options_from(const Args& args, const std::string& default_backend) {
  BackendOptions o;
  o.backend = args.get("backend", default_backend);
  const int64_t block_size = args.get_int("block-size", o.kv_block_size);
  MD_REQUIRE(block_size >= 1 && block_size <= 4096, "--block-size must be in [1, 4096], got ", block_size);
  o.kv_block_size = static_cast<int>(block_size);
  const int64_t threads = args.get_int("threads", o.n_threads);
  MD_REQUIRE(threads >= 0 && threads <= 4096, "--threads must be in [0, 4096], got ", threads);
  o.n_threads = static_cast<int>(threads);
  o.gpu_memory_utilization = args.get_double("gpu-memory-utilization", o.gpu_memory_utilization);
  MD_REQUIRE(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1,
             "--gpu-memory-utilization must be in (0, 1]");
  const int64_t chunk = args.get_int("prefill-chunk", o.prefill_chunk);
  MD_REQUIRE(chunk >= 0 && chunk <= 65536, "--prefill-chunk must be in [0, 65536], got ", chunk);
  o.prefill_chunk = static_cast<int>(chunk);
  return o;
}

}  // namespace megadecode
