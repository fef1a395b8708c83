// The Engine around its scheduler thread (engine/engine.h, engine/backend_guard.h): the gauges
// fall back to zero when aborts empty an idle engine; drain() refuses new work and lets the old
// finish; a backend that fails mid-step ends every sequence (running, waiting, queued) with an
// error, is never called again, and leaves the engine failed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "engine/engine.h"
#include "fakes.h"

namespace megadecode {
namespace {

using testing::CollectingSink;
using testing::FakeBackend;
using testing::wait_until;

SequenceRequest request(uint64_t id, int prompt_len, int max_tokens, std::shared_ptr<OutputSink> sink) {
  SequenceRequest r;
  r.request_id = id;
  for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(97 + (i * 7 + static_cast<int>(id)) % 26);
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  r.sink = std::move(sink);
  return r;
}

int n_finished(CollectingSink& sink, FinishReason reason) {
  std::lock_guard<std::mutex> lock(sink.mutex);
  int n = 0;
  for (const SeqOutput& o : sink.events) n += o.finished && o.finish_reason == reason;
  return n;
}

bool gauges_zero(const EngineMetrics& m) {
  return m.n_running.load() == 0 && m.n_waiting.load() == 0 && m.kv_blocks_used.load() == 0;
}

// Random requests, some running and some waiting, aborted in random order: once the last abort
// is taken, every gauge reads zero without another request arriving.
TEST(Engine, GaugesFallToZeroWhenAbortsEmptyTheEngine) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  for (int round = 0; round < 5; ++round) {
    FakeBackend backend(1024, 4);
    backend.set_delay_us(1000);  // 1000 tokens take a second at least: none ends by itself
    EngineConfig ec;
    ec.scheduler = SchedulerConfig{.max_num_seqs = 1 + static_cast<int>(rng.below(4)), .check_invariants = true};
    Engine engine(backend, ec, testing::fake_decoders());
    engine.start();
    auto sink = std::make_shared<CollectingSink>();
    const int n = 2 + static_cast<int>(rng.below(6));
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(engine.submit({request(i + 1, 1 + static_cast<int>(rng.below(12)), 1000, sink)}), SubmitStatus::kOk);
    ASSERT_TRUE(wait_until([&] { return engine.metrics().n_running.load() == std::min(n, ec.scheduler.max_num_seqs); }));
    EXPECT_GT(engine.metrics().kv_blocks_used.load(), 0);
    EXPECT_EQ(engine.metrics().kv_blocks_total.load(), 1024);
    std::vector<uint64_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(i + 1);
    for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.below(i)]);
    for (uint64_t id : ids) {
      engine.abort(id);
      if (rng.below(2)) std::this_thread::sleep_for(std::chrono::microseconds(rng.below(3000)));
    }
    ASSERT_TRUE(wait_until([&] { return n_finished(*sink, FinishReason::kAbort) == n; }));
    EXPECT_TRUE(wait_until([&] { return gauges_zero(engine.metrics()); }, std::chrono::milliseconds(1000)))
        << "round " << round << ": running " << engine.metrics().n_running.load() << ", waiting "
        << engine.metrics().n_waiting.load() << ", KV blocks " << engine.metrics().kv_blocks_used.load();
    engine.stop();
  }
}

TEST(Engine, DrainRefusesNewWorkAndLetsTheOldFinish) {
  FakeBackend backend(1024, 4);
  backend.set_delay_us(200);
  Engine engine(backend, EngineConfig{}, testing::fake_decoders());
  engine.start();
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_EQ(engine.submit({request(1, 5, 40, sink)}), SubmitStatus::kOk);
  EXPECT_TRUE(engine.running());
  engine.drain();
  EXPECT_FALSE(engine.running());
  EXPECT_EQ(engine.submit({request(2, 5, 4, sink)}), SubmitStatus::kStopped);
  ASSERT_TRUE(wait_until([&] { return engine.idle(); }));
  EXPECT_EQ(n_finished(*sink, FinishReason::kLength), 1);
  EXPECT_TRUE(gauges_zero(engine.metrics()));
  engine.stop();
  EXPECT_EQ(n_finished(*sink, FinishReason::kAbort), 0);
}

TEST(Engine, BackendFailureEndsEverySequenceAndIsFinal) {
  FakeBackend backend(1024, 4);
  backend.set_delay_us(500);
  EngineConfig ec;
  ec.scheduler = SchedulerConfig{.max_num_seqs = 2, .check_invariants = true};
  Engine engine(backend, ec, testing::fake_decoders());
  engine.start();
  auto sink = std::make_shared<CollectingSink>();
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_EQ(engine.submit({request(id, 6, 1000, sink)}), SubmitStatus::kOk);
  ASSERT_TRUE(wait_until([&] { return engine.metrics().n_running.load() == 2 && engine.metrics().n_waiting.load() == 1; }));
  backend.fail_every_call();
  ASSERT_TRUE(wait_until([&] { return engine.failed(); }));
  ASSERT_TRUE(wait_until([&] { return n_finished(*sink, FinishReason::kError) == 3; }));
  {
    std::lock_guard<std::mutex> lock(sink->mutex);
    for (const SeqOutput& o : sink->events)
      if (o.finished) {
        EXPECT_NE(o.error.find("injected device failure"), std::string::npos) << o.error;
      }
  }
  EXPECT_NE(engine.failure().find("injected device failure"), std::string::npos) << engine.failure();
  EXPECT_FALSE(engine.running());
  EXPECT_TRUE(engine.idle());
  EXPECT_TRUE(gauges_zero(engine.metrics()));
  const std::string calls = backend.call_log();
  EXPECT_EQ(engine.submit({request(4, 3, 3, sink)}), SubmitStatus::kFailed);
  EXPECT_FALSE(engine.inspect([](const Scheduler&) {}));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(backend.call_log(), calls) << "the backend was called after it failed";
  engine.stop();
  EXPECT_EQ(n_finished(*sink, FinishReason::kError), 3);
}

}  // namespace
}  // namespace megadecode
