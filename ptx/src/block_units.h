// ptx/src/block_units.h — the block's instruction units: Exec decodes an instruction's op and
// runs it on a mask of lanes (moves, loads and stores, warp votes and shuffles, control, ...);
// ExecFloat and ExecInt are the floating-point and integer units. Part of block.h (included at its
// end, after the class); not to be included alone. The arithmetic without block state is alu.h.
#pragma once

#include "block.h"

namespace orion::ptx::exec {

inline bool Block::Exec(Warp& w, uint32_t mask, const Ins& ins) {
  const Ty t = ins.type;
  const int n = TyBytes(t);
  const bool fl = TyFloat(t);
  const bool sg = TySigned(t);
  switch (ins.op) {
    case Op::kNop:
    case Op::kMembar:
    case Op::kPrefetch:
    case Op::kNanosleep:
    case Op::kBarArrive: return true;
    case Op::kMov: {
      const Operand& d = ins.o[0];
      const Operand& a = ins.o[1];
      if (d.kind == Operand::kVec) {  // unpack: mov.b64 {lo, hi}, x
        const int e = n / d.n;
        Lanes(mask, [&](int l) {
          const uint64_t v = Val(w, a, l);
          for (int i = 0; i < d.n; ++i)
            if (d.regs[i] != kNoReg) w.regs[d.regs[i] * 32 + static_cast<uint32_t>(l)] = Trunc(v >> (8 * e * i), e);
        });
      } else if (a.kind == Operand::kVec) {  // pack: mov.b64 x, {lo, hi}
        const int e = n / a.n;
        Lanes(mask, [&](int l) {
          uint64_t v = 0;
          for (int i = 0; i < a.n; ++i)
            if (a.regs[i] != kNoReg) v |= Trunc(w.regs[a.regs[i] * 32 + static_cast<uint32_t>(l)], e) << (8 * e * i);
          Set(w, d, l, v);
        });
      } else {
        Lanes(mask, [&](int l) { Set(w, d, l, t == Ty::kPred ? (Val(w, a, l) & 1) : Trunc(Val(w, a, l), n)); });
      }
      return true;
    }
    case Op::kCvt:
      if (n == 0 || TyBytes(ins.type2) == 0) return Unsupported(w, mask, ins);  // `cvt.rzi`: no types
      if (ins.o[0].kind == Operand::kReg && (t == Ty::kF16x2 || t == Ty::kBF16x2)) {
        // cvt.rn.f16x2.f32 d, a, b: a to the upper half, b to the lower.
        Ins one = ins;
        one.type = t == Ty::kF16x2 ? Ty::kF16 : Ty::kBF16;
        Lanes(mask, [&](int l) {
          Set(w, ins.o[0], l, (Convert(one, Val(w, ins.o[1], l)) << 16) | Convert(one, Val(w, ins.o[2], l)));
        });
        return true;
      }
      Lanes(mask, [&](int l) { Set(w, ins.o[0], l, Convert(ins, Val(w, ins.o[1], l))); });
      return true;
    case Op::kCvta:
      Lanes(mask, [&](int l) {
        uint64_t v = Val(w, ins.o[1], l);
        const uint64_t base = ins.space == Space::kShared  ? kSharedWindow
                              : ins.space == Space::kLocal ? kLocalWindow
                                                           : 0;
        v = ins.to ? v - base : v + base;
        Set(w, ins.o[0], l, Trunc(v, n));
      });
      return true;
    case Op::kIsspacep:
      Lanes(mask, [&](int l) {
        const uint64_t v = Val(w, ins.o[1], l);
        const bool sh = v - kSharedWindow < kWindowBytes, lo = v - kLocalWindow < kWindowBytes;
        bool r = ins.space == Space::kShared ? sh : ins.space == Space::kLocal ? lo : (!sh && !lo);
        Set(w, ins.o[0], l, r);
      });
      return true;
    case Op::kLd: {
      const Operand& d = ins.o[0];
      const int cnt = d.kind == Operand::kVec ? d.n : 1;
      const int e = n;
      for (int l = 0; l < 32; ++l) {
        if (!((mask >> l) & 1)) continue;
        const uint64_t addr = Address(w, ins.o[1], l);
        const uint8_t* p = Mem(ins.space, addr, static_cast<uint32_t>(e * cnt), w, l, false, ins);
        if (p == nullptr) return false;
        for (int i = 0; i < cnt; ++i) {
          uint64_t v = Load(p + e * i, e);
          if (sg) v = static_cast<uint64_t>(SExt(v, e));
          if (d.kind == Operand::kVec) {
            if (d.regs[i] != kNoReg) w.regs[d.regs[i] * 32 + static_cast<uint32_t>(l)] = v;
          } else {
            Set(w, d, l, v);
          }
        }
      }
      return true;
    }
    case Op::kSt: {
      const Operand& a = ins.o[1];
      const int cnt = a.kind == Operand::kVec ? a.n : 1;
      const int e = n;
      for (int l = 0; l < 32; ++l) {
        if (!((mask >> l) & 1)) continue;
        const uint64_t addr = Address(w, ins.o[0], l);
        uint8_t* p = Mem(ins.space, addr, static_cast<uint32_t>(e * cnt), w, l, true, ins);
        if (p == nullptr) return false;
        for (int i = 0; i < cnt; ++i) {
          const uint64_t v = a.kind == Operand::kVec
                                 ? (a.regs[i] == kNoReg ? 0 : w.regs[a.regs[i] * 32 + static_cast<uint32_t>(l)])
                                 : Val(w, a, l);
          Store(p + e * i, v, e);
        }
      }
      return true;
    }
    case Op::kCpAsync: {
      // cp.async [dst], [src], cp-size {, src-size | ignore-src}: copied now (parse.cpp says why
      // that is allowed); bytes past src-size are zero-filled.
      const uint32_t cp = static_cast<uint32_t>(ins.o[2].imm);
      const int args = ins.nops - ((ins.sub & kCpAsyncCacheHint) != 0 ? 1 : 0);
      for (int l = 0; l < 32; ++l) {
        if (!((mask >> l) & 1)) continue;
        uint64_t src_size = cp;
        if (args == 4)
          src_size = (ins.sub & kCpAsyncIgnoreSrc) != 0 ? (Pred(w, ins.o[3], l) ? 0 : cp)
                                                        : static_cast<uint32_t>(Val(w, ins.o[3], l));
        if (src_size > cp) {
          SetFault(CUDA_ERROR_LAUNCH_FAILED, "cp.async src-size " + std::to_string(src_size) +
                                                 " larger than its cp-size (" + Where(w, l, ins) + ")");
          return false;
        }
        uint8_t* d = Mem(Space::kShared, Address(w, ins.o[0], l), cp, w, l, true, ins);
        if (d == nullptr) return false;
        const uint64_t src = Address(w, ins.o[1], l);
        uint8_t tmp[16] = {};
        if ((src_size & (src_size - 1)) == 0 && src_size != 0) {
          const uint8_t* s = Mem(Space::kGlobal, src, static_cast<uint32_t>(src_size), w, l, false, ins);
          if (s == nullptr) return false;
          std::memcpy(tmp, s, src_size);
        } else {
          for (uint64_t i = 0; i < src_size; ++i) {
            const uint8_t* s = Mem(Space::kGlobal, src + i, 1, w, l, false, ins);
            if (s == nullptr) return false;
            tmp[i] = *s;
          }
        }
        std::memcpy(d, tmp, cp);
      }
      return true;
    }
    case Op::kAtom:
    case Op::kRed:
      for (int l = 0; l < 32; ++l)
        if ((mask >> l) & 1 && !Atomic(w, l, ins, ins.op == Op::kAtom)) return false;
      return true;
    case Op::kActivemask: Lanes(mask, [&](int l) { Set(w, ins.o[0], l, mask); }); return true;
    case Op::kSelp:
      Lanes(mask,
            [&](int l) { Set(w, ins.o[0], l, Pred(w, ins.o[3], l) ? Val(w, ins.o[1], l) : Val(w, ins.o[2], l)); });
      return true;
    case Op::kSlct:
      Lanes(mask, [&](int l) {
        const uint64_t c = Val(w, ins.o[3], l);
        const bool ge = ins.type2 == Ty::kF32 ? !(F32(c) < 0.0f) && !std::isnan(F32(c)) : static_cast<int32_t>(c) >= 0;
        Set(w, ins.o[0], l, ge ? Val(w, ins.o[1], l) : Val(w, ins.o[2], l));
      });
      return true;
    case Op::kSetp: {
      const bool dual = ins.o[0].n == 1;
      const int a = dual ? 2 : 1;
      Lanes(mask, [&](int l) {
        bool r = Compare(ins.cmp, ins.type2, Val(w, ins.o[a], l), Val(w, ins.o[a + 1], l));
        bool q = !r;
        if (ins.boolop != BoolOp::kNone) {
          const bool c = Pred(w, ins.o[a + 2], l);
          auto comb = [&](bool x) {
            return ins.boolop == BoolOp::kAnd ? (x && c) : ins.boolop == BoolOp::kOr ? (x || c) : (x != c);
          };
          r = comb(r);
          q = comb(q);
        }
        Set(w, ins.o[0], l, r);
        if (dual) Set(w, ins.o[1], l, q);
      });
      return true;
    }
    case Op::kSet:
      Lanes(mask, [&](int l) {
        bool r = Compare(ins.cmp, ins.type2, Val(w, ins.o[1], l), Val(w, ins.o[2], l));
        if (ins.boolop != BoolOp::kNone) {
          const bool c = Pred(w, ins.o[3], l);
          r = ins.boolop == BoolOp::kAnd ? (r && c) : ins.boolop == BoolOp::kOr ? (r || c) : (r != c);
        }
        Set(w, ins.o[0], l, t == Ty::kF32 ? (r ? B32(1.0f) : 0) : (r ? Trunc(UINT64_MAX, n) : 0));
      });
      return true;
    case Op::kTestp:
      Lanes(mask, [&](int l) {
        const double x = t == Ty::kF64 ? F64(Val(w, ins.o[1], l)) : F32(Val(w, ins.o[1], l));
        bool r = false;
        switch (ins.sub) {
          case 0: r = std::isfinite(x); break;
          case 1: r = std::isinf(x); break;
          case 2: r = !std::isnan(x); break;
          case 3: r = std::isnan(x); break;
          case 4: r = t == Ty::kF64 ? std::isnormal(x) : std::isnormal(static_cast<float>(x)); break;
          case 5:
            r = t == Ty::kF64 ? std::fpclassify(x) == FP_SUBNORMAL
                              : std::fpclassify(static_cast<float>(x)) == FP_SUBNORMAL;
            break;
        }
        Set(w, ins.o[0], l, r);
      });
      return true;
    case Op::kTex:
    case Op::kSuld:
    case Op::kSust:
    case Op::kTxq:
    case Op::kSuq:
      for (int l = 0; l < 32; ++l)
        if ((mask >> l) & 1 && !ImageLane(w, l, ins)) return false;
      return true;
    default: break;
  }
  if (fl) return ExecFloat(w, mask, ins);
  if (t == Ty::kPred) {
    if (ins.op != Op::kAnd && ins.op != Op::kOr && ins.op != Op::kXor && ins.op != Op::kNot)
      return Unsupported(w, mask, ins);
    Lanes(mask, [&](int l) {
      const bool a = Pred(w, ins.o[1], l);
      const bool b = ins.nops > 2 ? Pred(w, ins.o[2], l) : false;
      const bool r = ins.op == Op::kAnd ? (a && b) : ins.op == Op::kOr ? (a || b) : ins.op == Op::kXor ? (a != b) : !a;
      Set(w, ins.o[0], l, r);
    });
    return true;
  }
  if (n == 0) return Unsupported(w, mask, ins);  // integer arithmetic without a type (`abs;`)
  return ExecInt(w, mask, ins, n, sg);
}

inline uint64_t Block::VecReg(const Warp& w, const Operand& o, int i, int lane) const {
  return o.regs[i] == kNoReg ? 0 : w.regs[o.regs[i] * 32 + static_cast<uint32_t>(lane)];
}

inline bool Block::Unsupported(Warp& w, uint32_t mask, const Ins& ins) {
  SetFault(CUDA_ERROR_NOT_SUPPORTED, std::string("instruction ") + OpName(ins.op) + "." + TyName(ins.type) +
                                         " is not supported by the sim executor (" +
                                         Where(w, std::countr_zero(mask | 1u), ins) + ")");
  return false;
}

inline bool Block::ExecFloat(Warp& w, uint32_t mask, const Ins& ins) {
  const int arity = FloatArity(ins.op);  // alu.h: the float unit's table, one lane at a time
  if (arity == 0) return Unsupported(w, mask, ins);
  FloatLanes(ins, [&](const Ins& unit) {
    Lanes(mask, [&](int l) {
      const uint64_t a = Val(w, ins.o[1], l), b = arity > 1 ? Val(w, ins.o[2], l) : 0;
      const uint64_t c = arity > 2 ? Val(w, ins.o[3], l) : 0;
      Set(w, ins.o[0], l, FloatLane(unit, a, b, c));
    });
  });
  return true;
}

inline bool Block::ExecInt(Warp& w, uint32_t mask, const Ins& ins, int n, bool sg) {
  const uint32_t bits = static_cast<uint32_t>(8 * n);
  auto A = [&](int l) { return Val(w, ins.o[1], l); };
  auto B = [&](int l) { return Val(w, ins.o[2], l); };
  auto C = [&](int l) { return Val(w, ins.o[3], l); };
  auto put = [&](int l, uint64_t v) { Set(w, ins.o[0], l, Trunc(v, n)); };
  auto clamp_s = [&](__int128 v) -> uint64_t {
    const __int128 lo = -(static_cast<__int128>(1) << (bits - 1)), hi = (static_cast<__int128>(1) << (bits - 1)) - 1;
    return static_cast<uint64_t>(static_cast<int64_t>(v < lo ? lo : v > hi ? hi : v));
  };
  // Fast paths for the most common forms: no carry, no saturation, low half.
  if (!ins.cc && !ins.sat) {
    switch (ins.op) {
      case Op::kAdd: Lanes(mask, [&](int l) { put(l, A(l) + B(l)); }); return true;
      case Op::kSub: Lanes(mask, [&](int l) { put(l, A(l) - B(l)); }); return true;
      case Op::kMul:
        if (ins.mul == MulMode::kLo || ins.mul == MulMode::kNone) {
          Lanes(mask, [&](int l) { put(l, A(l) * B(l)); });
          return true;
        }
        if (ins.mul == MulMode::kWide && n == 4) {
          Lanes(mask, [&](int l) {
            Set(w, ins.o[0], l,
                sg ? static_cast<uint64_t>(SExt(A(l), 4) * SExt(B(l), 4)) : Trunc(A(l), 4) * Trunc(B(l), 4));
          });
          return true;
        }
        break;
      case Op::kMad:
        if (ins.mul == MulMode::kLo) {
          Lanes(mask, [&](int l) { put(l, A(l) * B(l) + C(l)); });
          return true;
        }
        if (ins.mul == MulMode::kWide && n == 4) {
          Lanes(mask, [&](int l) {
            Set(w, ins.o[0], l,
                (sg ? static_cast<uint64_t>(SExt(A(l), 4) * SExt(B(l), 4)) : Trunc(A(l), 4) * Trunc(B(l), 4)) + C(l));
          });
          return true;
        }
        break;
      default: break;
    }
  }
  switch (ins.op) {
    case Op::kAdd:
    case Op::kSub:
    case Op::kAddc:
    case Op::kSubc: {
      const bool sub = ins.op == Op::kSub || ins.op == Op::kSubc;
      const bool use_cf = ins.op == Op::kAddc || ins.op == Op::kSubc;
      uint32_t carry_out = w.carry;
      Lanes(mask, [&](int l) {
        const uint64_t cf = use_cf ? (w.carry >> l) & 1 : 0;
        if (ins.sat && sg) {
          const __int128 r = sub ? static_cast<__int128>(SExt(A(l), n)) - SExt(B(l), n)
                                 : static_cast<__int128>(SExt(A(l), n)) + SExt(B(l), n);
          put(l, clamp_s(r));
          return;
        }
        const unsigned __int128 a = Trunc(A(l), n), b = Trunc(B(l), n);
        unsigned __int128 r = sub ? a - b - cf : a + b + cf;
        if (ins.cc) {
          const bool c = sub ? (a < b + cf) : ((r >> bits) & 1) != 0;
          carry_out = (carry_out & ~(1u << l)) | (static_cast<uint32_t>(c) << l);
        }
        put(l, static_cast<uint64_t>(r));
      });
      if (ins.cc) w.carry = carry_out;
      return true;
    }
    case Op::kMul:
    case Op::kMad:
    case Op::kMadc: {
      const bool mad = ins.op != Op::kMul;
      uint32_t carry_out = w.carry;
      Lanes(mask, [&](int l) {
        const __int128 a = sg ? static_cast<__int128>(SExt(A(l), n)) : static_cast<__int128>(Trunc(A(l), n));
        const __int128 b = sg ? static_cast<__int128>(SExt(B(l), n)) : static_cast<__int128>(Trunc(B(l), n));
        const __int128 p = a * b;
        uint64_t r;
        int rn = n;
        switch (ins.mul) {
          case MulMode::kHi: r = static_cast<uint64_t>(p >> bits); break;
          case MulMode::kWide:
            r = static_cast<uint64_t>(p);
            rn = 2 * n;
            break;
          default: r = static_cast<uint64_t>(p); break;
        }
        if (mad) {
          const uint64_t c = C(l);
          const uint64_t cf = ins.op == Op::kMadc ? (w.carry >> l) & 1 : 0;
          if (ins.sat && sg && rn == 4) {
            put(l, clamp_s(static_cast<__int128>(static_cast<int32_t>(r)) + static_cast<int32_t>(c)));
            return;
          }
          const unsigned __int128 s = static_cast<unsigned __int128>(Trunc(r, rn)) + Trunc(c, rn) + cf;
          if (ins.cc) carry_out = (carry_out & ~(1u << l)) | (static_cast<uint32_t>((s >> (8 * rn)) & 1) << l);
          r = static_cast<uint64_t>(s);
        }
        Set(w, ins.o[0], l, Trunc(r, rn));
      });
      if (ins.cc) w.carry = carry_out;
      return true;
    }
    case Op::kMul24:
    case Op::kMad24:
      Lanes(mask, [&](int l) {
        const int64_t a = sg ? SExt(A(l) & 0xffffff, 3) : static_cast<int64_t>(A(l) & 0xffffff);
        const int64_t b = sg ? SExt(B(l) & 0xffffff, 3) : static_cast<int64_t>(B(l) & 0xffffff);
        const int64_t p = a * b;
        uint64_t r = ins.mul == MulMode::kHi ? static_cast<uint64_t>(p >> 16) : static_cast<uint64_t>(p);
        if (ins.op == Op::kMad24) r += C(l);
        put(l, r);
      });
      return true;
    case Op::kSad:
      Lanes(mask, [&](int l) {
        const int64_t a = sg ? SExt(A(l), n) : static_cast<int64_t>(Trunc(A(l), n));
        const int64_t b = sg ? SExt(B(l), n) : static_cast<int64_t>(Trunc(B(l), n));
        put(l, static_cast<uint64_t>(a > b ? a - b : b - a) + C(l));
      });
      return true;
    case Op::kDiv:
    case Op::kRem:
      Lanes(mask, [&](int l) {
        const bool div = ins.op == Op::kDiv;
        if (sg) {
          const int64_t a = SExt(A(l), n), b = SExt(B(l), n);
          if (b == 0) return put(l, div ? UINT64_MAX : static_cast<uint64_t>(a));
          if (b == -1) return put(l, div ? static_cast<uint64_t>(-static_cast<__int128>(a)) : 0);
          put(l, static_cast<uint64_t>(div ? a / b : a % b));
        } else {
          const uint64_t a = Trunc(A(l), n), b = Trunc(B(l), n);
          if (b == 0) return put(l, div ? UINT64_MAX : a);
          put(l, div ? a / b : a % b);
        }
      });
      return true;
    case Op::kAbs:
      Lanes(mask, [&](int l) {
        const int64_t a = SExt(A(l), n);
        put(l, static_cast<uint64_t>(a < 0 ? -static_cast<__int128>(a) : a));
      });
      return true;
    case Op::kNeg: Lanes(mask, [&](int l) { put(l, ~A(l) + 1); }); return true;
    case Op::kMin:
    case Op::kMax:
      Lanes(mask, [&](int l) {
        const bool mn = ins.op == Op::kMin;
        bool less;
        if (sg)
          less = SExt(A(l), n) < SExt(B(l), n);
        else
          less = Trunc(A(l), n) < Trunc(B(l), n);
        uint64_t r = (mn == less) ? A(l) : B(l);
        if (ins.relu && sg && SExt(r, n) < 0) r = 0;
        put(l, r);
      });
      return true;
    case Op::kPopc:
      Lanes(mask, [&](int l) { Set(w, ins.o[0], l, static_cast<uint64_t>(std::popcount(Trunc(A(l), n)))); });
      return true;
    case Op::kClz:
      Lanes(mask, [&](int l) {
        const uint64_t a = Trunc(A(l), n);
        Set(w, ins.o[0], l, a == 0 ? bits : static_cast<uint64_t>(std::countl_zero(a) - (64 - static_cast<int>(bits))));
      });
      return true;
    case Op::kBfind:
      Lanes(mask, [&](int l) {
        uint64_t a = Trunc(A(l), n);
        if (sg && SExt(a, n) < 0) a = Trunc(~a, n);
        uint64_t r = a == 0 ? 0xffffffffu : static_cast<uint64_t>(63 - std::countl_zero(a));
        if (a != 0 && ins.sub == 1) r = bits - 1 - r;  // .shiftamt: a left-shift amount
        Set(w, ins.o[0], l, r);
      });
      return true;
    case Op::kBrev:
      Lanes(mask, [&](int l) {
        uint64_t a = Trunc(A(l), n), r = 0;
        for (uint32_t i = 0; i < bits; ++i) r |= ((a >> i) & 1) << (bits - 1 - i);
        put(l, r);
      });
      return true;
    case Op::kBfe:
      Lanes(mask, [&](int l) {
        const uint64_t a = Trunc(A(l), n);
        const uint32_t pos = static_cast<uint32_t>(B(l)) & 0xff, len = static_cast<uint32_t>(C(l)) & 0xff;
        uint64_t r = 0;
        bool sbit = false;
        if (sg) {
          const uint32_t msb = pos + len - 1 >= bits ? bits - 1 : pos + len - 1;
          sbit = len == 0 ? false : ((a >> msb) & 1) != 0;
        }
        for (uint32_t i = 0; i < bits; ++i) {
          const bool bit = i < len && pos + i < bits ? ((a >> (pos + i)) & 1) != 0 : sbit;
          r |= static_cast<uint64_t>(bit) << i;
        }
        put(l, r);
      });
      return true;
    case Op::kBfi:
      Lanes(mask, [&](int l) {
        // bfi.b32 f, a, b, c, d: insert a's low d bits into b at c.
        const uint64_t a = A(l), b = Trunc(B(l), n);
        const uint32_t pos = static_cast<uint32_t>(C(l)) & 0xff,
                       len = static_cast<uint32_t>(Val(w, ins.o[4], l)) & 0xff;
        uint64_t r = b;
        for (uint32_t i = 0; i < len && pos + i < bits; ++i) {
          r = (r & ~(uint64_t{1} << (pos + i))) | (((a >> i) & 1) << (pos + i));
        }
        put(l, r);
      });
      return true;
    case Op::kPrmt:
      Lanes(mask, [&](int l) {
        const uint64_t src = (Trunc(B(l), 4) << 32) | Trunc(A(l), 4);
        const uint32_t c = static_cast<uint32_t>(C(l));
        auto byte = [&](uint32_t i) { return static_cast<uint32_t>((src >> (8 * (i & 7))) & 0xff); };
        uint32_t r = 0;
        for (uint32_t i = 0; i < 4; ++i) {
          uint32_t v = 0;
          const uint32_t c2 = c & 3;
          switch (ins.sub) {
            case 0: {
              const uint32_t sel = (c >> (4 * i)) & 0xf;
              v = byte(sel & 7);
              if (sel & 8) v = (v & 0x80) ? 0xff : 0;
              break;
            }
            case 1: v = byte(c2 + i); break;                 // f4e
            case 2: v = byte((c2 - i) & 7); break;           // b4e
            case 3: v = byte(c2); break;                     // rc8
            case 4: v = byte(std::max(i, c2)); break;        // ecl
            case 5: v = byte(std::min(i, c2)); break;        // ecr
            case 6: v = byte((c & 1) * 2 + (i & 1)); break;  // rc16
          }
          r |= v << (8 * i);
        }
        put(l, r);
      });
      return true;
    case Op::kAnd: Lanes(mask, [&](int l) { put(l, A(l) & B(l)); }); return true;
    case Op::kOr: Lanes(mask, [&](int l) { put(l, A(l) | B(l)); }); return true;
    case Op::kXor: Lanes(mask, [&](int l) { put(l, A(l) ^ B(l)); }); return true;
    case Op::kNot: Lanes(mask, [&](int l) { put(l, ~A(l)); }); return true;
    case Op::kCnot: Lanes(mask, [&](int l) { put(l, Trunc(A(l), n) == 0 ? 1 : 0); }); return true;
    case Op::kShl:
      Lanes(mask, [&](int l) {
        const uint64_t s = Trunc(B(l), 4);
        put(l, s >= bits ? 0 : A(l) << s);
      });
      return true;
    case Op::kShr:
      Lanes(mask, [&](int l) {
        const uint64_t s = Trunc(B(l), 4);
        if (sg) {
          const int64_t a = SExt(A(l), n);
          put(l, static_cast<uint64_t>(a >> std::min<uint64_t>(s, 63)));
        } else {
          put(l, s >= bits ? 0 : Trunc(A(l), n) >> s);
        }
      });
      return true;
    case Op::kShf:
      Lanes(mask, [&](int l) {
        const uint64_t v = (Trunc(B(l), 4) << 32) | Trunc(A(l), 4);
        uint32_t s = static_cast<uint32_t>(C(l));
        s = ins.wrap ? (s & 31) : std::min<uint32_t>(s, 32);
        Set(w, ins.o[0], l, ins.sub == 0 ? Trunc((v << s) >> 32, 4) : Trunc(v >> s, 4));
      });
      return true;
    case Op::kLop3:
      Lanes(mask, [&](int l) {
        const uint64_t a = A(l), b = B(l), c = C(l);
        const uint32_t lut = static_cast<uint32_t>(Val(w, ins.o[4], l));
        uint64_t r = 0;
        for (uint32_t i = 0; i < 8; ++i)
          if ((lut >> i) & 1) r |= ((i & 4) ? a : ~a) & ((i & 2) ? b : ~b) & ((i & 1) ? c : ~c);
        put(l, r);
      });
      return true;
    case Op::kDp4a:
    case Op::kDp2a:
      Lanes(mask, [&](int l) {
        const uint32_t a = static_cast<uint32_t>(A(l)), b = static_cast<uint32_t>(B(l));
        const bool as = TySigned(ins.type), bs = TySigned(ins.type2);
        int64_t acc = static_cast<int64_t>(as || bs ? SExt(C(l), 4) : static_cast<int64_t>(Trunc(C(l), 4)));
        if (ins.op == Op::kDp4a) {
          for (int i = 0; i < 4; ++i) {
            const int64_t x = as ? static_cast<int8_t>(a >> (8 * i)) : static_cast<int64_t>((a >> (8 * i)) & 0xff);
            const int64_t y = bs ? static_cast<int8_t>(b >> (8 * i)) : static_cast<int64_t>((b >> (8 * i)) & 0xff);
            acc += x * y;
          }
        } else {
          const int hi = ins.mul == MulMode::kHi ? 2 : 0;
          for (int i = 0; i < 2; ++i) {
            const int64_t x = as ? static_cast<int16_t>(a >> (16 * i)) : static_cast<int64_t>((a >> (16 * i)) & 0xffff);
            const int64_t y =
                bs ? static_cast<int8_t>(b >> (8 * (i + hi))) : static_cast<int64_t>((b >> (8 * (i + hi))) & 0xff);
            acc += x * y;
          }
        }
        Set(w, ins.o[0], l, Trunc(static_cast<uint64_t>(acc), 4));
      });
      return true;
    default: return Unsupported(w, mask, ins);
  }
}

}  // namespace orion::ptx::exec
