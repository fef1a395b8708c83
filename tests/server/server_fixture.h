// A test server: the engine on the fake backend, a byte-level fake tokenizer and chat template
// (or no tokenizer at all, as `serve --skip-tokenizer-init` runs), the HTTP server on 127.0.0.1 and
// an ephemeral port (TLS and an API key when asked); plus a small blocking HTTP client and an
// SSE parser. Teardown follows the server's lifetime rule (HTTP stop, engine stop, destroy).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "../engine/fakes.h"
#include "engine/engine.h"
#include "server/http_server.h"
#include "server/model_text.h"
#include "server/openai_service.h"

namespace megadecode::testing {

class FakeTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool /*add_special_tokens*/) const override {
    std::vector<int32_t> out;
    for (size_t i = 0; i < text.size();) {
      bool special = false;
      for (int32_t s = 256; s < kFakeVocab; ++s) {
        const std::string name = fake_special_text(s);
        if (text.substr(i, name.size()) == name) {
          out.push_back(s);
          i += name.size();
          special = true;
          break;
        }
      }
      if (!special) out.push_back(static_cast<unsigned char>(text[i++]));
    }
    return out;
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::string s;
    for (int32_t t : ids) {
      if (t >= 256) {
        if (!skip_special_tokens) s += fake_special_text(t);
      } else {
        s += static_cast<char>(t);
      }
    }
    return s;
  }
  int vocab_size() const override { return kFakeVocab; }
  std::optional<int32_t> token_id(std::string_view token) const override {
    for (int32_t s = 256; s < kFakeVocab; ++s)
      if (fake_special_text(s) == token) return s;
    return std::nullopt;
  }
  bool is_special(int32_t id) const override { return id >= 256; }
  std::string token_bytes(int32_t id) const override {
    return id >= 256 ? fake_special_text(id) : std::string(1, static_cast<char>(id));
  }
  std::optional<int32_t> eos_token_id() const override { return kFakeEos; }
};

// The fake model's chat template: roles and contents only (no tool-call or reasoning format).
inline std::string fake_render_chat(const ChatInput& input) {
  std::string s;
  for (const ChatMessage& m : input.messages) s += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (input.add_generation_prompt) s += "<|im_start|>assistant\n";
  return s;
}

inline ChatInput user_chat(std::vector<std::pair<std::string, std::string>> messages) {
  ChatInput in;
  for (auto& [role, content] : messages) in.messages.push_back(ChatMessage{role, content, {}, {}, {}});
  return in;
}

struct TestServerOptions {
  int n_blocks = 256;
  int block_size = 4;
  int max_positions = 512;
  SchedulerConfig scheduler{.max_num_seqs = 8, .max_prefill_tokens = 32, .prefix_caching = true, .check_invariants = true};
  int max_waiting = 1024;
  size_t max_body_bytes = 1 << 20;
  int n_io_threads = 2;
  int backend_delay_us = 0;
  GenerationDefaults defaults;
  bool skip_tokenizer = false;  // no tokenizer: token-id prompts and "token_ids" outputs only
  ApiKeyGuard api_key;          // none: every route open
  std::string ssl_certfile, ssl_keyfile;  // both: HTTPS only
};

class TestServer {
 public:
  explicit TestServer(const TestServerOptions& o = {}) : backend(o.n_blocks, o.block_size, o.max_positions) {
    backend.set_delay_us(o.backend_delay_us);
    EngineConfig ec;
    ec.scheduler = o.scheduler;
    ec.max_waiting = o.max_waiting;
    engine = std::make_unique<Engine>(backend, ec, o.skip_tokenizer ? no_text_decoders() : fake_decoders());
    ServedModel model;
    if (o.skip_tokenizer) {
      model = served_model_without_tokenizer({}, "fake-model", backend.config());  // end tokens: kFakeEos
    } else {
      model.name = "fake-model";
      model.root = "/models/fake";
      model.tokenizer = &tokenizer;
      model.chat.render = fake_render_chat;
      model.eos_token_ids = {kFakeEos};
    }
    model.defaults = o.defaults;
    service = std::make_unique<OpenAiService>(*engine, model, o.api_key);
    HttpServerConfig hc;
    hc.port = 0;
    hc.n_threads = o.n_io_threads;
    hc.max_body_bytes = o.max_body_bytes;
    hc.ssl_certfile = o.ssl_certfile;
    hc.ssl_keyfile = o.ssl_keyfile;
    http = std::make_unique<HttpServer>(hc, service->handler());
    engine->start();
    http->start();
  }
  ~TestServer() {
    http->stop();
    engine->stop();
    http.reset();
    service.reset();
    engine.reset();
  }
  int port() const { return http->port(); }
  // Blocks until the engine holds no KV blocks and runs nothing (bounded), then checks invariants.
  bool drained(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      bool idle = false;
      engine->inspect([&](const Scheduler& s) {
        s.check_invariants();
        idle = s.idle() && s.kv().n_used() == 0;
      });
      if (idle) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  FakeBackend backend;
  FakeTokenizer tokenizer;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<OpenAiService> service;
  std::unique_ptr<HttpServer> http;
};

struct HttpResult {
  int status = 0;
  std::map<std::string, std::string> headers;
  std::string body;
  nlohmann::json json() const { return nlohmann::json::parse(body); }
};

// One blocking keep-alive connection.
class HttpClient {
 public:
  explicit HttpClient(int port) : socket_(ioc_) {
    namespace net = boost::asio;
    socket_.connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  }
  HttpResult request(const std::string& method, const std::string& path, const std::string& body = "",
                     const std::string& content_type = "application/json", const HttpHeaders& headers = {}) {
    namespace http = boost::beast::http;
    http::request<http::string_body> req(http::string_to_verb(method), path, 11);
    req.set(http::field::host, "127.0.0.1");
    for (const auto& [k, v] : headers) req.set(k, v);
    if (!body.empty() || method == "POST") {
      if (!content_type.empty()) req.set(http::field::content_type, content_type);
      req.body() = body;
      req.prepare_payload();
    }
    http::write(socket_, req);
    http::response_parser<http::string_body> parser;
    parser.body_limit(1u << 30);
    parser.skip(method == "HEAD");  // a HEAD response has no body, whatever Content-Length says
    http::read(socket_, buffer_, parser);
    HttpResult r;
    r.status = static_cast<int>(parser.get().result_int());
    for (const auto& f : parser.get()) r.headers[std::string(f.name_string())] = std::string(f.value());
    r.body = parser.get().body();
    return r;
  }
  boost::asio::ip::tcp::socket& socket() { return socket_; }

 private:
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
};

inline HttpResult post_json(int port, const std::string& path, const nlohmann::json& body) {
  HttpClient c(port);
  return c.request("POST", path, body.dump());
}

// The `data:` payloads of an SSE body, in order.
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

}  // namespace megadecode::testing
