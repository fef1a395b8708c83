// CPU tests of the decode benchmark's host side: byte accounting of a step, distinct experts from a
// step's routing capture, records and tables, --points parsing, the Chrome trace export (clock
// mapping, waits and phases nested in their tasks, the step's split), and the SVG renderer on a
// synthetic trace.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "bench/decode_bytes.h"
#include "bench/decode_options.h"
#include "bench/decode_report.h"
#include "bench/decode_trace.h"
#include "core/check.h"
#include "core/rng.h"
#include "cuda/megakernel/flags.h"
#include "model/presets.h"
#include "model/weights.h"
#include "plan/planner.h"

namespace megadecode {
namespace {

TEST(DecodeBytes, FullShapeNumbers) {
  const ModelConfig c = preset_config("qwen3-30b-a3b");
  EXPECT_EQ(kv_bytes_per_token(c), 48 * 2 * 4 * 128 * 2);  // 96 KiB
  EXPECT_EQ(expert_bytes(c), 3 * 768 * 2048 * 2);
  // Every tensor of a checkpoint, counted from the loader's list: the same total.
  int64_t elems = 0;
  for (const TensorSpec& t : expected_tensors(c))
    elems += std::accumulate(t.shape.begin(), t.shape.end(), int64_t{1}, std::multiplies<>());
  EXPECT_EQ(model_weight_bytes(c), elems * 2);
  EXPECT_NEAR(static_cast<double>(model_weight_bytes(c)), 61.06e9, 0.1e9);

  std::vector<int> ctx = {8192};
  std::vector<int> distinct(c.n_layers, 8);
  const StepBytes b = decode_step_bytes(c, ctx, distinct);
  const int64_t attn_layer = ((4096 + 2 * 512) * 2048 + 2048 * 4096) * 2 + (2 * 2048 + 2 * 128) * 2;
  EXPECT_EQ(b.attention, 48 * attn_layer);
  EXPECT_EQ(b.router, int64_t{48} * 128 * 2048 * 2);
  EXPECT_EQ(b.experts, int64_t{48} * 8 * expert_bytes(c));
  EXPECT_EQ(b.lm_head, int64_t{151937} * 2048 * 2);
  EXPECT_EQ(b.embed, 2048 * 2);
  EXPECT_EQ(b.kv, int64_t{8192} * 98304);
  // DESIGN.md: ~6.1 GB of weights at batch 1, plus 768 MiB of KV at 8K.
  EXPECT_NEAR(static_cast<double>(b.total() - b.kv), 6.1e9, 0.15e9);
}

// North Mini Code (cohere2_moe): the weights match the loader's tensor list (one norm a parallel
// block, no q/k norms, the dense layer 0, tied embeddings); a sliding layer reads at most its
// window of keys. At 32K, 13 full layers of 49 (layer 0 and every fourth) and 36 sliding ones of
// 4096 keys read (13 x 32768 + 36 x 4096) / (49 x 32768) = 0.357 of what full attention on every
// layer would: the layer layout alone puts the floor above 0.35.
TEST(DecodeBytes, NorthMiniCodeWindowsAndBlocks) {
  const ModelConfig c = preset_config("north-mini-code");
  int64_t elems = 0;
  for (const TensorSpec& t : expected_tensors(c))
    elems += std::accumulate(t.shape.begin(), t.shape.end(), int64_t{1}, std::multiplies<>());
  EXPECT_EQ(model_weight_bytes(c), elems * 2);
  int full = 0;
  for (int l = 0; l < c.n_layers; ++l) full += c.layers[l].sliding_window == 0;
  ASSERT_EQ(full, 13);
  const int64_t per_layer_token = 2 * 4 * 128 * 2;
  EXPECT_EQ(kv_bytes_read(c, 32768), (int64_t{13} * 32768 + int64_t{36} * 4096) * per_layer_token);
  EXPECT_EQ(kv_bytes_read(c, 4096), int64_t{49} * 4096 * per_layer_token) << "inside the window: every key";
  EXPECT_EQ(kv_bytes_read(c, 4097), (int64_t{13} * 4097 + int64_t{36} * 4096) * per_layer_token);
  EXPECT_EQ(kv_bytes_read(c, 1), int64_t{49} * per_layer_token);
  const double ratio = static_cast<double>(kv_bytes_read(c, 32768)) / (kv_bytes_per_token(c) * 32768.0);
  EXPECT_NEAR(ratio, 0.357, 0.001);
  std::vector<int> ctx = {32768}, distinct(c.n_layers, 8);
  const StepBytes b = decode_step_bytes(c, ctx, distinct);
  EXPECT_EQ(b.kv, kv_bytes_read(c, 32768));
  const int64_t attn_layer = ((4096 + 2 * 512) * 2048 + 2048 * 4096) * 2 + 2048 * 2;  // one norm, no q/k norms
  EXPECT_EQ(b.attention, 49 * attn_layer);
  EXPECT_EQ(b.experts, int64_t{3} * 3072 * 2048 * 2 + int64_t{48} * 8 * expert_bytes(c)) << "layer 0 dense";
  EXPECT_EQ(b.router, int64_t{48} * 128 * 2048 * 2);
  // Shared experts: one more SwiGLU MLP a MoE layer, read every step.
  ModelConfig shared = c;
  shared.shared_intermediate_size = 1024;
  const int64_t one_shared = int64_t{3} * 1024 * 2048 * 2;
  EXPECT_EQ(decode_step_bytes(shared, ctx, distinct).experts, b.experts + 48 * one_shared);
  EXPECT_EQ(model_weight_bytes(shared), model_weight_bytes(c) + 48 * one_shared);
}

TEST(DecodeBytes, ScalesWithDistinctExpertsAndContexts) {
  SplitMix64 rng(test_seed());
  const ModelConfig c = preset_config("small");
  std::vector<int> d(c.n_layers), ctx(1 + rng.below(64));
  for (int& x : d) x = static_cast<int>(rng.below(c.n_experts + 1));
  int64_t tokens = 0;
  for (int& n : ctx) tokens += (n = 1 + static_cast<int>(rng.below(100000)));
  const StepBytes b = decode_step_bytes(c, ctx, d);
  EXPECT_EQ(b.experts, std::accumulate(d.begin(), d.end(), int64_t{0}) * expert_bytes(c));
  EXPECT_EQ(b.kv, tokens * kv_bytes_per_token(c));
  EXPECT_EQ(b.embed, static_cast<int64_t>(ctx.size()) * c.hidden_size * 2);
  d[0] = c.n_experts + 1;
  EXPECT_THROW(decode_step_bytes(c, ctx, d), Error);
  d.pop_back();
  EXPECT_THROW(decode_step_bytes(c, ctx, d), Error);
  std::vector<int> zero = {0};
  d.assign(c.n_layers, 1);
  EXPECT_THROW(decode_step_bytes(c, zero, d), Error);
}

// Distinct experts per layer over every token of a step's routing, repeats and top-k order aside.
TEST(DecodeBytes, DistinctExpertsFromTheRouting) {
  RoutingLog log(3, 2);
  const std::vector<float> w(6, 0.5f);
  // layer 0: {1, 2} + {2, 1} + {1, 7}; layer 1: {4, 5} three times; layer 2: {0, 9} {3, 6} {8, 2}
  log.record(0, 10, std::vector<int32_t>{1, 2, 4, 5, 0, 9}, w);
  log.record(1, 3, std::vector<int32_t>{2, 1, 5, 4, 3, 6}, w);
  log.record(2, 0, std::vector<int32_t>{1, 7, 4, 5, 8, 2}, w);
  ModelConfig shape = preset_config("small");  // 3 MoE layers of 10 experts
  shape.n_layers = 3;
  shape.n_experts = 10;
  shape.layers.assign(3, LayerSpec{});
  EXPECT_EQ(distinct_experts(log, shape), (std::vector<int>{3, 2, 6}));
  log.record(1, 3, std::vector<int32_t>{3, 1, 5, 4, 3, 6}, w);  // a token recorded again replaces its routing
  EXPECT_EQ(distinct_experts(log, shape), (std::vector<int>{4, 2, 6}));
  ModelConfig other = shape;
  other.n_layers = 4;
  other.layers.assign(4, LayerSpec{});
  EXPECT_THROW(distinct_experts(log, other), Error);  // another layer count
  other = shape;
  other.n_experts = 9;
  EXPECT_THROW(distinct_experts(log, other), Error);   // expert 9 outside 9 experts
  EXPECT_THROW(distinct_experts(RoutingLog(3, 2), shape), Error);  // nothing captured
  // A dense layer records expert -1 for every token and counts none; anything else there is an error.
  other = shape;
  other.layers[1].ffn = FfnKind::kDense;
  EXPECT_THROW(distinct_experts(log, other), Error);  // layer 1 holds experts 4, 5, 3, ...
  RoutingLog dense(3, 2);
  dense.record(0, 10, std::vector<int32_t>{1, 2, -1, -1, 0, 9}, w);
  dense.record(1, 3, std::vector<int32_t>{2, 1, -1, -1, 3, 6}, w);
  EXPECT_EQ(distinct_experts(dense, other), (std::vector<int>{2, 0, 4}));
  EXPECT_THROW(distinct_experts(dense, shape), Error);  // -1 in a MoE layer
  // The counts feed decode_step_bytes.
  const ModelConfig c = preset_config("small");
  RoutingLog one(c.n_layers, c.n_experts_per_tok);
  std::vector<int32_t> experts(static_cast<size_t>(c.n_layers) * c.n_experts_per_tok);
  std::iota(experts.begin(), experts.end(), 0);
  one.record(0, 0, experts, std::vector<float>(experts.size(), 0.125f));
  const std::vector<int> d = distinct_experts(one, c);
  EXPECT_EQ(d, std::vector<int>(c.n_layers, c.n_experts_per_tok));
  std::vector<int> ctx = {100};
  EXPECT_EQ(decode_step_bytes(c, ctx, d).experts, int64_t{c.n_layers} * c.n_experts_per_tok * expert_bytes(c));
}

TEST(DecodeReport, RecordArithmetic) {
  DecodePoint p;
  p.options.backend = "cuda-mk";
  p.batch = 8;
  p.context = 8192;
  p.n_sms = 132;
  p.ceiling_gbps = 4000;
  p.step_ms = {3.0f, 1.0f, 2.0f, 100.0f, 2.0f};  // median 2 ms despite the outlier
  p.distinct_experts = {8, 10};
  p.bytes.attention = 4'000'000'000;  // 4 GB
  const nlohmann::json r = decode_record(p);
  for (const char* key : {"backend", "batch", "context", "step_ms", "tok_s", "bytes_per_step", "ceiling_gbps",
                          "pct_of_floor", "policy", "n_sms", "distinct_experts"})
    EXPECT_TRUE(r.contains(key)) << key;
  EXPECT_DOUBLE_EQ(r["step_ms"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(r["tok_s"].get<double>(), 4000.0);
  EXPECT_DOUBLE_EQ(r["achieved_gbps"].get<double>(), 2000.0);
  EXPECT_DOUBLE_EQ(r["pct_of_floor"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(r["floor_ms"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(r["distinct_experts"].get<double>(), 9.0);
  const std::vector<nlohmann::json> rows = {r};
  const std::string table = format_decode_table("t", rows);
  EXPECT_NE(table.find("50.0%"), std::string::npos) << table;
  EXPECT_NE(table.find("4000.0"), std::string::npos) << table;
  p.step_ms.clear();
  EXPECT_THROW(decode_record(p), Error);
}

TEST(DecodeReport, ParsePoints) {
  EXPECT_EQ(parse_points(""), (std::vector<std::pair<int, int>>{}));
  EXPECT_EQ(parse_points("1024:1,131072:2"), (std::vector<std::pair<int, int>>{{1024, 1}, {131072, 2}}));
  for (const char* bad : {"1024", "1024:", ":1", "a:1", "1:-1", "1:2,", "1:2:3", "99999999999:1"})
    EXPECT_THROW(parse_points(bad), Error) << bad;
}

DecodeBenchOptions parse(std::vector<std::string> words) {
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return parse_decode_bench_args(static_cast<int>(argv.size()), argv.data());
}

TEST(DecodeOptions, DefaultsAndMemoryPlan) {
  const DecodeBenchOptions d = parse({});
  EXPECT_EQ(d.points.size(), 7u);
  EXPECT_EQ(d.points.back(), (std::pair<int, int>{8192, 64}));
  EXPECT_EQ(d.backends, (std::vector<std::string>{"cuda-mk", "cuda-ops", "cuda-batched", "cuda"}));
  EXPECT_TRUE(!d.ablations && d.trace_path.empty());
  EXPECT_EQ(d.steps, 100);
  EXPECT_EQ(d.block_bytes(), 16 * 98304);
  EXPECT_EQ(d.main_blocks(), 64 * 512);  // batch 64 x 8192 / 16: 48 GiB of KV
  // What scripts/gpu runs fits on an H200 (141 GB, ~140 GB free) and not on an 80 GB card.
  const DecodeBenchOptions g = parse({"--points", "1024:1,32768:1,131072:1", "--ablations", "--trace", "t.json",
                                      "--backends", "mk"});
  EXPECT_EQ(g.points.size(), 10u);
  EXPECT_EQ(g.config.max_position_embeddings, 131072);  // raised past the preset's 40960
  EXPECT_EQ(g.backends, (std::vector<std::string>{"cuda-mk"}));
  EXPECT_EQ(parse({"--backends", "batched,cuda,batched"}).backends,
            (std::vector<std::string>{"cuda-batched", "cuda"}));
  // The batched rows go to 1024 sequences (the megakernel's rows skip batches above 64).
  EXPECT_EQ(parse({"--batch", "256", "--context", "1024"}).points.back(), (std::pair<int, int>{1024, 256}));
  EXPECT_EQ(g.main_blocks(), 64 * 512);
  EXPECT_EQ(g.ablation_blocks(), 8 * 512);
  EXPECT_EQ(decode_memory_problem(g, int64_t{140} << 30), "");
  const std::string p80 = decode_memory_problem(g, int64_t{80} << 30);
  EXPECT_NE(p80.find("batch 64 x context 8192"), std::string::npos) << p80;
  EXPECT_EQ(p80.find("batch 1 x context 1024"), std::string::npos) << p80;
  // Batch 64 at 128K needs 768 GiB of KV: refused, named.
  const std::string huge = decode_memory_problem(parse({"--context", "131072", "--batch", "64"}), int64_t{140} << 30);
  EXPECT_NE(huge.find("batch 64 x context 131072"), std::string::npos) << huge;
}

// North presets (parallel blocks) run on every backend (the megakernel and the batched step); the
// rings of the largest point's sequences, counted in the memory plan.
TEST(DecodeOptions, NorthPresetsRunEveryBackendWithARingPool) {
  const DecodeBenchOptions n = parse({"--preset", "north-mini-code", "--context", "8192,32768", "--batch", "1,8"});
  EXPECT_EQ(n.backends, (std::vector<std::string>{"cuda-mk", "cuda-ops", "cuda-batched", "cuda"}));
  EXPECT_EQ(n.ring_blocks(), 8 * 257);  // kv_ring_length(4096, 16) = 257 blocks a sequence
  EXPECT_EQ(n.ring_block_bytes(), 36 * 2 * 4 * 128 * 2 * 16);  // the 36 sliding layers
  EXPECT_EQ(n.block_bytes(), 13 * 2 * 4 * 128 * 2 * 16);       // the full pool: the 13 full-attention layers
  EXPECT_EQ(decode_memory_problem(n, int64_t{140} << 30), "");
  // A point holds min(R, its blocks) ring blocks a sequence: 1K at batch 256 needs 64 a sequence.
  const DecodeBenchOptions wide = parse({"--preset", "north-mini-code", "--context", "8192", "--batch", "1",
                                         "--points", "8192:64,1024:256"});
  EXPECT_EQ(wide.ring_blocks(), std::max<int64_t>(64 * 257, 256 * 64));
  EXPECT_EQ(parse({"--preset", "north-mini-code", "--context", "1024", "--batch", "8"}).ring_blocks(), 8 * 64);
  EXPECT_EQ(parse({"--preset", "north-mini-code", "--backends", "batched,mk"}).backends,
            (std::vector<std::string>{"cuda-batched", "cuda-mk"}));
  EXPECT_EQ(parse({}).ring_blocks(), 0);  // qwen3-30b-a3b: no sliding layers
}

TEST(DecodeOptions, BadFlagsAreErrors) {
  const std::vector<std::vector<std::string>> bad = {
      {"--batch", "0"}, {"--batch", "1025"}, {"--context", "0"}, {"--context", "2000000"}, {"--steps", "0"},
      {"--warmup", "-1"}, {"--backends", "mk,gpu"}, {"--policy", "nope"}, {"--ablation-batch", "99"},
      {"--trace-batch", "0"}, {"--block-size", "0"}, {"--ceiling-mib", "1"}, {"--preset", "nope"},
      {"--points", "1:"}, {"--bogus"}, {"--attention", "tc"}};  // --attention is gone: one attention item now
  for (const auto& words : bad) EXPECT_THROW(parse(words), Error) << words[0];
}

// --switches names megakernel switches; the loader's cap has a default (one page) that a cap
// switch replaces, and a later cap replaces an earlier one.
TEST(DecodeOptions, SwitchesAndTheLoaderCap) {
  EXPECT_EQ(parse({"--switches", "inflight-2,kv-prefetch"}).backend.kernel_flags,
            uint32_t{cuda::kMkInflight2} | uint32_t{cuda::kMkKvPrefetch});
  EXPECT_EQ(parse({}).backend.kernel_flags, 0u);
  EXPECT_EQ(cuda::mk_inflight_cap(0), cuda::kMkDefaultInflight);
  EXPECT_EQ(cuda::kMkDefaultInflight, 1u);
  EXPECT_EQ(cuda::mk_inflight_cap(cuda::kMkInflight2 | cuda::kMkPollBackoff), 2u);
  EXPECT_EQ(cuda::mk_inflight_cap(cuda::kMkInflight3), 3u);
  EXPECT_EQ(cuda::mk_inflight_cap(cuda::kMkInflightOff), 0u);
  EXPECT_EQ(cuda::mk_with_switch(cuda::kMkInflight2 | cuda::kMkKvPrefetch, cuda::kMkInflight3),
            uint32_t{cuda::kMkInflight3} | uint32_t{cuda::kMkKvPrefetch});
  EXPECT_EQ(cuda::mk_with_switch(cuda::kMkInflight2, cuda::kMkPollBackoff),
            uint32_t{cuda::kMkInflight2} | uint32_t{cuda::kMkPollBackoff});
  std::set<std::string> names;
  std::set<uint32_t> flags;
  for (const cuda::MkSwitch& sw : cuda::kMkSwitches) {
    EXPECT_TRUE(names.insert(sw.name).second) << sw.name;
    EXPECT_TRUE(flags.insert(sw.flag).second) << sw.name;
    EXPECT_NE(sw.flag, 0u) << sw.name;
  }
  EXPECT_THROW(parse({"--switches", "inflight-1"}), Error);  // the default is no switch
  EXPECT_THROW(parse({"--switches", "kv-prefetch,nope"}), Error);
}

// A plan to name things by, and hand-made records on two SMs. clock64 = 2 * ns + per-SM offset,
// globaltimer quantised to 1 us: the export must recover the fine times from the clock.
struct TraceCase {
  Plan plan;
  std::vector<TraceRecord> recs;
};

TraceRecord rec(int sm, TraceKind kind, int op, int64_t t0_ns, int64_t t1_ns, int counter = 0) {
  TraceRecord r{};
  const int64_t base = 1'000'000'000, off = 12345 + 1000 * sm;
  r.g_begin = (base + t0_ns) / 1000 * 1000;
  r.g_end = (base + t1_ns) / 1000 * 1000;
  r.c_begin = 2 * (base + t0_ns) + off;
  r.c_end = 2 * (base + t1_ns) + off;
  r.kind = kind;
  r.op = op;
  r.layer = 0;
  r.task = 0;
  r.arg0 = counter;
  r.arg1 = 1;
  r.sm = sm;
  return r;
}

TraceCase trace_case() {
  const ModelConfig c = preset_config("tiny");
  std::vector<int32_t> table = {0};
  BatchState batch;
  batch.seqs.push_back(SeqState{5, table});
  PlanOptions o;
  o.n_sms = 2;
  TraceCase t{make_plan(c, batch, policy_by_name("default"), o), {}};
  const int qkv = static_cast<int>(Op::kQkv), oproj = static_cast<int>(Op::kOProj);
  for (int sm = 0; sm < 2; ++sm) {
    // Every 10 us: a QKV task 0..4 us (its fill 1..2, a page wait 2..3), nothing 4..5, an O-proj
    // task 5..10 us whose counter wait is 5..8 (whole microseconds: the timer's quantum); the
    // loader waits for a ring slot 3..4 at the O-proj task.
    for (int i = 0; i < 20; ++i) {
      const int64_t at = i * 10000;
      t.recs.push_back(rec(sm, kTraceLoader, oproj, at + 3000, at + 4000, kLoaderSlotWait));
      t.recs.push_back(rec(sm, kTraceWork, qkv, at, at + 4000));
      t.recs.push_back(rec(sm, kTracePhase, qkv, at + 1000, at + 2000, kPhaseFill));
      t.recs.push_back(rec(sm, kTracePhase, qkv, at + 2000, at + 3000, kPhasePage));
      t.recs.push_back(rec(sm, kTraceWork, oproj, at + 5000, at + 10000));
      t.recs.push_back(rec(sm, kTraceWait, oproj, at + 5000, at + 8000, 1));
    }
  }
  return t;
}

TEST(DecodeTrace, ChromeJsonNestsWaitsAndPhasesInTasks) {
  TraceCase t = trace_case();
  TraceSummary s;
  const nlohmann::json j = trace_to_chrome(t.recs, t.plan, 3, {{"backend", "cuda-mk"}}, &s);
  ASSERT_TRUE(j.contains("traceEvents"));
  int tasks = 0, waits = 0, fills = 0, pages = 0, meta = 0, loader = 0;
  for (const nlohmann::json& e : j["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name"));
    if (e["ph"] == "M") {
      ++meta;
      continue;
    }
    ASSERT_EQ(e["ph"], "X");
    ASSERT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("tid"));
    const double dur = e["dur"].get<double>(), ts = e["ts"].get<double>();
    EXPECT_GE(ts, 0.0);
    if (e["pid"] == 0) {
      ++tasks;
      EXPECT_TRUE(e["cat"] == "qkv" || e["cat"] == "o_proj");
      EXPECT_NEAR(dur, e["cat"] == "qkv" ? 4.0 : 5.0, 1e-6);  // recovered from clock64, not the 1 us timer
    } else if (e["pid"] == 2) {
      ++loader;
      EXPECT_EQ(e["cat"], "loader");
      EXPECT_EQ(e["name"], "loader: ring wait");
      EXPECT_NEAR(dur, 1.0, 1e-6);
      EXPECT_NEAR(std::fmod(ts, 10.0), 3.0, 1e-6);
    } else if (e["cat"] == "wait") {
      ++waits;
      EXPECT_NEAR(dur, 3.0, 1e-6);
      EXPECT_NEAR(std::fmod(ts, 10.0), 5.0, 1e-6);
      EXPECT_EQ(e["args"]["for"], "o_proj L0");
    } else {
      ASSERT_EQ(e["cat"], "phase");
      if (e["name"] == "fill") {
        ++fills;
        EXPECT_NEAR(dur, 1.0, 1e-6);
      } else {
        EXPECT_EQ(e["name"], "pages");
        ++pages;
        EXPECT_NEAR(dur, 1.0, 1e-6);
      }
    }
  }
  EXPECT_EQ(tasks, 80);
  EXPECT_EQ(waits, 40);
  EXPECT_EQ(fills, 40);
  EXPECT_EQ(pages, 40);
  EXPECT_EQ(loader, 40);
  EXPECT_EQ(meta, 3 + 2 * 3 * 2);
  EXPECT_EQ(s.n_loader, 40);
  EXPECT_NEAR(s.loader_us[kLoaderSlotWait], 40.0, 1e-6);
  EXPECT_NEAR(s.loader_us[kLoaderRouting], 0.0, 1e-9);
  EXPECT_NEAR(s.step_us, 200.0, 1e-6);
  EXPECT_NEAR(s.busy_frac, 0.5, 1e-9);  // 9 us of tasks per 10, less 3 of waits and 1 of pages
  EXPECT_NEAR(s.wait_frac, 0.3, 1e-9);
  EXPECT_NEAR(s.page_frac, 0.1, 1e-9);
  EXPECT_NEAR(s.idle_frac, 0.1, 1e-9);
  EXPECT_NEAR(s.sm_clock_ghz, 2.0, 1e-6);  // clock64 = 2 x ns
  EXPECT_EQ(s.dropped, 3);
  const TraceOpTime& q = s.ops.at("qkv");
  const TraceOpTime& o = s.ops.at("o_proj");
  EXPECT_EQ(q.n_tasks, 40);
  EXPECT_NEAR(q.task_us, 160.0, 1e-6);
  EXPECT_NEAR(q.phase_us[kPhaseFill], 40.0, 1e-6);
  EXPECT_NEAR(q.phase_us[kPhasePage], 40.0, 1e-6);
  EXPECT_NEAR(q.wait_us, 0.0, 1e-9);
  EXPECT_EQ(o.n_tasks, 40);
  EXPECT_NEAR(o.wait_us, 120.0, 1e-6);
  EXPECT_EQ(j["otherData"]["backend"], "cuda-mk");
  EXPECT_NEAR(j["otherData"]["ops"]["qkv"]["pages_us"].get<double>(), 40.0, 1e-6);
  const std::string text = format_trace_summary(s);
  EXPECT_NE(text.find("o_proj"), std::string::npos) << text;
  EXPECT_NE(text.find("waiting for pages 10.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("SM clock 2.00 GHz"), std::string::npos) << text;
  EXPECT_NE(text.find("ring waits 20.0"), std::string::npos) << text;  // per SM
  EXPECT_NEAR(j["otherData"]["loader_us_per_sm"]["ring_wait"].get<double>(), 20.0, 1e-6);
  // Records naming an SM outside the plan, an unknown kind, phase, loader phase or op are refused.
  for (int bad = 0; bad < 5; ++bad) {
    std::vector<TraceRecord> recs = t.recs;
    if (bad == 0) recs[1].sm = 7;
    if (bad == 1) recs[1].kind = 9;
    if (bad == 2) recs[2].arg0 = kNumTracePhases;
    if (bad == 3) recs[1].op = kNumOps;
    if (bad == 4) recs[0].arg0 = kNumLoaderPhases;
    EXPECT_THROW(trace_to_chrome(recs, t.plan, 0, {}), Error) << bad;
  }
}

// The per-layer timeline: three layers of (qkv, attn, o_proj) waves on two SMs with known times;
// the middle layer's medians are read back exactly. A task's work starts after its counter waits.
TEST(DecodeTrace, LayerTimelineMeasuresWavesAndHops) {
  TraceCase t = trace_case();
  t.recs.clear();
  const int qkv = static_cast<int>(Op::kQkv), attn = static_cast<int>(Op::kAttn), oproj = static_cast<int>(Op::kOProj);
  for (int layer = 0; layer < 3; ++layer) {
    const int64_t l0 = layer * 100000;  // 100 us per layer
    auto add = [&](int sm, int op, int64_t a, int64_t b, TraceKind kind = kTraceWork) {
      TraceRecord r = rec(sm, kind, op, l0 + a, l0 + b);
      r.layer = layer;
      r.task = static_cast<int32_t>(10 * layer + op);  // a wait names its task
      t.recs.push_back(r);
    };
    add(0, qkv, 0, 2000);                                      // qkv 0..2 us on SM 0
    add(0, attn, 5000, 9000);                                  // attn: hop of 3 us after qkv
    add(1, attn, 6000, 16000);                                 //   items of 4 and 10 us
    add(0, oproj, 20000 + 1000 * layer, 23000 + 1000 * layer); // o_proj: hop 4 us (layer 1: 5 us)
    add(1, oproj, 20000, 22000);                               //   the work after SM 1's wait
    add(1, oproj, 20000, 21000, kTraceWait);
  }
  TraceSummary s;
  trace_to_chrome(t.recs, t.plan, 0, {}, &s);
  EXPECT_NEAR(s.layer_us, 100.0, 1e-6);
  ASSERT_EQ(s.layer_timeline.size(), 3u);
  const WaveTiming &n = s.layer_timeline[0], &q = s.layer_timeline[1], &o = s.layer_timeline[2];
  EXPECT_EQ(n.op, "qkv");
  EXPECT_EQ(q.op, "attn");
  EXPECT_EQ(o.op, "o_proj");
  EXPECT_NEAR(q.start_us, 5.0, 1e-6);
  EXPECT_NEAR(q.end_us, 16.0, 1e-6);
  EXPECT_NEAR(q.gap_us, 3.0, 1e-6);
  EXPECT_NEAR(q.item_p50_us, 7.0, 1e-6);
  EXPECT_NEAR(q.item_max_us, 10.0, 1e-6);
  EXPECT_EQ(q.items, 2);
  EXPECT_NEAR(o.start_us, 21.0, 1e-6);  // layer 1 only (the middle layer)
  EXPECT_NEAR(o.gap_us, 5.0, 1e-6);
  EXPECT_NEAR(o.end_us, 24.0, 1e-6);
  const std::string text = format_trace_summary(s);
  EXPECT_NE(text.find("one layer"), std::string::npos) << text;
}

TEST(DecodeTrace, SvgScriptRendersASyntheticTrace) {
  if (std::system("python3 -c 'import json' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  TraceCase t = trace_case();
  const auto dir = std::filesystem::temp_directory_path() / ("md_trace_" + std::to_string(test_seed()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "t.json");
    f << trace_to_chrome(t.recs, t.plan, 0, {{"backend", "cuda-mk"}, {"batch", 1}}).dump();
  }
  const std::string script = std::string(MEGADECODE_SOURCE_DIR) + "/scripts/trace_to_svg.py";
  const std::string cmd = "python3 " + script + " " + (dir / "t.json").string() + " " + (dir / "t.svg").string() +
                          " --width 800 --row 8 > " + (dir / "log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream f(dir / "t.svg");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string svg = ss.str();
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t bars = 0;
  for (size_t p = svg.find("<rect x="); p != std::string::npos; p = svg.find("<rect x=", p + 1)) ++bars;
  EXPECT_GE(bars, 2u * 3 * 20 / 2);  // adjacent bars of one op may merge, but most stay apart
  EXPECT_NE(svg.find("#d62728"), std::string::npos);  // the wait colour
  EXPECT_NE(svg.find("SM 1"), std::string::npos);
  // A trace without complete events is refused.
  {
    std::ofstream e(dir / "empty.json");
    e << "{\"traceEvents\": []}";
  }
  const std::string bad = "python3 " + script + " " + (dir / "empty.json").string() + " " +
                          (dir / "e.svg").string() + " >/dev/null 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace megadecode
