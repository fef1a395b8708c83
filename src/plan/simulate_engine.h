// The discrete-event core of the timing model (simulate.h), internal to src/plan/simulate*.cpp:
// an event queue, agents written as coroutines (one per SM loader and consumer: their code reads
// like the kernel's loops), the step's counters with hop + poll detection, and the memory system
// (per-SM page FIFOs served by rate pools: HBM shared fairly by the streaming SMs, L2 likewise).
#pragma once

#include <coroutine>
#include <cstdint>
#include <deque>
#include <exception>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

#include "plan/simulate_plan.h"

namespace megadecode::sim {

inline constexpr double kNever = std::numeric_limits<double>::infinity();

// A coroutine awaited by its caller: it starts when awaited and resumes the caller when it
// returns (symmetric transfer, no recursion); a top-level one is started with start().
class [[nodiscard]] Co {
 public:
  struct promise_type {
    std::coroutine_handle<> caller;
    std::exception_ptr error;
    Co get_return_object() { return Co(std::coroutine_handle<promise_type>::from_promise(*this)); }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct Final {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        const std::coroutine_handle<> c = h.promise().caller;
        return c ? c : std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    Final final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { error = std::current_exception(); }
  };
  explicit Co(std::coroutine_handle<promise_type> h) : h_(h) {}
  Co(Co&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Co& operator=(Co&&) = delete;
  ~Co() {
    if (h_) h_.destroy();
  }
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> caller) noexcept {
    h_.promise().caller = caller;
    return h_;
  }
  void await_resume() const {
    if (h_.promise().error) std::rethrow_exception(h_.promise().error);
  }
  void start() { h_.resume(); }
  bool done() const { return h_.done(); }
  std::exception_ptr error() const { return h_.promise().error; }

 private:
  std::coroutine_handle<promise_type> h_;
};

// One simulated thread of control. Wake-ups carry the token the agent had when it registered for
// them; the first one to fire resumes it and bumps the token, so the others become stale.
struct Agent {
  std::coroutine_handle<> resume;
  uint64_t token = 0;
  bool blocked = false;
  const char* what = "";  // what it is blocked on (deadlock report)
  int sm = 0;
};

class Engine {
 public:
  Engine(const SimPlan& plan, const SimParams& params);

  const SimPlan& plan;
  const SimParams& params;
  double now() const { return now_; }

  // ---- blocking ----
  struct Block {
    Agent& a;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) noexcept {
      a.resume = h;
      a.blocked = true;
    }
    void await_resume() const noexcept {}
  };
  // Suspends `a` until one of the wake-ups registered since its last wake fires.
  Block block(Agent& a, const char* what) {
    a.what = what;
    return Block{a};
  }
  void wake_at(double t, Agent& a);
  struct Delay {
    Engine& e;
    Agent& a;
    double dt;
    bool await_ready() const noexcept { return dt <= 0; }
    void await_suspend(std::coroutine_handle<> h) {
      a.what = "a delay";
      e.wake_at(e.now_ + dt, a);
      Block{a}.await_suspend(h);
    }
    void await_resume() const noexcept {}
  };
  Delay delay(Agent& a, double dt) { return Delay{*this, a, dt}; }

  // ---- counters ----
  int32_t arrive(int32_t counter, int32_t amount);  // returns the new value
  // When `a`, polling since poll_start, sees counter >= target (kNever: not reached yet); with
  // no registration, registers `a` for the arrival that reaches it.
  double seen_or_register(const SimWait& w, double poll_start, Agent* a);
  // Waits for counter >= target from now (hop + poll); the interval is recorded when `record`.
  Co wait_counter(Agent& a, SimWait w, std::vector<std::pair<double, double>>* record);

  // ---- memory ----
  // A page read of `bytes`, the first `l2_part` of them already in L2 (prefetched), into SM sm's
  // ring (ring: it takes the next slot and lands for the consumers) or from HBM into L2 only (a
  // prefetch, l2_part 0). A page wholly in L2 is served at the L2 rate; one partly in L2 lands
  // when its HBM part has been served. Returns its ring sequence number or -1.
  int64_t issue(int sm, int64_t bytes, int64_t l2_part, bool ring);
  int64_t ring_issued(int sm) const { return static_cast<int64_t>(sms_[sm].ring.size()); }
  bool slot_free(int sm) const;  // the slot of the next ring page is free
  void on_slot(int sm, Agent& a);
  double landed(int sm, int64_t seq) const;  // kNever while not issued or not landed
  void on_landed(int sm, int64_t seq, Agent& a);
  void release(int sm, int64_t seq);  // the consumers are done with ring page seq

  int64_t hbm_bytes() const { return hbm_bytes_; }
  int64_t l2_bytes() const { return l2_bytes_; }

  // Runs the agents' top-level coroutines to completion. Error on a deadlock (naming who waits
  // for what) or when `max_events` is exceeded.
  int64_t run(std::vector<Co>& tops, const std::vector<Agent*>& agents, int64_t max_events);

 private:
  struct Event {
    double t;
    uint64_t seq;
    int kind;  // kWake, kTick, kLand
    Agent* agent;
    uint64_t arg;  // wake: token; tick: pool | generation << 1; land: page id
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  static constexpr int kWake = 0, kTick = 1, kLand = 2;
  struct Waiter {
    int32_t target;
    double poll_start;
    Agent* agent;
    uint64_t token;
  };
  struct Page {
    int sm;
    int64_t bytes;  // served by its pool (a page partly in L2: its HBM part)
    double issued;
    double landed = kNever;
    int64_t seq;  // ring sequence number, -1 for an L2 prefetch
    bool from_l2;
  };
  // Bytes of the SMs in service are served at min(cap, bw / n) each, in "virtual bytes" V.
  struct Pool {
    double bw, cap, latency;
    double v = 0, t = 0;
    uint64_t gen = 0;
    std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>> heap;
    double rate() const { return std::min(cap, bw / static_cast<double>(heap.size())); }
  };
  struct SmMem {
    std::vector<int> ring;  // page ids by ring sequence number
    std::deque<int> fifo;   // pages issued, not yet served (the head is in service)
    bool in_service = false;
    int64_t released = 0;   // ring pages released (in order)
    Agent* slot_waiter = nullptr;
    uint64_t slot_token = 0;
    Agent* land_waiter = nullptr;
    uint64_t land_token = 0;
    int64_t land_seq = -1;
  };

  void push(double t, int kind, Agent* a, uint64_t arg);
  void wake(Agent& a, uint64_t token);
  double seen(double reached, double poll_start) const;
  void advance(Pool& p);
  void reschedule(int pool);
  void serve_next(int sm);
  void tick(int pool, uint64_t gen);
  void land(int page);

  double now_ = 0;
  uint64_t event_seq_ = 0;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::vector<int32_t> value_;
  std::vector<std::vector<std::pair<double, int32_t>>> history_;  // (time, value after) per counter
  std::vector<std::vector<Waiter>> waiters_;
  std::vector<Page> pages_;
  std::vector<SmMem> sms_;
  Pool pools_[2];  // 0: HBM, 1: L2
  int64_t hbm_bytes_ = 0, l2_bytes_ = 0;
};

}  // namespace megadecode::sim
