// orion/controller/client.h — talking to orion-controller's REST API (controller/openapi.yaml).
// Used by oriond (register, heartbeat, confirm, release), the guest runtime (allocations),
// orion-check and orion-smi. HTTP/1.1 with JSON bodies and `Authorization: Bearer <key>`, over TLS
// for an https:// address (Boost.Asio's OpenSSL streams: the chain verified against the CA file,
// SetTlsCaFile, else $ORION_TLS_CA, else the system's CAs; the certificate's name or IP against the
// address). At run time it needs libssl and libcrypto beside libc (Boost.Beast is header-only); it
// lives inside the guest's libcuda.so.1.
//
// Several controllers (one pool on etcd) are a comma-separated list wherever one address is
// configured (ORION_CONTROLLER, controller_addr): a request that cannot reach one, or that one
// answers 503 (its store unreachable), goes to the next.
//
//   ControllerClient c(*ParseEndpoints("10.0.0.5:9123,10.0.0.6:9123"), key);
//   auto a = c.Call("POST", "/v1/allocations", {{"vgpus", 2}, {"gmem_mib", 4096}});
//   if (!a.ok()) ...;   // the controller's message, or why none could be reached
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "orion/common/status.h"

namespace orion::controller {

inline constexpr uint16_t kDefaultPort = 9123;

struct Endpoint {
  std::string host;
  uint16_t port = kDefaultPort;
  bool tls = false;  // https://
  std::string hostport() const {
    return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
  std::string text() const { return (tls ? "https://" : "") + hostport(); }
};

// "host:port", "host" (port 9123) or "[v6]:port", each optionally after http:// or https:// (TLS).
// kInvalidArgument on garbage.
Result<Endpoint> ParseEndpoint(const std::string& addr, uint16_t default_port = kDefaultPort);
// "a:p,b:p,..." (spaces around commas allowed; 1..16 entries, each as ParseEndpoint).
inline constexpr size_t kMaxControllers = 16;
Result<std::vector<Endpoint>> ParseEndpoints(const std::string& list, uint16_t default_port = kDefaultPort);

struct HttpReply {
  int status = 0;  // HTTP status
  std::string body;
};

// The CA file (PEM) that verifies https:// controllers in this process; "" = $ORION_TLS_CA, else
// the system's default CAs. oriond sets it from server.conf's controller_tls_ca.
void SetTlsCaFile(const std::string& path);
// The client certificate and key (PEM) shown to a controller that wants one (tls_client_ca);
// "" = $ORION_TLS_CERT and $ORION_TLS_KEY, else none. oriond: controller_tls_cert/_key.
void SetTlsClientCert(const std::string& cert_file, const std::string& key_file);

// One request on a fresh connection. `timeout_ms` bounds connect + TLS handshake + write + read.
// Errors: kUnavailable (cannot connect / connection lost), kInternal (bad response).
Result<HttpReply> HttpRequest(const Endpoint& ep, const std::string& method, const std::string& target,
                              const std::string& body, const std::string& bearer, int timeout_ms);

class ControllerClient {
 public:
  ControllerClient(Endpoint ep, std::string key, int timeout_ms = 3000)
      : eps_{std::move(ep)}, key_(std::move(key)), timeout_ms_(timeout_ms) {}
  // `eps` must not be empty. Thread-safe (the current controller is an atomic index).
  ControllerClient(std::vector<Endpoint> eps, std::string key, int timeout_ms = 3000)
      : eps_(std::move(eps)), key_(std::move(key)), timeout_ms_(timeout_ms) {}
  ControllerClient(const ControllerClient& o)
      : eps_(o.eps_), key_(o.key_), timeout_ms_(o.timeout_ms_), current_(o.current_.load()) {}

  // Sends `body` (null: none) and parses the JSON reply. A non-2xx reply becomes an error whose
  // message is the controller's "message" (codes: 400 kInvalidArgument, 401/403 kPermissionDenied,
  // 404 kNotFound, 409 and 429 kResourceExhausted, 503 kUnavailable, else kInternal).
  // Failover: starts at the controller that answered last; when it cannot be reached or answers
  // 503, tries the next ones (each with the full timeout), and returns the last one's error.
  Result<nlohmann::json> Call(const std::string& method, const std::string& target,
                              const nlohmann::json& body = nullptr) const;
  // The controller that answered last (or will be asked first).
  const Endpoint& endpoint() const { return eps_[current_.load() % eps_.size()]; }
  const std::vector<Endpoint>& endpoints() const { return eps_; }

 private:
  Result<nlohmann::json> CallOne(const Endpoint& ep, const std::string& method, const std::string& target,
                                 const std::string& text) const;
  std::vector<Endpoint> eps_;
  std::string key_;
  int timeout_ms_;
  mutable std::atomic<size_t> current_{0};
};

}  // namespace orion::controller
