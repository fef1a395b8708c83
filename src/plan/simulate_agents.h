// The agents of the timing model, internal to src/plan/simulate*.cpp: per SM a loader and a
// consumer (simulate_agents.cpp), with the pieces they share (consuming pages, items with their
// split merge: simulate.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "plan/simulate_engine.h"

namespace megadecode::sim {

struct SmState {
  int sm = 0;
  Agent loader, consumer;
  int64_t consumed = 0;  // ring pages the consumers took (the next one's sequence number)
  std::vector<WorkSlice> slices;
  std::vector<std::pair<double, double>> waits;  // counter waits of the SM's waiter

  // loader
  std::vector<char> routed;          // [layer]: the loader computed the layer's routing
  bool consumer_waits_for_routing = false;
  std::vector<int64_t> l2_ahead;     // [task]: bytes from its start prefetched into L2
  int64_t l2_pending = 0;            // prefetched into L2, not yet read into the ring
};

struct Step {
  Engine e;
  std::vector<SmState> sms;
  Step(const SimPlan& plan, const SimParams& params);
};

inline int64_t n_pages(int64_t bytes, int64_t page_bytes) { return (bytes + page_bytes - 1) / page_bytes; }
inline int64_t page_size(int64_t bytes, int64_t page_bytes, int64_t k) {
  return std::min(page_bytes, bytes - k * page_bytes);
}

// The consumers take the next pages of `bytes` as they land, each for bytes / consume_gbps.
Co consume(Step& st, SmState& s, int64_t bytes);
// An item after its waits: cost, pages, arrivals, and the split merge when it arrives last.
Co run_item(Step& st, SmState& s, const SimItem& item);
void arrive_all(Step& st, const std::vector<SimArrive>& arrives);

Co loader(Step& st, SmState& s);
Co consumer(Step& st, SmState& s);

}  // namespace megadecode::sim
