// The emulator's synchronisation: counters as padded std::atomic<int32_t> (one per cache line, as
// the GPU keeps one per 128-byte line), and the per-SM Worker that implements Sync for the tiles:
// acquire waits with bounded spins (yield, then short sleeps, then a timeout Error naming the
// task), release arrivals, the attention items' acq_rel fetch_add, and seeded random delays.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/rng.h"
#include "emu/emulator.h"
#include "emu/tiles.h"
#include "plan/plan.h"

namespace megadecode::emu {

struct alignas(64) PaddedCounter {
  std::atomic<int32_t> value{0};
};

// A wait in progress when the step stopped (a timeout, or another worker's failure).
struct BlockedWait {
  std::string where;  // SM, task, item
  int wave;
  int32_t counter, target, value;
};

// State shared by the workers of one step.
struct StepShared {
  const Plan* plan = nullptr;
  const EmulatorOptions* options = nullptr;
  std::unique_ptr<PaddedCounter[]> counters;
  std::atomic<bool> abort{false};
  std::mutex error_mutex;
  std::string first_error;           // guarded by error_mutex
  std::vector<BlockedWait> blocked;  // guarded by error_mutex
  bool timed_out = false;            // guarded by error_mutex
  std::chrono::steady_clock::time_point start;

  void fail(const std::string& message);  // records the first failure and stops every worker
  // Records a wait that cannot finish; a timeout also stops every worker.
  void block(BlockedWait wait, bool timeout);
  // After the workers joined: the error to report (empty: none). A stuck step names the blocked wait
  // of the earliest wave, the likely cause (later ones wait downstream of it).
  std::string error() const;
};

// Thrown inside a worker when another one failed: unwinds it without recording anything.
struct StepAborted {};

class Worker final : public Sync {
 public:
  Worker(StepShared& shared, int sm);

  void wait(int32_t counter, int32_t target) override;
  void arrive(int32_t counter, int32_t amount) override;
  int32_t fetch_add(int32_t counter, int32_t amount) override;
  void pause() override;

  void begin_task(int task) {
    task_ = task;
  }
  std::string where() const;  // "SM 3, task 57 (...)"

 private:
  std::atomic<int32_t>& counter(int32_t index);

  StepShared& shared_;
  int sm_;
  int task_ = -1;
  SplitMix64 rng_;
};

}  // namespace megadecode::emu
