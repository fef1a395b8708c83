#include "bench/bench.h"
#include "core/check.h"

namespace megadecode {

int bench_serve(int /*argc*/, char** /*argv*/) { throw Error("bench serve: not implemented yet"); }

}  // namespace megadecode
