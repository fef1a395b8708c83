// Engine: the scheduler thread and its inbox (see engine.h).
#include "engine/engine.h"

#include <algorithm>
#include <future>

#include "core/check.h"
#include "core/log.h"
#include "sampling/params.h"

namespace megadecode {

Engine::Engine(Backend& backend, const EngineConfig& config, TextDecoderFactory decoders,
               std::shared_ptr<EngineMetrics> metrics)
    : metrics_(metrics ? std::move(metrics) : std::make_shared<EngineMetrics>()),
      backend_(backend),
      scheduler_(backend_, config.scheduler, std::move(decoders), metrics_.get()),
      vocab_size_(backend.config().vocab_size),
      max_waiting_(config.max_waiting) {
  const int model_max = backend.config().max_position_embeddings;
  const int pool_max = backend.n_kv_blocks() * backend.kv_block_size();
  int len = config.max_model_len > 0 ? config.max_model_len : model_max;
  MD_REQUIRE(model_max <= 0 || len <= model_max, "--max-model-len ", len, " exceeds the model's ", model_max,
             " positions");
  if (len > pool_max) {
    log_warn("max_model_len ", len, " capped to the KV pool's ", pool_max, " tokens");
    len = pool_max;
  }
  MD_REQUIRE(len >= 2, "max_model_len must be at least 2, got ", len);
  max_model_len_ = len;
  MD_REQUIRE(max_waiting_ >= 1, "max_waiting must be at least 1, got ", max_waiting_);
  metrics_->kv_blocks_total = backend.n_kv_blocks();
  metrics_->kv_ring_blocks_total = backend.n_ring_blocks();
}

Engine::~Engine() { stop(); }

void Engine::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  MD_CHECK(!started_, "engine started twice");
  started_ = true;
  thread_ = std::thread([this] { loop(); });
}

void Engine::drain() {
  std::lock_guard<std::mutex> lock(mutex_);
  draining_ = true;
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Whatever never reached the thread (or everything, when it never started) ends here.
  std::vector<SequenceRequest> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left.swap(inbox_);
    tasks_.clear();
  }
  for (SequenceRequest& r : left) scheduler_.add(std::move(r));
  scheduler_.abort_all(FinishReason::kAbort, "server shutting down");
  std::lock_guard<std::mutex> lock(mutex_);
  n_waiting_ = 0;
  n_live_ = 0;
}

bool Engine::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return started_ && !stopping_ && !draining_ && !failed_;
}

bool Engine::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return inbox_.empty() && !iterating_ && n_live_ == 0;
}

bool Engine::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

std::string Engine::failure() const { return backend_.failure(); }

void Engine::validate(const SequenceRequest& s) const {
  MD_REQUIRE(!s.prompt.empty(), "the prompt is empty");
  for (int32_t t : s.prompt) MD_REQUIRE(t >= 0 && t < vocab_size_, "token id ", t, " is outside [0, ", vocab_size_, ")");
  MD_REQUIRE(s.stop.max_tokens >= 1, "max_tokens must be at least 1, got ", s.stop.max_tokens);
  MD_REQUIRE(s.stop.min_tokens >= 0 && s.stop.min_tokens <= s.stop.max_tokens, "min_tokens ", s.stop.min_tokens,
             " must be in [0, max_tokens]");
  const int64_t total = static_cast<int64_t>(s.prompt.size()) + s.stop.max_tokens;
  MD_REQUIRE(total <= max_model_len_, "prompt (", s.prompt.size(), " tokens) + max_tokens (", s.stop.max_tokens,
             ") exceeds the maximum context length ", max_model_len_);
  MD_REQUIRE(s.logprobs >= -1 && s.logprobs <= vocab_size_, "logprobs ", s.logprobs, " out of range");
  sampling::validate(s.sampling);
}

SubmitStatus Engine::submit(std::vector<SequenceRequest> seqs) {
  for (const SequenceRequest& s : seqs) validate(s);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) return SubmitStatus::kFailed;
    if (stopping_ || draining_) return SubmitStatus::kStopped;
    if (n_waiting_ + static_cast<int>(inbox_.size() + seqs.size()) > max_waiting_) {
      ++metrics_->rejected_queue_full;
      return SubmitStatus::kQueueFull;
    }
    for (SequenceRequest& s : seqs) inbox_.push_back(std::move(s));
  }
  wake_.notify_one();
  return SubmitStatus::kOk;
}

void Engine::abort(uint64_t request_id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    aborts_.push_back(request_id);
  }
  wake_.notify_one();
}

bool Engine::inspect(const std::function<void(const Scheduler&)>& fn) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || !started_ || failed_) return false;
    tasks_.push_back([this, fn, done] {
      fn(scheduler_);
      done->set_value();
    });
  }
  wake_.notify_one();
  finished.wait();
  return true;
}

void Engine::loop() {
  std::vector<SequenceRequest> arrived;
  std::vector<uint64_t> aborts;
  std::vector<std::function<void()>> tasks;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Sleep only when there is nothing at all to do; a running batch never waits here.
      wake_.wait(lock, [&] {
        return stopping_ || !inbox_.empty() || !aborts_.empty() || !tasks_.empty() || !scheduler_.idle();
      });
      if (stopping_) {
        // stop() aborts what is left after the join; tasks waiting on inspect() must not hang.
        for (auto& t : tasks_) t();
        tasks_.clear();
        return;
      }
      arrived.swap(inbox_);
      aborts.swap(aborts_);
      tasks.swap(tasks_);
      iterating_ = true;
    }
    try {
      for (SequenceRequest& r : arrived) scheduler_.add(std::move(r));
      for (uint64_t id : aborts) scheduler_.abort(id);
      arrived.clear();
      aborts.clear();
      for (auto& t : tasks) t();
      tasks.clear();
      scheduler_.step();
    } catch (const std::exception& e) {
      // Backend failures are handled per sequence inside step(); anything else ends every
      // sequence with an error rather than the process.
      log_error("engine iteration failed: ", e.what());
      arrived.clear();
      aborts.clear();
      tasks.clear();
      scheduler_.abort_all(FinishReason::kError, e.what());
    }
    if (backend_.failed()) return fail_everything();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      n_waiting_ = scheduler_.n_waiting();
      n_live_ = scheduler_.n_waiting() + scheduler_.n_running();
      iterating_ = false;
    }
  }
}

// Scheduler thread, after a backend failure: the sequences of the failed step already ended with
// its error; every other one (queued, waiting, running) ends with the failure too, new work is
// refused, and the thread ends.
void Engine::fail_everything() {
  const std::string message = backend_.failure();
  log_error(message, ": every request ends with an error; the engine stops");
  std::vector<SequenceRequest> left;
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    left.swap(inbox_);
    tasks.swap(tasks_);
    aborts_.clear();
  }
  for (SequenceRequest& r : left) scheduler_.add(std::move(r));
  scheduler_.abort_all(FinishReason::kError, message);
  for (auto& t : tasks) t();  // inspect() callers must not hang
  std::lock_guard<std::mutex> lock(mutex_);
  n_waiting_ = 0;
  n_live_ = 0;
  iterating_ = false;
}

}  // namespace megadecode
