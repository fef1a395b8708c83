// The engine: a Scheduler driven by one dedicated scheduler thread (DESIGN §6), fed through a
// locked inbox. submit() and abort() only queue work and wake the thread, so HTTP threads never
// wait for a step and the decode loop never waits for them: batch changes take effect at the
// next iteration.
// Ending: drain() refuses new work and lets what runs finish (idle() says when), stop() ends what
// is left (finish reason abort). A backend failure in a step (backend_guard.h) is final: every
// sequence ends with an error, the thread stops, submit() answers kFailed and failed() is true.
// Threading: every public member may be called from any thread, except that the constructor,
// start() and the destructor belong to the owner. Sinks are called on the scheduler thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_guard.h"
#include "engine/metrics.h"
#include "engine/request.h"
#include "engine/scheduler.h"

namespace megadecode {

struct EngineConfig {
  SchedulerConfig scheduler;
  int max_model_len = 0;  // 0: the model's max_position_embeddings; always capped by the KV pool
  int max_waiting = 1024;  // sequences queued (not yet admitted) before submit() refuses
};

enum class SubmitStatus { kOk, kQueueFull, kStopped /* stopping or draining */, kFailed /* the backend failed */ };

class Engine {
 public:
  Engine(Backend& backend, const EngineConfig& config, TextDecoderFactory decoders,
         std::shared_ptr<EngineMetrics> metrics = nullptr);
  ~Engine();  // stop()s

  void start();  // launches the scheduler thread
  // From now on submit() refuses (kStopped); sequences already submitted go on. Idempotent.
  void drain();
  // Ends every sequence (finish reason abort) and joins the thread. Idempotent.
  void stop();

  // Queues all sequences of one request (all or none). Error when a sequence is invalid (empty
  // prompt, token out of range, prompt + max_tokens > max_model_len, ...).
  SubmitStatus submit(std::vector<SequenceRequest> seqs);
  void abort(uint64_t request_id);
  uint64_t new_request_id() { return next_request_id_.fetch_add(1); }

  int max_model_len() const { return max_model_len_; }
  int vocab_size() const { return vocab_size_; }
  EngineMetrics& metrics() { return *metrics_; }
  // Started, and neither draining, stopping nor failed (/health).
  bool running() const;
  // No sequence queued or unfinished.
  bool idle() const;
  // The backend failed (backend_guard.h); failure() is its message.
  bool failed() const;
  std::string failure() const;

  // Runs fn(scheduler) on the scheduler thread between iterations and waits for it: tests use it
  // for invariant and leak checks. False when the engine is stopped.
  bool inspect(const std::function<void(const Scheduler&)>& fn);

 private:
  void loop();
  void fail_everything();
  void validate(const SequenceRequest& seq) const;

  std::shared_ptr<EngineMetrics> metrics_;
  BackendGuard backend_;  // the scheduler's backend
  Scheduler scheduler_;
  int max_model_len_;
  int vocab_size_;
  int max_waiting_;
  std::atomic<uint64_t> next_request_id_{1};

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable wake_;
  std::vector<SequenceRequest> inbox_;
  std::vector<uint64_t> aborts_;
  std::vector<std::function<void()>> tasks_;
  int n_waiting_ = 0;  // inbox + scheduler's waiting queue, as of the last iteration
  int n_live_ = 0;     // the scheduler's sequences, as of the last iteration
  bool iterating_ = false;
  bool started_ = false;
  bool draining_ = false;
  bool stopping_ = false;
  bool failed_ = false;
  std::thread thread_;
};

}  // namespace megadecode
