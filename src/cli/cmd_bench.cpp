#include "cli/commands.h"
#include "core/check.h"

namespace megadecode {

int cmd_bench(int /*argc*/, char** /*argv*/) { throw Error("not implemented yet"); }

}  // namespace megadecode
