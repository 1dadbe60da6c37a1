#include "orion/controller/client.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

namespace orion::controller {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

Result<Endpoint> ParseEndpoint(const std::string& address, uint16_t default_port) {
  Endpoint ep;
  std::string port;
  std::string addr = address;
  if (addr.rfind("https://", 0) == 0) {
    ep.tls = true;
    addr.erase(0, 8);
  } else if (addr.rfind("http://", 0) == 0) {
    addr.erase(0, 7);
  }
  if (!addr.empty() && addr.front() == '[') {
    const size_t close = addr.find(']');
    if (close == std::string::npos) return InvalidArgument("'" + addr + "' is not host:port");
    ep.host = addr.substr(1, close - 1);
    if (close + 1 < addr.size()) {
      if (addr[close + 1] != ':') return InvalidArgument("'" + addr + "' is not host:port");
      port = addr.substr(close + 2);
    }
  } else {
    const size_t colon = addr.rfind(':');
    ep.host = addr.substr(0, colon);
    if (colon != std::string::npos) port = addr.substr(colon + 1);
    // An IPv6 address goes in brackets ([::1]:9123); a bare colon in the host is a typo ("::::").
    if (ep.host.find(':') != std::string::npos) {
      return InvalidArgument("'" + addr + "' is not host:port (write an IPv6 address as [addr]:port)");
    }
  }
  if (ep.host.empty() || ep.host.find_first_of(" /\t\r\n") != std::string::npos) {
    return InvalidArgument("'" + addr + "' is not host:port");
  }
  ep.port = default_port;
  if (!port.empty()) {
    char* end = nullptr;
    const unsigned long p = std::strtoul(port.c_str(), &end, 10);
    if (*end != '\0' || p == 0 || p > 65535) return InvalidArgument("'" + addr + "' has no valid port");
    ep.port = static_cast<uint16_t>(p);
  }
  return ep;
}

Result<std::vector<Endpoint>> ParseEndpoints(const std::string& list, uint16_t default_port) {
  std::vector<Endpoint> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    std::string one = list.substr(pos, comma - pos);
    const size_t b = one.find_first_not_of(' '), e = one.find_last_not_of(' ');
    one = b == std::string::npos ? std::string() : one.substr(b, e - b + 1);
    if (one.empty()) return InvalidArgument("'" + list + "' has an empty controller address");
    auto ep = ParseEndpoint(one, default_port);
    if (!ep.ok()) return ep.status();
    if (out.size() == kMaxControllers) return InvalidArgument("'" + list + "' lists more than 16 addresses");
    out.push_back(*ep);
    pos = comma + 1;
  }
  return out;
}

namespace {

namespace ssl = boost::asio::ssl;

std::mutex g_tls_mu;
std::string g_tls_ca, g_tls_cert, g_tls_key;  // SetTlsCaFile, SetTlsClientCert

// What an https:// request uses: the CA file ("" = the system's) and a client certificate and key
// ("" = none), each as set in the process, else from the environment.
struct TlsFiles {
  std::string ca, cert, key;
};
TlsFiles TlsNow() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "");
  };
  std::lock_guard<std::mutex> lock(g_tls_mu);
  TlsFiles f{g_tls_ca, g_tls_cert, g_tls_key};
  if (f.ca.empty()) f.ca = env("ORION_TLS_CA");
  if (f.cert.empty() && f.key.empty()) {
    f.cert = env("ORION_TLS_CERT");
    f.key = env("ORION_TLS_KEY");
  }
  return f;
}

// One client context per set of files (loading the system's CAs is costly), kept for the process.
Result<std::shared_ptr<ssl::context>> TlsContext(const TlsFiles& f) {
  std::lock_guard<std::mutex> lock(g_tls_mu);
  static auto* cache = new std::map<std::string, std::shared_ptr<ssl::context>>;
  const std::string id = f.ca + '\n' + f.cert + '\n' + f.key;
  if (auto it = cache->find(id); it != cache->end()) return it->second;
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  beast::error_code ec;
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  ctx->set_verify_mode(ssl::verify_peer, ec);
  if (f.ca.empty()) {
    ctx->set_default_verify_paths(ec);
  } else {
    ctx->load_verify_file(f.ca, ec);
  }
  if (ec) {
    return Unavailable("cannot load the TLS CA " + (f.ca.empty() ? std::string("(system default)") : "file " + f.ca) +
                       ": " + ec.message());
  }
  if (f.cert.empty() != f.key.empty()) {
    return InvalidArgument(
        "a TLS client certificate needs its key and a key its certificate (ORION_TLS_CERT and "
        "ORION_TLS_KEY, or controller_tls_cert and controller_tls_key)");
  }
  if (!f.cert.empty()) {
    ctx->use_certificate_chain_file(f.cert, ec);
    if (ec) return Unavailable("cannot load the TLS client certificate " + f.cert + ": " + ec.message());
    ctx->use_private_key_file(f.key, ssl::context::pem, ec);
    // OpenSSL checks the key against the certificate ("key values mismatch").
    if (ec) return Unavailable("cannot load the TLS client key " + f.key + ": " + ec.message());
  }
  if (cache->size() < 16) (*cache)[id] = ctx;
  return ctx;
}

// Why TLS failed (the handshake, or a read: TLS 1.3 reports a refused client certificate there),
// for the operator.
std::string TlsError(const beast::error_code& ec, SSL* ssl, const TlsFiles& f) {
  std::string why = ec.message();
  if (ec.category() != boost::asio::error::get_ssl_category()) return why;
  const int reason = ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
  if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
    why = std::string("certificate verify failed: ") + X509_verify_cert_error_string(SSL_get_verify_result(ssl)) +
          " (CA " + (f.ca.empty() ? std::string("the system's, set ORION_TLS_CA") : "file " + f.ca) + ")";
  } else if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG) {
    why += " (no TLS on that port: a plain-HTTP controller is http://host:port)";
  } else if (reason == SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED || reason == SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE ||
             reason == SSL_R_SSLV3_ALERT_BAD_CERTIFICATE || reason == SSL_R_TLSV1_ALERT_UNKNOWN_CA) {
    why += f.cert.empty() ? " (the controller may want a client certificate: ORION_TLS_CERT and ORION_TLS_KEY)"
                          : " (the controller refused the client certificate " + f.cert + ")";
  }
  return why;
}

}  // namespace

void SetTlsCaFile(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_tls_mu);
  g_tls_ca = path;
}

void SetTlsClientCert(const std::string& cert_file, const std::string& key_file) {
  std::lock_guard<std::mutex> lock(g_tls_mu);
  g_tls_cert = cert_file;
  g_tls_key = key_file;
}

Result<HttpReply> HttpRequest(const Endpoint& ep, const std::string& method, const std::string& target,
                              const std::string& body, const std::string& bearer, int timeout_ms) {
  boost::asio::io_context ioc;
  tcp::resolver resolver(ioc);
  std::shared_ptr<ssl::context> tls_ctx;
  const TlsFiles files = ep.tls ? TlsNow() : TlsFiles{};
  if (ep.tls) {
    // No OpenSSL cleanup at exit: the guest runtime releases its allocation from libcuda's
    // destructor, after atexit handlers. If the program set OpenSSL up itself (cleaned up at exit),
    // a request after that cleanup fails here instead of touching freed state.
    if (OPENSSL_init_ssl(OPENSSL_INIT_NO_ATEXIT | OPENSSL_INIT_LOAD_SSL_STRINGS | OPENSSL_INIT_LOAD_CRYPTO_STRINGS,
                         nullptr) != 1) {
      return Unavailable("controller " + ep.text() + ": OpenSSL is shut down (the process is exiting)");
    }
    auto c = TlsContext(files);
    if (!c.ok()) return Unavailable("controller " + ep.text() + ": " + c.status().message());
    tls_ctx = *c;
  }
  // The TCP stream alone (http://), or under TLS (https://): one of the two is used.
  std::optional<beast::tcp_stream> plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure;
  if (ep.tls) {
    secure.emplace(ioc, *tls_ctx);
    SSL* s = secure->native_handle();
    beast::error_code not_ip_sni;
    (void)boost::asio::ip::make_address(ep.host, not_ip_sni);
    if (not_ip_sni) SSL_set_tlsext_host_name(s, ep.host.c_str());  // SNI: names only
    secure->set_verify_callback(ssl::host_name_verification(ep.host));
  } else {
    plain.emplace(ioc);
  }
  beast::tcp_stream& stream = ep.tls ? beast::get_lowest_layer(*secure) : *plain;
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, ep.hostport());
  req.set(http::field::user_agent, "orion");
  if (!bearer.empty()) req.set(http::field::authorization, "Bearer " + bearer);
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  beast::error_code failed;
  const char* stage = "resolve";
  stream.expires_after(std::chrono::milliseconds(timeout_ms));
  auto exchange = [&](auto& s) {
    stage = "write";
    http::async_write(s, req, [&](beast::error_code ec3, size_t) {
      if (ec3) {
        failed = ec3;
        return;
      }
      stage = "read";
      http::async_read(s, buffer, res, [&](beast::error_code ec4, size_t) {
        if (ec4) failed = ec4;
        stage = "done";
      });
    });
  };
  auto on_connect = [&](beast::error_code ec2) {
    if (ec2) {
      failed = ec2;
      return;
    }
    if (!ep.tls) return exchange(stream);
    stage = "TLS handshake";
    secure->async_handshake(ssl::stream_base::client, [&](beast::error_code ec3) {
      if (ec3) {
        failed = ec3;
        return;
      }
      exchange(*secure);
    });
  };
  beast::error_code not_ip;
  const auto ip = boost::asio::ip::make_address(ep.host, not_ip);
  if (!not_ip) {
    // A numeric address (the usual case): no resolver, which would start a thread per request.
    stage = "connect";
    stream.async_connect(tcp::endpoint(ip, ep.port), on_connect);
  } else {
    resolver.async_resolve(ep.host, std::to_string(ep.port), [&](beast::error_code ec, tcp::resolver::results_type r) {
      if (ec) {
        failed = ec;
        return;
      }
      stage = "connect";
      stream.async_connect(r, [&](beast::error_code ec2, const tcp::endpoint&) { on_connect(ec2); });
    });
  }
  ioc.run();
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  if (failed || std::string(stage) != "done") {
    const std::string why = !failed  ? std::string("no answer")
                            : ep.tls ? TlsError(failed, secure->native_handle(), files)
                                     : failed.message();
    return Unavailable("controller " + ep.text() + " (" + stage + "): " + why);
  }
  return HttpReply{static_cast<int>(res.result_int()), std::move(res.body())};
}

Result<nlohmann::json> ControllerClient::Call(const std::string& method, const std::string& target,
                                              const nlohmann::json& body) const {
  // replace: a string that is not valid UTF-8 (a host or program name is bytes) is sent with U+FFFD
  // in place of the bad bytes instead of throwing out of dump().
  const std::string text =
      body.is_null() ? std::string() : body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const size_t start = current_.load();
  Result<nlohmann::json> last = Unavailable("no controller configured");
  for (size_t k = 0; k < eps_.size(); ++k) {
    const size_t i = (start + k) % eps_.size();
    last = CallOne(eps_[i], method, target, text);
    // Unreachable, or its store is (503): the next controller may serve it. Anything else is the
    // pool's answer.
    if (last.ok() || last.status().code() != Code::kUnavailable) {
      current_.store(i);
      return last;
    }
  }
  return last;
}

Result<nlohmann::json> ControllerClient::CallOne(const Endpoint& ep, const std::string& method,
                                                 const std::string& target, const std::string& text) const {
  auto r = HttpRequest(ep, method, target, text, key_, timeout_ms_);
  if (!r.ok()) return r.status();
  nlohmann::json j = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (r->status >= 200 && r->status < 300) {
    if (j.is_discarded()) return Internal("controller " + ep.text() + " sent a reply that is not JSON");
    return j;
  }
  std::string msg = "HTTP " + std::to_string(r->status);
  if (!j.is_discarded() && j.is_object() && j.contains("message") && j["message"].is_string()) {
    msg = j["message"].get<std::string>();
  }
  Code code = Code::kInternal;
  switch (r->status) {
    case 400: code = Code::kInvalidArgument; break;
    case 401:
    case 403: code = Code::kPermissionDenied; break;
    case 404: code = Code::kNotFound; break;
    case 409:
    case 429: code = Code::kResourceExhausted; break;
    case 503: code = Code::kUnavailable; break;
    default: break;
  }
  return Status(code, msg);
}

}  // namespace orion::controller
