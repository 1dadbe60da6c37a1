// Tests for orion/fatbin/fatbin.h.
//
// Fixtures (ORION_FATBIN_FIXTURES) are built by nvcc from tests/data/kernels.cu at build time, see
// fatbin/CMakeLists.txt; tests that need them skip when nvcc was not found. The synthetic containers
// and PTX below need no toolkit.
#include "orion/fatbin/fatbin.h"

#include <gtest/gtest.h>
#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace orion::fatbin {
namespace {

using Bytes = std::vector<uint8_t>;

// ---- the layouts the C++ ABI gives kernels.cu's signatures -------------------------------------
// Host replicas of the argument lists: a kernel's parameter buffer is laid out like a struct of
// its parameters (natural alignment), and param_bytes ends at the last parameter (no tail pad).
struct S {
  int a;
  double b;
  char c[5];
};
struct alignas(16) A16 {
  float x, y, z, w;
};
struct alignas(16) Double2 {
  double x, y;
};
struct Huge {
  char x[20000];
};
struct MixedArgs {
  int* p;
  int i;
  float f;
  S s;
  char c;
};
struct ManyArgs {
  char a;
  short b;
  int c;
  long long d;
  double e;
  char f;
  float* g;
  S h;
  char i;
};
struct AlignArgs {
  char a;
  A16 v;
  char b;
  Double2 d;
  float* p;
};
struct HugeArgs {
  char a;
  Huge h;
  int c;
  float* p;
};
static_assert(sizeof(S) == 24 && alignof(S) == 8);
static_assert(offsetof(MixedArgs, i) == 8 && offsetof(MixedArgs, f) == 12 && offsetof(MixedArgs, s) == 16 &&
              offsetof(MixedArgs, c) == 40);
static_assert(offsetof(ManyArgs, b) == 2 && offsetof(ManyArgs, c) == 4 && offsetof(ManyArgs, d) == 8 &&
              offsetof(ManyArgs, e) == 16 && offsetof(ManyArgs, f) == 24 && offsetof(ManyArgs, g) == 32 &&
              offsetof(ManyArgs, h) == 40 && offsetof(ManyArgs, i) == 64);
static_assert(offsetof(AlignArgs, v) == 16 && offsetof(AlignArgs, b) == 32 && offsetof(AlignArgs, d) == 48 &&
              offsetof(AlignArgs, p) == 64);
static_assert(offsetof(HugeArgs, h) == 1 && offsetof(HugeArgs, c) == 20004 && offsetof(HugeArgs, p) == 20008);

struct Expected {
  std::string name;
  std::vector<KernelParam> params;
  uint32_t param_bytes;
};
const std::vector<Expected>& ExpectedKernels() {
  static const std::vector<Expected> k = {
      {"k_ptr", {{0, 0, 8}}, 8},
      {"_Z5k_inti", {{0, 0, 4}}, 4},
      {"_Z7k_floatf", {{0, 0, 4}}, 4},
      {"_Z8k_struct1S", {{0, 0, 24}}, 24},
      {"_Z7k_mixedPiif1Sc", {{0, 0, 8}, {1, 8, 4}, {2, 12, 4}, {3, 16, 24}, {4, 40, 1}}, 41},
      {"_Z6k_manycsixdcPf1Sc",
       {{0, 0, 1}, {1, 2, 2}, {2, 4, 4}, {3, 8, 8}, {4, 16, 8}, {5, 24, 1}, {6, 32, 8}, {7, 40, 24}, {8, 64, 1}},
       65},
      {"_Z7k_alignc3A16c7double2Pf", {{0, 0, 1}, {1, 16, 16}, {2, 32, 1}, {3, 48, 16}, {4, 64, 8}}, 72},
      {"_Z6k_hugec4HugeiPf", {{0, 0, 1}, {1, 1, 20000}, {2, 20004, 4}, {3, 20008, 8}}, 20016},
      {"_Z7k_emptyv", {}, 0},
      {"_Z6k_tmplIiEvPT_S0_", {{0, 0, 8}, {1, 8, 4}}, 12},
      {"_Z6k_tmplIdEvPT_S0_", {{0, 0, 8}, {1, 8, 8}}, 16},
      {"_Z6k_callPi", {{0, 0, 8}}, 8},
  };
  return k;
}
const std::map<std::string, uint64_t>& ExpectedGlobals() {
  static const std::map<std::string, uint64_t> g = {{"dvar", 40}, {"cvar", 28}, {"dinit", 8}, {"mvar", 4}};
  return g;
}

void ExpectKernelsOf(const Module& m) {
  EXPECT_EQ(m.kernels.size(), ExpectedKernels().size());
  for (const Expected& e : ExpectedKernels()) {
    SCOPED_TRACE(e.name);
    const Kernel* k = m.FindKernel(e.name);
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->name, e.name);
    EXPECT_EQ(k->params, e.params);
    EXPECT_EQ(k->param_bytes, e.param_bytes);
  }
  EXPECT_EQ(m.FindKernel("_Z6helperi"), nullptr);  // __device__ function, not a kernel
  EXPECT_EQ(m.FindKernel("k_missing"), nullptr);
  std::map<std::string, uint64_t> globals;
  for (const Global& g : m.globals) globals[g.name] = g.size;
  EXPECT_EQ(globals, ExpectedGlobals());
  ASSERT_NE(m.FindGlobal("dvar"), nullptr);
  EXPECT_EQ(m.FindGlobal("dvar")->size, 40u);
  EXPECT_EQ(m.FindGlobal("nope"), nullptr);
}

// ---- fixture access -----------------------------------------------------------------------------
#define REQUIRE_FIXTURES()                                                          \
  do {                                                                              \
    if (!ORION_FATBIN_HAVE_FIXTURES) GTEST_SKIP() << "nvcc was not found by CMake"; \
  } while (0)

Bytes Fixture(const std::string& name) {
  std::ifstream f(std::string(ORION_FATBIN_FIXTURES) + "/" + name, std::ios::binary);
  EXPECT_TRUE(f.good()) << name;
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
// PTX as cuModuleLoadData takes it: NUL-terminated.
Bytes PtxFixture() {
  Bytes b = Fixture("sm90.ptx");
  b.push_back(0);
  return b;
}

template <typename T>
T Get(const Bytes& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}
template <typename T>
void Put(Bytes& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

// Entry headers of a (trusted) fatbin fixture.
struct EntryAt {
  size_t off;
  uint16_t kind;
  uint32_t hdr_size, arch, compressed_size;
  uint64_t size, flags, uncompressed_size;
};
std::vector<EntryAt> Entries(const Bytes& fb) {
  std::vector<EntryAt> out;
  const size_t end = Get<uint16_t>(fb, 6) + Get<uint64_t>(fb, 8);
  for (size_t p = Get<uint16_t>(fb, 6); p < end;) {
    EntryAt e{p,
              Get<uint16_t>(fb, p),
              Get<uint32_t>(fb, p + 4),
              Get<uint32_t>(fb, p + 28),
              Get<uint32_t>(fb, p + 16),
              Get<uint64_t>(fb, p + 8),
              Get<uint64_t>(fb, p + 40),
              Get<uint64_t>(fb, p + 56)};
    out.push_back(e);
    p += e.hdr_size + e.size;
  }
  return out;
}

// Section lookup in a (trusted) cubin fixture.
struct TestElf {
  const Bytes& b;
  size_t Shdr(size_t i) const { return Get<uint64_t>(b, 0x28) + i * 64; }
  size_t Count() const { return Get<uint16_t>(b, 0x3c); }
  std::string Name(size_t i) const {
    const size_t strtab = Get<uint64_t>(b, Shdr(Get<uint16_t>(b, 0x3e)) + 24);
    return reinterpret_cast<const char*>(b.data() + strtab + Get<uint32_t>(b, Shdr(i)));
  }
  size_t Find(const std::string& name) const {
    for (size_t i = 0; i < Count(); ++i)
      if (Name(i) == name) return i;
    ADD_FAILURE() << "no section " << name;
    return 0;
  }
  size_t Offset(size_t i) const { return Get<uint64_t>(b, Shdr(i) + 24); }
  size_t Size(size_t i) const { return Get<uint64_t>(b, Shdr(i) + 32); }
  // File offset of the first .nv.info record with `attr` in section `sec` for which pred(record
  // offset) holds.
  template <typename P>
  size_t Record(size_t sec, uint8_t attr, P pred) const {
    for (size_t p = Offset(sec); p < Offset(sec) + Size(sec);) {
      if (b[p + 1] == attr && pred(p)) return p;
      p += b[p] == 4 ? 4 + Get<uint16_t>(b, p + 2) : 4;
    }
    ADD_FAILURE() << "no record " << int(attr);
    return 0;
  }
};

// ---- synthetic images ---------------------------------------------------------------------------
const char kPtx[] = R"(//
// hand-written PTX: comments /* { */ and strings must not confuse the parser
.version 9.0
.target sm_90
.address_size 64
.file 1 "weird { name ( .entry fake( .param .u32 x ) }.cu"

.extern .global .align 4 .b8 ext_var[];       // declaration only: not a global of this module
.global .align 4 .b8 gv[40];
.visible .const .align 8 .u64 cv[2][3] = {{1, 2, 3}, {4, 5, 6}};
.global .align 1 .b8 $str[] = {104, 105, 0};
.global .u32 a, b[4], c = 7;
.global .attribute(.managed) .align 4 .u32 managed_v;
.global .v4 .f32 vec4;

.extern .entry ext_kernel(.param .u64 p);     // declared elsewhere: not in this module
.func  (.param .b32 func_retval0) dev(.param .u64 .ptr .global .align 8 q, .param .b32 r)
{
  .reg .b32 %r<2>;
  ret;
}

.visible .entry vec_kernel(
	.param .u8 p0,
	.param .v2 .f32 p1,            /* 8 bytes, align 8 */
	.param .u64 .ptr .global .align 16 p2,
	.param .align 4 .b8 p3[6],
	.param .v4 .b32 p4,
	.param .f16 p5
)
.maxntid 128, 1, 1
{
	.reg .b64 %rd<2>;
	ld.param.u64 %rd1, [p2];
	ret;
}
.entry noparams { ret; }
.weak .entry empty_parens()
{
	ret;
}
)";

Bytes PtxBytes(std::string_view text) {
  Bytes b(text.begin(), text.end());
  b.push_back(0);
  return b;
}

struct Spec {
  uint16_t kind = 1;
  uint32_t arch = 90;
  uint64_t flags = 0x11;
  Bytes data;  // stored payload (already compressed if flags say so)
  uint32_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  uint32_t hdr_size = 64;
};
Bytes MakeFatbin(const std::vector<Spec>& entries) {
  Bytes b(16);
  Put<uint32_t>(b, 0, 0xBA55ED50);
  Put<uint16_t>(b, 4, 1);
  Put<uint16_t>(b, 6, 16);
  for (const Spec& e : entries) {
    const size_t at = b.size();
    b.resize(at + e.hdr_size + e.data.size());
    Put<uint16_t>(b, at, e.kind);
    Put<uint16_t>(b, at + 2, 0x101);
    Put<uint32_t>(b, at + 4, e.hdr_size);
    Put<uint64_t>(b, at + 8, e.data.size());
    Put<uint32_t>(b, at + 16, e.compressed_size);
    Put<uint32_t>(b, at + 28, e.arch);
    Put<uint64_t>(b, at + 40, e.flags);
    Put<uint64_t>(b, at + 56, e.uncompressed_size);
    std::copy(e.data.begin(), e.data.end(), b.begin() + static_cast<ptrdiff_t>(at + e.hdr_size));
  }
  Put<uint64_t>(b, 8, b.size() - 16);
  return b;
}
Spec Lz4Spec(std::string_view text) {
  Spec s;
  s.flags |= 0x2000;
  Bytes out(static_cast<size_t>(LZ4_compressBound(static_cast<int>(text.size()))));
  const int n = LZ4_compress_default(text.data(), reinterpret_cast<char*>(out.data()), static_cast<int>(text.size()),
                                     static_cast<int>(out.size()));
  out.resize(static_cast<size_t>(n));
  s.compressed_size = static_cast<uint32_t>(n);
  out.resize((out.size() + 7) / 8 * 8);  // padded like nvcc's entries
  s.data = out;
  s.uncompressed_size = text.size();
  return s;
}
Spec ZstdSpec(std::string_view text) {
  Spec s;
  s.flags |= 0x8000;
  Bytes out(ZSTD_compressBound(text.size()));
  const size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  s.compressed_size = static_cast<uint32_t>(n);
  out.resize((n + 7) / 8 * 8);
  s.data = out;
  s.uncompressed_size = text.size();
  return s;
}

Result<Module> Parse(const Bytes& b, uint32_t prefer_sm = 90) { return ParseImage(b, prefer_sm); }

// ---- positive: nvcc fixtures --------------------------------------------------------------------
TEST(FatbinFixtures, Sm90Fatbin) {
  REQUIRE_FIXTURES();
  auto m = Parse(Fixture("sm90.fatbin"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_FALSE(m->from_ptx);
  EXPECT_EQ(m->sm_arch, 90u);
  ExpectKernelsOf(*m);
}

TEST(FatbinFixtures, BareCubin) {
  REQUIRE_FIXTURES();
  auto m = Parse(Fixture("sm90.cubin"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_FALSE(m->from_ptx);
  EXPECT_EQ(m->sm_arch, 90u);  // from e_flags
  ExpectKernelsOf(*m);
}

TEST(FatbinFixtures, OtherCubins) {
  REQUIRE_FIXTURES();
  // sm_100 marks pointer parameters with flag bits in both parameter record formats; a relocatable
  // (-rdc=true) cubin has CUDA-specific section and symbol types for variables.
  for (const auto& [file, arch] : {std::pair{"sm100.cubin", 100u}, std::pair{"rdc.cubin", 90u}}) {
    SCOPED_TRACE(file);
    auto m = Parse(Fixture(file));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->sm_arch, arch);
    ExpectKernelsOf(*m);
  }
}

TEST(FatbinFixtures, Ptx) {
  REQUIRE_FIXTURES();
  auto m = Parse(PtxFixture());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->from_ptx);
  EXPECT_EQ(m->sm_arch, 0u);
  ExpectKernelsOf(*m);
}

TEST(FatbinFixtures, PtxLayoutsEqualCubinLayouts) {
  REQUIRE_FIXTURES();
  auto ptx = Parse(PtxFixture());
  auto cubin = Parse(Fixture("sm90.cubin"));
  ASSERT_TRUE(ptx.ok() && cubin.ok());
  ASSERT_EQ(ptx->kernels.size(), cubin->kernels.size());
  for (const Kernel& k : cubin->kernels) {
    SCOPED_TRACE(k.name);
    const Kernel* p = ptx->FindKernel(k.name);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->params, k.params);
    EXPECT_EQ(p->param_bytes, k.param_bytes);
  }
}

TEST(FatbinFixtures, MultiArchSelection) {
  REQUIRE_FIXTURES();
  const Bytes fb = Fixture("multi.fatbin");
  // Three entries: sm_75 and sm_90 cubins, compute_90 PTX.
  int elf = 0, ptx = 0;
  for (const EntryAt& e : Entries(fb)) (e.kind == 2 ? elf : ptx)++;
  EXPECT_EQ(elf, 2);
  EXPECT_EQ(ptx, 1);
  const std::pair<uint32_t, uint32_t> cases[] = {{90, 90}, {89, 75}, {86, 75},  {75, 75},
                                                 {74, 75}, {0, 75},  {100, 90}, {0xffffffff, 90}};
  for (const auto& [prefer, want] : cases) {
    SCOPED_TRACE(prefer);
    auto m = Parse(fb, prefer);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_FALSE(m->from_ptx);
    EXPECT_EQ(m->sm_arch, want);
    ExpectKernelsOf(*m);  // offsets and sizes do not depend on the arch [recipes]
  }
}

TEST(FatbinFixtures, CompressedEntries) {
  REQUIRE_FIXTURES();
  // -Xfatbin=-compress-all: --compress-mode=size gives zstd (0x8000), speed gives LZ4 (0x2000).
  for (const auto& [file, flag] : {std::pair{"zstd.fatbin", 0x8000ull}, std::pair{"lz4.fatbin", 0x2000ull}}) {
    SCOPED_TRACE(file);
    const Bytes fb = Fixture(file);
    for (const EntryAt& e : Entries(fb)) {
      EXPECT_EQ(e.flags & 0xa000, flag) << "entry at " << e.off;
      EXPECT_GT(e.uncompressed_size, e.compressed_size);
    }
    auto m = Parse(fb);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_FALSE(m->from_ptx);
    EXPECT_EQ(m->sm_arch, 90u);
    ExpectKernelsOf(*m);
  }
}

TEST(FatbinFixtures, PtxOnlyFatbins) {
  REQUIRE_FIXTURES();
  // nvcc 13 zstd-compresses PTX by default [recipes]; --compress-mode=none stores it raw.
  for (const auto& [file, flag] : {std::pair{"ptxonly.fatbin", 0x8000ull}, std::pair{"ptxraw.fatbin", 0ull}}) {
    SCOPED_TRACE(file);
    const Bytes fb = Fixture(file);
    const auto entries = Entries(fb);
    ASSERT_EQ(entries.size(), 1u);
    EXPECT_EQ(entries[0].kind, 1);
    EXPECT_EQ(entries[0].flags & 0xa000, flag);
    auto m = Parse(fb, 75);  // the only PTX entry is compute_90 > 75: the lowest is taken
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_TRUE(m->from_ptx);
    EXPECT_EQ(m->sm_arch, 0u);
    ExpectKernelsOf(*m);
  }
}

TEST(FatbinFixtures, ImageSize) {
  REQUIRE_FIXTURES();
  for (const char* file : {"sm90.fatbin", "multi.fatbin", "zstd.fatbin", "sm90.cubin"}) {
    SCOPED_TRACE(file);
    Bytes b = Fixture(file);
    const uint64_t size = b.size();
    auto n = ImageSize(b.data(), size);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, size);
    b.resize(b.size() + 100, 0xee);  // trailing bytes are not part of the image
    n = ImageSize(b.data(), b.size());
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, size);
    EXPECT_FALSE(ImageSize(b.data(), size - 1).ok());
    EXPECT_TRUE(Parse(b).ok());
  }
  Bytes ptx = PtxFixture();
  const uint64_t len = ptx.size();
  ptx.resize(ptx.size() + 50, 'x');
  auto n = ImageSize(ptx.data(), ptx.size());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, len);                                 // strlen + 1
  EXPECT_FALSE(ImageSize(ptx.data(), len - 1).ok());  // NUL not within max
}

// ---- positive: synthetic ------------------------------------------------------------------------
void ExpectHandWrittenPtx(const Module& m) {
  EXPECT_TRUE(m.from_ptx);
  ASSERT_EQ(m.kernels.size(), 3u);
  const Kernel* k = m.FindKernel("vec_kernel");
  ASSERT_NE(k, nullptr);
  const std::vector<KernelParam> want = {{0, 0, 1}, {1, 8, 8}, {2, 16, 8}, {3, 24, 6}, {4, 32, 16}, {5, 48, 2}};
  EXPECT_EQ(k->params, want);
  EXPECT_EQ(k->param_bytes, 50u);
  for (const char* name : {"noparams", "empty_parens"}) {
    ASSERT_NE(m.FindKernel(name), nullptr) << name;
    EXPECT_TRUE(m.FindKernel(name)->params.empty());
    EXPECT_EQ(m.FindKernel(name)->param_bytes, 0u);
  }
  EXPECT_EQ(m.FindKernel("ext_kernel"), nullptr);
  EXPECT_EQ(m.FindKernel("fake"), nullptr);
  std::map<std::string, uint64_t> globals;
  for (const Global& g : m.globals) globals[g.name] = g.size;
  const std::map<std::string, uint64_t> want_globals = {{"gv", 40}, {"cv", 48}, {"$str", 3},      {"a", 4},
                                                        {"b", 16},  {"c", 4},   {"managed_v", 4}, {"vec4", 16}};
  EXPECT_EQ(globals, want_globals);
}

TEST(FatbinSynthetic, HandWrittenPtx) {
  auto m = Parse(PtxBytes(kPtx));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectHandWrittenPtx(*m);
}

TEST(FatbinSynthetic, PtxEntriesRawLz4Zstd) {
  Spec raw;
  raw.data = PtxBytes(kPtx);
  raw.data.resize((raw.data.size() + 7) / 8 * 8, 0);
  for (const Spec& s : {raw, Lz4Spec(kPtx), ZstdSpec(kPtx)}) {
    SCOPED_TRACE(s.flags);
    auto m = Parse(MakeFatbin({s}));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ExpectHandWrittenPtx(*m);
  }
}

TEST(FatbinSynthetic, PtxEntrySelectionAndSkippedKinds) {
  Spec lto;  // kind 8 (LTO-IR) entries are skipped
  lto.kind = 8;
  lto.data = Bytes(16, 0xab);
  Spec p75 = ZstdSpec(".version 8.0\n.target sm_75\n.entry k75(.param .u32 x) { ret; }");
  p75.arch = 75;
  Spec p90 = ZstdSpec(".version 8.0\n.target sm_90\n.entry k90(.param .u64 x) { ret; }");
  auto m = Parse(MakeFatbin({lto, p90, p75}), 80);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_NE(m->FindKernel("k75"), nullptr);
  m = Parse(MakeFatbin({lto, p75, p90}), 95);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_NE(m->FindKernel("k90"), nullptr);
  EXPECT_EQ(m->FindKernel("k90")->params, (std::vector<KernelParam>{{0, 0, 8}}));
  auto none = Parse(MakeFatbin({lto}));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kNotFound);
  EXPECT_EQ(Parse(MakeFatbin({})).status().code(), Code::kNotFound);
}

TEST(FatbinSynthetic, OnlyFirstContainerIsRead) {
  Spec s;
  s.data = PtxBytes(".version 8.0\n.entry first() {}");
  Bytes fb = MakeFatbin({s});
  const uint64_t first = fb.size();
  s.data = PtxBytes(".version 8.0\n.entry second() {}");
  const Bytes second = MakeFatbin({s});
  fb.insert(fb.end(), second.begin(), second.end());
  auto m = Parse(fb);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_NE(m->FindKernel("first"), nullptr);
  EXPECT_EQ(m->FindKernel("second"), nullptr);
  auto n = ImageSize(fb.data(), fb.size());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, first);
}

// ---- negative: table-driven ---------------------------------------------------------------------
struct BadCase {
  std::string what;
  Bytes image;
};

void ExpectAllFail(const std::vector<BadCase>& cases) {
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    // An exact-size heap copy, so ASan catches any read past the end.
    const auto copy = std::make_unique<uint8_t[]>(std::max<size_t>(c.image.size(), 1));
    if (!c.image.empty()) std::memcpy(copy.get(), c.image.data(), c.image.size());
    const std::span<const uint8_t> s(copy.get(), c.image.size());
    auto m = ParseImage(s, 90);
    EXPECT_FALSE(m.ok());
    if (!m.ok()) {
      EXPECT_FALSE(m.status().message().empty());
      if (std::getenv("FATBIN_TEST_VERBOSE"))
        std::printf("%-45s -> %s\n", c.what.c_str(), m.status().ToString().c_str());
    }
  }
}

TEST(FatbinNegative, UnrecognisedImages) {
  Bytes wrapper(16, 0);
  Put<uint32_t>(wrapper, 0, 0x466243B1);
  Bytes ptx_no_nul(kPtx, kPtx + sizeof kPtx - 1);
  Bytes ptx_no_version = PtxBytes(".target sm_90\n.entry k() {}");
  Bytes ptx_control = PtxBytes(".version 8.0\n\x01.entry k() {}");
  ExpectAllFail({{"empty", {}},
                 {"one byte", {0x50}},
                 {"wrong magic", {0x51, 0xed, 0x55, 0xba, 1, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
                 {"fatbin wrapper", wrapper},
                 {"PTX without NUL", ptx_no_nul},
                 {"PTX without .version", ptx_no_version},
                 {"PTX with control bytes", ptx_control},
                 {"random", {1, 2, 3, 4, 5, 6, 7, 8, 0}}});
  auto w = ParseImage(wrapper);
  EXPECT_NE(w.status().message().find("__fatBinC_Wrapper_t"), std::string::npos);
  EXPECT_FALSE(ImageSize(wrapper.data(), wrapper.size()).ok());
  EXPECT_FALSE(ImageSize(nullptr, 100).ok());
}

TEST(FatbinNegative, FatbinHeadersAndEntries) {
  Spec ptx;
  ptx.data = PtxBytes(kPtx);
  const Bytes good = MakeFatbin({ptx});
  ASSERT_TRUE(Parse(good).ok());
  std::vector<BadCase> cases;
  for (size_t len = 0; len < 16 + 64; ++len)  // truncated container and entry headers
    cases.push_back(
        {"truncated to " + std::to_string(len), Bytes(good.begin(), good.begin() + static_cast<ptrdiff_t>(len))});
  auto mut = [&](std::string what, auto f) {
    Bytes b = good;
    f(b);
    cases.push_back({std::move(what), b});
  };
  mut("version 2", [](Bytes& b) { Put<uint16_t>(b, 4, 2); });
  mut("header_size 8", [](Bytes& b) { Put<uint16_t>(b, 6, 8); });
  mut("header_size 0xffff", [](Bytes& b) { Put<uint16_t>(b, 6, 0xffff); });
  mut("payload_size +1", [](Bytes& b) { Put<uint64_t>(b, 8, Get<uint64_t>(b, 8) + 1); });
  mut("payload_size max", [](Bytes& b) { Put<uint64_t>(b, 8, ~0ull); });
  mut("payload_size max-15", [](Bytes& b) { Put<uint64_t>(b, 8, ~0ull - 15); });
  mut("payload_size 10 (partial entry header)", [](Bytes& b) { Put<uint64_t>(b, 8, 10); });
  mut("entry hdr_size 0", [](Bytes& b) { Put<uint32_t>(b, 16 + 4, 0); });
  mut("entry hdr_size 63", [](Bytes& b) { Put<uint32_t>(b, 16 + 4, 63); });
  mut("entry hdr_size max", [](Bytes& b) { Put<uint32_t>(b, 16 + 4, ~0u); });
  mut("entry size +1", [](Bytes& b) { Put<uint64_t>(b, 16 + 8, Get<uint64_t>(b, 16 + 8) + 1); });
  mut("entry size max", [](Bytes& b) { Put<uint64_t>(b, 16 + 8, ~0ull); });
  mut("entry size max-63", [](Bytes& b) { Put<uint64_t>(b, 16 + 8, ~0ull - 63); });
  mut("both compression flags", [](Bytes& b) { Put<uint64_t>(b, 16 + 40, 0xa011); });
  mut("zstd flag on raw text", [](Bytes& b) {
    Put<uint64_t>(b, 16 + 40, 0x8011);
    Put<uint32_t>(b, 16 + 16, 100);
    Put<uint64_t>(b, 16 + 56, 1000);
  });
  mut("lz4 flag, compressed_size 0", [](Bytes& b) {
    Put<uint64_t>(b, 16 + 40, 0x2011);
    Put<uint64_t>(b, 16 + 56, 1000);
  });

  auto cmut = [&](std::string what, const Spec& s, auto f) {
    Bytes b = MakeFatbin({s});
    ASSERT_TRUE(Parse(b).ok()) << what;
    f(b);
    cases.push_back({std::move(what), b});
  };
  for (const Spec& s : {Lz4Spec(kPtx), ZstdSpec(kPtx)}) {
    const std::string name = s.flags & 0x2000 ? "lz4 " : "zstd ";
    const uint32_t csize = s.compressed_size;
    cmut(name + "compressed_size > size", s,
         [](Bytes& b) { Put<uint32_t>(b, 16 + 16, static_cast<uint32_t>(Get<uint64_t>(b, 16 + 8) + 1)); });
    cmut(name + "compressed_size max", s, [](Bytes& b) { Put<uint32_t>(b, 16 + 16, ~0u); });
    cmut(name + "compressed_size halved", s, [csize](Bytes& b) { Put<uint32_t>(b, 16 + 16, csize / 2); });
    cmut(name + "uncompressed_size 0", s, [](Bytes& b) { Put<uint64_t>(b, 16 + 56, 0); });
    cmut(name + "uncompressed_size - 1", s, [](Bytes& b) { Put<uint64_t>(b, 16 + 56, Get<uint64_t>(b, 16 + 56) - 1); });
    cmut(name + "uncompressed_size + 1", s, [](Bytes& b) { Put<uint64_t>(b, 16 + 56, Get<uint64_t>(b, 16 + 56) + 1); });
    cmut(name + "uncompressed_size 256 MiB + 1", s, [](Bytes& b) { Put<uint64_t>(b, 16 + 56, (256ull << 20) + 1); });
    cmut(name + "uncompressed_size max", s, [](Bytes& b) { Put<uint64_t>(b, 16 + 56, ~0ull); });
    cmut(name + "payload zeroed", s, [csize](Bytes& b) { std::fill_n(b.begin() + 80, csize, 0); });
    cmut(name + "payload 0xff", s, [csize](Bytes& b) { std::fill_n(b.begin() + 80, csize, 0xff); });
  }
  ExpectAllFail(cases);

  // The size limit is reported as such.
  Spec z = ZstdSpec(kPtx);
  z.uncompressed_size = (256ull << 20) + 1;
  EXPECT_EQ(Parse(MakeFatbin({z})).status().code(), Code::kResourceExhausted);
}

TEST(FatbinNegative, EveryPrefixOfEveryFixtureFails) {
  REQUIRE_FIXTURES();
  for (const char* file : {"sm90.fatbin", "multi.fatbin", "zstd.fatbin", "lz4.fatbin", "sm90.cubin"}) {
    SCOPED_TRACE(file);
    const Bytes b = Fixture(file);
    for (size_t len = 0; len < b.size(); ++len) {
      // Every length near both ends, a sample in between (each is an exact-size copy for ASan).
      if (len > 2048 && len + 2048 < b.size() && len % 61 != 0) continue;
      auto copy = std::make_unique<uint8_t[]>(std::max<size_t>(len, 1));
      std::memcpy(copy.get(), b.data(), len);
      ASSERT_FALSE(ParseImage({copy.get(), len}).ok()) << "prefix " << len;
      ASSERT_FALSE(ImageSize(copy.get(), len).ok()) << "prefix " << len;
    }
  }
  // PTX: without its NUL every prefix is rejected; cut and re-terminated, it must not crash.
  const Bytes ptx = PtxFixture();
  for (size_t len = 0; len + 1 < ptx.size(); ++len) {
    auto copy = std::make_unique<uint8_t[]>(len + 1);
    std::memcpy(copy.get(), ptx.data(), len);
    ASSERT_FALSE(ParseImage({copy.get(), len}).ok()) << "prefix " << len;
    copy[len] = 0;
    (void)ParseImage({copy.get(), len + 1});
  }
}

TEST(FatbinNegative, CorruptCompressedFixtureEntries) {
  REQUIRE_FIXTURES();
  std::vector<BadCase> cases;
  for (const char* file : {"zstd.fatbin", "lz4.fatbin"}) {
    const Bytes fb = Fixture(file);
    for (const EntryAt& e : Entries(fb)) {
      if (e.kind != 2) continue;
      const size_t data = e.off + e.hdr_size;
      Bytes b = fb;
      for (size_t i = 0; i < e.compressed_size; i += 7) b[data + i] ^= 0x5a;
      cases.push_back({std::string(file) + " scrambled cubin", b});
      b = fb;
      Put<uint64_t>(b, e.off + 56, e.uncompressed_size * 2);
      cases.push_back({std::string(file) + " wrong uncompressed_size", b});
    }
  }
  ExpectAllFail(cases);
}

TEST(FatbinNegative, CorruptCubins) {
  REQUIRE_FIXTURES();
  const Bytes good = Fixture("sm90.cubin");
  const TestElf elf{good};
  const uint64_t shoff = Get<uint64_t>(good, 0x28);
  const size_t symtab = elf.Find(".symtab");
  const size_t info = elf.Find(".nv.info._Z7k_mixedPiif1Sc");
  const auto kparam = [&](uint16_t ordinal) {
    return elf.Record(info, 0x17, [&](size_t p) { return Get<uint16_t>(good, p + 8) == ordinal; });
  };
  std::vector<BadCase> cases;
  auto mut = [&](std::string what, auto f) {
    Bytes b = good;
    f(b);
    cases.push_back({std::move(what), b});
  };
  mut("ELFCLASS32", [](Bytes& b) { b[4] = 1; });
  mut("big-endian", [](Bytes& b) { b[5] = 2; });
  mut("e_machine x86-64", [](Bytes& b) { Put<uint16_t>(b, 0x12, 62); });
  mut("no section table", [](Bytes& b) { Put<uint64_t>(b, 0x28, 0); });
  mut("section table past the end", [&](Bytes& b) { Put<uint64_t>(b, 0x28, b.size() - 10); });
  mut("section table at max", [](Bytes& b) { Put<uint64_t>(b, 0x28, ~0ull - 8); });
  mut("e_shnum 0xffff", [](Bytes& b) { Put<uint16_t>(b, 0x3c, 0xffff); });
  mut("e_shentsize 10", [](Bytes& b) { Put<uint16_t>(b, 0x3a, 10); });
  mut("e_shstrndx out of range", [](Bytes& b) { Put<uint16_t>(b, 0x3e, 0xfffe); });
  mut("extended shnum huge", [&](Bytes& b) {
    Put<uint16_t>(b, 0x3c, 0);
    Put<uint64_t>(b, shoff + 32, 1ull << 40);
  });
  mut("program headers past the end", [&](Bytes& b) { Put<uint64_t>(b, 0x20, b.size() - 8); });
  mut("segment past the end", [&](Bytes& b) { Put<uint64_t>(b, Get<uint64_t>(b, 0x20) + 56 + 32, b.size()); });
  mut("section offset past the end", [&](Bytes& b) { Put<uint64_t>(b, elf.Shdr(symtab) + 24, b.size()); });
  mut("section size overflows", [&](Bytes& b) { Put<uint64_t>(b, elf.Shdr(symtab) + 32, ~0ull); });
  mut("symtab entsize 0", [&](Bytes& b) { Put<uint64_t>(b, elf.Shdr(symtab) + 56, 0); });
  mut("symtab link out of range", [&](Bytes& b) { Put<uint32_t>(b, elf.Shdr(symtab) + 40, 9999); });
  mut("no symtab", [&](Bytes& b) { Put<uint32_t>(b, elf.Shdr(symtab) + 4, 1); });
  mut("symbol names past strtab", [&](Bytes& b) {
    for (size_t i = 1; i < elf.Size(symtab) / 24; ++i) Put<uint32_t>(b, elf.Offset(symtab) + i * 24, 0x7fffffff);
  });
  mut("symbol section index out of range", [&](Bytes& b) {
    for (size_t i = 1; i < elf.Size(symtab) / 24; ++i) Put<uint16_t>(b, elf.Offset(symtab) + i * 24 + 6, 0xfe00);
  });
  mut("strtab not NUL-terminated", [&](Bytes& b) {
    const size_t st = Get<uint32_t>(b, elf.Shdr(symtab) + 40);
    std::fill_n(b.begin() + static_cast<ptrdiff_t>(elf.Offset(st)), elf.Size(st), 'A');
  });
  mut(".nv.info record length past the end", [&](Bytes& b) { Put<uint16_t>(b, elf.Offset(info) + 2, 0xffff); });
  mut(".nv.info unknown format", [&](Bytes& b) { b[elf.Offset(info)] = 9; });
  mut(".nv.info truncated record", [&](Bytes& b) { Put<uint64_t>(b, elf.Shdr(info) + 32, elf.Size(info) - 2); });
  mut("KPARAM_INFO record too short", [&](Bytes& b) { Put<uint16_t>(b, kparam(0) + 2, 8); });
  mut("duplicate ordinal", [&](Bytes& b) { Put<uint16_t>(b, kparam(2) + 8, 1); });
  mut("missing ordinal", [&](Bytes& b) { Put<uint16_t>(b, kparam(0) + 8, 7); });
  mut("offset beyond CBANK_PARAM_SIZE", [&](Bytes& b) { Put<uint16_t>(b, kparam(4) + 10, 0xfff0); });
  mut("size beyond CBANK_PARAM_SIZE",
      [&](Bytes& b) { Put<uint32_t>(b, kparam(4) + 12, 0xfffc0000u | (Get<uint32_t>(b, kparam(4) + 12) & 0x3ffff)); });
  mut("CBANK_PARAM_SIZE too small",
      [&](Bytes& b) { Put<uint16_t>(b, elf.Record(info, 0x19, [](size_t) { return true; }) + 2, 40); });
  ExpectAllFail(cases);
}

TEST(FatbinNegative, BadPtx) {
  const char* const cases[] = {
      ".version 8.0\n.entry",                                    // no name
      ".version 8.0\n.entry 5k() {}",                            // bad name
      ".version 8.0\n.entry k(.param .u32) {}",                  // no parameter name
      ".version 8.0\n.entry k(.param .q32 x) {}",                // unknown type
      ".version 8.0\n.entry k(.param x) {}",                     // no type
      ".version 8.0\n.entry k(.param .align 3 .b8 x[4]) {}",     // alignment not a power of 2
      ".version 8.0\n.entry k(.param .align .b8 x[4]) {}",       // missing alignment
      ".version 8.0\n.entry k(.param .b8 x[]) {}",               // unsized parameter
      ".version 8.0\n.entry k(.param .b8 x[4) {}",               // missing ]
      ".version 8.0\n.entry k(.param .u32 x .param .u32 y) {}",  // missing comma
      ".version 8.0\n.entry k(.param .u32 x,",                   // unterminated list
      ".version 8.0\n.entry k(.reg .u32 x) {}",                  // not .param
      ".version 8.0\n.entry k(.param .b8 x[4294967296]) {}",     // over the parameter cap
      ".version 8.0\n.entry k(.param .b8 x[600000], .param .b8 y[600000]) {}",
      ".version 8.0\n.entry k(.param .b8 x[18446744073709551616]) {}",  // not a uint64
      ".version 8.0\n.global .b8 v[18446744073709551615][2];",          // size overflows
      ".version 8.0\n.global .b8 v[];",                                 // unsized, no initializer
      ".version 8.0\n.global .u32 v",                                   // unterminated
      ".version 8.0\n.global .u32 v = {1, 2",                           // unterminated initializer
      ".version 8.0\n.global .u32 v, ;",                                // missing declarator
      ".version 8.0\n.global .attribute .u32 v;",                       // .attribute without (
  };
  std::vector<BadCase> bad;
  for (const char* c : cases) bad.push_back({c, PtxBytes(c)});
  ExpectAllFail(bad);
}

// ---- mutation smoke test: any result is fine, a crash or sanitizer report is not ---------------
TEST(FatbinNegative, RandomMutationsDoNotCrash) {
  std::vector<Bytes> seeds;
  Spec ptx;
  ptx.data = PtxBytes(kPtx);
  seeds.push_back(MakeFatbin({ptx}));
  seeds.push_back(MakeFatbin({Lz4Spec(kPtx)}));
  seeds.push_back(MakeFatbin({ZstdSpec(kPtx)}));
  seeds.push_back(PtxBytes(kPtx));
  if (ORION_FATBIN_HAVE_FIXTURES)
    for (const char* f : {"sm90.cubin", "multi.fatbin", "lz4.fatbin"}) seeds.push_back(Fixture(f));
  std::mt19937_64 rng(12345);
  size_t ok = 0, runs = 0;
  for (const Bytes& seed : seeds) {
    for (int iter = 0; iter < 1500; ++iter) {
      Bytes b = seed;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t at = rng() % b.size();
        switch (rng() % 4) {
          case 0: b[at] = static_cast<uint8_t>(rng()); break;
          case 1: b[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
          case 2:
            if (at + 8 <= b.size()) Put<uint64_t>(b, at & ~size_t{3}, rng() % 2 ? ~0ull >> (rng() % 64) : rng() % 256);
            break;
          case 3:
            if (at + 4 <= b.size()) Put<uint32_t>(b, at & ~size_t{3}, static_cast<uint32_t>(rng() % 2 ? 0 : rng()));
            break;
        }
      }
      if (rng() % 8 == 0) b.resize(rng() % b.size());
      auto copy = std::make_unique<uint8_t[]>(std::max<size_t>(b.size(), 1));
      if (!b.empty()) std::memcpy(copy.get(), b.data(), b.size());
      auto m = ParseImage({copy.get(), b.size()}, static_cast<uint32_t>(rng() % 128));
      ok += m.ok();
      (void)ImageSize(copy.get(), b.size());
      ++runs;
    }
  }
  std::printf("mutations: %zu of %zu parsed\n", ok, runs);
}

}  // namespace
}  // namespace orion::fatbin
