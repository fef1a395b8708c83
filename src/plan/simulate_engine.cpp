// The discrete-event core of the timing model (simulate_engine.h): events, counters, memory.
#include "plan/simulate_engine.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/check.h"

namespace megadecode::sim {

Engine::Engine(const SimPlan& p, const SimParams& prm)
    : plan(p), params(prm), value_(p.n_counters, 0), history_(p.n_counters), waiters_(p.n_counters), sms_(p.n_sms) {
  // GB/s = 1e3 bytes/us
  pools_[0] = Pool{prm.hbm_gbps * 1e3, prm.sm_stream_gbps * 1e3, prm.hbm_latency_us};
  pools_[1] = Pool{prm.l2_gbps * 1e3, prm.sm_stream_gbps * 1e3, prm.l2_latency_us};
}

void Engine::push(double t, int kind, Agent* a, uint64_t arg) { events_.push(Event{t, event_seq_++, kind, a, arg}); }

void Engine::wake_at(double t, Agent& a) { push(std::max(t, now_), kWake, &a, a.token); }

void Engine::wake(Agent& a, uint64_t token) {
  if (!a.blocked || a.token != token) return;  // stale: something else woke it first
  a.blocked = false;
  ++a.token;
  a.resume.resume();
}

// ---- counters ----

int32_t Engine::arrive(int32_t counter, int32_t amount) {
  MD_REQUIRE(counter >= 0 && counter < plan.n_counters, "simulate: arrival on counter ", counter, " of ",
             plan.n_counters);
  const int32_t v = value_[counter] += amount;
  history_[counter].push_back({now_, v});
  auto& ws = waiters_[counter];
  for (size_t i = 0; i < ws.size();) {
    if (ws[i].target <= v) {
      push(seen(now_, ws[i].poll_start), kWake, ws[i].agent, ws[i].token);
      ws[i] = ws.back();
      ws.pop_back();
    } else {
      ++i;
    }
  }
  return v;
}

// The arrival at `reached` is visible hop_us later, and seen at the waiter's next poll.
double Engine::seen(double reached, double poll_start) const {
  const double visible = reached + params.hop_us;
  if (visible <= poll_start) return poll_start;
  if (params.poll_us <= 0) return visible;
  return poll_start + std::ceil((visible - poll_start) / params.poll_us - 1e-9) * params.poll_us;
}

double Engine::seen_or_register(const SimWait& w, double poll_start, Agent* a) {
  MD_REQUIRE(w.counter >= 0 && w.counter < plan.n_counters, "simulate: wait on counter ", w.counter, " of ",
             plan.n_counters);
  const auto& h = history_[w.counter];
  if (!h.empty() && h.back().second >= w.target) {
    const auto it = std::find_if(h.begin(), h.end(), [&](const auto& e) { return e.second >= w.target; });
    return seen(it->first, poll_start);
  }
  if (w.target <= 0) return poll_start;
  if (a) waiters_[w.counter].push_back({w.target, poll_start, a, a->token});
  return kNever;
}

Co Engine::wait_counter(Agent& a, SimWait w, std::vector<std::pair<double, double>>* record) {
  const double t0 = now_;
  for (;;) {
    const double t = seen_or_register(w, t0, nullptr);
    if (t <= now_) break;
    if (t < kNever) wake_at(t, a);
    else seen_or_register(w, t0, &a);
    co_await block(a, "a counter");
  }
  if (record && now_ > t0) record->push_back({t0, now_});
}

// ---- memory ----

int64_t Engine::issue(int sm, int64_t bytes, int64_t l2_part, bool ring) {
  MD_CHECK(bytes > 0 && l2_part >= 0 && l2_part <= bytes);
  SmMem& m = sms_[sm];
  const int id = static_cast<int>(pages_.size());
  const int64_t seq = ring ? static_cast<int64_t>(m.ring.size()) : -1;
  const bool from_l2 = l2_part == bytes;
  pages_.push_back(Page{sm, from_l2 ? bytes : bytes - l2_part, now_, kNever, seq, from_l2});
  if (ring) m.ring.push_back(id);
  hbm_bytes_ += bytes - l2_part;
  l2_bytes_ += l2_part;
  m.fifo.push_back(id);
  serve_next(sm);
  return seq;
}

bool Engine::slot_free(int sm) const {
  const SmMem& m = sms_[sm];
  const int64_t seq = static_cast<int64_t>(m.ring.size());
  return seq < params.ring_pages || seq - params.ring_pages < m.released;
}

void Engine::on_slot(int sm, Agent& a) {
  sms_[sm].slot_waiter = &a;
  sms_[sm].slot_token = a.token;
}

double Engine::landed(int sm, int64_t seq) const {
  const SmMem& m = sms_[sm];
  return seq < static_cast<int64_t>(m.ring.size()) ? pages_[m.ring[seq]].landed : kNever;
}

void Engine::on_landed(int sm, int64_t seq, Agent& a) {
  SmMem& m = sms_[sm];
  m.land_waiter = &a;
  m.land_token = a.token;
  m.land_seq = seq;
}

void Engine::release(int sm, int64_t seq) {
  SmMem& m = sms_[sm];
  MD_CHECK(seq == m.released, "pages are released in ring order");
  ++m.released;
  if (m.slot_waiter) {
    Agent* a = std::exchange(m.slot_waiter, nullptr);
    push(now_, kWake, a, m.slot_token);
  }
}

void Engine::advance(Pool& p) {
  if (!p.heap.empty()) p.v += p.rate() * (now_ - p.t);
  p.t = now_;
}

void Engine::reschedule(int pool) {
  Pool& p = pools_[pool];
  ++p.gen;
  if (p.heap.empty()) return;
  const double dt = std::max(0.0, (p.heap.top().first - p.v) / p.rate());
  push(now_ + dt, kTick, nullptr, static_cast<uint64_t>(pool) | p.gen << 1);
}

// Puts the head of the SM's FIFO in service in its pool (one page at a time per SM).
void Engine::serve_next(int sm) {
  SmMem& m = sms_[sm];
  if (m.in_service || m.fifo.empty()) return;
  const Page& pg = pages_[m.fifo.front()];
  const int pool = pg.from_l2 ? 1 : 0;
  Pool& p = pools_[pool];
  advance(p);
  p.heap.push({p.v + static_cast<double>(pg.bytes), sm});
  m.in_service = true;
  reschedule(pool);
}

void Engine::tick(int pool, uint64_t gen) {
  Pool& p = pools_[pool];
  if (gen != p.gen) return;  // the pool changed since: a newer tick is queued
  advance(p);
  // The generation matches: nothing changed since this tick was planned, so the top is due
  // (rounding may leave v a hair short of it); entries due at the same time go with it.
  std::vector<int> served;
  do {
    served.push_back(p.heap.top().second);
    p.heap.pop();
  } while (!p.heap.empty() && p.heap.top().first <= p.v + 1e-6);
  for (int sm : served) {
    SmMem& m = sms_[sm];
    const int id = m.fifo.front();
    m.fifo.pop_front();
    m.in_service = false;
    const double t = std::max(now_, pages_[id].issued + p.latency);
    if (t <= now_) land(id);
    else push(t, kLand, nullptr, static_cast<uint64_t>(id));
  }
  reschedule(pool);
  for (int sm : served) serve_next(sm);
}

void Engine::land(int id) {
  Page& pg = pages_[id];
  pg.landed = now_;
  SmMem& m = sms_[pg.sm];
  if (pg.seq >= 0 && m.land_waiter && m.land_seq == pg.seq) {
    Agent* a = std::exchange(m.land_waiter, nullptr);
    push(now_, kWake, a, m.land_token);
  }
}

int64_t Engine::run(std::vector<Co>& tops, const std::vector<Agent*>& agents, int64_t max_events) {
  for (Co& c : tops) c.start();
  int64_t n = 0;
  while (!events_.empty()) {
    const Event e = events_.top();
    events_.pop();
    MD_CHECK(e.t >= now_, "events run in time order");
    now_ = e.t;
    MD_REQUIRE(++n <= max_events, "simulate: more than ", max_events, " events at t = ", now_,
               " us: the simulation does not converge");
    if (e.kind == kWake) wake(*e.agent, e.arg);
    else if (e.kind == kTick) tick(static_cast<int>(e.arg & 1), e.arg >> 1);
    else land(static_cast<int>(e.arg));
  }
  for (const Co& c : tops)
    if (c.error()) std::rethrow_exception(c.error());
  std::string stuck;
  for (const Agent* a : agents)
    if (a->blocked && stuck.size() < 400) stuck += cat(stuck.empty() ? "" : "; ", "SM ", a->sm, " waits for ", a->what);
  MD_REQUIRE(stuck.empty(), "simulate: deadlock at t = ", now_, " us: ", stuck);
  for (const Co& c : tops) MD_CHECK(c.done());
  return n;
}

}  // namespace megadecode::sim
