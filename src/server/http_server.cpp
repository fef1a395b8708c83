// HttpServer: acceptor, per-connection sessions on strands, request parsing with Beast, response
// writing (complete or chunked) and disconnect detection (see http_server.h).
#if defined(__SANITIZE_THREAD__)
#pragma GCC diagnostic ignored "-Wtsan"  // Asio's fences in TSan builds: known, harmless noise
#endif
#include "server/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <cerrno>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "core/check.h"
#include "core/log.h"
#include "server/api_error.h"

namespace megadecode {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

class Session;

// What sessions share with the server: its settings, whether it still runs, who is connected.
struct Shared {
  HttpServerConfig config;
  HttpHandler handler;
  std::atomic<bool> alive{true};
  std::mutex mutex;  // guards sessions
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
};

std::string status_line(int status) {
  return cat("HTTP/1.1 ", status, " ", std::string(http::obsolete_reason(static_cast<http::status>(status))), "\r\n");
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, std::shared_ptr<Shared> shared) : stream_(std::move(socket)), shared_(std::move(shared)) {}
  ~Session() {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->sessions.erase(this);
  }

  void start() {
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->sessions.emplace(this, weak_from_this());
    }
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }
  // Any thread.
  void post(std::function<void()> fn) {
    if (!shared_->alive) return;
    net::post(stream_.get_executor(), std::move(fn));
  }
  void close_from_server() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->fail(); });
  }

  // ---- strand only ----
  void respond(uint64_t id, int status, const std::string& content_type, std::string body, const HttpHeaders& headers) {
    if (!current(id) || response_started_) return;
    response_started_ = true;
    response_done_ = true;
    std::string head = status_line(status);
    head += "Server: megadecode\r\n";
    if (!content_type.empty()) head += cat("Content-Type: ", content_type, "\r\n");
    for (const auto& [k, v] : headers) head += cat(k, ": ", v, "\r\n");
    head += cat("Content-Length: ", body.size(), "\r\n");
    head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    queue(std::move(head));
    queue(std::move(body));
  }
  void begin_stream(uint64_t id, const std::string& content_type) {
    if (!current(id) || response_started_) return;
    response_started_ = true;
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
    if (!current(id) || !response_started_ || response_done_ || data.empty()) return;
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
    queue(chunked_ ? std::string("0\r\n\r\n") : std::string());
  }
  bool gone() const { return closed_; }
  bool closed_any_thread() const { return closed_flag_.load(); }
  void on_gone(uint64_t id, std::function<void()> fn) {
    if (closed_) {
      fn();
      return;
    }
    if (id == exchange_id_ && in_exchange_) gone_callbacks_.push_back(std::move(fn));
  }

 private:
  bool current(uint64_t id) const { return !closed_ && in_exchange_ && id == exchange_id_; }

  void do_read() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(shared_->config.max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(std::chrono::seconds(shared_->config.idle_timeout_s));
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
      reject(431, "The request headers are too large");
      return false;
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted ||
        ec == beast::error::timeout || ec == net::error::connection_reset) {
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
    begin_exchange(req.keep_alive(), req.version());
    stream_.expires_never();
    watch_disconnect();
    HttpRequest r;
    r.method = std::string(req.method_string());
    const std::string target(req.target());
    r.path = target.substr(0, target.find('?'));
    r.body = std::move(req.body());
    auto exchange = make_exchange();
    try {
      shared_->handler(std::move(r), exchange);
    } catch (const std::exception& e) {
      log_error("request handler failed: ", e.what());
      respond(exchange_id_, 500, "application/json", server_error(e.what()).body(), {});
    }
  }

  void begin_exchange(bool keep_alive, unsigned version) {
    ++exchange_id_;
    in_exchange_ = true;
    response_started_ = false;
    response_done_ = false;
    chunked_ = false;
    keep_alive_ = keep_alive;
    version_ = version;
    gone_callbacks_.clear();
  }

  // An error answered before any handler ran; the connection closes after it.
  void reject(int status, const std::string& message) {
    begin_exchange(false, 11);
    ApiError e(status, message, "invalid_request_error");
    respond(exchange_id_, status, "application/json", e.body(), {});
  }

  // Notices a client that closes its connection while its request is in flight. A readiness
  // event can be stale (edge-triggered epoll reports data that an earlier read already took), so
  // peek: 0 bytes is the peer's FIN, EAGAIN means nothing happened (wait again), data is a
  // pipelined request (stop watching; a failed write will notice a disconnect from here on).
  void watch_disconnect() {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), id = exchange_id_](beast::error_code ec) {
      if (!self->current(id) || self->response_done_) return;
      if (ec == net::error::operation_aborted) return;
      if (ec) return self->fail();
      char byte;
      const ssize_t n = ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
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
    stream_.expires_after(std::chrono::seconds(shared_->config.write_timeout_s));
    net::async_write(stream_, net::buffer(*buf), [self = shared_from_this(), buf](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) return self->fail();
      self->stream_.expires_never();
      self->flush();
    });
  }

  void finish_exchange() {
    in_exchange_ = false;
    gone_callbacks_.clear();
    if (keep_alive_ && shared_->alive) {
      do_read();
    } else {
      lingering_close();
    }
  }

  // Half-close, then read and drop whatever the client still sends (an unread request body would
  // make close() send a reset that can destroy the response in flight), then close.
  void lingering_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(2));
    drain();
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
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  std::shared_ptr<Exchange> make_exchange();

  beast::tcp_stream stream_;
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
  unsigned version_ = 11;
  std::vector<std::function<void()>> gone_callbacks_;
};

class SessionExchange : public Exchange {
 public:
  SessionExchange(std::shared_ptr<Session> session, uint64_t id) : session_(std::move(session)), id_(id) {}
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
  std::shared_ptr<Session> session_;
  uint64_t id_;
};

std::shared_ptr<Exchange> Session::make_exchange() {
  return std::make_shared<SessionExchange>(shared_from_this(), exchange_id_);
}

}  // namespace

struct HttpServer::Impl {
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> retry_timer;
  std::vector<std::thread> threads;
  int port = 0;
  bool started = false;
  bool stopped = false;

  void accept() {
    acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor->is_open()) return;
      if (ec) {
        // Out of file descriptors and similar: wait a little instead of spinning.
        log_warn("accept failed: ", ec.message());
        retry_timer->expires_after(std::chrono::milliseconds(50));
        retry_timer->async_wait([this](beast::error_code) {
          if (acceptor->is_open()) accept();
        });
        return;
      }
      beast::error_code nd;
      socket.set_option(tcp::no_delay(true), nd);  // SSE pieces are small: send them at once
      std::make_shared<Session>(std::move(socket), shared)->start();
      accept();
    });
  }
};

HttpServer::HttpServer(const HttpServerConfig& config, HttpHandler handler) : impl_(std::make_unique<Impl>()) {
  MD_REQUIRE(config.n_threads >= 1, "the HTTP server needs at least one thread");
  impl_->shared->config = config;
  impl_->shared->handler = std::move(handler);
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& m = *impl_;
  MD_CHECK(!m.started, "HTTP server started twice");
  const HttpServerConfig& c = m.shared->config;
  beast::error_code ec;
  const auto address = net::ip::make_address(c.host, ec);
  MD_REQUIRE(!ec, "--host ", c.host, ": not an IP address (", ec.message(), ")");
  MD_REQUIRE(c.port >= 0 && c.port <= 65535, "--port ", c.port, " out of range");
  tcp::endpoint endpoint(address, static_cast<unsigned short>(c.port));
  m.acceptor.emplace(net::make_strand(m.ioc));
  m.acceptor->open(endpoint.protocol(), ec);
  MD_REQUIRE(!ec, "cannot open a socket: ", ec.message());
  m.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  m.acceptor->bind(endpoint, ec);
  MD_REQUIRE(!ec, "cannot bind ", c.host, ":", c.port, ": ", ec.message());
  m.acceptor->listen(net::socket_base::max_listen_connections, ec);
  MD_REQUIRE(!ec, "cannot listen on ", c.host, ":", c.port, ": ", ec.message());
  m.port = m.acceptor->local_endpoint().port();
  m.retry_timer.emplace(m.acceptor->get_executor());
  m.started = true;
  m.accept();
  for (int i = 0; i < c.n_threads; ++i) m.threads.emplace_back([&m] { m.ioc.run(); });
}

int HttpServer::port() const { return impl_->port; }

size_t HttpServer::n_connections() const {
  std::lock_guard<std::mutex> lock(impl_->shared->mutex);
  return impl_->shared->sessions.size();
}

void HttpServer::stop() {
  Impl& m = *impl_;
  if (!m.started || m.stopped) return;
  m.stopped = true;
  m.shared->alive = false;
  net::post(m.acceptor->get_executor(), [&m] {
    beast::error_code ec;
    m.acceptor->close(ec);
    m.retry_timer->cancel();
  });
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard<std::mutex> lock(m.shared->mutex);
    for (auto& [ptr, weak] : m.shared->sessions)
      if (auto s = weak.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->close_from_server();
  // Give the closes a moment to run, then stop whatever is left (bounded shutdown).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!m.ioc.stopped() && std::chrono::steady_clock::now() < deadline) {
    if (std::all_of(live.begin(), live.end(), [](const auto& s) { return s->closed_any_thread(); })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  live.clear();
  m.ioc.stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
}

long raise_open_file_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return -1;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
    getrlimit(RLIMIT_NOFILE, &r);
  }
  return static_cast<long>(r.rlim_cur);
}

}  // namespace megadecode
