#include "orion/tls/stream.h"

#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>
#include <mutex>

namespace orion::tls {
namespace {

class PlainStream final : public Stream {
 public:
  explicit PlainStream(int fd) noexcept : Stream(fd) {}
  ssize_t Read(void* p, size_t len) noexcept override {
    return Io([&] { return ::recv(fd_, p, len, MSG_DONTWAIT); }, POLLIN);
  }
  ssize_t Write(const void* p, size_t len) noexcept override {
    return Io([&] { return ::send(fd_, p, len, MSG_NOSIGNAL | MSG_DONTWAIT); }, POLLOUT);
  }
  bool Buffered() const noexcept override { return false; }

 private:
  // One non-blocking socket call, retried on EINTR: its count, kAgain (waiting for `want`), or
  // kError (error_ says why).
  template <typename Call>
  ssize_t Io(Call call, short want) noexcept {
    for (;;) {
      const ssize_t n = call();
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wants_ = want;
        return kAgain;
      }
      error_ = std::strerror(errno);
      return kError;
    }
  }
};

// OpenSSL's reason for the last error on this thread's queue, or `fallback`.
std::string OpensslReason(const char* fallback) {
  const unsigned long e = ERR_peek_last_error();
  if (e == 0) return fallback;
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  const char* r = ERR_reason_error_string(e);
  return r != nullptr ? std::string(r) : std::string(buf);
}

bool InitOpenssl() {
  // No cleanup at exit (the guest runtime may still send its Goodbye from libcuda's destructor,
  // after atexit handlers ran), as the controller client does.
  static const bool ok =
      OPENSSL_init_ssl(OPENSSL_INIT_NO_ATEXIT | OPENSSL_INIT_LOAD_SSL_STRINGS | OPENSSL_INIT_LOAD_CRYPTO_STRINGS,
                       nullptr) == 1;
  return ok;
}

void CommonOptions(SSL_CTX* ctx) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // A killed client closes its socket without close_notify: that is a closed connection (frames
  // carry their own lengths, so a truncated one is caught there), not an error.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE
#ifdef SSL_OP_ENABLE_KTLS
                               | SSL_OP_ENABLE_KTLS
#endif
  );
  // AES-128-GCM first: as safe for this use, and about a third faster than AES-256 with AES-NI.
  SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384");
  // Whole writes (a retry after WANT_WRITE passes the same bytes, maybe from a moved buffer): one
  // call per message, not per 16 KiB record. Reads take what the socket holds (read-ahead into a
  // 256 KiB buffer): one system call for many records, not two per record.
  SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, 256 * 1024);
}

// Blocks SIGPIPE on this thread for one write, and consumes the one a write to a closed peer raised
// (standard signals do not queue: one pending SIGPIPE is all there can be). A server context skips
// it: oriond ignores SIGPIPE.
class SigpipeGuard {
 public:
  explicit SigpipeGuard(bool on) noexcept : on_(on) {
    if (!on_) return;
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!on_) return;
    const int saved = errno;
    if (saved == EPIPE) {
      const timespec zero{0, 0};
      (void)sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    errno = saved;
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  bool on_;
  sigset_t pipe_{}, old_{};
};

}  // namespace

std::unique_ptr<Stream> Stream::Plain(int fd) { return std::make_unique<PlainStream>(fd); }

bool LooksLikeTls(const unsigned char* b, size_t n) noexcept { return n >= 3 && b[0] == 22 && b[1] == 3 && b[2] <= 4; }

Context::~Context() { SSL_CTX_free(ctx_); }

Result<std::shared_ptr<Context>> Context::Server(const std::string& cert_file, const std::string& key_file) {
  if (!InitOpenssl()) return Internal("OpenSSL cannot be initialized");
  std::shared_ptr<Context> c(new Context);
  c->ctx_ = SSL_CTX_new(TLS_server_method());
  if (c->ctx_ == nullptr) return Internal("SSL_CTX_new: " + OpensslReason("out of memory"));
  CommonOptions(c->ctx_);
  SSL_CTX_set_num_tickets(c->ctx_, 0);  // no resumption: one long connection per session
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(c->ctx_, cert_file.c_str()) != 1) {
    return InvalidArgument("tls_cert " + cert_file + ": " + OpensslReason("cannot be read"));
  }
  if (SSL_CTX_use_PrivateKey_file(c->ctx_, key_file.c_str(), SSL_FILETYPE_PEM) != 1 &&
      ERR_GET_REASON(ERR_peek_last_error()) != X509_R_KEY_VALUES_MISMATCH) {
    return InvalidArgument("tls_key " + key_file + ": " + OpensslReason("cannot be read"));
  }
  if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH || SSL_CTX_check_private_key(c->ctx_) != 1) {
    return InvalidArgument("tls_key " + key_file + " does not belong to tls_cert " + cert_file + ": " +
                           OpensslReason("key values mismatch"));
  }
  return c;
}

Result<std::shared_ptr<Context>> Context::Client(const std::string& ca_file) {
  if (!InitOpenssl()) return Internal("OpenSSL cannot be initialized");
  std::shared_ptr<Context> c(new Context);
  c->ctx_ = SSL_CTX_new(TLS_client_method());
  if (c->ctx_ == nullptr) return Internal("SSL_CTX_new: " + OpensslReason("out of memory"));
  CommonOptions(c->ctx_);
  SSL_CTX_set_verify(c->ctx_, SSL_VERIFY_PEER, nullptr);
  ERR_clear_error();
  c->ca_file_ = ca_file;
  if (!ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(c->ctx_, ca_file.c_str(), nullptr) != 1) {
      return InvalidArgument("ORION_TLS_CA " + ca_file + ": " + OpensslReason("cannot be read"));
    }
  } else if (SSL_CTX_set_default_verify_paths(c->ctx_) != 1) {
    return InvalidArgument("the system's CA certificates cannot be loaded: " + OpensslReason("unknown"));
  }
  return c;
}

Result<std::unique_ptr<TlsStream>> TlsStream::Accept(std::shared_ptr<Context> ctx, int fd) {
  SSL* ssl = SSL_new(ctx->native());
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return Internal("SSL_new: " + OpensslReason("out of memory"));
  }
  SSL_set_accept_state(ssl);
  return std::unique_ptr<TlsStream>(new TlsStream(std::move(ctx), ssl, fd, true));
}

Result<std::unique_ptr<TlsStream>> TlsStream::Connect(std::shared_ptr<Context> ctx, int fd, const std::string& host) {
  SSL* ssl = SSL_new(ctx->native());
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return Internal("SSL_new: " + OpensslReason("out of memory"));
  }
  unsigned char ip[16];
  const bool is_ip = inet_pton(AF_INET, host.c_str(), ip) == 1 || inet_pton(AF_INET6, host.c_str(), ip) == 1;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  const int named = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str())
                          : X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size());
  if (named != 1) {
    SSL_free(ssl);
    return InvalidArgument("cannot verify the server as '" + host + "'");
  }
  if (!is_ip) SSL_set_tlsext_host_name(ssl, host.c_str());  // SNI: names only (RFC 6066)
  SSL_set_connect_state(ssl);
  return std::unique_ptr<TlsStream>(new TlsStream(std::move(ctx), ssl, fd, false));
}

TlsStream::~TlsStream() {
  // No close_notify: oriond's parent frees its copy of a stream its worker now owns, and must not
  // write to the connection. The channel that owns the socket shuts it down.
  SSL_free(ssl_);
}

ssize_t TlsStream::Failed(int ret, const char* what) noexcept {
  const int err = SSL_get_error(ssl_, ret);
  switch (err) {
    case SSL_ERROR_WANT_READ: wants_ = POLLIN; return kAgain;
    case SSL_ERROR_WANT_WRITE: wants_ = POLLOUT; return kAgain;
    case SSL_ERROR_ZERO_RETURN: return 0;
    case SSL_ERROR_SYSCALL:
      if (errno == EINTR) {
        wants_ = POLLIN | POLLOUT;
        return kAgain;
      }
      if (errno == 0 || errno == ECONNRESET || errno == EPIPE) {
        error_ = std::string(what) + ": the peer closed the connection";
        return done_ ? 0 : kError;  // after the handshake, the peer going away
      }
      error_ = std::string(what) + ": " + std::strerror(errno);
      return kError;
    default: break;
  }
  const unsigned long e = ERR_peek_last_error();
  const int reason = ERR_GET_REASON(e);
  if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
    const long v = SSL_get_verify_result(ssl_);
    error_ = std::string("certificate verify failed: ") + X509_verify_cert_error_string(v) + " (CA: " +
             (ctx_->ca_file().empty() ? std::string("the system's CAs; set ORION_TLS_CA") : ctx_->ca_file()) + ")";
  } else if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
             reason == SSL_R_RECORD_LENGTH_MISMATCH) {
    error_ = std::string(what) + ": the peer does not speak TLS (" + OpensslReason("wrong version number") + ")";
  } else if (reason == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
    error_ = std::string(what) + ": the peer closed the connection";
  } else {
    error_ = std::string(what) + ": " + OpensslReason("failed");
  }
  return kError;
}

ssize_t TlsStream::Handshake() noexcept {
  std::lock_guard<std::mutex> l(mu_);
  if (done_) return 1;
  ERR_clear_error();
  errno = 0;
  int ret;
  {
    SigpipeGuard g(!server_);
    ret = SSL_do_handshake(ssl_);
  }
  if (ret == 1) {
    done_ = true;
    return 1;
  }
  const ssize_t r = Failed(ret, "TLS handshake");
  if (r == 0) {
    error_ = "TLS handshake: the peer closed the connection";
    return kError;
  }
  return r;
}

ssize_t TlsStream::Read(void* p, size_t len) noexcept {
  std::lock_guard<std::mutex> l(mu_);
  ERR_clear_error();
  errno = 0;
  size_t n = 0;
  if (SSL_read_ex(ssl_, p, len, &n) == 1) return static_cast<ssize_t>(n);
  return Failed(0, "TLS read");
}

ssize_t TlsStream::Write(const void* p, size_t len) noexcept {
  if (len == 0) return 0;
  std::lock_guard<std::mutex> l(mu_);
  ERR_clear_error();
  errno = 0;
  size_t n = 0;
  int ok;
  {
    SigpipeGuard g(!server_);
    ok = SSL_write_ex(ssl_, p, len, &n);
  }
  if (ok == 1) return static_cast<ssize_t>(n);
  const ssize_t r = Failed(0, "TLS write");
  if (r == 0) {
    error_ = "TLS write: the peer closed the connection";
    return kError;
  }
  return r;
}

bool TlsStream::Buffered() const noexcept {
  std::lock_guard<std::mutex> l(mu_);
  return SSL_pending(ssl_) > 0 || SSL_has_pending(ssl_) == 1;
}

bool TlsStream::kernel_send() const noexcept {
#if defined(BIO_get_ktls_send)
  return BIO_get_ktls_send(SSL_get_wbio(ssl_)) == 1;
#else
  return false;
#endif
}

bool TlsStream::kernel_receive() const noexcept {
#if defined(BIO_get_ktls_recv)
  return BIO_get_ktls_recv(SSL_get_rbio(ssl_)) == 1;
#else
  return false;
#endif
}

std::string TlsStream::Describe() const {
  std::lock_guard<std::mutex> l(mu_);
  const bool s = kernel_send(), r = kernel_receive();
  return std::string(SSL_get_version(ssl_)) + " (" + SSL_get_cipher_name(ssl_) + ", kernel TLS: " +
         (s && r ? "send and receive"
          : s    ? "send"
          : r    ? "receive"
                 : "no") +
         ")";
}

}  // namespace orion::tls
