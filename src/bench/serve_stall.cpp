// Decode-stall measurement (see serve_stall.h): a phase machine driven by chunk arrivals on one
// Asio thread, then the ITL windows computed from the recorded arrival times.
#include "bench/serve_stall.h"

#include <cstdio>

#include "core/check.h"

namespace megadecode::serve_bench {

using nlohmann::json;

namespace {

// The long request asks for a few tokens, not one: its first token chunk is what ends the window,
// and a lone token may decode to no text (part of a UTF-8 character).
constexpr int kLongMaxTokens = 4;

enum class Phase { kStarting, kBefore, kDuring, kAfter, kDone };

const char* phase_text(Phase p) {
  switch (p) {
    case Phase::kStarting: return "waiting for every stream's first token (is the server's --max-num-seqs below the stream count?)";
    case Phase::kBefore: return "in the window before the long prompt";
    case Phase::kDuring: return "waiting for the long prompt's first token";
    case Phase::kAfter: return "waiting for every stream's next token after the long prompt's first";
    case Phase::kDone: return "done";
  }
  return "?";
}

json window_json(const StallWindow& w) {
  return {{"start_s", w.start},
          {"end_s", w.end},
          {"window_ms", (w.end - w.start) * 1e3},
          {"samples", w.itl.count},
          {"itl_ms", {{"mean", w.itl.mean * 1e3}, {"p50", w.itl.median * 1e3}, {"p99", w.itl.p99 * 1e3}, {"max", w.itl.max * 1e3}}}};
}

}  // namespace

void stall_windows(const std::vector<std::vector<double>>& stream_chunk_times, double t_ready, double t_arrival,
                   double t_first, StallReport& report) {
  MD_REQUIRE(t_ready <= t_arrival && t_arrival <= t_first, "stall windows: expected t_ready ", t_ready,
             " <= t_arrival ", t_arrival, " <= t_first ", t_first);
  std::vector<double> before, during;
  for (const std::vector<double>& t : stream_chunk_times) {
    for (size_t k = 1; k < t.size(); ++k) {
      const double a = t[k - 1], b = t[k];
      MD_CHECK(a <= b, "stream chunk times out of order");
      if (a >= t_ready && b <= t_arrival) before.push_back(b - a);
      if (b > t_arrival && a < t_first) during.push_back(b - a);
    }
  }
  report.t_ready = t_ready;
  report.t_arrival = t_arrival;
  report.t_first = t_first;
  report.before = {t_ready, t_arrival, summarize(std::move(before))};
  report.during = {t_arrival, t_first, summarize(std::move(during))};
}

StallReport run_stall(const Target& target, const StallOptions& o) {
  MD_REQUIRE(o.n_streams >= 1 && o.stream_input_len >= 1 && o.stream_output_len >= 2 && o.long_prompt_len >= 1 &&
                 o.before_tokens >= 2 && o.timeout_s > 0 && o.vocab >= 1,
             "bench serve (decode stall): --background-streams, --input-len, --long-prompt-len, --timeout and "
             "--vocab must be positive, --output-len and --before-tokens at least 2");
  SplitMix64 rng(o.seed);
  std::vector<std::string> stream_http;
  for (int i = 0; i < o.n_streams; ++i)
    stream_http.push_back(http_post(target, "/v1/completions",
                                    completion_body(o.model, random_prompt(rng, o.stream_input_len, o.vocab),
                                                    o.stream_output_len)));
  std::string long_http = http_post(
      target, "/v1/completions", completion_body(o.model, random_prompt(rng, o.long_prompt_len, o.vocab), kLongMaxTokens));

  net::io_context ioc;
  const tcp::endpoint ep(net::ip::make_address(target.host), static_cast<unsigned short>(target.port));
  const size_t n = static_cast<size_t>(o.n_streams);
  std::vector<RequestRecord> streams(n);
  RequestRecord long_rec;
  std::vector<std::shared_ptr<BenchRequest>> stream_reqs;
  std::shared_ptr<BenchRequest> long_req;
  std::vector<size_t> ready_index(n, 0);  // chunks each stream had when every stream was decoding
  Phase phase = Phase::kStarting;
  StallReport report;
  net::steady_timer deadline(ioc);
  const auto t0 = BenchClock::now();

  auto stop = [&](const std::string& error) {
    if (phase == Phase::kDone) return;
    report.error = error;
    report.complete = error.empty();
    phase = Phase::kDone;
    deadline.cancel();
    for (auto& r : stream_reqs) r->cancel();
    if (long_req) long_req->cancel();
  };
  auto check_after = [&] {
    for (const RequestRecord& r : streams)
      if (r.chunk_times.empty() || r.chunk_times.back() < report.t_first) return;
    stop("");
  };
  auto on_stream_chunk = [&](double t) {
    if (phase == Phase::kStarting) {
      for (const RequestRecord& r : streams)
        if (r.first_token < 0) return;
      report.t_ready = t;
      for (size_t i = 0; i < n; ++i) ready_index[i] = streams[i].chunk_times.size();
      phase = Phase::kBefore;
    } else if (phase == Phase::kBefore) {
      for (size_t i = 0; i < n; ++i)
        if (streams[i].chunk_times.size() - ready_index[i] < static_cast<size_t>(o.before_tokens)) return;
      phase = Phase::kDuring;
      long_req = std::make_shared<BenchRequest>(
          ioc, ep, long_http, long_rec, t0,
          [&](double t_tok) {
            if (phase != Phase::kDuring) return;
            report.t_first = t_tok;
            phase = Phase::kAfter;
            check_after();
          },
          [&] {
            if (phase == Phase::kDuring)
              stop("the long request ended without a token: " + (long_rec.error.empty() ? "no text" : long_rec.error) +
                   (long_rec.error.rfind("HTTP status", 0) == 0 ? " (is --long-prompt-len + 4 within the server's max_model_len?)" : ""));
          });
      long_req->start();
      report.t_arrival = long_rec.send;
    } else if (phase == Phase::kAfter) {
      check_after();
    }
  };
  for (size_t i = 0; i < n; ++i) {
    stream_reqs.push_back(std::make_shared<BenchRequest>(ioc, ep, stream_http[i], streams[i], t0, on_stream_chunk, [&, i] {
      if (phase == Phase::kDone) return;
      const RequestRecord& r = streams[i];
      stop(r.ok ? "stream " + std::to_string(i) + " finished (" + std::to_string(r.chunk_times.size()) +
                      " chunks) " + phase_text(phase) + ": raise --output-len"
                : "stream " + std::to_string(i) + " failed " + phase_text(phase) + ": " + r.error);
    }));
  }
  deadline.expires_after(std::chrono::duration_cast<BenchClock::duration>(std::chrono::duration<double>(o.timeout_s)));
  deadline.async_wait([&](boost::system::error_code ec) {
    if (ec) return;  // cancelled: the run ended first
    char text[64];
    std::snprintf(text, sizeof text, "timed out after %g s ", o.timeout_s);
    stop(text + std::string(phase_text(phase)));
  });
  for (auto& r : stream_reqs) r->start();
  ioc.run();

  for (const RequestRecord& r : streams) report.stream_tokens.push_back(static_cast<int>(r.chunk_times.size()));
  if (report.complete) {
    std::vector<std::vector<double>> times;
    for (const RequestRecord& r : streams) times.push_back(r.chunk_times);
    stall_windows(times, report.t_ready, report.t_arrival, report.t_first, report);
  }
  return report;
}

json stall_json(const StallOptions& o, const StallReport& r) {
  json j = {{"mode", "decode_stall"},
            {"model", o.model},
            {"background_streams", o.n_streams},
            {"input_len", o.stream_input_len},
            {"output_len", o.stream_output_len},
            {"long_prompt_len", o.long_prompt_len},
            {"before_tokens", o.before_tokens},
            {"complete", r.complete},
            {"error", r.error},
            {"stream_tokens", r.stream_tokens}};
  if (!r.complete) return j;
  j["t_ready_s"] = r.t_ready;
  j["t_long_arrival_s"] = r.t_arrival;
  j["t_long_first_token_s"] = r.t_first;
  j["long_ttft_ms"] = (r.t_first - r.t_arrival) * 1e3;
  j["before"] = window_json(r.before);
  j["during"] = window_json(r.during);
  j["itl_p99_ratio"] = r.before.itl.p99 > 0 ? r.during.itl.p99 / r.before.itl.p99 : 0.0;
  j["itl_max_ratio"] = r.before.itl.max > 0 ? r.during.itl.max / r.before.itl.max : 0.0;
  // The stall target's ratio: the streams' p99 during the prompt over their p50 before it.
  j["itl_p99_during_over_p50_before"] = r.before.itl.median > 0 ? r.during.itl.p99 / r.before.itl.median : 0.0;
  return j;
}

void print_stall(const StallOptions& o, const StallReport& r) {
  std::printf("bench serve (decode stall): %s, %d streams (%d in, up to %d out), long prompt %d tokens\n",
              o.model.c_str(), o.n_streams, o.stream_input_len, o.stream_output_len, o.long_prompt_len);
  if (!r.complete) {
    std::printf("  incomplete: %s\n", r.error.c_str());
    return;
  }
  std::printf("  long prompt: sent at %.3f s, first token at %.3f s (TTFT %.1f ms)\n", r.t_arrival, r.t_first,
              (r.t_first - r.t_arrival) * 1e3);
  std::printf("  %-30s %8s %10s %10s %10s %10s  (stream ITL, ms)\n", "window", "samples", "mean", "p50", "p99", "max");
  for (auto [name, w] : {std::pair{"before", r.before}, std::pair{"during long prefill", r.during}}) {
    char label[48];
    std::snprintf(label, sizeof label, "%s (%.0f ms)", name, (w.end - w.start) * 1e3);
    std::printf("  %-30s %8zu %10.2f %10.2f %10.2f %10.2f\n", label, w.itl.count, w.itl.mean * 1e3,
                w.itl.median * 1e3, w.itl.p99 * 1e3, w.itl.max * 1e3);
  }
}

}  // namespace megadecode::serve_bench
