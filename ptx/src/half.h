// half.h — IEEE 754 binary16 ("half", PTX .f16) conversions in portable C++: the PTX executor's
// f16 arithmetic is done in float and rounded through these (as a GPU's f16 units round each
// result). No compiler half type is needed (_Float16 is not available with every compiler).
// Rounding: to nearest, ties to even; overflow to infinity; subnormals kept; NaN stays NaN (quiet,
// the top payload bits kept). ptx_test checks them against the compiler's _Float16 where it has one,
// over every half and a sweep of floats.
#pragma once

#include <bit>
#include <cstdint>

namespace orion::ptx {

inline float HalfToFloat(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {  // zero or subnormal: m x 2^-24, exact in float
    const float v = static_cast<float>(m) * 0x1p-24f;
    return sign != 0 ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));  // infinity, NaN
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t FloatToHalf(float f) noexcept {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN, quiet
  if (abs >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65536 (and infinity)
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), in units of 2^-24
    const uint32_t e = abs >> 23;
    if (e < 102) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u) != 0)) ++r;  // may become 0x400: the smallest normal
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t h = ((((abs >> 23) - 112u) << 10) | ((abs & 0x7fffffu) >> 13));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0)) ++h;  // a carry may reach infinity (0x7c00)
  return static_cast<uint16_t>(sign | h);
}

}  // namespace orion::ptx
