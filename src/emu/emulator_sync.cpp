#include "emu/emulator_sync.h"

#include <thread>

#include "core/check.h"

namespace megadecode::emu {

void StepShared::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (first_error.empty()) first_error = message;
  }
  abort.store(true, std::memory_order_release);
}

void StepShared::block(BlockedWait wait, bool timeout) {
  {
    std::lock_guard<std::mutex> lock(error_mutex);
    blocked.push_back(std::move(wait));
    timed_out = timed_out || timeout;
  }
  if (timeout) abort.store(true, std::memory_order_release);
}

std::string StepShared::error() const {
  if (!first_error.empty()) return first_error;
  if (!timed_out) return "";
  const BlockedWait* first = &blocked.front();
  for (const BlockedWait& b : blocked)
    if (b.wave < first->wave) first = &b;
  std::string s = cat("cpu-mk: ", first->where, " timed out after ", options->timeout_s, " s waiting for ",
                      counter_name(*plan, first->counter), " >= ", first->target, " (value ", first->value, ")");
  if (blocked.size() > 1) s += cat("; ", blocked.size() - 1, " other waits were blocked in the same or later waves");
  return s;
}

Worker::Worker(StepShared& shared, int sm)
    : shared_(shared), sm_(sm), rng_(mix64(shared.options->delay_seed ^ mix64(static_cast<uint64_t>(sm) + 1))) {}

std::atomic<int32_t>& Worker::counter(int32_t index) {
  MD_REQUIRE(index >= 0 && index < shared_.plan->params.counters.n_counters, where(), ": counter index ", index,
             " out of range");
  return shared_.counters[index].value;
}

std::string Worker::where() const {
  std::string s = cat("SM ", sm_, ", ", describe_task(*shared_.plan, task_));
  return s;
}

void Worker::wait(int32_t index, int32_t target) {
  std::atomic<int32_t>& c = counter(index);
  if (c.load(std::memory_order_acquire) >= target) return;
  if (shared_.options->sequential) {
    throw Error(cat("cpu-mk sequential run: ", where(), " waits for ", counter_name(*shared_.plan, index),
                    " >= ", target, " but it is ", c.load(std::memory_order_relaxed),
                    " (the plan's wave order does not produce it first)"));
  }
  // Spin, then yield, then sleep in growing steps: 132 emulated SMs share a few cores.
  const auto begin = std::chrono::steady_clock::now();
  const auto limit = std::chrono::duration<double>(shared_.options->timeout_s);
  int spins = 0;
  auto nap = std::chrono::microseconds(10);
  for (;;) {
    const int32_t value = c.load(std::memory_order_acquire);
    if (value >= target) return;
    const bool aborted = shared_.abort.load(std::memory_order_acquire);
    const bool timeout = !aborted && spins >= 256 && std::chrono::steady_clock::now() - begin > limit;
    if (aborted || timeout) {
      shared_.block({where(), shared_.plan->task_wave[task_], index, target, value}, timeout);
      throw StepAborted{};
    }
    if (++spins < 64) continue;
    if (spins < 256) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(2000));
  }
}

void Worker::arrive(int32_t index, int32_t amount) { counter(index).fetch_add(amount, std::memory_order_release); }

int32_t Worker::fetch_add(int32_t index, int32_t amount) {
  return counter(index).fetch_add(amount, std::memory_order_acq_rel);
}

void Worker::pause() {
  const EmulatorOptions& o = *shared_.options;
  if (o.delay_probability <= 0 || o.sequential) return;
  if (rng_.unit() >= o.delay_probability) return;
  if (rng_.below(2) == 0) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(rng_.below(o.max_delay_us + 1)));
  }
}

}  // namespace megadecode::emu
