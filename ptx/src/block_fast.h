// ptx/src/block_fast.h — the fast paths of the block's units (fast.h says which forms): each runs
// one instruction on a mask of lanes over whole register rows, without the per-lane operand
// decoding of the general units, and means exactly what they mean (block_units.h is the
// reference; the unit tests run both). Part of block.h (included at its end); not to be included
// alone.
#pragma once

#include "block.h"
#include "fast.h"

namespace orion::ptx::exec {

// The 32 lanes' values of source operand `o`: a register's row, or `tmp` filled (an immediate, a
// special register, a symbol's address) for the lanes in `mask`.
inline const uint64_t* Block::Row(const Warp& w, const Operand& o, uint32_t mask, uint64_t* tmp) const {
  if (o.kind == Operand::kReg) return &w.regs[o.reg * 32];
  if (o.kind == Operand::kImm) {
    for (int l = 0; l < 32; ++l) tmp[l] = o.imm;
    return tmp;
  }
  if (o.kind == Operand::kSpecial && o.reg == kTidX && cfg_.block[1] == 1 && cfg_.block[2] == 1) {
    // A one-dimensional block: %tid.x is the thread's index (Special's t % ntid.x, no division).
    const uint64_t first = uint64_t{w.index} * 32;
    for (int l = 0; l < 32; ++l) tmp[l] = first + static_cast<uint64_t>(l);
    return tmp;
  }
  if (o.kind == Operand::kSpecial && ((o.reg >= kNtidX && o.reg <= kNctaidZ) || o.reg == kWarpid)) {
    // The same for every lane of the warp (%ntid, %ctaid, %nctaid, %warpid): read once.
    const uint64_t v = Special(w, o.reg, 0);
    for (int l = 0; l < 32; ++l) tmp[l] = v;
    return tmp;
  }
  for (uint32_t m = mask; m != 0; m &= m - 1) {
    const int l = std::countr_zero(m);
    tmp[l] = Val(w, o, l);
  }
  return tmp;
}

// `f(l)` for each lane of `mask`: a plain loop over all 32 when every lane is in it (the compiler
// vectorizes it), else over the mask's bits.
template <class F>
inline void ForLanes(uint32_t mask, F f) {
  if (mask == kFull) {
    for (int l = 0; l < 32; ++l) f(l);
  } else {
    for (; mask != 0; mask &= mask - 1) f(std::countr_zero(mask));
  }
}

// True when it ran `ins` (Ins::fast) on `mask`; false when it did not touch anything and the
// general units must run it (a load or store some lane of which is not inside the allocation the
// last access hit, or not aligned).
inline bool Block::ExecFast(Warp& w, uint32_t mask, const Ins& ins) {
  uint64_t ta[32], tb[32], tc[32];
  uint64_t* d = ins.o[0].kind == Operand::kReg ? &w.regs[ins.o[0].reg * 32] : nullptr;
  const int n = ins.fast_bytes;
  const uint64_t keep = n >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * n)) - 1;
  switch (static_cast<FastForm>(ins.fast)) {
    case kFastMov: {
      const uint64_t* a = Row(w, ins.o[1], mask, ta);
      ForLanes(mask, [&](int l) { d[l] = a[l] & keep; });
      return true;
    }
    case kFastAdd:
    case kFastSub:
    case kFastMulLo:
    case kFastAnd:
    case kFastOr:
    case kFastXor: {
      const uint64_t* a = Row(w, ins.o[1], mask, ta);
      const uint64_t* b = Row(w, ins.o[2], mask, tb);
      switch (static_cast<FastForm>(ins.fast)) {
        case kFastAdd: ForLanes(mask, [&](int l) { d[l] = (a[l] + b[l]) & keep; }); break;
        case kFastSub: ForLanes(mask, [&](int l) { d[l] = (a[l] - b[l]) & keep; }); break;
        case kFastMulLo: ForLanes(mask, [&](int l) { d[l] = (a[l] * b[l]) & keep; }); break;
        case kFastAnd: ForLanes(mask, [&](int l) { d[l] = (a[l] & b[l]) & keep; }); break;
        case kFastOr: ForLanes(mask, [&](int l) { d[l] = (a[l] | b[l]) & keep; }); break;
        default: ForLanes(mask, [&](int l) { d[l] = (a[l] ^ b[l]) & keep; }); break;
      }
      return true;
    }
    case kFastShl:
    case kFastShr:
    case kFastSar: {
      const uint64_t* a = Row(w, ins.o[1], mask, ta);
      const uint64_t* b = Row(w, ins.o[2], mask, tb);
      const uint64_t bits = 8 * static_cast<uint64_t>(n);
      if (ins.fast == kFastShl) {
        ForLanes(mask, [&](int l) {
          const uint64_t sh = b[l] & 0xffffffffu;
          d[l] = sh >= bits ? 0 : (a[l] << sh) & keep;
        });
      } else if (ins.fast == kFastShr) {
        ForLanes(mask, [&](int l) {
          const uint64_t sh = b[l] & 0xffffffffu;
          d[l] = sh >= bits ? 0 : (a[l] & keep) >> sh;
        });
      } else {
        ForLanes(mask, [&](int l) {
          const uint64_t sh = std::min<uint64_t>(b[l] & 0xffffffffu, 63);
          d[l] = static_cast<uint64_t>(SExt(a[l], n) >> sh) & keep;
        });
      }
      return true;
    }
    case kFastPredAnd:
    case kFastPredOr:
    case kFastPredXor: {
      const uint64_t* a = Row(w, ins.o[1], mask, ta);
      const uint64_t* b = Row(w, ins.o[2], mask, tb);
      const uint64_t na = ins.o[1].neg ? 1 : 0, nb = ins.o[2].neg ? 1 : 0;
      if (ins.fast == kFastPredAnd) {
        ForLanes(mask, [&](int l) { d[l] = ((a[l] & 1) ^ na) & ((b[l] & 1) ^ nb); });
      } else if (ins.fast == kFastPredOr) {
        ForLanes(mask, [&](int l) { d[l] = ((a[l] & 1) ^ na) | ((b[l] & 1) ^ nb); });
      } else {
        ForLanes(mask, [&](int l) { d[l] = ((a[l] & 1) ^ na) ^ ((b[l] & 1) ^ nb); });
      }
      return true;
    }
    case kFastMadLo: {
      const uint64_t* a = Row(w, ins.o[1], mask, ta);
      const uint64_t* b = Row(w, ins.o[2], mask, tb);
      const uint64_t* c = Row(w, ins.o[3], mask, tc);
      ForLanes(mask, [&](int l) { d[l] = (a[l] * b[l] + c[l]) & keep; });
      return true;
    }
    case kFastMulWide: {
      const uint64_t* a = Row(w, ins.o[1], mask, ta);
      const uint64_t* b = Row(w, ins.o[2], mask, tb);
      if (TySigned(ins.type)) {
        ForLanes(mask, [&](int l) {
          d[l] = static_cast<uint64_t>(int64_t{static_cast<int32_t>(a[l])} * int64_t{static_cast<int32_t>(b[l])});
        });
      } else {
        ForLanes(mask, [&](int l) { d[l] = (a[l] & 0xffffffffu) * (b[l] & 0xffffffffu); });
      }
      return true;
    }
    case kFastAddF32:
    case kFastSubF32:
    case kFastMulF32: {
      const uint64_t* a = Row(w, ins.o[1], mask, ta);
      const uint64_t* b = Row(w, ins.o[2], mask, tb);
      switch (static_cast<FastForm>(ins.fast)) {
        case kFastAddF32: ForLanes(mask, [&](int l) { d[l] = B32(F32(a[l]) + F32(b[l])); }); break;
        case kFastSubF32: ForLanes(mask, [&](int l) { d[l] = B32(F32(a[l]) - F32(b[l])); }); break;
        default: ForLanes(mask, [&](int l) { d[l] = B32(F32(a[l]) * F32(b[l])); }); break;
      }
      return true;
    }
    case kFastFmaF32: {
      const uint64_t* a = Row(w, ins.o[1], mask, ta);
      const uint64_t* b = Row(w, ins.o[2], mask, tb);
      const uint64_t* c = Row(w, ins.o[3], mask, tc);
      ForLanes(mask, [&](int l) { d[l] = B32(std::fma(F32(a[l]), F32(b[l]), F32(c[l]))); });
      return true;
    }
    case kFastSetp: {
      const uint64_t* a = Row(w, ins.o[1], mask, ta);
      const uint64_t* b = Row(w, ins.o[2], mask, tb);
      const Cmp cmp = ins.cmp;
      const Ty t = ins.type2;
      // 4-byte integers (the commonest, loop bounds and indices): the comparison chosen once.
      if (t == Ty::kS32 || t == Ty::kU32 || t == Ty::kB32) {
        auto run = [&](auto op) {
          if (t == Ty::kS32) {
            ForLanes(mask, [&](int l) { d[l] = op(static_cast<int32_t>(a[l]), static_cast<int32_t>(b[l])) ? 1 : 0; });
          } else {
            ForLanes(mask, [&](int l) { d[l] = op(static_cast<uint32_t>(a[l]), static_cast<uint32_t>(b[l])) ? 1 : 0; });
          }
        };
        switch (cmp) {
          case Cmp::kEq: run([](auto x, auto y) { return x == y; }); return true;
          case Cmp::kNe: run([](auto x, auto y) { return x != y; }); return true;
          case Cmp::kLt: run([](auto x, auto y) { return x < y; }); return true;
          case Cmp::kLe: run([](auto x, auto y) { return x <= y; }); return true;
          case Cmp::kGt: run([](auto x, auto y) { return x > y; }); return true;
          case Cmp::kGe: run([](auto x, auto y) { return x >= y; }); return true;
          default: break;  // lo, ls, hi, hs and the rest: Compare itself
        }
      }
      ForLanes(mask, [&](int l) { d[l] = Compare(cmp, t, a[l], b[l]) ? 1 : 0; });
      return true;
    }
    case kFastLd:
    case kFastSt: {
      // Every lane's address first: inside the allocation the last access hit, and aligned;
      // otherwise nothing is done here and the general unit runs it (and finds the allocation,
      // or faults naming the lane).
      const bool load = ins.fast == kFastLd;
      const Operand& at = ins.o[load ? 1 : 0];
      const auto bytes = static_cast<uint64_t>(n);
      // The range the addresses must fall in (Mem's rules): the allocation the last global access
      // hit; the block's shared memory; the kernel's parameter buffer, where alignment is not
      // required (a constant bank on a GPU), and not a .func's parameters.
      uint64_t base = span_.base, size = span_.bytes;
      uint8_t* host0 = span_.host;
      uint64_t align = bytes - 1;
      if (ins.space == Space::kShared) {
        base = 0, size = shared_.size(), host0 = shared_.data();
      } else if (ins.space == Space::kParam) {
        base = 0, size = cfg_.param_bytes, host0 = const_cast<uint8_t*>(cfg_.params), align = 0;
      }
      const bool global = ins.space == Space::kGlobal || ins.space == Space::kGeneric;
      // Commonly every lane falls in that one range: offsets from it, checked all at once, then
      // moves of the access's fixed size.
      const uint64_t* reg = at.reg != kNoReg ? &w.regs[at.reg * 32] : nullptr;
      const uint64_t disp = at.imm + (at.sym != kNoSym ? cfg_.var_addrs[at.sym] : 0);
      uint64_t off[32];
      uint64_t bad = 0;
      ForLanes(mask, [&](int l) {
        const uint64_t addr = (reg != nullptr ? reg[l] : 0) + disp;
        const uint64_t o = addr - base;
        bad |= (addr & align) | static_cast<uint64_t>(o >= size) | static_cast<uint64_t>(bytes > size - o);
        off[l] = o;
      });
      if (bad == 0) {
        if (load) {
          if (n == 4 && TySigned(ins.type)) {
            ForLanes(mask, [&](int l) {
              int32_t v;
              std::memcpy(&v, host0 + off[l], 4);
              d[l] = static_cast<uint64_t>(int64_t{v});
            });
          } else if (n == 4) {
            ForLanes(mask, [&](int l) {
              uint32_t v;
              std::memcpy(&v, host0 + off[l], 4);
              d[l] = v;
            });
          } else {
            ForLanes(mask, [&](int l) { std::memcpy(&d[l], host0 + off[l], 8); });
          }
        } else {
          const uint64_t* a = Row(w, ins.o[1], mask, ta);
          if (n == 4) {
            ForLanes(mask, [&](int l) {
              const auto v = static_cast<uint32_t>(a[l]);
              std::memcpy(host0 + off[l], &v, 4);
            });
          } else {
            ForLanes(mask, [&](int l) { std::memcpy(host0 + off[l], &a[l], 8); });
          }
        }
        return true;
      }
      // Some lane elsewhere: lane by lane, each global one perhaps in another allocation.
      uint8_t* host[32];
      for (uint32_t m = mask; m != 0; m &= m - 1) {
        const int l = std::countr_zero(m);
        const uint64_t addr = Address(w, at, l);
        uint64_t at_off = addr - base;
        if ((addr & align) != 0) return false;
        if (at_off >= size || bytes > size - at_off) {
          // Global: perhaps another allocation of the session (a kernel reading two arrays).
          if (!global || !NearSpan(addr)) return false;
          base = span_.base, size = span_.bytes, host0 = span_.host;
          at_off = addr - base;
          if (bytes > size - at_off) return false;
        }
        host[l] = host0 + at_off;
      }
      if (load) {
        const bool sg = TySigned(ins.type);
        for (uint32_t m = mask; m != 0; m &= m - 1) {
          const int l = std::countr_zero(m);
          uint64_t v = Load(host[l], n);
          if (sg) v = static_cast<uint64_t>(SExt(v, n));
          d[l] = v;
        }
      } else {
        const uint64_t* a = Row(w, ins.o[1], mask, ta);
        for (uint32_t m = mask; m != 0; m &= m - 1) {
          const int l = std::countr_zero(m);
          Store(host[l], a[l], n);
        }
      }
      return true;
    }
    default: return false;
  }
}

}  // namespace orion::ptx::exec
