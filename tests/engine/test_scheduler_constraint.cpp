// The scheduler driving token constraints (structured output, engine/token_constraint.h) on the
// fake backend with a test-double constraint: every token is one the constraint's mask allowed
// (equal to a reference that samples under the same masks), a finished constraint ends the
// sequence with "stop", max_tokens first gives "length" with the partial text, the end tokens end
// it when the mask allows them, min_tokens bans them unless the mask allows nothing else, a mask
// that allows everything changes no token, and a token the constraint refuses (a backend bug) ends
// the sequence with an error naming the backend.
// sanitize: address
#include <gtest/gtest.h>

#include <map>

#include "engine/scheduler.h"
#include "fakes.h"

namespace megadecode {
namespace {

using testing::CollectingSink;
using testing::FakeBackend;
using testing::fake_decoders;
using testing::RandomSetConstraint;

std::vector<int32_t> ascii(const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); }

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  int n_finished = 0;
  SeqOutput last;
};

std::map<uint64_t, Result> run(FakeBackend& backend, std::vector<SequenceRequest> requests, int max_num_seqs = 4) {
  Scheduler sched(backend, SchedulerConfig{.max_num_seqs = max_num_seqs, .check_invariants = true}, fake_decoders(),
                  nullptr);
  auto sink = std::make_shared<CollectingSink>();
  for (SequenceRequest& r : requests) {
    r.sink = sink;
    sched.add(std::move(r));
  }
  for (int i = 0; i < 100000 && sched.step(); ++i) {
  }
  EXPECT_TRUE(sched.idle());
  EXPECT_EQ(sched.kv().n_used(), 0) << "KV blocks leaked";
  std::map<uint64_t, Result> out;
  for (const SeqOutput& e : sink->events) {
    Result& r = out[e.request_id];
    EXPECT_EQ(r.n_finished, 0) << "event after the finish of request " << e.request_id;
    r.tokens.insert(r.tokens.end(), e.tokens.begin(), e.tokens.end());
    r.text += e.text;
    if (e.finished) ++r.n_finished;
    r.last = e;
  }
  return out;
}

SequenceRequest constrained(uint64_t id, const std::string& prompt, int max_tokens, float temperature,
                            RandomSetConstraint::Options o) {
  SequenceRequest r;
  r.request_id = id;
  r.prompt = ascii(prompt);
  r.sampling.temperature = temperature;
  r.sampling.seed = id * 7919;
  r.stop.max_tokens = max_tokens;
  r.stop.eos_token_ids = {testing::kFakeEos, testing::kFakeImEnd};
  r.constraint = std::make_shared<RandomSetConstraint>(std::move(o));
  return r;
}

// What the engine must produce: the fake model's tokens sampled under the constraint's masks,
// ending at an end token, the constraint's finish or max_tokens.
std::vector<int32_t> reference(const SequenceRequest& r) {
  std::shared_ptr<RandomSetConstraint> c = dynamic_cast<RandomSetConstraint&>(*r.constraint).fresh();
  std::vector<int32_t> history = r.prompt, out;
  std::vector<uint32_t> mask(token_mask_words(testing::kFakeVocab));
  while (static_cast<int>(out.size()) < r.stop.max_tokens) {
    c->fill_mask(mask);
    const int32_t t = testing::fake_sample(testing::fake_logits(history), r.sampling,
                                           static_cast<int>(history.size()), {}, history.size(), mask);
    out.push_back(t);
    history.push_back(t);
    if (t == testing::kFakeEos || t == testing::kFakeImEnd) break;
    EXPECT_TRUE(c->accept(t));
    if (c->finished()) break;
  }
  return out;
}

TEST(SchedulerConstraint, EveryTokenIsAllowedAndAFinishedConstraintStops) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 4; ++round) {
    std::vector<SequenceRequest> reqs;
    for (uint64_t id = 1; id <= 6; ++id) {
      RandomSetConstraint::Options o;
      o.seed = rng.next();
      o.density = 0.02f + static_cast<float>(rng.below(50)) / 100.0f;
      o.n_tokens = 1 + static_cast<int>(rng.below(12));
      reqs.push_back(constrained(id, "Prompt " + std::to_string(id), 40, id % 2 ? 0.0f : 0.9f, o));
    }
    FakeBackend backend(64, 4);
    const auto results = run(backend, reqs);
    size_t total = 0;
    for (const SequenceRequest& r : reqs) {
      const Result& got = results.at(r.request_id);
      const auto& c = dynamic_cast<const RandomSetConstraint&>(*r.constraint);
      EXPECT_EQ(got.tokens, reference(r)) << "request " << r.request_id;
      EXPECT_EQ(got.tokens, c.accepted) << "the engine handed every token to accept()";
      EXPECT_EQ(got.last.finish_reason, FinishReason::kStop) << "request " << r.request_id;
      EXPECT_TRUE(got.last.error.empty()) << got.last.error;
      EXPECT_TRUE(c.finished());
      EXPECT_EQ(got.text, testing::fake_text(got.tokens));
      total += got.tokens.size();
    }
    EXPECT_EQ(backend.n_masked_rows(), total) << "every constrained row was sampled under its mask";
  }
}

TEST(SchedulerConstraint, MaxTokensFirstGivesLengthWithThePartialText) {
  RandomSetConstraint::Options o;
  o.seed = 11;
  o.n_tokens = 50;
  SequenceRequest r = constrained(1, "Partial", 5, 0.0f, o);
  FakeBackend backend(64, 4);
  const auto results = run(backend, {r});
  const Result& got = results.at(1);
  EXPECT_EQ(got.tokens.size(), 5u);
  EXPECT_EQ(got.tokens, reference(r));
  EXPECT_EQ(got.last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(got.text, testing::fake_text(got.tokens));
}

TEST(SchedulerConstraint, EndTokensAllowedByTheMaskEndTheSequence) {
  for (float temperature : {0.0f, 1.0f}) {
    RandomSetConstraint::Options o;
    o.seed = 5;
    o.only_end_from = 3;  // accepting after 3 tokens, nothing but an end token then
    SequenceRequest r = constrained(1, "Ends", 30, temperature, o);
    FakeBackend backend(64, 4);
    const auto results = run(backend, {r});
    const Result& got = results.at(1);
    ASSERT_EQ(got.tokens.size(), 4u);
    EXPECT_TRUE(got.tokens[3] == testing::kFakeEos || got.tokens[3] == testing::kFakeImEnd);
    EXPECT_EQ(got.tokens, reference(r));
    EXPECT_EQ(got.last.finish_reason, FinishReason::kStop);
  }
}

// Before min_tokens the end tokens are banned even where the mask allows them (the host resamples
// among the mask's other tokens); a mask that allows nothing but end tokens lets one through (the
// sequence ends with "stop") rather than hang.
TEST(SchedulerConstraint, MinTokensBansEndTokensUnlessTheMaskAllowsNothingElse) {
  RandomSetConstraint::Options o;
  o.seed = 3;
  o.density = 0.05f;
  o.accepting_from = 0;  // end tokens allowed at every step
  o.only_end_from = 6;
  SequenceRequest r = constrained(1, "Min", 30, 0.0f, o);
  r.stop.min_tokens = 10;
  FakeBackend backend(64, 4);
  const auto results = run(backend, {r});
  const Result& got = results.at(1);
  ASSERT_EQ(got.tokens.size(), 7u);
  for (int i = 0; i < 6; ++i) EXPECT_NE(got.tokens[i], testing::kFakeEos) << "end token before min_tokens";
  EXPECT_TRUE(got.tokens[6] == testing::kFakeEos || got.tokens[6] == testing::kFakeImEnd);
  EXPECT_EQ(got.last.finish_reason, FinishReason::kStop);
  const auto& c = dynamic_cast<const RandomSetConstraint&>(*r.constraint);
  EXPECT_EQ(c.accepted, std::vector<int32_t>(got.tokens.begin(), got.tokens.begin() + 6));
}

TEST(SchedulerConstraint, AMaskThatAllowsEverythingChangesNoToken) {
  for (float temperature : {0.0f, 0.8f}) {
    RandomSetConstraint::Options o;
    o.density = 2.0f;        // every token
    o.accepting_from = 0;    // the end tokens too
    SequenceRequest r = constrained(1, "Free", 25, temperature, o);
    r.stop.ignore_eos = true;
    SequenceRequest plain = r;
    plain.request_id = 2;
    plain.constraint = nullptr;
    FakeBackend backend(64, 4);
    const auto results = run(backend, {r, plain});
    EXPECT_EQ(results.at(1).tokens, results.at(2).tokens);
    EXPECT_EQ(results.at(1).tokens, testing::fake_reference(r.prompt, r.sampling, 25));
    EXPECT_EQ(results.at(1).last.finish_reason, FinishReason::kLength);
  }
}

// A constraint that refuses the token it allowed stands in for a backend that sampled outside the
// mask: the sequence ends with an error naming the backend; the others go on.
class RefusingConstraint : public RandomSetConstraint {
 public:
  using RandomSetConstraint::RandomSetConstraint;
  bool accept(int32_t) override { return false; }
};

TEST(SchedulerConstraint, ARefusedTokenEndsTheSequenceWithAnError) {
  SequenceRequest bad = constrained(1, "Bad", 10, 0.0f, {});
  bad.constraint = std::make_shared<RefusingConstraint>(RandomSetConstraint::Options{});
  SequenceRequest good = constrained(2, "Good", 10, 0.0f, {.seed = 9, .n_tokens = 4});
  FakeBackend backend(64, 4);
  const auto results = run(backend, {bad, good});
  EXPECT_EQ(results.at(1).last.finish_reason, FinishReason::kError);
  EXPECT_NE(results.at(1).last.error.find("backend fake"), std::string::npos) << results.at(1).last.error;
  EXPECT_TRUE(results.at(1).tokens.empty());
  EXPECT_EQ(results.at(2).last.finish_reason, FinishReason::kStop);
  EXPECT_EQ(results.at(2).tokens.size(), 4u);
}

}  // namespace
}  // namespace megadecode
