// HTTP details on the wire (server/http_session.h, server/openai_service.cpp): HEAD is answered
// with headers only, so the next response on a keep-alive connection starts clean (RFC 9110
// §9.3.2); a POST whose body is not declared JSON is a 415, as vLLM answers it.
#include <gtest/gtest.h>

#include "server_fixture.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::HttpClient;
using testing::HttpResult;
using testing::TestServer;

// Reads one response head ("HTTP/1.1 ..." up to the blank line) from the socket, byte by byte so
// that nothing after it is consumed.
std::string read_head(boost::asio::ip::tcp::socket& socket) {
  std::string head;
  char c;
  while (head.size() < 8192 && (head.size() < 4 || head.compare(head.size() - 4, 4, "\r\n\r\n") != 0)) {
    boost::asio::read(socket, boost::asio::buffer(&c, 1));
    head += c;
  }
  return head;
}

size_t content_length(const std::string& head) {
  const size_t at = head.find("Content-Length: ");
  return at == std::string::npos ? std::string::npos : std::stoul(head.substr(at + 16));
}

// On one keep-alive connection: HEAD, then GET of the same resource. The HEAD answer is a head
// with GET's Content-Length and no body: the bytes right after it are the next status line.
TEST(ServerHttp, HeadIsHeadersOnlyOnAKeepAliveConnection) {
  TestServer server;
  HttpClient c(server.port());
  for (const char* path : {"/health", "/v1/models", "/version", "/metrics", "/v1/completions", "/nowhere"}) {
    SCOPED_TRACE(path);
    const std::string get_body = std::string(path) == "/v1/completions" || std::string(path) == "/nowhere"
                                     ? ""
                                     : c.request("GET", path).body;
    const std::string head_req = std::string("HEAD ") + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
    const std::string get_req = "GET /version HTTP/1.1\r\nHost: x\r\n\r\n";
    boost::asio::write(c.socket(), boost::asio::buffer(head_req + get_req));  // pipelined
    const std::string head = read_head(c.socket());
    const std::string next = read_head(c.socket());  // would start with stray body bytes
    EXPECT_EQ(next.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << "after the HEAD answer:\n" << head << "came:\n" << next;
    std::string body(content_length(next), '\0');
    boost::asio::read(c.socket(), boost::asio::buffer(body));
    EXPECT_TRUE(json::parse(body).contains("version"));
    if (std::string(path) == "/v1/completions") {
      EXPECT_EQ(head.rfind("HTTP/1.1 405", 0), 0u) << head;
      EXPECT_NE(head.find("Allow: POST\r\n"), std::string::npos) << head;
    } else if (std::string(path) == "/nowhere") {
      EXPECT_EQ(head.rfind("HTTP/1.1 404", 0), 0u) << head;
    } else {
      EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
      if (std::string(path) != "/metrics") {  // the metrics change between the two requests
        EXPECT_EQ(content_length(head), get_body.size()) << head;
      }
    }
    EXPECT_NE(head.find("Connection: keep-alive"), std::string::npos) << head;
  }
  // A client parser that knows HEAD has no body gets the same answer; the connection still works.
  HttpResult h = c.request("HEAD", "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_TRUE(h.body.empty());
  EXPECT_EQ(c.request("GET", "/health").status, 200);
  HttpResult wrong = c.request("PUT", "/health");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(wrong.headers["Allow"], "GET, HEAD");
}

TEST(ServerHttp, PostBodiesMustBeDeclaredJson) {
  TestServer server;
  const std::string completion = json{{"prompt", "ct"}, {"max_tokens", 2}}.dump();
  const std::string chat = json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}}.dump();
  const std::pair<const char*, std::string> routes[] = {{"/v1/completions", completion},
                                                        {"/v1/chat/completions", chat},
                                                        {"/tokenize", json{{"prompt", "ct"}}.dump()},
                                                        {"/detokenize", json{{"tokens", {99}}}.dump()}};
  HttpClient c(server.port());
  for (const auto& [path, body] : routes) {
    for (const char* type : {"", "text/plain", "application/x-www-form-urlencoded", "application/jsonl",
                             "multipart/form-data; boundary=x", "json"}) {
      SCOPED_TRACE(std::string(path) + " with Content-Type \"" + type + "\"");
      HttpResult r = c.request("POST", path, body, type);
      EXPECT_EQ(r.status, 415) << r.body;
      json e = json::parse(r.body, nullptr, false);
      ASSERT_FALSE(e.is_discarded()) << r.body;
      EXPECT_EQ(e["error"]["type"], "invalid_request_error");
      EXPECT_NE(e["error"]["message"].get<std::string>().find("application/json"), std::string::npos);
    }
    for (const char* type : {"application/json", "application/json; charset=utf-8", "Application/JSON", " application/json ;x=y"}) {
      SCOPED_TRACE(std::string(path) + " with Content-Type \"" + type + "\"");
      HttpResult r = c.request("POST", path, body, type);
      EXPECT_EQ(r.status, 200) << r.body;
    }
  }
  EXPECT_TRUE(server.drained());
}

}  // namespace
}  // namespace megadecode
