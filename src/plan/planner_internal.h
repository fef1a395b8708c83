// Pieces of the planner shared between its files (not part of the plan/ interface).
#pragma once

#include "plan/planner.h"

namespace megadecode {

void check_plannable(const ModelConfig& c, const BatchState& batch, const Policy& policy, const PlanOptions& opt);
PlanShape plan_shape(const ModelConfig& c, const BatchState& batch, const Policy& p, const PlanOptions& opt);
CounterLayout counter_layout(const PlanShape& s, int n_waves);
BufferLayout buffer_layout(const PlanShape& s);

}  // namespace megadecode
