// guest/src/export_tables.cpp — the private tables NVIDIA's runtime and libraries ask the driver
// for with cuGetExportTable (cudart, cuBLAS, cuBLASLt, cuFFT, cuSPARSE, cuSOLVER, cuRAND, cuDNN).
//
// Every slot is either served for real (its behaviour is known: docs/spec/export-tables.md says
// where from and what Orion does) or refused: a refused slot logs its table and index once (with
// its first arguments) and returns CUDA_ERROR_NOT_SUPPORTED. Both kinds count as entry points for
// ORION_COVERAGE. An unknown table UUID is refused the same way; a table Orion declines on purpose
// (the caller goes on without it) is listed as declined.
#include <pthread.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "md2.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

namespace {

// ---- Tables and coverage ------------------------------------------------------------------------
enum Tbl : int {
  kCudart,        // 6bd5fb6c: runtime interface
  kHooks,         // a094798c: tool callback hooks
  kTls,           // 42d85a81: tools TLS
  kCls,           // c693336e: context-local storage
  kCtxChecks,     // 263e8860: context checks
  kIntegrity,     // d4082055: integrity check
  kToolsContext,  // 21318c60: contexts and streams (cuBLAS, cuBLASLt, cuSOLVER, cuFFT)
  kToolsModule,   // 6e163fbe: modules and functions (cuFFT)
  kLt1734,        // 1734dc26: asked for by cuBLASLt 13.2+ (wheel), slots unknown: all refused
  kTblCount
};

struct TableInfo {
  const char* name;
  uint8_t uuid[16];
};
constexpr TableInfo kInfo[kTblCount] = {
    {"cudart-interface",
     {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}},
    {"tools-hooks", {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66}},
    {"tools-tls", {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc}},
    {"context-storage",
     {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93}},
    {"context-checks",
     {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e}},
    {"integrity", {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2}},
    {"tools-context", {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2}},
    {"tools-module", {0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e}},
    {"unidentified", {0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca}},
};

// Declined on purpose: cudart asks for it before cuInit and goes on when it is refused (as with
// drivers that predate it); its slots' behaviour is not known.
constexpr uint8_t kDeclinedUuid[16] = {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e,
                                       0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9};

constexpr int kMaxSlots = 128;
struct SlotCoverage {
  std::atomic<uint64_t> calls[kTblCount][kMaxSlots]{};
  std::atomic<bool> real[kTblCount][kMaxSlots]{};
  std::mutex mu;                                   // guards the two maps
  std::map<std::string, uint64_t> unknown_tables;  // uuid text -> requests
  uint64_t declined = 0;
};
SlotCoverage& Cov() {
  static SlotCoverage* c = new SlotCoverage();  // leaked: read by the coverage report at exit
  return *c;
}
void SlotHit(int t, int slot, bool real) noexcept {
  Cov().calls[t][slot].fetch_add(1, std::memory_order_relaxed);
  if (real) Cov().real[t][slot].store(true, std::memory_order_relaxed);
}

std::string UuidText(const uint8_t* b) {
  char text[40];
  std::snprintf(text, sizeof text, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return text;
}
std::string TableText(int t) { return UuidText(kInfo[t].uuid).substr(0, 8) + " (" + kInfo[t].name + ")"; }

// A served slot: counts the call, then runs F.
template <int T, int N, auto F>
struct Real;
template <int T, int N, typename R, typename... A, R (*F)(A...)>
struct Real<T, N, F> {
  static R Call(A... a) {
    SlotHit(T, N, true);
    return F(a...);
  }
};
#define SERVE(T, N, F) reinterpret_cast<const void*>(&Real<T, N, &(F)>::Call)

// A refused slot: logs table, index and its first four integer arguments once; NOT_SUPPORTED.
// Every slot Orion knows of returns a CUresult or nothing, and extra integer parameters are
// ignored in the SysV ABI, so one signature fits all.
template <int T, int N>
uint64_t Refused(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3) {
  SlotHit(T, N, false);
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    char args[128];
    std::snprintf(args, sizeof args, "0x%" PRIx64 ", 0x%" PRIx64 ", 0x%" PRIx64 ", 0x%" PRIx64, a0, a1, a2, a3);
    LogWarn("private table " + TableText(T) + " slot " + std::to_string(N) +
            " is not supported by Orion (called with " + args + ", ...); returning CUDA_ERROR_NOT_SUPPORTED");
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

// A table of `S` slots: slot 0 its size in bytes (when `sized`), every other slot refused until a
// served one replaces it.
template <int T, std::size_t... I>
constexpr std::array<const void*, sizeof...(I)> RefusedSlots(std::index_sequence<I...>) {
  return {reinterpret_cast<const void*>(&Refused<T, static_cast<int>(I)>)...};
}
template <int T, std::size_t S>
std::array<const void*, S> NewTable(bool sized) {
  static_assert(S <= kMaxSlots);
  auto t = RefusedSlots<T>(std::make_index_sequence<S>());
  if (sized) t[0] = reinterpret_cast<const void*>(uintptr_t{S * sizeof(void*)});
  return t;
}

// ---- Context-local storage: (ctx, key) -> (value, destructor) ------------------------------------
struct ClsEntry {
  void* value;
  void (*dtor)(CUcontext, void*, void*);
};
std::mutex g_cls_mu;
// Leaked on purpose: cudart's exit handlers call remove() after static destructors have run.
std::map<std::pair<CUcontext, void*>, ClsEntry>& g_cls = *new std::map<std::pair<CUcontext, void*>, ClsEntry>();

CUcontext CtxOrCurrent(CUcontext c) { return c != nullptr ? c : reinterpret_cast<CUcontext>(CurrentCtx()); }

CUresult ClsPut(CUcontext ctx, void* key, void* value, void (*dtor)(CUcontext, void*, void*)) {
  CUcontext c = CtxOrCurrent(ctx);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> l(g_cls_mu);
  g_cls[{c, key}] = {value, dtor};
  return CUDA_SUCCESS;
}
CUresult ClsRemove(CUcontext ctx, void* key) {
  CUcontext c = CtxOrCurrent(ctx);
  std::lock_guard<std::mutex> l(g_cls_mu);
  return g_cls.erase({c, key}) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
CUresult ClsGet(void** value, CUcontext ctx, void* key) {
  CUcontext c = CtxOrCurrent(ctx);
  if (c == nullptr || value == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> l(g_cls_mu);
  auto it = g_cls.find({c, key});
  if (it == g_cls.end()) return CUDA_ERROR_INVALID_HANDLE;
  *value = it->second.value;
  return CUDA_SUCCESS;
}

// ---- Runtime interface ----------------------------------------------------------------------------
// Slot 2: the device's primary context, not retained and not activated.
CUresult CudartPrimaryCtx(CUcontext* out, CUdevice dev) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (dev < 0 || static_cast<size_t>(dev) >= s.primary.size()) return CUDA_ERROR_INVALID_DEVICE;
  *out = reinterpret_cast<CUcontext>(s.primary[static_cast<size_t>(dev)]);
  return CUDA_SUCCESS;
}
CUresult CudartModuleFromCubin(CUmodule* out, const void* wrapper) { return cuModuleLoadFatBinary(out, wrapper); }
CUresult CudartModuleFromCubinExt1(CUmodule* out, const void* wrapper, void* a3, void* a4, unsigned a5) {
  if (a3 != nullptr || a4 != nullptr || a5 != 0) return CUDA_ERROR_NOT_SUPPORTED;
  return cuModuleLoadFatBinary(out, wrapper);
}
CUresult CudartModuleFromCubinExt2(const void* fatbin, CUmodule* out, void* a3, void* a4, unsigned a5) {
  if (a3 != nullptr || a4 != nullptr || a5 != 0) return CUDA_ERROR_NOT_SUPPORTED;
  return cuModuleLoadFatBinary(out, fatbin);
}
void CudartFn7(size_t) {}
CUresult Success() { return CUDA_SUCCESS; }

// ---- Tool hooks and TLS ---------------------------------------------------------------------------
// Zeroed flag buffers mean "no tool attached".
uint32_t g_hook_flags1[1024];
uint32_t g_hook_flags2[64];
void HooksTable1(void** ptr, size_t* count) {
  *ptr = g_hook_flags1;
  *count = 1024;
}
void HooksTable2(void** ptr, size_t* count) {
  *ptr = g_hook_flags2;
  *count = 14;
}
CUresult TlsCurrentCtx(CUcontext* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUcontext>(CurrentCtx());
  return CUDA_SUCCESS;
}

// ---- Context checks -------------------------------------------------------------------------------
CUresult CtxIsWrapped(CUcontext, uint32_t* wrapped, CUcontext* inner) {
  if (wrapped != nullptr) *wrapped = 0;
  if (inner != nullptr) *inner = nullptr;
  return CUDA_SUCCESS;
}
uint32_t CtxChecksFn3() { return 0; }

// ---- Tools context (21318c60) ---------------------------------------------------------------------
GuestCtx* ValidCtx(CUcontext c) {
  if (c == nullptr) return CurrentCtx();
  return S().contexts.Has(c) ? reinterpret_cast<GuestCtx*>(c) : nullptr;
}
// Slot 4: the context's unique id (cuCtxGetId); a null context is the current one.
CUresult ToolsCtxId(CUcontext ctx, unsigned long long* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestCtx* c = ValidCtx(ctx);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *out = c->id;
  return CUDA_SUCCESS;
}
// Slot 51: the stream object of a stream handle in `ctx`: the null stream, CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD (`per_thread` is set for the latter) resolve to the context's default
// stream, which Orion represents as CU_STREAM_LEGACY (per-thread default streams share it; README).
CUresult ToolsCtxResolveStream(CUcontext ctx, CUstream stream, CUstream* out, int per_thread) {
  (void)per_thread;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ValidCtx(ctx) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t id = 0;
  if (!StreamId(stream, &id)) return CUDA_ERROR_INVALID_HANDLE;
  *out = id == 0 ? CU_STREAM_LEGACY : stream;
  return CUDA_SUCCESS;
}
// Slot 39: the unique id of a stream object from slot 51 (cuStreamGetId).
CUresult ToolsCtxStreamId(CUcontext ctx, CUstream stream, unsigned long long* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ValidCtx(ctx) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t id = 0;
  if (!StreamId(stream, &id)) return CUDA_ERROR_INVALID_HANDLE;
  *out = id;
  return CUDA_SUCCESS;
}

// ---- Tools module (6e163fbe) ----------------------------------------------------------------------
// Slot 7: calls visit(user, function) for each function of `mod` and returns how many it visited
// (not a CUresult). cuFFT uses it to find the kernel of a module it loaded without knowing the
// kernel's name (its callback keeps the last function) and requires the answer 1; for the single-
// kernel modules it loads, "visited one" and "found it" agree. 0 when `mod` or `ctx` is unknown.
uint32_t ToolsModuleForEachFunction(CUcontext ctx, CUmodule mod, void (*visit)(void*, CUfunction), void* user) {
  if (visit == nullptr || ValidCtx(ctx) == nullptr) return 0;
  unsigned n = 0;
  if (ModuleFunctionCount(mod, &n) != CUDA_SUCCESS) return 0;
  uint32_t visited = 0;
  for (unsigned i = 0; i < n; ++i) {
    CUfunction f = nullptr;
    if (ModuleFunctionAt(mod, i, &f) != CUDA_SUCCESS) break;
    visit(user, f);
    ++visited;
  }
  return visited;
}

// ---- Integrity check (HMAC-MD2, md2.h) ------------------------------------------------------------
const void* const* CudartTable();
const void* const* IntegrityTable();

CUresult IntegrityCheck(uint32_t version, uint64_t unix_seconds, uint64_t out[2]) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (version % 10 == 0) {
    out[0] = 0x3341181C03CB675CULL;
    out[1] = 0x8ED383AA1F4CD1E8ULL;
    return CUDA_SUCCESS;
  }
  if (version % 10 == 1) {
    out[0] = 0x1841181C03CB675CULL;
    out[1] = 0x8ED383AA1F4CD1E8ULL;
    return CUDA_SUCCESS;
  }
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  int driver = 0;
  cuDriverGetVersion(&driver);
  std::vector<uint8_t> msg(48);
  auto put32 = [&](size_t at, uint32_t v) { std::memcpy(msg.data() + at, &v, 4); };
  auto put64 = [&](size_t at, uint64_t v) { std::memcpy(msg.data() + at, &v, 8); };
  put32(0, static_cast<uint32_t>(driver));
  put32(4, version);
  put32(8, static_cast<uint32_t>(getpid()));
  put32(12, static_cast<uint32_t>(pthread_self()));
  put64(16, reinterpret_cast<uint64_t>(CudartTable()));
  put64(24, reinterpret_cast<uint64_t>(IntegrityTable()));
  put64(32, reinterpret_cast<uint64_t>(IntegrityTable()[1]));
  put64(40, unix_seconds);
  for (const DeviceInfo& d : Client::Get().devices()) {
    uint8_t rec[28];
    std::memcpy(rec, d.uuid, 16);
    std::memcpy(rec + 16, &d.attributes[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID], 4);
    std::memcpy(rec + 20, &d.attributes[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID], 4);
    std::memcpy(rec + 24, &d.attributes[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID], 4);
    msg.insert(msg.end(), rec, rec + 28);
  }
  static const uint8_t kKey[16] = {0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52,
                                   0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F};
  uint8_t digest[16];
  HmacMd2(kKey, msg.data(), msg.size(), digest);
  std::memcpy(out, digest, 16);
  return CUDA_SUCCESS;
}
CUresult IntegritySetEnabled(int) { return CUDA_SUCCESS; }

// ---- The tables -----------------------------------------------------------------------------------
// Built once; the same addresses are returned every time (the integrity hash mixes them in).
struct Tables {
  std::array<const void*, 13> cudart = NewTable<kCudart, 13>(true);
  std::array<const void*, 7> hooks = NewTable<kHooks, 7>(true);
  std::array<const void*, 4> tls = NewTable<kTls, 4>(true);
  std::array<const void*, 4> cls = NewTable<kCls, 4>(false);  // no size slot
  std::array<const void*, 4> ctx_checks = NewTable<kCtxChecks, 4>(true);
  std::array<const void*, 3> integrity = NewTable<kIntegrity, 3>(true);
  std::array<const void*, 96> tools_context = NewTable<kToolsContext, 96>(true);
  std::array<const void*, 64> tools_module = NewTable<kToolsModule, 64>(true);
  // cuBLASLt 13.2 calls slot 4 through this table without checking cuGetExportTable's result (a
  // refused table crashes it), but it checks the slot's result: served, every slot refused.
  std::array<const void*, 64> lt1734 = NewTable<kLt1734, 64>(true);

  Tables() {
    cudart[1] = SERVE(kCudart, 1, CudartModuleFromCubin);
    cudart[2] = SERVE(kCudart, 2, CudartPrimaryCtx);
    cudart[6] = SERVE(kCudart, 6, CudartModuleFromCubinExt1);
    cudart[7] = SERVE(kCudart, 7, CudartFn7);
    cudart[8] = SERVE(kCudart, 8, CudartModuleFromCubinExt2);
    cudart[12] = SERVE(kCudart, 12, Success);  // load the JIT compilers: nothing to load here

    hooks[1] = SERVE(kHooks, 1, Success);
    hooks[2] = SERVE(kHooks, 2, HooksTable1);
    hooks[4] = SERVE(kHooks, 4, Success);
    hooks[5] = SERVE(kHooks, 5, Success);
    hooks[6] = SERVE(kHooks, 6, HooksTable2);

    tls[1] = SERVE(kTls, 1, Success);
    tls[2] = SERVE(kTls, 2, TlsCurrentCtx);
    tls[3] = SERVE(kTls, 3, Success);

    cls[0] = SERVE(kCls, 0, ClsPut);
    cls[1] = SERVE(kCls, 1, ClsRemove);
    cls[2] = SERVE(kCls, 2, ClsGet);
    cls[3] = nullptr;  // NVIDIA's slot 3 is null

    ctx_checks[2] = SERVE(kCtxChecks, 2, CtxIsWrapped);
    ctx_checks[3] = SERVE(kCtxChecks, 3, CtxChecksFn3);

    integrity[1] = SERVE(kIntegrity, 1, IntegrityCheck);
    integrity[2] = SERVE(kIntegrity, 2, IntegritySetEnabled);

    tools_context[4] = SERVE(kToolsContext, 4, ToolsCtxId);
    tools_context[39] = SERVE(kToolsContext, 39, ToolsCtxStreamId);
    tools_context[51] = SERVE(kToolsContext, 51, ToolsCtxResolveStream);

    tools_module[7] = SERVE(kToolsModule, 7, ToolsModuleForEachFunction);
  }
  const void* Get(int t) const {
    switch (t) {
      case kCudart: return cudart.data();
      case kHooks: return hooks.data();
      case kTls: return tls.data();
      case kCls: return cls.data();
      case kCtxChecks: return ctx_checks.data();
      case kIntegrity: return integrity.data();
      case kToolsContext: return tools_context.data();
      case kToolsModule: return tools_module.data();
      case kLt1734: return lt1734.data();
      default: return nullptr;
    }
  }
};
const Tables& T() {
  static const Tables* t = new Tables();  // leaked: libraries call slots from exit handlers
  return *t;
}
const void* const* CudartTable() { return T().cudart.data(); }
const void* const* IntegrityTable() { return T().integrity.data(); }

}  // namespace

namespace orion::guest {

const void* FindExportTable(const CUuuid* id) noexcept {
  const auto* b = reinterpret_cast<const uint8_t*>(id->bytes);
  for (int t = 0; t < kTblCount; ++t) {
    if (std::memcmp(kInfo[t].uuid, b, 16) == 0) return T().Get(t);
  }
  SlotCoverage& c = Cov();
  const std::string text = UuidText(b);
  bool first = false;
  {
    std::lock_guard<std::mutex> l(c.mu);
    if (std::memcmp(b, kDeclinedUuid, 16) == 0) {
      ++c.declined;
      LogDebug("cuGetExportTable: private table " + text + " declined (optional; the caller goes on without it)");
      return nullptr;
    }
    first = c.unknown_tables[text]++ == 0;
  }
  if (first) {
    LogWarn("cuGetExportTable: private table " + text +
            " is not supported by Orion; returning CUDA_ERROR_NOT_SUPPORTED");
  }
  return nullptr;
}

std::string ExportTableCoverage(size_t* called, size_t* real, size_t* not_supported, size_t* declined) noexcept {
  std::string lines;
  SlotCoverage& c = Cov();
  for (int t = 0; t < kTblCount; ++t) {
    for (int s = 0; s < kMaxSlots; ++s) {
      uint64_t n = c.calls[t][s].load();
      if (n == 0) continue;
      bool r = c.real[t][s].load();
      ++*called;
      ++*(r ? real : not_supported);
      lines += std::string("orion-coverage: ") + (r ? "real " : "STUB ") + "table " + TableText(t) + " slot " +
               std::to_string(s) + " " + std::to_string(n) + "\n";
    }
  }
  std::lock_guard<std::mutex> l(c.mu);
  for (const auto& [text, n] : c.unknown_tables) {
    ++*called;
    ++*not_supported;
    lines += "orion-coverage: STUB table " + text + " " + std::to_string(n) + "\n";
  }
  if (c.declined != 0) {
    ++*declined;
    lines += "orion-coverage: DECLINED table " + UuidText(kDeclinedUuid) + " " + std::to_string(c.declined) + "\n";
  }
  return lines;
}

// Runs the context-local-storage destructors of `ctx` (cuDevicePrimaryCtxReset, cuCtxDestroy),
// outside our locks: cudart may call back into the driver.
void RunContextDestructors(CUcontext ctx) noexcept {
  std::vector<std::pair<void*, ClsEntry>> doomed;
  {
    std::lock_guard<std::mutex> l(g_cls_mu);
    for (auto it = g_cls.begin(); it != g_cls.end();) {
      if (it->first.first == ctx) {
        doomed.push_back({it->first.second, it->second});
        it = g_cls.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [key, e] : doomed) {
    if (e.dtor != nullptr) e.dtor(ctx, key, e.value);
  }
}

}  // namespace orion::guest
