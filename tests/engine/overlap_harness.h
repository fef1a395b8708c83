// The overlapped loop's test harness, shared by the CPU tests (test_scheduler_overlap.cpp) and
// the CUDA backends' (test_overlap_gpu.cpp): random workloads of one sampling mode, a run of the
// Scheduler to the end (requests in three waves, aborts between iterations, invariants checked, no
// KV block leaked), and the comparison of two runs' events.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/scheduler.h"
#include "fakes.h"

namespace megadecode::testing {

using Key = std::pair<uint64_t, int>;

// A generator from a fresh seed, printed (MEGADECODE_SEED=... reproduces a run).
inline SplitMix64 seeded_rng() {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return SplitMix64(seed);
}

inline std::vector<int32_t> ascii(const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); }

enum class Mode { kGreedy, kTemperature, kTopK, kTopP, kMinP, kPenalties, kMinTokens, kLogprobs, kMixed };
inline const char* mode_name(Mode m) {
  const char* names[] = {"Greedy", "Temperature", "TopK", "TopP", "MinP", "Penalties", "MinTokens", "Logprobs", "Mixed"};
  return names[static_cast<int>(m)];
}

// Random requests of one sampling mode (kMixed: any), with stop strings of one or two common
// characters (they end sequences at every point of a step's text), stop tokens, the fake EOS,
// max_tokens from 1, several choices per request and shared prompt prefixes.
inline std::vector<SequenceRequest> workload(SplitMix64& rng, Mode mode, int n_requests) {
  std::vector<SequenceRequest> out;
  const std::string shared = "A shared system prompt, long enough for a block or two. ";
  const std::string common = "etaoins ";
  for (int i = 0; i < n_requests; ++i) {
    SequenceRequest r;
    r.request_id = static_cast<uint64_t>(i + 1);
    std::string text = rng.below(2) ? shared.substr(0, rng.below(shared.size())) : "";
    for (int n = 1 + static_cast<int>(rng.below(20)); n > 0; --n) text += static_cast<char>(33 + rng.below(90));
    r.prompt = ascii(text);
    const Mode m = mode == Mode::kMixed ? static_cast<Mode>(rng.below(static_cast<int>(Mode::kMixed))) : mode;
    SamplingParams& p = r.sampling;
    p.temperature = m == Mode::kGreedy ? 0.0f : 0.5f + static_cast<float>(rng.below(100)) / 100.0f;
    p.seed = rng.next();
    if (m == Mode::kTopK) p.top_k = 1 + static_cast<int>(rng.below(20));
    if (m == Mode::kTopP) p.top_p = 0.3f + static_cast<float>(rng.below(60)) / 100.0f;
    if (m == Mode::kMinP) p.min_p = static_cast<float>(rng.below(30)) / 100.0f;
    if (m == Mode::kPenalties) {
      p.repetition_penalty = 1.0f + static_cast<float>(rng.below(50)) / 100.0f;
      p.presence_penalty = static_cast<float>(rng.below(100)) / 100.0f;
      p.frequency_penalty = static_cast<float>(rng.below(100)) / 100.0f;
    }
    r.stop.max_tokens = 1 + static_cast<int>(rng.below(rng.below(4) ? 30 : 3));
    r.stop.ignore_eos = rng.below(3) == 0 && m != Mode::kMinTokens;
    r.stop.eos_token_ids = {testing::kFakeEos};
    if (m == Mode::kMinTokens) {  // end tokens honoured, and often sampled before min_tokens
      if (rng.below(2)) p.temperature = 0.0f;
      r.stop.max_tokens = 4 + static_cast<int>(rng.below(20));
      r.stop.min_tokens = 1 + static_cast<int>(rng.below(r.stop.max_tokens));
    }
    if (m == Mode::kLogprobs) r.logprobs = static_cast<int>(rng.below(4));
    if (rng.below(2)) {
      r.stop.stop.push_back(std::string(1, common[rng.below(common.size())]));
      if (rng.below(2)) r.stop.stop.push_back(std::string(1, common[rng.below(common.size())]) + common[rng.below(common.size())]);
    }
    if (rng.below(4) == 0) r.stop.stop_token_ids = {static_cast<int32_t>('a' + rng.below(26))};
    r.stop.include_stop_str_in_output = rng.below(2) == 0;
    const int n = rng.below(4) == 0 ? 2 : 1;
    for (int k = 0; k < n; ++k) {
      SequenceRequest c = r;
      c.index = k;
      c.sampling.seed += static_cast<uint64_t>(k);
      out.push_back(std::move(c));
    }
  }
  return out;
}

struct RunSetup {
  int n_blocks = 64;
  int block_size = 4;
  SchedulerConfig scheduler;
  std::map<uint64_t, int> abort_after;  // request id -> abort once it has sent this many tokens (>= 1)
  int32_t fail_on_token = -1;
};

struct Outcome {
  std::map<Key, std::vector<SeqOutput>> events;
  uint64_t generation_tokens = 0;
  uint64_t n_chained = 0;
  size_t max_in_flight = 0;
};

// Runs the requests to the end; they arrive in three waves (at iterations 0, 4 and 10).
inline Outcome run(Backend& backend, const RunSetup& setup, const std::vector<SequenceRequest>& requests) {
  EngineMetrics metrics;
  SchedulerConfig cfg = setup.scheduler;
  cfg.check_invariants = true;
  Scheduler sched(backend, cfg, fake_decoders(), &metrics);
  auto sink = std::make_shared<CollectingSink>();
  std::map<uint64_t, int> pending_aborts = setup.abort_after;
  Outcome o;
  for (int it = 0; it < 100000; ++it) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (static_cast<int>(i % 3) * (3 + static_cast<int>(i % 3)) != it) continue;
      SequenceRequest r = requests[i];
      testing::refresh_constraint(r);  // a constraint is state: each run takes a fresh one
      r.sink = sink;
      sched.add(std::move(r));
    }
    if (!sched.step() && it > 10) break;
    // Aborts come between iterations, once the sequence has sent enough tokens.
    for (auto a = pending_aborts.begin(); a != pending_aborts.end();) {
      int n_tokens = 0;
      bool finished = false;
      for (const SeqOutput& e : sink->events)
        if (e.request_id == a->first) {
          n_tokens += static_cast<int>(e.tokens.size());
          finished |= e.finished;
        }
      if (n_tokens >= a->second || finished) {
        if (!finished) sched.abort(a->first);
        a = pending_aborts.erase(a);
      } else {
        ++a;
      }
    }
  }
  EXPECT_TRUE(sched.idle());
  EXPECT_EQ(sched.kv().n_used(), 0) << "KV blocks leaked";
  sched.check_invariants();
  for (SeqOutput& e : sink->events) o.events[{e.request_id, e.index}].push_back(std::move(e));
  o.generation_tokens = metrics.generation_tokens.load();
  o.n_chained = sched.n_chained();
  return o;
}

// Every event of every sequence equal (the prefix-cache hit count depends on timing: not compared).
inline void expect_same(const Outcome& want, const Outcome& got, const std::string& what) {
  EXPECT_EQ(got.generation_tokens, want.generation_tokens) << what << ": tokens counted";
  ASSERT_EQ(got.events.size(), want.events.size()) << what;
  for (const auto& [key, w] : want.events) {
    const std::vector<SeqOutput>& g = got.events.at(key);
    const std::string who = what + ": request " + std::to_string(key.first) + "." + std::to_string(key.second);
    ASSERT_EQ(g.size(), w.size()) << who << ": event count";
    for (size_t i = 0; i < w.size(); ++i) {
      const SeqOutput &a = w[i], &b = g[i];
      ASSERT_EQ(b.tokens, a.tokens) << who << " event " << i;
      EXPECT_EQ(b.text, a.text) << who << " event " << i;
      EXPECT_EQ(b.finished, a.finished) << who << " event " << i;
      EXPECT_EQ(b.finish_reason, a.finish_reason) << who << " event " << i;
      EXPECT_EQ(b.stop_string, a.stop_string) << who << " event " << i;
      EXPECT_EQ(b.stop_token, a.stop_token) << who << " event " << i;
      EXPECT_EQ(b.n_completion_tokens, a.n_completion_tokens) << who << " event " << i;
      EXPECT_EQ(b.n_prompt_tokens, a.n_prompt_tokens) << who << " event " << i;
      EXPECT_EQ(b.error.empty(), a.error.empty()) << who << " event " << i;
      ASSERT_EQ(b.logprobs.size(), a.logprobs.size()) << who << " event " << i;
      for (size_t k = 0; k < a.logprobs.size(); ++k) {
        EXPECT_EQ(b.logprobs[k].logprob, a.logprobs[k].logprob) << who;
        ASSERT_EQ(b.logprobs[k].top.size(), a.logprobs[k].top.size()) << who;
        for (size_t j = 0; j < a.logprobs[k].top.size(); ++j) EXPECT_EQ(b.logprobs[k].top[j].token, a.logprobs[k].top[j].token);
      }
    }
  }
}

}  // namespace megadecode::testing
