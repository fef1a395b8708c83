// The overlapped loop (Scheduler with Overlap) against the plain one: the same events for
// every sequence (tokens, text, logprobs, finish reason, stop string, counts) and the same tokens
// counted, for every sampling mode, stop strings and end tokens that end a sequence while its next
// step runs, max_tokens, min_tokens, aborts after a given token, preemption and backend failures;
// on the fake backend run synchronously (Overlap::kAlways), on the deferred fake whose steps run
// late as on a GPU stream, and on cpu-ref with the tiny model. Invariants after every mutation; no
// KV block leaks.
// sanitize: address
#include <gtest/gtest.h>

#include <map>

#include "engine/scheduler.h"
#include "fakes.h"
#include "model/loader.h"
#include "overlap_harness.h"
#include "ref/ref_backend.h"

namespace megadecode {
namespace {

using testing::CollectingSink;
using testing::DeferredFakeBackend;
using testing::FakeBackend;
using testing::fake_decoders;
using testing::Mode;
using testing::Outcome;
using testing::RunSetup;
using testing::expect_same;
using testing::mode_name;
using testing::run;
using testing::seeded_rng;
using testing::workload;
using testing::ascii;


// How much the overlapped loops overlapped, summed over workloads: a test that expects overlap
// fails when it never happened.
struct Overlapped {
  uint64_t n_chained = 0;         // the fewer of the two overlapped loops'
  bool two_in_flight = false;  // the deferred backend held two steps at once
};

// The three loops on one workload: plain, overlapped on the synchronous fake, overlapped on the
// deferred fake. Returns the plain outcome.
Outcome check_loops(const RunSetup& base, const std::vector<SequenceRequest>& requests, const std::string& what,
                    Overlapped* overlapped = nullptr) {
  RunSetup plain = base, sync = base, deferred = base;
  plain.scheduler.overlap = Overlap::kOff;
  sync.scheduler.overlap = Overlap::kAlways;
  deferred.scheduler.overlap = Overlap::kAuto;
  FakeBackend b0(base.n_blocks, base.block_size), b1(base.n_blocks, base.block_size);
  DeferredFakeBackend b2(base.n_blocks, base.block_size);
  for (FakeBackend* b : {&b0, &b1, static_cast<FakeBackend*>(&b2)}) b->fail_on_token(base.fail_on_token);
  const Outcome want = run(b0, plain, requests);
  EXPECT_EQ(want.n_chained, 0u);
  const Outcome got_sync = run(b1, sync, requests);
  expect_same(want, got_sync, what + " (overlap, synchronous backend)");
  const Outcome got_deferred = run(b2, deferred, requests);
  expect_same(want, got_deferred, what + " (overlap, deferred backend)");
  EXPECT_LE(b2.max_in_flight(), 2u) << what;
  if (overlapped != nullptr) {
    overlapped->n_chained += std::min(got_sync.n_chained, got_deferred.n_chained);
    overlapped->two_in_flight |= b2.max_in_flight() == 2;
  }
  return want;
}

class OverlapSamplingModes : public ::testing::TestWithParam<Mode> {};

TEST_P(OverlapSamplingModes, SameOutputsAsThePlainLoop) {
  SplitMix64 rng = seeded_rng();
  Overlapped overlapped;
  for (int round = 0; round < 4; ++round) {
    RunSetup s;
    s.block_size = 1 + static_cast<int>(rng.below(6));
    s.n_blocks = 200 / s.block_size + static_cast<int>(rng.below(100));
    s.scheduler.max_num_seqs = 1 + static_cast<int>(rng.below(8));
    s.scheduler.max_prefill_tokens = 1 + static_cast<int>(rng.below(40));
    s.scheduler.prefix_caching = rng.below(3) != 0;
    const std::vector<SequenceRequest> reqs = workload(rng, GetParam(), 3 + static_cast<int>(rng.below(8)));
    check_loops(s, reqs, std::string(mode_name(GetParam())) + " round " + std::to_string(round), &overlapped);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Penalties need the host to sample (and min_tokens to resample) between steps: such rows are
  // chained only once they are past min_tokens, or never.
  if (GetParam() != Mode::kPenalties) {
    EXPECT_GT(overlapped.n_chained, 0u) << "the overlapped loops never chained a step";
    EXPECT_TRUE(overlapped.two_in_flight) << "two steps were never in flight together";
  }
}

INSTANTIATE_TEST_SUITE_P(Scheduler, OverlapSamplingModes,
                         ::testing::Values(Mode::kGreedy, Mode::kTemperature, Mode::kTopK, Mode::kTopP, Mode::kMinP,
                                           Mode::kPenalties, Mode::kMinTokens, Mode::kLogprobs, Mode::kMixed),
                         [](const ::testing::TestParamInfo<Mode>& p) { return std::string(mode_name(p.param)); });

// Logprobs a backend computes itself (a GPU's row_logprobs): the engine asks that backend for no
// logits, and the events are those of the engine's own computation from the logits, in the plain
// and the overlapped loop.
TEST(SchedulerOverlap, LogprobsFromTheBackend) {
  SplitMix64 rng = seeded_rng();
  for (int round = 0; round < 3; ++round) {
    RunSetup s;
    s.block_size = 1 + static_cast<int>(rng.below(6));
    s.n_blocks = 300 / s.block_size;
    s.scheduler.max_num_seqs = 1 + static_cast<int>(rng.below(6));
    const std::vector<SequenceRequest> reqs = workload(rng, Mode::kLogprobs, 4 + static_cast<int>(rng.below(5)));
    FakeBackend host(s.n_blocks, s.block_size), device(s.n_blocks, s.block_size), chained(s.n_blocks, s.block_size);
    device.set_device_logprobs(20);
    chained.set_device_logprobs(20);
    s.scheduler.overlap = Overlap::kOff;
    const Outcome want = run(host, s, reqs);
    const Outcome got = run(device, s, reqs);
    s.scheduler.overlap = Overlap::kAlways;
    const Outcome got_chained = run(chained, s, reqs);
    const std::string what = "round " + std::to_string(round);
    expect_same(want, got, what + ", plain loop");
    expect_same(want, got_chained, what + ", overlapped loop");
    size_t n_logprobs = 0;
    for (const auto& [key, events] : want.events)
      for (const SeqOutput& e : events) n_logprobs += e.logprobs.size();
    if (n_logprobs > 0) {
      EXPECT_GT(host.n_logit_steps(), 0u) << what;
    }
    EXPECT_EQ(device.n_logit_steps(), 0u) << what;
    EXPECT_EQ(chained.n_logit_steps(), 0u) << what;
  }
}

// A pool small enough to preempt: chaining stops where a row has no next block, the plain step
// preempts, and the outputs stay the plain loop's.
TEST(SchedulerOverlap, PreemptionUnderOverlap) {
  SplitMix64 rng = seeded_rng();
  for (int round = 0; round < 6; ++round) {
    RunSetup s;
    s.block_size = 1 + static_cast<int>(rng.below(4));
    s.scheduler.max_num_seqs = 2 + static_cast<int>(rng.below(6));
    s.scheduler.max_prefill_tokens = 1 + static_cast<int>(rng.below(16));
    const std::vector<SequenceRequest> reqs = workload(rng, Mode::kMixed, 8);
    // Room for the longest sequence alone (as the engine's max_model_len guarantees), little more.
    int most = 0;
    for (const SequenceRequest& r : reqs)
      most = std::max(most, static_cast<int>(r.prompt.size()) + r.stop.max_tokens + 1);
    s.n_blocks = (most + s.block_size - 1) / s.block_size + static_cast<int>(rng.below(6));
    check_loops(s, reqs, "round " + std::to_string(round));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// A stop string that ends the sequence in the middle of a token's text while its next step runs:
// that step's token is computed and dropped (one more decode call than the plain loop), never
// sent, never counted.
TEST(SchedulerOverlap, StopStringInTheMiddleOfAStepDropsTheChainedToken) {
  const std::vector<int32_t> prompt = ascii("Once upon a time");
  const std::vector<int32_t> ref = testing::fake_reference(prompt, SamplingParams{.temperature = 0}, 12);
  const std::string text = testing::fake_text(ref);
  SequenceRequest r;
  r.request_id = 1;
  r.prompt = prompt;
  r.sampling.temperature = 0.0f;
  r.stop.max_tokens = 12;
  r.stop.ignore_eos = true;
  r.stop.stop = {text.substr(5, 2)};  // ends inside the 7th token's text at the latest
  RunSetup s;
  FakeBackend plain_backend(s.n_blocks, s.block_size);
  DeferredFakeBackend deferred_backend(s.n_blocks, s.block_size);
  RunSetup plain = s;
  plain.scheduler.overlap = Overlap::kOff;
  const Outcome want = run(plain_backend, plain, {r});
  const Outcome got = run(deferred_backend, s, {r});
  expect_same(want, got, "stop string");
  const SeqOutput& last = want.events.at({1, 0}).back();
  EXPECT_EQ(last.finish_reason, FinishReason::kStop);
  EXPECT_EQ(last.stop_string, text.substr(5, 2));
  const std::string p = plain_backend.call_log(), d = deferred_backend.call_log();
  EXPECT_EQ(std::count(d.begin(), d.end(), 'd'), std::count(p.begin(), p.end(), 'd') + 1) << p << " vs " << d;
}

// An end token sampled before min_tokens is replaced on the host: the row is not chained until it
// is past min_tokens (its next input is the host's token, not the backend's), then it is.
TEST(SchedulerOverlap, MinTokensResamplesBeforeChaining) {
  std::vector<int32_t> prompt;
  int eos_at = -1;
  for (int32_t c = 33; c < 127 && eos_at < 0; ++c) {
    prompt = {c, c};
    auto ref = testing::fake_reference(prompt, SamplingParams{.temperature = 0}, 6);
    auto it = std::find(ref.begin(), ref.end(), testing::kFakeEos);
    if (it != ref.end()) eos_at = static_cast<int>(it - ref.begin());
  }
  ASSERT_GE(eos_at, 0) << "no prompt reaches EOS in 6 tokens";
  SequenceRequest r;
  r.request_id = 1;
  r.prompt = prompt;
  r.sampling.temperature = 0.0f;
  r.stop.max_tokens = eos_at + 12;
  r.stop.min_tokens = eos_at + 3;
  r.stop.eos_token_ids = {testing::kFakeEos};
  Overlapped overlapped;
  const Outcome o = check_loops(RunSetup{}, {r}, "min_tokens", &overlapped);
  std::vector<int32_t> tokens;
  for (const SeqOutput& e : o.events.at({1, 0})) tokens.insert(tokens.end(), e.tokens.begin(), e.tokens.end());
  ASSERT_GE(tokens.size(), static_cast<size_t>(eos_at + 3));
  EXPECT_NE(tokens[eos_at], testing::kFakeEos) << "the end token was not replaced";
  EXPECT_GT(overlapped.n_chained, 0u);
}

// Aborts (a client's disconnect) after a given number of tokens: the token of the step in flight
// is dropped, the blocks freed, and every sequence's events are the plain loop's.
TEST(SchedulerOverlap, AbortsAfterTheKthToken) {
  SplitMix64 rng = seeded_rng();
  for (int round = 0; round < 6; ++round) {
    RunSetup s;
    s.scheduler.max_num_seqs = 1 + static_cast<int>(rng.below(8));
    std::vector<SequenceRequest> reqs = workload(rng, Mode::kMixed, 8);
    // An abort ends every choice of a request: requests of one choice only, so that "after the
    // k-th token" names one point of one sequence in either loop.
    std::map<uint64_t, int> n_choices;
    for (const SequenceRequest& r : reqs) ++n_choices[r.request_id];
    for (const auto& [id, n] : n_choices)
      if (n == 1 && rng.below(2)) s.abort_after[id] = 1 + static_cast<int>(rng.below(6));
    const Outcome o = check_loops(s, reqs, "round " + std::to_string(round));
    int n_aborted = 0;
    for (const auto& [key, events] : o.events) n_aborted += events.back().finish_reason == FinishReason::kAbort;
    std::printf("round %d: %d sequences aborted\n", round, n_aborted);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// A backend failure in a step: the step's rows end with an error in both loops, whatever was in
// flight; nothing leaks.
TEST(SchedulerOverlap, BackendFailureInAChainedStep) {
  const std::vector<int32_t> prompt = ascii("failure ahead");
  const std::vector<int32_t> ref = testing::fake_reference(prompt, SamplingParams{.temperature = 0}, 8);
  RunSetup s;
  s.fail_on_token = ref[4];  // the step whose input is the 5th token fails
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 3; ++i) {
    SequenceRequest r;
    r.request_id = static_cast<uint64_t>(i + 1);
    r.prompt = i == 0 ? prompt : ascii("other " + std::to_string(i));
    r.sampling.temperature = 0.0f;
    r.stop.max_tokens = 8;
    r.stop.ignore_eos = true;
    reqs.push_back(r);
  }
  const Outcome o = check_loops(s, reqs, "failure");
  EXPECT_EQ(o.events.at({1, 0}).back().finish_reason, FinishReason::kError);
}

// cpu-ref on the tiny model: the default decode_async (run at launch) chained by the overlapped
// loop gives the plain loop's tokens.
TEST(SchedulerOverlap, CpuRefTinyModel) {
  SplitMix64 rng = seeded_rng();
  auto model = std::make_shared<LoadedModel>(synthetic_model("tiny", 3));
  BackendOptions opt;
  opt.kv_block_size = 4;
  opt.n_kv_blocks = 128;
  opt.n_threads = 2;
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    SequenceRequest r;
    r.request_id = static_cast<uint64_t>(i + 1);
    for (int n = 2 + static_cast<int>(rng.below(10)); n > 0; --n)
      r.prompt.push_back(static_cast<int32_t>(rng.below(model->config.vocab_size)));
    const Mode m = static_cast<Mode>(i % 5);  // greedy, temperature, top-k, top-p, min-p
    r.sampling.temperature = m == Mode::kGreedy ? 0.0f : 0.9f;
    r.sampling.seed = rng.next();
    if (m == Mode::kTopK) r.sampling.top_k = 5;
    if (m == Mode::kTopP) r.sampling.top_p = 0.7f;
    if (m == Mode::kMinP) r.sampling.min_p = 0.05f;
    r.stop.max_tokens = 3 + static_cast<int>(rng.below(8));
    r.stop.ignore_eos = true;
    reqs.push_back(r);
  }
  Outcome outs[2];
  for (int k = 0; k < 2; ++k) {
    ref::RefBackend backend(model->config, model->weights, model, opt);
    RunSetup s;
    s.scheduler.overlap = k == 0 ? Overlap::kOff : Overlap::kAlways;
    outs[k] = run(backend, s, reqs);
  }
  expect_same(outs[0], outs[1], "cpu-ref");
  EXPECT_GT(outs[1].n_chained, 0u);
}

// Token constraints (structured output): a constrained row's mask depends on the token its step
// samples, so it never chains; the overlapped loops give the plain loop's events, every constrained
// token was sampled under its mask (none in a chained row), and the unconstrained rows of later
// waves still chain.
std::vector<SequenceRequest> constrained_workload(SplitMix64& rng, int vocab, std::vector<int32_t> end_tokens) {
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 9; ++i) {
    SequenceRequest r;
    r.request_id = static_cast<uint64_t>(i + 1);
    for (int n = 1 + static_cast<int>(rng.below(12)); n > 0; --n) r.prompt.push_back(static_cast<int32_t>(33 + rng.below(90)));
    r.sampling.temperature = rng.below(2) ? 0.0f : 0.8f;
    r.sampling.seed = rng.next();
    if (rng.below(3) == 0) r.sampling.top_k = 1 + static_cast<int>(rng.below(10));
    r.stop.max_tokens = 1 + static_cast<int>(rng.below(20));
    r.stop.eos_token_ids = end_tokens;
    if (rng.below(4) == 0) r.stop.min_tokens = static_cast<int>(rng.below(r.stop.max_tokens));
    if (i % 3 != 2) {  // two in three constrained: the third wave (i % 3 == 2) runs free and chains
      testing::RandomSetConstraint::Options o;
      o.vocab = vocab;
      o.seed = rng.next();
      o.density = 0.02f + static_cast<float>(rng.below(60)) / 100.0f;
      o.n_tokens = 1 + static_cast<int>(rng.below(25));
      o.accepting_from = static_cast<int>(rng.below(10));
      o.end_tokens = end_tokens;
      r.constraint = std::make_shared<testing::RandomSetConstraint>(o);
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// The generated tokens of the constrained requests, summed; none ended with an error.
size_t constrained_tokens(const Outcome& o, const std::vector<SequenceRequest>& reqs) {
  size_t n = 0;
  for (const SequenceRequest& r : reqs) {
    if (!r.constraint) continue;
    for (const SeqOutput& e : o.events.at({r.request_id, 0})) {
      n += e.tokens.size();
      EXPECT_TRUE(e.error.empty()) << "request " << r.request_id << ": " << e.error;
    }
  }
  return n;
}

TEST(SchedulerOverlap, ConstrainedRowsNeverChain) {
  SplitMix64 rng = seeded_rng();
  uint64_t chained = 0;
  for (int round = 0; round < 6; ++round) {
    const std::vector<SequenceRequest> reqs =
        constrained_workload(rng, testing::kFakeVocab, {testing::kFakeEos, testing::kFakeImEnd});
    RunSetup plain, sync, deferred;
    plain.scheduler.overlap = Overlap::kOff;
    sync.scheduler.overlap = Overlap::kAlways;
    for (RunSetup* s : {&plain, &sync, &deferred}) s->scheduler.max_num_seqs = 1 + static_cast<int>(round % 4) * 2;
    FakeBackend b0(plain.n_blocks, plain.block_size), b1(plain.n_blocks, plain.block_size);
    DeferredFakeBackend b2(plain.n_blocks, plain.block_size);
    const Outcome want = run(b0, plain, reqs);
    const Outcome got_sync = run(b1, sync, reqs);
    const Outcome got_deferred = run(b2, deferred, reqs);
    const std::string what = "round " + std::to_string(round);
    expect_same(want, got_sync, what + " (overlap, synchronous backend)");
    expect_same(want, got_deferred, what + " (overlap, deferred backend)");
    const size_t n = constrained_tokens(want, reqs);
    EXPECT_GT(n, 0u);
    EXPECT_EQ(b0.n_masked_rows(), n) << what;
    EXPECT_EQ(b1.n_masked_rows(), n) << what << ": a constrained row was chained";
    EXPECT_EQ(b2.n_masked_rows(), n) << what << ": a constrained row was chained";
    chained += std::min(got_sync.n_chained, got_deferred.n_chained);
  }
  EXPECT_GT(chained, 0u) << "the unconstrained rows never chained";
}

// The same on cpu-ref with the tiny model (its default decode_async): the overlapped loop's tokens
// are the plain loop's, and every constrained token passed its constraint's accept().
TEST(SchedulerOverlap, CpuRefTinyModelConstrained) {
  SplitMix64 rng = seeded_rng();
  auto model = std::make_shared<LoadedModel>(synthetic_model("tiny", 3));
  BackendOptions opt;
  opt.kv_block_size = 4;
  opt.n_kv_blocks = 256;
  opt.n_threads = 2;
  const std::vector<SequenceRequest> reqs = constrained_workload(rng, model->config.vocab_size, {1, 2});
  Outcome outs[2];
  for (int k = 0; k < 2; ++k) {
    ref::RefBackend backend(model->config, model->weights, model, opt);
    RunSetup s;
    s.n_blocks = opt.n_kv_blocks;
    s.block_size = opt.kv_block_size;
    s.scheduler.overlap = k == 0 ? Overlap::kOff : Overlap::kAlways;
    outs[k] = run(backend, s, reqs);
  }
  expect_same(outs[0], outs[1], "cpu-ref, constrained");
  EXPECT_GT(constrained_tokens(outs[0], reqs), 0u);
}

}  // namespace
}  // namespace megadecode
