// The timing model's defaults for the megakernel on the H200 (where each number comes from) and
// SimParams <-> JSON. Sources: "stream" = bench bandwidth's page-stream microbenchmark
// (bench/results/bandwidth-h200.json, 2026-12-01); DEVICE.md = the shared device notes; "v1 fit" =
// the calibration of the first kernel on its trace (docs/perf/notes.md, "Timing model": its hop,
// attention and sampling costs carry over where the code did); "assumed" = not measured yet.
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "plan/simulate.h"

namespace megadecode {

SimParams v2_h200_params() {
  SimParams p;
  p.hbm_gbps = 4040;         // stream: all 132 SMs, one 32 KB bulk copy per page, 64-192 KB in flight
  p.hbm_latency_us = 0.9;    // stream: one SM, 2 x 16 KB in flight, 35.3 GB/s: 32 KB / 35.3 GB/s
  p.sm_stream_gbps = 72;     // stream: one SM alone, 32 KB copies, 4 or 6 in flight (~one copy per 0.45 us)
  p.l2_gbps = 8600;          // stream: all SMs re-reading L2-resident pages
  p.l2_latency_us = 0.45;    // stream: one SM from L2, 32 KB copies at 72.5 GB/s
  p.ring_pages = 3;          // megakernel smem layout at batch <= 8: 3 slots of 32 KB
  p.page_bytes = 32 << 10;   // one bulk copy of 64 fragment tiles
  p.pickup_us = 0.1;         // assumed: the next task record is read while the current task runs
  p.consume_gbps = 200;      // stream: the MMAs of a 16 KB batch-1 page cost 0.07 us (29.1 vs 33.1 GB/s)

  p.hop_us = 0.45;           // DEVICE.md: release add -> acquire poll, 0.42-0.44 us one way
  p.poll_us = 0.0;           // the waiter spins on ld.acquire

  auto op = [&](Op o) -> double& { return p.op_us[static_cast<int>(o)]; };
  op(Op::kQkv) = 1.0;        // assumed: the RMSNorm prologue, one L2 round trip + a CTA reduction
  op(Op::kOProj) = 0.8;      // assumed: the attention output's rows into shared memory
  op(Op::kRouter) = 1.0;     // as QKV
  op(Op::kLmHead) = 1.0;     // as QKV
  op(Op::kExpertUp) = 0.5;   // assumed: the share's jobs after the routing (the h norm ran during the router)
  op(Op::kExpertDown) = 1.0; // assumed: the activation rows of every active expert, then the combine
  op(Op::kSample) = 22.0;    // v1 fit: the sampler is unchanged (one CTA per token)
  // Attention items: prologue/epilogue + the K/V loop after the QKV wait (the item is the v1 tc2
  // item; its first chunk streams before the wait), and the last arriver's merge, now parallel.
  op(Op::kAttn) = 4.0;       // assumed
  p.attention = {20.0, 0.05};  // assumed: 128 KB in ~6 us after the wait; the merge ~1.6 us for 32 splits
  p.routing_us = 1.5;        // assumed: the router logits (an L2 round trip), top-k, the share map
  p.l2_ahead_bytes = 192 << 10;  // loader: the next layer's weights during the routing gap
  return p;
}

nlohmann::json sim_params_json(const SimParams& p) {
  nlohmann::json ops = nlohmann::json::object();
  for (int i = 0; i < kNumOps; ++i) ops[op_name(static_cast<Op>(i))] = p.op_us[i];
  return {{"hbm_gbps", p.hbm_gbps},
          {"hbm_latency_us", p.hbm_latency_us},
          {"sm_stream_gbps", p.sm_stream_gbps},
          {"l2_gbps", p.l2_gbps},
          {"l2_latency_us", p.l2_latency_us},
          {"ring_pages", p.ring_pages},
          {"page_bytes", p.page_bytes},
          {"pickup_us", p.pickup_us},
          {"consume_gbps", p.consume_gbps},
          {"hop_us", p.hop_us},
          {"poll_us", p.poll_us},
          {"op_us", ops},
          {"attention",
           {{"kv_gbps", p.attention.kv_gbps},
            {"merge_us_per_split", p.attention.merge_us_per_split}}},
          {"routing_us", p.routing_us},
          {"l2_ahead_bytes", p.l2_ahead_bytes},
          {"routing_seed", p.routing_seed}};
}

namespace {

template <class T>
void take(const nlohmann::json& j, const std::string& key, T& out) {
  try {
    out = j.get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(cat("sim params: \"", key, "\" has the wrong type: ", j.dump()));
  }
}

}  // namespace

SimParams sim_params_from_json(const nlohmann::json& j, SimParams p) {
  MD_REQUIRE(j.is_object(), "sim params: expected a JSON object");
  for (const auto& [key, v] : j.items()) {
    if (key == "op_us") {
      MD_REQUIRE(v.is_object(), "sim params: \"op_us\" must be an object of op name -> us");
      for (const auto& [name, us] : v.items()) {
        int i = 0;
        while (i < kNumOps && name != op_name(static_cast<Op>(i))) ++i;
        MD_REQUIRE(i < kNumOps, "sim params: unknown op \"", name, "\" in \"op_us\"");
        take(us, name, p.op_us[i]);
      }
    } else if (key == "attention") {
      MD_REQUIRE(v.is_object(), "sim params: \"attention\" must be an object");
      for (const auto& [k, a] : v.items()) {
        if (k == "kv_gbps") take(a, k, p.attention.kv_gbps);
        else if (k == "merge_us_per_split") take(a, k, p.attention.merge_us_per_split);
        else throw Error(cat("sim params: unknown key \"attention.", k, "\""));
      }
    } else if (key == "hbm_gbps") take(v, key, p.hbm_gbps);
    else if (key == "hbm_latency_us") take(v, key, p.hbm_latency_us);
    else if (key == "sm_stream_gbps") take(v, key, p.sm_stream_gbps);
    else if (key == "l2_gbps") take(v, key, p.l2_gbps);
    else if (key == "l2_latency_us") take(v, key, p.l2_latency_us);
    else if (key == "ring_pages") take(v, key, p.ring_pages);
    else if (key == "page_bytes") take(v, key, p.page_bytes);
    else if (key == "consume_gbps") take(v, key, p.consume_gbps);
    else if (key == "pickup_us") take(v, key, p.pickup_us);
    else if (key == "hop_us") take(v, key, p.hop_us);
    else if (key == "poll_us") take(v, key, p.poll_us);
    else if (key == "routing_us") take(v, key, p.routing_us);
    else if (key == "l2_ahead_bytes") take(v, key, p.l2_ahead_bytes);
    else if (key == "routing_seed") take(v, key, p.routing_seed);
    else throw Error(cat("sim params: unknown key \"", key, "\""));
  }
  return p;
}

}  // namespace megadecode
