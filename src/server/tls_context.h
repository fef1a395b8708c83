// TLS for the HTTP server (`serve --ssl-certfile CERT --ssl-keyfile KEY`, vLLM's flags): the
// server side of Boost.Asio SSL over OpenSSL, TLS 1.2 and later only. Each connection does its
// handshake on its own strand (server/http_session.h).
// Threading: build once at start-up; the context is then shared read-only by every connection.
#pragma once

#include <memory>
#include <string>

#include <boost/asio/ssl/context.hpp>

namespace megadecode {

// A server context holding the PEM certificate chain and private key; an Error names the file
// that cannot be read or parsed, or says that the key does not belong to the certificate.
std::shared_ptr<boost::asio::ssl::context> make_tls_server_context(const std::string& certfile,
                                                                   const std::string& keyfile);

}  // namespace megadecode
