// What a backend uploads per step (plan/step_upload.h): the packed inputs sit where the arena's
// buffers say, with zeros around them; the ring tables are -1 past the blocks a sequence holds; the
// launch ranges cut each SM's list into its waves; the token masks are the constrained rows' masks
// behind a slot a row, nothing at all in a step without one.
#include <gtest/gtest.h>

#include <cstring>

#include "plan/planner.h"
#include "plan/step_upload.h"
#include "plan_test_util.h"
#include "sampling/token_mask.h"

namespace megadecode {
namespace {

TEST(StepUpload, InputsAndLaunchRanges) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 30; ++round) {
    const ModelConfig c = test::random_config(rng);
    PlanOptions o;
    o.n_sms = 1 + static_cast<int>(rng.below(20));
    const int batch = 1 + static_cast<int>(rng.below(9));
    const test::RandomBatch rb = test::random_batch(rng, batch, 300, test::pick(rng, {1, 4, 16}));
    const Plan plan = make_plan(c, rb.state, test::random_policy(rng, "default"), o);
    std::vector<int32_t> tokens(batch);
    std::vector<SamplingParams> sampling(batch);
    for (int i = 0; i < batch; ++i) {
      tokens[i] = rng.below(3) == 0 ? -1 - static_cast<int32_t>(rng.below(batch)) : static_cast<int32_t>(rng.below(50));
      sampling[i].seed = rng.next();
      sampling[i].top_k = static_cast<int>(rng.below(9));
    }
    std::vector<uint8_t> out(step_inputs_bytes(plan) + 64, 0xAB);
    pack_step_inputs(plan, rb.state, tokens, sampling, out);
    const BufferLayout& b = plan.params.buffers;
    std::vector<uint8_t> want(step_inputs_bytes(plan), 0);
    const int row = plan.params.shape.max_blocks_per_seq;
    for (int i = 0; i < batch; ++i) {
      std::memcpy(want.data() + b.token_ids.offset + 4 * i, &tokens[i], 4);
      std::memcpy(want.data() + b.seq_len.offset + 4 * i, &rb.state.seqs[i].n_ctx, 4);
      std::memcpy(want.data() + b.block_tables.offset + 4 * (static_cast<size_t>(i) * row),
                  rb.state.seqs[i].block_table.data(), 4 * rb.state.seqs[i].block_table.size());
      std::memcpy(want.data() + b.sampling.offset + sizeof(SamplingParams) * i, &sampling[i], sizeof(SamplingParams));
    }
    std::memcpy(want.data() + b.attn_items.offset, plan.attn_items.data(), plan.attn_items.size() * sizeof(AttnItem));
    ASSERT_EQ(std::memcmp(out.data(), want.data(), want.size()), 0) << "round " << round;
    ASSERT_EQ(out[want.size()], 0xAB) << "wrote past the inputs";

    const std::vector<int32_t> r = launch_ranges(plan);
    const int S = plan.n_sms();
    ASSERT_EQ(r.size(), (plan.waves.size() + 1) * 2 * S);
    for (int sm = 0; sm < S; ++sm) {
      EXPECT_EQ(r[sm], plan.list_begin[sm]);
      EXPECT_EQ(r[S + sm], plan.list_begin[sm + 1]);
      int expect_begin = plan.list_begin[sm];
      for (size_t w = 0; w < plan.waves.size(); ++w) {
        const int32_t* range = r.data() + (w + 1) * 2 * S;
        ASSERT_EQ(range[sm], expect_begin);
        for (int t = range[sm]; t < range[S + sm]; ++t) ASSERT_EQ(plan.task_wave[t], static_cast<int>(w));
        expect_begin = range[S + sm];
      }
      EXPECT_EQ(expect_begin, plan.list_begin[sm + 1]);
    }
  }
}

// The ring tables of a model with sliding layers: [batch][ring_len] blocks, -1 past the ones a
// sequence holds, nothing written past the buffer.
TEST(StepUpload, RingTables) {
  Plan plan;
  plan.params.shape.batch = 2;
  plan.params.shape.ring_len = 3;
  plan.params.buffers.ring_tables = BufferSpan{0, 2 * 3 * 4};
  const std::vector<int32_t> a = {7, 2}, b = {4, 5, 6, 9};  // b's fourth entry lies past ring_len
  BatchState batch;
  batch.seqs = {SeqState{3, {}, a}, SeqState{9, {}, b}};
  std::vector<uint8_t> out(24 + 4, 0xAB);
  pack_ring_tables(plan, batch, out);
  std::vector<int32_t> got(6);
  std::memcpy(got.data(), out.data(), 24);
  EXPECT_EQ(got, (std::vector<int32_t>{7, 2, -1, 4, 5, 6}));
  EXPECT_EQ(out[24], 0xAB) << "wrote past the ring tables";
}

TEST(StepUpload, TokenMasks) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 20; ++round) {
    const ModelConfig c = test::random_config(rng);
    const int batch = 1 + static_cast<int>(rng.below(9));
    const test::RandomBatch rb = test::random_batch(rng, batch, 300, test::pick(rng, {1, 4, 16}));
    const Plan plan = make_plan(c, rb.state, test::random_policy(rng, "default"), PlanOptions{.n_sms = 4});
    const size_t words = token_mask_words(c.vocab_size);
    const BufferSpan& span = plan.params.buffers.token_masks;
    ASSERT_GE(span.bytes, batch * (1 + words) * 4) << "room for every row's mask";
    std::vector<std::vector<uint32_t>> masks(batch);
    std::vector<std::span<const uint32_t>> views(batch);
    std::vector<uint8_t> out(span.bytes, 0xAB);
    EXPECT_EQ(pack_token_masks(plan, views, out), 0u) << "a step without constrained rows uploads nothing";
    EXPECT_EQ(out[0], 0xAB);
    for (int i = 0; i < batch; ++i) {
      if (rng.below(2) == 0 && i + 1 < batch) continue;
      masks[i].resize(words);
      for (uint32_t& w : masks[i]) w = static_cast<uint32_t>(rng.next());
      views[i] = masks[i];
    }
    const size_t bytes = pack_token_masks(plan, views, out);
    const auto* slots = reinterpret_cast<const int32_t*>(out.data());
    const auto* packed = reinterpret_cast<const uint32_t*>(out.data()) + batch;
    int32_t next = 0;
    for (int i = 0; i < batch; ++i) {
      if (masks[i].empty()) {
        EXPECT_EQ(slots[i], -1);
        continue;
      }
      ASSERT_EQ(slots[i], next++);
      EXPECT_EQ(std::memcmp(packed + static_cast<size_t>(slots[i]) * words, masks[i].data(), words * 4), 0);
    }
    EXPECT_EQ(bytes, (batch + next * words) * 4);
  }
}

}  // namespace
}  // namespace megadecode
