#include "bench/bench.h"
#include "core/check.h"

namespace megadecode {

int bench_tokenizer(int /*argc*/, char** /*argv*/) { throw Error("bench tokenizer: not implemented yet"); }

}  // namespace megadecode
