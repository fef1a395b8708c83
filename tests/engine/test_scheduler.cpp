// The scheduler against the fake backend: outputs equal the reference whatever the batching,
// chunking, preemption and prefix caching did; invariants after every mutation; nothing leaks.
// sanitize: address
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "engine/scheduler.h"
#include "fakes.h"

namespace megadecode {
namespace {

using testing::CollectingSink;
using testing::FakeBackend;
using testing::fake_decoders;
using testing::fake_reference;
using testing::fake_text;
using testing::make_request;

std::pair<uint64_t, int> key(uint64_t id, int index = 0) { return {id, index}; }

std::vector<int32_t> ascii(const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); }

void run_to_idle(Scheduler& s, int max_steps = 100000) {
  for (int i = 0; i < max_steps && s.step(); ++i) {
  }
  ASSERT_TRUE(s.idle()) << "scheduler did not finish";
}

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  int n_finished = 0;
  SeqOutput last;
};

std::map<std::pair<uint64_t, int>, Result> collect(const CollectingSink& sink) {
  std::map<std::pair<uint64_t, int>, Result> out;
  for (const SeqOutput& e : sink.events) {
    Result& r = out[{e.request_id, e.index}];
    EXPECT_EQ(r.n_finished, 0) << "event after the finish of request " << e.request_id;
    r.tokens.insert(r.tokens.end(), e.tokens.begin(), e.tokens.end());
    r.text += e.text;
    if (e.finished) ++r.n_finished;
    r.last = e;
  }
  return out;
}

TEST(Scheduler, SingleGreedyRequestMatchesReference) {
  FakeBackend backend(16, 4);
  Scheduler sched(backend, SchedulerConfig{.check_invariants = true}, fake_decoders(), nullptr);
  auto sink = std::make_shared<CollectingSink>();
  auto prompt = ascii("Hello, world");
  sched.add(make_request(1, prompt, 10, sink));
  run_to_idle(sched);
  auto results = collect(*sink);
  ASSERT_EQ(results.size(), 1u);
  const Result& r = results.begin()->second;
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(r.tokens, fake_reference(prompt, greedy, 10));
  EXPECT_EQ(r.text, fake_text(r.tokens));
  EXPECT_EQ(r.n_finished, 1);
  EXPECT_EQ(r.last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(r.last.n_prompt_tokens, 12);
  EXPECT_EQ(r.last.n_completion_tokens, 10);
  EXPECT_EQ(sched.kv().n_used(), 0);
}

TEST(Scheduler, OnePromptTokenAndMaxTokensOne) {
  FakeBackend backend(4, 4);
  Scheduler sched(backend, SchedulerConfig{.check_invariants = true}, fake_decoders(), nullptr);
  auto sink = std::make_shared<CollectingSink>();
  sched.add(make_request(1, {65}, 1, sink));
  run_to_idle(sched);
  auto r = collect(*sink).begin()->second;
  EXPECT_EQ(r.tokens, fake_reference({65}, SamplingParams{.temperature = 0}, 1));
  EXPECT_EQ(backend.call_log(), "d");  // nothing to prefill: the only prompt token goes through decode
}

// Many requests, random lengths, greedy and seeded sampling, a pool small enough to force
// preemption, small prefill chunks, shared prefixes; every output must equal the reference.
TEST(Scheduler, RandomWorkloadMatchesReferenceUnderPreemption) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 6; ++round) {
    const int bs = 1 + static_cast<int>(rng.below(8));
    const int n_blocks = 80 / bs + 4 + static_cast<int>(rng.below(20));
    FakeBackend backend(n_blocks, bs);
    SchedulerConfig cfg;
    cfg.max_num_seqs = 1 + static_cast<int>(rng.below(9));
    cfg.max_prefill_tokens = 1 + static_cast<int>(rng.below(24));
    cfg.prefix_caching = rng.below(3) != 0;
    cfg.check_invariants = true;
    EngineMetrics metrics;
    Scheduler sched(backend, cfg, fake_decoders(), &metrics);
    auto sink = std::make_shared<CollectingSink>();
    std::vector<int32_t> shared = ascii("The shared system prompt. ");
    std::map<uint64_t, std::pair<std::vector<int32_t>, SamplingParams>> expected_in;
    std::map<uint64_t, int> max_tokens;
    const int n_req = 12 + static_cast<int>(rng.below(12));
    for (int i = 0; i < n_req; ++i) {
      std::vector<int32_t> prompt;
      if (rng.below(2) == 0) prompt = std::vector<int32_t>(shared.begin(), shared.begin() + rng.below(shared.size()));
      const int extra = 1 + static_cast<int>(rng.below(30));
      for (int k = 0; k < extra; ++k) prompt.push_back(32 + static_cast<int32_t>(rng.below(90)));
      // prompt + max_tokens within the pool's tokens, as the Engine requires of every request
      // (Engine::validate: its max_model_len is at most the pool); a longer one could never run.
      const int room = n_blocks * bs - static_cast<int>(prompt.size());
      ASSERT_GE(room, 1);
      const int mt = 1 + static_cast<int>(rng.below(40)) % room;
      const float temp = rng.below(2) == 0 ? 0.0f : 0.8f;
      auto req = make_request(i + 1, prompt, mt, sink, temp, rng.next());
      if (rng.below(4) == 0) req.sampling.repetition_penalty = 1.3f;
      expected_in[i + 1] = {prompt, req.sampling};
      max_tokens[i + 1] = mt;
      sched.add(std::move(req));
      // Interleave arrivals with steps so admission happens mid-flight.
      for (int k = static_cast<int>(rng.below(3)); k > 0; --k) sched.step();
    }
    run_to_idle(sched);
    auto results = collect(*sink);
    ASSERT_EQ(results.size(), static_cast<size_t>(n_req));
    for (auto& [key, r] : results) {
      auto& [prompt, sp] = expected_in[key.first];
      EXPECT_EQ(r.n_finished, 1);
      EXPECT_EQ(r.tokens, fake_reference(prompt, sp, max_tokens[key.first])) << "request " << key.first;
      EXPECT_EQ(r.text, fake_text(r.tokens));
      EXPECT_EQ(r.last.finish_reason, FinishReason::kLength);
    }
    EXPECT_EQ(sched.kv().n_used(), 0);
    EXPECT_LE(backend.max_batch(), static_cast<size_t>(cfg.max_num_seqs));
    std::printf("round %d: bs %d blocks %d seqs %d chunk %d: %llu preemptions\n", round, bs, n_blocks,
                cfg.max_num_seqs, cfg.max_prefill_tokens, static_cast<unsigned long long>(sched.n_preemptions()));
  }
}

TEST(Scheduler, PreemptionHappensWhenThePoolIsTight) {
  FakeBackend backend(6, 2);  // 12 token slots
  Scheduler sched(backend, SchedulerConfig{.max_num_seqs = 4, .check_invariants = true}, fake_decoders(), nullptr);
  auto sink = std::make_shared<CollectingSink>();
  for (int i = 0; i < 3; ++i) sched.add(make_request(i + 1, ascii(std::string(1, 'a' + i) + "b"), 9, sink));
  run_to_idle(sched);
  EXPECT_GT(sched.n_preemptions(), 0u);
  for (auto& [key, r] : collect(*sink)) {
    std::vector<int32_t> prompt = ascii(std::string(1, 'a' + static_cast<char>(key.first - 1)) + "b");
    EXPECT_EQ(r.tokens, fake_reference(prompt, SamplingParams{.temperature = 0}, 9));
  }
}

TEST(Scheduler, PrefixCacheSkipsRecomputeAndReportsCachedTokens) {
  FakeBackend backend(32, 4);
  EngineMetrics metrics;
  Scheduler sched(backend, SchedulerConfig{.check_invariants = true}, fake_decoders(), &metrics);
  auto sink = std::make_shared<CollectingSink>();
  auto prompt = ascii("0123456789abcdefghij");  // 20 tokens = 5 blocks; 19 cacheable -> 4 blocks
  sched.add(make_request(1, prompt, 3, sink));
  run_to_idle(sched);
  const size_t first = backend.n_prefill_tokens();
  EXPECT_EQ(first, 19u);
  sched.add(make_request(2, prompt, 3, sink));
  run_to_idle(sched);
  EXPECT_EQ(backend.n_prefill_tokens() - first, 3u);  // only tokens 16..18
  auto results = collect(*sink);
  EXPECT_EQ(results[key(1)].last.n_cached_tokens, 0);
  EXPECT_EQ(results[key(2)].last.n_cached_tokens, 16);
  EXPECT_EQ(results[key(1)].tokens, results[key(2)].tokens);
  EXPECT_EQ(metrics.prefix_cache_hits.load(), 16u);
}

TEST(Scheduler, ChunkedPrefillInterleavesWithDecode) {
  FakeBackend backend(64, 4);
  Scheduler sched(backend, SchedulerConfig{.max_prefill_tokens = 8, .check_invariants = true}, fake_decoders(),
                  nullptr);
  auto sink = std::make_shared<CollectingSink>();
  sched.add(make_request(1, ascii("x"), 30, sink));
  sched.step();
  sched.add(make_request(2, ascii(std::string(60, 'y')), 2, sink));
  run_to_idle(sched);
  // 59 prompt tokens in chunks of 8: 8 prefill calls, each followed by a decode of request 1.
  const std::string log = backend.call_log();
  EXPECT_EQ(std::count(log.begin(), log.end(), 'p'), 8);
  EXPECT_EQ(log.find("pp"), std::string::npos) << log;
  auto results = collect(*sink);
  EXPECT_EQ(results[key(2)].tokens, fake_reference(ascii(std::string(60, 'y')), SamplingParams{.temperature = 0}, 2));
}

// Prompts are prefilled first come, first served: each iteration's budget goes to the oldest
// prompt still being prefilled, so a later prompt's first chunk comes only after every earlier
// prompt is in, and first tokens arrive in arrival order. Queue time (arrival to the first
// computing step) and prefill time (that step to the first token) are observed once per request,
// preemption and a prompt with nothing to prefill included.
TEST(Scheduler, PromptsArePrefilledFirstComeFirstServedWithQueueAndPrefillTimes) {
  FakeBackend backend(64, 4);
  EngineMetrics metrics;
  Scheduler sched(backend, SchedulerConfig{.max_prefill_tokens = 16, .check_invariants = true}, fake_decoders(),
                  &metrics);
  auto sink = std::make_shared<CollectingSink>();
  const int lengths[] = {40, 30, 20, 1};
  for (int i = 0; i < 4; ++i)
    sched.add(make_request(static_cast<uint64_t>(i + 1), ascii(std::string(lengths[i], static_cast<char>('a' + i))),
                           3, sink));
  run_to_idle(sched);
  const std::vector<int64_t> order = backend.prefill_seqs();
  ASSERT_FALSE(order.empty());
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end())) << "a later prompt was prefilled before an earlier one ended";
  EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 3u) << "the 1-token prompt has nothing to prefill";
  std::vector<uint64_t> first_token_order;
  for (const SeqOutput& e : sink->events)
    if (!e.tokens.empty() &&
        std::find(first_token_order.begin(), first_token_order.end(), e.request_id) == first_token_order.end())
      first_token_order.push_back(e.request_id);
  // The 1-token prompt decodes from the first step, beside the prompts being prefilled.
  EXPECT_EQ(first_token_order, (std::vector<uint64_t>{4, 1, 2, 3}));
  const auto queue = metrics.request_queue_time.snapshot(), prefill = metrics.request_prefill_time.snapshot();
  EXPECT_EQ(queue.count, 4u);
  EXPECT_EQ(prefill.count, 4u);
  EXPECT_EQ(metrics.time_to_first_token.snapshot().count, 4u);
  EXPECT_GE(queue.sum, 0.0);
  EXPECT_GE(prefill.sum, 0.0);
  // TTFT = queue + prefill time, request by request, so also summed.
  EXPECT_NEAR(metrics.time_to_first_token.snapshot().sum, queue.sum + prefill.sum, 1e-6);
}

TEST(Scheduler, QueueTimeIsObservedOncePerRequestThroughPreemption) {
  FakeBackend backend(6, 4);  // 24 KV slots: three 10-token sequences growing to 22 must preempt
  EngineMetrics metrics;
  Scheduler sched(backend, SchedulerConfig{.max_prefill_tokens = 64, .check_invariants = true}, fake_decoders(),
                  &metrics);
  auto sink = std::make_shared<CollectingSink>();
  for (int i = 0; i < 3; ++i) sched.add(make_request(static_cast<uint64_t>(i + 1), ascii(std::string(10, 'q')), 12, sink));
  run_to_idle(sched);
  ASSERT_GT(sched.n_preemptions(), 0u);
  EXPECT_EQ(metrics.request_queue_time.snapshot().count, 3u);
  EXPECT_EQ(metrics.request_prefill_time.snapshot().count, 3u);
}

TEST(Scheduler, AbortFreesWaitingAndRunning) {
  FakeBackend backend(8, 4);
  Scheduler sched(backend, SchedulerConfig{.max_num_seqs = 1, .check_invariants = true}, fake_decoders(), nullptr);
  auto sink = std::make_shared<CollectingSink>();
  sched.add(make_request(1, ascii("abc"), 100, sink));
  sched.add(make_request(2, ascii("def"), 100, sink));
  for (int i = 0; i < 5; ++i) sched.step();
  EXPECT_EQ(sched.n_running(), 1);
  EXPECT_EQ(sched.n_waiting(), 1);
  sched.abort(2);
  sched.abort(1);
  sched.abort(77);  // unknown: nothing happens
  EXPECT_TRUE(sched.idle());
  EXPECT_EQ(sched.kv().n_used(), 0);
  auto results = collect(*sink);
  EXPECT_EQ(results[key(1)].last.finish_reason, FinishReason::kAbort);
  EXPECT_EQ(results[key(1)].tokens.size(), 5u);  // every step decodes once
  EXPECT_EQ(results[key(2)].last.finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(results[key(2)].tokens.empty());
}

// The gauges follow every change, not only steps: aborts that empty the scheduler (which makes
// step() return at once) bring them back to zero.
TEST(Scheduler, AbortsPublishTheGaugesWithoutAStep) {
  FakeBackend backend(16, 4);
  EngineMetrics metrics;
  Scheduler sched(backend, SchedulerConfig{.max_num_seqs = 1, .check_invariants = true}, fake_decoders(), &metrics);
  auto sink = std::make_shared<CollectingSink>();
  sched.add(make_request(1, ascii("abcdef"), 100, sink));
  sched.add(make_request(2, ascii("gh"), 100, sink));
  EXPECT_EQ(metrics.n_waiting.load(), 2);
  for (int i = 0; i < 3; ++i) sched.step();
  EXPECT_EQ(metrics.n_running.load(), 1);
  EXPECT_EQ(metrics.n_waiting.load(), 1);
  EXPECT_EQ(metrics.kv_blocks_used.load(), sched.kv().n_used());
  EXPECT_GT(metrics.kv_blocks_used.load(), 0);
  EXPECT_EQ(metrics.kv_blocks_total.load(), 16);
  sched.abort(1);
  EXPECT_EQ(metrics.n_running.load(), 0);
  EXPECT_EQ(metrics.kv_blocks_used.load(), 0);
  EXPECT_EQ(metrics.n_waiting.load(), 1);
  sched.abort(2);
  EXPECT_FALSE(sched.step());
  EXPECT_EQ(metrics.n_waiting.load(), 0);
  sched.add(make_request(3, ascii("x"), 100, sink));
  sched.step();
  EXPECT_EQ(metrics.n_running.load(), 1);
  sched.abort_all(FinishReason::kAbort, "shutdown");
  EXPECT_EQ(metrics.n_running.load(), 0);
  EXPECT_EQ(metrics.kv_blocks_used.load(), 0);
}

TEST(Scheduler, BackendErrorFailsOnlyThatStepAndFreesBlocks) {
  FakeBackend backend(16, 4);
  Scheduler sched(backend, SchedulerConfig{.check_invariants = true}, fake_decoders(), nullptr);
  auto sink = std::make_shared<CollectingSink>();
  backend.fail_on_token(7);
  sched.add(make_request(1, {65, 66, 7, 67, 68}, 5, sink));  // fails in prefill
  run_to_idle(sched);
  sched.add(make_request(2, ascii("fine"), 5, sink));
  run_to_idle(sched);
  auto results = collect(*sink);
  EXPECT_EQ(results[key(1)].last.finish_reason, FinishReason::kError);
  EXPECT_NE(results[key(1)].last.error.find("injected"), std::string::npos);
  EXPECT_EQ(results[key(2)].last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(sched.kv().n_used(), 0);
}

TEST(Scheduler, DetokenizerErrorFailsOnlyThatSequence) {
  FakeBackend backend(16, 4);
  // A decoder that throws on one byte value: the sequence whose text hits it fails, others go on.
  struct Throwing : testing::FakeDecoder {
    Throwing() : FakeDecoder(true) {}
    std::string push(int32_t t) override {
      if (t == bad) throw Error("cannot decode");
      return FakeDecoder::push(t);
    }
    int32_t bad = -1;
  };
  auto reference = fake_reference(ascii("zz"), SamplingParams{.temperature = 0}, 3);
  TextDecoderFactory decoders = [&](bool) {
    auto d = std::make_unique<Throwing>();
    d->bad = reference[1];
    return d;
  };
  Scheduler sched(backend, SchedulerConfig{.check_invariants = true}, decoders, nullptr);
  auto sink = std::make_shared<CollectingSink>();
  sched.add(make_request(1, ascii("zz"), 5, sink));
  sched.add(make_request(2, ascii("q"), 1, sink));
  run_to_idle(sched);
  auto results = collect(*sink);
  EXPECT_EQ(results[key(1)].last.finish_reason, FinishReason::kError);
  EXPECT_EQ(results[key(1)].tokens.size(), 2u);
  EXPECT_EQ(results[key(2)].n_finished, 1);
  EXPECT_EQ(sched.kv().n_used(), 0);
}

TEST(Scheduler, LogprobsMatchLogSoftmaxOfTheLogits) {
  FakeBackend backend(16, 4);
  Scheduler sched(backend, SchedulerConfig{.check_invariants = true}, fake_decoders(), nullptr);
  auto sink = std::make_shared<CollectingSink>();
  auto prompt = ascii("logprobs!");
  auto req = make_request(1, prompt, 4, sink);
  req.logprobs = 3;
  req.prompt_logprobs = true;
  sched.add(std::move(req));
  run_to_idle(sched);
  std::vector<int32_t> history = prompt;
  int n_seen = 0;
  for (const SeqOutput& e : sink->events) {
    if (e.prompt_logprobs) {
      ASSERT_EQ(e.prompt_logprobs->size(), prompt.size());
      EXPECT_FALSE((*e.prompt_logprobs)[0].has_value());
      for (size_t p = 1; p < prompt.size(); ++p) {
        auto logits = testing::fake_logits(std::span<const int32_t>(prompt).first(p));
        auto want = token_logprob(logits, prompt[p], 3);
        ASSERT_TRUE((*e.prompt_logprobs)[p].has_value());
        EXPECT_FLOAT_EQ((*e.prompt_logprobs)[p]->logprob, want.logprob);
      }
    }
    for (size_t k = 0; k < e.tokens.size(); ++k) {
      auto logits = testing::fake_logits(history);
      auto want = token_logprob(logits, e.tokens[k], 3);
      ASSERT_EQ(e.logprobs.size(), e.tokens.size());
      EXPECT_FLOAT_EQ(e.logprobs[k].logprob, want.logprob);
      ASSERT_EQ(e.logprobs[k].top.size(), 3u);
      EXPECT_EQ(e.logprobs[k].top[0].token, e.tokens[k]);  // greedy picks the top token
      EXPECT_LE(e.logprobs[k].logprob, 0.0f);
      history.push_back(e.tokens[k]);
      ++n_seen;
    }
  }
  EXPECT_EQ(n_seen, 4);
}

TEST(Scheduler, MinTokensKeepsEndTokensAway) {
  // Find a prompt whose greedy continuation hits the fake EOS early.
  std::vector<int32_t> prompt;
  int eos_at = -1;
  for (int32_t c = 33; c < 127 && eos_at < 0; ++c) {
    prompt = {c, c};
    auto ref = fake_reference(prompt, SamplingParams{.temperature = 0}, 6);
    auto it = std::find(ref.begin(), ref.end(), testing::kFakeEos);
    if (it != ref.end()) eos_at = static_cast<int>(it - ref.begin());
  }
  ASSERT_GE(eos_at, 0) << "no prompt reaches EOS in 6 tokens";
  FakeBackend backend(16, 4);
  Scheduler sched(backend, SchedulerConfig{.check_invariants = true}, fake_decoders(), nullptr);
  auto sink = std::make_shared<CollectingSink>();
  auto plain = make_request(1, prompt, 20, sink);
  plain.stop.ignore_eos = false;
  plain.stop.eos_token_ids = {testing::kFakeEos};
  auto with_min = plain;
  with_min.request_id = 2;
  with_min.stop.min_tokens = eos_at + 3;
  sched.add(std::move(plain));
  sched.add(std::move(with_min));
  run_to_idle(sched);
  auto results = collect(*sink);
  EXPECT_EQ(results[key(1)].tokens.size(), static_cast<size_t>(eos_at + 1));
  EXPECT_EQ(results[key(1)].last.finish_reason, FinishReason::kStop);
  const auto& t2 = results[key(2)].tokens;
  ASSERT_GE(t2.size(), static_cast<size_t>(eos_at + 3));
  for (int i = 0; i < eos_at + 3; ++i) EXPECT_NE(t2[i], testing::kFakeEos) << "end token before min_tokens";
}

}  // namespace
}  // namespace megadecode
