// `megadecode bench decode|serve|tokenizer|engine ...`
#include <cstring>

#include "bench/bench.h"
#include "cli/commands.h"
#include "core/check.h"

namespace megadecode {

int cmd_bench(int argc, char** argv) {
  MD_REQUIRE(argc >= 1, "usage: megadecode bench decode|serve|tokenizer|engine|bandwidth|gemm|prefill [FLAGS]");
  if (std::strcmp(argv[0], "decode") == 0) return bench_decode(argc - 1, argv + 1);
  if (std::strcmp(argv[0], "serve") == 0) return bench_serve(argc - 1, argv + 1);
  if (std::strcmp(argv[0], "tokenizer") == 0) return bench_tokenizer(argc - 1, argv + 1);
  if (std::strcmp(argv[0], "engine") == 0) return bench_engine(argc - 1, argv + 1);
  if (std::strcmp(argv[0], "prefill") == 0) return bench_prefill(argc - 1, argv + 1);
  if (std::strcmp(argv[0], "bandwidth") == 0 || std::strcmp(argv[0], "gemm") == 0) {
#if defined(MEGADECODE_HAVE_CUDA)
    return argv[0][0] == 'b' ? bench_bandwidth(argc - 1, argv + 1) : bench_gemm(argc - 1, argv + 1);
#else
    throw Error(cat("bench ", argv[0], ": this build has no CUDA support"));
#endif
  }
  throw Error(cat("unknown benchmark \"", argv[0], "\" (known: decode, serve, tokenizer, engine, bandwidth, gemm, prefill)"));
}

}  // namespace megadecode
