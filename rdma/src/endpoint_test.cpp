// What can be checked of the RDMA endpoint without an RDMA device (the Soft-RoCE guest of
// tests/integration/test_rdma.py covers the rest): GID text, and FindPort's refusals with reasons.
#include "orion/rdma/endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/un.h>

namespace orion::rdma {
namespace {

TEST(Gid, TextOfIpv4MappedAndIpv6) {
  uint8_t g[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 9, 0, 1};
  EXPECT_EQ(GidText(g), "::ffff:10.9.0.1");
  uint8_t l[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55};
  EXPECT_EQ(GidText(l), "fe80::211:22ff:fe33:4455");
}

TEST(FindPort, RefusesNonIpAddresses) {
  sockaddr_un u{};
  u.sun_family = AF_UNIX;
  auto p = FindPort(reinterpret_cast<sockaddr*>(&u));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kUnavailable);
  if (VerbsUnavailableReason().empty()) {
    EXPECT_EQ(p.status().message(), "the connection is not over IP");
  }
}

TEST(FindPort, LoopbackHasNoRdmaPortAndSaysWhy) {
  // rdma_cm and RoCE do not work on lo: no device owns 127.0.0.1, whatever this host has.
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto p = FindPort(reinterpret_cast<sockaddr*>(&a));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kUnavailable);
  EXPECT_FALSE(p.status().message().empty());
  const std::string m = p.status().message();
  EXPECT_TRUE(m.find("libibverbs.so.1 cannot be loaded") == 0 || m.find("this host has no RDMA device") == 0 ||
              m.find("has the address ::ffff:127.0.0.1") != std::string::npos)
      << m;
}

}  // namespace
}  // namespace orion::rdma
