#include "md2.h"

#include <algorithm>
#include <cstring>

namespace orion::guest {
namespace {

// RFC 1319 §3.2: the permutation of 0..255 built from the digits of pi.
constexpr uint8_t kPi[256] = {
    41,  46,  67,  201, 162, 216, 124, 1,   61,  54,  84,  161, 236, 240, 6,   19,  98,  167, 5,   243, 192, 199,
    115, 140, 152, 147, 43,  217, 188, 76,  130, 202, 30,  155, 87,  60,  253, 212, 224, 22,  103, 66,  111, 24,
    138, 23,  229, 18,  190, 78,  196, 214, 218, 158, 222, 73,  160, 251, 245, 142, 187, 47,  238, 122, 169, 104,
    121, 145, 21,  178, 7,   63,  148, 194, 16,  137, 11,  34,  95,  33,  128, 127, 93,  154, 90,  144, 50,  39,
    53,  62,  204, 231, 191, 247, 151, 3,   255, 25,  48,  179, 72,  165, 181, 209, 215, 94,  146, 42,  172, 86,
    170, 198, 79,  184, 56,  210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4,   241, 69,  157, 112, 89,
    100, 113, 135, 32,  134, 91,  207, 101, 230, 45,  168, 2,   27,  96,  37,  173, 174, 176, 185, 246, 28,  70,
    97,  105, 52,  64,  126, 15,  85,  71,  163, 35,  221, 81,  175, 58,  195, 92,  249, 206, 186, 197, 234, 38,
    44,  83,  13,  110, 133, 40,  132, 9,   211, 223, 205, 244, 65,  129, 77,  82,  106, 220, 55,  200, 108, 193,
    171, 250, 36,  225, 123, 8,   12,  189, 177, 74,  120, 136, 149, 139, 227, 99,  232, 109, 233, 203, 213, 254,
    59,  0,   29,  57,  242, 239, 183, 14,  102, 88,  208, 228, 166, 119, 114, 248, 235, 117, 75,  10,  49,  68,
    80,  180, 143, 237, 31,  26,  219, 153, 141, 51,  159, 17,  131, 20};

struct Md2 {
  uint8_t x[48]{};
  uint8_t c[16]{};
  uint8_t buf[16]{};
  size_t n = 0;

  void Block(const uint8_t* b) {
    for (int j = 0; j < 16; ++j) {
      x[16 + j] = b[j];
      x[32 + j] = static_cast<uint8_t>(x[16 + j] ^ x[j]);
    }
    uint8_t t = 0;
    for (int j = 0; j < 18; ++j) {
      for (int k = 0; k < 48; ++k) t = x[k] ^= kPi[t];
      t = static_cast<uint8_t>(t + j);
    }
    uint8_t l = c[15];
    for (int j = 0; j < 16; ++j) l = c[j] ^= kPi[b[j] ^ l];
  }
  void Update(const uint8_t* p, size_t len) {
    while (len > 0) {
      const size_t k = std::min(len, 16 - n);
      std::memcpy(buf + n, p, k);
      n += k;
      p += k;
      len -= k;
      if (n == 16) {
        Block(buf);
        n = 0;
      }
    }
  }
  void Final(uint8_t out[16]) {
    const auto pad = static_cast<uint8_t>(16 - n);
    uint8_t padding[16];
    std::memset(padding, pad, sizeof padding);
    Update(padding, pad);
    uint8_t cc[16];
    std::memcpy(cc, c, 16);
    Block(cc);
    std::memcpy(out, x, 16);
  }
};

}  // namespace

void Md2Digest(const uint8_t* msg, size_t len, uint8_t out[16]) noexcept {
  Md2 m;
  m.Update(msg, len);
  m.Final(out);
}

void HmacMd2(const uint8_t key[16], const uint8_t* msg, size_t len, uint8_t out[16]) noexcept {
  uint8_t k[16];
  Md2 inner, outer;
  for (int i = 0; i < 16; ++i) k[i] = key[i] ^ 0x36;
  inner.Update(k, 16);
  inner.Update(msg, len);
  uint8_t ih[16];
  inner.Final(ih);
  for (int i = 0; i < 16; ++i) k[i] = key[i] ^ 0x5c;
  outer.Update(k, 16);
  outer.Update(ih, 16);
  outer.Final(out);
}

}  // namespace orion::guest
