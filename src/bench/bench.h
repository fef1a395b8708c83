// Benchmarks behind `megadecode bench KIND`: each prints a table and writes JSON with --json FILE.
#pragma once

namespace megadecode {

int bench_decode(int argc, char** argv);     // bench_decode.cpp (GPU)
int bench_serve(int argc, char** argv);      // bench_serve.cpp (HTTP load generator)
int bench_tokenizer(int argc, char** argv);  // bench_tokenizer.cpp

}  // namespace megadecode
