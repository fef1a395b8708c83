// The HTTP/1.1 server: Boost.Asio/Beast, asynchronous, a few I/O threads for any number of
// connections (each connection's work runs on its own strand). It parses requests (body limit ->
// 413, malformed -> 400), hands each to the HttpHandler with an Exchange, writes complete or
// chunked (SSE) responses, keeps connections alive, and notices clients that disconnect while
// their request is in flight.
// Threading: start()/stop()/port() belong to the owner thread. Lifetime: stop() the server, then
// release every Exchange held elsewhere (e.g. stop the engine), then destroy the server.
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
  size_t max_body_bytes = 8u << 20;  // larger bodies get 413
  int idle_timeout_s = 120;          // a keep-alive connection waiting for a request longer is closed
  int write_timeout_s = 60;          // a client that does not read for this long is dropped
};

class HttpServer {
 public:
  HttpServer(const HttpServerConfig& config, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts the I/O threads; Error when the address cannot be bound.
  void start();
  int port() const;
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
