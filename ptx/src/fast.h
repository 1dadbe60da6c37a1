// ptx/src/fast.h — the instruction forms the executor runs on a fast path (block_fast.h): the
// commonest integer and f32 arithmetic, moves, integer and f32 comparisons, and global loads and
// stores of 4 and 8 bytes, when their operands are plain (a register destination; registers,
// immediates, special registers or symbols as sources) and no modifier changes their meaning
// (no carry, saturation, flush-to-zero, rounding mode or second destination); loads and stores of
// global, shared and (loads) kernel-parameter memory. Lower() marks each
// instruction (Ins::fast); every other form, and any lane a fast path cannot serve (an access
// outside the allocation the last one hit), goes to the general units (block_units.h), which stay
// the reference for what each instruction means.
#pragma once

#include <cstdint>

#include "ir.h"

namespace orion::ptx {

enum FastForm : uint8_t {
  kFastNone = 0,
  kFastMov,  // mov / cvta.global: d = trunc(a)
  kFastAdd,  // integer, 4 or 8 bytes
  kFastSub,
  kFastMulLo,
  kFastMadLo,
  kFastMulWide,  // mul.wide of 4-byte integers
  kFastAnd,
  kFastOr,
  kFastXor,
  kFastShl,  // shl, shr of unsigned and bit types, shr of signed ones (arithmetic)
  kFastShr,
  kFastSar,
  kFastPredAnd,  // and / or / xor .pred, operands possibly negated (!p)
  kFastPredOr,
  kFastPredXor,
  kFastAddF32,
  kFastSubF32,
  kFastMulF32,
  kFastFmaF32,  // fma.rn.f32, mad.f32
  kFastSetp,    // one destination, no boolean combination
  kFastLd,      // ld.global, .shared, .param or generic, of a 4- or 8-byte register
  kFastSt,      // st.global, .shared or generic
};

inline bool FastSource(const Operand& o) {
  return !o.neg &&
         (o.kind == Operand::kReg || o.kind == Operand::kImm || o.kind == Operand::kSpecial || o.kind == Operand::kSym);
}

// The fast form of `ins`, or kFastNone.
inline FastForm FastFormOf(const Ins& ins) {
  const int n = TyBytes(ins.type);
  const bool integer = !TyFloat(ins.type) && ins.type != Ty::kPred && (n == 4 || n == 8);
  const bool moved = integer || ins.type == Ty::kF32 || ins.type == Ty::kF64;  // mov, ld, st: bits as they are
  const bool dst = ins.nops >= 1 && ins.o[0].kind == Operand::kReg && ins.o[0].n == 0;
  auto sources = [&](int first, int count) {
    if (ins.nops != first + count) return false;
    for (int i = first; i < first + count; ++i)
      if (!FastSource(ins.o[i])) return false;
    return true;
  };
  switch (ins.op) {
    case Op::kMov: return moved && dst && sources(1, 1) ? kFastMov : kFastNone;
    case Op::kCvta: return integer && dst && ins.space == Space::kGlobal && sources(1, 1) ? kFastMov : kFastNone;
    case Op::kAdd:
    case Op::kSub:
    case Op::kMul:
    case Op::kMad:
    case Op::kFma:
      if (!dst || ins.cc || ins.sat) return kFastNone;
      if (ins.type == Ty::kF32) {
        if (ins.ftz || ins.relu || (ins.rnd != Rnd::kDefault && ins.rnd != Rnd::kRn)) return kFastNone;
        if (ins.op == Op::kFma || ins.op == Op::kMad) return sources(1, 3) ? kFastFmaF32 : kFastNone;
        if (!sources(1, 2)) return kFastNone;
        return ins.op == Op::kAdd ? kFastAddF32 : ins.op == Op::kSub ? kFastSubF32 : kFastMulF32;
      }
      if (!integer || ins.op == Op::kFma) return kFastNone;
      if (ins.op == Op::kAdd) return sources(1, 2) ? kFastAdd : kFastNone;
      if (ins.op == Op::kSub) return sources(1, 2) ? kFastSub : kFastNone;
      if (ins.op == Op::kMul) {
        if (!sources(1, 2)) return kFastNone;
        if (ins.mul == MulMode::kLo || ins.mul == MulMode::kNone) return kFastMulLo;
        return ins.mul == MulMode::kWide && n == 4 ? kFastMulWide : kFastNone;
      }
      return ins.mul == MulMode::kLo && sources(1, 3) ? kFastMadLo : kFastNone;
    case Op::kAnd:
    case Op::kOr:
    case Op::kXor:
      if (ins.type == Ty::kPred && dst && ins.nops == 3) {
        for (int i = 1; i < 3; ++i)
          if (ins.o[i].kind != Operand::kReg && ins.o[i].kind != Operand::kImm) return kFastNone;
        return ins.op == Op::kAnd ? kFastPredAnd : ins.op == Op::kOr ? kFastPredOr : kFastPredXor;
      }
      if (!integer || !dst || !sources(1, 2)) return kFastNone;
      return ins.op == Op::kAnd ? kFastAnd : ins.op == Op::kOr ? kFastOr : kFastXor;
    case Op::kShl:
    case Op::kShr:
      if (!integer || !dst || !sources(1, 2)) return kFastNone;
      return ins.op == Op::kShl ? kFastShl : TySigned(ins.type) ? kFastSar : kFastShr;
    case Op::kSetp: {
      const int m = TyBytes(ins.type2);
      const bool cmp_int = !TyFloat(ins.type2) && ins.type2 != Ty::kPred && (m == 4 || m == 8);
      return dst && ins.boolop == BoolOp::kNone && (cmp_int || ins.type2 == Ty::kF32) && !ins.ftz && sources(1, 2)
                 ? kFastSetp
                 : kFastNone;
    }
    case Op::kLd:
      return moved && dst && ins.nops == 2 && ins.o[1].kind == Operand::kMem && ins.vec == 1 &&
                     (ins.space == Space::kGlobal || ins.space == Space::kGeneric || ins.space == Space::kShared ||
                      ins.space == Space::kParam)
                 ? kFastLd
                 : kFastNone;
    case Op::kSt:
      return moved && ins.nops == 2 && ins.o[0].kind == Operand::kMem && FastSource(ins.o[1]) && ins.vec == 1 &&
                     (ins.space == Space::kGlobal || ins.space == Space::kGeneric || ins.space == Space::kShared)
                 ? kFastSt
                 : kFastNone;
    default: return kFastNone;
  }
}

}  // namespace orion::ptx
