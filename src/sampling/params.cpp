#include "sampling/params.h"

#include <cmath>

namespace megadecode::sampling {
namespace {

// Error naming `field` unless lo <= v <= hi (lo excluded when lo_open); NaN is never in range.
void require_in(const char* field, float v, float lo, float hi, bool lo_open, const char* range) {
  const bool ok = std::isfinite(v) && v >= lo && v <= hi && !(lo_open && v == lo);
  if (!ok) throw ParamError(field, cat("sampling: ", field, " must be ", range, ", got ", v));
}

}  // namespace

void validate(const SamplingParams& p) {
  require_in("temperature", p.temperature, 0.0f, 100.0f, false, "in [0, 100]");
  if (p.top_k < -1) throw ParamError("top_k", cat("sampling: top_k must be -1, 0 (off) or positive, got ", p.top_k));
  require_in("top_p", p.top_p, 0.0f, 1.0f, true, "in (0, 1]");
  require_in("min_p", p.min_p, 0.0f, 1.0f, false, "in [0, 1]");
  require_in("presence_penalty", p.presence_penalty, -2.0f, 2.0f, false, "in [-2, 2]");
  require_in("frequency_penalty", p.frequency_penalty, -2.0f, 2.0f, false, "in [-2, 2]");
  require_in("repetition_penalty", p.repetition_penalty, 0.0f, 100.0f, true, "in (0, 100]");
}

}  // namespace megadecode::sampling
