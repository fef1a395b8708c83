// `megadecode bench engine` and its null backend: the backend returns its fixed tokens by position
// (chained rows included), checks rows as cuda-mk does, plans only megakernel batches (patched, or
// fresh per step), and lets its "device" take the time asked; the scheduler on it gives the same
// outputs with every loop and plan mode; the bench runs in-process and writes its JSON records.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../engine/fakes.h"
#include "bench/bench.h"
#include "bench/null_backend.h"
#include "core/check.h"
#include "core/stopwatch.h"
#include "engine/scheduler.h"
#include "model/presets.h"

namespace megadecode {
namespace {

std::vector<int32_t> cycle_of(const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); }

NullBackend make_null(const NullBackendOptions& null, int n_blocks = 256) {
  BackendOptions bo;
  bo.kv_block_size = 16;
  bo.n_kv_blocks = n_blocks;
  return NullBackend(preset_config("qwen3-30b-a3b"), bo, null);
}

TEST(NullBackend, FixedTokensByPositionAndChainedRows) {
  NullBackendOptions null;
  null.token_cycle = cycle_of("abcdefg");
  NullBackend b = make_null(null);
  std::vector<int32_t> table = {5, 9, 3}, table2 = {1};
  const int32_t tok = 42;
  std::vector<DecodeSeq> seqs(2);
  seqs[0].chunk = SeqChunk{1, std::span<const int32_t>(&tok, 1), 40, table};
  seqs[1].chunk = SeqChunk{2, std::span<const int32_t>(&tok, 1), 3, table2};
  DecodeResult r;
  b.decode(seqs, false, r);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{'a' + 41 % 7, 'a' + 4 % 7}));
  // The next step chained to this one: rows take no token of their own.
  const DecodeTicket t1 = b.decode_async(seqs, true);
  for (size_t i = 0; i < 2; ++i) {
    seqs[i].chunk.tokens = {};
    seqs[i].prev_row = static_cast<int>(i);
    ++seqs[i].chunk.start_pos;
  }
  const DecodeTicket t2 = b.decode_async(seqs, false);
  b.collect(t1, r);
  EXPECT_EQ(r.logits.size(), 2u * preset_config("qwen3-30b-a3b").vocab_size);
  EXPECT_THROW(b.collect(t1, r), Error);  // collected already
  b.collect(t2, r);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{'a' + 42 % 7, 'a' + 5 % 7}));
  EXPECT_EQ(b.plan_counts().new_skeletons, 1u);
  EXPECT_EQ(b.plan_counts().patched + b.plan_counts().reassembled, 2u);
}

TEST(NullBackend, ChecksRowsAsCudaMkDoes) {
  NullBackend b = make_null(NullBackendOptions{}, 8);
  const int32_t tok = 1;
  std::vector<int32_t> table = {7}, outside = {8}, short_table = {};
  DecodeSeq s;
  s.chunk = SeqChunk{1, std::span<const int32_t>(&tok, 1), 0, outside};
  DecodeResult r;
  EXPECT_THROW(b.decode(std::span<const DecodeSeq>(&s, 1), false, r), Error);
  s.chunk.block_table = short_table;
  EXPECT_THROW(b.decode(std::span<const DecodeSeq>(&s, 1), false, r), Error);
  s.chunk.block_table = table;
  s.sampling.top_p = 0.0f;
  EXPECT_THROW(b.decode(std::span<const DecodeSeq>(&s, 1), false, r), Error);
  s.sampling = SamplingParams{};
  b.decode(std::span<const DecodeSeq>(&s, 1), false, r);
  EXPECT_EQ(r.tokens.size(), 1u);
}

// Above 64 rows the step is the batched path's: no plan.
TEST(NullBackend, BatchedStepsTakeNoPlan) {
  NullBackend b = make_null(NullBackendOptions{}, 200);
  std::vector<std::vector<int32_t>> tables(65);
  std::vector<DecodeSeq> seqs(65);
  const int32_t tok = 3;
  for (int i = 0; i < 65; ++i) {
    tables[i] = {i};
    seqs[i].chunk = SeqChunk{i, std::span<const int32_t>(&tok, 1), 5, tables[i]};
  }
  DecodeResult r;
  b.decode(seqs, false, r);
  EXPECT_EQ(r.tokens.size(), 65u);
  EXPECT_EQ(b.plan_counts().new_skeletons + b.plan_counts().patched + b.plan_counts().reassembled, 0u);
}

TEST(NullBackend, DeviceTimeIsWaitedFor) {
  NullBackendOptions null;
  null.device_us = 3000;
  NullBackend b = make_null(null);
  std::vector<int32_t> table = {0};
  const int32_t tok = 1;
  DecodeSeq s;
  s.chunk = SeqChunk{1, std::span<const int32_t>(&tok, 1), 0, table};
  const Stopwatch t;
  const DecodeTicket a = b.decode_async(std::span<const DecodeSeq>(&s, 1), false);
  const DecodeTicket c = b.decode_async(std::span<const DecodeSeq>(&s, 1), false);  // queued behind a
  DecodeResult r;
  b.collect(a, r);
  b.collect(c, r);
  EXPECT_GE(t.seconds(), 0.006);  // two steps of 3 ms, one after the other
}

// The scheduler on the null backend: every loop and plan mode gives the same events.
TEST(NullBackend, SchedulerOutputsAgreeAcrossModes) {
  std::vector<std::vector<SeqOutput>> runs;
  for (int mode = 0; mode < 4; ++mode) {
    NullBackendOptions null;
    null.token_cycle = cycle_of("The quick brown fox jumps over the lazy dog. ");
    null.patch_plan = mode % 2 == 0;
    NullBackend b = make_null(null, 512);
    SchedulerConfig sc;
    sc.max_num_seqs = 5;
    sc.check_invariants = true;
    sc.overlap = mode < 2 ? Overlap::kAuto : Overlap::kOff;
    Scheduler sched(b, sc, testing::fake_decoders(), nullptr);
    auto sink = std::make_shared<testing::CollectingSink>();
    for (int i = 0; i < 7; ++i) {
      SequenceRequest r;
      r.request_id = static_cast<uint64_t>(i + 1);
      r.prompt = cycle_of(std::string(20 + 37 * i, 'x'));
      r.stop.max_tokens = 10 + 7 * i;
      r.stop.stop = {i % 2 ? "lazy" : "z"};
      r.stop.ignore_eos = true;
      r.sink = sink;
      sched.add(std::move(r));
    }
    while (sched.step()) {
    }
    EXPECT_EQ(sched.kv().n_used(), 0);
    if (mode < 2) {
      EXPECT_GT(sched.n_chained(), 0u);
    }
    std::stable_sort(sink->events.begin(), sink->events.end(),
                     [](const SeqOutput& x, const SeqOutput& y) { return x.request_id < y.request_id; });
    runs.push_back(std::move(sink->events));
  }
  for (size_t m = 1; m < runs.size(); ++m) {
    ASSERT_EQ(runs[m].size(), runs[0].size()) << "mode " << m;
    for (size_t i = 0; i < runs[0].size(); ++i) {
      EXPECT_EQ(runs[m][i].tokens, runs[0][i].tokens) << "mode " << m;
      EXPECT_EQ(runs[m][i].text, runs[0][i].text) << "mode " << m;
      EXPECT_EQ(runs[m][i].finish_reason, runs[0][i].finish_reason) << "mode " << m;
    }
  }
}

// Logprobs: the null backend hands them over as a CUDA backend does (computed on the device, no
// logits), or with device_logprobs -1 returns the logits and the engine computes them; either way
// every token gets its logprob and top list, and the tokens are the same.
TEST(NullBackend, LogprobsFromTheDeviceOrTheHost) {
  std::vector<std::vector<int32_t>> tokens;
  for (int device : {20, -1}) {
    NullBackendOptions null;
    null.token_cycle = cycle_of("The quick brown fox. ");
    null.device_logprobs = device;
    NullBackend b = make_null(null, 256);
    EXPECT_EQ(b.max_device_logprobs(), device);
    SchedulerConfig sc;
    sc.check_invariants = true;
    sc.overlap = Overlap::kAuto;
    Scheduler sched(b, sc, testing::fake_decoders(), nullptr);
    auto sink = std::make_shared<testing::CollectingSink>();
    for (int i = 0; i < 4; ++i) {
      SequenceRequest r;
      r.request_id = static_cast<uint64_t>(i + 1);
      r.prompt = cycle_of(std::string(10 + 9 * i, 'y'));
      r.stop.max_tokens = 5 + i;
      r.stop.ignore_eos = true;
      r.logprobs = i == 3 ? -1 : 2 * i;  // 0, 2, 4 top tokens; the last asks for none
      r.sink = sink;
      sched.add(std::move(r));
    }
    while (sched.step()) {
    }
    std::vector<int32_t> all;
    for (const SeqOutput& e : sink->events) {
      const int want_top = e.request_id == 4 ? -1 : 2 * static_cast<int>(e.request_id - 1);
      ASSERT_EQ(e.logprobs.size(), want_top < 0 ? 0 : e.tokens.size()) << "device " << device;
      for (size_t k = 0; k < e.logprobs.size(); ++k) {
        EXPECT_EQ(e.logprobs[k].token, e.tokens[k]);
        EXPECT_EQ(static_cast<int>(e.logprobs[k].top.size()), want_top);
      }
      all.insert(all.end(), e.tokens.begin(), e.tokens.end());
    }
    tokens.push_back(all);
  }
  EXPECT_EQ(tokens[0], tokens[1]);
}

TEST(BenchEngine, RunsAndWritesRecords) {
  const std::filesystem::path tok = std::filesystem::path(MEGADECODE_SOURCE_DIR) / "data/tokenizer/qwen3";
  if (!std::filesystem::exists(tok / "tokenizer.json")) GTEST_SKIP() << "no " << tok << " (scripts/setup writes it)";
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / ("md_bench_engine_" + std::to_string(test_seed()) + ".json");
  std::vector<std::string> words = {"--batch", "1,3,65", "--context", "40", "--steps", "4", "--warmup", "1",
                                    "--json", out.string()};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(bench_engine(static_cast<int>(argv.size()), argv.data()), 0);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(printed.find("engine benchmark"), std::string::npos) << printed;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
  std::filesystem::remove(out);
  ASSERT_EQ(j["records"].size(), 3u);
  const int batches[] = {1, 3, 65};
  for (int i = 0; i < 3; ++i) {
    const nlohmann::json& r = j["records"][i];
    EXPECT_EQ(r["batch"], batches[i]);
    EXPECT_GT(r["steps_per_s"].get<double>(), 0.0);
    EXPECT_GT(r["host_us_per_step"].get<double>(), 0.0);
    EXPECT_EQ(r["steps_chained"], 4);  // the whole batch runs every measured step, overlapped
  }
  EXPECT_EQ(j["records"][2]["plan_us"].get<double>(), 0.0);  // the batched path: no plan
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--batch", "0"}, {"--context", "1"},
                                              {"--steps", "0"}, {"--device-us", "-1"}, {"--bogus", "1"},
                                              {"--logprobs", "21"}, {"--host-logprobs"}}) {
    std::vector<std::string> w = bad;
    std::vector<char*> a;
    for (std::string& s : w) a.push_back(s.data());
    EXPECT_THROW(bench_engine(static_cast<int>(a.size()), a.data()), Error) << bad[0];
  }
}

}  // namespace
}  // namespace megadecode
