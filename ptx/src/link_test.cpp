// PTX linking (orion/ptx/link.h): modules nvcc compiled with -rdc=true (tests/data/link_a.cu,
// link_b.cu) linked and then run on the executor, and the linker's rules on hand-written PTX.
#include "orion/ptx/link.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "orion/ptx/ptx.h"
#include "test_memory.h"

namespace orion::ptx {
namespace {

std::string Slurp(const char* path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs kernel `name(int* a, int n)` of `text` over `in`; returns a.
std::vector<int32_t> RunKernel(const std::string& text, const char* name, const std::vector<int32_t>& in,
                               LaunchResult* res = nullptr) {
  auto prog = Parse(text);
  EXPECT_TRUE(prog.ok()) << prog.status().message();
  if (!prog.ok()) return {};
  TestMemory mem;
  std::vector<uint64_t> vars;
  for (const ModuleVar& v : Vars(**prog)) {
    const uint64_t a = mem.Alloc(std::max<uint64_t>(v.size, 1));
    std::memcpy(mem.Host(a), v.init.data(), std::min<size_t>(v.init.size(), v.size));
    vars.push_back(a);
  }
  const uint64_t buf = mem.Upload(in);
  uint8_t params[16] = {};
  const int32_t n = static_cast<int32_t>(in.size());
  std::memcpy(params, &buf, 8);
  std::memcpy(params + 8, &n, 4);
  LaunchConfig cfg;
  cfg.grid[0] = 1;
  cfg.block[0] = static_cast<uint32_t>(in.size());
  cfg.params = params;
  cfg.param_bytes = 12;
  cfg.var_addrs = vars.data();
  LaunchResult r = Launch(**prog, name, cfg, mem);
  if (res != nullptr) *res = r;
  EXPECT_EQ(r.code, CUDA_SUCCESS) << r.message;
  return mem.Download<int32_t>(buf, in.size());
}

const char* kHeader = ".version 8.0\n.target sm_75\n.address_size 64\n";

#ifdef ORION_LINK_FIXTURE_A
TEST(PtxLink, NvccSeparateCompilationLinksAndRuns) {
  const std::string a = Slurp(ORION_LINK_FIXTURE_A), b = Slurp(ORION_LINK_FIXTURE_B);
  ASSERT_NE(a.find(".extern .func"), std::string::npos);  // the fixture really needs linking
  // Alone, A has undefined references; Parse would accept it, the linker does not.
  auto alone = LinkText({a});
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), Code::kNotFound);
  EXPECT_NE(alone.status().message().find("_Z5scalei"), std::string::npos) << alone.status().message();
  for (const auto& order : {std::vector<std::string_view>{a, b}, std::vector<std::string_view>{b, a}}) {
    auto linked = LinkText(order);
    ASSERT_TRUE(linked.ok()) << linked.status().message();
    std::vector<int32_t> in(40);
    for (int i = 0; i < 40; ++i) in[i] = i - 5;
    const std::vector<int32_t> out = RunKernel(*linked, "apply", in);
    ASSERT_EQ(out.size(), in.size());
    for (int i = 0; i < 40; ++i) EXPECT_EQ(out[i], in[i] * 3 + 7) << i;  // scale() and bias from B
#ifdef ORION_PTXAS
    // NVIDIA's own assembler (what the cuda backend's driver JIT runs) accepts the linked module.
    const std::string path = ::testing::TempDir() + "/orion_linked.ptx";
    std::ofstream(path) << *linked;
    const std::string cmd = std::string(ORION_PTXAS) + " -arch=sm_75 " + path + " -o /dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << *linked;
#endif
  }
}
#endif

TEST(PtxLink, WeakYieldsToVisibleAndTwoVisibleAreAnError) {
  const std::string user =
      std::string(kHeader) +
      ".extern .func (.param .b32 r) f(.param .b32 x);\n"
      ".visible .entry k(.param .u64 p, .param .u32 n)\n{\n.reg .b32 %r<4>;\n.reg .b64 %rd<4>;\n"
      "ld.param.u64 %rd1, [p];\ncvta.to.global.u64 %rd1, %rd1;\nmov.u32 %r1, %tid.x;\nmul.wide.u32 %rd2, %r1, 4;\n"
      "add.s64 %rd3, %rd1, %rd2;\n{\n.param .b32 a0;\n.param .b32 r0;\nst.param.b32 [a0], %r1;\n"
      "call.uni (r0), f, (a0);\nld.param.b32 %r2, [r0];\n}\nst.global.u32 [%rd3], %r2;\nret;\n}\n";
  auto def = [](const char* linkage, int add) {
    return std::string(kHeader) + linkage +
           " .func (.param .b32 r) f(.param .b32 x)\n{\n.reg .b32 %r<3>;\n"
           "ld.param.b32 %r1, [x];\nadd.s32 %r2, %r1, " +
           std::to_string(add) + ";\nst.param.b32 [r], %r2;\nret;\n}\n";
  };
  const std::string weak = def(".weak", 100), strong = def(".visible", 1000), strong2 = def(".visible", 5);
  auto linked = LinkText({user, weak, strong});
  ASSERT_TRUE(linked.ok()) << linked.status().message();
  std::vector<int32_t> out = RunKernel(*linked, "k", std::vector<int32_t>(8, 0));
  ASSERT_EQ(out.size(), 8u);
  EXPECT_EQ(out[3], 1003);  // the .visible one
  linked = LinkText({user, weak, def(".weak", 200)});
  ASSERT_TRUE(linked.ok());
  out = RunKernel(*linked, "k", std::vector<int32_t>(8, 0));
  EXPECT_EQ(out[3], 103);  // the first .weak one
  auto dup = LinkText({user, strong, strong2});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("multiple definition of 'f'"), std::string::npos) << dup.status().message();
}

TEST(PtxLink, ModuleLocalNamesDoNotCollide) {
  // Both modules have a module-local function `g` and variable `c`, and each kernel must get its own.
  auto mod = [](const char* kernel, int value, int cval) {
    return std::string(kHeader) + ".global .align 4 .u32 c = " + std::to_string(cval) + ";\n" +
           ".func (.param .b32 r) g()\n{\n.reg .b32 %r<2>;\nmov.u32 %r1, " + std::to_string(value) +
           ";\nst.param.b32 [r], %r1;\nret;\n}\n.visible .entry " + kernel +
           "(.param .u64 p, .param .u32 n)\n{\n.reg .b32 %r<5>;\n.reg .b64 %rd<3>;\nld.param.u64 %rd1, [p];\n"
           "cvta.to.global.u64 %rd1, %rd1;\n{\n.param .b32 r0;\ncall.uni (r0), g, ();\nld.param.b32 %r1, [r0];\n}\n"
           "ld.global.u32 %r2, [c];\nadd.s32 %r3, %r1, %r2;\nst.global.u32 [%rd1], %r3;\nret;\n}\n";
  };
  auto linked = LinkText({mod("k1", 10, 1), mod("k2", 20, 2)});
  ASSERT_TRUE(linked.ok()) << linked.status().message();
  EXPECT_EQ(RunKernel(*linked, "k1", {0})[0], 11);
  EXPECT_EQ(RunKernel(*linked, "k2", {0})[0], 22);
}

TEST(PtxLink, BraceInitializedGlobalsKeepTheirSemicolon) {
  // libdevice's float64 trig tables (linked in by numba) are `.global ... = {...};`: the item must
  // end at the ';' after the braces, or the linked module does not parse (INVALID_IMAGE).
  const std::string m = std::string(kHeader) +
                        ".global .align 4 .b8 tbl[8] = {1, 0, 0, 0, 40, 0, 0, 0};\n"
                        ".const .align 4 .u32 pair[2] = {3, 4};\n"
                        ".visible .entry k(.param .u64 p, .param .u32 n)\n{\n.reg .b32 %r<6>;\n.reg .b64 %rd<3>;\n"
                        "ld.param.u64 %rd1, [p];\ncvta.to.global.u64 %rd1, %rd1;\nld.global.u32 %r1, [tbl+4];\n"
                        "ld.const.u32 %r2, [pair+4];\nadd.s32 %r3, %r1, %r2;\nst.global.u32 [%rd1], %r3;\nret;\n}\n";
  auto linked = LinkText({m});
  ASSERT_TRUE(linked.ok()) << linked.status().message();
  EXPECT_NE(linked->find("= {1, 0, 0, 0, 40, 0, 0, 0};"), std::string::npos) << *linked;
  ASSERT_TRUE(Parse(*linked).ok()) << Parse(*linked).status().message() << "\n" << *linked;
  EXPECT_EQ(RunKernel(*linked, "k", {0})[0], 44);
}

TEST(PtxLink, DriverFunctionsStayExternAndDebugInfoIsDropped) {
  const std::string m = std::string(kHeader) + ".file 1 \"/tmp/a.cu\"\n" +
                        ".extern .func (.param .b32 r) vprintf(.param .b64 f, .param .b64 a);\n"
                        ".visible .entry k(.param .u64 p, .param .u32 n)\n{\n.loc 1 3 1\nret;\n}\n";
  auto linked = LinkText({m, m.substr(0, m.find(".visible"))});
  ASSERT_TRUE(linked.ok()) << linked.status().message();
  EXPECT_NE(linked->find(".extern .func (.param .b32 r) vprintf"), std::string::npos);
  EXPECT_EQ(linked->find(".loc"), std::string::npos);
  EXPECT_EQ(linked->find(".file"), std::string::npos);
  EXPECT_TRUE(Parse(*linked).ok());
}

TEST(PtxLink, BadInputsAreRefused) {
  EXPECT_EQ(LinkText({}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(LinkText({"not ptx at all"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(LinkText({std::string(kHeader) + ".visible .entry k()\n{\nret;\n"}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(LinkText({std::string(kHeader) + "/* unterminated"}).status().code(), Code::kInvalidArgument);
  const std::string ok = std::string(kHeader) + ".visible .entry k()\n{\nret;\n}\n";
  std::vector<std::string_view> many(kMaxLinkModules, ok);
  EXPECT_EQ(LinkText(many).status().code(), Code::kInvalidArgument);
  auto undefined = LinkText({std::string(kHeader) + ".extern .global .align 4 .u32 nowhere;\n" + ok});
  ASSERT_FALSE(undefined.ok());
  EXPECT_NE(undefined.status().message().find("undefined reference to 'nowhere'"), std::string::npos);
  auto devrt = LinkText(
      {std::string(kHeader) + ".extern .func (.param .b64 r) cudaGetParameterBufferV2(.param .b64 a);\n" + ok});
  ASSERT_FALSE(devrt.ok());
  EXPECT_NE(devrt.status().message().find("libcudadevrt"), std::string::npos);
  // Numbers past int in .version and .target (a fuzzer's find: atoi overflowed) link as small ones.
  const std::string huge = ".version 936424714.9\n.target sm_99999999999\n.address_size 64\n";
  auto big = LinkText({huge + ".visible .entry k2()\n{\nret;\n}\n", ok});
  ASSERT_TRUE(big.ok()) << big.status().message();
  EXPECT_NE(big->find(".target sm_99999999999"), std::string::npos) << *big;  // the higher target wins
}

}  // namespace
}  // namespace orion::ptx
