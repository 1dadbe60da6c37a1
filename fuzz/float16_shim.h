// float16_shim.h — for compilers without _Float16 on x86-64 (clang < 15): the fuzz build force-
// includes this into ptx/src/exec.cpp only (fuzz/CMakeLists.txt checks the compiler first), and
// _Float16 becomes a 2-byte class with IEEE binary16 conversions to and from float. exec.cpp uses
// _Float16 only through std::bit_cast and float conversions (H2F / F2H), which this supports.
// Float to half rounds to nearest even (GCC's _Float16 follows the current rounding mode; the
// fuzzer looks for memory errors, not for the last bit of a .rz conversion).
#pragma once

#include <cstdint>
#include <cstring>

class OrionFuzzHalf {
 public:
  OrionFuzzHalf() = default;
  OrionFuzzHalf(float f) : bits_(FromFloat(f)) {}  // NOLINT: implicit, as a real _Float16
  operator float() const { return ToFloat(bits_); }

 private:
  static float ToFloat(uint16_t h) {
    const uint32_t sign = uint32_t{h & 0x8000u} << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
      u = sign | 0x7f800000u | (man << 13);  // inf, NaN (payload kept)
    } else if (exp != 0) {
      u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = 113;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        --e;
      }
      u = sign | (static_cast<uint32_t>(e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t FromFloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    const uint32_t exp = (u >> 23) & 0xff;
    const uint32_t man = u & 0x7fffffu;
    if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (man != 0 ? 0x200u | (man >> 13) : 0));
    const int e = static_cast<int>(exp) - 127 + 15;
    if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: inf
    if (e <= 0) {
      if (e < -10) return sign;  // below half the smallest subnormal: zero
      const uint32_t m = man | 0x800000u;
      const int shift = 14 - e;  // 14..24
      uint32_t h = m >> shift;
      const uint32_t rem = m & ((1u << shift) - 1);
      const uint32_t half = 1u << (shift - 1);
      if (rem > half || (rem == half && (h & 1))) ++h;
      return static_cast<uint16_t>(sign | h);
    }
    uint32_t h = (static_cast<uint32_t>(e) << 10) | (man >> 13);
    const uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // may carry into the exponent: correct
    return static_cast<uint16_t>(sign | h);
  }
  uint16_t bits_;
};
static_assert(sizeof(OrionFuzzHalf) == 2);

#define _Float16 OrionFuzzHalf
