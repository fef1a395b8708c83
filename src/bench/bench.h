// Benchmarks behind `megadecode bench KIND`: each prints a table and writes JSON with --json FILE.
#pragma once

namespace megadecode {

int bench_decode(int argc, char** argv);     // bench_decode.cpp (GPU)
int bench_serve(int argc, char** argv);      // bench_serve.cpp (HTTP load generator)
int bench_tokenizer(int argc, char** argv);  // bench_tokenizer.cpp
int bench_structured(int argc, char** argv);  // bench_structured.cpp: structured-output compile and mask time
int bench_engine(int argc, char** argv);     // bench_engine.cpp: the engine loop's host cost (null backend)
int bench_bandwidth(int argc, char** argv);  // src/bench/gpu/gemm.cu (GPU): pure-read ceiling
int bench_gemm(int argc, char** argv);       // src/bench/gpu/gemm.cu (GPU): the GEMM engine vs cuBLAS
int bench_prefill(int argc, char** argv);    // src/bench/gpu/prefill_run.cu (GPU): prefill kernels

}  // namespace megadecode
