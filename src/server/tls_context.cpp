// make_tls_server_context (see tls_context.h).
#include "server/tls_context.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <filesystem>

#include "core/check.h"

namespace megadecode {

namespace ssl = boost::asio::ssl;

std::shared_ptr<ssl::context> make_tls_server_context(const std::string& certfile, const std::string& keyfile) {
  MD_REQUIRE(!certfile.empty() && !keyfile.empty(), "TLS needs both --ssl-certfile and --ssl-keyfile");
  MD_REQUIRE(std::filesystem::is_regular_file(certfile), "--ssl-certfile ", certfile, ": no such file");
  MD_REQUIRE(std::filesystem::is_regular_file(keyfile), "--ssl-keyfile ", keyfile, ": no such file");
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                   ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  // The key first: a certificate that does not match it then drops it (no error yet), and the
  // check below names the mismatch rather than a parse failure.
  boost::system::error_code ec;
  ctx->use_private_key_file(keyfile, ssl::context::pem, ec);
  MD_REQUIRE(!ec, "--ssl-keyfile ", keyfile, ": not a PEM private key (", ec.message(), ")");
  ctx->use_certificate_chain_file(certfile, ec);
  MD_REQUIRE(!ec, "--ssl-certfile ", certfile, ": not a PEM certificate (", ec.message(), ")");
  MD_REQUIRE(SSL_CTX_check_private_key(ctx->native_handle()) == 1, "--ssl-keyfile ", keyfile,
             ": the key does not belong to the certificate in ", certfile);
  ERR_clear_error();
  return ctx;
}

}  // namespace megadecode
