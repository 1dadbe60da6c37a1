// A NOT_SUPPORTED stub for every driver entry point Orion does not implement.
#include "export.h"
#include "state.h"

using namespace orion::guest;

// ---- Stubs -------------------------------------------------------------------------------------
// Every driver symbol gets a weak definition that logs its name once and returns
// CUDA_ERROR_NOT_SUPPORTED; the implemented ones (strong definitions in api_*.cpp) win at link
// time. Every driver entry point returns CUresult, so a stub ignoring its arguments is ABI-safe.
namespace {
std::atomic<bool> g_warned[static_cast<size_t>(Sym::kCount)];
CUresult StubCalled(Sym s) noexcept {
  CoverageHit(s, false);
  if (!g_warned[static_cast<size_t>(s)].exchange(true)) {
    LogWarn(std::string(SymName(s)) + " is not supported by Orion; returning CUDA_ERROR_NOT_SUPPORTED");
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}
}  // namespace

// orion_stubimpl_<sym> is the stub itself (hidden); <sym> is a weak alias of it, replaced by the
// real definition where one exists. cuGetProcAddress compares the two to know what is real.
extern "C" {
#define ORION_CUDA_SYMBOL(s)                                                                                  \
  __attribute__((visibility("hidden"))) CUresult orion_stubimpl_##s() noexcept { return StubCalled(Sym::s); } \
  ORION_EXPORT CUresult orion_stub_##s() noexcept asm(#s) __attribute__((weak, alias("orion_stubimpl_" #s)));
#include "cuda_api.inc"
#undef ORION_CUDA_SYMBOL
}
