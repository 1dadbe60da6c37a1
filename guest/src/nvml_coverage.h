// guest/src/nvml_coverage.h — the NVML entry points of Orion's libnvidia-ml.so.1 (nvml_api.inc,
// generated from nvml.h) and their call counters for ORION_COVERAGE (nvml_stubs.cpp).
#pragma once

#include <cstdint>

namespace orion::guest {

enum class NvmlSym : uint32_t {
#define ORION_NVML_SYMBOL(s) s,
#define ORION_NVML_OTHER(s) s,
#include "nvml_api.inc"
#undef ORION_NVML_OTHER
#undef ORION_NVML_SYMBOL
  kCount
};

// Counts a call of `s`; `real` for an implemented entry point, false for a stub. Thread-safe.
void NvmlCoverageHit(NvmlSym s, bool real) noexcept;

}  // namespace orion::guest
