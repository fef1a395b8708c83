// The timing model's calibrated defaults (where each number comes from) and SimParams <-> JSON.
// Sources: DEVICE.md = the H200 measurements in the shared device notes; "trace" = the v1 tc
// trace bench/results/trace-cuda-mk-tc-b1-ctx8192.json.gz (batch 1, context 8192, full
// qwen3-30b-a3b shape); "fit" = chosen so the simulated per-layer timeline of that trace's plan
// matches the measured one (docs/perf/notes.md, "Timing model"); "assumed" = not measured yet.
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "plan/simulate.h"

namespace megadecode {

SimParams v1_h200_params(bool tc_attention) {
  SimParams p;
  p.loader = SimLoader::kV1;
  p.hbm_gbps = 4540;         // DEVICE.md: pure read ceiling ~4.55 TB/s (bench decode: 4538 GB/s)
  p.hbm_latency_us = 0.65;   // DEVICE.md: 16 KB in flight per SM reads at 73 % of the ceiling,
                             // Little's law: 132 x 16 KB / (0.73 x 4.55 TB/s) = 0.65 us
  p.sm_stream_gbps = 128;    // assumed: one SM's loader alone (v1 never gets near it: its GEMM
                             // consumer is the limit); half of a 128 B/clk fill path at 2 GHz
  p.l2_gbps = 10000;         // assumed (not measured on this machine)
  p.l2_latency_us = 0.45;    // DEVICE.md: cross-SM signal (release add -> acquire poll) 0.43 us
  p.ring_pages = tc_attention ? 5 : 8;  // megakernel.cuh: 24.7 KB pages after the op scratch
                                        // (tc attention scratch ~92 KB leaves 5 slots)
  p.page_bytes = 16 << 10;   // mk_gemm.cuh: the weight part of a page
  p.work_slots = 4;          // mk_producer.cuh kWorkSlots
  p.pickup_us = 0.5;         // trace: back-to-back work slices of one SM are 0.51 us apart (p50)
  p.consume_gbps = 27.2;     // trace: LM-head tiles (512 KiB) take 19.2 us and QKV / router
                             // tiles (128 KiB) 4.86 us, prefetched or not, 4 SMs or 132: a per-SM
                             // consumer limit of 27.2 GB/s with ~0 fixed cost

  p.hop_us = 1.25;           // fit (trace: arrival -> producer's wait end, median 0.8-1.0 us)
  p.poll_us = 0.256;         // mk_sync.cuh: __nanosleep backoff 32 -> 256 ns
  p.claim_rtt_us = 0.4;      // fit (scalar trace: a second attention claim, 2 round trips + post, 1.02 us)
  p.issue_us = 0.3;          // scalar trace: the first claim ends 3.6 us into a QKV tile whose 8 pages
                             // were prefetched: 8 activation copies + 2 round trips (fit kept it)

  auto op = [&](Op o) -> double& { return p.op_us[static_cast<int>(o)]; };
  op(Op::kAttnNorm) = 20.7;  // trace: one CTA per token, median 20.74 us (MoE combine + norm)
  op(Op::kMoeNorm) = 14.0;   // trace: 13.95 us (O-proj reduction + norm)
  op(Op::kDispatch) = 10.7;  // trace: 10.75 us
  op(Op::kFinalNorm) = 15.6; // trace: 15.62 us
  op(Op::kSample) = 22.0;    // trace: 22.02 us
  op(Op::kQkv) = 0.0;        // trace: 4.86 us = 128 KiB / consume_gbps
  op(Op::kRouter) = 0.0;     // trace: 4.86 us
  op(Op::kLmHead) = 0.0;     // trace: 19.2 us = 512 KiB / consume_gbps
  op(Op::kOProj) = 0.55;     // fit (trace: 5.38 us for 128 KiB)
  op(Op::kExpertUp) = 0.6;   // fit (trace item p50 6.40 us)
  op(Op::kExpertDown) = 1.7; // fit (trace item p50 6.14 us for 120 KiB)
  // Attention items: 2 us + KV bytes / kv_gbps. The split between the two is fitted on the step
  // time at context 32768 (run7: 12.88 ms, items of 512 keys); the 8K trace fixes their sum.
  op(Op::kAttn) = 2.0;
  if (tc_attention) {
    p.attention = {5.7, 0.64, true, true};  // fit: 25 us per 256-key item after its QKV wait;
                                            // the last arriver's merge ~20 us for 32 splits
  } else {
    p.attention = {1.78, 0.64, false, false};  // run2 trace: scalar items 75.7 us (p50)
  }
  p.routing_us = 1.0;        // v2 only (assumed): top-k of every token + the job map
  p.l2_ahead_bytes = 256 << 10;  // v2 only: mk_producer.cuh kL2LookaheadBytes
  return p;
}

nlohmann::json sim_params_json(const SimParams& p) {
  nlohmann::json ops = nlohmann::json::object();
  for (int i = 0; i < kNumOps; ++i) ops[op_name(static_cast<Op>(i))] = p.op_us[i];
  return {{"loader", p.loader == SimLoader::kV1 ? "v1" : "v2"},
          {"hbm_gbps", p.hbm_gbps},
          {"hbm_latency_us", p.hbm_latency_us},
          {"sm_stream_gbps", p.sm_stream_gbps},
          {"l2_gbps", p.l2_gbps},
          {"l2_latency_us", p.l2_latency_us},
          {"ring_pages", p.ring_pages},
          {"page_bytes", p.page_bytes},
          {"work_slots", p.work_slots},
          {"pickup_us", p.pickup_us},
          {"consume_gbps", p.consume_gbps},
          {"hop_us", p.hop_us},
          {"poll_us", p.poll_us},
          {"claim_rtt_us", p.claim_rtt_us},
          {"issue_us", p.issue_us},
          {"op_us", ops},
          {"attention",
           {{"kv_gbps", p.attention.kv_gbps},
            {"merge_us_per_split", p.attention.merge_us_per_split},
            {"one_at_a_time", p.attention.one_at_a_time},
            {"consumer_waits", p.attention.consumer_waits}}},
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
    if (key == "loader") {
      const std::string name = v.is_string() ? v.get<std::string>() : "";
      MD_REQUIRE(name == "v1" || name == "v2", "sim params: \"loader\" must be \"v1\" or \"v2\", got ", v.dump());
      p.loader = name == "v1" ? SimLoader::kV1 : SimLoader::kV2;
    } else if (key == "op_us") {
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
        else if (k == "one_at_a_time") take(a, k, p.attention.one_at_a_time);
        else if (k == "consumer_waits") take(a, k, p.attention.consumer_waits);
        else throw Error(cat("sim params: unknown key \"attention.", k, "\""));
      }
    } else if (key == "hbm_gbps") take(v, key, p.hbm_gbps);
    else if (key == "hbm_latency_us") take(v, key, p.hbm_latency_us);
    else if (key == "sm_stream_gbps") take(v, key, p.sm_stream_gbps);
    else if (key == "l2_gbps") take(v, key, p.l2_gbps);
    else if (key == "l2_latency_us") take(v, key, p.l2_latency_us);
    else if (key == "ring_pages") take(v, key, p.ring_pages);
    else if (key == "page_bytes") take(v, key, p.page_bytes);
    else if (key == "work_slots") take(v, key, p.work_slots);
    else if (key == "consume_gbps") take(v, key, p.consume_gbps);
    else if (key == "pickup_us") take(v, key, p.pickup_us);
    else if (key == "hop_us") take(v, key, p.hop_us);
    else if (key == "poll_us") take(v, key, p.poll_us);
    else if (key == "claim_rtt_us") take(v, key, p.claim_rtt_us);
    else if (key == "issue_us") take(v, key, p.issue_us);
    else if (key == "routing_us") take(v, key, p.routing_us);
    else if (key == "l2_ahead_bytes") take(v, key, p.l2_ahead_bytes);
    else if (key == "routing_seed") take(v, key, p.routing_seed);
    else throw Error(cat("sim params: unknown key \"", key, "\""));
  }
  return p;
}

}  // namespace megadecode
