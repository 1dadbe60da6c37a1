// half.h — IEEE 754 binary16 ("half", PTX .f16) conversions in portable C++: the PTX executor's
// f16 arithmetic is done in float and rounded through these (as a GPU's f16 units round each
// result). No compiler half type is needed (_Float16 is not available with every compiler).
// Rounding: the current rounding mode (to nearest even unless a directed .rz/.rm/.rp is in force);
// subnormals kept; NaN stays NaN (quiet, the top payload bits kept). ptx_test checks them against the compiler's
// _Float16 where it has one, over every half and a sweep of floats.
#pragma once

#include <bit>
#include <cfenv>
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

// Rounds as the current floating-point rounding mode says (std::fegetround: to nearest even by
// default; the executor's RoundScope sets .rz/.rm/.rp for one operation), as a hardware or GCC
// conversion does: toward zero and away from a direction's infinity, the largest finite half
// (65504) is the limit instead of infinity.
inline uint16_t FloatToHalf(float f) noexcept {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN, quiet
  if (abs == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);                          // infinity
  const int mode = std::fegetround();
  const bool up = (mode == FE_UPWARD && sign == 0) || (mode == FE_DOWNWARD && sign != 0);  // away from zero
  // Whether the value, truncated to `r` with `rem` of `half * 2` left over, rounds away from zero.
  auto away = [&](uint32_t r, uint32_t rem, uint32_t half) {
    if (rem == 0 || mode == FE_TOWARDZERO) return false;
    if (mode == FE_UPWARD || mode == FE_DOWNWARD) return up;
    return rem > half || (rem == half && (r & 1u) != 0);  // to nearest, ties to even
  };
  if (abs >= 0x47800000u) {  // >= 65536: past the largest finite half
    return static_cast<uint16_t>(sign | (mode == FE_TONEAREST || up ? 0x7c00u : 0x7bffu));
  }
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), in units of 2^-24
    const uint32_t e = abs >> 23;
    if (e < 102) return static_cast<uint16_t>(sign | (abs != 0 && up ? 1u : 0u));  // below 2^-25
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = mant >> shift;
    if (away(r, mant & ((1u << shift) - 1u), 1u << (shift - 1))) ++r;  // may become 0x400: the smallest normal
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t h = ((((abs >> 23) - 112u) << 10) | ((abs & 0x7fffffu) >> 13));
  if (away(h, abs & 0x1fffu, 0x1000u)) ++h;  // a carry may reach infinity (0x7c00)
  return static_cast<uint16_t>(sign | h);
}

}  // namespace orion::ptx
