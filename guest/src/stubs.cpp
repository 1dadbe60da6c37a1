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

extern "C" {
#define ORION_CUDA_SYMBOL(s)                                                        \
  ORION_EXPORT __attribute__((weak)) CUresult orion_stub_##s() asm(#s);            \
  ORION_EXPORT __attribute__((weak)) CUresult orion_stub_##s() { return StubCalled(Sym::s); }
#include "cuda_api.inc"
#undef ORION_CUDA_SYMBOL
}

