#include "core/check.h"

#include <cstdio>
#include <cstdlib>

namespace megadecode {

void check_failed(const char* condition, const char* file, int line, const std::string& message) {
  std::fprintf(stderr, "megadecode: internal check failed: %s at %s:%d%s%s\n", condition, file, line,
               message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace megadecode
