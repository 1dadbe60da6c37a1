// ptx/src/jit.cpp — the translator (jit.h): traces of fast-form instructions to LLVM IR over
// <32 x i64> register rows, optimized and compiled for the host CPU by LLVM's ORC LLJIT.
//
// Each instruction means what its fast path means (block_fast.h, the reference); the comments name
// the fast path's expression. Sources: LLVM Language Reference (masked gather/scatter: "scatter with
// overlapping addresses is guaranteed to be ordered from least-significant to most-significant
// element", as the interpreter's lanes are; fcmp's ordered and unordered predicates); LLVM 14's ORC
// LLJIT ("Building a JIT" tutorial, LLJIT.h).
#include "jit.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include <pthread.h>
#include <unistd.h>

#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Transforms/Scalar/EarlyCSE.h>
#include <llvm/Transforms/Scalar/SimplifyCFG.h>
#include <llvm/Transforms/Utils/Mem2Reg.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include "alu.h"
#include "fast.h"

namespace orion::ptx::jit {

bool Enabled() {
  static const bool on = [] {
    const char* e = std::getenv("ORION_PTX_JIT");
    const char* f = std::getenv("ORION_PTX_FAST");  // the general units alone: no translation either
    return (e == nullptr || std::strcmp(e, "0") != 0) && (f == nullptr || std::strcmp(f, "0") != 0);
  }();
  return on;
}

namespace {

bool ReadableSource(const Operand& o) {
  switch (o.kind) {
    case Operand::kReg:
    case Operand::kImm:
    case Operand::kSym: return true;
    case Operand::kSpecial:
      // The clocks change as the kernel runs; every other special register is lane-invariant,
      // a per-lane constant, or %tid.
      return o.reg != kClock && o.reg != kClock64 && o.reg != kGlobaltimer && o.reg < kSpecials;
    default: return false;
  }
}

bool IsMemory(const Ins& ins) {
  return (ins.op == Op::kLd || ins.op == Op::kSt) && ins.o[ins.op == Op::kLd ? 1 : 0].kind == Operand::kMem;
}

// Whether a trace may stop before `ins` (a load or store outside its range, a warp collective whose
// members are not all here): the instruction after it is an entry point.
bool CanStop(const Ins& ins) { return IsMemory(ins) || ins.op == Op::kShfl || ins.op == Op::kVote; }

bool PlainDst(const Operand& o) { return o.kind == Operand::kReg && o.n == 0; }
bool IntType(Ty t) { return !TyFloat(t) && t != Ty::kPred && t != Ty::kNone && TyBytes(t) >= 1 && TyBytes(t) <= 8; }
bool F32OrF64(Ty t) { return t == Ty::kF32 || t == Ty::kF64; }
bool Nearest(Rnd r) { return r == Rnd::kDefault || r == Rnd::kRn; }

// What the translator does with `ins` beyond its fast form (fast.h), each meaning what the general
// units (block_units.h, alu.h) mean: kNone leaves it to the interpreter.
enum class Form : uint8_t {
  kNone,
  kFast,    // its fast form (Emit's switch)
  kMov,     // mov of 1-, 2-byte integers and halves (truncated), of predicates (bit 0)
  kSelp,    // selp: d = p ? a : b
  kMinMax,  // integer min / max (no .relu)
  kAbsNeg,  // integer abs / neg
  kFloat,   // f32 / f64 add sub mul div fma mad abs neg rcp sqrt rsqrt, round to nearest,
            // .ftz (f32), no .sat / .relu
  kCvt,     // cvt between integers, f32 and f64 (no .sat; rounding to nearest, or to an integer)
  kAccess,  // ld / st of 1, 2, 4, 8 bytes, scalar or .v2 / .v4, global / generic / shared (ld: param)
  kShfl,    // shfl.sync (d or d|p), when its members are all here (else the interpreter's wait)
  kVote,    // vote.sync all / any / uni / ballot, the same
  kActivemask,
  kCallFloat,  // the float unit's other forms (sin cos lg2 ex2 tanh min max copysign; .sat, .relu,
               // directed rounding; f16, bf16 and their pairs): a call of its own per-lane code
  kCallCvt,    // cvt's other forms (.sat, halves): the same
};

Form FormOfOp(const Ins& ins) {
  const Ty t = ins.type;
  const int n = TyBytes(t);
  switch (ins.op) {
    case Op::kMov:
      return ins.nops == 2 && PlainDst(ins.o[0]) && (IntType(t) || t == Ty::kF16 || t == Ty::kBF16 || t == Ty::kPred)
                 ? Form::kMov
                 : Form::kNone;
    case Op::kSelp: return ins.nops == 4 && PlainDst(ins.o[0]) && n >= 1 && n <= 8 ? Form::kSelp : Form::kNone;
    case Op::kMin:
    case Op::kMax:
      if (ins.nops != 3 || !PlainDst(ins.o[0]) || ins.relu) return Form::kNone;
      // Float min / max: the general unit calls libm's fmin / fmax, whose zero signs and NaN
      // payloads LLVM's minnum / maxnum need not match: left to it.
      return IntType(t) ? Form::kMinMax : Form::kNone;
    case Op::kAbs:
    case Op::kNeg:
      if (ins.nops != 2 || !PlainDst(ins.o[0]) || ins.cc || ins.sat) return Form::kNone;
      if (IntType(t)) return Form::kAbsNeg;
      return F32OrF64(t) && !ins.relu ? Form::kFloat : Form::kNone;
    case Op::kAdd:
    case Op::kSub:
    case Op::kMul:
    case Op::kDiv:
    case Op::kFma:
    case Op::kMad:
    case Op::kRcp:
    case Op::kSqrt:
    case Op::kRsqrt: {
      if (!F32OrF64(t) || !PlainDst(ins.o[0]) || ins.sat || ins.relu || !Nearest(ins.rnd)) return Form::kNone;
      const int srcs = ins.op == Op::kFma || ins.op == Op::kMad                            ? 3
                       : ins.op == Op::kRcp || ins.op == Op::kSqrt || ins.op == Op::kRsqrt ? 1
                                                                                           : 2;
      return ins.nops == 1 + srcs ? Form::kFloat : Form::kNone;
    }
    case Op::kCvt: {
      const Ty st = ins.type2;
      if (ins.nops != 2 || !PlainDst(ins.o[0]) || ins.sat) return Form::kNone;
      const bool di = IntType(t), si = IntType(st), df = F32OrF64(t), sf = F32OrF64(st);
      if (di && si) return Form::kCvt;
      if (df && si) return Nearest(ins.rnd) ? Form::kCvt : Form::kNone;
      if (di && sf) return Form::kCvt;  // every rounding to an integer
      if (df && sf) {
        const bool integral = ins.rnd == Rnd::kRzi || ins.rnd == Rnd::kRmi || ins.rnd == Rnd::kRpi;
        // Rounding to an integer toward zero / down / up also sets the host's rounding mode for
        // the final narrowing (alu.h Directed): exact only when nothing narrows.
        return Nearest(ins.rnd) || ins.rnd == Rnd::kRni || (integral && t == st) ? Form::kCvt : Form::kNone;
      }
      return Form::kNone;
    }
    case Op::kShfl: {
      const bool pair = ins.o[0].n == 1;
      return ins.nops == (pair ? 6 : 5) && ins.o[0].kind == Operand::kReg && (!pair || ins.o[1].kind == Operand::kReg)
                 ? Form::kShfl
                 : Form::kNone;
    }
    case Op::kVote: return ins.nops == 3 && PlainDst(ins.o[0]) ? Form::kVote : Form::kNone;
    case Op::kActivemask: return ins.nops == 1 && PlainDst(ins.o[0]) ? Form::kActivemask : Form::kNone;
    case Op::kLd:
    case Op::kSt: {
      const bool load = ins.op == Op::kLd;
      if (ins.nops != 2 || !IsMemory(ins) || n < 1 || n > 8 || (n & (n - 1)) != 0 || t == Ty::kPred) return Form::kNone;
      if (ins.vec != 1 && ins.vec != 2 && ins.vec != 4) return Form::kNone;
      const Operand& v = ins.o[load ? 0 : 1];
      if (ins.vec == 1 ? (load && !PlainDst(v)) : (v.kind != Operand::kVec || v.n != ins.vec)) return Form::kNone;
      const bool space = ins.space == Space::kGlobal || ins.space == Space::kGeneric || ins.space == Space::kShared ||
                         (load && ins.space == Space::kParam);
      return space ? Form::kAccess : Form::kNone;
    }
    default: return Form::kNone;
  }
}

// The forms a trace runs by calling the interpreter's per-lane units (jit.h CallFloat, CallConvert).
Form CallFormOf(const Ins& ins) {
  const Ty t = ins.type;
  if (!PlainDst(ins.o[0])) return Form::kNone;
  if (ins.op == Op::kCvt) {
    // Block::Exec's cvt: a type on each side; the f16x2 / bf16x2 pair conversion is its own case.
    const bool ok = TyBytes(t) != 0 && TyBytes(ins.type2) != 0 && t != Ty::kF16x2 && t != Ty::kBF16x2;
    return ok && ins.nops == 2 ? Form::kCallCvt : Form::kNone;
  }
  const int arity = exec::FloatArity(ins.op);
  return TyFloat(t) && arity != 0 && ins.nops == 1 + arity ? Form::kCallFloat : Form::kNone;
}

Form FormOf(const Ins& ins) {
  Form f = Form::kNone;
  if (ins.fast == kFastLd || ins.fast == kFastSt) {
    f = FormOfOp(ins);
  } else if (ins.fast != kFastNone) {
    f = Form::kFast;
    if (ins.fast == kFastSetp) {
      const Ty t = ins.type2;
      const bool ok =
          t == Ty::kF32 ? ins.cmp <= Cmp::kGe || (ins.cmp >= Cmp::kEqu && ins.cmp <= Cmp::kNan) : ins.cmp <= Cmp::kHs;
      if (!ok) f = Form::kNone;
    }
  } else {
    f = FormOfOp(ins);
    if (f == Form::kNone) f = CallFormOf(ins);
  }
  if (f == Form::kNone) return f;
  // Operands: a plain destination, then sources the trace can read (a register, an immediate, a
  // symbol's address, a special register other than the clocks; a predicate may be negated).
  for (int i = 0; i < ins.nops; ++i) {
    const Operand& o = ins.o[i];
    if (o.kind == Operand::kMem) continue;
    if (o.kind == Operand::kVec) {
      if (f != Form::kAccess) return Form::kNone;
      for (int j = 0; j < o.n; ++j)
        if ((o.regs[j] & 0x80000000u) != 0 && o.regs[j] != kNoReg) return Form::kNone;  // a symbol in a vector
      continue;
    }
    if (i == 0 && ins.op != Op::kSt) continue;                    // the destination register
    if (i == 1 && f == Form::kShfl && ins.o[0].n == 1) continue;  // d|p: p is a destination too
    const bool pred_operand = (f == Form::kSelp && i == 3) || (f == Form::kVote && i == 1) ||
                              ins.fast == kFastPredAnd || ins.fast == kFastPredOr || ins.fast == kFastPredXor;
    if (o.neg && !pred_operand) return Form::kNone;
    if (!ReadableSource(o)) return Form::kNone;
  }
  return f;
}

}  // namespace

bool Translatable(const Ins& ins) { return FormOf(ins) != Form::kNone; }

namespace {

using llvm::BasicBlock;
using llvm::Type;
using llvm::Value;

// Builds one module: a function per trace.
class Gen {
 public:
  Gen(llvm::LLVMContext& c, llvm::Module& m, const Kernel& k, const Code& code)
      : c_(c), m_(m), k_(k), code_(code), b_(c) {
    i1_ = Type::getInt1Ty(c);
    i8_ = Type::getInt8Ty(c);
    i32_ = Type::getInt32Ty(c);
    i64_ = Type::getInt64Ty(c);
    f32_ = Type::getFloatTy(c);
    v64_ = llvm::FixedVectorType::get(i64_, 32);
    v32_ = llvm::FixedVectorType::get(i32_, 32);
    vf_ = llvm::FixedVectorType::get(f32_, 32);
    vd_ = llvm::FixedVectorType::get(Type::getDoubleTy(c), 32);
    vm_ = llvm::FixedVectorType::get(i1_, 32);
  }

  // The function of trace [begin, end).
  llvm::Function* Trace(uint32_t begin, uint32_t end, const std::string& name) {
    auto* fty = llvm::FunctionType::get(i32_, {i64_->getPointerTo(), i32_}, false);
    fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m_);
    fn_->addParamAttr(0, llvm::Attribute::NoAlias);
    frame_ = fn_->getArg(0);
    BasicBlock* entry = BasicBlock::Create(c_, "entry", fn_);
    std::vector<BasicBlock*> blocks;
    for (uint32_t pc = begin; pc <= end; ++pc) blocks.push_back(BasicBlock::Create(c_, "pc" + std::to_string(pc), fn_));
    b_.SetInsertPoint(entry);
    // The frame's fields, read once.
    regs_ = b_.CreateIntToPtr(Field(kFieldRegs), i64_->getPointerTo(), "regs");
    group_ = b_.CreateBitCast(b_.CreateTrunc(Field(kFieldGroup), i32_), vm_, "group");
    tid_ = FieldPtr(kFieldTid, i64_);
    special_ = FieldPtr(kFieldSpecial, i64_);
    vars_ = FieldPtr(kFieldVarAddrs, i64_);
    spans_ = FieldPtr(kFieldSpans, i64_);
    shared_ = b_.CreateIntToPtr(Field(kFieldShared), i8_->getPointerTo());
    shared_bytes_ = Field(kFieldSharedBytes);
    params_ = b_.CreateIntToPtr(Field(kFieldParams), i8_->getPointerTo());
    param_bytes_ = Field(kFieldParamBytes);
    lanes_ = b_.CreateAlloca(i64_, nullptr, "lanes");
    src_slot_ = b_.CreateAlloca(i64_, b_.getInt32(32), "shfl_src");
    for (auto& row : call_rows_) row = b_.CreateAlloca(i64_, b_.getInt32(32), "call_row");
    b_.CreateStore(b_.getInt64(0), lanes_);
    BasicBlock* bad = BasicBlock::Create(c_, "bad_entry", fn_);
    auto* sw = b_.CreateSwitch(fn_->getArg(1), bad);
    for (uint32_t pc = begin; pc < end; ++pc)
      if (code_.entry[pc] != 0) sw->addCase(b_.getInt32(pc), blocks[pc - begin]);
    b_.SetInsertPoint(bad);
    b_.CreateRet(fn_->getArg(1));
    for (uint32_t pc = begin; pc < end; ++pc) {
      b_.SetInsertPoint(blocks[pc - begin]);
      Emit(k_.code[pc], pc);
      b_.CreateBr(blocks[pc - begin + 1]);
    }
    b_.SetInsertPoint(blocks.back());
    Leave(end);
    return fn_;
  }

 private:
  // Frame field `f` as an i64.
  Value* Field(int f) {
    Value* p = b_.CreateConstInBoundsGEP1_64(i64_, frame_, static_cast<uint64_t>(f));
    return b_.CreateAlignedLoad(i64_, p, llvm::Align(8));
  }
  Value* FieldPtr(int f, Type* elem) { return b_.CreateIntToPtr(Field(f), elem->getPointerTo()); }

  // Adds the lanes run to the frame's count and returns `pc`.
  void Leave(uint32_t pc) {
    Value* p = b_.CreateConstInBoundsGEP1_64(i64_, frame_, kFieldLaneIns);
    Value* sum = b_.CreateAdd(b_.CreateAlignedLoad(i64_, p, llvm::Align(8)), b_.CreateLoad(i64_, lanes_));
    b_.CreateAlignedStore(sum, p, llvm::Align(8));
    b_.CreateRet(b_.getInt32(pc));
  }

  Value* RowPtr(uint32_t reg) {
    Value* p = b_.CreateConstInBoundsGEP1_64(i64_, regs_, uint64_t{reg} * 32);
    return b_.CreateBitCast(p, v64_->getPointerTo());
  }
  Value* LoadRow(uint32_t reg) { return b_.CreateAlignedLoad(v64_, RowPtr(reg), llvm::Align(8)); }
  // The destination's lanes of `mask` become `v`; the others keep their value.
  void StoreRow(uint32_t reg, Value* v, Value* mask) {
    Value* old = LoadRow(reg);
    b_.CreateAlignedStore(b_.CreateSelect(mask, v, old), RowPtr(reg), llvm::Align(8));
  }
  Value* Splat(Value* v) { return b_.CreateVectorSplat(32, v); }
  Value* Splat(uint64_t v) { return Splat(b_.getInt64(v)); }

  // The 32 lanes' values of a source operand (Block::Row, Block::Val).
  Value* Src(const Operand& o) {
    switch (o.kind) {
      case Operand::kReg: return LoadRow(o.reg);
      case Operand::kImm: return Splat(o.imm);
      case Operand::kSym: {
        Value* vars = vars_;
        Value* a =
            b_.CreateAlignedLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, vars, o.reg & 0x7fffffffu), llvm::Align(8));
        return Splat(b_.CreateAdd(a, b_.getInt64(o.imm)));
      }
      case Operand::kSpecial: return Special(o.reg);
      default: return Splat(uint64_t{0});  // not reached: Translatable refuses the rest
    }
  }
  Value* Special(uint32_t id) {
    if (id == kTidX || id == kTidY || id == kTidZ) {
      Value* p = b_.CreateConstInBoundsGEP1_64(i64_, tid_, uint64_t{id - kTidX} * 32);
      return b_.CreateAlignedLoad(v64_, b_.CreateBitCast(p, v64_->getPointerTo()), llvm::Align(8));
    }
    if (id == kLaneid || (id >= kLanemaskEq && id <= kLanemaskGe)) {  // per-lane constants (Block::Special)
      std::vector<llvm::Constant*> lanes;
      for (uint64_t l = 0; l < 32; ++l) {
        const uint64_t bit = uint64_t{1} << l;
        uint64_t v = l;
        if (id == kLanemaskEq) v = bit;
        if (id == kLanemaskLt) v = bit - 1;
        if (id == kLanemaskLe) v = (bit - 1) | bit;
        if (id == kLanemaskGt) v = ~((bit - 1) | bit) & 0xffffffffu;
        if (id == kLanemaskGe) v = ~(bit - 1) & 0xffffffffu;
        lanes.push_back(b_.getInt64(v));
      }
      return llvm::ConstantVector::get(lanes);
    }
    return Splat(b_.CreateAlignedLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, special_, id), llvm::Align(8)));
  }

  Value* Lo32(Value* v) { return b_.CreateTrunc(v, v32_); }
  Value* Zext(Value* v32) { return b_.CreateZExt(v32, v64_); }
  Value* Sext(Value* v32) { return b_.CreateSExt(v32, v64_); }
  Value* AsF32(Value* v) { return b_.CreateBitCast(Lo32(v), vf_); }
  Value* FromF32(Value* f) { return Zext(b_.CreateBitCast(f, v32_)); }

  // The instruction's lanes: the group, less those its guard predicate leaves out (Block::Step).
  Value* Mask(const Ins& ins) {
    if (ins.pred == kNoReg) return group_;
    Value* p = b_.CreateTrunc(LoadRow(ins.pred), vm_);
    if (ins.pred_neg) p = b_.CreateNot(p);
    return b_.CreateAnd(group_, p);
  }

  void Emit(const Ins& ins, uint32_t pc) {
    Value* mask = Mask(ins);
    Value* count = b_.CreateZExt(b_.CreateUnaryIntrinsic(llvm::Intrinsic::ctpop, b_.CreateBitCast(mask, i32_)), i64_);
    b_.CreateStore(b_.CreateAdd(b_.CreateLoad(i64_, lanes_), count), lanes_);
    const Form form = FormOf(ins);
    if (form == Form::kAccess) return Access(ins, pc, mask);
    if (form == Form::kShfl || form == Form::kVote) return Collective(form, ins, pc, mask);
    if (form != Form::kFast) return EmitForm(form, ins, mask);
    const int n = ins.fast_bytes;
    const uint64_t keep = n >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * n)) - 1;
    Value* k = Splat(keep);
    const uint32_t d = ins.o[0].reg;
    switch (static_cast<FastForm>(ins.fast)) {
      case kFastMov: StoreRow(d, b_.CreateAnd(Src(ins.o[1]), k), mask); return;
      case kFastAdd: StoreRow(d, b_.CreateAnd(b_.CreateAdd(Src(ins.o[1]), Src(ins.o[2])), k), mask); return;
      case kFastSub: StoreRow(d, b_.CreateAnd(b_.CreateSub(Src(ins.o[1]), Src(ins.o[2])), k), mask); return;
      case kFastMulLo: StoreRow(d, b_.CreateAnd(b_.CreateMul(Src(ins.o[1]), Src(ins.o[2])), k), mask); return;
      case kFastAnd: StoreRow(d, b_.CreateAnd(b_.CreateAnd(Src(ins.o[1]), Src(ins.o[2])), k), mask); return;
      case kFastOr: StoreRow(d, b_.CreateAnd(b_.CreateOr(Src(ins.o[1]), Src(ins.o[2])), k), mask); return;
      case kFastXor: StoreRow(d, b_.CreateAnd(b_.CreateXor(Src(ins.o[1]), Src(ins.o[2])), k), mask); return;
      case kFastMadLo:
        StoreRow(d, b_.CreateAnd(b_.CreateAdd(b_.CreateMul(Src(ins.o[1]), Src(ins.o[2])), Src(ins.o[3])), k), mask);
        return;
      case kFastShl:
      case kFastShr:
      case kFastSar: {
        Value* a = Src(ins.o[1]);
        Value* sh = b_.CreateAnd(Src(ins.o[2]), Splat(0xffffffffu));
        if (ins.fast == kFastSar) {
          // (SExt(a, n) >> min(sh, 63)) & keep
          Value* s = b_.CreateSelect(b_.CreateICmpUGT(sh, Splat(63)), Splat(63), sh);
          Value* x = n == 4 ? Sext(Lo32(a)) : a;
          StoreRow(d, b_.CreateAnd(b_.CreateAShr(x, s), k), mask);
          return;
        }
        // sh >= bits ? 0 : shifted (a shift by 64 or more is poison in LLVM: shift by 0 instead)
        Value* over = b_.CreateICmpUGE(sh, Splat(8 * static_cast<uint64_t>(n)));
        Value* s = b_.CreateSelect(over, Splat(uint64_t{0}), sh);
        Value* r = ins.fast == kFastShl ? b_.CreateAnd(b_.CreateShl(a, s), k) : b_.CreateLShr(b_.CreateAnd(a, k), s);
        StoreRow(d, b_.CreateSelect(over, Splat(uint64_t{0}), r), mask);
        return;
      }
      case kFastPredAnd:
      case kFastPredOr:
      case kFastPredXor: {
        // ((a & 1) ^ na) op ((b & 1) ^ nb)
        Value* a = b_.CreateXor(b_.CreateAnd(Src(ins.o[1]), Splat(1)), Splat(ins.o[1].neg ? 1 : 0));
        Value* bb = b_.CreateXor(b_.CreateAnd(Src(ins.o[2]), Splat(1)), Splat(ins.o[2].neg ? 1 : 0));
        Value* r = ins.fast == kFastPredAnd  ? b_.CreateAnd(a, bb)
                   : ins.fast == kFastPredOr ? b_.CreateOr(a, bb)
                                             : b_.CreateXor(a, bb);
        StoreRow(d, r, mask);
        return;
      }
      case kFastMulWide: {
        Value* a = Lo32(Src(ins.o[1]));
        Value* bb = Lo32(Src(ins.o[2]));
        const bool sg = TySigned(ins.type);
        StoreRow(d, b_.CreateMul(sg ? Sext(a) : Zext(a), sg ? Sext(bb) : Zext(bb)), mask);
        return;
      }
      case kFastAddF32:
      case kFastSubF32:
      case kFastMulF32: {
        Value* a = AsF32(Src(ins.o[1]));
        Value* bb = AsF32(Src(ins.o[2]));
        Value* r = ins.fast == kFastAddF32   ? b_.CreateFAdd(a, bb)
                   : ins.fast == kFastSubF32 ? b_.CreateFSub(a, bb)
                                             : b_.CreateFMul(a, bb);
        StoreRow(d, FromF32(r), mask);
        return;
      }
      case kFastFmaF32: {
        Value* r = b_.CreateIntrinsic(llvm::Intrinsic::fma, {vf_},
                                      {AsF32(Src(ins.o[1])), AsF32(Src(ins.o[2])), AsF32(Src(ins.o[3]))});
        StoreRow(d, FromF32(r), mask);
        return;
      }
      case kFastSetp: StoreRow(d, b_.CreateZExt(Compare(ins, Src(ins.o[1]), Src(ins.o[2])), v64_), mask); return;
      default: return;  // not reached: FormOf (loads and stores are Form::kAccess)
    }
  }

  // setp (alu.h Compare): floats compared as floats (ordered, or unordered: u), signed integers
  // sign-extended for eq..ge, every other integer comparison unsigned on the truncated values.
  Value* Compare(const Ins& ins, Value* a, Value* b) {
    using P = llvm::CmpInst::Predicate;
    const Ty t = ins.type2;
    if (t == Ty::kF32) {
      static const P kF[] = {P::FCMP_OEQ, P::FCMP_ONE,   P::FCMP_OLT,   P::FCMP_OLE,   P::FCMP_OGT,
                             P::FCMP_OGE, P::FCMP_FALSE, P::FCMP_FALSE, P::FCMP_FALSE, P::FCMP_FALSE,  // lo ls hi hs
                             P::FCMP_UEQ, P::FCMP_UNE,   P::FCMP_ULT,   P::FCMP_ULE,   P::FCMP_UGT,
                             P::FCMP_UGE, P::FCMP_ORD,   P::FCMP_UNO};
      return b_.CreateFCmp(kF[static_cast<int>(ins.cmp)], AsF32(a), AsF32(b));
    }
    const int n = TyBytes(t);
    if (n == 4) a = Lo32(a), b = Lo32(b);
    const bool sg = TySigned(t) && ins.cmp <= Cmp::kGe;
    P p = P::ICMP_EQ;
    switch (ins.cmp) {
      case Cmp::kEq: p = P::ICMP_EQ; break;
      case Cmp::kNe: p = P::ICMP_NE; break;
      case Cmp::kLt:
      case Cmp::kLo: p = sg ? P::ICMP_SLT : P::ICMP_ULT; break;
      case Cmp::kLe:
      case Cmp::kLs: p = sg ? P::ICMP_SLE : P::ICMP_ULE; break;
      case Cmp::kGt:
      case Cmp::kHi: p = sg ? P::ICMP_SGT : P::ICMP_UGT; break;
      default: p = sg ? P::ICMP_SGE : P::ICMP_UGE; break;  // ge, hs
    }
    return b_.CreateICmp(p, a, b);
  }

  // ld / st of 4 or 8 bytes (block_fast.h kFastLd/kFastSt): every active lane's address inside the
  // range (the slot's allocation, shared memory, the parameter buffer) and aligned, or the trace
  // stops here and the interpreter runs the instruction.
  void Access(const Ins& ins, uint32_t pc, Value* mask) {
    const bool load = ins.op == Op::kLd;
    const Operand& at = ins.o[load ? 1 : 0];
    const auto elem = static_cast<uint64_t>(TyBytes(ins.type));
    const uint64_t cnt = ins.vec;
    const uint64_t bytes = elem * cnt;  // the whole access: aligned to its size (block_memory.h Mem)
    uint64_t align = bytes - 1;
    Value *base, *size, *host;
    if (ins.space == Space::kShared) {
      base = b_.getInt64(0), size = shared_bytes_, host = shared_;
    } else if (ins.space == Space::kParam) {
      base = b_.getInt64(0), size = param_bytes_, host = params_, align = 0;
    } else {
      Value* spans = spans_;
      const uint64_t s = uint64_t{code_.slot_of[pc]} * 3;
      base = b_.CreateAlignedLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, spans, s), llvm::Align(8));
      size = b_.CreateAlignedLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, spans, s + 1), llvm::Align(8));
      host = b_.CreateIntToPtr(
          b_.CreateAlignedLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, spans, s + 2), llvm::Align(8)),
          i8_->getPointerTo());
    }
    Value* addr = Splat(at.imm);
    if (at.sym != kNoSym) {
      Value* vars = vars_;
      addr = b_.CreateAdd(
          addr, Splat(b_.CreateAlignedLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, vars, at.sym), llvm::Align(8))));
    }
    if (at.reg != kNoReg) addr = b_.CreateAdd(LoadRow(at.reg), addr);
    // bad |= (addr & align) | (o >= size) | (bytes > size - o), over the active lanes
    Value* o = b_.CreateSub(addr, Splat(base));
    Value* vsize = Splat(size);
    Value* bad = b_.CreateOr(b_.CreateICmpUGE(o, vsize), b_.CreateICmpUGT(Splat(bytes), b_.CreateSub(vsize, o)));
    if (align != 0) bad = b_.CreateOr(bad, b_.CreateICmpNE(b_.CreateAnd(addr, Splat(align)), Splat(uint64_t{0})));
    Value* any = b_.CreateICmpNE(b_.CreateBitCast(b_.CreateAnd(bad, mask), i32_), b_.getInt32(0));
    StopIf(any, pc, mask, "outside");  // the interpreter runs it (and counts its lanes)
    // Element i of every lane at host + o + i * elem, moved lane by lane in lane order (a
    // scatter's overlapping lanes: the highest lane's value stays, as the interpreter's).
    Type* et = b_.getIntNTy(static_cast<unsigned>(8 * elem));
    auto* ety = llvm::FixedVectorType::get(et, 32);
    const llvm::Align al(align == 0 ? 1 : elem);
    const Operand& v = ins.o[load ? 0 : 1];
    if (cnt == 1 && (elem == 4 || elem == 8)) {
      // Commonly every lane runs and lane l's address is lane 0's plus l elements (a[i] with i
      // from %tid.x): one vector move instead of a gather or a scatter.
      std::vector<llvm::Constant*> steps;
      for (uint64_t l = 0; l < 32; ++l) steps.push_back(b_.getInt64(l * elem));
      Value* from0 = b_.CreateSub(o, Splat(b_.CreateExtractElement(o, uint64_t{0})));
      Value* linear = b_.CreateAndReduce(b_.CreateICmpEQ(from0, llvm::ConstantVector::get(steps)));
      Value* full = b_.CreateICmpEQ(b_.CreateBitCast(mask, i32_), b_.getInt32(-1));
      BasicBlock* row = BasicBlock::Create(c_, "row" + std::to_string(pc), fn_);
      BasicBlock* lanes = BasicBlock::Create(c_, "lanes" + std::to_string(pc), fn_);
      BasicBlock* done = BasicBlock::Create(c_, "moved" + std::to_string(pc), fn_);
      b_.CreateCondBr(b_.CreateAnd(full, linear), row, lanes);
      b_.SetInsertPoint(row);
      Value* base_ptr =
          b_.CreateBitCast(b_.CreateGEP(i8_, host, b_.CreateExtractElement(o, uint64_t{0})), ety->getPointerTo());
      Value* row_x = nullptr;
      if (load) {
        row_x = b_.CreateAlignedLoad(ety, base_ptr, al);
      } else {
        Value* x = Src(v);
        b_.CreateAlignedStore(elem < 8 ? b_.CreateTrunc(x, ety) : x, base_ptr, al);
      }
      b_.CreateBr(done);
      b_.SetInsertPoint(lanes);
      Value* ptrs = b_.CreateBitCast(b_.CreateGEP(i8_, host, o), llvm::FixedVectorType::get(et->getPointerTo(), 32));
      Value* lanes_x = nullptr;
      if (load) {
        lanes_x = b_.CreateMaskedGather(ety, ptrs, al, mask, llvm::UndefValue::get(ety));
      } else {
        Value* x = Src(v);
        b_.CreateMaskedScatter(elem < 8 ? b_.CreateTrunc(x, ety) : x, ptrs, al, mask);
      }
      b_.CreateBr(done);
      b_.SetInsertPoint(done);
      if (load) {
        llvm::PHINode* x = b_.CreatePHI(ety, 2);
        x->addIncoming(row_x, row);
        x->addIncoming(lanes_x, lanes);
        Value* r = elem < 8 ? (TySigned(ins.type) ? b_.CreateSExt(x, v64_) : b_.CreateZExt(x, v64_)) : x;
        if (v.reg != kNoReg) StoreRow(v.reg, r, mask);
      }
      return;
    }
    for (uint64_t i = 0; i < cnt; ++i) {
      Value* at_i = i == 0 ? o : b_.CreateAdd(o, Splat(i * elem));
      // Shared memory and the parameter buffer are under 2 GiB: 32-bit offsets (a gather moves 16
      // of them per AVX-512 instruction, against 8 with 64-bit ones).
      if (ins.space == Space::kShared || ins.space == Space::kParam)
        at_i = b_.CreateSExt(b_.CreateTrunc(at_i, v32_), v64_);
      Value* ptrs = b_.CreateBitCast(b_.CreateGEP(i8_, host, at_i), llvm::FixedVectorType::get(et->getPointerTo(), 32));
      const uint32_t reg = v.kind == Operand::kVec ? v.regs[i] : v.reg;
      if (load) {
        Value* x = b_.CreateMaskedGather(ety, ptrs, al, mask, llvm::UndefValue::get(ety));
        if (elem < 8) x = TySigned(ins.type) ? b_.CreateSExt(x, v64_) : b_.CreateZExt(x, v64_);
        if (reg != kNoReg) StoreRow(reg, x, mask);
      } else {
        Value* x = v.kind == Operand::kVec ? (reg == kNoReg ? Splat(uint64_t{0}) : LoadRow(reg)) : Src(v);
        if (elem < 8) x = b_.CreateTrunc(x, ety);
        b_.CreateMaskedScatter(x, ptrs, al, mask);
      }
    }
  }

  // The trace stops before `pc` (nothing done for it) when `stop` holds: its lanes are uncounted.
  void StopIf(Value* stop, uint32_t pc, Value* mask, const char* why) {
    BasicBlock* leave = BasicBlock::Create(c_, std::string(why) + std::to_string(pc), fn_);
    BasicBlock* go = BasicBlock::Create(c_, "go" + std::to_string(pc), fn_);
    b_.CreateCondBr(stop, leave, go, llvm::MDBuilder(c_).createBranchWeights(1, 1000));
    b_.SetInsertPoint(leave);
    Value* count = b_.CreateZExt(b_.CreateUnaryIntrinsic(llvm::Intrinsic::ctpop, b_.CreateBitCast(mask, i32_)), i64_);
    b_.CreateStore(b_.CreateSub(b_.CreateLoad(i64_, lanes_), count), lanes_);
    Leave(pc);
    b_.SetInsertPoint(go);
  }

  // The first lane of `mask32` (lane 0 when there is none), an i32.
  Value* FirstLane(Value* mask32) {
    return b_.CreateIntrinsic(llvm::Intrinsic::cttz, {i32_}, {b_.CreateOr(mask32, b_.getInt32(1)), b_.getTrue()});
  }

  // shfl.sync / vote.sync (Block::Step's collective rule, then Block::Collective): run here when
  // the member mask (read at the group's first lane) has no live lane outside the group.
  void Collective(Form form, const Ins& ins, uint32_t pc, Value* mask) {
    Value* group32 = b_.CreateBitCast(group_, i32_);
    Value* members = b_.CreateTrunc(b_.CreateExtractElement(Src(ins.o[ins.nops - 1]), FirstLane(group32)), i32_);
    Value* live = b_.CreateTrunc(
        b_.CreateAlignedLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, frame_, kFieldLive), llvm::Align(8)), i32_);
    Value* away = b_.CreateAnd(b_.CreateAnd(members, live), b_.CreateNot(group32));
    StopIf(b_.CreateICmpNE(away, b_.getInt32(0)), pc, mask, "wait");
    if (form == Form::kVote) {
      // members = the operand (at the instruction's first lane) & mask; the ballot of the predicate
      Value* mask32 = b_.CreateBitCast(mask, i32_);
      Value* mem =
          b_.CreateAnd(b_.CreateTrunc(b_.CreateExtractElement(Src(ins.o[2]), FirstLane(mask32)), i32_), mask32);
      Value* p = b_.CreateTrunc(Src(ins.o[1]), vm_);
      if (ins.o[1].neg) p = b_.CreateNot(p);
      Value* ballot = b_.CreateAnd(b_.CreateBitCast(p, i32_), mem);
      Value* r;
      switch (static_cast<VoteMode>(ins.sub)) {
        case VoteMode::kAll: r = b_.CreateZExt(b_.CreateICmpEQ(ballot, mem), i64_); break;
        case VoteMode::kAny: r = b_.CreateZExt(b_.CreateICmpNE(ballot, b_.getInt32(0)), i64_); break;
        case VoteMode::kUni:
          r = b_.CreateZExt(b_.CreateOr(b_.CreateICmpEQ(ballot, b_.getInt32(0)), b_.CreateICmpEQ(ballot, mem)), i64_);
          break;
        default: r = b_.CreateZExt(ballot, i64_); break;
      }
      StoreRow(ins.o[0].reg, Splat(r), mask);
      return;
    }
    std::vector<llvm::Constant*> ids;
    for (uint64_t l = 0; l < 32; ++l) ids.push_back(b_.getInt64(l));
    Value* lane = llvm::ConstantVector::get(ids);
    const bool pair = ins.o[0].n == 1;
    const int a_i = pair ? 2 : 1;
    // src: the group's values of a (0 elsewhere); lane l reads src[j] (Block::Collective).
    Value* src = b_.CreateSelect(group_, Src(ins.o[a_i]), Splat(uint64_t{0}));
    Value* bb = b_.CreateAnd(Src(ins.o[a_i + 1]), Splat(31));
    Value* c = Src(ins.o[a_i + 2]);
    Value* seg = b_.CreateAnd(b_.CreateLShr(c, Splat(8)), Splat(31));
    Value* cval = b_.CreateAnd(c, Splat(31));
    Value* maxl = b_.CreateOr(b_.CreateAnd(lane, seg), b_.CreateAnd(cval, b_.CreateNot(seg)));
    Value* minl = b_.CreateAnd(lane, seg);
    Value *j, *pval;
    switch (static_cast<ShflMode>(ins.sub)) {
      case ShflMode::kUp:
        j = b_.CreateSub(lane, bb);
        pval = b_.CreateICmpSGE(j, maxl);
        break;
      case ShflMode::kDown:
        j = b_.CreateAdd(lane, bb);
        pval = b_.CreateICmpSLE(j, maxl);
        break;
      case ShflMode::kBfly:
        j = b_.CreateXor(lane, bb);
        pval = b_.CreateICmpSLE(j, maxl);
        break;
      default:  // idx
        j = b_.CreateOr(minl, b_.CreateAnd(bb, b_.CreateNot(seg)));
        pval = b_.CreateICmpSLE(j, maxl);
        break;
    }
    Value* inside = b_.CreateAnd(b_.CreateICmpSGE(j, Splat(uint64_t{0})), b_.CreateICmpSLE(j, Splat(31)));
    j = b_.CreateSelect(b_.CreateAnd(pval, inside), j, lane);
    // src[j] per lane, through a 32-entry array on the stack.
    b_.CreateAlignedStore(src, b_.CreateBitCast(src_slot_, v64_->getPointerTo()), llvm::Align(8));
    Value* got = b_.CreateMaskedGather(v64_, b_.CreateGEP(i64_, src_slot_, j), llvm::Align(8), mask,
                                       llvm::UndefValue::get(v64_));
    StoreRow(ins.o[0].reg, b_.CreateAnd(got, Splat(0xffffffffu)), mask);
    if (pair) StoreRow(ins.o[1].reg, b_.CreateZExt(pval, v64_), mask);
  }

  // A call of the interpreter's per-lane unit (jit.h CallFloat / CallConvert) on the instruction's
  // lanes: its sources' rows through arrays on the stack, its result back from one.
  Value* Call(Form form, const Ins& ins, Value* mask) {
    auto* ptr = i64_->getPointerTo();
    Value* rows[4] = {call_rows_[0], call_rows_[1], call_rows_[2], call_rows_[3]};
    const int srcs = ins.nops - 1;
    for (int i = 0; i < srcs; ++i)
      b_.CreateAlignedStore(Src(ins.o[1 + i]), b_.CreateBitCast(rows[i], v64_->getPointerTo()), llvm::Align(8));
    Value* insp = b_.CreateIntToPtr(b_.getInt64(reinterpret_cast<uintptr_t>(&ins)), i8_->getPointerTo());
    Value* m32 = b_.CreateBitCast(mask, i32_);
    if (form == Form::kCallFloat) {
      auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {i8_->getPointerTo(), ptr, ptr, ptr, ptr, i32_}, false);
      Value* fn = b_.CreateIntToPtr(b_.getInt64(reinterpret_cast<uintptr_t>(&CallFloat)), fty->getPointerTo());
      b_.CreateCall(fty, fn, {insp, rows[0], rows[1], rows[2], rows[3], m32});
    } else {
      auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {i8_->getPointerTo(), ptr, ptr, i32_}, false);
      Value* fn = b_.CreateIntToPtr(b_.getInt64(reinterpret_cast<uintptr_t>(&CallConvert)), fty->getPointerTo());
      b_.CreateCall(fty, fn, {insp, rows[0], rows[3], m32});
    }
    return b_.CreateAlignedLoad(v64_, b_.CreateBitCast(rows[3], v64_->getPointerTo()), llvm::Align(8));
  }

  // The forms beyond the fast ones (Form), as the general units compute them.
  Value* Keep(int n) { return Splat(n >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * n)) - 1); }
  Value* IntN(Value* v, int n) {
    return n >= 8 ? v : b_.CreateTrunc(v, llvm::FixedVectorType::get(b_.getIntNTy(8 * n), 32));
  }
  Value* Ext(Value* v, bool sg) {
    return v->getType() == v64_ ? v : sg ? b_.CreateSExt(v, v64_) : b_.CreateZExt(v, v64_);
  }
  // FtzF (alu.h): a subnormal f32 becomes a zero of its sign.
  Value* Ftz(Value* f) {
    Value* bits = b_.CreateBitCast(f, v32_);
    auto c32 = [&](uint32_t x) { return b_.CreateVectorSplat(32, b_.getInt32(x)); };
    Value* sub = b_.CreateAnd(b_.CreateICmpEQ(b_.CreateAnd(bits, c32(0x7f800000u)), c32(0)),
                              b_.CreateICmpNE(b_.CreateAnd(bits, c32(0x007fffffu)), c32(0)));
    return b_.CreateBitCast(b_.CreateSelect(sub, b_.CreateAnd(bits, c32(0x80000000u)), bits), vf_);
  }
  Value* AsF64(Value* v) { return b_.CreateBitCast(v, vd_); }

  void EmitForm(Form form, const Ins& ins, Value* mask) {
    const Ty t = ins.type;
    const int n = TyBytes(t);
    const bool sg = TySigned(t);
    const uint32_t d = ins.o[0].reg;
    switch (form) {
      case Form::kMov:  // Exec kMov: Trunc(v, n); a predicate's bit 0
        StoreRow(d, b_.CreateAnd(Src(ins.o[1]), t == Ty::kPred ? Splat(1) : Keep(n)), mask);
        return;
      case Form::kSelp: {  // d = p ? a : b, the sources' bits as they are
        Value* p = b_.CreateTrunc(Src(ins.o[3]), vm_);
        if (ins.o[3].neg) p = b_.CreateNot(p);
        StoreRow(d, b_.CreateSelect(p, Src(ins.o[1]), Src(ins.o[2])), mask);
        return;
      }
      case Form::kMinMax: {  // ExecInt: less on the n-byte values; r = (min == less) ? a : b; Trunc
        Value* a = Src(ins.o[1]);
        Value* bb = Src(ins.o[2]);
        Value* less = sg ? b_.CreateICmpSLT(IntN(a, n), IntN(bb, n)) : b_.CreateICmpULT(IntN(a, n), IntN(bb, n));
        Value* r = ins.op == Op::kMin ? b_.CreateSelect(less, a, bb) : b_.CreateSelect(less, bb, a);
        StoreRow(d, b_.CreateAnd(r, Keep(n)), mask);
        return;
      }
      case Form::kAbsNeg: {  // ExecInt: |SExt(a, n)| and ~a + 1, truncated
        Value* a = Src(ins.o[1]);
        Value* r;
        if (ins.op == Op::kNeg) {
          r = b_.CreateSub(Splat(uint64_t{0}), a);
        } else {
          Value* x = Ext(IntN(a, n), true);
          r = b_.CreateSelect(b_.CreateICmpSLT(x, Splat(uint64_t{0})), b_.CreateSub(Splat(uint64_t{0}), x), x);
        }
        StoreRow(d, b_.CreateAnd(r, Keep(n)), mask);
        return;
      }
      case Form::kFloat: StoreRow(d, Float(ins), mask); return;
      case Form::kCallFloat:
      case Form::kCallCvt: StoreRow(d, Call(form, ins, mask), mask); return;
      case Form::kActivemask:  // Exec: the instruction's lanes
        StoreRow(d, Splat(b_.CreateZExt(b_.CreateBitCast(mask, i32_), i64_)), mask);
        return;
      case Form::kCvt: StoreRow(d, Cvt(ins, Src(ins.o[1])), mask); return;
      default: return;
    }
  }

  // ExecFloat / FEval: f32 with .ftz on the inputs and the result, f64 as it is.
  Value* Float(const Ins& ins) {
    const bool f32 = ins.type == Ty::kF32;
    const int srcs = ins.nops - 1;
    Value* x[3] = {};
    for (int i = 0; i < srcs; ++i) {
      Value* v = Src(ins.o[1 + i]);
      x[i] = f32 ? AsF32(v) : AsF64(v);
      if (f32 && ins.ftz) x[i] = Ftz(x[i]);
    }
    Type* vt = f32 ? static_cast<Type*>(vf_) : static_cast<Type*>(vd_);
    Value* one = llvm::ConstantFP::get(vt, 1.0);
    Value* r = nullptr;
    switch (ins.op) {
      case Op::kAdd: r = b_.CreateFAdd(x[0], x[1]); break;
      case Op::kSub: r = b_.CreateFSub(x[0], x[1]); break;
      case Op::kMul: r = b_.CreateFMul(x[0], x[1]); break;
      case Op::kDiv: r = b_.CreateFDiv(x[0], x[1]); break;
      case Op::kFma:
      case Op::kMad: r = b_.CreateIntrinsic(llvm::Intrinsic::fma, {vt}, {x[0], x[1], x[2]}); break;
      case Op::kAbs: r = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x[0]); break;
      case Op::kNeg: r = b_.CreateFNeg(x[0]); break;
      case Op::kRcp: r = b_.CreateFDiv(one, x[0]); break;
      case Op::kSqrt: r = b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x[0]); break;
      default: r = b_.CreateFDiv(one, b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x[0])); break;  // rsqrt
    }
    if (f32 && ins.ftz) r = Ftz(r);
    return f32 ? FromF32(r) : b_.CreateBitCast(r, v64_);
  }

  // alu.h Convert without .sat: integers through their n-byte values; floats through a double (exact
  // for every f32) rounded to an integer as asked, then saturated (NaN: 0); to f32 rounded to nearest.
  Value* Cvt(const Ins& ins, Value* v) {
    const Ty dt = ins.type, st = ins.type2;
    const int dn = TyBytes(dt), sn = TyBytes(st);
    if (IntType(dt) && IntType(st)) return Ext(IntN(Ext(IntN(v, sn), TySigned(st)), dn), TySigned(dt));
    if (IntType(st)) {  // -> f32 / f64, to nearest
      Value* x = IntN(v, sn);
      Type* ft = dt == Ty::kF32 ? static_cast<Type*>(vf_) : static_cast<Type*>(vd_);
      Value* f = TySigned(st) ? b_.CreateSIToFP(x, ft) : b_.CreateUIToFP(x, ft);
      return dt == Ty::kF32 ? FromF32(f) : b_.CreateBitCast(f, v64_);
    }
    Value* x = st == Ty::kF32 ? b_.CreateFPExt(ins.ftz ? Ftz(AsF32(v)) : AsF32(v), vd_) : AsF64(v);
    auto round = [&](Rnd r) -> Value* {
      switch (r) {
        case Rnd::kRni:
        case Rnd::kRn: return b_.CreateUnaryIntrinsic(llvm::Intrinsic::nearbyint, x);
        case Rnd::kRmi:
        case Rnd::kRm: return b_.CreateUnaryIntrinsic(llvm::Intrinsic::floor, x);
        case Rnd::kRpi:
        case Rnd::kRp: return b_.CreateUnaryIntrinsic(llvm::Intrinsic::ceil, x);
        default: return b_.CreateUnaryIntrinsic(llvm::Intrinsic::trunc, x);
      }
    };
    if (IntType(dt)) {  // the n-byte result, zero-extended (Trunc)
      auto* it = llvm::FixedVectorType::get(b_.getIntNTy(static_cast<unsigned>(8 * dn)), 32);
      Value* i = b_.CreateIntrinsic(TySigned(dt) ? llvm::Intrinsic::fptosi_sat : llvm::Intrinsic::fptoui_sat, {it, vd_},
                                    {round(ins.rnd)});
      return Ext(i, false);
    }
    if (ins.rnd == Rnd::kRni || ins.rnd == Rnd::kRzi || ins.rnd == Rnd::kRmi || ins.rnd == Rnd::kRpi)
      x = round(ins.rnd);
    if (dt == Ty::kF64) return b_.CreateBitCast(x, v64_);
    Value* f = b_.CreateFPTrunc(x, vf_);
    if (ins.ftz) f = Ftz(f);
    return FromF32(f);
  }

  llvm::LLVMContext& c_;
  llvm::Module& m_;
  const Kernel& k_;
  const Code& code_;
  llvm::IRBuilder<> b_;
  Type *i1_, *i8_, *i32_, *i64_, *f32_;
  llvm::FixedVectorType *v64_, *v32_, *vf_, *vd_, *vm_;
  llvm::Function* fn_ = nullptr;
  Value* frame_ = nullptr;
  Value* regs_ = nullptr;
  Value* group_ = nullptr;
  Value *tid_ = nullptr, *special_ = nullptr, *vars_ = nullptr, *spans_ = nullptr;
  Value *shared_ = nullptr, *shared_bytes_ = nullptr, *params_ = nullptr, *param_bytes_ = nullptr;
  Value* lanes_ = nullptr;
  Value* src_slot_ = nullptr;  // 32 lanes' values for shfl's reads across lanes
  Value* call_rows_[4] = {};   // a call's sources and result (Call)
};

std::string ErrorText(llvm::Error e) { return llvm::toString(std::move(e)); }

}  // namespace

namespace {

// Which instructions form traces, and where each can be entered.
std::shared_ptr<Code> Plan(const Kernel& k) {
  auto code = std::make_shared<Code>();
  const auto n = static_cast<uint32_t>(k.code.size());
  code->entry.assign(n, 0);
  code->slot_of.assign(n, kNoSlot);
  // Where a trace must begin: the kernel's start, branch targets, functions' entries.
  std::vector<bool> label(n + 1, false);
  label[0] = true;
  for (const Ins& ins : k.code)
    if (ins.op == Op::kBra && ins.o[0].reg < n) label[ins.o[0].reg] = true;  // Step: o[0].reg is the target
  for (const CallSite& cs : k.calls)
    if (cs.entry < n) label[cs.entry] = true;
  for (uint32_t pc = 0; pc < n;) {
    if (!Translatable(k.code[pc])) {
      ++pc;
      continue;
    }
    Code::Trace& t = code->traces.emplace_back();
    t.begin = pc;
    do {
      const Ins& ins = k.code[pc];
      if (IsMemory(ins) && (ins.space == Space::kGlobal || ins.space == Space::kGeneric))
        code->slot_of[pc] = code->slots++;
      if (pc == t.begin || CanStop(k.code[pc - 1])) code->entry[pc] = static_cast<uint32_t>(code->traces.size());
      ++pc;
    } while (pc < n && !label[pc] && Translatable(k.code[pc]));
    t.end = pc;
    code->translated += t.end - t.begin;
  }
  return code;
}

// Compiles the plan's traces; false with `why` set when LLVM cannot.
bool Compile(const Kernel& k, Code& code, std::string* why) {
  const auto t0 = std::chrono::steady_clock::now();
  static std::once_flag native;
  std::call_once(native, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!jtmb) {
    *why = "LLVM cannot describe this host: " + ErrorText(jtmb.takeError());
    return false;
  }
  auto tm = jtmb->createTargetMachine();
  if (!tm) {
    *why = "LLVM has no code generator for this host: " + ErrorText(tm.takeError());
    return false;
  }
  auto ctx = std::make_unique<llvm::LLVMContext>();
  auto mod = std::make_unique<llvm::Module>("orion_ptx_" + k.name, *ctx);
  mod->setDataLayout((*tm)->createDataLayout());
  mod->setTargetTriple((*tm)->getTargetTriple().str());
  {
    Gen gen(*ctx, *mod, k, code);
    for (size_t i = 0; i < code.traces.size(); ++i)
      gen.Trace(code.traces[i].begin, code.traces[i].end, "trace" + std::to_string(i));
  }
  std::string broken;
  llvm::raw_string_ostream os(broken);
  if (llvm::verifyModule(*mod, &os)) {
    *why = "the translator built invalid IR: " + os.str();
    return false;
  }
  {
    // A short pipeline: the traces are straight-line code already; what pays is promoting the
    // lane count to registers, sharing loads of a register row, and folding the blocks. (LLVM's
    // O2 pipeline took 40% longer for the same speed on ptx_bench.)
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder pb(tm->get());
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    llvm::FunctionPassManager fpm;
    fpm.addPass(llvm::PromotePass());
    fpm.addPass(llvm::EarlyCSEPass(true));
    fpm.addPass(llvm::SimplifyCFGPass());
    for (llvm::Function& f : *mod)
      if (!f.isDeclaration()) fpm.run(f, fam);
  }
  auto jit = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(*jtmb)).create();
  if (!jit) {
    *why = "LLVM's LLJIT: " + ErrorText(jit.takeError());
    return false;
  }
  if (llvm::Error e = (*jit)->addIRModule(llvm::orc::ThreadSafeModule(std::move(mod), std::move(ctx)))) {
    *why = "LLVM's LLJIT: " + ErrorText(std::move(e));
    return false;
  }
  std::vector<TraceFn> fns;
  for (size_t i = 0; i < code.traces.size(); ++i) {
    auto sym = (*jit)->lookup("trace" + std::to_string(i));
    if (!sym) {
      *why = "LLVM's LLJIT: " + ErrorText(sym.takeError());
      return false;
    }
    fns.push_back(reinterpret_cast<TraceFn>(static_cast<uintptr_t>(sym->getAddress())));
  }
  code.engine = std::shared_ptr<llvm::orc::LLJIT>(std::move(*jit));
  for (size_t i = 0; i < fns.size(); ++i) code.traces[i].fn.store(fns[i], std::memory_order_release);
  code.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

void Finish(const Kernel& k, Code& code) {
  std::string why;
  const bool ok = Compile(k, code, &why);
  if (!ok) {
    code.why = why;
    std::fprintf(stderr, "orion ptx: kernel %s runs on the interpreter: %s\n", k.name.c_str(), why.c_str());
  }
  code.state.store(ok ? Code::kReady : Code::kFailed, std::memory_order_release);
  code.state.notify_all();
}

// The process's translator thread: compiles kernels in the order they were first launched, while
// their launches run on the interpreter. A forked child starts its own (its parent's queue is not
// its own: those kernels stay on the interpreter there).
class Translator {
 public:
  void Add(const std::shared_ptr<const Kernel>& k, const std::shared_ptr<Code>& code) {
    std::lock_guard<std::mutex> lock(mu_);
    if (pid_ != getpid()) {
      pid_ = getpid();
      started_ = false;
      queue_.clear();
    }
    queue_.emplace_back(k, code);
    if (!started_) {
      pthread_attr_t attr;
      pthread_attr_init(&attr);
      pthread_attr_setstacksize(&attr, 8 << 20);  // LLVM recurses
      pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
      pthread_t t;
      started_ = pthread_create(
                     &t, &attr,
                     [](void* self) -> void* {
                       static_cast<Translator*>(self)->Loop();
                       return nullptr;
                     },
                     this) == 0;
      pthread_attr_destroy(&attr);
      if (!started_) {  // no thread: compile here
        queue_.pop_back();
        Finish(*k, *code);
        return;
      }
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    const pid_t mine = pid_;
    for (;;) {
      cv_.wait(lock, [&] { return !queue_.empty() || pid_ != mine; });
      if (pid_ != mine) return;
      auto job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      // A kernel unloaded (its module's Program gone) before its turn is not compiled.
      if (std::shared_ptr<const Kernel> k = job.first.lock()) {
        Finish(*k, *job.second);
      } else {
        job.second->why = "unloaded before it was compiled";
        job.second->state.store(Code::kFailed, std::memory_order_release);
        job.second->state.notify_all();
      }
      job = {};
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::weak_ptr<const Kernel>, std::shared_ptr<Code>>> queue_;
  bool started_ = false;
  pid_t pid_ = getpid();
};

Translator& TheTranslator() {
  static Translator* t = new Translator();  // leaked: its thread may outlive static destructors
  return *t;
}

}  // namespace

std::shared_ptr<const Code> Translate(const Kernel& k, std::string* why) {
  std::shared_ptr<Code> code = Plan(k);
  if (code->traces.empty()) {
    code->state = Code::kReady;
    return code;
  }
  if (!Compile(k, *code, why)) return nullptr;
  code->state = Code::kReady;
  return code;
}

static bool Sync() {
  static const bool sync = [] {
    const char* e = std::getenv("ORION_PTX_JIT");
    return e != nullptr && std::strcmp(e, "sync") == 0;
  }();
  return sync;
}

const Code* For(const std::shared_ptr<const Kernel>& k) {
  if (!Enabled()) return nullptr;
  std::call_once(k->jit->once, [&] {
    std::shared_ptr<Code> code = Plan(*k);
    if (code->traces.empty()) return;
    if (code->translated > kMaxTranslated) {
      std::fprintf(stderr, "orion ptx: kernel %s runs on the interpreter: %u instructions to translate (at most %u)\n",
                   k->name.c_str(), code->translated, kMaxTranslated);
      return;
    }
    code->threshold = uint64_t{code->translated} * kWarpInstructionsPerTranslated;
    k->jit->code = code;
    if (Sync()) {
      code->queued = true;
      Finish(*k, *code);
    }
  });
  return k->jit->code.get();
}

void Start(const std::shared_ptr<const Kernel>& k) {
  const std::shared_ptr<Code>& code = k->jit->code;
  if (code == nullptr || code->queued.exchange(true)) return;
  TheTranslator().Add(k, code);
}

void Ran(const std::shared_ptr<const Kernel>& k, uint64_t warp_instructions) {
  const std::shared_ptr<Code>& code = k->jit->code;
  if (code == nullptr || code->queued.load(std::memory_order_relaxed)) return;
  if (code->work.fetch_add(warp_instructions, std::memory_order_relaxed) + warp_instructions >= code->threshold)
    Start(k);
}

}  // namespace orion::ptx::jit
