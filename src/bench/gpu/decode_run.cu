// `megadecode bench decode` (CUDA builds): the run. Flags and the memory plan come from
// bench/decode_options.h; the device work from bench/decode_gpu.h; records, tables and the trace
// export from bench/decode_report.h and bench/decode_trace.h. Order: read ceiling, weights,
// each backend of --backends over every point it runs (one backend and its KV cache at a time; the
// megakernel's at batches <= 64), the trace of one cuda-mk step, the ablations, then the JSON.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "bench/decode_bytes.h"
#include "bench/decode_gpu.h"
#include "bench/decode_options.h"
#include "bench/decode_report.h"
#include "bench/decode_trace.h"
#include "bench/gpu/bandwidth.h"
#include "core/check.h"
#include "core/json_file.h"
#include "cuda/megakernel/types.h"
#include "model/presets.h"
#include "plan/policy.h"

namespace megadecode {
namespace {

constexpr int kTraceCapacity = 16384;  // records per SM and role (~1,200 per SM at batch 1; 270 MB in all)

// One backend configuration of the sweep: its name in the tables and its options.
struct Variant {
  std::string name;
  BackendOptions options;
};

// `base` with another backend, policy or kernel flags.
Variant variant(const std::string& name, const BackendOptions& base, const std::string& backend,
                const std::string& policy, uint32_t flags) {
  BackendOptions o = base;
  o.backend = backend;
  o.policy = policy;
  o.kernel_flags = flags;
  return {name, o};
}

// Each ablation changes one thing of the main sweep's options (--policy, --switches, its block
// size): none (named as the main rows), every other plan policy, every switch not already on, and
// with switches on, none of them.
std::vector<Variant> ablation_variants(const BackendOptions& base) {
  std::vector<Variant> v;
  const uint32_t flags = base.kernel_flags;
  v.push_back(variant(base.policy + (flags != 0 ? "+" : ""), base, "cuda-mk", base.policy, flags));
  for (const std::string& p : policy_names())
    if (p != base.policy) v.push_back(variant(p, base, "cuda-mk", p, flags));
  if (flags != 0) v.push_back(variant("no-switches", base, "cuda-mk", base.policy, 0));
  for (const cuda::MkSwitch& sw : cuda::kMkSwitches)
    if (cuda::mk_with_switch(flags, sw.flag) != flags)
      v.push_back(variant(sw.name, base, "cuda-mk", base.policy, cuda::mk_with_switch(flags, sw.flag)));
  v.push_back(variant("cuda-ops", base, "cuda-ops", base.policy, flags));
  return v;
}

// The options with a KV cache of `blocks` and, for a model with sliding-window layers, a ring pool
// of `ring_blocks` (the caller checked that both fit in memory). The bench never prefills: no
// prefill runner for such a model (cohere2_moe), whose memory its rings need.
BackendOptions with_blocks(BackendOptions o, int64_t blocks, const DecodeBenchOptions& bench) {
  MD_REQUIRE(blocks >= 1 && blocks < (int64_t{1} << 31), "KV cache of ", blocks, " blocks");
  o.n_kv_blocks = static_cast<int>(blocks);
  const int64_t ring = bench.ring_blocks();
  MD_REQUIRE(ring < (int64_t{1} << 31), "KV ring pool of ", ring, " blocks");
  o.n_ring_blocks = static_cast<int>(ring);
  if (bench.config.block == BlockKind::kParallel) o.prefill_chunk = 0;
  return o;
}

}  // namespace

int bench_decode(int argc, char** argv) {
  const DecodeBenchOptions o = parse_decode_bench_args(argc, argv);
  if (o.help) {
    std::printf("%s", kDecodeBenchUsage);
    return 0;
  }
  const GpuInfo gpu = gpu_info();
  const std::string problem = decode_memory_problem(o, gpu.free_bytes);
  MD_REQUIRE(problem.empty(), "bench decode: does not fit on ", gpu.name, ": ", problem);
  const int64_t weights = model_weight_bytes(o.config);
  std::printf("bench decode: %s (%d SMs, %.1f GB free), preset %s, steps %d (warm-up %d), seed %llu\n",
              gpu.name.c_str(), gpu.n_sms, gpu.free_bytes / 1e9, o.preset.c_str(), o.steps, o.warmup,
              static_cast<unsigned long long>(o.seed));
  const int declared = preset_config(o.preset).max_position_embeddings;
  if (o.config.max_position_embeddings > declared)
    std::printf("note: contexts beyond the preset's %d positions run plain RoPE (real checkpoints use YaRN rope "
                "scaling there); the bytes and work of a step are the same\n", declared);
  nlohmann::json ceiling_records = nlohmann::json::array();
  const int64_t ceiling_bytes = std::min<int64_t>(o.ceiling_mib << 20, (gpu.free_bytes - weights) / 2) / 16 * 16;
  const double ceiling = cuda::measure_read_ceiling(static_cast<size_t>(ceiling_bytes), 20, ceiling_records, false);
  std::printf("read ceiling: %.1f GB/s (best of %zu launch shapes over %lld MiB)\n", ceiling, ceiling_records.size(),
              static_cast<long long>(ceiling_bytes >> 20));
  std::fflush(stdout);

  DecodeGpu dev(o.config, o.seed);
  auto measure = [&](const Variant& v, int ctx, int b, int trace_capacity, DecodePointResult* keep) {
    DecodePointResult res = dev.run(b, ctx, o.warmup, o.steps, trace_capacity);
    DecodePoint p;
    p.options = v.options;
    p.path = res.path;
    p.kernel_ms = res.kernel_ms;
    p.batch = b;
    p.context = ctx;
    p.n_sms = res.n_sms;
    p.ceiling_gbps = ceiling;
    p.step_ms = res.step_ms;
    p.chained_ms = res.chained_ms;
    p.distinct_experts = res.distinct_experts;
    p.bytes = decode_step_bytes(o.config, res.context_lens, res.distinct_experts);
    if (keep) *keep = std::move(res);
    return p;
  };

  nlohmann::json records = nlohmann::json::array(), ablations = nlohmann::json::array(), trace_summary;
  int max_batch = 1;
  for (const auto& [ctx, b] : o.points) max_batch = std::max(max_batch, b);
  std::vector<Variant> mains;
  for (const std::string& name : o.backends) {
    Variant v = variant(name, o.backend, name, o.backend.policy, o.backend.kernel_flags);
    v.options.max_batch = max_batch;
    mains.push_back(v);
  }
  for (const Variant& v : mains) {
    const bool megakernel_only = v.options.backend == "cuda-mk" || v.options.backend == "cuda-ops";
    dev.open(with_blocks(v.options, o.main_blocks(), o));
    for (const auto& [ctx, b] : o.points) {
      if (megakernel_only && b > kDecodeBenchMegakernelMaxBatch) continue;
      nlohmann::json r = decode_record(measure(v, ctx, b, 0, nullptr));
      std::printf("  %-12s %-10s batch %3d context %6d: %8.3f ms  %8.1f tok/s  %5.1f%% of floor; chained %.3f ms (%.3fx)\n",
                  v.name.c_str(), r["path"].get<std::string>().c_str(), b, ctx, r["step_ms"].get<double>(),
                  r["tok_s"].get<double>(), r["pct_of_floor"].get<double>(), r["chained_ms"].get<double>(),
                  r["chained_ms"].get<double>() / r["step_ms"].get<double>());
      if (!r["kernel_ms"].empty()) {  // the batched step's kernels, one eager step with events
        std::printf("    kernels (ms, eager):");
        for (const auto& [name, ms] : r["kernel_ms"].items()) std::printf(" %s %.2f", name.c_str(), ms.get<double>());
        std::printf("\n");
      }
      std::fflush(stdout);
      records.push_back(std::move(r));
    }
    if (v.options.backend == "cuda-mk" && !o.trace_path.empty()) {
      DecodePointResult res;
      const int ctx = o.points.front().first;
      const nlohmann::json r = decode_record(measure(v, ctx, o.trace_batch, kTraceCapacity, &res));
      const nlohmann::json meta = {{"backend", "cuda-mk"}, {"batch", o.trace_batch}, {"context", ctx},
                                   {"policy", v.options.policy}, {"device", gpu.name},
                                   {"step_ms_untraced", r["step_ms"]}};
      TraceSummary sum;
      write_json(o.trace_path, trace_to_chrome(res.trace, res.plan, res.trace_dropped, meta, &sum), -1);
      std::printf("%s", format_trace_summary(sum).c_str());
      std::printf("trace of one cuda-mk step (batch %d, context %d) written to %s\n", o.trace_batch, ctx,
                  o.trace_path.c_str());
      trace_summary = {{"batch", o.trace_batch}, {"context", ctx}, {"step_us", sum.step_us},
                       {"busy_frac", sum.busy_frac}, {"wait_frac", sum.wait_frac}, {"page_frac", sum.page_frac}, {"idle_frac", sum.idle_frac},
                       {"ops", trace_ops_json(sum)},
                       {"layer_us", sum.layer_us}, {"layer_timeline", layer_timeline_json(sum)}};
    }
  }
  dev.close();
  const std::vector<nlohmann::json> rows(records.begin(), records.end());
  std::printf("\n%s", format_decode_table("decode steps (median of " + std::to_string(o.steps) + ")", rows).c_str());

  if (o.ablations) {
    const int ctx = o.points.front().first;
    for (const Variant& v : ablation_variants(o.backend)) {
      dev.open(with_blocks(v.options, o.ablation_blocks(), o));
      for (int b : o.ablation_batches) {
        DecodePoint p = measure(v, ctx, b, 0, nullptr);
        p.ablation = v.name;
        ablations.push_back(decode_record(p));
      }
      dev.close();
    }
    std::vector<nlohmann::json> sorted(ablations.begin(), ablations.end());
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const nlohmann::json& a, const nlohmann::json& b) { return a["batch"] < b["batch"]; });
    std::printf("\n%s", format_decode_table("ablations (context " + std::to_string(ctx) + ")", sorted).c_str());
  }

  if (!o.json_path.empty()) {
    nlohmann::json out = {{"device", gpu.name}, {"n_sms", gpu.n_sms}, {"preset", o.preset}, {"seed", o.seed},
                          {"steps", o.steps}, {"warmup", o.warmup}, {"kv_block_size", o.backend.kv_block_size},
                          {"ceiling_gbps", ceiling}, {"ceiling_shapes", ceiling_records}, {"records", records},
                          {"ablations", ablations}, {"command", o.command}};
    if (!trace_summary.is_null()) out["trace_summary"] = trace_summary;
    write_json(o.json_path, out, 1);
    std::printf("records written to %s\n", o.json_path.c_str());
  }
  return 0;
}

}  // namespace megadecode
