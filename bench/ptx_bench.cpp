// ptx_bench — speed of the sim backend's PTX executor on one and on all cores: lane-instructions
// per second on nvcc-compiled kernels (tests/data/ptx_kernels.cu): a vector add of N elements and
// a tiled SGEMM of M^3, and the cost of a small launch (1024 elements, 2000 times). Results are
// checked against the host so a fast wrong executor cannot pass (the small launches' are not). Each
// kernel's first launch is timed on its own (the translator compiles it meanwhile, ptx/src/jit.h),
// then what translation did, then the launches that run its native code.
//
//   ptx_bench [--n 16777216] [--m 512] [--workers 2]
//   ptx_bench --translation FILE.ptx     what the translator covers of each kernel of FILE
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "orion/ptx/ptx.h"
#include "test_memory.h"

using namespace orion::ptx;

namespace {

using Memory = TestMemory;

struct Figure {
  double seconds;
  uint64_t lanes;
};

Figure Time(Program& p, const char* kernel, LaunchConfig cfg, Memory& mem) {
  const auto t0 = std::chrono::steady_clock::now();
  const LaunchResult r = Launch(p, kernel, cfg, mem);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.code != CUDA_SUCCESS) {
    std::fprintf(stderr, "ptx_bench: %s failed: %s\n", kernel, r.message.c_str());
    std::exit(1);
  }
  return {s, r.thread_instructions};
}

// The translator's work on `kernel` once its compilation is over (ptx::Translated), as a comment line.
void PrintTranslation(Program& p, const char* kernel) {
  auto t = Translated(p, kernel, true);
  if (!t.ok()) {
    std::fprintf(stderr, "ptx_bench: %s: %s\n", kernel, t.status().message().c_str());
    std::exit(1);
  }
  if (!t->enabled || !t->ready) {
    std::printf("# %s: not translated (%s): the interpreter runs it\n", kernel, t->why.c_str());
    return;
  }
  std::printf("# %s: %u of %u instructions translated, %u traces, compiled in %.1f ms\n", kernel, t->translated,
              t->instructions, t->traces, t->milliseconds);
}

}  // namespace

// --translation FILE.ptx: for each .entry of the file, how much of it the translator covers.
int Coverage(const char* path) {
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  auto prog = Parse(text.str());
  if (!prog.ok()) {
    std::fprintf(stderr, "ptx_bench: %s: %s\n", path, prog.status().message().c_str());
    return 1;
  }
  const std::string t = text.str();
  uint64_t all = 0, translated = 0;
  for (size_t pos = 0; (pos = t.find(".entry", pos)) != std::string::npos;) {
    pos += 6;
    while (pos < t.size() && std::isspace(static_cast<unsigned char>(t[pos]))) ++pos;
    size_t end = pos;
    while (end < t.size() && (std::isalnum(static_cast<unsigned char>(t[end])) || t[end] == '_' || t[end] == '$'))
      ++end;
    const std::string name = t.substr(pos, end - pos);
    auto tr = Translated(**prog, name, true);
    if (!tr.ok()) {
      std::printf("%-48s not lowered: %s\n", name.c_str(), tr.status().message().c_str());
      continue;
    }
    all += tr->instructions;
    translated += tr->translated;
    std::printf("%-48s %5u of %5u instructions translated (%3.0f%%), %4u traces, %7.1f ms%s%s\n", name.c_str(),
                tr->translated, tr->instructions, 100.0 * tr->translated / std::max(1u, tr->instructions), tr->traces,
                tr->milliseconds, tr->why.empty() ? "" : ": ", tr->why.c_str());
  }
  std::printf("# all kernels: %llu of %llu instructions translated (%.0f%%)\n",
              static_cast<unsigned long long>(translated), static_cast<unsigned long long>(all),
              100.0 * static_cast<double>(translated) / static_cast<double>(std::max<uint64_t>(1, all)));
  return 0;
}

int main(int argc, char** argv) {
  uint64_t n = 1u << 24;
  int m = 512;
  uint32_t workers = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--n")) n = std::stoull(argv[i + 1]);
    if (!std::strcmp(argv[i], "--m")) m = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--workers")) workers = static_cast<uint32_t>(std::stoul(argv[i + 1]));
    if (!std::strcmp(argv[i], "--translation")) return Coverage(argv[i + 1]);
  }
  std::ifstream f(ORION_PTX_FIXTURE);
  std::stringstream text;
  text << f.rdbuf();
  auto prog = Parse(text.str());
  if (!prog.ok()) {
    std::fprintf(stderr, "ptx_bench: %s\n", prog.status().message().c_str());
    return 1;
  }
  Memory mem;
  std::vector<uint64_t> vars;
  for (const ModuleVar& v : Vars(**prog)) vars.push_back(mem.Alloc(std::max<uint64_t>(v.size, 1)));

  std::printf("# PTX executor (sim backend), %s\n", ORION_PTX_FIXTURE);
  std::printf("%-34s %8s %10s %14s %12s\n", "kernel", "workers", "seconds", "lane-instr", "Minstr/s");
  // Vector add.
  {
    const uint64_t a = mem.Alloc(n * 4), b = mem.Alloc(n * 4), c = mem.Alloc(n * 4);
    auto* ha = reinterpret_cast<float*>(mem.Host(a));
    auto* hb = reinterpret_cast<float*>(mem.Host(b));
    for (uint64_t i = 0; i < n; ++i) ha[i] = static_cast<float>(i), hb[i] = 1.0f;
    uint8_t params[28];
    const int ni = static_cast<int>(n);
    std::memcpy(params, &a, 8), std::memcpy(params + 8, &b, 8), std::memcpy(params + 16, &c, 8);
    std::memcpy(params + 24, &ni, 4);
    // The first launch (on the interpreter while the translator compiles), then launches with the
    // translation in use (ORION_PTX_JIT=0: the interpreter's).
    const uint32_t kFirst = 0;
    for (uint32_t w : {kFirst, 1u, workers}) {
      if (w == 1) PrintTranslation(**prog, "_Z4vaddPKfS0_Pfi");
      LaunchConfig cfg;
      cfg.grid[0] = static_cast<uint32_t>((n + 255) / 256);
      cfg.block[0] = 256;
      cfg.params = params;
      cfg.param_bytes = 28;
      cfg.var_addrs = vars.data();
      cfg.workers = std::max(w, 1u);
      std::memset(mem.Host(c), 0, n * 4);
      const Figure fig = Time(**prog, "_Z4vaddPKfS0_Pfi", cfg, mem);
      const auto* hc = reinterpret_cast<const float*>(mem.Host(c));
      for (uint64_t i = 0; i < n; ++i)
        if (hc[i] != static_cast<float>(i) + 1.0f)
          return std::fprintf(stderr, "vadd wrong at %llu\n", (unsigned long long)i), 1;
      std::printf("%-34s %8u %10.3f %14llu %12.1f\n",
                  ("vadd n=" + std::to_string(n) + (w == kFirst ? " (first launch)" : "")).c_str(), cfg.workers,
                  fig.seconds, static_cast<unsigned long long>(fig.lanes),
                  static_cast<double>(fig.lanes) / fig.seconds / 1e6);
    }
  }
  // Small launches: a vector add of 1024 elements (4 blocks), launched many times; what each
  // launch costs beyond its instructions (host threads, blocks' state).
  {
    const uint64_t small = 1024;
    const uint64_t a = mem.Alloc(small * 4), b = mem.Alloc(small * 4), c = mem.Alloc(small * 4);
    uint8_t params[28];
    const int ni = static_cast<int>(small);
    std::memcpy(params, &a, 8), std::memcpy(params + 8, &b, 8), std::memcpy(params + 16, &c, 8);
    std::memcpy(params + 24, &ni, 4);
    for (uint32_t w : {1u, workers}) {
      LaunchConfig cfg;
      cfg.grid[0] = static_cast<uint32_t>(small / 256);
      cfg.block[0] = 256;
      cfg.params = params;
      cfg.param_bytes = 28;
      cfg.var_addrs = vars.data();
      cfg.workers = w;
      constexpr int kLaunches = 2000;
      double seconds = 0;
      uint64_t lanes = 0;
      for (int i = 0; i < kLaunches; ++i) {
        const Figure fig = Time(**prog, "_Z4vaddPKfS0_Pfi", cfg, mem);
        seconds += fig.seconds;
        lanes += fig.lanes;
      }
      std::printf("%-34s %8u %10.3f %14llu %12.1f   %.1f us/launch\n", "vadd n=1024 x2000 launches", w, seconds,
                  static_cast<unsigned long long>(lanes), static_cast<double>(lanes) / seconds / 1e6,
                  seconds / kLaunches * 1e6);
    }
  }
  // Tiled SGEMM (16x16 tiles in shared memory, __syncthreads).
  {
    const uint32_t kFirst = 0;
    const uint64_t bytes = uint64_t(m) * m * 4;
    const uint64_t A = mem.Alloc(bytes), B = mem.Alloc(bytes), C = mem.Alloc(bytes);
    auto* ha = reinterpret_cast<float*>(mem.Host(A));
    auto* hb = reinterpret_cast<float*>(mem.Host(B));
    for (int i = 0; i < m * m; ++i) ha[i] = static_cast<float>(i % 3), hb[i] = static_cast<float>(i % 5) - 2;
    uint8_t params[28];
    std::memcpy(params, &A, 8), std::memcpy(params + 8, &B, 8), std::memcpy(params + 16, &C, 8);
    std::memcpy(params + 24, &m, 4);
    for (uint32_t w : {kFirst, 1u, workers}) {
      if (w == 1) PrintTranslation(**prog, "_Z6matmulPKfS0_Pfi");
      LaunchConfig cfg;
      cfg.grid[0] = cfg.grid[1] = static_cast<uint32_t>((m + 15) / 16);
      cfg.block[0] = cfg.block[1] = 16;
      cfg.params = params;
      cfg.param_bytes = 28;
      cfg.var_addrs = vars.data();
      cfg.workers = std::max(w, 1u);
      const Figure fig = Time(**prog, "_Z6matmulPKfS0_Pfi", cfg, mem);
      const auto* hc = reinterpret_cast<const float*>(mem.Host(C));
      for (int k = 0; k < 64; ++k) {  // sampled entries
        const int i = (k * 7919) % m, j = (k * 104729) % m;
        float acc = 0;
        for (int q = 0; q < m; ++q) acc += ha[i * m + q] * hb[q * m + j];
        if (std::fabs(hc[i * m + j] - acc) > 1e-3f * std::max(1.0f, std::fabs(acc)))
          return std::fprintf(stderr, "sgemm wrong at %d,%d\n", i, j), 1;
      }
      std::printf("%-34s %8u %10.3f %14llu %12.1f\n",
                  ("sgemm tiled " + std::to_string(m) + "^3" + (w == kFirst ? " (first launch)" : "")).c_str(),
                  cfg.workers, fig.seconds, static_cast<unsigned long long>(fig.lanes),
                  static_cast<double>(fig.lanes) / fig.seconds / 1e6);
    }
  }
  return 0;
}
