// The plan validator, run on every plan in tests, in debug builds and by the cpu-mk backend.
// It throws megadecode::Error naming the offending task when a plan could hang or compute wrong:
//   1. structure: opcodes, wait/arrive counts, counter indices, list bounds; task flags only on
//      ATTN tasks of parallel plans (kAttnSliding needs a window); dense shares only in parallel plans;
//   2. attention items well-formed (each (seq, group) split in order; two sets in parallel plans:
//      the full layers' from position 0, the sliding layers' over the last W positions of the same
//      context) and each run once per layer of its set, by tasks whose flags agree;
//      GEMM tiles cover their op's row blocks exactly once (QKV tiles inside one KV group, arriving
//      on its counter); the MoE and dense FFN shares of a layer exist once each;
//      the dynamic arrivals (attention splits and merges) name exactly the tasks that may make them;
//   3. satisfiable waits: 1 <= target <= what the counter's producers can arrive (static arrivals
//      plus the attention items' dynamic maxima) and <= the counter's planned total;
//   4. the dependency graph (task -> producers of every counter it waits on; a dynamic arrival's
//      producers are every task that may make it) is acyclic;
//   5. no self-deadlock: no task waits on arrivals that only tasks later in its own SM's list make;
//   6. with list order added (each task after its predecessor on the same SM) still acyclic;
//   7. lists sorted by wave and every producer waited on is in a strictly earlier wave;
//   8. every layer funnels: the next layer's QKV tiles (or the LM head; parallel blocks: also its
//      router tiles and dense up shares, which read the layer input) after all of layer L, so
//      buffers reused across layers are race-free;
//   9. parallel blocks: every O-proj tile (which writes x = (x + o) + F) comes after every other
//      task of its layer; no router, expert or dense share waits, even through other tasks, on its
//      layer's O-proj, nor on its attention (except under router-after-attn and grid-sync); a
//      layer has routed or dense FFN tasks, not both;
//  10. every down share waits, directly or through other tasks, on every up share of its layer (it
//      reads activation rows any of them wrote); shared experts only in parallel plans, whole
//      units, their activations' buffer large enough;
//  11. the routing order of the megakernel's loader (it routes a layer at its SM's first routed task
//      of the layer, into one set of tables): on each list the routed tasks come layer by layer, the
//      first of a layer is an expert-up share whose last wait implies every router tile of the
//      layer, and every router tile of a routed layer waits, even through other tasks, on every
//      down share of the previous routed layer.
#pragma once

#include "plan/plan.h"

namespace megadecode {

void validate_plan(const Plan& plan);

}  // namespace megadecode
