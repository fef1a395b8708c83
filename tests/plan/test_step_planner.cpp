// StepPlanner against make_plan: over random evolving batches (every sequence one token longer,
// sequences joining and leaving, jumps of context, fresh block tables, a new block size) on random
// shapes, policies and SM counts, every plan equals a fresh make_plan in every field, and what the
// planner says it kept (PlanUpdate) is what the previous plan held. On the full qwen3-30b-a3b shape
// steady decoding takes the patch path (lists kept) in most steps.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/check.h"
#include "plan/planner.h"
#include "kv/kv_cache.h"
#include "plan/step_planner.h"
#include "plan/validator.h"
#include "plan_test_util.h"

namespace megadecode {
namespace {

// A batch as a scheduler evolves it: one pool of blocks, tables that grow, sequences that come and go.
class EvolvingBatch {
 public:
  EvolvingBatch(SplitMix64& rng, int block_size, int max_ctx) : rng_(rng), block_size_(block_size), max_ctx_(max_ctx) {}

  void join(int n_ctx) {
    seqs_.push_back({0, {}});
    grow(seqs_.back(), n_ctx);
  }
  void leave(size_t i) {
    release(seqs_[i]);
    seqs_.erase(seqs_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  void decode_all() {
    for (Seq& s : seqs_) grow(s, s.n_ctx + 1 > max_ctx_ ? 1 + static_cast<int>(rng_.below(40)) : s.n_ctx + 1);
  }
  void jump(size_t i) { grow(seqs_[i], std::min(max_ctx_, seqs_[i].n_ctx + 1 + static_cast<int>(rng_.below(600)))); }
  void new_table(size_t i) {  // preempted and recomputed: other blocks
    const int n = seqs_[i].n_ctx;
    release(seqs_[i]);
    grow(seqs_[i], n);
  }
  void new_block_size(int block_size) {
    std::vector<int> ctx;
    for (Seq& s : seqs_) {
      ctx.push_back(s.n_ctx);
      release(s);
    }
    block_size_ = block_size;
    for (size_t i = 0; i < seqs_.size(); ++i) grow(seqs_[i], ctx[i]);
  }
  size_t size() const { return seqs_.size(); }
  int max_ctx() const { return max_ctx_; }
  BatchState state() const {
    BatchState b;
    b.kv_block_size = block_size_;
    for (const Seq& s : seqs_) b.seqs.push_back({s.n_ctx, s.table});
    return b;
  }

 private:
  struct Seq {
    int n_ctx;
    std::vector<int32_t> table;
  };
  // Shrinking frees the blocks past the new end (a restart at a short context).
  void grow(Seq& s, int n_ctx) {
    const size_t need = static_cast<size_t>((n_ctx + block_size_ - 1) / block_size_);
    while (s.table.size() > need) {
      free_.push_back(s.table.back());
      s.table.pop_back();
    }
    while (s.table.size() < need) s.table.push_back(take());
    s.n_ctx = n_ctx;
  }
  void release(Seq& s) {
    free_.insert(free_.end(), s.table.begin(), s.table.end());
    s.table.clear();
    s.n_ctx = 0;
  }
  int32_t take() {
    if (free_.empty()) return next_++;
    const size_t k = rng_.below(free_.size());
    const int32_t b = free_[k];
    free_[k] = free_.back();
    free_.pop_back();
    return b;
  }
  SplitMix64& rng_;
  int block_size_;
  int max_ctx_;
  std::vector<Seq> seqs_;
  std::vector<int32_t> free_;
  int32_t next_ = 0;
};

// What a PlanUpdate without lists_changed promises to have kept.
struct Lists {
  std::vector<Task> tasks;
  std::vector<int32_t> list_begin, task_wave;
  size_t n_dynamic = 0;
  explicit Lists(const Plan& p)
      : tasks(p.tasks), list_begin(p.list_begin), task_wave(p.task_wave), n_dynamic(p.dynamic_arrivals.size()) {}
  bool same(const Plan& p) const {
    return p.tasks.size() == tasks.size() && std::memcmp(p.tasks.data(), tasks.data(), tasks.size() * sizeof(Task)) == 0 &&
           p.list_begin == list_begin && p.task_wave == task_wave && p.dynamic_arrivals.size() == n_dynamic;
  }
};

void step_and_compare(StepPlanner& planner, const ModelConfig& c, const BatchState& b, const Policy& p,
                      const PlanOptions& o, std::optional<Lists>& previous, const std::string& where) {
  const uint64_t version = planner.lists_version();
  const Plan& patched = planner.plan(b);
  const Plan fresh = make_plan(c, b, p, o);
  ASSERT_EQ(test::plan_difference(patched, fresh), "") << where;
  const PlanUpdate& u = planner.last_update();
  if (previous && !u.lists_changed) {
    ASSERT_TRUE(previous->same(patched)) << where << ": lists changed unannounced";
  }
  ASSERT_TRUE(!u.new_skeleton || u.lists_changed) << where;
  ASSERT_EQ(planner.lists_version(), version + (u.lists_changed ? 1 : 0)) << where;
  previous.emplace(patched);
}

TEST(StepPlanner, EqualsMakePlanOverEvolvingBatches) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const char* policies[] = {"default", "grid-sync", "long-splits"};
  uint64_t patched = 0, reassembled = 0;
  for (int round = 0; round < 40; ++round) {
    const ModelConfig c = test::random_config(rng);
    const Policy p = test::random_policy(rng, policies[rng.below(3)]);
    PlanOptions o;
    o.n_sms = 1 + static_cast<int>(rng.below(24));
    EvolvingBatch batch(rng, test::pick(rng, {1, 2, 4, 16}), 50 + static_cast<int>(rng.below(1500)));
    const int n0 = 1 + static_cast<int>(rng.below(8));
    for (int i = 0; i < n0; ++i) batch.join(1 + static_cast<int>(rng.below(batch.max_ctx())));
    StepPlanner planner(c, p, o);
    std::optional<Lists> previous;
    for (int step = 0; step < 60; ++step) {
      const uint64_t what = rng.below(100);
      if (what < 70) {
        batch.decode_all();
      } else if (what < 78 && batch.size() > 1) {
        batch.leave(rng.below(batch.size()));
      } else if (what < 86 && batch.size() < 12) {
        batch.join(1 + static_cast<int>(rng.below(batch.max_ctx())));
      } else if (what < 92) {
        batch.jump(rng.below(batch.size()));
      } else if (what < 98) {
        batch.new_table(rng.below(batch.size()));
      } else {
        batch.new_block_size(test::pick(rng, {1, 2, 4, 16}));
      }
      step_and_compare(planner, c, batch.state(), p, o, previous,
                       "round " + std::to_string(round) + " step " + std::to_string(step));
      if (::testing::Test::HasFatalFailure()) return;
    }
    patched += planner.counts().patched;
    reassembled += planner.counts().reassembled;
  }
  std::printf("%llu steps patched, %llu reassembled\n", static_cast<unsigned long long>(patched),
              static_cast<unsigned long long>(reassembled));
  EXPECT_GT(patched, 0u);
  EXPECT_GT(reassembled, 0u);
}

// Steady decoding of the full shape: the lists stay and only the items' ends move, except when a
// sequence's split changes.
TEST(StepPlanner, FullShapeSteadyDecodeIsPatched) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig c = preset_config("qwen3-30b-a3b");
  for (int n : {1, 4}) {
    EvolvingBatch batch(rng, 16, 1 << 15);
    for (int i = 0; i < n; ++i) batch.join(600 + static_cast<int>(rng.below(2000)));
    StepPlanner planner(c, Policy{}, PlanOptions{});
    std::optional<Lists> previous;
    const int steps = 24;
    for (int step = 0; step < steps; ++step) {
      batch.decode_all();
      step_and_compare(planner, c, batch.state(), Policy{}, PlanOptions{}, previous,
                       "batch " + std::to_string(n) + " step " + std::to_string(step));
      if (::testing::Test::HasFatalFailure()) return;
    }
    validate_plan(planner.plan(batch.state()));
    EXPECT_EQ(planner.counts().new_skeletons, 1u);
    // The first step builds the skeleton. A sequence's split changes at most every 16 tokens (its
    // split length grows by whole blocks), so at most twice in 24 steps, and each change can cost
    // two reassemblies: the growing last split reaching the full ones' length may reorder the
    // placement the step before the split count changes (seed 16043318403773851379: 3 at batch 1).
    EXPECT_GE(planner.counts().patched, static_cast<uint64_t>(steps - 1 - 4 * n)) << "batch " << n;
  }
}

// A sliding-window model redoes its items every step (the window moves with the context), yet its
// lists mostly come out as they were: those steps keep them (lists_changed off, checked against the
// previous lists by step_and_compare) so the backends upload nothing.
TEST(StepPlanner, SlidingWindowSteadyDecodeKeepsItsLists) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig c = preset_config("north-mini-code");
  ASSERT_GT(c.max_sliding_window(), 0);
  for (int n : {1, 3}) {
    EvolvingBatch batch(rng, 16, 1 << 15);
    for (int i = 0; i < n; ++i) batch.join(600 + static_cast<int>(rng.below(9000)));
    StepPlanner planner(c, Policy{}, PlanOptions{});
    std::optional<Lists> previous;
    const int steps = 24;
    // Every sequence's whole ring (R blocks of its own): the planner reads only its length.
    const int ring = kv_ring_length(c.max_sliding_window(), 16);
    std::vector<std::vector<int32_t>> rings(n, std::vector<int32_t>(ring));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < ring; ++j) rings[i][j] = i * ring + j;
    for (int step = 0; step < steps; ++step) {
      batch.decode_all();
      BatchState b = batch.state();
      for (int i = 0; i < n; ++i) b.seqs[i].ring_table = rings[i];
      step_and_compare(planner, c, b, Policy{}, PlanOptions{}, previous,
                       "batch " + std::to_string(n) + " step " + std::to_string(step));
      if (::testing::Test::HasFatalFailure()) return;
    }
    std::printf("batch %d: %llu patched, %llu reassembled\n", n,
                static_cast<unsigned long long>(planner.counts().patched),
                static_cast<unsigned long long>(planner.counts().reassembled));
    EXPECT_EQ(planner.counts().new_skeletons, 1u);
    EXPECT_GE(planner.counts().patched, static_cast<uint64_t>(steps - 1 - 4 * n)) << "batch " << n;
  }
}

TEST(StepPlanner, RejectsWhatMakePlanRejects) {
  const ModelConfig c = preset_config("tiny");
  StepPlanner planner(c, Policy{}, PlanOptions{.n_sms = 8});
  const std::vector<int32_t> table = {3, 3};
  BatchState b{16, {{5, table}, {5, table}}};  // two sequences write the same slot
  std::string fresh, patched;
  try {
    make_plan(c, b, Policy{}, PlanOptions{.n_sms = 8});
  } catch (const Error& e) {
    fresh = e.what();
  }
  try {
    planner.plan(b);
  } catch (const Error& e) {
    patched = e.what();
  }
  EXPECT_NE(fresh, "");
  EXPECT_EQ(patched, fresh);
  // A good batch afterwards plans as make_plan does.
  BatchState good{16, {{5, table}}};
  EXPECT_EQ(test::plan_difference(planner.plan(good), make_plan(c, good, Policy{}, PlanOptions{.n_sms = 8})), "");
}

}  // namespace
}  // namespace megadecode
