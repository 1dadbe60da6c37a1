// orion_tls: a connected socket as a byte stream, plain or TLS (OpenSSL), for oriond's TCP data
// plane (issue #22 item 7). Both ends use it: oriond's parent does the server handshake before the
// Hello and its worker inherits the stream across fork(); the guest runtime connects with it.
//
// Shapes and ownership:
//   - A Stream never owns its socket: the channel that holds the fd closes it. The fd must be
//     non-blocking (O_NONBLOCK); every call returns at once, and callers poll(2) the fd for
//     wants() when a call returned kAgain. Before polling for input, check Buffered(): TLS may hold
//     decrypted bytes the socket no longer shows.
//   - Writes never raise SIGPIPE (plain: MSG_NOSIGNAL; a TLS client: SIGPIPE is blocked for the
//     write and the one it raised consumed), so the guest runtime does not change its host
//     program's signals. A TLS server end assumes its process ignores SIGPIPE (oriond does).
//   - A Write writes all of `len` or returns kAgain; after kAgain the caller must call it again
//     with the same bytes (OpenSSL's rule; the buffer may move) before writing anything else.
//   - TLS: 1.2 at least. The client verifies the server's chain against a CA file (or the system's
//     CAs) and its name or IP address (RFC 6125, through OpenSSL's X509_VERIFY_PARAM). Kernel TLS
//     (SSL_OP_ENABLE_KTLS) is asked for; whether the kernel took it (the `tls` module and a cipher it
//     offloads) is in Describe().
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <string>

#include "orion/common/status.h"

typedef struct ssl_ctx_st SSL_CTX;  // NOLINT(modernize-use-using): OpenSSL's own declaration
typedef struct ssl_st SSL;          // NOLINT(modernize-use-using)

namespace orion::tls {

// Returned by Read/Write (as a negative count) and Handshake.
inline constexpr ssize_t kAgain = -1;  // nothing now: poll the fd for wants()
inline constexpr ssize_t kError = -2;  // the connection failed: error() says why

class Stream {
 public:
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  // Reads up to `len` bytes: > 0 bytes read; 0 the peer closed; kAgain; kError.
  virtual ssize_t Read(void* p, size_t len) noexcept = 0;
  // Writes `len` bytes (plain: maybe fewer): > 0 bytes written; kAgain (TLS: call again with the
  // same bytes); kError.
  virtual ssize_t Write(const void* p, size_t len) noexcept = 0;
  // True when bytes are buffered inside the stream (decrypted, not yet read).
  virtual bool Buffered() const noexcept = 0;
  // The poll(2) events the last kAgain waits for (POLLIN or POLLOUT).
  short wants() const noexcept { return wants_; }
  int fd() const noexcept { return fd_; }
  const std::string& error() const noexcept { return error_; }
  virtual bool secure() const noexcept { return false; }
  // "TCP", or "TLS 1.3 (TLS_AES_256_GCM_SHA384, kernel TLS: send and receive)".
  virtual std::string Describe() const { return "TCP"; }

  // A plain TCP stream over `fd`.
  static std::unique_ptr<Stream> Plain(int fd);

 protected:
  explicit Stream(int fd) noexcept : fd_(fd) {}
  int fd_;
  short wants_ = 0;
  std::string error_;
};

// An SSL_CTX with its settings. Shared by the streams made from it.
class Context {
 public:
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  // A server's: its certificate chain and private key (PEM files, no passphrase). Errors name the
  // file and OpenSSL's reason (missing file, not PEM, key does not match the certificate).
  static Result<std::shared_ptr<Context>> Server(const std::string& cert_file, const std::string& key_file);
  // A client's: verifies servers against `ca_file` (PEM), or the system's CAs when empty.
  static Result<std::shared_ptr<Context>> Client(const std::string& ca_file);
  SSL_CTX* native() const noexcept { return ctx_; }
  const std::string& ca_file() const noexcept { return ca_file_; }

 private:
  Context() = default;
  SSL_CTX* ctx_ = nullptr;
  std::string ca_file_;
};

class TlsStream final : public Stream {
 public:
  ~TlsStream() override;
  // A server end over `fd`: Handshake() until done.
  static Result<std::unique_ptr<TlsStream>> Accept(std::shared_ptr<Context> ctx, int fd);
  // A client end over `fd`, verifying the server as `host` (a name or an IP address).
  static Result<std::unique_ptr<TlsStream>> Connect(std::shared_ptr<Context> ctx, int fd, const std::string& host);
  // One non-blocking handshake step: 1 done; kAgain (poll for wants()); kError (error() says why,
  // in words a user can act on: verification failures name the reason and the CA file).
  ssize_t Handshake() noexcept;
  ssize_t Read(void* p, size_t len) noexcept override;
  ssize_t Write(const void* p, size_t len) noexcept override;
  bool Buffered() const noexcept override;
  bool secure() const noexcept override { return true; }
  std::string Describe() const override;
  bool kernel_send() const noexcept;  // kernel TLS took the send (receive) direction
  bool kernel_receive() const noexcept;

 private:
  TlsStream(std::shared_ptr<Context> ctx, SSL* ssl, int fd, bool server) noexcept
      : Stream(fd), ctx_(std::move(ctx)), ssl_(ssl), server_(server) {}
  // Classifies a failed SSL call: kAgain (wants_ set) or kError (error_ set).
  ssize_t Failed(int ret, const char* what) noexcept;
  std::shared_ptr<Context> ctx_;
  // SSL objects are not safe for concurrent use (oriond's watchdog sends keepalives from another
  // thread than the session's reads): every call holds this lock; all of them are non-blocking.
  mutable std::mutex mu_;
  SSL* ssl_;
  bool server_;
  bool done_ = false;
};

// True when `b` (at least 3 bytes) begins like a TLS record carrying a handshake (a ClientHello):
// content type 22, version 3.x.
bool LooksLikeTls(const unsigned char* b, size_t n) noexcept;

}  // namespace orion::tls
