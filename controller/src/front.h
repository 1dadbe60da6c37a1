// The controller's connection front: one epoll thread accepts and reads every connection, bounded,
// and a request reaches cpp-httplib's routing (a worker thread) only when its head and body are in
// memory.
//
// Why not httplib's own loop (Debian 12's cpp-httplib 0.11.4): it gives each connection a pool
// thread for its whole life (an idle keep-alive connection holds one until its read timeout, so 32
// idle connections stalled the controller); it reads a request line or header line of any length
// into memory before checking it (after a pre-routing 401 it reads the unread body as the next
// request line); and set_payload_max_length does not bound a chunked body. Here an idle or slow
// connection costs a descriptor and at most FrontLimits::max_head_bytes, never a thread; a head is
// checked (keys, Content-Length, Transfer-Encoding) before one byte of its body is kept; a body,
// chunked or not, is kept only up to FrontLimits::max_body_bytes (413 beyond, the connection closed).
//
// The HTTP/1.1 parsing (request line, fields, Content-Length, chunked decoding) is Boost.Beast's
// request_parser, fed the bytes the epoll loop reads (none of Beast's or Asio's networking); the
// front adds the limits, the checks above, and hands httplib's routing (process_request) the
// request rebuilt from Beast's message: Content-Length of the decoded body, no Transfer-Encoding.
//
//   FrontServer server(limits, [&](const httplib::Request& head, httplib::Response& res) {
//     return api->PreRouting(head, res) == httplib::Server::HandlerResponse::Handled;
//   });
//   api->Install(server);              // routes, as on any httplib::Server
//   server.bind_to_port(host, port);   // listen_fd from set_socket_options
//   server.Serve(listen_fd);           // until Stop() (async-signal-safe)
//
// HTTPS (UseTls before Serve): OpenSSL on the same non-blocking sockets, SSL_accept / SSL_read /
// SSL_write whose WANT_READ / WANT_WRITE become the connection's epoll interest. The handshake is
// bounded like an idle connection (idle_timeout_ms from the accept: a silent or slow TLS client is
// closed), TLS 1.2 at least. A connection whose first byte is not a TLS handshake record gets a
// plain-text `HTTP/1.1 400` saying the controller serves HTTPS, and is closed.
#pragma once

#include <httplib.h>

#include <cstddef>
#include <functional>
#include <memory>

namespace orion::controller {

struct FrontLimits {
  size_t max_head_bytes = 16 * 1024;    // request line and headers (431 beyond)
  size_t max_body_bytes = 256 * 1024;   // decoded body (413 beyond)
  size_t max_body_buffered = 64 << 20;  // body bytes held across all connections (503 beyond)
  size_t max_connections = 4096;        // beyond: the oldest connection not being answered is closed
  int idle_timeout_ms = 5000;           // a keep-alive connection with no request begun
  int request_timeout_ms = 10000;       // from a request's first byte to its last (408 beyond)
  int write_timeout_ms = 10000;         // to write a reply
  size_t workers = 32;                  // threads that run routes (a watch holds one up to 30 s)
};

class FrontServer final : public httplib::Server {
 public:
  // Runs on the front thread with a request's head (method, path, headers; no body, no params):
  // true = answered in `res` (its body is never read, the connection closes after the reply).
  using HeadCheck = std::function<bool(const httplib::Request& head, httplib::Response& res)>;

  FrontServer(FrontLimits limits, HeadCheck check);
  ~FrontServer() override;

  // Accepts on `listen_fd` (bound and listening) until Stop(). Returns false if the front cannot
  // start (epoll, eventfd).
  bool Serve(int listen_fd);
  // Safe from a signal handler and any thread: Serve returns once in-flight routes have answered.
  void Stop();

  // Serve HTTPS with `cert_file` (PEM, the certificate and its chain) and `key_file` (PEM), TLS 1.2
  // or later; with `client_ca_file` (PEM CAs), only to clients whose certificate they signed (mutual
  // TLS). Returns "" or why not (a file missing or unreadable, a key that is not the
  // certificate's), for the operator.
  std::string UseTls(const std::string& cert_file, const std::string& key_file, const std::string& client_ca_file = "");

  // Connections open now (for tests and logs).
  size_t connections() const;

 private:
  class Front;
  // Runs httplib's parser and routes over one complete request; returns the reply's bytes.
  std::string Route(const std::string& request, const std::string& remote_ip, int remote_port,
                    const std::string& local_ip, int local_port, bool* close);

  std::unique_ptr<Front> front_;
};

}  // namespace orion::controller
