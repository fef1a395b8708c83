// The HTTP/1.1 server: Boost.Asio/Beast, asynchronous, a few I/O threads for any number of
// connections (each connection's work runs on its own strand), over plain TCP or TLS. It parses
// requests (body limit -> 413, header limit -> 431, malformed -> 400), hands each to the
// HttpHandler with an Exchange, writes complete or chunked (SSE) responses, answers HEAD with
// headers only, keeps connections alive, and notices clients that disconnect while their request
// is in flight (server/http_session.h).
// Shutdown (server/shutdown.h): begin_drain() makes every response close its connection; once
// n_in_flight() is 0 every response has been written; stop() closes what is left.
// Threading: start()/begin_drain()/stop()/port() belong to the owner thread; n_in_flight() and
// n_connections() may be read from any thread. Lifetime: stop() the server, then release every
// Exchange held elsewhere (e.g. stop the engine), then destroy the server.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/exchange.h"

namespace megadecode {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: an ephemeral port (see port())
  int n_threads = 2;
  size_t max_body_bytes = 8u << 20;     // larger bodies get 413
  size_t max_header_bytes = 64u << 10;  // larger request heads get 431
  int idle_timeout_s = 120;             // a keep-alive connection waiting for a request longer is closed
  int write_timeout_s = 60;             // a client that does not read for this long is dropped
  std::string ssl_certfile;             // both set: TLS only (server/tls_context.h)
  std::string ssl_keyfile;
};

class HttpServer {
 public:
  HttpServer(const HttpServerConfig& config, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts the I/O threads; Error when the address cannot be bound or the TLS files
  // cannot be used.
  void start();
  int port() const;
  bool tls() const;
  // From now on every response ends its connection ("Connection: close"); the listener stays
  // open, so that clients still get an answer (the handler's 503) rather than a refused connection.
  void begin_drain();
  // Requests read whose response is not completely written yet.
  size_t n_in_flight() const;
  // Stops accepting, closes every connection and joins the I/O threads (bounded time).
  void stop();
  size_t n_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Raises the soft limit on open files to the hard limit (a thousand connections need more than
// the usual 1024); returns the new soft limit.
long raise_open_file_limit();

}  // namespace megadecode
