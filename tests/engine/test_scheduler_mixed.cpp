// Mixed steps: while sequences decode, prompt pieces ride in their decode step
// (Backend::decode_async_mixed) instead of separate prefill calls, first come first served, as
// many prompt tokens a step as PromptShare allows; outputs equal the reference whatever the mixing.
// sanitize: address
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "engine/backend_guard.h"
#include "engine/prompt_share.h"
#include "engine/scheduler.h"
#include "fakes.h"

namespace megadecode {
namespace {

using testing::CollectingSink;
using testing::FakeBackend;
using testing::fake_decoders;
using testing::fake_reference;
using testing::make_request;

std::vector<int32_t> text(int n, char c) { return std::vector<int32_t>(n, c); }

std::map<uint64_t, std::vector<int32_t>> tokens_by_request(const CollectingSink& sink) {
  std::map<uint64_t, std::vector<int32_t>> out;
  for (const SeqOutput& e : sink.events) out[e.request_id].insert(out[e.request_id].end(), e.tokens.begin(), e.tokens.end());
  return out;
}

void run_to_idle(Scheduler& s) {
  for (int i = 0; i < 100000 && s.step(); ++i) {
  }
  ASSERT_TRUE(s.idle());
}

TEST(PromptShare, SharesTheAddedTimeTheRatioAllows) {
  PromptShare share(PromptShare::Params{.ratio = 1.5, .min_tokens = 4, .initial = 32, .weight = 0.5});
  EXPECT_EQ(share.tokens(1000), 32) << "no estimates yet";
  EXPECT_EQ(share.tokens(20), 20) << "capped by the caller's most";
  share.mixed_step(0.020, 100);  // no baseline yet: ignored
  EXPECT_EQ(share.tokens(1000), 32);
  share.plain_step(0.010);
  EXPECT_EQ(share.tokens(1000), 32) << "no per-token cost yet";
  share.mixed_step(0.020, 100);  // 0.1 ms a prompt token over a 10 ms step
  EXPECT_DOUBLE_EQ(share.seconds_per_token(), 1e-4);
  EXPECT_EQ(share.tokens(1000), 50) << "(1.5 - 1) x 10 ms / 0.1 ms";
  share.mixed_step(0.040, 100);  // 0.3 ms a token: the average moves halfway, to 0.2 ms
  EXPECT_EQ(share.tokens(1000), 25);
  share.plain_step(0.030);  // the baseline moves halfway too, to 20 ms
  EXPECT_EQ(share.tokens(1000), 50);
  for (int i = 0; i < 40; ++i) share.mixed_step(10.0, 1);  // a prompt token costs seconds: the floor holds
  EXPECT_EQ(share.tokens(1000), 4);
  EXPECT_EQ(share.tokens(2), 2);
}

// A long prompt arriving while a stream decodes: no separate prefill call while the stream runs,
// the stream gets a token every step, no step carries more prompt tokens than the backend takes,
// and every output equals the reference.
TEST(SchedulerMixed, PromptRidesInTheStreamsStepsAndOutputsMatch) {
  FakeBackend backend(128, 4);
  backend.set_mixed_prompt_rows(24);
  Scheduler sched(backend, SchedulerConfig{.max_prefill_tokens = 2048, .check_invariants = true}, fake_decoders(),
                  nullptr);
  auto sink = std::make_shared<CollectingSink>();
  sched.add(make_request(1, text(5, 'a'), 80, sink));
  sched.step();  // request 1 alone: its prompt runs as a prefill call, its first token is decoded
  const size_t log0 = backend.call_log().size();
  sched.add(make_request(2, text(201, 'b'), 4, sink));
  run_to_idle(sched);
  const std::string log = backend.call_log().substr(log0);
  // Every prefill call of request 2 is one of a mixed step's pieces ('m' then its 'p's, then 'd').
  for (size_t i = 0; i < log.size(); ++i)
    if (log[i] == 'p') {
      size_t j = i;
      while (j > 0 && log[j - 1] == 'p') --j;
      ASSERT_TRUE(j > 0 && log[j - 1] == 'm') << "a separate prefill call while a stream decodes: " << log;
    }
  int carried = 0;
  for (const auto& step : backend.mixed_steps()) {
    ASSERT_EQ(step.size(), 1u);
    EXPECT_LE(step[0].second, 24);
    carried += step[0].second;
  }
  EXPECT_EQ(carried, 200) << "the whole prompt but its last token, which decodes";
  EXPECT_GE(backend.mixed_steps().size(), 200u / 24u);
  const auto out = tokens_by_request(*sink);
  EXPECT_EQ(out.at(1), fake_reference(text(5, 'a'), SamplingParams{.temperature = 0}, 80));
  EXPECT_EQ(out.at(2), fake_reference(text(201, 'b'), SamplingParams{.temperature = 0}, 4));
  EXPECT_EQ(sched.kv().n_used(), 0);
}

// Two prompts arriving during decoding are carried first come, first served: the later prompt's
// first piece comes in the step the earlier prompt's last piece does, or after.
TEST(SchedulerMixed, PromptsAreCarriedFirstComeFirstServed) {
  FakeBackend backend(256, 4);
  backend.set_mixed_prompt_rows(16);
  Scheduler sched(backend, SchedulerConfig{.check_invariants = true}, fake_decoders(), nullptr);
  auto sink = std::make_shared<CollectingSink>();
  sched.add(make_request(1, text(3, 'a'), 60, sink));
  sched.step();
  sched.add(make_request(2, text(50, 'b'), 2, sink));
  sched.add(make_request(3, text(41, 'c'), 2, sink));
  run_to_idle(sched);
  const auto steps = backend.mixed_steps();
  ASSERT_FALSE(steps.empty());
  bool later_started = false;
  int from2 = 0, from3 = 0;
  for (const auto& step : steps) {
    int total = 0;
    for (size_t i = 0; i < step.size(); ++i) {
      total += step[i].second;
      if (i > 0) {
        EXPECT_LT(step[i - 1].first, step[i].first) << "pieces out of arrival order";
      }
    }
    EXPECT_LE(total, 16);
    for (const auto& [seq, n] : step) {
      if (seq == 2) {
        EXPECT_FALSE(later_started) << "request 2 carried after request 3 began";
        from2 += n;
      } else {
        from3 += n;
      }
    }
    for (const auto& [seq, n] : step) {
      if (seq == 3) later_started = true;
    }
  }
  EXPECT_EQ(from2, 49);
  EXPECT_EQ(from3, 40);
  const auto out = tokens_by_request(*sink);
  EXPECT_EQ(out.at(2), fake_reference(text(50, 'b'), SamplingParams{.temperature = 0}, 2));
  EXPECT_EQ(out.at(3), fake_reference(text(41, 'c'), SamplingParams{.temperature = 0}, 2));
}

// A mixed step that fails ends its rows and its pieces' sequences with the error and frees their
// blocks; the scheduler goes on with the next request.
TEST(SchedulerMixed, AFailedMixedStepEndsItsRowsAndPieces) {
  FakeBackend backend(64, 4);
  backend.set_mixed_prompt_rows(8);
  Scheduler sched(backend, SchedulerConfig{.check_invariants = true}, fake_decoders(), nullptr);
  auto sink = std::make_shared<CollectingSink>();
  sched.add(make_request(1, text(3, 'a'), 40, sink));
  sched.step();
  std::vector<int32_t> bad = text(30, 'b');
  bad[20] = 7;  // the fake fails on this token: in a piece of a mixed step
  backend.fail_on_token(7);
  sched.add(make_request(2, bad, 3, sink));
  run_to_idle(sched);
  std::set<uint64_t> errors;
  for (const SeqOutput& e : sink->events)
    if (e.finished && e.finish_reason == FinishReason::kError) errors.insert(e.request_id);
  EXPECT_EQ(errors, (std::set<uint64_t>{1, 2}));
  EXPECT_EQ(sched.kv().n_used(), 0);
  backend.fail_on_token(-1);
  sched.add(make_request(3, text(9, 'c'), 3, sink));
  run_to_idle(sched);
  EXPECT_EQ(tokens_by_request(*sink).at(3), fake_reference(text(9, 'c'), SamplingParams{.temperature = 0}, 3));
}

// First come, first served between prompts and streams: prompts that arrived before every
// stream's first token (a burst) are prefilled in separate calls at the full budget; a prompt that
// arrived after a stream was already generating rides in its steps, only the share PromptShare
// allows (at most its initial 64 or the measured one).
TEST(SchedulerMixed, OnlyPromptsArrivingMidStreamRideAndAreBounded) {
  FakeBackend backend(512, 4);
  backend.set_mixed_prompt_rows(200);
  // A ratio barely over 1: the bounded share is its floor (16) once measured, 64 before.
  Scheduler sched(backend,
                  SchedulerConfig{.max_prefill_tokens = 1000, .check_invariants = true, .mixed_itl_ratio = 1.000001},
                  fake_decoders(), nullptr);
  auto sink = std::make_shared<CollectingSink>();
  sched.add(make_request(1, text(1, 'a'), 40, sink));   // decodes from the first step
  sched.add(make_request(2, text(601, 'b'), 2, sink));  // arrived with it: separate prefill calls
  sched.step();
  sched.step();
  sched.add(make_request(3, text(301, 'c'), 2, sink));  // arrives while request 1 generates
  run_to_idle(sched);
  const std::vector<int64_t> prefilled = backend.prefill_seqs();
  int n3 = 0;
  for (const auto& step : backend.mixed_steps())
    for (const auto& [seq, n] : step) {
      EXPECT_EQ(seq, 3) << "only the prompt that arrived mid-stream rides";
      EXPECT_LE(n, 64) << "a prompt arriving mid-stream rode more than the bounded share";
      n3 += n;
    }
  EXPECT_EQ(n3, 300);
  EXPECT_EQ(backend.n_prefill_tokens(), 600u + 300u) << "request 2's 600 in calls, request 3's 300 as pieces";
  EXPECT_EQ(prefilled.front(), 2);
  const auto out = tokens_by_request(*sink);
  EXPECT_EQ(out.at(2), fake_reference(text(601, 'b'), SamplingParams{.temperature = 0}, 2));
  EXPECT_EQ(out.at(3), fake_reference(text(301, 'c'), SamplingParams{.temperature = 0}, 2));
}

// The engine's guard passes mixed steps through as mixed steps (a wrapper that did not would
// silently turn them back into separate prefill calls), and a failed one marks the backend failed.
TEST(SchedulerMixed, TheBackendGuardForwardsMixedSteps) {
  FakeBackend backend(64, 4);
  backend.set_mixed_prompt_rows(8);
  BackendGuard guard(backend);
  EXPECT_EQ(guard.max_mixed_prompt_rows(), 8);
  Scheduler sched(guard, SchedulerConfig{.check_invariants = true}, fake_decoders(), nullptr);
  auto sink = std::make_shared<CollectingSink>();
  sched.add(make_request(1, text(3, 'a'), 20, sink));
  sched.step();
  sched.add(make_request(2, text(30, 'b'), 2, sink));
  run_to_idle(sched);
  EXPECT_FALSE(backend.mixed_steps().empty());
  EXPECT_FALSE(guard.failed());
  backend.fail_on_token(7);
  std::vector<int32_t> bad = text(20, 'c');
  bad[5] = 7;
  sched.add(make_request(3, text(3, 'a'), 20, sink));
  sched.step();
  sched.add(make_request(4, bad, 2, sink));
  run_to_idle(sched);
  EXPECT_TRUE(guard.failed());
  EXPECT_NE(guard.failure().find("mixed step"), std::string::npos) << guard.failure();
}

// Asynchronous steps pass through the guard as such (the base defaults would run each one
// synchronously, and the overlapped loop would never overlap a GPU backend), and a failure that
// surfaces when a step is collected counts like one at its launch.
TEST(SchedulerMixed, TheBackendGuardForwardsAsynchronousSteps) {
  testing::DeferredFakeBackend backend(64, 4);
  BackendGuard guard(backend);
  ASSERT_TRUE(guard.runs_async());
  Scheduler sched(guard, SchedulerConfig{.check_invariants = true, .overlap = Overlap::kAuto}, fake_decoders(),
                  nullptr);
  auto sink = std::make_shared<CollectingSink>();
  for (uint64_t id = 1; id <= 3; ++id) sched.add(make_request(id, text(4, 'a'), 12, sink));
  run_to_idle(sched);
  EXPECT_EQ(backend.max_in_flight(), 2u) << "the guard did not hand the steps to the backend's decode_async";
  EXPECT_EQ(tokens_by_request(*sink).size(), 3u);
  EXPECT_FALSE(guard.failed());
  sched.add(make_request(4, text(4, 'b'), 12, sink));
  for (int i = 0; i < 3; ++i) sched.step();  // the prompt, then steps in flight
  backend.fail_every_call();                 // the queued steps fail when collected
  run_to_idle(sched);
  EXPECT_TRUE(guard.failed());
  EXPECT_NE(guard.failure().find("decode step"), std::string::npos) << guard.failure();
}

TEST(SchedulerMixed, TheStepLineShowsAMixedStepsPromptTokens) {
  StepTimes t;
  t.step = 3;
  t.batch = 8;
  EXPECT_NE(step_line(t).find("step 3 batch 8 | host"), std::string::npos) << step_line(t);
  t.mixed_tokens = 16;
  EXPECT_NE(step_line(t).find("step 3 batch 8 + 16 prompt | host"), std::string::npos) << step_line(t);
}

// Random arrivals, prompt lengths, sampling, block sizes, mixed capacities and pool sizes
// (preemption included): every output equals the reference.
TEST(SchedulerMixed, RandomWorkloadMatchesReference) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 6; ++round) {
    const int bs = 1 + static_cast<int>(rng.below(8));
    FakeBackend backend(120 / bs + 4 + static_cast<int>(rng.below(30)), bs);
    backend.set_mixed_prompt_rows(1 + static_cast<int>(rng.below(40)));
    SchedulerConfig cfg;
    cfg.max_num_seqs = 1 + static_cast<int>(rng.below(8));
    cfg.max_prefill_tokens = 1 + static_cast<int>(rng.below(48));
    cfg.check_invariants = true;
    Scheduler sched(backend, cfg, fake_decoders(), nullptr);
    auto sink = std::make_shared<CollectingSink>();
    std::map<uint64_t, std::tuple<std::vector<int32_t>, SamplingParams, int>> expected;
    const int n = 10 + static_cast<int>(rng.below(10));
    for (int i = 0; i < n; ++i) {
      std::vector<int32_t> prompt;
      for (int k = 1 + static_cast<int>(rng.below(60)); k > 0; --k) prompt.push_back(32 + static_cast<int32_t>(rng.below(90)));
      const int mt = 1 + static_cast<int>(rng.below(30));
      auto r = make_request(i + 1, prompt, mt, sink, rng.below(2) == 0 ? 0.0f : 0.8f, rng.next());
      expected[i + 1] = {prompt, r.sampling, mt};
      sched.add(std::move(r));
      for (int k = static_cast<int>(rng.below(4)); k > 0; --k) sched.step();
    }
    run_to_idle(sched);
    const auto out = tokens_by_request(*sink);
    ASSERT_EQ(out.size(), static_cast<size_t>(n));
    for (const auto& [id, e] : expected)
      EXPECT_EQ(out.at(id), fake_reference(std::get<0>(e), std::get<1>(e), std::get<2>(e))) << "round " << round
                                                                                            << " request " << id;
    EXPECT_EQ(sched.kv().n_used(), 0);
    std::printf("round %d: %zu mixed steps, %llu preemptions\n", round, backend.mixed_steps().size(),
                static_cast<unsigned long long>(sched.n_preemptions()));
  }
}

}  // namespace
}  // namespace megadecode
