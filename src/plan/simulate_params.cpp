// The timing model's defaults for the megakernel on the H200 (where each number comes from) and
// SimParams <-> JSON. Sources: "phase" = the median of that phase or task in the v3 trace
// (tests/data/trace-cuda-mk-v3-b1-ctx8192.json.gz, batch 1, 8K; a task's time after its waits,
// regressed on its bytes where its sizes differ); "b8 phase" = the mean per task of a phase in
// the batch-8 trace of the same kernel (trace-cuda-mk-v3-b8-ctx8192.json.gz of the 2026-12-02
// run, otherData.ops), against the batch-1 one; "fit" = fitted to that trace's per-layer
// timeline with the phases held, or to a step time of tests/data/decode-h200.json
// (docs/perf/journal/2026-12.md, "Timing model, v3"); "stream" = bench
// bandwidth's page-stream microbenchmark (bench/results/bandwidth-h200.json); "assumed" = not
// measured.
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "plan/simulate.h"

namespace megadecode {

SimParams v3_h200_params() {
  SimParams p;
  p.hbm_gbps = 3700;         // fit: all SMs streaming their up shares at once after the routing
                             // (stream: 4040 with 64-192 KB in flight per SM)
  p.hbm_latency_us = 0.9;    // stream: one SM, 2 x 16 KB in flight, 35.3 GB/s: 32 KB / 35.3 GB/s
  p.sm_stream_gbps = 72;     // stream: one SM alone, 32 KB copies, 4 or 6 in flight
  p.l2_gbps = 8600;          // stream: all SMs re-reading L2-resident pages
  p.l2_latency_us = 0.45;    // stream: one SM from L2, 32 KB copies at 72.5 GB/s
  p.ring_pages = 4;          // megakernel smem layout at batch <= 8: 4 slots of 32 KB
  p.page_bytes = 32 << 10;   // one bulk copy of 64 fragment tiles
  p.pickup_us = 0.1;         // phase: the next task record is read while the current task runs
  p.consume_gbps = 42.6;     // phase: QKV tiles of 2 and 3 row blocks, 8.70 and 10.24 us: 64 KB
                             // per 1.54 us (at 2, 4, 8 token groups / 2, 4, 8: simulate.h)

  p.hop_us = 0.19;           // fit (DEVICE.md: release add -> acquire poll, 0.42-0.44 us one way)
  p.poll_us = 0.0;           // the waiter spins on ld.acquire
  p.wait_jitter_us = 2.0;    // fit (the trace: work starts scatter over ~3.4 us at every wave;
                             // 2.4 before the attention item got its measured length)

  auto op = [&](Op o) -> double& { return p.op_us[static_cast<int>(o)]; };
  auto pre = [&](Op o) -> double& { return p.pre_wait_us[static_cast<int>(o)]; };
  op(Op::kQkv) = 5.62;       // phase: the x norm fill (3.1 us, two L2 round trips) and the epilogue
  op(Op::kOProj) = 2.22;     // phase: 5.38 us for one 128 KB tile (fill 1.0 us)
  op(Op::kRouter) = 4.56;    // phase: 6.14 us for one 64 KB tile (the h norm fill 2.9 us)
  op(Op::kLmHead) = 3.0;     // assumed: as the QKV fill
  op(Op::kExpertUp) = 0.5;   // assumed: the share's jobs after the routing
  pre(Op::kExpertUp) = 4.61; // phase: the h norm fill (3.2 us) and the setup before the router wait
  op(Op::kExpertDown) = 4.2; // fit with job_us (phase: 14.1 us for 186 KB in 8 jobs at batch 1):
                             // 4.2 + 8 x 0.3, the 6.6 us of batch 1
  op(Op::kSample) = 22.0;    // v1 fit: the sampler is unchanged (one CTA per token)
  // cohere2_moe's dense FFN shares (in the kernel, not measured yet): assumed as the expert shares without routing,
  // the up share's x norm fill (as the QKV tile's) and the down share's fixed cost.
  op(Op::kDenseUp) = 3.1;    // assumed: the x norm fill of a QKV tile
  op(Op::kDenseDown) = 4.2;  // assumed: as the expert down share
  // Attention items: the prologue (q/k norm, RoPE), the K/V loop and the epilogue after the QKV
  // wait; the first K/V loads are issued before it.
  pre(Op::kAttn) = 2.05;     // phase: the item's start to its QKV wait
  op(Op::kAttn) = 10.3;      // phase: the attention task is 15.3 us for 128 KB in both traces
                             // (2.05 before the wait, 10.3 + 2.8 of K/V after it); it was fitted
                             // at 7.3 on the batch-1 waves, where the jitter hid 3 us of it
  p.attention = {46.5, 0.18};  // fit: the K/V loop's rate, the last arriver's merge per split
  p.fill_us = 2.5;           // fit: the batch-32 step time (118.3 ms; -2.0 %); batch 64 then +1.8 %
  p.job_us = 0.3;            // fit: the batch-8 step time (18.08 ms: +1.4 %); the down share's
                             // jobs grow with the active experts (8 at batch 1, ~50 at 8). It was
                             // 0.8 before the row costs below: it carried them
  // Row costs, per row beyond the first up to 8 (b8 phase: the fills 3.3 -> 6.3 us QKV, 1.0 -> 6.2
  // O-proj, 2.9 -> 5.8 router, 3.2 -> 6.2 up, 3.3 -> 6.0 LM head; routing 5.0 -> 11.0).
  p.row_us[static_cast<int>(Op::kQkv)] = 0.43;
  p.row_us[static_cast<int>(Op::kOProj)] = 0.74;
  p.row_us[static_cast<int>(Op::kRouter)] = 0.42;
  p.row_us[static_cast<int>(Op::kExpertUp)] = 0.43;
  p.row_us[static_cast<int>(Op::kLmHead)] = 0.39;
  p.row_us[static_cast<int>(Op::kDenseUp)] = 0.43;  // assumed: as the expert up share's fill
  p.routing_token_us = 0.86;
  p.routing_us = 5.0;        // phase: top-k by one warp per token, the share map (per 8 tokens)
  p.l2_ahead_bytes = 192 << 10;  // loader: the next layer's weights during the routing gap
  return p;
}

SimParams v3_h100_params() {
  // The same kernel on the H100 (80 GB HBM3, 132 SMs, the same SM clock): the memory system
  // scaled by the measured read ceilings (bench decode: 3130 GB/s against 4550 on the H200), the
  // consumer and synchronisation costs as on the H200. Checked against the H100 traces of both
  // models at batch 1, 8K (the v3 kernel's traces of 2026-12-06, device call 1, since replaced in
  // bench/results by newer ones: bench/results/index.json; docs/perf/journal/2026-12.md,
  // "Megakernel v4: the H100 first").
  SimParams p = v3_h200_params();
  const double ratio = 3130.0 / 4550.0;
  p.hbm_gbps *= ratio;
  return p;
}

SimParams sim_params_for_gpu(const std::string& gpu) {
  if (gpu == "h200") return v3_h200_params();
  if (gpu == "h100") return v3_h100_params();
  throw Error(cat("timing model: unknown GPU \"", gpu, "\" (known: h100, h200)"));
}

nlohmann::json sim_params_json(const SimParams& p) {
  nlohmann::json ops = nlohmann::json::object(), pre = nlohmann::json::object(), row = nlohmann::json::object();
  for (int i = 0; i < kNumOps; ++i) {
    ops[op_name(static_cast<Op>(i))] = p.op_us[i];
    pre[op_name(static_cast<Op>(i))] = p.pre_wait_us[i];
    row[op_name(static_cast<Op>(i))] = p.row_us[i];
  }
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
          {"wait_jitter_us", p.wait_jitter_us},
          {"op_us", ops},
          {"pre_wait_us", pre},
          {"row_us", row},
          {"attention",
           {{"kv_gbps", p.attention.kv_gbps},
            {"merge_us_per_split", p.attention.merge_us_per_split}}},
          {"fill_us", p.fill_us},
          {"job_us", p.job_us},
          {"routing_us", p.routing_us},
          {"routing_token_us", p.routing_token_us},
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
    if (key == "op_us" || key == "pre_wait_us" || key == "row_us") {
      MD_REQUIRE(v.is_object(), "sim params: \"", key, "\" must be an object of op name -> us");
      for (const auto& [name, us] : v.items()) {
        const int i = op_index(name);
        MD_REQUIRE(i < kNumOps, "sim params: unknown op \"", name, "\" in \"", key, "\"");
        take(us, name, (key == "op_us" ? p.op_us : key == "pre_wait_us" ? p.pre_wait_us : p.row_us)[i]);
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
    else if (key == "wait_jitter_us") take(v, key, p.wait_jitter_us);
    else if (key == "fill_us") take(v, key, p.fill_us);
    else if (key == "job_us") take(v, key, p.job_us);
    else if (key == "routing_us") take(v, key, p.routing_us);
    else if (key == "routing_token_us") take(v, key, p.routing_token_us);
    else if (key == "l2_ahead_bytes") take(v, key, p.l2_ahead_bytes);
    else if (key == "routing_seed") take(v, key, p.routing_seed);
    else throw Error(cat("sim params: unknown key \"", key, "\""));
  }
  return p;
}

}  // namespace megadecode
