#include "md2.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace orion::guest {
namespace {

std::string Hex(const uint8_t* d) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    s += k[d[i] >> 4];
    s += k[d[i] & 15];
  }
  return s;
}

// RFC 1319 appendix A.5 test suite.
TEST(Md2, Rfc1319Vectors) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "8350e5a3e24c153df2275c9f80692773"},
      {"a", "32ec01ec4a6dac72c0ab96fb34c0b5d1"},
      {"abc", "da853b0d3f88d99b30283a69e6ded6bb"},
      {"message digest", "ab4f496bfb2a530b219ff33031fe06b0"},
      {"abcdefghijklmnopqrstuvwxyz", "4e8ddff3650292ab5a4108c3aa47940b"},
      {"12345678901234567890123456789012345678901234567890123456789012345678901234567890",
       "d5976f79d83d3a0dc9806c3c66f3efd8"},
  };
  for (const auto& [msg, want] : cases) {
    uint8_t d[16];
    Md2Digest(reinterpret_cast<const uint8_t*>(msg), std::strlen(msg), d);
    EXPECT_EQ(Hex(d), want) << msg;
  }
}

// HMAC is MD2((K^opad) || MD2((K^ipad) || m)) with a 16-byte key (one MD2 block).
TEST(Md2, HmacMatchesDefinition) {
  uint8_t key[16];
  for (int i = 0; i < 16; ++i) key[i] = static_cast<uint8_t>(i * 7 + 1);
  const std::string m = "orion integrity message";
  std::string inner(16, '\0');
  for (int i = 0; i < 16; ++i) inner[i] = static_cast<char>(key[i] ^ 0x36);
  inner += m;
  uint8_t ih[16];
  Md2Digest(reinterpret_cast<const uint8_t*>(inner.data()), inner.size(), ih);
  std::string outer(16, '\0');
  for (int i = 0; i < 16; ++i) outer[i] = static_cast<char>(key[i] ^ 0x5c);
  outer.append(reinterpret_cast<const char*>(ih), 16);
  uint8_t want[16], got[16];
  Md2Digest(reinterpret_cast<const uint8_t*>(outer.data()), outer.size(), want);
  HmacMd2(key, reinterpret_cast<const uint8_t*>(m.data()), m.size(), got);
  EXPECT_EQ(Hex(got), Hex(want));
}

}  // namespace
}  // namespace orion::guest
