// `megadecode bench serve`: an HTTP load generator for a running server (vLLM's `bench serve`
// metrics): sends --num-prompts streaming requests of random token-id prompts (--input-len tokens,
// --output-len tokens with ignore_eos), at most --concurrency in flight, arriving as a Poisson
// process at --request-rate (inf: all at once). Reports throughput, TTFT, TPOT, ITL and E2E
// latency (mean, median, p99) as a table and, with --json FILE, as JSON.
#if defined(__SANITIZE_THREAD__)
#pragma GCC diagnostic ignored "-Wtsan"  // Asio's fences in TSan builds: known, harmless noise
#endif
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange
#include <vector>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "cli/args.h"
#include "core/check.h"
#include "core/rng.h"

namespace megadecode {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;
using BenchClock = std::chrono::steady_clock;

struct Target {
  std::string host;
  int port = 8000;
};

Target parse_url(const std::string& url) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  MD_REQUIRE(rest.find("://") == std::string::npos, "--url ", url, ": only http:// is supported");
  rest = rest.substr(0, rest.find('/'));
  Target t;
  const size_t colon = rest.rfind(':');
  t.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  if (colon != std::string::npos) t.port = std::stoi(rest.substr(colon + 1));
  MD_REQUIRE(!t.host.empty() && t.port > 0 && t.port < 65536, "--url ", url, ": expected http://HOST:PORT");
  return t;
}

struct RequestRecord {
  bool ok = false;
  std::string error;
  double send = 0.0;                // seconds since the benchmark started
  double first_token = -1.0;
  double end = 0.0;
  std::vector<double> chunk_times;  // arrival of each chunk that carried text
  int output_tokens = 0;
};

// One streaming request on its own connection; parses the chunked SSE response as it arrives.
class BenchRequest : public std::enable_shared_from_this<BenchRequest> {
 public:
  BenchRequest(net::io_context& ioc, const tcp::endpoint& ep, std::string http_request, RequestRecord& rec,
               BenchClock::time_point t0, std::function<void()> done)
      : socket_(ioc), ep_(ep), request_(std::move(http_request)), rec_(rec), t0_(t0), done_(std::move(done)) {}

  void start() {
    rec_.send = now();
    socket_.async_connect(ep_, [self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return self->finish("connect: " + ec.message());
      net::async_write(self->socket_, net::buffer(self->request_), [self](boost::system::error_code e, size_t) {
        if (e) return self->finish("write: " + e.message());
        self->read();
      });
    });
  }

 private:
  double now() const { return std::chrono::duration<double>(BenchClock::now() - t0_).count(); }
  void read() {
    socket_.async_read_some(net::buffer(buf_), [self = shared_from_this()](boost::system::error_code ec, size_t n) {
      if (ec) return self->finish("read: " + ec.message());
      self->raw_.append(self->buf_.data(), n);
      self->parse();
    });
  }
  void parse() {
    if (!headers_done_) {
      const size_t end = raw_.find("\r\n\r\n");
      if (end == std::string::npos) return read();
      if (raw_.compare(0, 12, "HTTP/1.1 200") != 0) return finish("HTTP status " + raw_.substr(9, 3));
      raw_.erase(0, end + 4);
      headers_done_ = true;
    }
    // Chunked framing, then SSE events.
    bool last_chunk = false;
    for (;;) {
      if (chunk_left_ == 0) {
        const size_t eol = raw_.find("\r\n");
        if (eol == std::string::npos) break;
        if (eol == 0) {
          raw_.erase(0, 2);
          continue;
        }
        chunk_left_ = std::stoul(raw_.substr(0, eol), nullptr, 16);
        raw_.erase(0, eol + 2);
        if (chunk_left_ == 0) {
          last_chunk = true;
          break;
        }
      }
      const size_t take = std::min(chunk_left_, raw_.size());
      body_.append(raw_, 0, take);
      raw_.erase(0, take);
      chunk_left_ -= take;
      if (chunk_left_ > 0) break;
    }
    for (size_t end; (end = body_.find("\n\n")) != std::string::npos;) {
      std::string event = body_.substr(0, end);
      body_.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      json j = json::parse(event.substr(6), nullptr, false);
      if (j.is_discarded()) return finish("invalid JSON event");
      if (j.contains("error")) return finish("server error: " + j["error"].value("message", ""));
      if (j.contains("usage") && j["usage"].is_object()) rec_.output_tokens = j["usage"].value("completion_tokens", 0);
      bool has_text = false;
      for (const json& c : j["choices"]) {
        if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) has_text = true;
        if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string() &&
            !c["delta"]["content"].get<std::string>().empty())
          has_text = true;
      }
      if (has_text) {
        const double t = now();
        if (rec_.first_token < 0) rec_.first_token = t;
        rec_.chunk_times.push_back(t);
      }
    }
    if (last_chunk) return finish("");
    read();
  }
  void finish(const std::string& error) {
    if (finished_) return;
    finished_ = true;
    rec_.end = now();
    rec_.ok = error.empty() && rec_.first_token >= 0;
    rec_.error = error.empty() && !rec_.ok ? "no tokens" : error;
    boost::system::error_code ec;
    socket_.close(ec);
    done_();
  }

  tcp::socket socket_;
  tcp::endpoint ep_;
  std::string request_;
  RequestRecord& rec_;
  BenchClock::time_point t0_;
  std::function<void()> done_;
  std::array<char, 8192> buf_{};
  std::string raw_;
  std::string body_;
  size_t chunk_left_ = 0;
  bool headers_done_ = false;
  bool finished_ = false;
};

struct Summary {
  double mean = 0, median = 0, p99 = 0;
};
Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  auto pct = [&](double p) {
    const double idx = p * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(idx);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
  };
  s.median = pct(0.5);
  s.p99 = pct(0.99);
  return s;
}

std::string http_get(const Target& t, const std::string& path) {
  net::io_context ioc;
  tcp::socket s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address(t.host), static_cast<unsigned short>(t.port)));
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + t.host + "\r\nConnection: close\r\n\r\n";
  net::write(s, net::buffer(req));
  std::string out;
  boost::system::error_code ec;
  std::array<char, 4096> buf{};
  for (size_t n; (n = s.read_some(net::buffer(buf), ec)) > 0 || !ec;) out.append(buf.data(), n);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

}  // namespace

int bench_serve(int argc, char** argv) {
  Args args(argc, argv,
            {"url", "model", "endpoint", "num-prompts", "concurrency", "request-rate", "input-len", "output-len",
             "seed", "json", "vocab"},
            {});
  const Target target = parse_url(args.get("url", "http://127.0.0.1:8000"));
  const int n_prompts = static_cast<int>(args.get_int("num-prompts", 200));
  const int concurrency = static_cast<int>(args.get_int("concurrency", 16));
  const double rate = args.has("request-rate") && args.get("request-rate", "inf") != "inf" ? args.get_double("request-rate", 0) : 0.0;
  const int input_len = static_cast<int>(args.get_int("input-len", 128));
  const int output_len = static_cast<int>(args.get_int("output-len", 128));
  const std::string endpoint = args.get("endpoint", "completions");
  MD_REQUIRE(n_prompts >= 1 && concurrency >= 1 && input_len >= 1 && output_len >= 1,
             "bench serve: --num-prompts, --concurrency, --input-len and --output-len must be positive");
  MD_REQUIRE(endpoint == "completions" || endpoint == "chat", "--endpoint must be completions or chat");
  MD_REQUIRE(rate >= 0.0, "--request-rate must be positive or inf");
  const net::ip::address address = net::ip::make_address(target.host);

  std::string model = args.get("model", "");
  if (model.empty()) {
    json models = json::parse(http_get(target, "/v1/models"), nullptr, false);
    MD_REQUIRE(!models.is_discarded() && models.contains("data") && !models["data"].empty(),
               "bench serve: GET /v1/models did not name a model; pass --model");
    model = models["data"][0]["id"];
  }
  // Random prompts: token ids from the low end of the vocabulary (every model has them); chat
  // prompts are random lowercase words instead (about one token each).
  const int vocab = static_cast<int>(args.get_int("vocab", 1000));
  SplitMix64 rng(static_cast<uint64_t>(args.get_int("seed", 0)));
  std::vector<std::string> requests;
  for (int i = 0; i < n_prompts; ++i) {
    json body = {{"model", model}, {"max_tokens", output_len}, {"ignore_eos", true}, {"stream", true},
                 {"stream_options", {{"include_usage", true}}}, {"temperature", 0.0}};
    std::string path;
    if (endpoint == "completions") {
      json ids = json::array();
      for (int k = 0; k < input_len; ++k) ids.push_back(static_cast<int>(rng.below(vocab)));
      body["prompt"] = ids;
      path = "/v1/completions";
    } else {
      std::string text;
      for (int k = 0; k < input_len; ++k) text += std::string(k ? " " : "") + static_cast<char>('a' + rng.below(26));
      body["messages"] = {{{"role", "user"}, {"content", text}}};
      path = "/v1/chat/completions";
    }
    const std::string b = body.dump();
    requests.push_back("POST " + path + " HTTP/1.1\r\nHost: " + target.host + "\r\nContent-Type: application/json\r\n" +
                       "Connection: close\r\nContent-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b);
  }

  // Arrival times: Poisson at `rate`, or all at t = 0.
  std::vector<double> arrival(n_prompts, 0.0);
  for (int i = 1; i < n_prompts && rate > 0.0; ++i) arrival[i] = arrival[i - 1] - std::log(1.0 - rng.unit()) / rate;

  net::io_context ioc;
  const tcp::endpoint ep(address, static_cast<unsigned short>(target.port));
  std::vector<RequestRecord> records(n_prompts);
  const auto t0 = BenchClock::now();
  int next = 0, in_flight = 0;
  net::steady_timer timer(ioc);
  std::function<void()> pump = [&] {
    while (next < n_prompts && in_flight < concurrency) {
      const double due = arrival[next];
      const double elapsed = std::chrono::duration<double>(BenchClock::now() - t0).count();
      if (due > elapsed) {
        timer.expires_after(std::chrono::duration_cast<BenchClock::duration>(std::chrono::duration<double>(due - elapsed)));
        timer.async_wait([&](boost::system::error_code) { pump(); });
        return;
      }
      ++in_flight;
      const int i = next++;
      std::make_shared<BenchRequest>(ioc, ep, requests[i], records[i], t0, [&] {
        --in_flight;
        pump();
      })->start();
    }
  };
  pump();
  ioc.run();
  const double duration = std::chrono::duration<double>(BenchClock::now() - t0).count();

  std::vector<double> ttft, tpot, itl, e2e;
  int completed = 0, failed = 0;
  long long total_out = 0;
  std::string first_error;
  for (const RequestRecord& r : records) {
    if (!r.ok) {
      ++failed;
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++completed;
    total_out += r.output_tokens;
    ttft.push_back(r.first_token - r.send);
    e2e.push_back(r.end - r.send);
    if (r.output_tokens > 1) tpot.push_back((r.end - r.send - (r.first_token - r.send)) / (r.output_tokens - 1));
    for (size_t k = 1; k < r.chunk_times.size(); ++k) itl.push_back(r.chunk_times[k] - r.chunk_times[k - 1]);
  }
  const Summary s_ttft = summarize(ttft), s_tpot = summarize(tpot), s_itl = summarize(itl), s_e2e = summarize(e2e);
  char rate_text[32] = "inf";
  if (rate > 0) std::snprintf(rate_text, sizeof rate_text, "%g/s", rate);
  std::printf("bench serve: %s, %d prompts (%d in / %d out tokens), concurrency %d, rate %s\n", model.c_str(),
              n_prompts, input_len, output_len, concurrency, rate_text);
  std::printf("  completed %d, failed %d%s%s\n", completed, failed, first_error.empty() ? "" : " (first error: ",
              first_error.empty() ? "" : (first_error + ")").c_str());
  std::printf("  duration %.3f s, %.2f req/s, %.1f output tok/s\n", duration, completed / duration, total_out / duration);
  std::printf("  %-6s %10s %10s %10s  (ms)\n", "", "mean", "median", "p99");
  for (auto [name, s] : {std::pair{"TTFT", s_ttft}, std::pair{"TPOT", s_tpot}, std::pair{"ITL", s_itl}, std::pair{"E2EL", s_e2e}})
    std::printf("  %-6s %10.2f %10.2f %10.2f\n", name, s.mean * 1e3, s.median * 1e3, s.p99 * 1e3);

  if (args.has("json")) {
    auto ms = [](const Summary& s) { return json{{"mean_ms", s.mean * 1e3}, {"median_ms", s.median * 1e3}, {"p99_ms", s.p99 * 1e3}}; };
    json out = {{"model", model},          {"endpoint", endpoint},       {"num_prompts", n_prompts},
                {"concurrency", concurrency}, {"request_rate", rate > 0 ? json(rate) : json("inf")},
                {"input_len", input_len},  {"output_len", output_len},   {"completed", completed},
                {"failed", failed},        {"duration_s", duration},     {"request_throughput", completed / duration},
                {"output_token_throughput", total_out / duration},       {"total_output_tokens", total_out},
                {"ttft", ms(s_ttft)},      {"tpot", ms(s_tpot)},         {"itl", ms(s_itl)},
                {"e2el", ms(s_e2e)}};
    std::ofstream f(args.get("json", ""));
    f << out.dump(2) << "\n";
    MD_REQUIRE(f.good(), "cannot write ", args.get("json", ""));
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace megadecode
