// `megadecode bench decode|serve|tokenizer|structured|engine ...`
#include <cstdio>
#include <cstring>

#include "bench/bench.h"
#include "cli/commands.h"
#include "core/check.h"

namespace megadecode {

namespace {
constexpr const char* kUsage =
    "usage: megadecode bench decode|serve|tokenizer|structured|bandwidth|gemm|prefill [FLAGS]   (bench NAME --help: its flags)\n"
    "  decode     decode step time per batch and context (GPU)\n"
    "  prefill    prefill time per prompt length (GPU)\n"
    "  serve      an HTTP load generator for a running server (vLLM's bench serve metrics)\n"
    "  tokenizer  tokenizer and detokenizer throughput\n"
    "  structured structured-output grammar compile and token-mask time\n"
    "  bandwidth  the device's pure-read ceiling (GPU)\n"
    "  gemm       skinny GEMM against cuBLAS (GPU)\n";
}  // namespace

int cmd_bench(int argc, char** argv) {
  MD_REQUIRE(argc >= 1, kUsage);
  if (std::strcmp(argv[0], "--help") == 0 || std::strcmp(argv[0], "-h") == 0) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (std::strcmp(argv[0], "decode") == 0) return bench_decode(argc - 1, argv + 1);
  if (std::strcmp(argv[0], "serve") == 0) return bench_serve(argc - 1, argv + 1);
  if (std::strcmp(argv[0], "tokenizer") == 0) return bench_tokenizer(argc - 1, argv + 1);
  if (std::strcmp(argv[0], "structured") == 0) return bench_structured(argc - 1, argv + 1);
  if (std::strcmp(argv[0], "engine") == 0) return bench_engine(argc - 1, argv + 1);
  if (std::strcmp(argv[0], "prefill") == 0) return bench_prefill(argc - 1, argv + 1);
  if (std::strcmp(argv[0], "bandwidth") == 0 || std::strcmp(argv[0], "gemm") == 0) {
#if defined(MEGADECODE_HAVE_CUDA)
    return argv[0][0] == 'b' ? bench_bandwidth(argc - 1, argv + 1) : bench_gemm(argc - 1, argv + 1);
#else
    throw Error(cat("bench ", argv[0], ": this build has no CUDA support"));
#endif
  }
  throw Error(cat("unknown benchmark \"", argv[0], "\" (known: decode, serve, tokenizer, structured, engine, bandwidth, gemm, prefill)"));
}

}  // namespace megadecode
