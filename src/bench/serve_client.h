// The client side of `megadecode bench serve`: one streaming OpenAI request per connection (the
// chunked SSE response parsed as it arrives, the arrival time of every chunk that carries tokens
// recorded), request framing, random token-id prompts and latency summaries. Asio, one thread.
#pragma once
#if defined(__SANITIZE_THREAD__)
#pragma GCC diagnostic ignored "-Wtsan"  // Asio's fences in TSan builds: known, harmless noise
#endif

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange
#include <vector>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "core/rng.h"

namespace megadecode::serve_bench {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using BenchClock = std::chrono::steady_clock;

struct Target {
  std::string host;
  int port = 8000;
};

// http://HOST:PORT[/...]; Error for anything else.
Target parse_url(const std::string& url);

struct RequestRecord {
  bool ok = false;
  bool cancelled = false;           // ended by cancel() (decode-stall mode), not an error
  std::string error;
  double send = 0.0;                // seconds since the benchmark started
  double first_token = -1.0;
  double end = 0.0;
  std::vector<double> chunk_times;  // arrival of each chunk that carried tokens (carries_tokens)
  int output_tokens = 0;            // from the final usage chunk
  int prompt_tokens = 0;            // from it too
  int cached_tokens = 0;            // its prompt_tokens_details.cached_tokens (the prefix cache's hit)
  std::vector<int32_t> token_ids;   // the first choice's output ids, where the server sends them
};

// Whether a streamed event brings tokens: a choice with non-empty text, delta content or
// "token_ids" (a --skip-tokenizer-init server sends ids and empty text).
bool carries_tokens(const nlohmann::json& event);

// One streaming request on its own connection. `on_chunk(t)` runs after each token chunk (t: its
// arrival, already in rec.chunk_times); `done` runs once when the request ends for any reason.
class BenchRequest : public std::enable_shared_from_this<BenchRequest> {
 public:
  BenchRequest(net::io_context& ioc, const tcp::endpoint& ep, std::string http_request, RequestRecord& rec,
               BenchClock::time_point t0, std::function<void(double)> on_chunk, std::function<void()> done);
  void start();
  // Closes the connection (the server sees a disconnect and aborts the request); the record is
  // marked cancelled and `done` runs. No effect once the request ended.
  void cancel();
  bool finished() const { return finished_; }

 private:
  double now() const;
  void read();
  void parse();
  void finish(const std::string& error);

  tcp::socket socket_;
  tcp::endpoint ep_;
  std::string request_;
  RequestRecord& rec_;
  BenchClock::time_point t0_;
  std::function<void(double)> on_chunk_;
  std::function<void()> done_;
  std::array<char, 8192> buf_{};
  std::string raw_;   // bytes not yet through the chunked framing
  std::string body_;  // de-chunked bytes not yet through the SSE framing
  size_t chunk_left_ = 0;
  bool headers_done_ = false;
  bool finished_ = false;
};

// "POST path" with a JSON body, Connection: close.
std::string http_post(const Target& t, const std::string& path, const std::string& body);
// Blocking GET; the response body ("" when the response has none). Error when it cannot connect.
std::string http_get(const Target& t, const std::string& path);

// A streaming /v1/completions request of prompt token ids with ignore_eos, greedy; with a
// response_format (an object: {"type": "json_object"} or a json_schema one), that too.
std::string completion_body(const std::string& model, const std::vector<int32_t>& prompt, int max_tokens,
                            const nlohmann::json& response_format = nullptr);
// n token ids uniform in [0, vocab).
std::vector<int32_t> random_prompt(SplitMix64& rng, int n, int vocab);

struct Summary {
  double mean = 0, median = 0, p99 = 0, max = 0;
  size_t count = 0;
};
// Percentiles by linear interpolation between order statistics; all zero when v is empty.
Summary summarize(std::vector<double> v);

}  // namespace megadecode::serve_bench
