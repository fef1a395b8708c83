// The client side of `megadecode bench serve` (see serve_client.h).
#include "bench/serve_client.h"

#include <algorithm>
#include <numeric>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace megadecode::serve_bench {

using nlohmann::json;

Target parse_url(const std::string& url) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  MD_REQUIRE(rest.find("://") == std::string::npos, "--url ", url, ": only http:// is supported");
  rest = rest.substr(0, rest.find('/'));
  Target t;
  const size_t colon = rest.rfind(':');
  t.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    MD_REQUIRE(!port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos,
               "--url ", url, ": expected http://HOST:PORT");
    t.port = std::stoi(port);
  }
  MD_REQUIRE(!t.host.empty() && t.port > 0 && t.port < 65536, "--url ", url, ": expected http://HOST:PORT");
  return t;
}

namespace {

bool non_empty_string(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}

}  // namespace

bool carries_tokens(const json& event) {
  auto choices = event.find("choices");
  if (choices == event.end() || !choices->is_array()) return false;
  for (const json& c : *choices) {
    if (!c.is_object()) continue;
    if (non_empty_string(c, "text")) return true;
    if (auto ids = c.find("token_ids"); ids != c.end() && ids->is_array() && !ids->empty()) return true;
    if (auto delta = c.find("delta"); delta != c.end() && delta->is_object() && non_empty_string(*delta, "content"))
      return true;
  }
  return false;
}

BenchRequest::BenchRequest(net::io_context& ioc, const tcp::endpoint& ep, std::string http_request,
                           RequestRecord& rec, BenchClock::time_point t0, std::function<void(double)> on_chunk,
                           std::function<void()> done)
    : socket_(ioc),
      ep_(ep),
      request_(std::move(http_request)),
      rec_(rec),
      t0_(t0),
      on_chunk_(std::move(on_chunk)),
      done_(std::move(done)) {}

double BenchRequest::now() const { return std::chrono::duration<double>(BenchClock::now() - t0_).count(); }

void BenchRequest::start() {
  rec_.send = now();
  socket_.async_connect(ep_, [self = shared_from_this()](boost::system::error_code ec) {
    if (ec) return self->finish("connect: " + ec.message());
    net::async_write(self->socket_, net::buffer(self->request_), [self](boost::system::error_code e, size_t) {
      if (e) return self->finish("write: " + e.message());
      self->read();
    });
  });
}

void BenchRequest::cancel() {
  if (finished_) return;
  rec_.cancelled = true;
  finish("");
}

void BenchRequest::read() {
  if (finished_) return;
  socket_.async_read_some(net::buffer(buf_), [self = shared_from_this()](boost::system::error_code ec, size_t n) {
    if (self->finished_) return;  // cancelled while the read was pending
    if (ec) return self->finish("read: " + ec.message());
    self->raw_.append(self->buf_.data(), n);
    self->parse();
  });
}

void BenchRequest::parse() {
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
      const std::string size = raw_.substr(0, eol);
      if (size.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos || size.size() > 8)
        return finish("malformed chunk size");
      chunk_left_ = std::stoul(size, nullptr, 16);
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
    if (j.is_discarded() || !j.is_object()) return finish("invalid JSON event");
    if (j.contains("error")) return finish("server error: " + j["error"].value("message", ""));
    if (const auto u = j.find("usage"); u != j.end() && u->is_object()) {
      rec_.output_tokens = u->value("completion_tokens", 0);
      rec_.prompt_tokens = u->value("prompt_tokens", 0);
      if (const auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object())
        rec_.cached_tokens = d->value("cached_tokens", 0);
    }
    if (const auto c = j.find("choices"); c != j.end() && c->is_array())
      for (const json& choice : *c)
        if (choice.is_object() && choice.value("index", 0) == 0)
          if (const auto ids = choice.find("token_ids"); ids != choice.end() && ids->is_array())
            for (const json& id : *ids)
              if (id.is_number_integer()) rec_.token_ids.push_back(id.get<int32_t>());
    if (carries_tokens(j)) {
      const double t = now();
      if (rec_.first_token < 0) rec_.first_token = t;
      rec_.chunk_times.push_back(t);
      if (on_chunk_) on_chunk_(t);
      if (finished_) return;  // the callback cancelled this request
    }
  }
  if (last_chunk) return finish("");
  read();
}

void BenchRequest::finish(const std::string& error) {
  if (finished_) return;
  finished_ = true;
  rec_.end = now();
  rec_.ok = error.empty() && !rec_.cancelled && rec_.first_token >= 0;
  rec_.error = error.empty() && !rec_.ok && !rec_.cancelled ? "no tokens" : error;
  boost::system::error_code ec;
  socket_.close(ec);
  if (done_) done_();
}

std::string http_post(const Target& t, const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: " + t.host + "\r\nContent-Type: application/json\r\n" +
         "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string http_get(const Target& t, const std::string& path) {
  net::io_context ioc;
  tcp::socket s(ioc);
  boost::system::error_code ec;
  s.connect(tcp::endpoint(net::ip::make_address(t.host), static_cast<unsigned short>(t.port)), ec);
  MD_REQUIRE(!ec, "cannot connect to http://", t.host, ":", t.port, ": ", ec.message());
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + t.host + "\r\nConnection: close\r\n\r\n";
  net::write(s, net::buffer(req));
  std::string out;
  std::array<char, 4096> buf{};
  for (size_t n; (n = s.read_some(net::buffer(buf), ec)) > 0 || !ec;) out.append(buf.data(), n);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

std::string completion_body(const std::string& model, const std::vector<int32_t>& prompt, int max_tokens,
                            const json& response_format) {
  json body = {{"model", model},           {"prompt", prompt},      {"max_tokens", max_tokens},
               {"ignore_eos", true},       {"stream", true},        {"temperature", 0.0},
               {"stream_options", {{"include_usage", true}}}};
  if (!response_format.is_null()) body["response_format"] = response_format;
  return body.dump();
}

std::vector<int32_t> random_prompt(SplitMix64& rng, int n, int vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return ids;
}

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.count = v.size();
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  auto pct = [&](double p) {
    const double idx = p * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(idx);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
  };
  s.median = pct(0.5);
  s.p99 = pct(0.99);
  s.max = v.back();
  return s;
}

}  // namespace megadecode::serve_bench
