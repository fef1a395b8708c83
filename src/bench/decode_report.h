// Records and tables of `megadecode bench decode`: one JSON record per measured point (backend,
// batch, context, policy, median step time, tok/s, bytes the step had to read, achieved GB/s,
// % of the measured read ceiling) and the stdout tables. Pure host code (unit-tested).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/decode_bytes.h"
#include "engine/backend.h"

namespace megadecode {

struct DecodePoint {
  BackendOptions options;  // the backend measured (backend, policy, kernel_flags)
  std::string ablation;    // "" in the main sweep; the variant's name in the ablation table
  std::string path;        // the decode path that ran: megakernel or batched
  int batch = 0;
  int context = 0;
  int n_sms = 0;
  double ceiling_gbps = 0;
  std::vector<float> step_ms;          // every timed step
  std::vector<std::pair<std::string, double>> kernel_ms;  // batched path: ms per kernel of one step
  std::vector<int> distinct_experts;   // per layer
  StepBytes bytes;
  // Wall ms a step of decode_async steps chained on the device, two in flight (the engine's
  // overlapped loop without the server: every per-step upload, copy and host phase); 0: not run.
  double chained_ms = 0;
};

// Median, p10, p90 of the steps; tok/s = batch / median; achieved GB/s = bytes / median;
// pct_of_floor = 100 x achieved / ceiling (= floor time / step time). Error when nothing was timed.
nlohmann::json decode_record(const DecodePoint& p);

// A fixed-width table of records (the keys decode_record writes); `title` printed above it.
std::string format_decode_table(const std::string& title, std::span<const nlohmann::json> records);

// "1024:1,32768:1" -> {(1024, 1), (32768, 1)}; Error naming the bad entry.
std::vector<std::pair<int, int>> parse_points(const std::string& text);

}  // namespace megadecode
