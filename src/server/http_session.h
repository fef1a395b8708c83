// One HTTP/1.1 connection of HttpServer (http_server.h), over plain TCP or TLS: reads requests
// with Beast (body limit -> 413, header limit -> 431, malformed -> 400), hands each to the
// HttpHandler with an Exchange, writes complete or chunked (SSE) responses, answers HEAD with
// headers only, keeps connections alive (closes them once the server drains), and notices clients
// that disconnect while their request is in flight.
// Threading: everything but post(), close_from_server() and closed_any_thread() runs on the
// connection's strand. Only http_server.cpp includes this header.
#pragma once

#if defined(__SANITIZE_THREAD__)
#pragma GCC diagnostic ignored "-Wtsan"  // Asio's fences in TSan builds: known, harmless noise
#endif

#include <sys/socket.h>

#include <cerrno>

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "core/check.h"
#include "core/log.h"
#include "server/api_error.h"
#include "server/http_server.h"

namespace megadecode::http_detail {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// What the server sees of a session, whatever its stream.
class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void close_from_server() = 0;  // any thread
  virtual bool closed_any_thread() const = 0;
};

// What sessions share with the server: its settings, whether it still runs or drains, who is
// connected and how many exchanges are in flight.
struct Shared {
  HttpServerConfig config;
  HttpHandler handler;
  std::atomic<bool> alive{true};
  std::atomic<bool> draining{false};  // responses close their connections
  std::atomic<int> n_exchanges{0};    // requests read whose response is not yet written
  std::mutex mutex;                   // guards sessions
  std::unordered_map<SessionBase*, std::weak_ptr<SessionBase>> sessions;
};

inline std::string status_line(int status) {
  return cat("HTTP/1.1 ", status, " ", std::string(http::obsolete_reason(static_cast<http::status>(status))), "\r\n");
}

template <class Stream>
class Session : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
  using std::enable_shared_from_this<Session<Stream>>::shared_from_this;
  using std::enable_shared_from_this<Session<Stream>>::weak_from_this;

 public:
  template <class... StreamArgs>
  explicit Session(std::shared_ptr<Shared> shared, StreamArgs&&... args)
      : stream_(std::forward<StreamArgs>(args)...), shared_(std::move(shared)) {}
  ~Session() {
    leave_exchange();
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->sessions.erase(this);
  }

  void start() {
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->sessions.emplace(this, weak_from_this());
    }
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if constexpr (kTls) {
        self->tcp().expires_after(std::chrono::seconds(self->shared_->config.idle_timeout_s));
        self->stream_.async_handshake(net::ssl::stream_base::server, [self](beast::error_code ec) {
          if (ec) return self->fail();  // not TLS, or a client that gave up: nothing to answer
          self->do_read();
        });
      } else {
        self->do_read();
      }
    });
  }
  // Any thread.
  void post(std::function<void()> fn) {
    if (!shared_->alive) return;
    net::post(stream_.get_executor(), std::move(fn));
  }
  void close_from_server() override {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->fail(); });
  }
  bool closed_any_thread() const override { return closed_flag_.load(); }

  // ---- strand only ----
  void respond(uint64_t id, int status, const std::string& content_type, std::string body, const HttpHeaders& headers) {
    if (!current(id) || response_started_) return;
    response_started_ = true;
    response_done_ = true;
    if (shared_->draining) keep_alive_ = false;
    std::string head = status_line(status);
    head += "Server: megadecode\r\n";
    if (!content_type.empty()) head += cat("Content-Type: ", content_type, "\r\n");
    for (const auto& [k, v] : headers) head += cat(k, ": ", v, "\r\n");
    head += cat("Content-Length: ", body.size(), "\r\n");  // for HEAD: what GET would send
    head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    queue(std::move(head));
    if (!head_request_) queue(std::move(body));
  }
  void begin_stream(uint64_t id, const std::string& content_type) {
    if (!current(id) || response_started_) return;
    response_started_ = true;
    if (shared_->draining) keep_alive_ = false;
    chunked_ = version_ >= 11;
    if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the end of the stream is the end of the connection
    std::string head = status_line(200);
    head += "Server: megadecode\r\n";
    head += cat("Content-Type: ", content_type, "\r\nCache-Control: no-cache\r\n");
    head += chunked_ ? "Transfer-Encoding: chunked\r\n" : "";
    head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    queue(std::move(head));
  }
  void stream(uint64_t id, std::string data) {
    if (!current(id) || !response_started_ || response_done_ || data.empty() || head_request_) return;
    if (chunked_) {
      char size[32];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      data.insert(0, size);
      data += "\r\n";
    }
    queue(std::move(data));
  }
  void end_stream(uint64_t id) {
    if (!current(id) || !response_started_ || response_done_) return;
    response_done_ = true;
    queue(chunked_ && !head_request_ ? std::string("0\r\n\r\n") : std::string());
  }
  bool gone() const { return closed_; }
  void on_gone(uint64_t id, std::function<void()> fn) {
    if (closed_) {
      fn();
      return;
    }
    if (id == exchange_id_ && in_exchange_) gone_callbacks_.push_back(std::move(fn));
  }

 private:
  beast::tcp_stream& tcp() { return beast::get_lowest_layer(stream_); }
  bool current(uint64_t id) const { return !closed_ && in_exchange_ && id == exchange_id_; }

  void do_read() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(shared_->config.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(shared_->config.max_header_bytes));
    tcp().expires_after(std::chrono::seconds(shared_->config.idle_timeout_s));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // Sorts read errors: true when the session may go on with the request.
  bool read_ok(beast::error_code ec) {
    if (closed_) return false;
    if (ec == http::error::body_limit) {
      reject(413, cat("The request body is larger than the limit of ", shared_->config.max_body_bytes, " bytes"));
      return false;
    }
    if (ec == http::error::header_limit) {
      reject(431, cat("The request headers are larger than the limit of ", shared_->config.max_header_bytes, " bytes"));
      return false;
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted ||
        ec == beast::error::timeout || ec == net::error::connection_reset || ec == net::ssl::error::stream_truncated) {
      fail();
      return false;
    }
    if (ec) {
      reject(400, cat("Malformed HTTP request: ", ec.message()));
      return false;
    }
    return true;
  }

  void on_header(beast::error_code ec) {
    if (!read_ok(ec)) return;
    auto read_body = [self = shared_from_this()] {
      http::async_read(self->stream_, self->buffer_, *self->parser_,
                       [self](beast::error_code e, size_t) { self->on_read(e); });
    };
    // curl and others wait (about a second) for "100 Continue" before sending a larger body.
    const auto& req = parser_->get();
    if (req.version() >= 11 && beast::iequals(req[http::field::expect], "100-continue") && !parser_->is_done()) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(kContinue), [self = shared_from_this(), read_body](beast::error_code e, size_t) {
        if (e) return self->fail();
        read_body();
      });
      return;
    }
    read_body();
  }

  void on_read(beast::error_code ec) {
    if (!read_ok(ec)) return;
    http::request<http::string_body> req = parser_->release();
    begin_exchange(req.keep_alive(), req.version(), req.method() == http::verb::head);
    tcp().expires_never();
    watch_disconnect();
    HttpRequest r;
    r.method = std::string(req.method_string());
    const std::string target(req.target());
    r.path = target.substr(0, target.find('?'));
    r.content_type = std::string(req[http::field::content_type]);
    r.authorization = std::string(req[http::field::authorization]);
    r.body = std::move(req.body());
    auto exchange = make_exchange();
    try {
      shared_->handler(std::move(r), exchange);
    } catch (const std::exception& e) {
      log_error("request handler failed: ", e.what());
      respond(exchange_id_, 500, "application/json", server_error(e.what()).body(), {});
    }
  }

  void begin_exchange(bool keep_alive, unsigned version, bool head_request) {
    ++exchange_id_;
    if (!in_exchange_) ++shared_->n_exchanges;
    in_exchange_ = true;
    response_started_ = false;
    response_done_ = false;
    chunked_ = false;
    keep_alive_ = keep_alive;
    version_ = version;
    head_request_ = head_request;
    gone_callbacks_.clear();
  }
  void leave_exchange() {
    if (!in_exchange_) return;
    in_exchange_ = false;
    --shared_->n_exchanges;
  }

  // An error answered before any handler ran; the connection closes after it.
  void reject(int status, const std::string& message) {
    begin_exchange(false, 11, false);
    ApiError e(status, message, "invalid_request_error");
    respond(exchange_id_, status, "application/json", e.body(), {});
  }

  // Notices a client that closes its connection while its request is in flight. A readiness
  // event can be stale (edge-triggered epoll reports data that an earlier read already took), so
  // peek: 0 bytes is the peer's FIN, EAGAIN means nothing happened (wait again), data is a
  // pipelined request or a TLS record (stop watching; a failed write notices a disconnect then).
  void watch_disconnect() {
    tcp().socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), id = exchange_id_](beast::error_code ec) {
      if (!self->current(id) || self->response_done_) return;
      if (ec == net::error::operation_aborted) return;
      if (ec) return self->fail();
      char byte;
      const ssize_t n = ::recv(self->tcp().socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0) return self->fail();
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->watch_disconnect();
      if (n < 0) return self->fail();
    });
  }

  void queue(std::string data) {
    out_bytes_ += data.size();
    out_.push_back(std::move(data));
    flush();
  }

  void flush() {
    if (writing_ || closed_) return;
    if (out_.empty()) {
      if (in_exchange_ && response_done_) finish_exchange();
      return;
    }
    auto buf = std::make_shared<std::string>();
    buf->reserve(out_bytes_);
    for (std::string& s : out_) *buf += s;
    out_.clear();
    out_bytes_ = 0;
    writing_ = true;
    tcp().expires_after(std::chrono::seconds(shared_->config.write_timeout_s));
    net::async_write(stream_, net::buffer(*buf), [self = shared_from_this(), buf](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) return self->fail();
      self->tcp().expires_never();
      self->flush();
    });
  }

  void finish_exchange() {
    leave_exchange();
    gone_callbacks_.clear();
    if (keep_alive_ && shared_->alive && !shared_->draining) {
      do_read();
    } else {
      lingering_close();
    }
  }

  // TLS: send close_notify first (bounded). Then half-close, read and drop whatever the client
  // still sends (an unread request body would make close() send a reset that can destroy the
  // response in flight), then close.
  void lingering_close() {
    tcp().expires_after(std::chrono::seconds(2));
    if constexpr (kTls) {
      stream_.async_shutdown([self = shared_from_this()](beast::error_code) { self->fail(); });
    } else {
      beast::error_code ec;
      tcp().socket().shutdown(tcp::socket::shutdown_send, ec);
      drain();
    }
  }
  void drain() {
    auto scratch = std::make_shared<std::array<char, 4096>>();
    stream_.async_read_some(net::buffer(*scratch), [self = shared_from_this(), scratch](beast::error_code ec, size_t) {
      if (ec) return self->fail();
      self->drain();
    });
  }

  void fail() {
    if (closed_) return;
    closed_ = true;
    closed_flag_ = true;
    auto callbacks = std::move(gone_callbacks_);
    gone_callbacks_.clear();
    if (in_exchange_ && !response_done_)
      for (auto& fn : callbacks) fn();
    leave_exchange();
    beast::error_code ec;
    tcp().socket().shutdown(tcp::socket::shutdown_both, ec);
    tcp().close();
  }

  std::shared_ptr<Exchange> make_exchange();

  Stream stream_;
  std::shared_ptr<Shared> shared_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> out_;
  size_t out_bytes_ = 0;
  bool writing_ = false;
  bool closed_ = false;
  std::atomic<bool> closed_flag_{false};  // closed_, readable from other threads
  uint64_t exchange_id_ = 0;
  bool in_exchange_ = false;
  bool response_started_ = false;
  bool response_done_ = false;
  bool chunked_ = false;
  bool keep_alive_ = false;
  bool head_request_ = false;  // HEAD: headers only, whatever the handler answers
  unsigned version_ = 11;
  std::vector<std::function<void()>> gone_callbacks_;
};

template <class Stream>
class SessionExchange : public Exchange {
 public:
  SessionExchange(std::shared_ptr<Session<Stream>> session, uint64_t id) : session_(std::move(session)), id_(id) {}
  void post(std::function<void()> fn) override { session_->post(std::move(fn)); }
  void respond(int status, const std::string& content_type, std::string body, const HttpHeaders& headers) override {
    session_->respond(id_, status, content_type, std::move(body), headers);
  }
  void begin_stream(const std::string& content_type) override { session_->begin_stream(id_, content_type); }
  void stream(std::string data) override { session_->stream(id_, std::move(data)); }
  void end_stream() override { session_->end_stream(id_); }
  bool client_gone() const override { return session_->gone(); }
  void on_client_gone(std::function<void()> fn) override { session_->on_gone(id_, std::move(fn)); }

 private:
  std::shared_ptr<Session<Stream>> session_;
  uint64_t id_;
};

template <class Stream>
std::shared_ptr<Exchange> Session<Stream>::make_exchange() {
  return std::make_shared<SessionExchange<Stream>>(shared_from_this(), exchange_id_);
}

}  // namespace megadecode::http_detail
