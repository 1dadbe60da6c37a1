// Unit tests of the PTX executor: instruction families against values computed on the host, and
// whole nvcc-compiled kernels (tests/data/ptx_kernels.cu, built to PTX at build time).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

#include "half.h"
#include "orion/ptx/ptx.h"
#include "test_memory.h"
#include "../../tests/cuda/divergent_value.h"

namespace orion::ptx {
namespace {

// Packs kernel arguments at their natural alignment (the PTX ABI for scalars).
class Params {
 public:
  template <class T>
  Params& Add(T v) {
    const size_t a = alignof(T);
    buf_.resize((buf_.size() + a - 1) / a * a);
    const size_t at = buf_.size();
    buf_.resize(at + sizeof(T));
    std::memcpy(buf_.data() + at, &v, sizeof(T));
    return *this;
  }
  const uint8_t* data() const { return buf_.data(); }
  uint32_t size() const { return static_cast<uint32_t>(buf_.size()); }

 private:
  std::vector<uint8_t> buf_;
};

struct Runner {
  std::shared_ptr<Program> prog;
  std::vector<uint64_t> vars;
  LaunchResult Go(TestMemory& mem, const std::string& kernel, std::array<uint32_t, 3> grid,
                  std::array<uint32_t, 3> block, const Params& p, uint32_t smem = 0, std::string* out = nullptr,
                  uint32_t workers = 1, uint64_t timeout_ms = 0) {
    if (vars.empty()) {
      for (const ModuleVar& v : Vars(*prog)) {
        const uint64_t a = mem.Alloc(std::max<uint64_t>(v.size, 1));
        vars.push_back(a);
        GlobalMemory::Span s;
        mem.Find(a, &s);
        std::memcpy(s.host, v.init.data(), std::min<size_t>(v.init.size(), v.size));
      }
    }
    LaunchConfig cfg;
    std::copy(grid.begin(), grid.end(), cfg.grid);
    std::copy(block.begin(), block.end(), cfg.block);
    cfg.dynamic_smem = smem;
    cfg.params = p.data();
    cfg.param_bytes = p.size();
    cfg.var_addrs = vars.data();
    cfg.printf_out = out;
    cfg.workers = workers;
    cfg.timeout_ms = timeout_ms;
    return Launch(*prog, kernel, cfg, mem);
  }
};

Runner MustParse(const std::string& text) {
  auto p = Parse(text);
  EXPECT_TRUE(p.ok()) << p.status().message();
  if (!p.ok()) std::abort();
  return Runner{*p, {}};
}

// A kernel `k(u64 out, u64 in)` whose body is `body`, run with one block of `threads`.
std::string Wrap(const std::string& regs, const std::string& body) {
  return ".version 8.0\n.target sm_75\n.address_size 64\n"
         ".visible .entry k(.param .u64 k_out, .param .u64 k_in)\n{\n"
         ".reg .pred %p<8>;\n.reg .b16 %rs<16>;\n.reg .b32 %r<32>;\n.reg .b64 %rd<32>;\n.reg .f32 %f<16>;\n"
         ".reg .f64 %fd<16>;\n" +
         regs +
         "ld.param.u64 %rd1, [k_out];\ncvta.to.global.u64 %rd1, %rd1;\n"
         "ld.param.u64 %rd2, [k_in];\ncvta.to.global.u64 %rd2, %rd2;\n"
         "mov.u32 %r1, %tid.x;\nmul.wide.u32 %rd3, %r1, 8;\nadd.s64 %rd4, %rd1, %rd3;\nadd.s64 %rd5, %rd2, %rd3;\n" +
         body + "\nret;\n}\n";
}

// Runs `body` on 32 threads; input i = in[i] (u64 each); returns out[0..31] (u64 each).
std::vector<uint64_t> Lanes32(const std::string& body, const std::vector<uint64_t>& in, LaunchResult* res = nullptr) {
  TestMemory mem;
  Runner r = MustParse(Wrap("", body));
  const uint64_t out = mem.Alloc(32 * 8);
  const uint64_t inp = mem.Upload(in);
  Params p;
  p.Add(out).Add(inp);
  LaunchResult lr = r.Go(mem, "k", {1, 1, 1}, {32, 1, 1}, p);
  if (res != nullptr) *res = lr;
  EXPECT_EQ(lr.code, CUDA_SUCCESS) << lr.message;
  return mem.Download<uint64_t>(out, 32);
}

std::vector<uint64_t> Iota(uint64_t mul = 1, int64_t add = 0) {
  std::vector<uint64_t> v(32);
  for (uint64_t i = 0; i < 32; ++i) v[i] = i * mul + static_cast<uint64_t>(add);
  return v;
}

uint64_t FBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float BitsF(uint64_t b) {
  uint32_t u = static_cast<uint32_t>(b);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint64_t DBits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
double BitsD(uint64_t b) {
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}

TEST(PtxInt, AddSubMulMadShift) {
  auto in = Iota(3, -40);
  auto out = Lanes32(R"(ld.global.u32 %r2, [%rd5];
    mul.lo.s32 %r3, %r2, -7; add.s32 %r3, %r3, %r1; sub.s32 %r3, %r3, 5; mad.lo.s32 %r3, %r3, %r2, 11;
    shl.b32 %r4, %r3, 3; shr.s32 %r5, %r4, 2; shr.u32 %r6, %r4, 28; xor.b32 %r5, %r5, %r6;
    cvt.s64.s32 %rd6, %r5; st.global.u64 [%rd4], %rd6;)",
                     in);
  for (int i = 0; i < 32; ++i) {
    const int32_t x = static_cast<int32_t>(in[i]);
    int32_t r = x * -7 + i - 5;
    r = r * x + 11;
    const uint32_t s = static_cast<uint32_t>(r) << 3;
    const int32_t e = (static_cast<int32_t>(s) >> 2) ^ static_cast<int32_t>(s >> 28);
    EXPECT_EQ(static_cast<int64_t>(out[i]), e) << i;
  }
}

TEST(PtxInt, WideHiDivRemMinMax) {
  auto in = Iota(0x10000001, -5);
  auto out = Lanes32(R"(ld.global.u32 %r2, [%rd5]; add.u32 %r3, %r1, 3;
    mul.wide.s32 %rd6, %r2, %r2; mul.hi.u32 %r4, %r2, 0x9e3779b9; div.s32 %r5, %r2, %r3; rem.u32 %r6, %r2, %r3;
    min.s32 %r7, %r2, %r1; max.u32 %r8, %r2, 100; add.s32 %r4, %r4, %r5; add.s32 %r4, %r4, %r6;
    add.s32 %r4, %r4, %r7; add.s32 %r4, %r4, %r8; cvt.u64.u32 %rd7, %r4; add.s64 %rd6, %rd6, %rd7;
    st.global.u64 [%rd4], %rd6;)",
                     in);
  for (int i = 0; i < 32; ++i) {
    const uint32_t u = static_cast<uint32_t>(in[i]);
    const int32_t s = static_cast<int32_t>(u);
    const uint32_t d = static_cast<uint32_t>(i + 3);
    uint32_t r = static_cast<uint32_t>((uint64_t{u} * 0x9e3779b9u) >> 32);
    r += static_cast<uint32_t>(s / static_cast<int32_t>(d));
    r += u % d;
    r += static_cast<uint32_t>(std::min(s, i));
    r += std::max(u, 100u);
    EXPECT_EQ(out[i], static_cast<uint64_t>(int64_t{s} * s) + r) << i;
  }
}

TEST(PtxInt, BitOpsValues) {
  auto in = Iota(0x01234567, 0x89);
  auto out = Lanes32(R"(ld.global.u32 %r2, [%rd5];
    popc.b32 %r3, %r2; clz.b32 %r4, %r2; brev.b32 %r5, %r2; bfe.u32 %r6, %r2, 4, 8; bfe.s32 %r7, %r2, 8, 5;
    bfi.b32 %r8, %r1, %r2, 12, 5; prmt.b32 %r9, %r2, %r1, 0x3715; bfind.u32 %r10, %r2;
    shf.l.wrap.b32 %r11, %r2, %r1, 13; shf.r.clamp.b32 %r12, %r1, %r2, 40; lop3.b32 %r13, %r2, %r1, %r5, 0x96;
    add.s32 %r3, %r3, %r4; xor.b32 %r3, %r3, %r5; add.s32 %r3, %r3, %r6; xor.b32 %r3, %r3, %r7;
    add.s32 %r3, %r3, %r8; xor.b32 %r3, %r3, %r9; add.s32 %r3, %r3, %r10; xor.b32 %r3, %r3, %r11;
    add.s32 %r3, %r3, %r12; xor.b32 %r3, %r3, %r13;
    cvt.u64.u32 %rd6, %r3; st.global.u64 [%rd4], %rd6;)",
                     in);
  for (uint32_t i = 0; i < 32; ++i) {
    const uint32_t a = static_cast<uint32_t>(in[i]);
    uint32_t brev = 0;
    for (int b = 0; b < 32; ++b) brev |= ((a >> b) & 1u) << (31 - b);
    const uint32_t bfe_u = (a >> 4) & 0xff;
    int32_t bfe_s = static_cast<int32_t>((a >> 8) & 0x1f);
    if (bfe_s & 0x10) bfe_s |= ~0x1f;
    const uint32_t bfi = (a & ~(0x1fu << 12)) | ((i & 0x1f) << 12);
    const uint64_t src = (uint64_t{i} << 32) | a;
    uint32_t prmt = 0;
    const uint32_t sel = 0x3715;
    for (int b = 0; b < 4; ++b) {
      const uint32_t s = (sel >> (4 * b)) & 0xf;
      uint32_t v = static_cast<uint32_t>((src >> (8 * (s & 7))) & 0xff);
      if (s & 8) v = (v & 0x80) ? 0xff : 0;
      prmt |= v << (8 * b);
    }
    const uint32_t bfind = a == 0 ? 0xffffffffu : 31u - static_cast<uint32_t>(__builtin_clz(a));
    const uint32_t shfl = static_cast<uint32_t>(((uint64_t{i} << 32 | a) << 13) >> 32);
    const uint32_t shfr = 0;  // clamp: shift by 32 of {a:i} >> 32 -> a ... checked below
    (void)shfr;
    const uint32_t shfr2 = static_cast<uint32_t>((uint64_t{a} << 32 | i) >> 32);
    const uint32_t lop = a ^ i ^ brev;
    uint32_t r = static_cast<uint32_t>(__builtin_popcount(a)) + static_cast<uint32_t>(a ? __builtin_clz(a) : 32);
    r ^= brev;
    r += bfe_u;
    r ^= static_cast<uint32_t>(bfe_s);
    r += bfi;
    r ^= prmt;
    r += bfind;
    r ^= shfl;
    r += shfr2;
    r ^= lop;
    EXPECT_EQ(out[i], r) << i;
  }
}

TEST(PtxInt, CarryChain) {
  // 64-bit add out of 32-bit halves with add.cc/addc.
  auto in = Iota(0x7fffffff3ull, 0xfffffff0ull);
  auto out = Lanes32(R"(ld.global.u64 %rd6, [%rd5]; mov.b64 {%r2, %r3}, %rd6;
    add.cc.u32 %r4, %r2, %r2; addc.u32 %r5, %r3, %r3; mov.b64 %rd7, {%r4, %r5};
    sub.cc.u32 %r6, %r4, 0xffffffff; subc.u32 %r7, %r5, 0; mov.b64 %rd8, {%r6, %r7};
    xor.b64 %rd7, %rd7, %rd8; st.global.u64 [%rd4], %rd7;)",
                     in);
  for (int i = 0; i < 32; ++i) {
    const uint64_t s = in[i] + in[i];
    EXPECT_EQ(out[i], s ^ (s - 0xffffffffull)) << i;
  }
}

TEST(PtxFloat, ArithmeticAndMath) {
  std::vector<uint64_t> in(32);
  for (int i = 0; i < 32; ++i) in[i] = FBits(0.37f * static_cast<float>(i) - 3.1f);
  auto out = Lanes32(R"(ld.global.f32 %f1, [%rd5]; mul.rn.f32 %f2, %f1, 0f40490FDB; add.f32 %f2, %f2, 0f3F800000;
    fma.rn.f32 %f3, %f1, %f2, 0fBF000000; div.rn.f32 %f4, %f3, %f2; sqrt.rn.f32 %f5, %f2; abs.f32 %f5, %f5;
    max.f32 %f6, %f4, %f5; min.f32 %f7, %f4, %f5; sub.f32 %f8, %f6, %f7; neg.f32 %f8, %f8;
    cvt.rzi.s32.f32 %r2, %f3; cvt.rn.f32.s32 %f9, %r2; add.f32 %f8, %f8, %f9;
    mov.b32 %r3, %f8; cvt.u64.u32 %rd6, %r3; st.global.u64 [%rd4], %rd6;)",
                     in);
  for (int i = 0; i < 32; ++i) {
    const float x = BitsF(in[i]);
    float f2 = x * 3.14159274101257324f;
    f2 = f2 + 1.0f;
    const float f3 = std::fma(x, f2, -0.5f);
    const float f4 = f3 / f2;
    const float f5 = std::fabs(std::sqrt(f2));
    float f8 = -(std::fmax(f4, f5) - std::fmin(f4, f5));
    f8 = f8 + static_cast<float>(static_cast<int32_t>(std::trunc(f3)));
    const float got = BitsF(out[i]);
    if (std::isnan(f8))
      EXPECT_TRUE(std::isnan(got)) << i;
    else
      EXPECT_EQ(got, f8) << i;
  }
}

TEST(PtxFloat, DoubleAndConversions) {
  std::vector<uint64_t> in(32);
  for (int i = 0; i < 32; ++i) in[i] = DBits(1.0 / (i + 1) - 0.25 * i);
  auto out = Lanes32(R"(ld.global.f64 %fd1, [%rd5]; mul.f64 %fd2, %fd1, 0d400921FB54442D18;
    fma.rn.f64 %fd3, %fd2, %fd1, %fd1; sqrt.rn.f64 %fd4, %fd3; abs.f64 %fd5, %fd2; add.f64 %fd5, %fd5, %fd4;
    cvt.rn.f32.f64 %f1, %fd5; cvt.f64.f32 %fd6, %f1; sub.f64 %fd7, %fd5, %fd6;
    cvt.rni.s64.f64 %rd6, %fd2; cvt.rn.f64.s64 %fd8, %rd6; add.f64 %fd7, %fd7, %fd8;
    st.global.f64 [%rd4], %fd7;)",
                     in);
  for (int i = 0; i < 32; ++i) {
    const double x = BitsD(in[i]);
    const double f2 = x * 3.141592653589793;
    const double f3 = std::fma(f2, x, x);
    const double f4 = std::sqrt(f3);
    const double f5 = std::fabs(f2) + f4;
    const double f6 = static_cast<double>(static_cast<float>(f5));
    const double e = (f5 - f6) + static_cast<double>(static_cast<int64_t>(std::nearbyint(f2)));
    const double got = BitsD(out[i]);
    if (std::isnan(e))
      EXPECT_TRUE(std::isnan(got)) << i;
    else
      EXPECT_EQ(got, e) << i;
  }
}

// A float rounded to half and back: by the compiler's own half type where it has one (GCC on
// x86-64), so the executor's portable conversions (half.h) are checked against an independent one.
#if defined(__GNUC__) && !defined(__clang__)
#define ORION_HAVE_FLOAT16 1
float RoundHalf(float x) { return static_cast<float>(static_cast<_Float16>(x)); }
#else
float RoundHalf(float x) { return HalfToFloat(FloatToHalf(x)); }
#endif

#ifdef ORION_HAVE_FLOAT16
TEST(PtxFloat, HalfConversionsMatchTheCompilersHalfType) {
  auto same = [](float a, float b) {
    return std::isnan(a) ? std::isnan(b) : std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
  };
  // Every half to float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float want = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h)));
    ASSERT_TRUE(same(HalfToFloat(static_cast<uint16_t>(h)), want)) << std::hex << h;
  }
  // Floats to half: every midpoint between neighbouring halves (the ties) and the floats beside
  // it, then a sweep over all float bit patterns.
  uint64_t checked = 0;
  auto check = [&](uint32_t bits) {
    const float f = std::bit_cast<float>(bits);
    const uint16_t want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    const uint16_t got = FloatToHalf(f);
    if (std::isnan(f)) {
      ASSERT_TRUE((got & 0x7c00u) == 0x7c00u && (got & 0x3ffu) != 0) << std::hex << bits;
    } else {
      ASSERT_EQ(got, want) << std::hex << bits;
    }
    ++checked;
  };
  // In each rounding mode (the executor's .rn/.rz/.rm/.rp conversions run under it).
  for (int mode : {FE_TONEAREST, FE_TOWARDZERO, FE_UPWARD, FE_DOWNWARD}) {
    SCOPED_TRACE(mode);
    for (uint32_t h = 0; h < 0x7bff; ++h) {
      const float lo = HalfToFloat(static_cast<uint16_t>(h)), hi = HalfToFloat(static_cast<uint16_t>(h + 1));
      const uint32_t mid = std::bit_cast<uint32_t>((lo + hi) / 2);  // exact in float
      ASSERT_EQ(std::fesetround(mode), 0);
      for (uint32_t b : {mid - 1, mid, mid + 1}) {
        check(b);
        check(b | 0x80000000u);
      }
      std::fesetround(FE_TONEAREST);
    }
    ASSERT_EQ(std::fesetround(mode), 0);
    for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4099) check(static_cast<uint32_t>(b));
    for (uint32_t b : {0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u, 0x7f7fffffu, 0x7f800000u,
                       0x33000000u, 0x33000001u, 0x32ffffffu, 0x00000001u, 0x387fc000u, 0x387fe000u}) {
      check(b);
      check(b | 0x80000000u);
    }
    std::fesetround(FE_TONEAREST);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(checked, 4000000u);
}
#endif

TEST(PtxFloat, HalfPrecision) {
  std::vector<uint64_t> in(32);
  for (int i = 0; i < 32; ++i) in[i] = FBits(0.5f * static_cast<float>(i) - 4.0f);
  auto out = Lanes32(R"(ld.global.f32 %f1, [%rd5]; cvt.rn.f16.f32 %rs1, %f1; add.f16 %rs2, %rs1, %rs1;
    mul.f16 %rs3, %rs2, %rs1; fma.rn.f16 %rs4, %rs3, %rs1, %rs2; mov.b32 %r2, {%rs4, %rs1};
    add.f16x2 %r3, %r2, %r2; mov.b32 {%rs5, %rs6}, %r3; cvt.f32.f16 %f2, %rs5; cvt.f32.f16 %f3, %rs6;
    add.f32 %f4, %f2, %f3; mov.b32 %r4, %f4; cvt.u64.u32 %rd6, %r4; st.global.u64 [%rd4], %rd6;)",
                     in);
  for (int i = 0; i < 32; ++i) {
    const float a = RoundHalf(BitsF(in[i]));
    const float b = RoundHalf(a + a);
    const float c = RoundHalf(b * a);
    const float d = RoundHalf(std::fma(c, a, b));
    const float lo = RoundHalf(d * 2);
    const float hi = RoundHalf(a * 2);
    EXPECT_EQ(BitsF(out[i]), lo + hi) << i;
  }
}

TEST(PtxControl, DivergenceAndReconvergence) {
  // Odd lanes loop i times, even lanes take another path; then all vote.
  auto out = Lanes32(R"(and.b32 %r2, %r1, 1; setp.eq.s32 %p1, %r2, 0; mov.u32 %r3, 0;
    @%p1 bra EVEN; mov.u32 %r4, 0;
  LOOP: add.s32 %r3, %r3, %r4; add.s32 %r4, %r4, 1; setp.le.u32 %p2, %r4, %r1; @%p2 bra LOOP;
    bra.uni JOIN;
  EVEN: mul.lo.s32 %r3, %r1, 100;
  JOIN: activemask.b32 %r5; vote.sync.ballot.b32 %r6, %p1, 0xffffffff;
    cvt.u64.u32 %rd6, %r3; cvt.u64.u32 %rd7, %r5; shl.b64 %rd7, %rd7, 32; or.b64 %rd6, %rd6, %rd7;
    cvt.u64.u32 %rd8, %r6; xor.b64 %rd6, %rd6, %rd8; st.global.u64 [%rd4], %rd6;)",
                     Iota());
  for (uint64_t i = 0; i < 32; ++i) {
    const uint64_t v = (i % 2 == 0) ? i * 100 : i * (i + 1) / 2;
    EXPECT_EQ(out[i], (v | (uint64_t{0xffffffff} << 32)) ^ 0x55555555u) << i;
  }
}

TEST(PtxWarp, Shuffles) {
  auto out = Lanes32(R"(mul.lo.s32 %r2, %r1, 3;
    shfl.sync.down.b32 %r3, %r2, 5, 31, 0xffffffff; shfl.sync.up.b32 %r4|%p1, %r2, 3, 0, 0xffffffff;
    shfl.sync.bfly.b32 %r5, %r2, 7, 31, 0xffffffff; shfl.sync.idx.b32 %r6, %r2, 9, 0x1f, 0xffffffff;
    selp.u32 %r7, 1000, 0, %p1;
    add.s32 %r3, %r3, %r4; mul.lo.s32 %r3, %r3, 1000; add.s32 %r3, %r3, %r5; mul.lo.s32 %r3, %r3, 7;
    add.s32 %r3, %r3, %r6; add.s32 %r3, %r3, %r7;
    cvt.u64.u32 %rd6, %r3; st.global.u64 [%rd4], %rd6;)",
                     Iota());
  for (uint32_t i = 0; i < 32; ++i) {
    const uint32_t down = i + 5 <= 31 ? (i + 5) * 3 : i * 3;
    const uint32_t up = i >= 3 ? (i - 3) * 3 : i * 3;
    const uint32_t bfly = (i ^ 7) * 3;
    const uint32_t idx = 9 * 3;
    EXPECT_EQ(out[i], ((down + up) * 1000 + bfly) * 7 + idx + (i >= 3 ? 1000 : 0)) << i;
  }
}

TEST(PtxMemory, OutOfBoundsIsAnErrorNotACrash) {
  LaunchResult r;
  TestMemory mem;
  Runner run = MustParse(Wrap("", "add.s64 %rd9, %rd4, 256; st.global.u64 [%rd9], %rd3;"));
  const uint64_t out = mem.Alloc(32 * 8);
  Params p;
  p.Add(out).Add(out);
  r = run.Go(mem, "k", {1, 1, 1}, {32, 1, 1}, p);
  EXPECT_EQ(r.code, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_NE(r.message.find("outside the session's memory"), std::string::npos) << r.message;
  // Misaligned.
  Runner run2 = MustParse(Wrap("", "add.s64 %rd9, %rd4, 4; st.global.u64 [%rd9], %rd3;"));
  r = run2.Go(mem, "k", {1, 1, 1}, {32, 1, 1}, p);
  EXPECT_EQ(r.code, CUDA_ERROR_MISALIGNED_ADDRESS) << r.message;
  // A host pointer value (what a buggy kernel might write through) is never dereferenced.
  Runner run3 = MustParse(Wrap("", "mov.u64 %rd9, 0x7fff00001000; st.global.u64 [%rd9], %rd3;"));
  r = run3.Go(mem, "k", {1, 1, 1}, {32, 1, 1}, p);
  EXPECT_EQ(r.code, CUDA_ERROR_ILLEGAL_ADDRESS);
}

TEST(PtxMemory, ParamLoadsNeedOnlyTheParamAlignment) {
  // A u64 at offset 4 of an `.align 4` byte-array parameter (as NVVM emits for cuBLAS's structs).
  const std::string text =
      ".version 8.0\n.target sm_75\n.address_size 64\n"
      ".visible .entry k(.param .align 4 .b8 k_s[12], .param .u64 k_out)\n{\n"
      ".reg .b64 %rd<4>;\nld.param.u64 %rd1, [k_s+4];\nld.param.u64 %rd2, [k_out];\n"
      "cvta.to.global.u64 %rd2, %rd2;\nst.global.u64 [%rd2], %rd1;\nret;\n}\n";
  TestMemory mem;
  Runner run = MustParse(text);
  const uint64_t out = mem.Alloc(8);
  std::vector<uint8_t> params(24, 0);
  const uint64_t v = 0x1122334455667788ull;
  std::memcpy(params.data() + 4, &v, 8);
  std::memcpy(params.data() + 16, &out, 8);
  LaunchConfig cfg;
  cfg.params = params.data();
  cfg.param_bytes = 24;
  auto r = Launch(*run.prog, "k", cfg, mem);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  EXPECT_EQ(mem.Download<uint64_t>(out, 1)[0], v);
}

TEST(PtxMemory, PtrAlignIsThePointeesNotTheParameters) {
  // `.ptr .align 1` must not pack the next parameter at offset 9 (cuBLAS's reduce kernels).
  const std::string text =
      ".version 8.0\n.target sm_75\n.address_size 64\n"
      ".visible .entry k(.param .u64 .ptr .align 1 k_out, .param .f32 k_v, .param .u64 k_w)\n{\n"
      ".reg .b64 %rd<4>;\n.reg .f32 %f<2>;\nld.param.u64 %rd1, [k_out];\nld.param.f32 %f1, [k_v];\n"
      "ld.param.u64 %rd2, [k_w];\nst.global.f32 [%rd1], %f1;\nst.global.u64 [%rd1+8], %rd2;\nret;\n}\n";
  TestMemory mem;
  Runner run = MustParse(text);
  const uint64_t out = mem.Alloc(16);
  Params p;
  p.Add(out).Add(2.5f).Add(uint64_t{77});
  auto r = run.Go(mem, "k", {1, 1, 1}, {1, 1, 1}, p);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  EXPECT_EQ(mem.Download<float>(out, 1)[0], 2.5f);
  EXPECT_EQ(mem.Download<uint64_t>(out, 2)[1], 77u);
}

TEST(PtxErrors, BlockLargerThanMaxntidIsRefused) {
  const std::string text =
      ".version 8.0\n.target sm_75\n.address_size 64\n"
      ".visible .entry k() .maxntid 128, 1, 1\n{\nret;\n}\n";
  TestMemory mem;
  Runner run = MustParse(text);
  Params p;
  EXPECT_EQ(run.Go(mem, "k", {1, 1, 1}, {128, 1, 1}, p).code, CUDA_SUCCESS);
  auto r = run.Go(mem, "k", {1, 1, 1}, {256, 1, 1}, p);
  EXPECT_EQ(r.code, CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(r.message.find(".maxntid"), std::string::npos) << r.message;
}

TEST(PtxErrors, UnsupportedInstructionIsNamed) {
  TestMemory mem;
  Runner run = MustParse(Wrap("", "tld4.r.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6}];"));
  Params p;
  p.Add(uint64_t{0}).Add(uint64_t{0});
  auto r = run.Go(mem, "k", {1, 1, 1}, {1, 1, 1}, p);
  EXPECT_EQ(r.code, CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_NE(r.message.find("tld4.r.2d"), std::string::npos) << r.message;
}

TEST(PtxErrors, TimeoutEndsARunawayKernel) {
  TestMemory mem;
  Runner run = MustParse(Wrap("", "SPIN: bra.uni SPIN;"));
  Params p;
  p.Add(uint64_t{0}).Add(uint64_t{0});
  auto r = run.Go(mem, "k", {1, 1, 1}, {32, 1, 1}, p, 0, nullptr, 1, 200);
  EXPECT_EQ(r.code, CUDA_ERROR_LAUNCH_TIMEOUT) << r.message;
}

// ---- the front end: forms real compilers emit ----

TEST(PtxFrontEnd, WarpSzIsThePredefinedConstant32) {
  // nvcc writes `warpSize` as the predefined identifier WARP_SZ (cuda-samples reduction, shfl_scan).
  auto out = Lanes32(
      "mul.lo.u32 %r3, %r1, WARP_SZ;\nadd.u32 %r3, %r3, WARP_SZ;\ncvt.u64.u32 %rd6, %r3;\n"
      "st.global.u64 [%rd4], %rd6;",
      Iota());
  ASSERT_EQ(out.size(), 32u);
  for (uint64_t i = 0; i < 32; ++i) EXPECT_EQ(out[i], i * 32 + 32) << i;
}

TEST(PtxFrontEnd, DirectiveGluedToItsTypeIsTwoTokens) {
  // cuda_fp16.hpp's inline asm writes `{.reg.b16 lo, hi; ...}` with no space after `.reg`.
  auto out = Lanes32(
      "{\n.reg.b16 lo, hi;\n.reg.b32 t;\nmov.b32 {lo, hi}, %r1;\nadd.u32 t, %r1, 7;\n"
      "cvt.u32.u16 %r4, lo;\nadd.u32 %r4, %r4, t;\ncvt.u64.u32 %rd6, %r4;\n}\n"
      "st.global.u64 [%rd4], %rd6;",
      Iota());
  ASSERT_EQ(out.size(), 32u);
  for (uint64_t i = 0; i < 32; ++i) EXPECT_EQ(out[i], i + i + 7) << i;
}

TEST(PtxFrontEnd, VersionIsReadAndComparedWithTheDriversIsa) {
  EXPECT_EQ(PtxIsaVersion("//\n.version 8.5\n.target sm_90\n"), 805u);
  EXPECT_EQ(PtxIsaVersion(".version 9.0\n"), 900u);
  EXPECT_EQ(PtxIsaVersion(".version 10.12\n"), 1012u);
  EXPECT_EQ(PtxIsaVersion(".target sm_90\n"), 0u);         // no .version: nothing to compare
  EXPECT_EQ(PtxIsaVersion(".version 936424714.0\n"), 0u);  // not a version
  // PTX ISA release notes: CUDA 12.0 brought PTX 8.0, 12.8 8.7, 13.0 9.0, 13.1 9.1.
  EXPECT_EQ(MaxPtxIsaVersion(12000), 800u);
  EXPECT_EQ(MaxPtxIsaVersion(12060), 805u);
  EXPECT_EQ(MaxPtxIsaVersion(12080), 807u);
  EXPECT_EQ(MaxPtxIsaVersion(13000), 900u);
  EXPECT_EQ(MaxPtxIsaVersion(13010), 901u);
}

TEST(PtxMemory, CpAsyncCopiesZeroFillsAndIgnoresSource) {
  // cp.async (sm_80; cuSOLVER's and Ampere-style GEMMs use it): lanes 0-9 copy 16 bytes (.cg, an
  // L2 prefetch hint), lanes 10-31 copy 4 and zero-fill 12 (.ca, src-size 4), then lanes 20-31
  // copy again with the ignore-src predicate, true for lane 31 only (16 zero bytes there).
  const std::string text =
      ".version 8.0\n.target sm_80\n.address_size 64\n"
      ".visible .entry k(.param .u64 k_out, .param .u64 k_in)\n{\n"
      ".reg .pred %p<4>;\n.reg .b32 %r<12>;\n.reg .b64 %rd<8>;\n.shared .align 16 .b8 buf[512];\n"
      "ld.param.u64 %rd1, [k_out];\ncvta.to.global.u64 %rd1, %rd1;\n"
      "ld.param.u64 %rd2, [k_in];\ncvta.to.global.u64 %rd2, %rd2;\n"
      "mov.u32 %r1, %tid.x;\nmul.wide.u32 %rd3, %r1, 16;\nadd.s64 %rd4, %rd2, %rd3;\n"
      "mov.u32 %r2, buf;\nshl.b32 %r3, %r1, 4;\nadd.u32 %r4, %r2, %r3;\n"
      "setp.lt.u32 %p1, %r1, 10;\n@%p1 cp.async.cg.shared.global.L2::128B [%r4], [%rd4], 16;\n"
      "mov.u32 %r9, 4;\n@!%p1 cp.async.ca.shared.global [%r4], [%rd4], 16, %r9;\n"
      "cp.async.commit_group;\n"
      "setp.ge.u32 %p2, %r1, 20;\nsetp.eq.u32 %p3, %r1, 31;\n"
      "@%p2 cp.async.ca.shared::cta.global [%r4], [%rd4], 16, %p3;\n"
      "cp.async.commit_group;\ncp.async.wait_group 0;\ncp.async.wait_all;\nbar.sync 0;\n"
      "ld.shared.v4.u32 {%r5, %r6, %r7, %r8}, [%r4];\nadd.s64 %rd5, %rd1, %rd3;\n"
      "st.global.v4.u32 [%rd5], {%r5, %r6, %r7, %r8};\nret;\n}\n";
  TestMemory mem;
  Runner run = MustParse(text);
  std::vector<uint32_t> in(128);
  for (uint32_t i = 0; i < 128; ++i) in[i] = 0x1000 + i;
  const uint64_t din = mem.Upload(in), dout = mem.Alloc(128 * 4);
  Params p;
  p.Add(dout).Add(din);
  auto r = run.Go(mem, "k", {1, 1, 1}, {32, 1, 1}, p);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  auto out = mem.Download<uint32_t>(dout, 128);
  for (uint32_t lane = 0; lane < 32; ++lane) {
    for (uint32_t w = 0; w < 4; ++w) {
      const uint32_t got = out[lane * 4 + w], src = in[lane * 4 + w];
      const uint32_t want = lane == 31 ? 0 : lane < 10 || lane >= 20 ? src : w == 0 ? src : 0;
      EXPECT_EQ(got, want) << "lane " << lane << " word " << w;
    }
  }
  // Bulk copies (TMA) are refused by name.
  Runner bulk = MustParse(
      Wrap("", "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%rd1], [%rd2], 16, [%rd3];"));
  auto b = bulk.Go(mem, "k", {1, 1, 1}, {1, 1, 1}, Params().Add(uint64_t{0}).Add(uint64_t{0}));
  EXPECT_EQ(b.code, CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_NE(b.message.find("cp.async.bulk"), std::string::npos) << b.message;
}

// ---- textures and surfaces (hand-written PTX) ----

// A view of `data` (elements of T, `ch` per texel) as a texture or surface; rows packed unless
// `row_pitch` is given.
template <class T>
ImageView View(std::vector<T>& data, uint32_t format, uint32_t ch, uint32_t dims, uint64_t w, uint64_t h = 1,
               uint64_t d = 1, uint64_t row_pitch = 0) {
  ImageView v;
  v.data = reinterpret_cast<uint8_t*>(data.data());
  v.bytes = data.size() * sizeof(T);
  v.format = format;
  v.channels = ch;
  v.dims = dims;
  v.width = w;
  v.height = h;
  v.depth = d;
  v.row_pitch = row_pitch != 0 ? row_pitch : w * ch * sizeof(T);
  v.slice_pitch = v.row_pitch * h;
  return v;
}

TEST(PtxImage, QueriesAndAHandleReadFromTheParam) {
  const std::string text =
      ".version 8.0\n.target sm_75\n.address_size 64\n"
      ".visible .entry q(.param .u64 q_tex, .param .u64 q_surf, .param .u64 q_out)\n{\n"
      ".reg .b16 %rs<4>;\n.reg .b32 %r<16>;\n.reg .b64 %rd<8>;\n"
      "ld.param.u64 %rd1, [q_tex];\nld.param.u64 %rd2, [q_surf];\nld.param.u64 %rd3, [q_out];\n"
      "cvta.to.global.u64 %rd3, %rd3;\n"
      "txq.width.b32 %r1, [%rd1];\ntxq.height.b32 %r2, [%rd1];\ntxq.depth.b32 %r3, [%rd1];\n"
      "suq.width.b32 %r4, [%rd2];\nsuq.height.b32 %r5, [%rd2];\nsuq.depth.b32 %r6, [%rd2];\n"
      "mov.u32 %r7, 1;\n"
      "tex.1d.v4.s32.s32 {%r8, %r9, %r10, %r11}, [q_tex, {%r7}];\n"
      "mov.u32 %r12, 2;\nsuld.b.1d.v2.b16.trap {%rs1, %rs2}, [q_surf, {%r12}];\n"
      "cvt.u32.u16 %r13, %rs1;\ncvt.u32.u16 %r14, %rs2;\n"
      "st.global.v4.u32 [%rd3], {%r1, %r2, %r3, %r4};\nst.global.v2.u32 [%rd3+16], {%r5, %r6};\n"
      "st.global.v4.u32 [%rd3+32], {%r8, %r9, %r10, %r11};\n"
      "st.global.v2.u32 [%rd3+48], {%r13, %r14};\nret;\n}\n";
  TestMemory mem;
  Runner run = MustParse(text);
  // A 2-channel signed 16-bit 1D texture read as integers: texel 1 = (-5, 300), no z/w channels.
  std::vector<int16_t> t = {7, 8, -5, 300, 9, 10};
  ImageView tv = View(t, CU_AD_FORMAT_SIGNED_INT16, 2, 1, 3);
  tv.read_as_integer = true;
  std::vector<uint16_t> s(5 * 2 * 3);  // 5x2x3 texels of one u16
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint16_t>(1000 + i);
  const uint64_t th = mem.AddTexture(tv), sh = mem.AddSurface(View(s, CU_AD_FORMAT_UNSIGNED_INT16, 1, 3, 5, 2, 3));
  const uint64_t out = mem.Alloc(64);
  Params p;
  p.Add(th).Add(sh).Add(out);
  auto r = run.Go(mem, "q", {1, 1, 1}, {1, 1, 1}, p);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  auto o = mem.Download<uint32_t>(out, 14);
  EXPECT_EQ(o[0], 3u);
  EXPECT_EQ(o[1], 1u);
  EXPECT_EQ(o[2], 1u);
  EXPECT_EQ(o[3], 5u);
  EXPECT_EQ(o[4], 2u);
  EXPECT_EQ(o[5], 3u);
  EXPECT_EQ(static_cast<int32_t>(o[8]), -5);  // sign-extended s16
  EXPECT_EQ(o[9], 300u);
  EXPECT_EQ(o[10], 0u);  // missing z
  EXPECT_EQ(o[11], 1u);  // missing w (integer 1)
  // x = 2 is a byte offset: bytes 2..5 of row 0 are texels 1 and 2 (not texels 2 and 3).
  EXPECT_EQ(o[12], 1001u);
  EXPECT_EQ(o[13], 1002u);
}

TEST(PtxErrors, RefusedTextureAndSurfaceFormsAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"tex.level.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6}], %f7;", "tex.level.2d"},
      {"tex.grad.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6}], {%f7, %f8}, {%f9, %f10};", "tex.grad"},
      {"tex.2dms.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r2, %r3, %r4, %r5}];", "tex.2dms"},
      {"tex.cube.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r2, %r3, %r4, %r5}];", "tex.cube"},
      {"sust.p.2d.b32.trap [%rd1, {%r2, %r3}], {%r4, %r5, %r6, %r7};", "sust.p"},
      {"suld.b.2dms.b32.trap {%r2}, [%rd1, {%r3, %r4, %r5, %r6}];", "suld.b.2dms"},
      {"sured.b.add.2d.u32.trap [%rd1, {%r2, %r3}], %r4;", "sured"},
      {"txq.level.width.b32 %r2, [%rd1], %r3;", "txq.level"},
      {"tex.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6}], {%r2, %r3};", "offset"},
  };
  for (const auto& [ins, named] : cases) {
    TestMemory mem;
    Runner run = MustParse(Wrap("", ins));
    Params p;
    p.Add(uint64_t{0}).Add(uint64_t{0});
    auto r = run.Go(mem, "k", {1, 1, 1}, {1, 1, 1}, p);
    EXPECT_EQ(r.code, CUDA_ERROR_NOT_SUPPORTED) << ins;
    EXPECT_NE(r.message.find(named), std::string::npos) << r.message;
  }
}

// ---- nvcc-compiled kernels ----

#ifdef ORION_PTX_FIXTURE
std::string Fixture() {
  std::ifstream f(ORION_PTX_FIXTURE);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class Nvcc : public ::testing::Test {
 protected:
  void SetUp() override { run_ = MustParse(Fixture()); }
  TestMemory mem_;
  Runner run_;
};

TEST_F(Nvcc, VectorAdd) {
  const int n = 5000;
  std::vector<float> a(n), b(n);
  for (int i = 0; i < n; ++i) a[i] = static_cast<float>(i) * 0.5f, b[i] = 3.0f - static_cast<float>(i);
  const uint64_t da = mem_.Upload(a), db = mem_.Upload(b), dc = mem_.Alloc(n * 4);
  Params p;
  p.Add(da).Add(db).Add(dc).Add(n);
  auto r = run_.Go(mem_, "_Z4vaddPKfS0_Pfi", {(n + 255) / 256, 1, 1}, {256, 1, 1}, p, 0, nullptr, 2);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  auto c = mem_.Download<float>(dc, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(c[i], a[i] + b[i]) << i;
}

TEST_F(Nvcc, ManyLaunchesFromTwoThreadsShareTheBlockPool) {
  // Launches on several host threads each (the pool's threads, kept between launches), from two
  // launching threads at once: every one computes its own sum.
  const int n = 1500;  // 6 blocks
  std::vector<float> a(n), b(n);
  for (int i = 0; i < n; ++i) a[i] = static_cast<float>(i), b[i] = 0.25f;
  const uint64_t da = mem_.Upload(a), db = mem_.Upload(b), dc[2] = {mem_.Alloc(n * 4), mem_.Alloc(n * 4)};
  Params first;
  first.Add(da).Add(db).Add(dc[0]).Add(n);
  ASSERT_EQ(run_.Go(mem_, "_Z4vaddPKfS0_Pfi", {(n + 255) / 256, 1, 1}, {256, 1, 1}, first).code, CUDA_SUCCESS);
  std::atomic<int> wrong{0};
  auto launcher = [&](int t) {
    for (int k = 0; k < 100; ++k) {
      Params p;
      p.Add(da).Add(t == 0 ? db : da).Add(dc[t]).Add(n);
      auto* c = reinterpret_cast<float*>(mem_.Host(dc[t]));
      std::fill(c, c + n, -1.0f);
      auto r = run_.Go(mem_, "_Z4vaddPKfS0_Pfi", {(n + 255) / 256, 1, 1}, {256, 1, 1}, p, 0, nullptr, 3 + t);
      if (r.code != CUDA_SUCCESS) ++wrong;
      for (int i = 0; i < n; ++i)
        if (c[i] != a[i] + (t == 0 ? 0.25f : a[i])) ++wrong;
    }
  };
  std::thread t0(launcher, 0), t1(launcher, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(Nvcc, TiledMatmulWithSharedMemoryAndBarriers) {
  const int n = 40;  // not a multiple of the tile: edge blocks diverge
  std::vector<float> A(n * n), B(n * n);
  for (int i = 0; i < n * n; ++i) A[i] = static_cast<float>(i % 7) - 3, B[i] = static_cast<float>(i % 5) * 0.5f;
  const uint64_t da = mem_.Upload(A), db = mem_.Upload(B), dc = mem_.Alloc(n * n * 4);
  Params p;
  p.Add(da).Add(db).Add(dc).Add(n);
  auto r = run_.Go(mem_, "_Z6matmulPKfS0_Pfi", {3, 3, 1}, {16, 16, 1}, p);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  auto C = mem_.Download<float>(dc, n * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      float acc = 0;
      for (int k = 0; k < n; ++k) acc += A[i * n + k] * B[k * n + j];
      ASSERT_FLOAT_EQ(C[i * n + j], acc) << i << "," << j;
    }
}

TEST_F(Nvcc, WarpShuffleReductionWithAtomics) {
  const int n = 100000;
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = (i * 37) % 1001 - 500;
  const uint64_t dv = mem_.Upload(v), dout = mem_.Upload(std::vector<int>{0});
  Params p;
  p.Add(dv).Add(dout).Add(n);
  auto r = run_.Go(mem_, "_Z6reducePKiPii", {8, 1, 1}, {256, 1, 1}, p, 0, nullptr, 2);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  EXPECT_EQ(mem_.Download<int>(dout, 1)[0], std::accumulate(v.begin(), v.end(), 0));
}

TEST_F(Nvcc, HistogramSharedAndGlobalAtomics) {
  const int n = 70000;
  std::vector<uint8_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131) ^ (i >> 3));
  const uint64_t dv = mem_.Upload(v), dh = mem_.Upload(std::vector<uint32_t>(256, 0));
  Params p;
  p.Add(dv).Add(dh).Add(n);
  auto r = run_.Go(mem_, "_Z9histogramPKhPji", {6, 1, 1}, {128, 1, 1}, p, 0, nullptr, 2);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  std::vector<uint32_t> want(256, 0);
  for (uint8_t x : v) ++want[x];
  EXPECT_EQ(mem_.Download<uint32_t>(dh, 256), want);
}

TEST_F(Nvcc, BlockScan) {
  std::vector<int> v(256);
  for (int i = 0; i < 256; ++i) v[i] = i % 9 - 2;
  const uint64_t d = mem_.Upload(v);
  Params p;
  p.Add(d);
  auto r = run_.Go(mem_, "_Z4scanPi", {1, 1, 1}, {256, 1, 1}, p);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  std::vector<int> want(256);
  std::partial_sum(v.begin(), v.end(), want.begin());
  EXPECT_EQ(mem_.Download<int>(d, 256), want);
}

TEST_F(Nvcc, DevicePrintf) {
  Params p;
  p.Add(7).Add(2.5);
  std::string out;
  auto r = run_.Go(mem_, "_Z2prid", {1, 1, 1}, {3, 1, 1}, p, 0, &out);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  EXPECT_EQ(out, "hello 7 2.500000 from 0\nhello 7 2.500000 from 1\nhello 7 2.500000 from 2\n");
}

TEST_F(Nvcc, StructByValueAndDouble) {
  struct S {
    int a;
    double b;
    char c[3];
  } s{5, 0.25, {1, -3, 9}};
  std::vector<uint8_t> buf(sizeof(S) + 8);
  std::memcpy(buf.data(), &s, sizeof s);
  const uint64_t d = mem_.Alloc(32 * 8);
  std::memcpy(buf.data() + 24, &d, 8);
  LaunchConfig cfg;
  cfg.block[0] = 32;
  cfg.params = buf.data();
  cfg.param_bytes = 32;
  std::vector<uint64_t> vars;
  for (const ModuleVar& v : Vars(*run_.prog)) vars.push_back(mem_.Alloc(std::max<uint64_t>(v.size, 1)));
  cfg.var_addrs = vars.data();
  auto r = Launch(*run_.prog, "_Z2st1SPd", cfg, mem_);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  auto o = mem_.Download<double>(d, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(o[i], 5 + 0.25 + (-3) + std::sqrt(static_cast<double>(i))) << i;
}

TEST_F(Nvcc, AssertFails) {
  Params p;
  p.Add(3);
  std::string out;
  auto r = run_.Go(mem_, "_Z4asrti", {1, 1, 1}, {8, 1, 1}, p, 0, &out);
  EXPECT_EQ(r.code, CUDA_ERROR_ASSERT);
  EXPECT_NE(out.find("Assertion `x != threadIdx.x` failed."), std::string::npos) << out;
  EXPECT_NE(out.find("thread: [3,0,0]"), std::string::npos) << out;
}

TEST_F(Nvcc, MathFunctions) {
  std::vector<float> v(64);
  for (int i = 0; i < 64; ++i) v[i] = static_cast<float>(i) * 0.1f - 2.0f;
  const uint64_t d = mem_.Upload(v);
  Params p;
  p.Add(d);
  auto r = run_.Go(mem_, "_Z4mathPf", {1, 1, 1}, {64, 1, 1}, p);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  auto o = mem_.Download<float>(d, 64);
  for (int i = 0; i < 64; ++i) {
    const float x = v[i];
    const double want = std::sin(x) + std::exp(x) + 1.0 / (x + 1) + 1.0 / std::sqrt(x + 2) + std::tanh(x);
    if (x + 2 <= 0 || std::fabs(x + 1) < 1e-3f) continue;  // NaN / pole
    EXPECT_NEAR(o[i], want, 1e-4 * std::max(1.0, std::fabs(want))) << i << " x=" << x;
  }
}
TEST_F(Nvcc, WarpSizeIsWarpSz) {
  ASSERT_NE(Fixture().find("WARP_SZ"), std::string::npos);  // the fixture really uses the identifier
  const uint64_t d = mem_.Alloc(96 * 4);
  Params p;
  p.Add(d);
  auto r = run_.Go(mem_, "_Z14warp_size_lanePi", {1, 1, 1}, {96, 1, 1}, p);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  auto o = mem_.Download<int>(d, 96);
  for (int i = 0; i < 96; ++i) EXPECT_EQ(o[i], i / 32 * 1000 + i % 32) << i;
}

TEST_F(Nvcc, SpinningWarpLetsTheWarpItWaitsForRun) {
  // Warp 0 spins on a shared flag that only warp 1 sets (with and without __nanosleep in the loop).
  // Run warp by warp to completion, warp 0 would spin until the timeout.
  for (int sleep : {0, 1}) {
    const uint64_t d = mem_.Alloc(64 * 4);
    Params p;
    p.Add(d).Add(sleep);
    auto r = run_.Go(mem_, "_Z14spin_until_setPii", {1, 1, 1}, {64, 1, 1}, p, 0, nullptr, 1, 20000);
    ASSERT_EQ(r.code, CUDA_SUCCESS) << "sleep=" << sleep << ": " << r.message;
    auto o = mem_.Download<int>(d, 64);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(o[i], i < 32 ? 42 : -1) << i;
  }
}

TEST_F(Nvcc, SoftwareBarrierBetweenWarps) {
  // cuda-samples simpleAWBarrier's pattern: each warp's lane 0 arrives on a global counter and
  // spins until every warp of the block has arrived.
  const uint64_t count = mem_.Upload(std::vector<unsigned>{0}), d = mem_.Alloc(256 * 4);
  Params p;
  p.Add(count).Add(d);
  auto r = run_.Go(mem_, "_Z21warp_software_barrierPjS_", {1, 1, 1}, {256, 1, 1}, p, 0, nullptr, 1, 20000);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  auto o = mem_.Download<unsigned>(d, 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(o[i], 8u) << i;
}

TEST_F(Nvcc, DivergentWarpThenBallot) {
  const uint64_t d = mem_.Alloc(64 * 4);
  Params p;
  p.Add(d);
  auto r = run_.Go(mem_, "_Z9divergentPi", {1, 1, 1}, {64, 1, 1}, p, 0, nullptr, 1, 5000);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  auto got = mem_.Download<int>(d, 64);
  std::vector<int> want(64);
  DivergentReference(64, want.data());
  EXPECT_EQ(got, want);
}

// Texture and surface kernels (tests/data/ptx_kernels.cu). References follow the CUDA C++
// Programming Guide, "Texture Fetching".
int RefIndex(int i, int n, uint32_t mode) {  // -1: border
  switch (mode) {
    case CU_TR_ADDRESS_MODE_WRAP: return ((i % n) + n) % n;
    case CU_TR_ADDRESS_MODE_MIRROR: {
      const int r = ((i % (2 * n)) + 2 * n) % (2 * n);
      return r < n ? r : 2 * n - 1 - r;
    }
    case CU_TR_ADDRESS_MODE_CLAMP: return std::clamp(i, 0, n - 1);
    default: return i < 0 || i >= n ? -1 : i;
  }
}
// tex(x,y) = (1-a)(1-b)T[i,j] + a(1-b)T[i+1,j] + (1-a)bT[i,j+1] + abT[i+1,j+1], xB = x - 0.5,
// i = floor(xB), a = frac(xB) (likewise y): the guide's linear filtering, unnormalized coordinates.
float RefBilinear(const std::vector<float>& img, int w, int h, float x, float y, uint32_t mode, float border) {
  const float xb = x - 0.5f, yb = y - 0.5f;
  const int i = static_cast<int>(std::floor(xb)), j = static_cast<int>(std::floor(yb));
  const float a = xb - std::floor(xb), b = yb - std::floor(yb);
  auto T = [&](int ii, int jj) {
    const int xi = RefIndex(ii, w, mode), yj = RefIndex(jj, h, mode);
    return xi < 0 || yj < 0 ? border : img[static_cast<size_t>(yj * w + xi)];
  };
  return (1 - a) * (1 - b) * T(i, j) + a * (1 - b) * T(i + 1, j) + (1 - a) * b * T(i, j + 1) + a * b * T(i + 1, j + 1);
}

class NvccImage : public Nvcc {
 protected:
  // tex2D<float>(tex, x, y) for each point, one thread each.
  std::vector<float> Tex2D(uint64_t tex, const std::vector<std::pair<float, float>>& xy, LaunchResult* res = nullptr) {
    std::vector<float> flat;
    for (auto [x, y] : xy) flat.push_back(x), flat.push_back(y);
    const auto n = static_cast<int>(xy.size());
    const uint64_t dxy = mem_.Upload(flat), dout = mem_.Alloc(xy.size() * 4);
    Params p;
    p.Add(tex).Add(dout).Add(dxy).Add(n);
    auto r = run_.Go(mem_, "_Z6tex_2dyPfPK6float2i", {1, 1, 1}, {static_cast<uint32_t>(n), 1, 1}, p);
    if (res != nullptr)
      *res = r;
    else
      EXPECT_EQ(r.code, CUDA_SUCCESS) << r.message;
    return mem_.Download<float>(dout, xy.size());
  }
  // tex2D<float4>
  std::vector<float> Tex2D4(uint64_t tex, const std::vector<std::pair<float, float>>& xy) {
    std::vector<float> flat;
    for (auto [x, y] : xy) flat.push_back(x), flat.push_back(y);
    const auto n = static_cast<int>(xy.size());
    const uint64_t dxy = mem_.Upload(flat), dout = mem_.Alloc(xy.size() * 16);
    Params p;
    p.Add(tex).Add(dout).Add(dxy).Add(n);
    auto r = run_.Go(mem_, "_Z7tex_2d4yP6float4PK6float2i", {1, 1, 1}, {static_cast<uint32_t>(n), 1, 1}, p);
    EXPECT_EQ(r.code, CUDA_SUCCESS) << r.message;
    return mem_.Download<float>(dout, xy.size() * 4);
  }
};

TEST_F(NvccImage, Tex1DfetchIntegerCoordinatesBorderAndClamp) {
  std::vector<float> t(8);
  for (int i = 0; i < 8; ++i) t[i] = static_cast<float>(i) * 1.5f + 1;
  ImageView v = View(t, CU_AD_FORMAT_FLOAT, 1, 1, 8);
  v.address_mode[0] = CU_TR_ADDRESS_MODE_BORDER;  // linear memory: out-of-range fetches read 0
  const uint64_t border = mem_.AddTexture(v);
  v.address_mode[0] = CU_TR_ADDRESS_MODE_CLAMP;
  const uint64_t clamp = mem_.AddTexture(v);
  for (uint64_t tex : {border, clamp}) {
    const uint64_t dout = mem_.Alloc(12 * 4);
    Params p;
    p.Add(tex).Add(dout).Add(12);
    auto r = run_.Go(mem_, "_Z9tex_fetchyPfi", {1, 1, 1}, {12, 1, 1}, p);
    ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
    auto o = mem_.Download<float>(dout, 12);
    for (int i = 0; i < 12; ++i) {
      const int x = i - 2;  // the kernel fetches texel i - 2
      const float want = x >= 0 && x < 8 ? t[x] : tex == border ? 0.0f : t[std::clamp(x, 0, 7)];
      EXPECT_EQ(o[i], want) << "texel " << x;
    }
  }
  EXPECT_EQ(mem_.texture_lookups, 2u) << "each handle is resolved once per launch";
}

TEST_F(NvccImage, Tex2DPointSamplingUnnormalizedAndNormalized) {
  const int w = 4, h = 3;
  std::vector<float> img(w * h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) img[y * w + x] = static_cast<float>(10 * y + x);
  ImageView v = View(img, CU_AD_FORMAT_FLOAT, 1, 2, w, h);
  v.address_mode[0] = v.address_mode[1] = CU_TR_ADDRESS_MODE_CLAMP;
  const uint64_t un = mem_.AddTexture(v);
  v.normalized_coords = true;
  const uint64_t nrm = mem_.AddTexture(v);
  std::vector<std::pair<float, float>> at, at_n;
  std::vector<float> want;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const float fx = static_cast<float>(x) + 0.2f + 0.15f * static_cast<float>(y), fy = static_cast<float>(y) + 0.9f;
      at.push_back({fx, fy});
      at_n.push_back({fx / w, fy / h});
      want.push_back(img[y * w + x]);  // nearest-point: T[floor(x), floor(y)]
    }
  // Unnormalized coordinates outside the image clamp to the edge texels.
  at.push_back({-3.0f, 1.5f});
  at.push_back({9.0f, 7.0f});
  at_n.push_back({-0.75f, 0.5f});
  at_n.push_back({2.25f, 2.4f});
  want.push_back(img[1 * w + 0]);
  want.push_back(img[2 * w + 3]);
  EXPECT_EQ(Tex2D(un, at), want);
  EXPECT_EQ(Tex2D(nrm, at_n), want);
}

TEST_F(NvccImage, Tex2DAddressModesWithNormalizedCoordinates) {
  const int w = 4, h = 2;
  std::vector<float> img(w * h);
  for (int i = 0; i < w * h; ++i) img[i] = static_cast<float>(i * i) + 0.5f;
  const std::vector<std::pair<float, float>> at = {{0.3f, 0.3f},  {1.3f, 0.3f},  {-0.1f, 0.3f}, {2.6f, 0.8f},
                                                   {-1.4f, 1.7f}, {1.1f, -0.2f}, {1.6f, 0.6f},  {-0.6f, -1.3f}};
  const uint32_t modes[] = {CU_TR_ADDRESS_MODE_WRAP, CU_TR_ADDRESS_MODE_CLAMP, CU_TR_ADDRESS_MODE_MIRROR,
                            CU_TR_ADDRESS_MODE_BORDER};
  for (uint32_t mode : modes) {
    ImageView v = View(img, CU_AD_FORMAT_FLOAT, 1, 2, w, h);
    v.normalized_coords = true;
    v.address_mode[0] = v.address_mode[1] = mode;
    v.border_color[0] = -42.0f;
    const auto got = Tex2D(mem_.AddTexture(v), at);
    for (size_t k = 0; k < at.size(); ++k) {
      // The guide's formulas on the normalized coordinate, then T[floor(x * N)].
      auto coord = [&](float u, int n) -> int {
        const float fr = u - std::floor(u), nf = static_cast<float>(n);
        switch (mode) {
          case CU_TR_ADDRESS_MODE_WRAP: return std::min(static_cast<int>(std::floor(fr * nf)), n - 1);
          case CU_TR_ADDRESS_MODE_MIRROR: {
            const float m = static_cast<int64_t>(std::floor(u)) % 2 == 0 ? fr : 1 - fr;
            return std::min(static_cast<int>(std::floor(m * nf)), n - 1);
          }
          case CU_TR_ADDRESS_MODE_CLAMP: return std::clamp(static_cast<int>(std::floor(u * nf)), 0, n - 1);
          default: return u < 0 || u >= 1 ? -1 : static_cast<int>(std::floor(u * nf));
        }
      };
      const int x = coord(at[k].first, w), y = coord(at[k].second, h);
      const float want = x < 0 || y < 0 ? -42.0f : img[y * w + x];
      EXPECT_EQ(got[k], want) << "mode " << mode << " at (" << at[k].first << "," << at[k].second << ")";
    }
  }
  // A few by hand: wrap 1.3 -> 0.3 -> texel 1; mirror 1.1 -> 0.9 -> texel 3; mirror 1.6 -> 0.4 -> texel 1.
  ImageView v = View(img, CU_AD_FORMAT_FLOAT, 1, 2, w, h);
  v.normalized_coords = true;
  v.address_mode[0] = v.address_mode[1] = CU_TR_ADDRESS_MODE_WRAP;
  EXPECT_EQ(Tex2D(mem_.AddTexture(v), {{1.3f, 0.3f}})[0], img[1]);
  v.address_mode[0] = v.address_mode[1] = CU_TR_ADDRESS_MODE_MIRROR;
  EXPECT_EQ(Tex2D(mem_.AddTexture(v), {{1.1f, 0.3f}, {1.6f, 0.6f}}), (std::vector<float>{img[3], img[w + 1]}));
}

TEST_F(NvccImage, Tex2DLinearFiltering) {
  const int w = 5, h = 4;
  std::vector<float> img(w * h);
  for (int i = 0; i < w * h; ++i) img[i] = static_cast<float>((i * 37) % 23) - 7.25f;
  std::vector<std::pair<float, float>> at;
  for (int k = 0; k < 40; ++k)
    at.push_back({-1.0f + 0.173f * static_cast<float>(k), -0.6f + 0.137f * static_cast<float>((k * 7) % 40)});
  for (uint32_t mode : {CU_TR_ADDRESS_MODE_CLAMP, CU_TR_ADDRESS_MODE_BORDER}) {
    ImageView v = View(img, CU_AD_FORMAT_FLOAT, 1, 2, w, h);
    v.filter_mode = CU_TR_FILTER_MODE_LINEAR;
    v.address_mode[0] = v.address_mode[1] = mode;
    v.border_color[0] = 3.0f;
    const auto got = Tex2D(mem_.AddTexture(v), at);
    for (size_t k = 0; k < at.size(); ++k)
      EXPECT_NEAR(got[k], RefBilinear(img, w, h, at[k].first, at[k].second, mode, 3.0f), 1e-5)
          << "mode " << mode << " at (" << at[k].first << "," << at[k].second << ")";
  }
  // At texel centres linear filtering returns the texel; halfway between two it is their mean.
  ImageView v = View(img, CU_AD_FORMAT_FLOAT, 1, 2, w, h);
  v.filter_mode = CU_TR_FILTER_MODE_LINEAR;
  v.address_mode[0] = v.address_mode[1] = CU_TR_ADDRESS_MODE_CLAMP;
  const auto got = Tex2D(mem_.AddTexture(v), {{2.5f, 1.5f}, {3.0f, 1.5f}});
  EXPECT_EQ(got[0], img[1 * w + 2]);
  EXPECT_FLOAT_EQ(got[1], (img[1 * w + 2] + img[1 * w + 3]) / 2);
}

TEST_F(NvccImage, MissingChannelsReadAsZeroAndAlphaOne) {
  std::vector<float> two = {1.5f, -2.5f, 3.5f, 4.5f};  // 2x1 texels of (r, g)
  ImageView v2 = View(two, CU_AD_FORMAT_FLOAT, 2, 2, 2, 1);
  std::vector<uint16_t> half = {0x3c00, 0xc000};  // 1.0, -2.0 as HALF, one channel
  ImageView vh = View(half, CU_AD_FORMAT_HALF, 1, 2, 2, 1);
  EXPECT_EQ(Tex2D4(mem_.AddTexture(v2), {{1.5f, 0.5f}}), (std::vector<float>{3.5f, 4.5f, 0.0f, 1.0f}));
  EXPECT_EQ(Tex2D4(mem_.AddTexture(vh), {{1.5f, 0.5f}}), (std::vector<float>{-2.0f, 0.0f, 0.0f, 1.0f}));
}

TEST_F(NvccImage, U8NormalizedFloatVersusReadAsInteger) {
  std::vector<uint8_t> img = {0, 64, 128, 255, 10, 20, 30, 40};  // 2x1 RGBA8
  ImageView v = View(img, CU_AD_FORMAT_UNSIGNED_INT8, 4, 2, 2, 1);
  const auto f = Tex2D4(mem_.AddTexture(v), {{0.5f, 0.5f}, {1.5f, 0.5f}});
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(f[i], static_cast<float>(img[i]) / 255.0f) << i;
  v.read_as_integer = true;
  const uint64_t dxy = mem_.Upload(std::vector<float>{0.5f, 0.5f, 1.5f, 0.5f}), dout = mem_.Alloc(8);
  Params p;
  p.Add(mem_.AddTexture(v)).Add(dout).Add(dxy).Add(2);
  auto r = run_.Go(mem_, "_Z8tex_2du8yP6uchar4PK6float2i", {1, 1, 1}, {2, 1, 1}, p);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  EXPECT_EQ(mem_.Download<uint8_t>(dout, 8), img);
  // Signed 8-bit: [-1, 1], -128 and -127 both -1.
  std::vector<int8_t> s = {-128, -127, -64, 0, 127};
  ImageView vs = View(s, CU_AD_FORMAT_SIGNED_INT8, 1, 2, 5, 1);
  const auto g = Tex2D(mem_.AddTexture(vs), {{0.5f, 0.5f}, {1.5f, 0.5f}, {2.5f, 0.5f}, {3.5f, 0.5f}, {4.5f, 0.5f}});
  EXPECT_EQ(g, (std::vector<float>{-1.0f, -1.0f, -64.0f / 127.0f, 0.0f, 1.0f}));
}

TEST_F(NvccImage, Tex3DPointAndTrilinear) {
  const int w = 4, h = 3, d = 2;
  std::vector<float> vol(w * h * d);
  for (int i = 0; i < w * h * d; ++i) vol[i] = static_cast<float>((i * 13) % 17) * 0.5f;
  ImageView v = View(vol, CU_AD_FORMAT_FLOAT, 1, 3, w, h, d);
  v.address_mode[0] = v.address_mode[1] = v.address_mode[2] = CU_TR_ADDRESS_MODE_CLAMP;
  const uint64_t point = mem_.AddTexture(v);
  v.filter_mode = CU_TR_FILTER_MODE_LINEAR;
  const uint64_t linear = mem_.AddTexture(v);
  std::vector<float> xyz;
  for (int k = 0; k < 24; ++k) {
    xyz.push_back(0.31f * static_cast<float>(k) - 0.4f);
    xyz.push_back(0.21f * static_cast<float>((k * 5) % 24) - 0.3f);
    xyz.push_back(0.11f * static_cast<float>((k * 7) % 24) - 0.2f);
    xyz.push_back(0.0f);
  }
  auto T = [&](int x, int y, int z) {
    return vol[static_cast<size_t>((std::clamp(z, 0, d - 1) * h + std::clamp(y, 0, h - 1)) * w +
                                   std::clamp(x, 0, w - 1))];
  };
  for (uint64_t tex : {point, linear}) {
    const uint64_t dxyz = mem_.Upload(xyz), dout = mem_.Alloc(24 * 4);
    Params p;
    p.Add(tex).Add(dout).Add(dxyz).Add(24);
    auto r = run_.Go(mem_, "_Z6tex_3dyPfPK6float4i", {1, 1, 1}, {24, 1, 1}, p);
    ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
    const auto o = mem_.Download<float>(dout, 24);
    for (int k = 0; k < 24; ++k) {
      const float x = xyz[4 * k], y = xyz[4 * k + 1], z = xyz[4 * k + 2];
      float want;
      if (tex == point) {
        want = T(static_cast<int>(std::floor(x)), static_cast<int>(std::floor(y)), static_cast<int>(std::floor(z)));
      } else {
        const float xb = x - 0.5f, yb = y - 0.5f, zb = z - 0.5f;
        const int i = static_cast<int>(std::floor(xb)), j = static_cast<int>(std::floor(yb)),
                  l = static_cast<int>(std::floor(zb));
        const float a = xb - std::floor(xb), b = yb - std::floor(yb), c = zb - std::floor(zb);
        want = 0;
        for (int dz = 0; dz < 2; ++dz)
          for (int dy = 0; dy < 2; ++dy)
            for (int dx = 0; dx < 2; ++dx)
              want += (dx ? a : 1 - a) * (dy ? b : 1 - b) * (dz ? c : 1 - c) * T(i + dx, j + dy, l + dz);
      }
      EXPECT_NEAR(o[k], want, 1e-5) << (tex == point ? "point" : "linear") << " at " << x << "," << y << "," << z;
    }
  }
}

TEST_F(NvccImage, Surface2DReadModifyWriteWithPaddedRows) {
  const int w = 5, h = 3, pitch = 32;  // rows of 20 bytes, 12 bytes of padding each
  std::vector<float> img(pitch / 4 * h, -1.0f);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) img[y * pitch / 4 + x] = static_cast<float>(y * 10 + x);
  const std::vector<float> before = img;
  const uint64_t s = mem_.AddSurface(View(img, CU_AD_FORMAT_FLOAT, 1, 2, w, h, 1, pitch));
  Params p;
  p.Add(s);
  auto r = run_.Go(mem_, "_Z10surf_scaley", {h, 1, 1}, {w, 1, 1}, p);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  for (int y = 0; y < h; ++y)
    for (int i = 0; i < pitch / 4; ++i) {
      const float b = before[y * pitch / 4 + i];
      EXPECT_EQ(img[y * pitch / 4 + i], i < w ? b * 2 + 1 : b) << "row " << y << " word " << i;
    }
}

TEST_F(NvccImage, Surface1DWriteUchar4IsByteAddressed) {
  std::vector<uint8_t> img(8 * 4, 0xee);
  const uint64_t s = mem_.AddSurface(View(img, CU_AD_FORMAT_UNSIGNED_INT8, 4, 1, 8));
  Params p;
  p.Add(s);
  auto r = run_.Go(mem_, "_Z9surf_rgbay", {1, 1, 1}, {8, 1, 1}, p);
  ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
  for (int x = 0; x < 8; ++x) {
    EXPECT_EQ(img[x * 4 + 0], x);
    EXPECT_EQ(img[x * 4 + 1], x + 1);
    EXPECT_EQ(img[x * 4 + 2], x + 2);
    EXPECT_EQ(img[x * 4 + 3], 255 - x);
  }
}

TEST_F(NvccImage, SurfaceClampAndZeroModes) {
  std::vector<int32_t> img = {1, 2, 3, 4, 5, 6, 7, 8};  // 4x2
  const uint64_t s = mem_.AddSurface(View(img, CU_AD_FORMAT_SIGNED_INT32, 1, 2, 4, 2));
  struct Case {
    int x, y;
    int clamp, zero;
    bool stored;
  };
  const Case cases[] = {
      {2, 0, 3, 3, true}, {10, 1, 8, 0, false}, {-3, 5, 5, 0, false}, {1, -1, 2, 0, false}, {3, 1, 8, 8, true}};
  for (const Case& c : cases) {
    std::vector<int32_t> before = img;
    const uint64_t dout = mem_.Alloc(8);
    Params p;
    p.Add(s).Add(dout).Add(c.x).Add(c.y);
    auto r = run_.Go(mem_, "_Z10surf_modesyPiii", {1, 1, 1}, {1, 1, 1}, p);
    ASSERT_EQ(r.code, CUDA_SUCCESS) << r.message;
    const auto o = mem_.Download<int32_t>(dout, 2);
    EXPECT_EQ(o[0], c.clamp) << c.x << "," << c.y;
    EXPECT_EQ(o[1], c.zero) << c.x << "," << c.y;
    if (c.stored) before[c.y * 4 + c.x] = -1;  // .zero stores land in range, are dropped outside
    EXPECT_EQ(img, before) << c.x << "," << c.y;
  }
}

TEST_F(NvccImage, SurfaceTrapOutOfRangeFailsTheLaunch) {
  std::vector<int32_t> img(4 * 2, 0);
  const uint64_t s = mem_.AddSurface(View(img, CU_AD_FORMAT_SIGNED_INT32, 1, 2, 4, 2));
  for (auto [x, y] : {std::pair{4, 0}, std::pair{-1, 0}, std::pair{0, 2}, std::pair{0, -1}}) {
    Params p;
    p.Add(s).Add(x).Add(y);
    auto r = run_.Go(mem_, "_Z9surf_trapyii", {1, 1, 1}, {1, 1, 1}, p);
    EXPECT_EQ(r.code, CUDA_ERROR_ILLEGAL_ADDRESS) << x << "," << y;
    EXPECT_NE(r.message.find("out of range"), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("sust at PTX line"), std::string::npos) << r.message;
  }
  EXPECT_EQ(img, std::vector<int32_t>(8, 0));
  Params p;
  p.Add(s).Add(3).Add(1);
  ASSERT_EQ(run_.Go(mem_, "_Z9surf_trapyii", {1, 1, 1}, {1, 1, 1}, p).code, CUDA_SUCCESS);
  EXPECT_EQ(img[7], 7);
}

TEST_F(NvccImage, UnknownOrUnusableHandleFailsTheLaunch) {
  std::vector<float> img(4, 1.0f);
  const uint64_t surf = mem_.AddSurface(View(img, CU_AD_FORMAT_FLOAT, 1, 2, 2, 2));
  LaunchResult r;
  Tex2D(0xdead, {{0.5f, 0.5f}}, &r);
  EXPECT_EQ(r.code, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_NE(r.message.find("unknown texture object 0xdead used by tex at PTX line"), std::string::npos) << r.message;
  Tex2D(surf, {{0.5f, 0.5f}}, &r);  // a surface is not a texture
  EXPECT_EQ(r.code, CUDA_ERROR_ILLEGAL_ADDRESS) << r.message;
  ImageView bad = View(img, CU_AD_FORMAT_FLOAT, 3, 2, 1, 1);  // 3 channels: no CUDA format has them
  Tex2D(mem_.AddTexture(bad), {{0.5f, 0.5f}}, &r);
  EXPECT_EQ(r.code, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_NE(r.message.find("3 channels"), std::string::npos) << r.message;
}

// A hostile view: `bytes` far smaller than width x height x texel. Its data ends right before a
// PROT_NONE page, so a single byte read or written past `bytes` would crash the test. Texels inside
// `bytes` work; any other fails the launch with CUDA_ERROR_ILLEGAL_ADDRESS (nothing is clamped to fit).
TEST_F(NvccImage, HostileViewIsNeverAccessedPastItsBytes) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* m = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  ASSERT_EQ(mprotect(static_cast<uint8_t*>(m) + page, page, PROT_NONE), 0);
  auto* data = reinterpret_cast<float*>(static_cast<uint8_t*>(m) + page - 16);
  for (int i = 0; i < 4; ++i) data[i] = static_cast<float>(i + 1);
  ImageView v;
  v.data = reinterpret_cast<uint8_t*>(data);
  v.bytes = 16;
  v.format = CU_AD_FORMAT_FLOAT;
  v.dims = 2;
  v.width = 64;
  v.height = 64;
  v.row_pitch = 256;
  v.address_mode[0] = v.address_mode[1] = CU_TR_ADDRESS_MODE_CLAMP;
  const uint64_t t = mem_.AddTexture(v);
  EXPECT_EQ(Tex2D(t, {{0.5f, 0.5f}, {3.5f, 0.2f}}), (std::vector<float>{1.0f, 4.0f}));
  LaunchResult r;
  for (auto xy : {std::pair{4.5f, 0.5f}, std::pair{0.5f, 1.5f}, std::pair{1e9f, 1e9f}}) {
    Tex2D(t, {xy}, &r);
    EXPECT_EQ(r.code, CUDA_ERROR_ILLEGAL_ADDRESS) << xy.first << "," << xy.second;
    EXPECT_NE(r.message.find("outside its 16 bytes"), std::string::npos) << r.message;
  }
  // Pitches whose products overflow 64 bits.
  ImageView huge = v;
  huge.width = uint64_t{1} << 62;
  huge.row_pitch = uint64_t{1} << 63;
  huge.address_mode[0] = huge.address_mode[1] = CU_TR_ADDRESS_MODE_BORDER;
  const uint64_t th = mem_.AddTexture(huge);
  for (auto xy : {std::pair{1e18f, 0.5f}, std::pair{0.5f, 2.5f}, std::pair{0.5f, 1.5f}}) {
    Tex2D(th, {xy}, &r);
    EXPECT_EQ(r.code, CUDA_ERROR_ILLEGAL_ADDRESS) << xy.first << "," << xy.second;
  }
  // Surfaces: stores and clamped loads past `bytes` fail too; the 16 bytes keep what was written.
  const uint64_t s = mem_.AddSurface(v);
  Params p;
  p.Add(s).Add(3).Add(0);
  ASSERT_EQ(run_.Go(mem_, "_Z9surf_trapyii", {1, 1, 1}, {1, 1, 1}, p).code, CUDA_SUCCESS);
  int32_t last;
  std::memcpy(&last, &data[3], 4);
  EXPECT_EQ(last, 7);
  Params p2;
  p2.Add(s).Add(4).Add(0);  // inside the 64-texel row, outside the 16 bytes
  r = run_.Go(mem_, "_Z9surf_trapyii", {1, 1, 1}, {1, 1, 1}, p2);
  EXPECT_EQ(r.code, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_NE(r.message.find("outside its 16 bytes"), std::string::npos) << r.message;
  const uint64_t dout = mem_.Alloc(8);
  Params p3;
  p3.Add(s).Add(dout).Add(1000).Add(0);  // .clamp moves x to texel 63: still outside the bytes
  r = run_.Go(mem_, "_Z10surf_modesyPiii", {1, 1, 1}, {1, 1, 1}, p3);
  EXPECT_EQ(r.code, CUDA_ERROR_ILLEGAL_ADDRESS) << r.message;
  munmap(m, 2 * page);
}
#endif

}  // namespace
}  // namespace orion::ptx
