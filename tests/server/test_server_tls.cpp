// TLS (server/tls_context.h, `serve --ssl-certfile --ssl-keyfile`): a self-signed certificate made
// here with OpenSSL's C API, a client that verifies it (chain and host name), complete and
// streamed responses over one kept-alive TLS connection; a plain-HTTP client gets no HTTP answer
// and harms nothing; unusable files are Errors that name the flag.
#include <gtest/gtest.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>

#include "core/rng.h"
#include "server_fixture.h"

namespace megadecode {
namespace {

namespace fs = std::filesystem;
namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = beast::http;
using nlohmann::json;

struct Pem {
  fs::path cert, key;
};

// A fresh P-256 key and a self-signed certificate for 127.0.0.1 (and localhost), valid one hour.
Pem make_self_signed(const fs::path& dir, const std::string& name, uint64_t serial) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  EXPECT_NE(key, nullptr);
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), static_cast<long>(serial & 0x7fffffff));
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, key);
  X509_NAME* subject = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(x, subject);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  X509_EXTENSION* san = X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
  EXPECT_NE(san, nullptr);
  X509_add_ext(x, san, -1);
  X509_EXTENSION_free(san);
  EXPECT_GT(X509_sign(x, key, EVP_sha256()), 0);
  Pem pem{dir / (name + "_cert.pem"), dir / (name + "_key.pem")};
  FILE* f = std::fopen(pem.cert.c_str(), "w");
  PEM_write_X509(f, x);
  std::fclose(f);
  f = std::fopen(pem.key.c_str(), "w");
  PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  X509_free(x);
  EVP_PKEY_free(key);
  return pem;
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const uint64_t seed = test_seed();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    dir_ = fs::temp_directory_path() / ("megadecode_tls_" + std::to_string(::getpid()) + "_" + std::to_string(seed));
    fs::create_directories(dir_);
    pem_ = make_self_signed(dir_, "server", seed);
    other_ = make_self_signed(dir_, "other", seed + 1);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  Pem pem_, other_;
};

// One verifying TLS client connection.
class TlsClient {
 public:
  TlsClient(int port, const fs::path& ca) : ctx_(ssl::context::tls_client), stream_(ioc_, ctx_) {
    ctx_.load_verify_file(ca.string());
    stream_.set_verify_mode(ssl::verify_peer);
    stream_.set_verify_callback(ssl::host_name_verification("127.0.0.1"));
    beast::get_lowest_layer(stream_).connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
    stream_.handshake(ssl::stream_base::client);
  }
  testing::HttpResult request(const std::string& method, const std::string& path, const std::string& body = "") {
    http::request<http::string_body> req(http::string_to_verb(method), path, 11);
    req.set(http::field::host, "127.0.0.1");
    if (method == "POST") {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
      req.prepare_payload();
    }
    http::write(stream_, req);
    http::response_parser<http::string_body> parser;
    http::read(stream_, buffer_, parser);
    testing::HttpResult r;
    r.status = static_cast<int>(parser.get().result_int());
    for (const auto& f : parser.get()) r.headers[std::string(f.name_string())] = std::string(f.value());
    r.body = parser.get().body();
    return r;
  }

 private:
  net::io_context ioc_;
  ssl::context ctx_;
  beast::ssl_stream<beast::tcp_stream> stream_;
  beast::flat_buffer buffer_;
};

TEST_F(TlsTest, RoundTripsOverVerifiedTls) {
  testing::TestServerOptions o;
  o.ssl_certfile = pem_.cert.string();
  o.ssl_keyfile = pem_.key.string();
  testing::TestServer server(o);
  ASSERT_TRUE(server.http->tls());
  TlsClient c(server.port(), pem_.cert);
  EXPECT_EQ(c.request("GET", "/health").status, 200);
  json body = {{"prompt", "tls"}, {"max_tokens", 5}, {"ignore_eos", true}, {"temperature", 0}};
  testing::HttpResult whole = c.request("POST", "/v1/completions", body.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(whole.json()["usage"]["completion_tokens"], 5);
  body["stream"] = true;
  testing::HttpResult streamed = c.request("POST", "/v1/completions", body.dump());
  ASSERT_EQ(streamed.status, 200);
  std::vector<std::string> events = testing::sse_data(streamed.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) text += json::parse(events[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, whole.json()["choices"][0]["text"].get<std::string>());
}

TEST_F(TlsTest, PlainHttpGetsNoAnswerAndHarmsNothing) {
  testing::TestServerOptions o;
  o.ssl_certfile = pem_.cert.string();
  o.ssl_keyfile = pem_.key.string();
  testing::TestServer server(o);
  {
    testing::HttpClient plain(server.port());
    const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    net::write(plain.socket(), net::buffer(req));
    std::string got;
    char buf[512];
    beast::error_code ec;
    for (size_t n; (n = plain.socket().read_some(net::buffer(buf), ec)) > 0 && !ec;) got.append(buf, n);
    EXPECT_TRUE(ec) << "the server kept a plain-HTTP connection open";
    EXPECT_NE(got.rfind("HTTP/", 0), 0u) << got;
  }
  // A client that trusts another certificate refuses this server.
  EXPECT_THROW(TlsClient(server.port(), other_.cert), boost::system::system_error);
  TlsClient good(server.port(), pem_.cert);
  EXPECT_EQ(good.request("GET", "/health").status, 200);
}

TEST_F(TlsTest, UnusableFilesAreErrorsNamingTheFlag) {
  auto start_error = [&](const std::string& cert, const std::string& key) -> std::string {
    HttpServerConfig hc;
    hc.port = 0;
    hc.ssl_certfile = cert;
    hc.ssl_keyfile = key;
    try {
      HttpServer http(hc, [](HttpRequest&&, std::shared_ptr<Exchange>) {});
      http.start();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(start_error(pem_.cert.string(), (dir_ / "missing.pem").string()).find("--ssl-keyfile"), std::string::npos);
  EXPECT_NE(start_error((dir_ / "missing.pem").string(), pem_.key.string()).find("--ssl-certfile"), std::string::npos);
  EXPECT_NE(start_error(pem_.key.string(), pem_.key.string()).find("--ssl-certfile"), std::string::npos);  // a key, not a cert
  EXPECT_NE(start_error(pem_.cert.string(), other_.key.string()).find("does not belong"), std::string::npos);
  EXPECT_THROW(HttpServer(HttpServerConfig{.ssl_certfile = pem_.cert.string()}, nullptr), Error);  // one of the two
}

}  // namespace
}  // namespace megadecode
