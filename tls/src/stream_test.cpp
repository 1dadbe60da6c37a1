// orion_tls over socketpairs: handshake, bytes both ways in and out of order, verification
// failures, a plain peer, a closed peer, no SIGPIPE. Certificates are made here (OpenSSL API).
#include "orion/tls/stream.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace orion::tls {
namespace {

struct Pki {
  std::string dir, ca, cert, key, other_ca, other_key;
};

EVP_PKEY* NewKey() { return EVP_EC_gen("P-256"); }

X509* NewCert(EVP_PKEY* key, const char* cn, X509* issuer, EVP_PKEY* issuer_key, const char* san, bool ca) {
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), static_cast<long>(std::rand()));
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn), -1, -1, 0);
  X509_set_issuer_name(x, issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509V3_CTX v3;
  X509V3_set_ctx(&v3, issuer != nullptr ? issuer : x, x, nullptr, nullptr, 0);
  auto add = [&](int nid, const char* value) {
    X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, &v3, nid, value);
    X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
  };
  add(NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE");
  if (san != nullptr) add(NID_subject_alt_name, san);
  X509_sign(x, issuer_key != nullptr ? issuer_key : key, EVP_sha256());
  return x;
}

void Write(const std::string& path, X509* x, EVP_PKEY* k) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (x != nullptr) PEM_write_X509(f, x);
  if (k != nullptr) PEM_write_PrivateKey(f, k, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
}

const Pki& Certs() {
  static Pki* p = [] {
    auto* pki = new Pki;
    char tmpl[] = "/tmp/orion-tls-test-XXXXXX";
    pki->dir = mkdtemp(tmpl);
    EVP_PKEY* ca_key = NewKey();
    X509* ca = NewCert(ca_key, "Orion test CA", nullptr, nullptr, nullptr, true);
    EVP_PKEY* key = NewKey();
    X509* cert = NewCert(key, "oriond", ca, ca_key, "DNS:gpu-host.example,IP:127.0.0.1", false);
    EVP_PKEY* other_key = NewKey();
    X509* other = NewCert(other_key, "Another CA", nullptr, nullptr, nullptr, true);
    pki->ca = pki->dir + "/ca.crt";
    pki->cert = pki->dir + "/server.crt";
    pki->key = pki->dir + "/server.key";
    pki->other_ca = pki->dir + "/other.crt";
    pki->other_key = pki->dir + "/other.key";
    Write(pki->ca, ca, nullptr);
    Write(pki->cert, cert, nullptr);
    Write(pki->key, nullptr, key);
    Write(pki->other_ca, other, nullptr);
    Write(pki->other_key, nullptr, other_key);
    return pki;
  }();
  return *p;
}

struct Pair {
  int a = -1, b = -1;
  Pair() {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    a = sv[0];
    b = sv[1];
  }
  ~Pair() {
    if (a >= 0) close(a);
    if (b >= 0) close(b);
  }
};

void WaitFor(Stream& s) {
  pollfd p{s.fd(), s.wants(), 0};
  poll(&p, 1, 1000);
}

// Runs both handshakes to their end; returns (server result, client result).
std::pair<ssize_t, ssize_t> Handshake(TlsStream& server, TlsStream& client) {
  ssize_t rs = kAgain, rc = kAgain;
  for (int i = 0; i < 1000 && (rs == kAgain || rc == kAgain); ++i) {
    if (rc == kAgain) rc = client.Handshake();
    if (rs == kAgain) rs = server.Handshake();
    if (rs == kAgain && rc == kAgain) {
      pollfd p[2] = {{server.fd(), server.wants(), 0}, {client.fd(), client.wants(), 0}};
      poll(p, 2, 1000);
    }
  }
  return {rs, rc};
}

struct Connected {
  Pair pair;
  std::unique_ptr<TlsStream> server, client;
  explicit Connected(const std::string& ca, const std::string& host = "127.0.0.1") {
    auto sctx = Context::Server(Certs().cert, Certs().key);
    auto cctx = Context::Client(ca);
    EXPECT_TRUE(sctx.ok() && cctx.ok());
    server = TlsStream::Accept(*sctx, pair.a).value();
    client = TlsStream::Connect(*cctx, pair.b, host).value();
  }
};

// Sends `data` from `from` while reading it at `to` (both non-blocking, interleaved).
std::vector<uint8_t> Transfer(Stream& from, Stream& to, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> got(data.size());
  size_t sent = 0, recvd = 0;
  for (int spins = 0; recvd < data.size() && spins < 100000; ++spins) {
    if (sent < data.size()) {
      const ssize_t n = from.Write(data.data() + sent, data.size() - sent);
      if (n > 0) sent += static_cast<size_t>(n);
      EXPECT_NE(n, kError) << from.error();
    }
    const ssize_t m = to.Read(got.data() + recvd, got.size() - recvd);
    if (m > 0) recvd += static_cast<size_t>(m);
    EXPECT_NE(m, kError) << to.error();
    EXPECT_NE(m, 0);
    if (m == 0 || m == kError) break;
  }
  got.resize(recvd);
  return got;
}

TEST(Tls, HandshakeThenBytesBothWays) {
  Connected c(Certs().ca);
  auto [rs, rc] = Handshake(*c.server, *c.client);
  ASSERT_EQ(rc, 1) << c.client->error();
  ASSERT_EQ(rs, 1) << c.server->error();
  EXPECT_EQ(c.client->Describe().rfind("TLSv1.3 (", 0), 0u) << c.client->Describe();
  std::vector<uint8_t> big(4 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  EXPECT_EQ(Transfer(*c.client, *c.server, big), big);
  std::vector<uint8_t> small = {1, 2, 3, 4, 5};
  EXPECT_EQ(Transfer(*c.server, *c.client, small), small);
  // What the socket delivered in one record is held decrypted: Buffered says so.
  ASSERT_EQ(c.server->Write("abcdef", 6), 6);
  char two[2];
  ssize_t n = kAgain;
  for (int i = 0; i < 100 && n == kAgain; ++i) {
    n = c.client->Read(two, 2);
    if (n == kAgain) WaitFor(*c.client);
  }
  ASSERT_EQ(n, 2);
  EXPECT_TRUE(c.client->Buffered());
  char rest[8];
  EXPECT_EQ(c.client->Read(rest, sizeof rest), 4);
  EXPECT_FALSE(c.client->Buffered());
  EXPECT_EQ(c.client->Read(rest, sizeof rest), kAgain);
  EXPECT_EQ(c.client->wants(), POLLIN);
}

TEST(Tls, TheServerIsVerifiedByNameToo) {
  Connected ok(Certs().ca, "gpu-host.example");
  EXPECT_EQ(Handshake(*ok.server, *ok.client).second, 1) << ok.client->error();
  Connected wrong(Certs().ca, "other-host.example");
  EXPECT_EQ(Handshake(*wrong.server, *wrong.client).second, kError);
  EXPECT_EQ(wrong.client->error(), "certificate verify failed: hostname mismatch (CA: " + Certs().ca + ")");
  Connected wrong_ip(Certs().ca, "127.0.0.2");
  EXPECT_EQ(Handshake(*wrong_ip.server, *wrong_ip.client).second, kError);
  EXPECT_EQ(wrong_ip.client->error(), "certificate verify failed: IP address mismatch (CA: " + Certs().ca + ")");
}

TEST(Tls, AnotherCaIsRefusedOnBothEnds) {
  Connected c(Certs().other_ca);
  auto [rs, rc] = Handshake(*c.server, *c.client);
  EXPECT_EQ(rc, kError);
  EXPECT_EQ(c.client->error(),
            "certificate verify failed: unable to get local issuer certificate (CA: " + Certs().other_ca + ")");
  EXPECT_EQ(rs, kError);
  EXPECT_NE(c.server->error().find("alert"), std::string::npos) << c.server->error();
}

TEST(Tls, APlainPeerIsNamed) {
  Pair p;
  auto cctx = Context::Client(Certs().ca);
  ASSERT_TRUE(cctx.ok());
  auto client = TlsStream::Connect(*cctx, p.b, "127.0.0.1").value();
  // A plain oriond answers with a frame header: "OFRM", version, ...
  const char frame[32] = "OFRM\x06\x00\x01\x00";
  ASSERT_EQ(write(p.a, frame, sizeof frame), static_cast<ssize_t>(sizeof frame));
  ssize_t r = kAgain;
  for (int i = 0; i < 100 && r == kAgain; ++i) {
    r = client->Handshake();
    if (r == kAgain) WaitFor(*client);
  }
  EXPECT_EQ(r, kError);
  EXPECT_EQ(client->error().rfind("TLS handshake: the peer does not speak TLS (", 0), 0u) << client->error();
  // And one that closes on a ClientHello.
  Pair q;
  auto again = TlsStream::Connect(*cctx, q.b, "127.0.0.1").value();
  EXPECT_EQ(again->Handshake(), kAgain);
  unsigned char hello[5] = {};
  ASSERT_EQ(read(q.a, hello, sizeof hello), 5);
  EXPECT_TRUE(LooksLikeTls(hello, sizeof hello));
  EXPECT_FALSE(LooksLikeTls(reinterpret_cast<const unsigned char*>(frame), sizeof frame));
  close(q.a);
  q.a = -1;
  for (r = kAgain; r == kAgain;) r = again->Handshake();
  EXPECT_EQ(r, kError);
  EXPECT_EQ(again->error(), "TLS handshake: the peer closed the connection");
}

TEST(Tls, AClosedPeerReadsAsEndAndWritesRaiseNoSigpipe) {
  signal(SIGPIPE, SIG_DFL);  // a SIGPIPE would kill this test
  Connected c(Certs().ca);
  ASSERT_EQ(Handshake(*c.server, *c.client).second, 1);
  close(c.pair.a);  // the server's process dies: no close_notify
  c.pair.a = -1;
  char buf[16];
  EXPECT_EQ(c.client->Read(buf, sizeof buf), 0);
  std::vector<uint8_t> data(1 << 20, 7);
  ssize_t n = 0;
  for (int i = 0; i < 10 && n != kError; ++i) n = c.client->Write(data.data(), data.size());
  EXPECT_EQ(n, kError);
  EXPECT_EQ(c.client->error(), "TLS write: the peer closed the connection");
  auto plain = Stream::Plain(c.pair.b);
  EXPECT_EQ(plain->Write("x", 1), kError);
  EXPECT_EQ(plain->error(), "Broken pipe");
}

TEST(Tls, ContextErrorsNameTheFile) {
  auto missing = Context::Server(Certs().dir + "/none.crt", Certs().key);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message().rfind("tls_cert " + Certs().dir + "/none.crt: ", 0), 0u)
      << missing.status().message();
  auto mismatch = Context::Server(Certs().cert, Certs().other_key);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_EQ(mismatch.status().message().rfind("tls_key " + Certs().other_key + " does not belong to tls_cert", 0), 0u)
      << mismatch.status().message();
  auto ca = Context::Client(Certs().dir + "/none.crt");
  ASSERT_FALSE(ca.ok());
  EXPECT_EQ(ca.status().message().rfind("ORION_TLS_CA " + Certs().dir + "/none.crt: ", 0), 0u);
}

}  // namespace
}  // namespace orion::tls
