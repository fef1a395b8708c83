// A small persistent thread pool for the reference engine's row-parallel loops (matvecs).
// Work is split into one contiguous range per thread; each output element is computed by exactly
// one thread with the same code whatever the thread count, so results do not depend on it.
// Threading: one caller at a time (the backend's caller); the pool's own workers never call in.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace megadecode::ref {

class ThreadPool {
 public:
  // n_threads <= 0: one per hardware thread. n_threads == 1 runs everything on the caller.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n); returns when all are done. Ranges
  // are at least `grain` long (except the last), so tiny loops stay on the calling thread.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;  // valid while a loop runs
  int64_t job_n_ = 0;
  int job_parts_ = 0;     // ranges in the current loop (range 0 runs on the caller)
  uint64_t generation_ = 0;  // bumped per loop so each worker runs each loop once
  int pending_ = 0;          // workers still running the current loop
  bool stop_ = false;
};

}  // namespace megadecode::ref
