// Exported driver API: cuGetProcAddress (how cudart finds every entry point) and cuGetExportTable
// (the private tables NVIDIA's runtime and libraries require; the tables are in export_tables.cpp,
// their facts in docs/spec/export-tables.md).
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <utility>
#include <cstring>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "export.h"
#include "md2.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

// The exported symbol of every driver entry point, real or stub (stubs.cpp), for the table.
extern "C" {
#define ORION_CUDA_SYMBOL(s)         \
  CUresult orion_stub_##s() asm(#s); \
  __attribute__((visibility("hidden"))) CUresult orion_stubimpl_##s();
#include "cuda_api.inc"
#undef ORION_CUDA_SYMBOL
}

namespace {

// ---- cuGetProcAddress table --------------------------------------------------------------------
struct ProcRow {
  int version;
  bool ptds;
  void* fn;
  bool stub;  // fn is the NOT_SUPPORTED stub
};

const std::unordered_map<std::string_view, std::vector<ProcRow>>& ProcTable() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string_view, std::vector<ProcRow>>();
#define ORION_CUDA_PROC(name, version, kind, sym)                                              \
  (*t)[#name].push_back(                                                                       \
      {version, std::string_view(#kind) == "PTDS", reinterpret_cast<void*>(&orion_stub_##sym), \
       reinterpret_cast<void*>(&orion_stub_##sym) == reinterpret_cast<void*>(&orion_stubimpl_##sym)});
#include "cuda_api.inc"
#undef ORION_CUDA_PROC
    for (auto& [k, v] : *t) {
      std::sort(v.begin(), v.end(), [](const ProcRow& a, const ProcRow& b) { return a.version < b.version; });
    }
    return t;
  }();
  return *table;
}

CUresult GetProc(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                 CUdriverProcAddressQueryResult* status) {
  if (pfn == nullptr || symbol == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  auto set = [&](CUdriverProcAddressQueryResult s) {
    if (status != nullptr) *status = s;
  };
  const auto& t = ProcTable();
  auto it = t.find(symbol);
  if (it == t.end()) {
    set(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_ERROR_NOT_FOUND;
  }
  const bool want_ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  auto pick = [&](bool ptds) {
    const ProcRow* b = nullptr;
    for (const ProcRow& r : it->second) {
      if (r.ptds == ptds && r.version <= cudaVersion) b = &r;
    }
    return b;
  };
  const ProcRow* best = pick(want_ptds);
  if (want_ptds && (best == nullptr || best->stub)) {
    // No real per-thread-default-stream variant: the default-stream one serves (Orion maps the
    // per-thread default stream to the legacy default stream; see README).
    const ProcRow* fallback = pick(false);
    if (fallback != nullptr && (best == nullptr || !fallback->stub)) best = fallback;
  }
  if (best == nullptr) {
    set(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = best->fn;
  set(CU_GET_PROC_ADDRESS_SUCCESS);
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                                  CUdriverProcAddressQueryResult* symbolStatus) {
  ORION_API(cuGetProcAddress_v2);
  return GetProc(symbol, pfn, cudaVersion, flags, symbolStatus);
}

ORION_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  ORION_API(cuGetProcAddress);
  return GetProc(symbol, pfn, cudaVersion, flags, nullptr);
}

ORION_EXPORT CUresult CUDAAPI cuGetExportTable(const void** ppExportTable, const CUuuid* pExportTableId) {
  ORION_API(cuGetExportTable);
  if (ppExportTable == nullptr || pExportTableId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ppExportTable = FindExportTable(pExportTableId);  // export_tables.cpp: logs and counts refusals
  return *ppExportTable != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}

ORION_EXPORT CUresult CUDAAPI cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  ORION_API(cuModuleGetLoadingMode);
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *mode = CU_MODULE_EAGER_LOADING;
  return CUDA_SUCCESS;
}

}  // extern "C"
