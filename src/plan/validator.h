// The plan validator, run on every plan in tests, in debug builds and by the cpu-mk backend.
// It throws megadecode::Error naming the offending task when a plan could hang or compute wrong:
//   1. structure: opcodes, wait/arrive counts, counter indices, list bounds;
//   2. attention items well-formed (each (seq, group) split in order) and each run once per layer;
//      GEMM tiles cover their op's row blocks exactly once (QKV tiles inside one KV group, arriving
//      on its counter); the MoE shares of a layer exist once each;
//      the dynamic arrivals (attention splits and merges) name exactly the tasks that may make them;
//   3. satisfiable waits: 1 <= target <= what the counter's producers can arrive (static arrivals
//      plus the attention items' dynamic maxima) and <= the counter's planned total;
//   4. the dependency graph (task -> producers of every counter it waits on; a dynamic arrival's
//      producers are every task that may make it) is acyclic;
//   5. no self-deadlock: no task waits on arrivals that only tasks later in its own SM's list make;
//   6. with list order added (each task after its predecessor on the same SM) still acyclic;
//   7. lists sorted by wave and every producer waited on is in a strictly earlier wave;
//   8. every layer funnels: the next layer's QKV tiles (or the LM head) after all of layer L, so
//      buffers reused across layers are race-free.
#pragma once

#include "plan/plan.h"

namespace megadecode {

void validate_plan(const Plan& plan);

}  // namespace megadecode
