// ptx/src/block_memory.h — the block's memory: where an address of a state space lives on the
// host (global through GlobalMemory, shared, local, param), fixed-size loads and stores, and the
// atomics. Part of block.h (included at its end, after the class); not to be included alone.
// Sources: PTX ISA 9.0, "State Spaces"; "Parallel Synchronization and Communication Instructions"
// (atom, red).
#pragma once

#include "block.h"

namespace orion::ptx::exec {

// Makes the allocation containing `addr` the last one hit (span_): one of the few recently hit, or
// the session's table's. False when no allocation contains it (the general unit then faults).
inline bool Block::NearSpan(uint64_t addr) {
  for (const GlobalMemory::Span& s : recent_) {
    if (addr - s.base < s.bytes) {
      span_ = s;
      return true;
    }
  }
  GlobalMemory::Span s;
  if (!mem_.Find(addr, &s) || addr - s.base >= s.bytes) return false;
  recent_[recent_next_++ % std::size(recent_)] = s;
  span_ = s;
  return true;
}

// Host address of [addr, addr+bytes) in `sp`, or nullptr with the fault set.
inline uint8_t* Block::Mem(Space sp, uint64_t addr, uint32_t bytes, const Warp& w, int lane, bool write,
                           const Ins& ins) {
  // Fast path: an aligned access inside the allocation the last global access hit.
  if ((sp == Space::kGlobal || sp == Space::kGeneric) && (addr & (bytes - 1)) == 0 && addr - span_.base < span_.bytes &&
      bytes <= span_.bytes - (addr - span_.base))
    return span_.host + (addr - span_.base);
  // Parameters live in a constant bank on the GPU: NVVM loads 8-byte fields of `.align 4` byte
  // arrays at 4-aligned offsets there, so only memory-backed spaces require natural alignment.
  if (bytes > 1 && (addr & (bytes - 1)) != 0 && sp != Space::kParam) {
    SetFault(CUDA_ERROR_MISALIGNED_ADDRESS,
             "misaligned " + std::to_string(bytes) + "-byte access to 0x" + Hex(addr) + " by " + Where(w, lane, ins));
    return nullptr;
  }
  const uint32_t t = w.index * 32 + static_cast<uint32_t>(lane);
  if (sp == Space::kGeneric) {
    if (addr - kSharedWindow < kWindowBytes) {
      sp = Space::kShared;
      addr -= kSharedWindow;
    } else if (addr - kLocalWindow < kWindowBytes) {
      sp = Space::kLocal;
      addr -= kLocalWindow;
    } else {
      sp = Space::kGlobal;
    }
  }
  switch (sp) {
    case Space::kShared:
      if (addr <= shared_.size() && bytes <= shared_.size() - addr) return shared_.data() + addr;
      break;
    case Space::kLocal:
      if (addr <= k_.local_bytes && bytes <= k_.local_bytes - addr) return local_.data() + t * k_.local_bytes + addr;
      break;
    case Space::kParam:
      if (addr >= kFuncParamBase) {
        const uint64_t off = addr - kFuncParamBase;
        if (off <= k_.fparam_bytes && bytes <= k_.fparam_bytes - off) return fparam_.data() + t * k_.fparam_bytes + off;
      } else if (!write && addr <= cfg_.param_bytes && bytes <= cfg_.param_bytes - addr) {
        return const_cast<uint8_t*>(cfg_.params) + addr;
      }
      break;
    case Space::kGlobal:
    case Space::kConst:
    case Space::kGeneric: {
      if ((addr - span_.base < span_.bytes || NearSpan(addr)) && bytes <= span_.bytes - (addr - span_.base))
        return span_.host + (addr - span_.base);
      break;
    }
  }
  static const char* const kSpace[] = {"generic", "global", "shared", "local", "param", "const"};
  SetFault(CUDA_ERROR_ILLEGAL_ADDRESS, std::string(write ? "write" : "read") + " of " + std::to_string(bytes) +
                                           " bytes at " + kSpace[static_cast<int>(sp)] + " address 0x" + Hex(addr) +
                                           " outside the session's memory by " + Where(w, lane, ins));
  return nullptr;
}

inline uint64_t Block::Address(const Warp& w, const Operand& o, int lane) const {
  uint64_t a = o.imm;
  if (o.reg != kNoReg) a += w.regs[o.reg * 32 + static_cast<uint32_t>(lane)];
  if (o.sym != kNoSym) a += cfg_.var_addrs[o.sym];
  return a;
}

inline uint64_t Block::Load(const uint8_t* p, int bytes) {
  switch (bytes) {  // fixed sizes: inlined moves instead of a memcpy call per lane
    case 1: return *p;
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case 8: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    default: {
      uint64_t v = 0;
      std::memcpy(&v, p, static_cast<size_t>(std::min(bytes, 8)));
      return v;
    }
  }
}

inline void Block::Store(uint8_t* p, uint64_t v, int bytes) {
  switch (bytes) {
    case 1: *p = static_cast<uint8_t>(v); break;
    case 2: {
      const auto x = static_cast<uint16_t>(v);
      std::memcpy(p, &x, 2);
      break;
    }
    case 4: {
      const auto x = static_cast<uint32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    default: std::memcpy(p, &v, static_cast<size_t>(std::min(bytes, 8))); break;
  }
}

inline bool Block::Atomic(Warp& w, int l, const Ins& ins, bool want_old) {
  const int d = want_old ? 1 : 0;  // operand index of the address
  const Operand& am = ins.o[d];
  const uint64_t addr = Address(w, am, l);
  const Ty t = ins.type;
  const int n = TyBytes(t);
  uint8_t* p =
      Mem(ins.space == Space::kGeneric ? Space::kGeneric : ins.space, addr, static_cast<uint32_t>(n), w, l, true, ins);
  if (p == nullptr) return false;
  const uint64_t b = Val(w, ins.o[d + 1], l);
  const uint64_t c = ins.nops > d + 2 ? Val(w, ins.o[d + 2], l) : 0;
  const AtomOp op = static_cast<AtomOp>(ins.sub);
  uint64_t old = 0;
  auto rmw = [&](auto* ptr, auto f) {
    using T = std::remove_pointer_t<decltype(ptr)>;
    T cur = __atomic_load_n(ptr, __ATOMIC_RELAXED);
    for (;;) {
      const T nv = f(cur);
      if (__atomic_compare_exchange_n(ptr, &cur, nv, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return cur;
    }
  };
  if (n == 4 || n == 8) {
    auto run = [&](auto* ptr) {
      using T = std::remove_pointer_t<decltype(ptr)>;
      const T bv = static_cast<T>(b), cv = static_cast<T>(c);
      const bool sgn = TySigned(t);
      switch (op) {
        case AtomOp::kAdd:
          if (t == Ty::kF32)
            return static_cast<uint64_t>(rmw(ptr, [&](T x) { return static_cast<T>(B32(F32(x) + F32(bv))); }));
          if (t == Ty::kF64)
            return static_cast<uint64_t>(rmw(ptr, [&](T x) { return static_cast<T>(B64(F64(x) + F64(bv))); }));
          if (t == Ty::kF16x2 || t == Ty::kBF16x2)
            return static_cast<uint64_t>(rmw(ptr, [&](T x) {
              Ins add = ins;
              add.ftz = add.sat = false;
              add.rnd = Rnd::kDefault;
              return static_cast<T>(FEval(add, x, bv, 0, [](auto p1, auto p2, auto) { return p1 + p2; }));
            }));
          return static_cast<uint64_t>(__atomic_fetch_add(ptr, bv, __ATOMIC_SEQ_CST));
        case AtomOp::kAnd: return static_cast<uint64_t>(__atomic_fetch_and(ptr, bv, __ATOMIC_SEQ_CST));
        case AtomOp::kOr: return static_cast<uint64_t>(__atomic_fetch_or(ptr, bv, __ATOMIC_SEQ_CST));
        case AtomOp::kXor: return static_cast<uint64_t>(__atomic_fetch_xor(ptr, bv, __ATOMIC_SEQ_CST));
        case AtomOp::kExch: return static_cast<uint64_t>(__atomic_exchange_n(ptr, bv, __ATOMIC_SEQ_CST));
        case AtomOp::kCas: {
          T expected = bv;
          __atomic_compare_exchange_n(ptr, &expected, cv, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
          return static_cast<uint64_t>(expected);
        }
        case AtomOp::kInc:
          return static_cast<uint64_t>(rmw(ptr, [&](T x) { return x >= bv ? T{0} : static_cast<T>(x + 1); }));
        case AtomOp::kDec:
          return static_cast<uint64_t>(rmw(ptr, [&](T x) { return (x == 0 || x > bv) ? bv : static_cast<T>(x - 1); }));
        case AtomOp::kMin:
        case AtomOp::kMax: {
          const bool mn = op == AtomOp::kMin;
          if (t == Ty::kF32 || t == Ty::kF64) {
            return static_cast<uint64_t>(rmw(ptr, [&](T x) {
              const double xv = n == 4 ? F32(x) : F64(x), bvv = n == 4 ? F32(bv) : F64(bv);
              return (mn ? bvv < xv : bvv > xv) ? bv : x;
            }));
          }
          return static_cast<uint64_t>(rmw(ptr, [&](T x) {
            const bool less = sgn ? SExt(bv, n) < SExt(x, n) : bv < x;
            return (mn ? less : (!less && bv != x)) ? bv : x;
          }));
        }
      }
      return uint64_t{0};
    };
    old = n == 4 ? Trunc(run(reinterpret_cast<uint32_t*>(p)), 4) : run(reinterpret_cast<uint64_t*>(p));
  } else if (n == 2 && (op == AtomOp::kAdd || op == AtomOp::kCas || op == AtomOp::kExch || op == AtomOp::kMin ||
                        op == AtomOp::kMax)) {
    auto* ptr = reinterpret_cast<uint16_t*>(p);
    old = rmw(ptr, [&](uint16_t x) -> uint16_t {
      switch (op) {
        case AtomOp::kCas: return x == static_cast<uint16_t>(b) ? static_cast<uint16_t>(c) : x;
        case AtomOp::kExch: return static_cast<uint16_t>(b);
        case AtomOp::kAdd: {
          if (t == Ty::kF16) return static_cast<uint16_t>(F2H(H2F(x) + H2F(b)));
          if (t == Ty::kBF16) return static_cast<uint16_t>(F2BF(BF2F(x) + BF2F(b)));
          return static_cast<uint16_t>(x + b);
        }
        default: {
          const float xv = t == Ty::kBF16 ? BF2F(x) : H2F(x), bv = t == Ty::kBF16 ? BF2F(b) : H2F(b);
          const bool mn = op == AtomOp::kMin;
          return (mn ? bv < xv : bv > xv) ? static_cast<uint16_t>(b) : x;
        }
      }
    });
  } else {
    SetFault(CUDA_ERROR_NOT_SUPPORTED,
             std::string("atom/red of ") + TyName(t) + " is not supported by the sim executor");
    return false;
  }
  if (want_old) Set(w, ins.o[0], l, old);
  return true;
}

}  // namespace orion::ptx::exec
