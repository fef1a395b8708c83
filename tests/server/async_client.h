// An asynchronous load client for server tests: many raw HTTP/1.1 streaming requests on one
// io_context, each able to disconnect at a chosen point, with a small chunked-encoding decoder
// so the SSE events can be checked.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio.hpp>

namespace megadecode::testing {

struct StreamPlan {
  std::string body;             // JSON request for /v1/completions or /v1/chat/completions
  std::string path = "/v1/completions";
  int disconnect_after = -1;    // close after this many SSE events (0: right after sending); -1: read to the end
};

struct StreamOutcome {
  bool connected = false;
  bool completed = false;     // saw the terminating chunk
  bool disconnected = false;  // closed by plan
  int status = 0;
  std::vector<std::string> events;  // SSE data payloads
  std::string error;
};

// Decodes an HTTP/1.1 chunked body incrementally.
class ChunkDecoder {
 public:
  // Appends decoded bytes to `out`; returns true once the last chunk has been seen.
  bool feed(std::string_view in, std::string& out) {
    pending_.append(in);
    for (;;) {
      if (done_) return true;
      if (remaining_ == 0) {
        size_t eol = pending_.find("\r\n");
        if (eol == std::string::npos) return false;
        if (eol == 0) {  // the CRLF after a chunk's data
          pending_.erase(0, 2);
          continue;
        }
        remaining_ = std::stoul(pending_.substr(0, eol), nullptr, 16);
        pending_.erase(0, eol + 2);
        if (remaining_ == 0) {
          done_ = true;
          return true;
        }
      }
      const size_t take = std::min(remaining_, pending_.size());
      out.append(pending_, 0, take);
      pending_.erase(0, take);
      remaining_ -= take;
      if (remaining_ > 0) return false;
    }
  }

 private:
  std::string pending_;
  size_t remaining_ = 0;
  bool done_ = false;
};

// Counts connections; once all are up, every client sends its request (so that all of them are
// open at the same time however fast the server answers).
struct ConnectBarrier {
  size_t expected = 0;
  size_t connected = 0;
  std::vector<std::function<void()>> waiting;
  void arrive(std::function<void()> go) {
    waiting.push_back(std::move(go));
    if (++connected < expected) return;
    for (auto& g : waiting) g();
    waiting.clear();
  }
};

class StreamClient : public std::enable_shared_from_this<StreamClient> {
 public:
  StreamClient(boost::asio::io_context& ioc, int port, StreamPlan plan, StreamOutcome& outcome,
               ConnectBarrier* barrier = nullptr)
      : socket_(ioc), port_(port), plan_(std::move(plan)), out_(outcome), barrier_(barrier) {}

  void start() {
    namespace net = boost::asio;
    auto self = shared_from_this();
    socket_.async_connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)),
                          [self](boost::system::error_code ec) {
                            if (ec) return self->fail("connect: " + ec.message());
                            self->out_.connected = true;
                            if (self->barrier_ != nullptr) {
                              self->barrier_->arrive([self] { self->send(); });
                            } else {
                              self->send();
                            }
                          });
  }

 private:
  void send() {
    request_ = "POST " + plan_.path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
               std::to_string(plan_.body.size()) + "\r\n\r\n" + plan_.body;
    auto self = shared_from_this();
    boost::asio::async_write(socket_, boost::asio::buffer(request_), [self](boost::system::error_code ec, size_t) {
      if (ec) return self->fail("write: " + ec.message());
      if (self->plan_.disconnect_after == 0) return self->hang_up();
      self->read();
    });
  }
  void read() {
    auto self = shared_from_this();
    socket_.async_read_some(boost::asio::buffer(buf_), [self](boost::system::error_code ec, size_t n) {
      if (ec) return self->fail("read: " + ec.message());
      self->consume(std::string_view(self->buf_.data(), n));
    });
  }
  void consume(std::string_view data) {
    if (!headers_done_) {
      head_.append(data);
      const size_t end = head_.find("\r\n\r\n");
      if (end == std::string::npos) return read();
      out_.status = std::stoi(head_.substr(9, 3));
      const bool chunked = head_.find("Transfer-Encoding: chunked") < end;
      headers_done_ = true;
      std::string rest = head_.substr(end + 4);
      if (!chunked) {
        out_.error = "not a chunked stream: " + head_.substr(0, 200);
        return close();
      }
      return consume_body(rest);
    }
    consume_body(data);
  }
  void consume_body(std::string_view data) {
    const bool last = decoder_.feed(data, body_);
    for (;;) {  // complete SSE events
      const size_t end = body_.find("\n\n");
      if (end == std::string::npos) break;
      std::string event = body_.substr(0, end);
      body_.erase(0, end + 2);
      if (event.rfind("data: ", 0) == 0) out_.events.push_back(event.substr(6));
      if (plan_.disconnect_after > 0 && static_cast<int>(out_.events.size()) >= plan_.disconnect_after)
        return hang_up();
    }
    if (last) {
      out_.completed = true;
      return close();
    }
    read();
  }
  void hang_up() {
    out_.disconnected = true;
    close();
  }
  void fail(const std::string& what) {
    out_.error = what;
    close();
  }
  void close() {
    boost::system::error_code ec;
    socket_.close(ec);
  }

  boost::asio::ip::tcp::socket socket_;
  int port_;
  StreamPlan plan_;
  StreamOutcome& out_;
  ConnectBarrier* barrier_;
  std::string request_;
  std::array<char, 4096> buf_{};
  bool headers_done_ = false;
  std::string head_;
  ChunkDecoder decoder_;
  std::string body_;
};

// Runs every plan concurrently (one thread); returns the outcomes in plan order. With
// connect_all_first, no request is sent before every connection is up.
inline std::vector<StreamOutcome> run_streams(int port, const std::vector<StreamPlan>& plans,
                                              bool connect_all_first = false) {
  boost::asio::io_context ioc;
  std::vector<StreamOutcome> outcomes(plans.size());
  ConnectBarrier barrier;
  barrier.expected = plans.size();
  for (size_t i = 0; i < plans.size(); ++i)
    std::make_shared<StreamClient>(ioc, port, plans[i], outcomes[i], connect_all_first ? &barrier : nullptr)->start();
  ioc.run();
  return outcomes;
}

}  // namespace megadecode::testing
