// The plan validator, run on every plan in tests, in debug builds and by the cpu-mk backend.
// It throws megadecode::Error naming the offending task (or queue) when a plan could hang or
// overflow on the device:
//   1. structure: opcodes, wait/arrive counts, counter indices, list bounds;
//   2. queues: host-built item lists within capacity and well-formed, device-built capacity >= worst
//      case, every queue has a drain task, buffers sized for the capacities;
//   3. satisfiable waits: 1 <= target <= what the counter's producers can arrive (static arrivals
//      plus declared dynamic maxima) and <= the counter's planned total;
//   4. the dependency graph (task -> producers of every counter it or its items wait on;
//      dynamic producers are all drain tasks of the queue) is acyclic;
//   5. no self-deadlock: no task waits on arrivals that only tasks later in its own SM's list make;
//   6. with list order added (each task after its predecessor on the same SM) still acyclic;
//   7. lists sorted by wave and every producer waited on is in a strictly earlier wave;
//   8. every layer funnels: DISPATCH(L) after all earlier tasks of layer L, the next ATTN_NORM (or
//      FINAL_NORM) after all of layer L, so buffers reused across layers are race-free.
#pragma once

#include "plan/plan.h"

namespace megadecode {

void validate_plan(const Plan& plan);

}  // namespace megadecode
