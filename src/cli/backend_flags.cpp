#include "cli/backend_flags.h"

namespace megadecode {

BackendOptions backend_options_from(const Args& args, const std::string& default_backend) {
  BackendOptions o;
  o.backend = args.get("backend", default_backend);
  o.kv_block_size = args.get_int32("block-size", o.kv_block_size);
  o.n_threads = args.get_int32("threads", o.n_threads);
  o.gpu_memory_utilization = args.get_double("gpu-memory-utilization", o.gpu_memory_utilization);
  o.prefill_chunk = args.get_int32("prefill-chunk", o.prefill_chunk);
  check_backend_options(o);
  return o;
}

}  // namespace megadecode
