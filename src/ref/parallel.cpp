#include "ref/parallel.h"

#include <algorithm>

namespace megadecode::ref {
namespace {

// Range `part` of `parts` equal ranges over [0, n).
std::pair<int64_t, int64_t> part_range(int64_t n, int parts, int part) {
  return {n * part / parts, n * (part + 1) / parts};
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t by_grain = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  const int parts = static_cast<int>(std::min<int64_t>(n_threads(), by_grain));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_parts_ = parts;
    pending_ = parts - 1;
    ++generation_;
  }
  wake_.notify_all();
  auto [begin, end] = part_range(n, parts, 0);
  fn(begin, end);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    int parts;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      parts = job_parts_;
    }
    // Workers beyond this loop's part count have nothing to do but must not be counted as pending.
    if (index < parts) {
      auto [begin, end] = part_range(n, parts, index);
      (*job)(begin, end);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

}  // namespace megadecode::ref
