// One HTTP request in flight and the way back to its client, as the request handlers see it.
// Threading: post() may be called from any thread (the engine's scheduler thread does, from
// OutputSink::on_output). Every other member may be called only on the connection's strand:
// inside the handler call that received the Exchange, or inside a function run by post().
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace megadecode {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;         // "GET", "HEAD", "POST", ...
  std::string path;           // the target without its query string
  std::string content_type;   // the Content-Type header, "" when absent
  std::string authorization;  // the Authorization header, "" when absent
  std::string body;
};

class Exchange {
 public:
  virtual ~Exchange() = default;
  // Runs fn on the connection's strand; dropped when the server has stopped.
  virtual void post(std::function<void()> fn) = 0;

  // A complete response. Ignored after the response has started or the client has gone. The
  // answer to a HEAD request carries the headers (Content-Length: the body's size) and no body.
  virtual void respond(int status, const std::string& content_type, std::string body, const HttpHeaders& headers = {}) = 0;
  // A streamed response (HTTP/1.1 chunked transfer encoding): headers, any number of pieces, end.
  virtual void begin_stream(const std::string& content_type) = 0;
  virtual void stream(std::string data) = 0;
  virtual void end_stream() = 0;

  virtual bool client_gone() const = 0;
  // fn runs on the strand if the client disconnects (or the connection fails) before the
  // response is complete; at once when it is already gone.
  virtual void on_client_gone(std::function<void()> fn) = 0;
};

using HttpHandler = std::function<void(HttpRequest&& request, std::shared_ptr<Exchange> exchange)>;

}  // namespace megadecode
