// The executor's instruction units without a parse or a launch: instructions are decoded from
// their opcode text alone (decode.h), given their operands by hand, and run by one Block
// (block.h) of 32 threads on test memory. Each lane computes from its %tid.x and stores its result,
// so every lane's value is checked against the PTX ISA's definition of the operation. The units
// without block state (alu.h: Compare, Convert, FEval) are called directly.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "block.h"
#include "decode.h"
#include "fast.h"
#include "jit.h"
#include "test_memory.h"

namespace orion::ptx {
namespace {

Operand R(uint32_t reg) {
  Operand o;
  o.kind = Operand::kReg;
  o.reg = reg;
  return o;
}
Operand Imm(uint64_t v) {
  Operand o;
  o.kind = Operand::kImm;
  o.imm = v;
  return o;
}
Operand F32Imm(float f) {  // a 0f... immediate
  Operand o;
  o.kind = Operand::kImm;
  o.imm_kind = 1;
  o.imm = std::bit_cast<uint32_t>(f);
  return o;
}
Operand SpecialReg(uint32_t id) {  // %tid.x, %ctaid.x, ...
  Operand o;
  o.kind = Operand::kSpecial;
  o.reg = id;
  return o;
}
Operand TidX() { return SpecialReg(kTidX); }
Operand At(uint32_t base_reg) {  // [%rd]
  Operand o;
  o.kind = Operand::kMem;
  o.reg = base_reg;
  return o;
}

// One instruction: its opcode decoded as the parser decodes it, its operands as given.
Ins I(const std::string& opcode, std::vector<Operand> ops) {
  Ins ins;
  std::string why;
  EXPECT_TRUE(detail::Decode(opcode, &ins, &why)) << opcode << ": " << why;
  ins.nops = static_cast<uint8_t>(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) ins.o[i] = ops[i];
  detail::FixImmediates(&ins);
  return ins;
}

// Runs kernel `k` as one block of 32 threads on `mem`, with its translation `jit` when given; the
// lane-instructions it ran. With `fault`, the launch may fail (its fault is returned there).
uint64_t RunBlock(const Kernel& k, TestMemory& mem, const jit::Code* jit = nullptr, exec::Fault* fault = nullptr) {
  LaunchConfig cfg;
  cfg.block[0] = 32;
  std::atomic<bool> stop{false};
  exec::Block block(k, cfg, mem, stop, std::chrono::steady_clock::now() + std::chrono::seconds(10), jit);
  exec::Fault f;
  std::string printed;
  uint64_t warp_ins = 0, lane_ins = 0;
  const uint32_t ctaid[3] = {0, 0, 0};
  const bool ok = block.Run(ctaid, fault != nullptr ? fault : &f, &printed, &warp_ins, &lane_ins);
  if (fault == nullptr) {
    EXPECT_TRUE(ok) << f.message;
  }
  return lane_ins;
}

// Runs `body` in one block of 32 threads, %r0 = %tid.x on entry; each lane then stores the 32-bit
// register `result` at out[tid]. Returns out.
std::vector<uint32_t> Lanes(const std::vector<Ins>& body, uint32_t result) {
  TestMemory mem;
  const uint64_t out = mem.Alloc(32 * 4);
  Kernel k;
  k.name = "alu";
  k.nregs = 64;
  k.code.push_back(I("mov.u32", {R(0), TidX()}));
  k.code.insert(k.code.end(), body.begin(), body.end());
  // %rd60 = out + 4 * tid; st.global.u32 [%rd60], result
  k.code.push_back(I("mul.wide.u32", {R(61), R(0), Imm(4)}));
  k.code.push_back(I("mov.u64", {R(62), Imm(out)}));
  k.code.push_back(I("add.s64", {R(60), R(62), R(61)}));
  k.code.push_back(I("st.global.u32", {At(60), R(result)}));
  k.code.push_back(I("exit", {}));
  EXPECT_EQ(RunBlock(k, mem), 32u * k.code.size());  // every lane ran every instruction
  return mem.Download<uint32_t>(out, 32);
}

TEST(Block, IntegerArithmeticWrapsAsThePtxIsaSays) {
  // %r1 = tid * 0x7fffffff (mul.lo keeps the low 32 bits); %r2 = %r1 + 3; %r3 = mul.hi.s32(%r2, -7)
  const auto got =
      Lanes({I("mul.lo.s32", {R(1), R(0), Imm(0x7fffffff)}), I("add.s32", {R(2), R(1), Imm(3)}),
             I("mul.hi.s32", {R(3), R(2), Imm(static_cast<uint32_t>(-7))}), I("xor.b32", {R(4), R(3), R(2)})},
            4);
  for (uint32_t t = 0; t < 32; ++t) {
    const auto r2 = static_cast<int32_t>(t * 0x7fffffffu + 3u);
    const auto r3 = static_cast<int32_t>((int64_t{r2} * -7) >> 32);
    EXPECT_EQ(got[t], static_cast<uint32_t>(r3) ^ static_cast<uint32_t>(r2)) << "lane " << t;
  }
}

TEST(Block, ShiftsClampTheirCountAndShrSignExtendsOnlySignedTypes) {
  // shl.b32 by tid (counts past 31 give 0); shr.s32 of -256 by tid (sign fill); shr.u32 (zero fill)
  const auto shl = Lanes({I("add.u32", {R(5), R(0), Imm(20)}), I("shl.b32", {R(1), Imm(0x80000001u), R(5)})}, 1);
  const auto sar = Lanes({I("shr.s32", {R(1), Imm(static_cast<uint32_t>(-256)), R(0)})}, 1);
  const auto shr = Lanes({I("shr.u32", {R(1), Imm(0x80000000u), R(0)})}, 1);
  for (uint32_t t = 0; t < 32; ++t) {
    const uint32_t n = t + 20;
    EXPECT_EQ(shl[t], n >= 32 ? 0u : 0x80000001u << n) << t;
    EXPECT_EQ(sar[t], static_cast<uint32_t>(-256 >> t)) << t;
    EXPECT_EQ(shr[t], 0x80000000u >> t) << t;
  }
}

TEST(Block, MinMaxAndBitCountsPerLane) {
  const auto got = Lanes(
      {I("sub.s32", {R(1), R(0), Imm(16)}),  // -16 .. 15
       I("min.s32", {R(2), R(1), Imm(5)}), I("max.s32", {R(3), R(2), Imm(-3)}), I("popc.b32", {R(4), R(0)}),
       I("clz.b32", {R(5), R(0)}), I("add.s32", {R(6), R(3), R(4)}), I("mad.lo.s32", {R(7), R(5), Imm(100), R(6)})},
      7);
  for (uint32_t t = 0; t < 32; ++t) {
    const int32_t v = static_cast<int32_t>(t) - 16;
    const int32_t mm = std::max(std::min(v, 5), -3);
    const int32_t popc = std::popcount(t), clz = std::countl_zero(t);
    EXPECT_EQ(static_cast<int32_t>(got[t]), clz * 100 + mm + popc) << t;
  }
}

TEST(Block, FloatArithmeticRoundsAsAsked) {
  // %f1 = (float)tid; %f2 = %f1 * 0.1 (rn); %f3 = fma.rn(%f2, 3, 1); stored as bits.
  const auto got = Lanes({I("cvt.rn.f32.u32", {R(1), R(0)}), I("mul.rn.f32", {R(2), R(1), F32Imm(0.1f)}),
                          I("fma.rn.f32", {R(3), R(2), F32Imm(3.0f), F32Imm(1.0f)})},
                         3);
  for (uint32_t t = 0; t < 32; ++t) {
    const float want = std::fma(static_cast<float>(t) * 0.1f, 3.0f, 1.0f);
    EXPECT_EQ(got[t], std::bit_cast<uint32_t>(want)) << t;
  }
  // Directed rounding: 1/3 toward zero and toward +inf differ by one ulp.
  const auto rz = Lanes({I("div.rz.f32", {R(1), F32Imm(1.0f), F32Imm(3.0f)})}, 1);
  const auto rp = Lanes({I("div.rp.f32", {R(1), F32Imm(1.0f), F32Imm(3.0f)})}, 1);
  EXPECT_EQ(rp[0], rz[0] + 1);
  EXPECT_LT(std::bit_cast<float>(rz[0]), 1.0f / 3.0f + 1e-7f);
}

TEST(Block, WarpVotesTellAllAnyAndUniformApart) {
  // %r10 = (tid < k); vote.sync.MODE.pred %r11, %r10, 0xffffffff. `uni` is also a branch hint
  // (bra.uni): in a vote it is the mode, "the predicate is the same in every active thread".
  auto vote = [](const char* mode, uint32_t k) {
    return Lanes({I("setp.lt.u32", {R(10), R(0), Imm(k)}),
                  I(std::string("vote.sync.") + mode + ".pred", {R(11), R(10), Imm(0xffffffffu)})},
                 11)[0];
  };
  EXPECT_EQ(vote("uni", 0), 1u);   // false everywhere: uniform
  EXPECT_EQ(vote("uni", 32), 1u);  // true everywhere: uniform
  EXPECT_EQ(vote("uni", 5), 0u);
  EXPECT_EQ(vote("all", 0), 0u);
  EXPECT_EQ(vote("all", 32), 1u);
  EXPECT_EQ(vote("any", 0), 0u);
  EXPECT_EQ(vote("any", 5), 1u);
}

// alu.h's units take the decoded instruction and raw register bits: no block, no lanes.
uint64_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

TEST(Alu, ComparisonsOrderNanAndSignAsThePtxIsaSays) {
  using exec::Compare;
  const uint64_t nan = Bits(std::nanf("")), one = Bits(1.0f), two = Bits(2.0f);
  EXPECT_TRUE(Compare(Cmp::kLt, Ty::kF32, one, two));
  EXPECT_FALSE(Compare(Cmp::kLt, Ty::kF32, nan, two));  // ordered: false with a NaN
  EXPECT_TRUE(Compare(Cmp::kLtu, Ty::kF32, nan, two));  // unordered: true with a NaN
  EXPECT_FALSE(Compare(Cmp::kNe, Ty::kF32, nan, nan));
  EXPECT_TRUE(Compare(Cmp::kNan, Ty::kF32, one, nan));
  EXPECT_TRUE(Compare(Cmp::kNum, Ty::kF32, one, two));
  // 0xffffffff is -1 as .s32 and 4294967295 as .u32; only the low 4 bytes count.
  EXPECT_TRUE(Compare(Cmp::kLt, Ty::kS32, 0xffffffffu, 0));
  EXPECT_FALSE(Compare(Cmp::kLt, Ty::kU32, 0xffffffffu, 0));
  EXPECT_TRUE(Compare(Cmp::kHi, Ty::kU32, 0xffffffffu, 0));
  EXPECT_TRUE(Compare(Cmp::kEq, Ty::kU32, 0x1'00000005ull, 5));
  EXPECT_TRUE(Compare(Cmp::kLt, Ty::kS16, 0x8000, 0x7fff));  // -32768 < 32767
}

TEST(Alu, ConversionsRoundSaturateAndSendNanToZero) {
  auto cvt = [](const char* opcode, uint64_t v) {
    Ins ins;
    std::string why;
    EXPECT_TRUE(detail::Decode(opcode, &ins, &why)) << opcode << ": " << why;
    return exec::Convert(ins, v);
  };
  EXPECT_EQ(cvt("cvt.rzi.s32.f32", Bits(-2.7f)), 0xfffffffeu);  // toward zero: -2
  EXPECT_EQ(cvt("cvt.rmi.s32.f32", Bits(-2.2f)), 0xfffffffdu);  // toward -inf: -3
  EXPECT_EQ(cvt("cvt.rni.s32.f32", Bits(2.5f)), 2u);            // to nearest even
  EXPECT_EQ(cvt("cvt.rzi.s32.f32", Bits(std::nanf(""))), 0u);   // NaN: 0
  EXPECT_EQ(cvt("cvt.rzi.s32.f32", Bits(3e9f)), 0x7fffffffu);   // saturates to INT32_MAX
  EXPECT_EQ(cvt("cvt.rzi.u8.f32", Bits(-1.0f)), 0u);            // and to 0 for an unsigned type
  EXPECT_EQ(cvt("cvt.sat.u8.s32", 0xffffff00u), 0u);            // -256 clamps to 0
  EXPECT_EQ(cvt("cvt.sat.s8.s32", 300), 127u);
  EXPECT_EQ(cvt("cvt.s64.s32", 0xffffffffu), 0xffffffffffffffffull);  // sign-extended
  EXPECT_EQ(cvt("cvt.rn.f16.f32", Bits(1.0f)), 0x3c00u);
  EXPECT_EQ(cvt("cvt.f32.f16", 0xc000u), Bits(-2.0f));
  EXPECT_EQ(cvt("cvt.rn.bf16.f32", Bits(1.0f)), 0x3f80u);
  // 2^24 + 1 is not a float: .rz goes down, .rp up.
  EXPECT_EQ(cvt("cvt.rz.f32.u32", 16777217u), Bits(16777216.0f));
  EXPECT_EQ(cvt("cvt.rp.f32.u32", 16777217u), Bits(16777218.0f));
}

TEST(Alu, FloatOperationsFlushAndSaturateOnRequest) {
  auto eval = [](const char* opcode, uint64_t a, uint64_t b) {
    Ins ins;
    std::string why;
    EXPECT_TRUE(detail::Decode(opcode, &ins, &why)) << opcode << ": " << why;
    return exec::FEval(ins, a, b, 0, [](auto x, auto y, auto) { return x + y; });
  };
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(eval("add.f32", Bits(tiny), Bits(tiny)), Bits(2 * tiny));
  EXPECT_EQ(eval("add.ftz.f32", Bits(tiny), Bits(tiny)), Bits(0.0f));  // subnormal inputs flushed
  EXPECT_EQ(eval("add.sat.f32", Bits(0.75f), Bits(0.5f)), Bits(1.0f));
  EXPECT_EQ(eval("add.sat.f32", Bits(std::nanf("")), Bits(1.0f)), Bits(0.0f));  // .sat: NaN is 0
  // f16x2: each half on its own (1 + 2 = 3 low, -1 + 0.5 = -0.5 high).
  EXPECT_EQ(eval("add.f16x2", 0xbc00'3c00u, 0x3800'4000u), 0xb800'4200u);
}

// ---- the fast paths (block_fast.h) against the general units -------------------------------------

namespace fastdiff {

// Inputs a unit must get right: edges of each width and float class, then pseudo-random values.
std::vector<uint64_t> Inputs(uint64_t seed) {
  const uint64_t edges[] = {0,
                            1,
                            ~uint64_t{0},
                            0x7fffffffu,
                            0x80000000u,
                            0xffffffffu,
                            0x8000000000000000u,
                            0x7fffffffffffffffu,
                            std::bit_cast<uint32_t>(std::numeric_limits<float>::quiet_NaN()),
                            std::bit_cast<uint32_t>(std::numeric_limits<float>::infinity()),
                            std::bit_cast<uint32_t>(-std::numeric_limits<float>::infinity()),
                            std::bit_cast<uint32_t>(std::numeric_limits<float>::denorm_min()),
                            std::bit_cast<uint32_t>(-0.0f),
                            std::bit_cast<uint32_t>(1.5f),
                            31,
                            32,
                            63,
                            64,
                            65};
  std::vector<uint64_t> v(32);
  uint64_t x = seed * 0x9e3779b97f4a7c15u + 1;
  for (size_t l = 0; l < 32; ++l) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
    const uint64_t e = edges[(l + seed) % std::size(edges)];
    v[l] = (l + seed) % 3 == 0 ? e : (l + seed) % 3 == 1 ? (x & 0xffffffffu) : x;
    if ((l + seed) % 5 == 0)
      v[l] = std::bit_cast<uint32_t>(static_cast<float>(static_cast<int64_t>(x % 2001) - 1000) / 7);
  }
  return v;
}

// Runs `op` (destination %r10; its sources among %r1..%r3, which hold `in[0..2]`, and %r4, an
// address of 32 * 8 bytes of global memory holding in[0]) in a block of 32 threads: %r10 starts
// as in[3]. With `odd_only`, a guard predicate leaves the even lanes out. Every instruction is
// marked for its fast path (as Lower marks it) when `fast`, else for none. Returns %r10 per lane.
enum class Path { kGeneral, kFast, kTranslated };
std::vector<uint64_t> Run(Ins op, const std::vector<std::vector<uint64_t>>& in, bool odd_only, Path path) {
  const bool fast = path != Path::kGeneral;
  TestMemory mem;
  const uint64_t out = mem.Alloc(32 * 8);
  std::vector<uint64_t> arrays;
  for (const auto& v : in) arrays.push_back(mem.Upload(v));
  Kernel k;
  k.name = "fastdiff";
  k.nregs = 64;
  k.shared_static = 32 * 8;
  k.code.push_back(I("mov.u32", {R(0), TidX()}));
  k.code.push_back(I("mul.wide.u32", {R(61), R(0), Imm(8)}));
  const uint32_t regs[4] = {1, 2, 3, 10};
  for (size_t i = 0; i < 4; ++i) {
    k.code.push_back(I("mov.u64", {R(62), Imm(arrays[i])}));
    k.code.push_back(I("add.s64", {R(63), R(62), R(61)}));
    k.code.push_back(I("ld.global.u64", {R(regs[i]), At(63)}));
    if (i == 0) k.code.push_back(I("mov.u64", {R(4), R(63)}));
  }
  // Shared memory holds in[1] too, at tid * 8 (%r5).
  k.code.push_back(I("mov.u64", {R(5), R(61)}));
  k.code.push_back(I("st.shared.u64", {At(5), R(2)}));
  k.code.push_back(I("and.b32", {R(20), R(0), Imm(1)}));
  k.code.push_back(I("setp.ne.u32", {R(21), R(20), Imm(0)}));
  if (odd_only) op.pred = 21;
  k.code.push_back(op);
  // A store's bytes come back in %r10 (each lane's 8 bytes at %r4 are its own).
  if (op.op == Op::kSt) k.code.push_back(I("ld.global.u64", {R(10), At(4)}));
  k.code.push_back(I("mov.u64", {R(62), Imm(out)}));
  k.code.push_back(I("add.s64", {R(60), R(62), R(61)}));
  k.code.push_back(I("st.global.u64", {At(60), R(10)}));
  k.code.push_back(I("exit", {}));
  for (Ins& ins : k.code) {
    ins.fast = fast ? FastFormOf(ins) : kFastNone;
    ins.fast_bytes = static_cast<uint8_t>(TyBytes(ins.type));
  }
  std::shared_ptr<const jit::Code> code;
  if (path == Path::kTranslated) {
    std::string why;
    code = jit::Translate(k, &why);
    EXPECT_NE(code, nullptr) << why;
    // The instruction under test is inside a trace (the code around it too: one trace in all).
    EXPECT_TRUE(code != nullptr && code->traces.size() == 1 && code->translated == k.code.size() - 1)
        << OpName(op.op) << " is not translated";
  }
  RunBlock(k, mem, code.get());
  return mem.Download<uint64_t>(out, 32);
}

Operand Not(Operand o) {
  o.neg = true;
  return o;
}

}  // namespace fastdiff

// Every instruction form with a fast path (fast.h), with operands of each kind it takes.
std::vector<Ins> FastForms() {
  using fastdiff::Not;
  std::vector<Ins> ops;
  for (const char* t : {"s32", "u32", "s64", "u64"}) {
    const std::string ty = t;
    for (const char* op : {"add", "sub", "mul.lo"}) ops.push_back(I(op + ("." + ty), {R(10), R(1), R(2)}));
    ops.push_back(I("add." + ty, {R(10), R(1), Imm(0xfffffff7u)}));
    ops.push_back(I("mad.lo." + ty, {R(10), R(1), R(2), R(3)}));
    ops.push_back(I("shr." + ty, {R(10), R(1), R(3)}));
    ops.push_back(I("mov." + ty, {R(10), R(2)}));
    for (const char* cmp : {"eq", "ne", "lt", "le", "gt", "ge"})
      ops.push_back(I(std::string("setp.") + cmp + "." + ty, {R(10), R(1), R(2)}));
    ops.push_back(I("ld.global." + ty, {R(10), At(4)}));
    ops.push_back(I("ld.shared." + ty, {R(10), At(5)}));
  }
  for (const char* cmp : {"lo", "ls", "hi", "hs"}) {
    ops.push_back(I(std::string("setp.") + cmp + ".u32", {R(10), R(1), R(2)}));
    ops.push_back(I(std::string("setp.") + cmp + ".u64", {R(10), R(1), R(2)}));
  }
  for (const char* b : {"b32", "b64"}) {
    const std::string ty = b;
    for (const char* op : {"and", "or", "xor", "shl", "shr"}) ops.push_back(I(op + ("." + ty), {R(10), R(1), R(3)}));
  }
  ops.push_back(I("mul.wide.s32", {R(10), R(1), R(2)}));
  ops.push_back(I("mul.wide.u32", {R(10), R(1), Imm(4)}));
  ops.push_back(I("cvta.to.global.u64", {R(10), R(1)}));
  ops.push_back(I("mov.u32", {R(10), TidX()}));
  for (const char* f : {"add", "sub", "mul", "add.rn", "mul.rn"})
    ops.push_back(I(f + std::string(".f32"), {R(10), R(1), R(2)}));
  ops.push_back(I("fma.rn.f32", {R(10), R(1), R(2), R(3)}));
  ops.push_back(I("mad.rn.f32", {R(10), R(1), R(2), F32Imm(0.25f)}));
  ops.push_back(I("mov.f32", {R(10), F32Imm(-2.5f)}));
  ops.push_back(I("ld.global.f32", {R(10), At(4)}));
  for (const char* cmp : {"eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "geu", "num", "nan"})
    ops.push_back(I(std::string("setp.") + cmp + ".f32", {R(10), R(1), R(2)}));
  for (const char* op : {"and", "or", "xor"}) {
    ops.push_back(I(op + std::string(".pred"), {R(10), R(1), R(2)}));
    ops.push_back(I(op + std::string(".pred"), {R(10), Not(R(1)), R(2)}));
    ops.push_back(I(op + std::string(".pred"), {R(10), R(1), Not(R(2))}));
  }
  ops.push_back(I("st.global.u32", {At(4), R(2)}));  // then %r10 stays in[3]: the store must not fault
  return ops;
}

TEST(Block, FastPathsMeanWhatTheGeneralUnitsMean) {
  using fastdiff::Inputs;
  using fastdiff::Run;
  const std::vector<Ins> ops = FastForms();
  size_t seed = 0, marked = 0;
  for (const Ins& op : ops) {
    marked += FastFormOf(op) != kFastNone;
    ++seed;
    std::vector<std::vector<uint64_t>> in = {Inputs(seed), Inputs(seed + 100), Inputs(seed + 200), Inputs(seed + 300)};
    if (op.type == Ty::kPred) {
      for (auto& v : in)
        for (auto& x : v) x &= 1;
    }
    if (op.op == Op::kShl || op.op == Op::kShr) {
      for (auto& x : in[2]) x %= 70;  // shift counts below, at and past the width
    }
    for (bool odd : {false, true}) {
      const auto fast = Run(op, in, odd, fastdiff::Path::kFast);
      const auto general = Run(op, in, odd, fastdiff::Path::kGeneral);
      for (uint32_t l = 0; l < 32; ++l)
        ASSERT_EQ(fast[l], general[l]) << OpName(op.op) << " (form " << seed << " of the list), lane " << l
                                       << (odd ? ", odd lanes only" : "") << ": in " << std::hex << in[0][l] << " "
                                       << in[1][l] << " " << in[2][l];
    }
  }
  EXPECT_EQ(marked, ops.size()) << "every form listed has a fast path";
}

// ---- the translator (jit.h) against the fast paths -------------------------------------------------

bool Translator();  // whether this build translates (below)

Operand Vec(std::vector<uint32_t> regs) {
  Operand o;
  o.kind = Operand::kVec;
  o.n = static_cast<uint8_t>(regs.size());
  for (size_t i = 0; i < regs.size(); ++i) o.regs[i] = regs[i];
  return o;
}

// Forms the translator runs that have no fast path: it means what the general units mean.
std::vector<Ins> TranslatedForms() {
  using fastdiff::Not;
  std::vector<Ins> ops;
  for (const char* t : {"u16", "b16", "pred", "s8"}) ops.push_back(I(std::string("mov.") + t, {R(10), R(1)}));
  for (const char* t : {"b32", "f64", "u16", "s64"}) {
    ops.push_back(I(std::string("selp.") + t, {R(10), R(1), R(2), R(3)}));
    ops.push_back(I(std::string("selp.") + t, {R(10), R(1), Imm(77), Not(R(3))}));
  }
  for (const char* t : {"s32", "u32", "s64", "u64", "s16", "u16"})
    for (const char* op : {"min", "max"}) ops.push_back(I(op + ("." + std::string(t)), {R(10), R(1), R(2)}));
  for (const char* t : {"s32", "s64", "s16"})
    for (const char* op : {"abs", "neg"}) ops.push_back(I(op + ("." + std::string(t)), {R(10), R(1)}));
  for (const char* f : {"div.rn.f32", "div.full.f32", "div.approx.f32", "div.rn.ftz.f32", "add.ftz.f32", "mul.ftz.f32",
                        "sub.ftz.f32", "add.f64", "sub.f64", "mul.f64", "div.rn.f64"})
    ops.push_back(I(f, {R(10), R(1), R(2)}));
  for (const char* f : {"fma.rn.ftz.f32", "fma.rn.f64", "mad.rn.f64"}) ops.push_back(I(f, {R(10), R(1), R(2), R(3)}));
  for (const char* f :
       {"rcp.rn.f32", "rcp.approx.ftz.f32", "sqrt.rn.f32", "sqrt.approx.f32", "sqrt.approx.ftz.f32", "rsqrt.approx.f32",
        "rsqrt.approx.ftz.f32", "abs.f32", "neg.f32", "abs.ftz.f32", "abs.f64", "neg.f64", "sqrt.rn.f64", "rcp.rn.f64"})
    ops.push_back(I(f, {R(10), R(1)}));
  for (const char* c :
       {"cvt.u32.u64",     "cvt.s64.s32",     "cvt.u64.u32",         "cvt.u16.u32",     "cvt.s32.s16",
        "cvt.s8.s32",      "cvt.u32.u8",      "cvt.s64.u16",         "cvt.rn.f32.s32",  "cvt.rn.f32.u32",
        "cvt.rn.f32.s64",  "cvt.rn.f32.u64",  "cvt.rn.f64.s32",      "cvt.rn.f64.u64",  "cvt.f32.u16",
        "cvt.rzi.s32.f32", "cvt.rni.s32.f32", "cvt.rmi.u32.f32",     "cvt.rpi.s64.f64", "cvt.rzi.u8.f32",
        "cvt.rzi.s16.f64", "cvt.rn.s32.f32",  "cvt.rzi.ftz.s32.f32", "cvt.rzi.u64.f64", "cvt.f64.f32",
        "cvt.ftz.f64.f32", "cvt.rn.f32.f64",  "cvt.rn.ftz.f32.f64",  "cvt.rni.f32.f32", "cvt.rzi.f32.f32",
        "cvt.rmi.f64.f64", "cvt.rni.f64.f32"})
    ops.push_back(I(c, {R(10), R(1)}));
  for (const char* t : {"u8", "s8", "u16", "s16"}) {
    ops.push_back(I(std::string("ld.global.") + t, {R(10), At(4)}));
    ops.push_back(I(std::string("ld.shared.") + t, {R(10), At(5)}));
    ops.push_back(I(std::string("st.global.") + t, {At(4), R(2)}));
  }
  ops.push_back(I("ld.global.v2.u32", {Vec({10, 11}), At(4)}));
  ops.push_back(I("ld.global.v2.s32", {Vec({11, 10}), At(4)}));
  ops.push_back(I("ld.global.v4.u16", {Vec({12, 10, 13, kNoReg}), At(4)}));
  ops.push_back(I("ld.shared.v4.s8", {Vec({12, 13, 10, 14}), At(5)}));
  ops.push_back(I("st.global.v2.u32", {At(4), Vec({2, 3})}));
  ops.push_back(I("st.global.v4.u16", {At(4), Vec({1, 2, kNoReg, 3})}));
  ops.push_back(I("st.shared.u8", {At(5), R(3)}));
  // Warp collectives over the whole warp (the odd-lanes runs: the guard leaves the even ones out).
  for (const char* mode : {"up", "down", "bfly", "idx"}) {
    ops.push_back(I(std::string("shfl.sync.") + mode + ".b32", {R(10), R(1), R(2), R(3), Imm(0xffffffffu)}));
    ops.push_back(I(std::string("shfl.sync.") + mode + ".b32", {R(10), R(1), Imm(1), Imm(0x1f), Imm(0xffffffffu)}));
  }
  Operand pair = R(11);
  pair.n = 1;  // d|p
  ops.push_back(I("shfl.sync.bfly.b32", {pair, R(10), R(1), R(2), R(3), Imm(0xffffffffu)}));
  ops.push_back(I("shfl.sync.up.b32", {pair, R(10), R(1), R(2), Imm(0x81f), Imm(0xffffffffu)}));
  for (const char* mode : {"all", "any", "uni"}) {
    ops.push_back(I(std::string("vote.sync.") + mode + ".pred", {R(10), R(1), Imm(0xffffffffu)}));
    ops.push_back(I(std::string("vote.sync.") + mode + ".pred", {R(10), Not(R(1)), Imm(0xffffffffu)}));
  }
  ops.push_back(I("vote.sync.ballot.b32", {R(10), R(1), Imm(0xffffffffu)}));
  ops.push_back(I("vote.sync.ballot.b32", {R(10), Not(R(2)), Imm(0x0ff00ff0u)}));
  ops.push_back(I("activemask.b32", {R(10)}));
  // Forms a trace calls the interpreter's own per-lane units for (jit.h CallFloat, CallConvert).
  for (const char* f : {"sin.approx.f32", "cos.approx.ftz.f32", "lg2.approx.f32", "ex2.approx.ftz.f32",
                        "tanh.approx.f32", "sin.approx.f64", "ex2.approx.f64"})
    ops.push_back(I(f, {R(10), R(1)}));
  for (const char* f : {"min.f32", "max.f32", "min.ftz.f32", "max.f64", "copysign.f32", "add.sat.f32", "mul.rz.f32",
                        "add.rm.f64", "div.rp.f32", "add.f16", "mul.f16x2", "min.bf16", "max.bf16x2", "add.rn.bf16"})
    ops.push_back(I(f, {R(10), R(1), R(2)}));
  for (const char* f : {"fma.rm.f32", "fma.rn.sat.f32", "fma.rn.f16", "fma.rn.f16x2", "fma.rn.relu.bf16"})
    ops.push_back(I(f, {R(10), R(1), R(2), R(3)}));
  for (const char* c : {"cvt.sat.u8.s32", "cvt.sat.s16.u64", "cvt.rn.f16.f32", "cvt.f32.f16", "cvt.rn.bf16.f32",
                        "cvt.f32.bf16", "cvt.rzi.sat.f32.f32", "cvt.rz.f32.f64", "cvt.rn.sat.f32.f64", "cvt.rm.f32.s32",
                        "cvt.rn.f16.s32", "cvt.rzi.s32.f16", "cvt.f64.f16"})
    ops.push_back(I(c, {R(10), R(1)}));
  return ops;
}

TEST(Block, TranslatedFormsMeanWhatTheGeneralUnitsMean) {
  if (!Translator()) GTEST_SKIP() << "built without LLVM: no translator";
  using fastdiff::Inputs;
  using fastdiff::Run;
  size_t seed = 500;
  for (const Ins& op : TranslatedForms()) {
    ++seed;
    ASSERT_TRUE(jit::Translatable(op)) << OpName(op.op) << "." << TyName(op.type) << " (form " << seed - 500
                                       << " of the list) is not translatable";
    std::vector<std::vector<uint64_t>> in = {Inputs(seed), Inputs(seed + 100), Inputs(seed + 200), Inputs(seed + 300)};
    for (bool odd : {false, true}) {
      const auto translated = Run(op, in, odd, fastdiff::Path::kTranslated);
      const auto general = Run(op, in, odd, fastdiff::Path::kGeneral);
      for (uint32_t l = 0; l < 32; ++l)
        ASSERT_EQ(translated[l], general[l])
            << OpName(op.op) << "." << TyName(op.type) << " (form " << seed - 500 << " of the list), lane " << l
            << (odd ? ", odd lanes only" : "") << ": in " << std::hex << in[0][l] << " " << in[1][l] << " " << in[2][l];
    }
  }
}

bool Translator() {
  std::string why;
  Kernel k;
  k.nregs = 1;
  k.code.push_back(I("mov.u32", {R(0), TidX()}));
  k.code.back().fast = FastFormOf(k.code.back());
  k.code.back().fast_bytes = 4;
  return jit::Translate(k, &why) != nullptr;
}

TEST(Block, TranslatedTracesMeanWhatTheFastPathsMean) {
  if (!Translator()) GTEST_SKIP() << "built without LLVM: no translator";  // jit_none.cpp
  using fastdiff::Inputs;
  using fastdiff::Run;
  std::vector<Ins> ops = FastForms();
  // Special registers a trace reads itself.
  for (uint32_t id : {kTidX, kTidY, kNtidX, kCtaidX, kLaneid, kWarpid, kLanemaskLt, kLanemaskGe, kNctaidX})
    ops.push_back(I("mov.u32", {R(10), SpecialReg(id)}));
  size_t seed = 0;
  for (const Ins& op : ops) {
    ++seed;
    ASSERT_TRUE(jit::Translatable([&] {
      Ins f = op;
      f.fast = FastFormOf(op);
      return f;
    }()))
        << OpName(op.op) << " (form " << seed << " of the list) is not translatable";
    std::vector<std::vector<uint64_t>> in = {Inputs(seed), Inputs(seed + 100), Inputs(seed + 200), Inputs(seed + 300)};
    if (op.type == Ty::kPred) {
      for (auto& v : in)
        for (auto& x : v) x &= 1;
    }
    if (op.op == Op::kShl || op.op == Op::kShr) {
      for (auto& x : in[2]) x %= 70;
    }
    for (bool odd : {false, true}) {
      const auto translated = Run(op, in, odd, fastdiff::Path::kTranslated);
      const auto fast = Run(op, in, odd, fastdiff::Path::kFast);
      for (uint32_t l = 0; l < 32; ++l)
        ASSERT_EQ(translated[l], fast[l])
            << OpName(op.op) << " (form " << seed << " of the list), lane " << l << (odd ? ", odd lanes only" : "")
            << ": in " << std::hex << in[0][l] << " " << in[1][l] << " " << in[2][l];
    }
  }
}

// A load whose lanes fall in two allocations, then outside every allocation: the trace leaves it
// to the general unit, which finds the second allocation, or faults naming the instruction's line.
TEST(Block, ATraceLeavesALoadOutsideItsAllocationToTheUnits) {
  if (!Translator()) GTEST_SKIP() << "built without LLVM: no translator";
  for (bool outside : {false, true}) {
    TestMemory mem;
    std::vector<uint32_t> a(32), b(32);
    for (uint32_t i = 0; i < 32; ++i) a[i] = 1000 + i, b[i] = 2000 + i;
    const uint64_t da = mem.Upload(a), db = outside ? 0x7000'0000'0000ull : mem.Upload(b);
    const uint64_t out = mem.Alloc(32 * 4);
    Kernel k;
    k.name = "two";
    k.nregs = 16;
    k.code = {I("mov.u32", {R(0), TidX()}),
              I("and.b32", {R(1), R(0), Imm(1)}),
              I("setp.ne.u32", {R(2), R(1), Imm(0)}),
              I("mul.wide.u32", {R(3), R(0), Imm(4)}),
              I("add.s64", {R(7), R(3), Imm(da)}),
              I("add.s64", {R(7), R(3), Imm(db)}),  // odd lanes: the other allocation
              I("ld.global.u32", {R(8), At(7)}),
              I("add.u32", {R(9), R(8), Imm(1)}),
              I("add.s64", {R(10), R(3), Imm(out)}),
              I("st.global.u32", {At(10), R(9)}),
              I("exit", {})};
    k.code[5].pred = 2;
    k.code[6].line = 42;
    for (Ins& ins : k.code) {
      ins.fast = FastFormOf(ins);
      ins.fast_bytes = static_cast<uint8_t>(TyBytes(ins.type));
    }
    std::string why;
    const auto code = jit::Translate(k, &why);
    ASSERT_NE(code, nullptr) << why;
    ASSERT_EQ(code->translated, 10u);
    exec::Fault fault;
    const uint64_t lanes = RunBlock(k, mem, code.get(), &fault);
    if (outside) {
      EXPECT_EQ(fault.code, CUDA_ERROR_ILLEGAL_ADDRESS);
      EXPECT_NE(fault.message.find("PTX line 42"), std::string::npos) << fault.message;
      continue;
    }
    EXPECT_EQ(fault.code, CUDA_SUCCESS) << fault.message;
    EXPECT_EQ(lanes, 32u * 10 + 16);  // the predicated add ran on the odd lanes only
    const auto got = mem.Download<uint32_t>(out, 32);
    for (uint32_t l = 0; l < 32; ++l) EXPECT_EQ(got[l], (l % 2 != 0 ? 2001u : 1001u) + l) << "lane " << l;
  }
}

// ---- registers read before written (lower.cpp ReadBeforeWritten) --------------------------------------

Operand Label(uint32_t pc) {
  Operand o;
  o.kind = Operand::kLabel;
  o.reg = pc;
  return o;
}

// Lane l reads %r3 after a branch that skips its write for odd blocks' lanes: the analysis lists %r3
// (and %r5, written under a predicate), not the registers every path writes first; and a block
// that reuses another's registers reads 0 there, not what the earlier block left.
TEST(Block, RegistersReadBeforeWrittenStartAtZeroInEveryBlock) {
  TestMemory mem;
  const uint64_t out = mem.Alloc(2 * 32 * 4);
  Kernel k;
  k.name = "unwritten";
  k.nregs = 16;
  k.code = {I("mov.u32", {R(0), TidX()}),                  // 0
            I("mov.u32", {R(1), SpecialReg(kCtaidX)}),     // 1
            I("setp.ne.u32", {R(2), R(1), Imm(0)}),        // 2
            I("bra", {Label(5)}),                          // 3: @%r2 (block 1) skips the write
            I("add.u32", {R(3), R(0), Imm(100)}),          // 4
            I("mov.u32", {R(5), Imm(7)}),                  // 5: @%r2 only
            I("add.u32", {R(4), R(3), R(5)}),              // 6: reads %r3 and %r5
            I("mad.lo.u32", {R(6), R(1), Imm(32), R(0)}),  // 7
            I("mul.wide.u32", {R(7), R(6), Imm(4)}),       // 8
            I("add.s64", {R(8), R(7), Imm(out)}),          // 9
            I("st.global.u32", {At(8), R(4)}),             // 10
            I("exit", {})};
  k.code[3].pred = 2;
  k.code[5].pred = 2;
  for (Ins& ins : k.code) {
    ins.fast = FastFormOf(ins);
    ins.fast_bytes = static_cast<uint8_t>(TyBytes(ins.type));
  }
  std::vector<uint32_t> regs;
  ASSERT_TRUE(ReadBeforeWritten(k, &regs));
  EXPECT_EQ(regs, (std::vector<uint32_t>{3, 5}));
  k.read_before_known = true;
  k.read_before = regs;
  for (bool translated : {false, true}) {
    std::shared_ptr<const jit::Code> code;
    if (translated) {
      std::string why;
      code = jit::Translate(k, &why);
      if (code == nullptr) GTEST_SKIP() << "built without LLVM: no translator";
    }
    LaunchConfig cfg;
    cfg.block[0] = 32;
    cfg.grid[0] = 2;
    std::atomic<bool> stop{false};
    exec::Block block(k, cfg, mem, stop, std::chrono::steady_clock::now() + std::chrono::seconds(10), code.get());
    exec::Fault fault;
    std::string printed;
    uint64_t warp_ins = 0, lane_ins = 0;
    for (uint32_t b = 0; b < 2; ++b) {  // one Block object, block 0 then block 1, as a worker runs them
      const uint32_t ctaid[3] = {b, 0, 0};
      ASSERT_TRUE(block.Run(ctaid, &fault, &printed, &warp_ins, &lane_ins)) << fault.message;
    }
    const auto got = mem.Download<uint32_t>(out, 64);
    for (uint32_t l = 0; l < 32; ++l) {
      EXPECT_EQ(got[l], l + 100) << "block 0, lane " << l;  // %r3 written, %r5 still 0
      EXPECT_EQ(got[32 + l], 7u) << "block 1, lane " << l << (translated ? " (translated)" : "");
    }
  }
}

TEST(Block, AKernelWithoutRegistersHasNoneToClear) {
  // A kernel that declares no registers (a shared-memory size probe, say): nothing to analyze.
  Kernel k;
  k.nregs = 0;
  k.code = {I("exit", {})};
  std::vector<uint32_t> regs = {7};
  EXPECT_TRUE(ReadBeforeWritten(k, &regs));
  EXPECT_TRUE(regs.empty());
}

}  // namespace
}  // namespace orion::ptx
