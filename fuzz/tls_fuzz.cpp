// tls_fuzz — what a network client sends oriond's TLS port before its Hello (issue #22): the bytes
// oriond peeks at to tell TLS from a plain Hello (orion::tls::LooksLikeTls), then the server end of
// the TLS handshake (orion::tls::TlsStream over a socketpair, OpenSSL underneath) and, should a
// handshake complete, reads. Every input must end in a handshake error, a wait for more bytes, or
// a closed stream; anything else (a crash, a leak, a hang) is a finding.
//
// The server's certificate (EC P-256, self-signed) is made once at start-up in a temporary
// directory, removed again at once.
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "orion/tls/stream.h"

namespace {

std::shared_ptr<orion::tls::Context> ServerContext() {
  char tmpl[] = "/tmp/orion-tls-fuzz-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 86400);
  X509_set_pubkey(x, key);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("oriond"), -1, -1, 0);
  X509_set_issuer_name(x, X509_get_subject_name(x));
  X509_sign(x, key, EVP_sha256());
  const std::string cert = dir + "/server.crt", pem = dir + "/server.key";
  FILE* f = std::fopen(cert.c_str(), "w");
  PEM_write_X509(f, x);
  std::fclose(f);
  f = std::fopen(pem.c_str(), "w");
  PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  X509_free(x);
  EVP_PKEY_free(key);
  auto ctx = orion::tls::Context::Server(cert, pem);
  std::filesystem::remove_all(dir);
  if (!ctx.ok()) std::abort();
  return *ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<orion::tls::Context> ctx = ServerContext();
  (void)orion::tls::LooksLikeTls(data, size);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) return 0;
  // The client's bytes, then its end closes: the server sees them and then EOF.
  for (size_t done = 0; done < size;) {
    const ssize_t n = write(sv[1], data + done, size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  shutdown(sv[1], SHUT_WR);
  {
    auto s = orion::tls::TlsStream::Accept(ctx, sv[0]);
    if (!s.ok()) std::abort();
    auto& stream = *s;
    ssize_t r = orion::tls::kAgain;
    // The server's own flight may fill the socket (nobody reads it): a bounded number of steps.
    for (int i = 0; i < 64 && r == orion::tls::kAgain; ++i) {
      r = stream->Handshake();
      if (r == orion::tls::kAgain && stream->wants() == POLLOUT) break;
    }
    if (r == 1) {
      uint8_t buf[4096];
      for (int i = 0; i < 16 && stream->Read(buf, sizeof buf) > 0; ++i) {
      }
    } else if (r == orion::tls::kError && stream->error().empty()) {
      std::abort();  // an error must say why (oriond logs it)
    }
  }
  close(sv[0]);
  close(sv[1]);
  return 0;
}
