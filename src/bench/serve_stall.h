// Decode-stall measurement of `megadecode bench serve --background-streams N`: N streaming
// requests decode; once every one is decoding and has produced `before_tokens` more tokens, one
// long prompt arrives. Reported: the inter-token latency (ITL) of the N streams in the window from
// the long prompt's arrival to its first token, next to the same figures before it arrived. A
// server that prefills the long prompt in one piece shows the whole prefill as one ITL sample.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/serve_client.h"

namespace megadecode::serve_bench {

struct StallOptions {
  std::string model;
  int n_streams = 8;
  int stream_input_len = 128;
  int stream_output_len = 4096;  // max_tokens of a stream: must outlast the long prompt's prefill
  int long_prompt_len = 16384;
  int before_tokens = 32;        // tokens every stream produces in the "before" window
  double timeout_s = 300;        // the whole run; past it everything is cancelled and it fails
  int vocab = 1000;
  uint64_t seed = 0;
};

struct StallWindow {
  double start = 0, end = 0;  // seconds since the run started
  Summary itl;                // seconds, over every stream's samples in the window
};

struct StallReport {
  bool complete = false;  // every window was observed in full
  std::string error;      // why not, when not
  double t_ready = -1;    // every stream had its first token
  double t_arrival = -1;  // the long request was sent
  double t_first = -1;    // its first token arrived
  StallWindow before, during;
  std::vector<int> stream_tokens;  // token chunks each stream received
};

// The windows from the streams' chunk arrival times. An ITL sample is the gap (a, b) between two
// consecutive chunks of one stream. before: samples with t_ready <= a and b <= t_arrival. during:
// samples overlapping the open interval (t_arrival, t_first), i.e. b > t_arrival and a < t_first,
// so a stall that spans the whole prefill counts once, in full. Fills before, during, t_*;
// leaves complete and error alone.
void stall_windows(const std::vector<std::vector<double>>& stream_chunk_times, double t_ready, double t_arrival,
                   double t_first, StallReport& report);

// Runs the measurement against a server (blocking; bounded by options.timeout_s). The report is
// complete only when every stream was still decoding after the long prompt's first token.
StallReport run_stall(const Target& target, const StallOptions& options);

nlohmann::json stall_json(const StallOptions& options, const StallReport& report);
void print_stall(const StallOptions& options, const StallReport& report);

}  // namespace megadecode::serve_bench
