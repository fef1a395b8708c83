// step_line (see step_times.h).
#include "engine/step_times.h"

#include <cstdio>

namespace megadecode {

std::string step_line(const StepTimes& t) {
  char mixed[32] = "";
  if (t.mixed_tokens > 0) std::snprintf(mixed, sizeof mixed, " + %d prompt", t.mixed_tokens);
  char buf[352];
  std::snprintf(buf, sizeof buf,
                "step %llu batch %d%s%s | host %.1f us = schedule %.1f plan %.1f stage %.1f launch %.1f output %.1f"
                " | wait %.1f us compute %.1f us prefill %.1f us",
                static_cast<unsigned long long>(t.step), t.batch, t.chained ? " chained" : "", mixed, t.host_s() * 1e6,
                t.schedule_s * 1e6, t.plan_s * 1e6, t.stage_s * 1e6, t.launch_s * 1e6, t.output_s * 1e6,
                t.wait_s * 1e6, t.compute_s * 1e6, t.prefill_s * 1e6);
  return buf;
}

}  // namespace megadecode
