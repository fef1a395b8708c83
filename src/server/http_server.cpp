// HttpServer: the acceptor, the I/O threads, TLS set-up, draining and the bounded stop (see
// http_server.h); each connection is a Session (http_session.h).
#include "server/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <thread>

#include "server/http_session.h"
#include "server/tls_context.h"

namespace megadecode {

using namespace http_detail;

struct HttpServer::Impl {
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  net::io_context ioc;
  std::shared_ptr<net::ssl::context> tls;  // null: plain TCP
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> retry_timer;
  std::vector<std::thread> threads;
  int port = 0;
  bool started = false;
  bool stopped = false;

  void start_session(tcp::socket&& socket) {
    beast::error_code nd;
    socket.set_option(tcp::no_delay(true), nd);  // SSE pieces are small: send them at once
    if (tls) {
      std::make_shared<Session<TlsStream>>(shared, std::move(socket), *tls)->start();
    } else {
      std::make_shared<Session<PlainStream>>(shared, std::move(socket))->start();
    }
  }

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
      start_session(std::move(socket));
      accept();
    });
  }
};

HttpServer::HttpServer(const HttpServerConfig& config, HttpHandler handler) : impl_(std::make_unique<Impl>()) {
  MD_REQUIRE(config.n_threads >= 1, "the HTTP server needs at least one thread");
  MD_REQUIRE(config.ssl_certfile.empty() == config.ssl_keyfile.empty(),
             "TLS needs both --ssl-certfile and --ssl-keyfile (one was given)");
  impl_->shared->config = config;
  impl_->shared->handler = std::move(handler);
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& m = *impl_;
  MD_CHECK(!m.started, "HTTP server started twice");
  const HttpServerConfig& c = m.shared->config;
  if (!c.ssl_certfile.empty()) m.tls = make_tls_server_context(c.ssl_certfile, c.ssl_keyfile);
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

bool HttpServer::tls() const { return impl_->tls != nullptr; }

void HttpServer::begin_drain() { impl_->shared->draining = true; }

size_t HttpServer::n_in_flight() const { return static_cast<size_t>(std::max(0, impl_->shared->n_exchanges.load())); }

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
  std::vector<std::shared_ptr<SessionBase>> live;
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
