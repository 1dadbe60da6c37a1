// ptx/src/alu.h — the executor's arithmetic with no block state: bit casts between registers and
// numbers (f16, bf16, f32, f64), truncation and sign extension, directed rounding, and three units
// the block calls per lane: FEval (a float operation on the instruction's float type), Compare
// (setp/set/slct's comparisons) and Convert (cvt). Private to ptx/src; block_test.cpp tests them
// directly. Built into files compiled with -frounding-math (RoundScope changes the rounding mode).
// Sources: PTX ISA 9.0, "Floating-Point Instructions" (.rn/.rz/.rm/.rp, .ftz, .sat) and "Data
// Movement and Conversion Instructions: cvt" (rounding, saturation, NaN to an integer is 0).
#pragma once

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <optional>

#include "half.h"
#include "ir.h"

namespace orion::ptx::exec {

// ---- bits and numbers ------------------------------------------------------------------------

inline float F32(uint64_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b)); }
inline uint64_t B32(float f) { return std::bit_cast<uint32_t>(f); }
inline double F64(uint64_t b) { return std::bit_cast<double>(b); }
inline uint64_t B64(double d) { return std::bit_cast<uint64_t>(d); }
inline float H2F(uint64_t h) { return HalfToFloat(static_cast<uint16_t>(h)); }
inline uint64_t F2H(float f) { return FloatToHalf(f); }
inline float BF2F(uint64_t h) { return std::bit_cast<float>(static_cast<uint32_t>(static_cast<uint16_t>(h)) << 16); }
inline uint64_t F2BF(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return u >> 16;
}
inline uint64_t Trunc(uint64_t v, int bytes) { return bytes >= 8 ? v : v & ((uint64_t{1} << (8 * bytes)) - 1); }
inline int64_t SExt(uint64_t v, int bytes) {
  if (bytes >= 8) return static_cast<int64_t>(v);
  const int sh = 64 - 8 * bytes;
  return static_cast<int64_t>(v << sh) >> sh;
}
inline float FtzF(float f) { return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f; }

// Directed rounding for one operation (the file is built with -frounding-math).
class RoundScope {
 public:
  explicit RoundScope(Rnd r) {
    int mode = -1;
    switch (r) {
      case Rnd::kRz:
      case Rnd::kRzi: mode = FE_TOWARDZERO; break;
      case Rnd::kRm:
      case Rnd::kRmi: mode = FE_DOWNWARD; break;
      case Rnd::kRp:
      case Rnd::kRpi: mode = FE_UPWARD; break;
      default: break;
    }
    if (mode >= 0) {
      saved_ = std::fegetround();
      std::fesetround(mode);
    }
  }
  ~RoundScope() {
    if (saved_ >= 0) std::fesetround(saved_);
  }
  RoundScope(const RoundScope&) = delete;
  RoundScope& operator=(const RoundScope&) = delete;

 private:
  int saved_ = -1;
};

inline bool Directed(Rnd r) {
  return r == Rnd::kRz || r == Rnd::kRm || r == Rnd::kRp || r == Rnd::kRzi || r == Rnd::kRmi || r == Rnd::kRpi;
}

// ---- units ------------------------------------------------------------------------------------

// Float operation on the instruction's float type (scalars, f16x2/bf16x2 pairs).
template <class Fn>
inline uint64_t FEval(const Ins& ins, uint64_t a, uint64_t b, uint64_t c, Fn fn) {
  auto post32 = [&](float r) {
    if (ins.ftz) r = FtzF(r);
    if (ins.sat) r = std::isnan(r) ? 0.0f : std::fmin(std::fmax(r, 0.0f), 1.0f);
    if (ins.relu && (std::isnan(r) || r < 0)) r = std::isnan(r) ? r : 0.0f;
    return r;
  };
  switch (ins.type) {
    case Ty::kF32: {
      const float x = ins.ftz ? FtzF(F32(a)) : F32(a), y = ins.ftz ? FtzF(F32(b)) : F32(b),
                  z = ins.ftz ? FtzF(F32(c)) : F32(c);
      if (!Directed(ins.rnd)) return B32(post32(fn(x, y, z)));
      RoundScope rs(ins.rnd);
      return B32(post32(fn(x, y, z)));
    }
    case Ty::kF64: {
      std::optional<RoundScope> rs;
      if (Directed(ins.rnd)) rs.emplace(ins.rnd);
      double r = fn(F64(a), F64(b), F64(c));
      if (ins.sat) r = std::isnan(r) ? 0.0 : std::fmin(std::fmax(r, 0.0), 1.0);
      return B64(r);
    }
    case Ty::kF16: return F2H(post32(fn(H2F(a), H2F(b), H2F(c))));
    case Ty::kBF16: return F2BF(post32(fn(BF2F(a), BF2F(b), BF2F(c))));
    case Ty::kF16x2:
      return F2H(post32(fn(H2F(a), H2F(b), H2F(c)))) |
             (F2H(post32(fn(H2F(a >> 16), H2F(b >> 16), H2F(c >> 16)))) << 16);
    case Ty::kBF16x2:
      return F2BF(post32(fn(BF2F(a), BF2F(b), BF2F(c)))) |
             (F2BF(post32(fn(BF2F(a >> 16), BF2F(b >> 16), BF2F(c >> 16)))) << 16);
    default: return 0;
  }
}

inline bool Compare(Cmp cmp, Ty t, uint64_t a, uint64_t b) {
  if (TyFloat(t)) {
    double x, y;
    if (t == Ty::kF64)
      x = F64(a), y = F64(b);
    else if (t == Ty::kF32)
      x = F32(a), y = F32(b);
    else if (t == Ty::kBF16)
      x = BF2F(a), y = BF2F(b);
    else
      x = H2F(a), y = H2F(b);
    const bool un = std::isnan(x) || std::isnan(y);
    switch (cmp) {
      case Cmp::kEq: return !un && x == y;
      case Cmp::kNe: return !un && x != y;
      case Cmp::kLt: return !un && x < y;
      case Cmp::kLe: return !un && x <= y;
      case Cmp::kGt: return !un && x > y;
      case Cmp::kGe: return !un && x >= y;
      case Cmp::kEqu: return un || x == y;
      case Cmp::kNeu: return un || x != y;
      case Cmp::kLtu: return un || x < y;
      case Cmp::kLeu: return un || x <= y;
      case Cmp::kGtu: return un || x > y;
      case Cmp::kGeu: return un || x >= y;
      case Cmp::kNum: return !un;
      case Cmp::kNan: return un;
      default: return false;
    }
  }
  const int n = TyBytes(t);
  if (TySigned(t) && cmp <= Cmp::kGe) {
    const int64_t x = SExt(a, n), y = SExt(b, n);
    switch (cmp) {
      case Cmp::kEq: return x == y;
      case Cmp::kNe: return x != y;
      case Cmp::kLt: return x < y;
      case Cmp::kLe: return x <= y;
      case Cmp::kGt: return x > y;
      case Cmp::kGe: return x >= y;
      default: return false;
    }
  }
  const uint64_t x = Trunc(a, n), y = Trunc(b, n);
  switch (cmp) {
    case Cmp::kEq: return x == y;
    case Cmp::kNe: return x != y;
    case Cmp::kLt:
    case Cmp::kLo: return x < y;
    case Cmp::kLe:
    case Cmp::kLs: return x <= y;
    case Cmp::kGt:
    case Cmp::kHi: return x > y;
    case Cmp::kGe:
    case Cmp::kHs: return x >= y;
    default: return false;
  }
}

// The float unit's operations (block_units.h ExecFloat): how many sources each takes, or 0 for an op
// it does not run.
inline int FloatArity(Op op) {
  switch (op) {
    case Op::kAdd:
    case Op::kSub:
    case Op::kMul:
    case Op::kDiv:
    case Op::kMin:
    case Op::kMax:
    case Op::kCopysign: return 2;
    case Op::kFma:
    case Op::kMad: return 3;
    case Op::kAbs:
    case Op::kNeg:
    case Op::kRcp:
    case Op::kSqrt:
    case Op::kRsqrt:
    case Op::kSin:
    case Op::kCos:
    case Op::kLg2:
    case Op::kEx2:
    case Op::kTanh: return 1;
    default: return 0;
  }
}

// One lane of the float unit: `ins` (a float type) on source bits a, b, c (0 past its arity).
// Transcendentals come from the host's libm (at least as accurate as the GPU's approximations).
inline uint64_t FloatLane(const Ins& ins, uint64_t a, uint64_t b, uint64_t c) {
  auto un = [&](auto fn) { return FEval(ins, a, 0, 0, [&](auto x, auto, auto) { return fn(x); }); };
  auto bin = [&](auto fn) { return FEval(ins, a, b, 0, [&](auto x, auto y, auto) { return fn(x, y); }); };
  switch (ins.op) {
    case Op::kAdd: return bin([](auto x, auto y) { return x + y; });
    case Op::kSub: return bin([](auto x, auto y) { return x - y; });
    case Op::kMul: return bin([](auto x, auto y) { return x * y; });
    case Op::kDiv: return bin([](auto x, auto y) { return x / y; });
    case Op::kMin: return bin([](auto x, auto y) { return std::fmin(x, y); });
    case Op::kMax: return bin([](auto x, auto y) { return std::fmax(x, y); });
    case Op::kCopysign: return bin([](auto x, auto y) { return std::copysign(y, x); });
    case Op::kFma:
    case Op::kMad: return FEval(ins, a, b, c, [](auto x, auto y, auto z) { return std::fma(x, y, z); });
    case Op::kAbs: return un([](auto x) { return std::fabs(x); });
    case Op::kNeg: return un([](auto x) { return -x; });
    case Op::kRcp: return un([](auto x) { return decltype(x)(1) / x; });
    case Op::kSqrt: return un([](auto x) { return std::sqrt(x); });
    case Op::kRsqrt: return un([](auto x) { return decltype(x)(1) / std::sqrt(x); });
    case Op::kSin: return un([](auto x) { return std::sin(x); });
    case Op::kCos: return un([](auto x) { return std::cos(x); });
    case Op::kLg2: return un([](auto x) { return std::log2(x); });
    case Op::kEx2: return un([](auto x) { return std::exp2(x); });
    case Op::kTanh: return un([](auto x) { return std::tanh(x); });
    default: return 0;
  }
}

// Runs `lanes(unit)` where `unit` is `ins` as FloatLane may take it for every lane: an f32 / f64
// operation with directed rounding sets the host's rounding mode once around all the lanes (and
// `unit` asks for none per lane; FEval rounds only the operation itself under it, so the bits are
// the same), instead of twice per lane (fesetround costs ~10 ns).
template <class F>
inline void FloatLanes(const Ins& ins, F lanes) {
  if ((ins.type == Ty::kF32 || ins.type == Ty::kF64) && Directed(ins.rnd)) {
    Ins unit = ins;
    unit.rnd = Rnd::kDefault;
    RoundScope rs(ins.rnd);
    lanes(unit);
    return;
  }
  lanes(ins);
}

// cvt: destination ins.type, source ins.type2.
inline uint64_t Convert(const Ins& ins, uint64_t v) {
  const Ty dt = ins.type, st = ins.type2;
  const int dn = TyBytes(dt), sn = TyBytes(st);
  if (!TyFloat(dt) && !TyFloat(st)) {
    if (ins.sat) {
      const bool ss = TySigned(st), ds = TySigned(dt);
      const int64_t lo = ds ? -(int64_t{1} << (8 * dn - 1)) : 0;
      const uint64_t hi =
          ds ? (uint64_t{1} << (8 * dn - 1)) - 1 : (dn >= 8 ? UINT64_MAX : (uint64_t{1} << (8 * dn)) - 1);
      if (ss) {
        const int64_t x = SExt(v, sn);
        if (x < lo) return Trunc(static_cast<uint64_t>(lo), dn);
        if (x > 0 && static_cast<uint64_t>(x) > hi) return hi;
        return Trunc(static_cast<uint64_t>(x), dn);
      }
      const uint64_t x = Trunc(v, sn);
      return x > hi ? hi : x;
    }
    const uint64_t x = TySigned(st) ? static_cast<uint64_t>(SExt(v, sn)) : Trunc(v, sn);
    return TySigned(dt) ? static_cast<uint64_t>(SExt(x, dn)) : Trunc(x, dn);
  }
  // Source to a double (exact for every source float; ints up to 2^53 exact, larger ones are
  // converted directly below).
  auto src_float = [&]() -> double {
    switch (st) {
      case Ty::kF32: return ins.ftz ? FtzF(F32(v)) : F32(v);
      case Ty::kF64: return F64(v);
      case Ty::kF16: return H2F(v);
      case Ty::kBF16: return BF2F(v);
      default: return 0;
    }
  };
  if (!TyFloat(dt)) {  // float -> int: round as asked, saturate, NaN -> 0
    double x = src_float();
    if (std::isnan(x)) return 0;
    switch (ins.rnd) {
      case Rnd::kRni:
      case Rnd::kRn: x = std::nearbyint(x); break;  // default rounding is to nearest even
      case Rnd::kRmi:
      case Rnd::kRm: x = std::floor(x); break;
      case Rnd::kRpi:
      case Rnd::kRp: x = std::ceil(x); break;
      default: x = std::trunc(x); break;
    }
    if (TySigned(dt)) {
      const double lo = -std::ldexp(1.0, 8 * dn - 1), hi = std::ldexp(1.0, 8 * dn - 1);
      if (x <= lo) return Trunc(static_cast<uint64_t>(static_cast<int64_t>(lo)), dn);
      if (x >= hi) return Trunc((uint64_t{1} << (8 * dn - 1)) - 1, dn);
      return Trunc(static_cast<uint64_t>(static_cast<int64_t>(x)), dn);
    }
    if (x <= 0) return 0;
    if (x >= std::ldexp(1.0, 8 * dn)) return dn >= 8 ? UINT64_MAX : (uint64_t{1} << (8 * dn)) - 1;
    return static_cast<uint64_t>(x);
  }
  // -> float
  RoundScope rs(ins.rnd);
  auto finish32 = [&](float f) {
    if (ins.ftz) f = FtzF(f);
    if (ins.sat) f = std::isnan(f) ? 0.0f : std::fmin(std::fmax(f, 0.0f), 1.0f);
    return f;
  };
  if (!TyFloat(st)) {  // int -> float
    const bool s = TySigned(st);
    const int64_t si = SExt(v, sn);
    const uint64_t ui = Trunc(v, sn);
    switch (dt) {
      case Ty::kF64: return B64(s ? static_cast<double>(si) : static_cast<double>(ui));
      case Ty::kF32: return B32(finish32(s ? static_cast<float>(si) : static_cast<float>(ui)));
      case Ty::kF16: return F2H(s ? static_cast<float>(si) : static_cast<float>(ui));
      case Ty::kBF16: return F2BF(s ? static_cast<float>(si) : static_cast<float>(ui));
      default: return 0;
    }
  }
  // float -> float
  const bool to_int = ins.rnd == Rnd::kRni || ins.rnd == Rnd::kRzi || ins.rnd == Rnd::kRmi || ins.rnd == Rnd::kRpi;
  double x = src_float();
  if (to_int) {
    switch (ins.rnd) {
      case Rnd::kRni: x = std::nearbyint(x); break;
      case Rnd::kRzi: x = std::trunc(x); break;
      case Rnd::kRmi: x = std::floor(x); break;
      default: x = std::ceil(x); break;
    }
  }
  switch (dt) {
    case Ty::kF64: return B64(ins.sat ? (std::isnan(x) ? 0.0 : std::fmin(std::fmax(x, 0.0), 1.0)) : x);
    case Ty::kF32: return B32(finish32(static_cast<float>(x)));
    case Ty::kF16: return F2H(finish32(static_cast<float>(x)));
    case Ty::kBF16: return F2BF(finish32(static_cast<float>(x)));
    default: return 0;
  }
}

}  // namespace orion::ptx::exec
