// The agents of the timing model, internal to src/plan/simulate*.cpp: per SM a loader and a
// consumer. simulate_v1.cpp has the v1 producer (mk_producer.cuh) and the consumer loop it posts
// work records to; simulate_v2.cpp the v2 loader and consumers; the parts both consumers share
// (consuming pages, items with their split merge) are here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "plan/simulate_engine.h"

namespace megadecode::sim {

// A v1 work record: what the producer posts and the consumers run.
struct Work {
  enum Kind { kTask, kItem, kArriveOnly, kEnd } kind;
  const SimTask* task;
  const SimItem* item;
  bool release_late;    // the record is released when the work is done, not when taken
  bool consumer_waits;  // the item's waits are the consumers'
};

struct SmState {
  int sm = 0;
  Agent loader, consumer;
  int64_t consumed = 0;  // ring pages the consumers took (the next one's sequence number)
  std::vector<WorkSlice> slices;
  std::vector<std::pair<double, double>> waits;  // counter waits of the SM's waiter

  // v1 producer
  int pf_task = 0, pf_page = 0;  // the prefetch cursor (mk_producer.cuh)
  int64_t x_seq = 0;             // ring pages whose work was posted (activation part issued)
  std::vector<Work> works;       // posted
  int64_t works_released = 0;
  bool consumer_waits_for_post = false;
  bool loader_waits_for_release = false;

  // v2 loader
  int consumer_task = 0;             // tasks the consumers started
  bool loader_waits_for_consumer = false;
  std::vector<char> routed;          // [layer]: the consumers computed the layer's routing
  bool loader_waits_for_routing = false;
  std::vector<int64_t> l2_ahead;     // [task]: bytes from its start prefetched into L2
  int64_t l2_pending = 0;            // prefetched into L2, not yet read into the ring
};

struct Step {
  Engine e;
  std::vector<SmState> sms;
  std::vector<int64_t> queue_head;  // v1 claims
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

Co producer_v1(Step& st, SmState& s);
Co consumer_v1(Step& st, SmState& s);
Co loader_v2(Step& st, SmState& s);
Co consumer_v2(Step& st, SmState& s);

}  // namespace megadecode::sim
