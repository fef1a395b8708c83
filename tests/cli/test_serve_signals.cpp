// `megadecode serve` as a process (cli/cmd_serve.cpp wiring server/shutdown.h): SIGTERM with a
// stream in flight ends the stream with an error event and [DONE] after --shutdown-timeout and
// exits 0; a second signal exits at once; MEGADECODE_API_KEY guards the API; bad flags are
// errors before anything is served. The model: the tiny preset's random weights on cpu-ref,
// served as token ids (no tokenizer files needed).
#include <gtest/gtest.h>

#include <future>

#include "../server/server_fixture.h"
#include "process.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::Process;

std::vector<std::string> serve_args(std::vector<std::string> extra) {
  std::vector<std::string> a = {"serve", "--random-weights", "--preset", "tiny", "--backend", "cpu-ref",
                                "--skip-tokenizer-init", "--port", "0", "--threads", "1", "--kv-cache-tokens", "2048"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Sends a long streaming request and returns once its first bytes arrived; get() reads the rest
// to the end of the connection.
struct Stream {
  explicit Stream(int port) : client(port) {
    const std::string body = json{{"prompt", {1, 2, 3}}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}}.dump();
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    boost::asio::write(client.socket(), boost::asio::buffer(req));
    char buf[4096];
    received.append(buf, client.socket().read_some(boost::asio::buffer(buf)));
  }
  std::string rest() {
    char buf[4096];
    boost::system::error_code ec;
    for (size_t n; (n = client.socket().read_some(boost::asio::buffer(buf), ec)) > 0 && !ec;) received.append(buf, n);
    return received;
  }
  testing::HttpClient client;
  std::string received;
};

TEST(ServeSignals, SigtermEndsStreamsCleanlyAndExitsZero) {
  Process p(serve_args({"--shutdown-timeout", "0.5"}));
  const int port = p.wait_port(std::chrono::seconds(60));
  ASSERT_GT(port, 0) << p.err();
  Stream s(port);
  ASSERT_NE(s.received.find("HTTP/1.1 200"), std::string::npos) << s.received;
  p.signal(SIGTERM);
  const std::string all = s.rest();
  // The chunked body's last events: an OpenAI error event, then [DONE], then the last chunk.
  const size_t err = all.find("data: {\"error\"");
  const size_t done = all.find("data: [DONE]");
  ASSERT_NE(err, std::string::npos) << all.substr(all.size() > 600 ? all.size() - 600 : 0);
  ASSERT_NE(done, std::string::npos);
  EXPECT_LT(err, done);
  EXPECT_NE(all.find("shutting down", err), std::string::npos);
  EXPECT_NE(all.find("\r\n0\r\n\r\n", done), std::string::npos) << "the chunked body did not end";
  EXPECT_EQ(p.wait_exit(std::chrono::seconds(20)), 0) << p.err();
  EXPECT_NE(p.err().find("draining"), std::string::npos) << p.err();
}

TEST(ServeSignals, SecondSignalExitsAtOnce) {
  Process p(serve_args({"--shutdown-timeout", "120"}));
  const int port = p.wait_port(std::chrono::seconds(60));
  ASSERT_GT(port, 0) << p.err();
  Stream s(port);
  p.signal(SIGTERM);
  for (int i = 0; i < 500 && p.err().find("draining") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto t0 = std::chrono::steady_clock::now();
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait_exit(std::chrono::seconds(5)), 128 + SIGTERM) << p.err();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST(ServeSignals, ApiKeyFromTheEnvironment) {
  Process p(serve_args({}), {"MEGADECODE_API_KEY=env-key-123"});
  const int port = p.wait_port(std::chrono::seconds(60));
  ASSERT_GT(port, 0) << p.err();
  testing::HttpClient c(port);
  EXPECT_EQ(c.request("GET", "/v1/models").status, 401);
  EXPECT_EQ(c.request("GET", "/v1/models", "", "", {{"Authorization", "Bearer env-key-123"}}).status, 200);
  EXPECT_EQ(c.request("GET", "/health").status, 200);
  p.signal(SIGINT);
  EXPECT_EQ(p.wait_exit(std::chrono::seconds(20)), 0) << p.err();
}

TEST(ServeSignals, BadFlagsAreErrors) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--protect-metrics"}, "--protect-metrics needs --api-key"},
      {{"--shutdown-timeout", "-1"}, "--shutdown-timeout must be in [0, 86400]"},
      {{"--ssl-certfile", "/nonexistent/cert.pem"}, "needs both --ssl-certfile and --ssl-keyfile"},
      {{"--ssl-certfile", "/nonexistent/cert.pem", "--ssl-keyfile", "/nonexistent/key.pem"}, "--ssl-certfile /nonexistent/cert.pem: no such file"},
      {{"--api-key", "two words"}, "--api-key must be printable ASCII"}};
  for (const auto& [extra, message] : cases) {
    SCOPED_TRACE(message);
    Process p(serve_args(extra));
    EXPECT_EQ(p.wait_exit(std::chrono::seconds(60)), 1);
    EXPECT_NE(p.err().find(message), std::string::npos) << p.err();
  }
}

}  // namespace
}  // namespace megadecode
