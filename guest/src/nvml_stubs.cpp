// A NOT_SUPPORTED stub for every NVML entry point Orion does not implement, and the ORION_COVERAGE
// report of libnvidia-ml.so.1.
//
// Every nvmlReturn_t entry point of nvml.h (nvml_api.inc) gets a weak definition that logs its name
// once and returns NVML_ERROR_NOT_SUPPORTED; the implemented ones (strong definitions in nvml.cpp)
// win at link time, so `nm -D` shows T for real and W for refused (scripts/coverage-report). Every
// such entry point returns nvmlReturn_t (an int), so a stub ignoring its arguments is ABI-safe.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "log.h"
#include "nvml_abi.h"
#include "nvml_coverage.h"

namespace orion::guest {
namespace {

constexpr size_t kSyms = static_cast<size_t>(NvmlSym::kCount);
const char* const kNames[] = {
#define ORION_NVML_SYMBOL(s) #s,
#define ORION_NVML_OTHER(s) #s,
#include "nvml_api.inc"
#undef ORION_NVML_OTHER
#undef ORION_NVML_SYMBOL
};
static_assert(sizeof kNames / sizeof kNames[0] == kSyms);

struct Coverage {
  std::atomic<uint64_t> calls[kSyms]{};
  std::atomic<bool> real[kSyms]{};
  std::atomic<bool> warned[kSyms]{};
};
Coverage& Cov() {
  static Coverage* c = new Coverage();  // leaked: used by exit handlers
  return *c;
}

nvmlReturn_t StubCalled(NvmlSym s) noexcept {
  NvmlCoverageHit(s, false);
  if (!Cov().warned[static_cast<size_t>(s)].exchange(true)) {
    LogWarn(std::string(kNames[static_cast<size_t>(s)]) +
            " is not supported by Orion; returning NVML_ERROR_NOT_SUPPORTED");
  }
  return NVML_ERROR_NOT_SUPPORTED;
}

}  // namespace

void NvmlCoverageHit(NvmlSym s, bool real) noexcept {
  const auto i = static_cast<size_t>(s);
  Cov().calls[i].fetch_add(1, std::memory_order_relaxed);
  if (real && !Cov().real[i].load(std::memory_order_relaxed)) Cov().real[i].store(true, std::memory_order_relaxed);
}

// ORION_COVERAGE=1: at exit, the NVML entry points the program called, how often, and whether each
// is implemented (real) or answered NVML_ERROR_NOT_SUPPORTED (STUB); the summary line says "nvml:"
// so it is told apart from libcuda.so.1's.
__attribute__((destructor)) static void NvmlCoverageReport() {
  const char* e = std::getenv("ORION_COVERAGE");
  if (e == nullptr || *e == '\0' || std::strcmp(e, "0") == 0) return;
  size_t called = 0, real = 0;
  std::string lines;
  for (size_t i = 0; i < kSyms; ++i) {
    const uint64_t n = Cov().calls[i].load();
    if (n == 0) continue;
    ++called;
    const bool r = Cov().real[i].load();
    real += r;
    lines += std::string("orion-coverage: ") + (r ? "real " : "STUB ") + kNames[i] + " " + std::to_string(n) + "\n";
  }
  std::fprintf(stderr, "%sorion-coverage: nvml: %zu entry points called, %zu real, %zu not supported\n", lines.c_str(),
               called, real, called - real);
}

}  // namespace orion::guest

using orion::guest::NvmlSym;

// orion_nvml_stubimpl_<sym> is the stub itself (hidden); <sym> is a weak alias of it, replaced by the
// real definition where one exists.
extern "C" {
#define ORION_NVML_SYMBOL(s)                                                                 \
  __attribute__((visibility("hidden"))) nvmlReturn_t orion_nvml_stubimpl_##s() noexcept {    \
    return orion::guest::StubCalled(NvmlSym::s);                                             \
  }                                                                                          \
  __attribute__((visibility("default"))) nvmlReturn_t orion_nvml_stub_##s() noexcept asm(#s) \
      __attribute__((weak, alias("orion_nvml_stubimpl_" #s)));
#include "nvml_api.inc"
#undef ORION_NVML_SYMBOL
}
