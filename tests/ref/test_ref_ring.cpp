// cpu-ref with the sliding-window layers' K/V in rings: the oracle's logits with rings
// are bitwise those of a store that keeps every position, over prompts and decode continuations
// many windows long (north-tiny with the window lowered so that the ring wraps many times); a ring
// too short for the window shows as wrong logits; bad ring tables are errors; the engine's
// scheduler fills the ring tables (greedy tokens equal the reference, ring pool counted in the
// metrics, at most R ring blocks a sequence).
// sanitize: address
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "core/check.h"
#include "engine/decode_rows.h"
#include "engine/metrics.h"
#include "engine/scheduler.h"
#include "kv/kv_cache.h"
#include "model/presets.h"
#include "ref/ref_backend.h"
#include "ref_test_util.h"
#include "sampling/host_sampler.h"
#include "server/openai_service.h"

namespace megadecode {
namespace {

using ref::KvStore;
using ref::RefModel;
using ref::ThreadPool;

ModelConfig with_window(ModelConfig c, int window) {
  for (LayerSpec& l : c.layers)
    if (l.sliding_window > 0) l.sliding_window = window;
  return c;
}

// Every position's logits of `tokens` run in one chunk through a store without a ring pool (every
// layer keeps every position).
std::vector<float> keep_every_position(RefModel& model, int block_size, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = model.config();
  const int n = static_cast<int>(tokens.size());
  const int n_blocks = (n + block_size - 1) / block_size;
  KvStore kv(c, block_size, n_blocks);
  kv.fill(NAN);
  std::vector<int32_t> table(n_blocks);
  for (int i = 0; i < n_blocks; ++i) table[i] = n_blocks - 1 - i;
  std::vector<float> logits(static_cast<size_t>(n) * c.vocab_size);
  model.forward(SeqChunk{1, tokens, 0, table}, kv, logits);
  return logits;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// Two sequences interleaved over one KvCache (both pools), prompts in random chunk sizes (up to
// twice the window, so one chunk wraps the ring), then one token at a time; each call's logits
// against the reference's rows, bitwise.
void expect_ring_matches(const ModelConfig& c, int block_size, int n_positions, uint64_t seed) {
  SCOPED_TRACE(cat("window ", c.max_sliding_window(), " block size ", block_size, " seed ", seed));
  SplitMix64 rng(seed);
  test::TestWeights tw = test::random_weights(c, Dtype::kBF16, rng.next());
  ThreadPool pool(2);
  RefModel model(c, tw.weights, &pool);
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  const int r = kv_ring_length(c.max_sliding_window(), block_size);
  ASSERT_GE(n_positions, 4 * r * block_size) << "the ring should wrap several times";

  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<float> want;
    int prompt = 0, done = 0;
  };
  std::vector<Seq> seqs(2);
  for (Seq& s : seqs) {
    s.tokens = test::random_tokens(rng, n_positions, c.vocab_size);
    s.want = keep_every_position(model, block_size, s.tokens);
    s.prompt = n_positions / 2 + static_cast<int>(rng.below(n_positions / 4));
  }
  const int n_full = 2 * ((n_positions + block_size - 1) / block_size) + 3;
  KvCache cache(n_full, block_size, false, 2 * r + 1, r);
  KvStore kv(c, block_size, n_full, 2 * r + 1);
  kv.fill(NAN);
  for (int64_t id = 0; id < 2; ++id) {
    cache.admit(id, cache.plan_admission(seqs[id].tokens, 0, 1));
  }
  std::vector<float> logits;
  while (seqs[0].done < n_positions || seqs[1].done < n_positions) {
    const int64_t id = seqs[0].done == n_positions ? 1 : seqs[1].done == n_positions ? 0 : static_cast<int64_t>(rng.below(2));
    Seq& s = seqs[id];
    const int left = (s.done < s.prompt ? s.prompt : n_positions) - s.done;
    const int n = s.done < s.prompt ? std::min(left, 1 + static_cast<int>(rng.below(2 * c.max_sliding_window()))) : 1;
    ASSERT_TRUE(cache.ensure(id, s.done + n));
    cache.check_invariants();
    logits.assign(n * vocab, NAN);
    const SeqChunk chunk{id, std::span<const int32_t>(s.tokens).subspan(s.done, n), s.done, cache.table(id),
                         cache.ring_table(id)};
    model.forward(chunk, kv, logits);
    for (int i = 0; i < n; ++i)
      ASSERT_TRUE(same_bits(logits.data() + i * vocab, s.want.data() + (s.done + i) * vocab, vocab))
          << "sequence " << id << " position " << s.done + i << " (chunk of " << n << " at " << s.done << ")";
    s.done += n;
    EXPECT_LE(static_cast<int>(cache.ring_table(id).size()), r);
  }
  EXPECT_EQ(static_cast<int>(cache.ring_table(0).size()), r);
  EXPECT_EQ(cache.n_ring_used(), 2 * r);
}

TEST(RefRing, NorthTinyLogitsEqualKeepingEveryPositionBitwise) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const ModelConfig north = preset_config("north-tiny");
  ASSERT_GT(north.max_sliding_window(), 0);
  expect_ring_matches(with_window(north, 8), 4, 60, seed);       // R 3: 12 slots
  expect_ring_matches(with_window(north, 13), 5, 90, seed + 1);  // R 4: 20 slots, the window not a block multiple
}

// The same comparison with the model's window longer than the store's ring was built for: the
// ring has overwritten keys the window still reads, and the logits differ (from the first wrap
// on). So the bitwise comparison above sees a ring that keeps too little.
TEST(RefRing, ARingShorterThanTheWindowGivesOtherLogits) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const ModelConfig wide = with_window(test::cohere_config(), 12), narrow = with_window(test::cohere_config(), 4);
  const int bs = 2, n = 40;
  SplitMix64 rng(seed);
  test::TestWeights tw = test::random_weights(wide, Dtype::kF32, rng.next());
  ThreadPool pool(2);
  RefModel model(wide, tw.weights, &pool);
  const std::vector<int32_t> tokens = test::random_tokens(rng, n, wide.vocab_size);
  const std::vector<float> want = keep_every_position(model, bs, tokens);
  const int r = kv_ring_length(4, bs);  // 3 blocks, 6 slots: the 12-key window does not fit
  KvCache cache(64, bs, false, r, r);
  KvStore kv(narrow, bs, 64, r);
  kv.fill(NAN);
  cache.admit(1, cache.plan_admission(tokens, 0, n));
  std::vector<float> got(static_cast<size_t>(n) * wide.vocab_size);
  model.forward(SeqChunk{1, tokens, 0, cache.table(1), cache.ring_table(1)}, kv, got);
  const size_t vocab = wide.vocab_size;
  for (int p = 0; p < r * bs; ++p) EXPECT_TRUE(same_bits(got.data() + p * vocab, want.data() + p * vocab, vocab)) << p;
  int n_differ = 0;
  for (int p = r * bs; p < n; ++p) n_differ += !same_bits(got.data() + p * vocab, want.data() + p * vocab, vocab);
  EXPECT_EQ(n_differ, n - r * bs);
}

TEST(RefRing, BadRingTablesAreErrors) {
  const ModelConfig c = test::cohere_config();  // sliding windows of 5
  SplitMix64 rng(7);
  test::TestWeights tw = test::random_weights(c, Dtype::kF32, rng.next());
  ThreadPool pool(1);
  RefModel model(c, tw.weights, &pool);
  const int bs = 2, r = kv_ring_length(5, bs);  // 4
  KvStore ring(c, bs, 16, 8);
  EXPECT_EQ(ring.ring_length(), r);
  KvStore flat(c, bs, 16);
  const std::vector<int32_t> tokens = test::random_tokens(rng, 9, c.vocab_size);
  const std::vector<int32_t> table = {0, 1, 2, 3, 4}, ring_table = {0, 1, 2, 3};
  std::vector<float> logits(c.vocab_size);
  model.forward(SeqChunk{1, tokens, 0, table, ring_table}, ring, logits);  // fine
  EXPECT_THROW(model.forward(SeqChunk{1, tokens, 0, table, ring_table}, flat, logits), Error) << "no ring pool";
  EXPECT_THROW(model.forward(SeqChunk{1, tokens, 0, table, {}}, ring, logits), Error) << "no ring table";
  const std::vector<int32_t> short_ring = {0, 1, 2}, long_ring = {0, 1, 2, 3, 4}, bad_block = {0, 1, 8, 3};
  EXPECT_THROW(model.forward(SeqChunk{1, tokens, 0, table, short_ring}, ring, logits), Error) << "3 of 4 blocks";
  EXPECT_THROW(model.forward(SeqChunk{1, tokens, 0, table, long_ring}, ring, logits), Error) << "more than R";
  EXPECT_THROW(model.forward(SeqChunk{1, tokens, 0, table, bad_block}, ring, logits), Error) << "block 8 of 8";
  const std::vector<int32_t> short_table = {0, 1};
  EXPECT_THROW(model.forward(SeqChunk{1, tokens, 0, short_table, ring_table}, ring, logits), Error)
      << "short block table";
  // A short prefix needs only the ring blocks it reaches (positions 0-2: two).
  model.forward(SeqChunk{2, std::span<const int32_t>(tokens).first(3), 0, table, std::span<const int32_t>(short_ring).first(2)},
                ring, logits);
  EXPECT_THROW(model.forward(SeqChunk{2, std::span<const int32_t>(tokens).first(3), 0, table,
                                      std::span<const int32_t>(short_ring).first(1)},
                             ring, logits),
               Error);
  EXPECT_THROW(KvStore(test::small_moe_config(), bs, 16, 8), Error) << "a ring pool for a model without sliding layers";
  EXPECT_THROW(KvStore(c, bs, 16, -1), Error);
}

// A backend with a ring pool (the CUDA ones for a model with sliding layers) checks its decode
// rows' ring tables in check_decode_rows (engine/decode_rows.h): the state keeps the entries the
// positions use; a short table, one past the ring length or a block outside the pool is an Error.
TEST(RefRing, DecodeRowsCheckRingTablesAgainstThePool) {
  const ModelConfig c = test::cohere_config();
  const RingPoolShape pool{4, 8};  // rings of 4 blocks, 8 in the pool
  const std::vector<int32_t> token = {5}, table = {0, 1, 2}, ring = {3, 1, 0};
  DecodeSeq row;
  row.chunk = SeqChunk{1, token, 4, table, ring};  // position 4, blocks of 2: 3 blocks, 3 ring blocks
  const BatchState s = check_decode_rows(std::span<const DecodeSeq>(&row, 1), c, 4, 2, pool);
  ASSERT_EQ(s.seqs.size(), 1u);
  EXPECT_EQ(s.seqs[0].ring_table.size(), 3u);
  EXPECT_EQ(s.seqs[0].block_table.size(), 3u);
  const std::vector<int32_t> short_ring = {3, 1}, long_ring = {3, 1, 0, 2, 4}, bad_block = {3, 8, 0};
  for (const auto& bad : {short_ring, long_ring, bad_block}) {
    row.chunk.ring_table = bad;
    EXPECT_THROW(check_decode_rows(std::span<const DecodeSeq>(&row, 1), c, 4, 2, pool), Error) << bad.size();
  }
}

// The backends without a ring pool (the null backend; the CUDA ones for a model without sliding
// layers): a ring table reaching them is an error naming the backend (decode rows through
// check_decode_rows, chunks through require_no_ring_table). cpu-mk keeps a ring pool as cpu-ref
// does (tests/emu/test_emulator_north), and so do cuda-mk / cuda-ops for a model with sliding
// layers (tests/cuda/megakernel/test_megakernel_north).
TEST(RefRing, BackendsWithoutARingPoolRejectRingTables) {
  const ModelConfig c = test::small_moe_config();
  const std::vector<int32_t> token = {5}, table = {0}, ring = {0};
  DecodeSeq row;
  row.chunk = SeqChunk{1, token, 0, table, {}};
  EXPECT_EQ(check_decode_rows(std::span<const DecodeSeq>(&row, 1), c, 4, 4).seqs.size(), 1u);
  row.chunk.ring_table = ring;
  EXPECT_THROW(check_decode_rows(std::span<const DecodeSeq>(&row, 1), c, 4, 4), Error);
  EXPECT_NO_THROW(require_no_ring_table(SeqChunk{1, token, 0, table, {}}, "cuda-mk"));
  try {
    require_no_ring_table(row.chunk, "cuda-mk");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda-mk"), std::string::npos) << e.what();
  }
}

struct NullDecoder : TextDecoder {
  std::string push(int32_t) override { return {}; }
  std::string flush() override { return {}; }
};

struct Sink : OutputSink {
  void on_output(SeqOutput&& o) override {
    auto& t = tokens[o.request_id];
    t.insert(t.end(), o.tokens.begin(), o.tokens.end());
    if (o.finished) reasons[o.request_id] = o.finish_reason;
  }
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, FinishReason> reasons;
};

// Greedy generation of `n_out` tokens after `prompt` on a store that keeps every position.
std::vector<int32_t> greedy_reference(RefModel& model, int bs, std::vector<int32_t> tokens, int n_out) {
  const ModelConfig& c = model.config();
  const int n_max = static_cast<int>(tokens.size()) + n_out;
  const int n_blocks = (n_max + bs - 1) / bs;
  KvStore kv(c, bs, n_blocks);
  kv.fill(NAN);
  std::vector<int32_t> table(n_blocks);
  for (int i = 0; i < n_blocks; ++i) table[i] = i;
  std::vector<float> logits(c.vocab_size);
  SamplingParams greedy;
  greedy.temperature = 0;
  model.forward(SeqChunk{1, tokens, 0, table}, kv, logits);
  std::vector<int32_t> out;
  for (int i = 0; i < n_out; ++i) {
    const int pos = static_cast<int>(tokens.size()) - 1;
    out.push_back(sampling::sample_token(logits, greedy, pos + 1, {}));
    tokens.push_back(out.back());
    if (i + 1 < n_out) model.forward(SeqChunk{1, std::span<const int32_t>(tokens).last(1), pos + 1, table}, kv, logits);
  }
  return out;
}

// The scheduler over cpu-ref with a ring pool that binds (room for about two rings): chunked
// prompts, admissions held back and preemptions by the ring pool, the invariants after every
// mutation; the tokens equal the reference's, each sequence holds at most R ring blocks, and the
// metrics count the ring pool's blocks (sliding) beside the full pool's.
TEST(RefRing, SchedulerFillsRingTablesAndTheMetricsCountThem) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  const ModelConfig c = test::cohere_config();  // windows of 5
  test::TestWeights tw = test::random_weights(c, Dtype::kBF16, rng.next());
  const int bs = 2, r = kv_ring_length(c.max_sliding_window(), bs);
  BackendOptions options;
  options.kv_block_size = bs;
  options.n_kv_blocks = 200;
  options.n_ring_blocks = 2 * r + 1;
  options.n_threads = 2;
  ref::RefBackend backend(c, tw.weights, tw.store, options);
  ASSERT_EQ(backend.n_ring_blocks(), 2 * r + 1);
  EngineMetrics metrics;
  SchedulerConfig sc;
  sc.max_num_seqs = 4;
  sc.max_prefill_tokens = 7;
  sc.check_invariants = true;
  Scheduler sched(backend, sc, [](bool) { return std::make_unique<NullDecoder>(); }, &metrics);
  EXPECT_FALSE(sched.kv().prefix_cache_enabled());
  auto sink = std::make_shared<Sink>();
  std::map<uint64_t, std::vector<int32_t>> prompts;
  const int n_out = 18;
  const int prompt_len[] = {3, 4, 3, 20};  // fixed: the schedule (admissions, preemptions) is deterministic
  for (uint64_t id = 1; id <= 4; ++id) {
    SequenceRequest req;
    req.request_id = id;
    req.prompt = test::random_tokens(rng, prompt_len[id - 1], c.vocab_size);
    req.sampling.temperature = 0;
    req.stop.max_tokens = n_out;
    req.stop.ignore_eos = true;
    req.sink = sink;
    prompts[id] = req.prompt;
    sched.add(std::move(req));
  }
  int max_ring_used = 0;
  for (int i = 0; i < 10000 && sched.step(); ++i) {
    EXPECT_EQ(metrics.kv_ring_blocks_used.load(), sched.kv().n_ring_used());
    EXPECT_EQ(metrics.kv_blocks_used.load(), sched.kv().n_used());
    EXPECT_LE(sched.kv().n_ring_used(), sched.n_running() * r);
    max_ring_used = std::max(max_ring_used, sched.kv().n_ring_used());
    if (i == 3) {
      const std::string text = render_metrics(metrics, "north");
      const std::string sliding = "megadecode:kv_cache_blocks_used_by_layer_type{model_name=\"north\",layer_type=\"sliding\"} " +
                                  std::to_string(metrics.kv_ring_blocks_used.load()) + "\n";
      EXPECT_NE(text.find(sliding), std::string::npos) << text;
      EXPECT_NE(text.find("megadecode:kv_cache_blocks_total_by_layer_type{model_name=\"north\",layer_type=\"sliding\"} " +
                          std::to_string(2 * r + 1) + "\n"),
                std::string::npos);
      EXPECT_NE(text.find("megadecode:kv_cache_blocks_used_by_layer_type{model_name=\"north\",layer_type=\"full\"} " +
                          std::to_string(metrics.kv_blocks_used.load()) + "\n"),
                std::string::npos);
    }
  }
  ASSERT_TRUE(sched.idle());
  EXPECT_GT(max_ring_used, r) << "more than one ring at a time";
  EXPECT_LE(max_ring_used, 2 * r + 1);
  // Three short prompts take 2 ring blocks each (the fourth's 4 do not fit the 3 left); growing to
  // 4 each they need 12 of 9: the newest is preempted.
  EXPECT_GT(sched.n_preemptions(), 0u);
  EXPECT_EQ(metrics.kv_ring_blocks_used.load(), 0);
  EXPECT_EQ(metrics.kv_ring_blocks_total.load(), 2 * r + 1);
  EXPECT_EQ(sched.kv().n_ring_used(), 0);
  ThreadPool pool(2);
  RefModel model(c, tw.weights, &pool);
  for (const auto& [id, prompt] : prompts) {
    EXPECT_EQ(sink->reasons[id], FinishReason::kLength) << id;
    EXPECT_EQ(sink->tokens[id], greedy_reference(model, bs, prompt, n_out)) << "request " << id;
  }
}

}  // namespace
}  // namespace megadecode
