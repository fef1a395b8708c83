#include "bench/bench.h"
#include "core/check.h"

namespace megadecode {

int bench_decode(int /*argc*/, char** /*argv*/) { throw Error("bench decode: not implemented yet"); }

}  // namespace megadecode
