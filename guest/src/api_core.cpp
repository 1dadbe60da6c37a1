// Exported driver API: initialisation, versions, devices, contexts, errors.
// Device facts come from the Welcome (fetched once); contexts are mirrored locally.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <mutex>
#include <set>
#include <thread>

#include "export.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

namespace orion::guest {
namespace {

// Test hook: ORION_TEST_INIT_DELAY_MS stalls the thread that initialises, after it connected and
// before the primary contexts exist, so a test can send other threads into cuInit meanwhile.
void TestInitDelay() noexcept {
  const char* v = std::getenv("ORION_TEST_INIT_DELAY_MS");
  if (v == nullptr) return;
  const long ms = std::strtol(v, nullptr, 10);
  if (ms > 0 && ms <= 60000) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace

// Initialisation happens once, completely, before any thread sees it done: `initialized` is set
// last, after the primary contexts exist (Client::connected() alone is not enough: it turns true
// before them). Threads that arrive meanwhile wait on `init_mu` and then see the flag.
CUresult EnsureInit() noexcept {
  static std::atomic<bool> initialized{false};
  static std::mutex init_mu;
  // I1: pairs with I0 below; the primary contexts written before I0 are visible after this load.
  if (initialized.load(std::memory_order_acquire)) return CUDA_SUCCESS;
  std::lock_guard<std::mutex> once(init_mu);
  if (initialized.load(std::memory_order_relaxed)) return CUDA_SUCCESS;
  Client& c = Client::Get();
  CUresult r = c.Connect();
  if (r != CUDA_SUCCESS) return r;
  TestInitDelay();
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (s.primary.empty()) {
    // Primary contexts exist from cuInit on (cudart asks for them through its private table
    // and makes them current before retaining them); the server creates them now. Published in
    // State only when every one exists, so a failure leaves nothing half-made (the next call
    // tries again).
    const size_t n = c.devices().size();
    std::vector<GuestCtx*> made;
    for (size_t d = 0; d < n; ++d) {
      DeviceReq q{static_cast<uint32_t>(d), 0};
      HandleRep rep{};
      if (CUresult rr = c.Call(Op::kPrimaryCtxRetain, &q, sizeof q, &rep, sizeof rep); rr != CUDA_SUCCESS) {
        for (GuestCtx* g : made) delete g;
        return rr;
      }
      auto* ctx = new (std::nothrow) GuestCtx();
      if (ctx == nullptr) {
        for (GuestCtx* g : made) delete g;
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
      ctx->handle = rep.handle;
      ctx->device = static_cast<int>(d);
      ctx->primary = true;
      ctx->id = s.next_ctx_id++;
      made.push_back(ctx);
    }
    s.primary_refs.assign(n, 0);
    s.primary_flags.assign(n, 0);
    for (GuestCtx* ctx : made) {
      s.primary.push_back(ctx);
      s.contexts.Add(ctx);
    }
  }
  // I0: publishes the primary contexts; pairs with I1.
  initialized.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

}  // namespace orion::guest

namespace {

CUresult CheckDevice(CUdevice dev) {
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (dev < 0 || static_cast<size_t>(dev) >= Client::Get().devices().size()) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

const DeviceInfo& Dev(CUdevice dev) { return Client::Get().devices()[static_cast<size_t>(dev)]; }

CUresult RetainPrimary(CUcontext* pctx, CUdevice dev) {
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  auto d = static_cast<size_t>(dev);
  ++s.primary_refs[d];
  *pctx = reinterpret_cast<CUcontext>(s.primary[d]);
  return CUDA_SUCCESS;
}

GuestCtx* AsCtx(CUcontext c) { return S().contexts.Has(c) ? reinterpret_cast<GuestCtx*>(c) : nullptr; }

}  // namespace

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuInit(unsigned int Flags) {
  ORION_API(cuInit);
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return EnsureInit();
}

ORION_EXPORT CUresult CUDAAPI cuDriverGetVersion(int* driverVersion) {
  ORION_API(cuDriverGetVersion);
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Reports the server driver's version; before a session exists (no oriond), the API version
  // this runtime implements, as a real driver answers without cuInit.
  *driverVersion = EnsureInit() == CUDA_SUCCESS ? Client::Get().welcome().driver_version : CUDA_VERSION;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  ORION_API(cuDeviceGet);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(ordinal); r != CUDA_SUCCESS) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDeviceGetCount(int* count) {
  ORION_API(cuDeviceGetCount);
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  *count = static_cast<int>(Client::Get().devices().size());
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  ORION_API(cuDeviceGetName);
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  std::strncpy(name, Dev(dev).name, static_cast<size_t>(len));
  name[len - 1] = '\0';
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  ORION_API(cuDeviceGetUuid);
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  std::memcpy(uuid->bytes, Dev(dev).uuid, 16);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  ORION_API(cuDeviceGetUuid_v2);
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  std::memcpy(uuid->bytes, Dev(dev).uuid, 16);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDeviceGetLuid(char* luid, unsigned int* mask, CUdevice dev) {
  ORION_API(cuDeviceGetLuid);
  (void)luid;
  (void)mask;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  return CUDA_ERROR_NOT_SUPPORTED;  // LUIDs exist on Windows only, as with NVIDIA's Linux driver
}

ORION_EXPORT CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  ORION_API(cuDeviceTotalMem_v2);
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  *bytes = Dev(dev).total_mem;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  ORION_API(cuDeviceGetAttribute);
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  const int a = static_cast<int>(attrib);
  if (a <= 0 || a >= static_cast<int>(kMaxDeviceAttributes) || a >= CU_DEVICE_ATTRIBUTE_MAX) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *pi = Dev(dev).attributes[a];
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
  ORION_API(cuDeviceComputeCapability);
  if (major == nullptr || minor == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  *major = Dev(dev).attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
  *minor = Dev(dev).attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  ORION_API(cuDeviceGetPCIBusId);
  if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  std::strncpy(pciBusId, Dev(dev).pci_bus_id, static_cast<size_t>(len));
  pciBusId[len - 1] = '\0';
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
  ORION_API(cuDeviceGetByPCIBusId);
  if (dev == nullptr || pciBusId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  const auto& devs = Client::Get().devices();
  for (size_t i = 0; i < devs.size(); ++i) {
    if (strncasecmp(devs[i].pci_bus_id, pciBusId, sizeof devs[i].pci_bus_id) == 0) {
      *dev = static_cast<CUdevice>(i);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

// ---- Primary contexts -----------------------------------------------------------------------

ORION_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  ORION_API(cuDevicePrimaryCtxRetain);
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return RetainPrimary(pctx, dev);
}

static CUresult PrimaryRelease(CUdevice dev) {
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  auto d = static_cast<size_t>(dev);
  if (s.primary_refs[d] == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --s.primary_refs[d];  // the server context lives on until exit (allocations stay valid)
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  ORION_API(cuDevicePrimaryCtxRelease);
  return PrimaryRelease(dev);
}
ORION_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  ORION_API(cuDevicePrimaryCtxRelease_v2);
  return PrimaryRelease(dev);
}

ORION_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  ORION_API(cuDevicePrimaryCtxGetState);
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  *flags = s.primary_flags[static_cast<size_t>(dev)];
  *active = s.primary[static_cast<size_t>(dev)] != nullptr && s.primary_refs[static_cast<size_t>(dev)] > 0;
  return CUDA_SUCCESS;
}

static CUresult PrimarySetFlags(CUdevice dev, unsigned flags) {
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  if ((flags & ~0x1Fu) != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  s.primary_flags[static_cast<size_t>(dev)] = flags;  // scheduling flags: recorded, host decides
  if (s.primary[static_cast<size_t>(dev)] != nullptr) s.primary[static_cast<size_t>(dev)]->flags = flags;
  return CUDA_SUCCESS;
}
ORION_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  ORION_API(cuDevicePrimaryCtxSetFlags);
  return PrimarySetFlags(dev, flags);
}
ORION_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  ORION_API(cuDevicePrimaryCtxSetFlags_v2);
  return PrimarySetFlags(dev, flags);
}

static CUresult PrimaryReset(CUdevice dev) {
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  GuestCtx* ctx = S().primary[static_cast<size_t>(dev)];
  // Context-local storage (cudart's per-context state) is destroyed with the context.
  RunContextDestructors(reinterpret_cast<CUcontext>(ctx));
  DeviceReq q{static_cast<uint32_t>(dev), 0};
  CUresult r = Client::Get().Call(Op::kPrimaryCtxReset, &q, sizeof q);
  if (r == CUDA_SUCCESS) S().mirror.RemoveContext(ctx);
  {
    std::lock_guard<std::mutex> l(S().mu);
    S().primary_refs[static_cast<size_t>(dev)] = 0;
  }
  return r;
}
ORION_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) {
  ORION_API(cuDevicePrimaryCtxReset);
  return PrimaryReset(dev);
}
ORION_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  ORION_API(cuDevicePrimaryCtxReset_v2);
  return PrimaryReset(dev);
}

// ---- Contexts -----------------------------------------------------------------------------------

static CUresult CreateCtx(CUcontext* pctx, unsigned flags, CUdevice dev) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  CtxCreateReq q{static_cast<uint32_t>(dev), flags};
  HandleRep rep{};
  if (CUresult r = Client::Get().Call(Op::kCtxCreate, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS) return r;
  auto* c = new GuestCtx();
  c->handle = rep.handle;
  c->device = dev;
  c->flags = flags;
  c->id = S().next_ctx_id++;
  S().contexts.Add(c);
  CtxStack().push_back(c);
  SetCurrentCtx(c);
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  ORION_API(cuCtxCreate_v2);
  return CreateCtx(pctx, flags, dev);
}
ORION_EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int n, unsigned int flags,
                                             CUdevice dev) {
  ORION_API(cuCtxCreate_v3);
  if (n != 0 || params != nullptr) return CUDA_ERROR_NOT_SUPPORTED;  // execution affinity (MPS)
  return CreateCtx(pctx, flags, dev);
}
ORION_EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                                             CUdevice dev) {
  ORION_API(cuCtxCreate_v4);
  if (params != nullptr && (params->numExecAffinityParams != 0 || params->cigParams != nullptr))
    return CUDA_ERROR_NOT_SUPPORTED;
  return CreateCtx(pctx, flags, dev);
}

ORION_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  ORION_API(cuCtxDestroy_v2);
  GuestCtx* c = AsCtx(ctx);
  if (c == nullptr || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
  RunContextDestructors(ctx);
  HandleReq q{c->handle};
  CUresult r = Client::Get().Call(Op::kCtxDestroy, &q, sizeof q);
  if (r == CUDA_SUCCESS) S().mirror.RemoveContext(c);
  auto& st = CtxStack();
  st.erase(std::remove(st.begin(), st.end(), c), st.end());
  SetCurrentCtx(st.empty() ? nullptr : st.back());
  S().contexts.Remove(c);  // the object is leaked on purpose: stale handles stay harmless to test
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  ORION_API(cuCtxPushCurrent_v2);
  GuestCtx* c = AsCtx(ctx);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  CtxStack().push_back(c);
  SetCurrentCtx(c);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  ORION_API(cuCtxPopCurrent_v2);
  auto& st = CtxStack();
  if (st.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  GuestCtx* c = st.back();
  st.pop_back();
  SetCurrentCtx(st.empty() ? nullptr : st.back());
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  ORION_API(cuCtxSetCurrent);
  auto& st = CtxStack();
  if (ctx == nullptr) {
    if (!st.empty()) st.pop_back();
    SetCurrentCtx(st.empty() ? nullptr : st.back());
    return CUDA_SUCCESS;
  }
  GuestCtx* c = AsCtx(ctx);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (st.empty())
    st.push_back(c);
  else
    st.back() = c;
  SetCurrentCtx(c);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  ORION_API(cuCtxGetCurrent);
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!Client::Get().connected()) return CUDA_ERROR_NOT_INITIALIZED;
  *pctx = reinterpret_cast<CUcontext>(CurrentCtx());
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  ORION_API(cuCtxGetDevice);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestCtx* c = CurrentCtx();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = c->device;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  ORION_API(cuCtxGetDevice_v2);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestCtx* c = ctx == nullptr ? CurrentCtx() : AsCtx(ctx);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = c->device;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxGetFlags(unsigned int* flags) {
  ORION_API(cuCtxGetFlags);
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestCtx* c = CurrentCtx();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> l(S().mu);  // GuestCtx::flags is written under it
  *flags = c->flags;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxSetFlags(unsigned int flags) {
  ORION_API(cuCtxSetFlags);
  GuestCtx* c = CurrentCtx();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> l(S().mu);  // as cuCtxGetFlags and cuDevicePrimaryCtxSetFlags
  c->flags = flags;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long* ctxId) {
  ORION_API(cuCtxGetId);
  if (ctxId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestCtx* c = ctx == nullptr ? CurrentCtx() : AsCtx(ctx);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *ctxId = c->id;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  ORION_API(cuCtxGetApiVersion);
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestCtx* c = ctx == nullptr ? CurrentCtx() : AsCtx(ctx);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *version = 3020;  // what NVIDIA's driver reports for every context since CUDA 3.2
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxSynchronize(void) {
  ORION_API(cuCtxSynchronize);
  if (CurrentCtx() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r; CaptureForbidsSync(~uint64_t{0}, &r)) return r;
  return Client::Get().Call(Op::kCtxSynchronize, nullptr, 0);
}

ORION_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  ORION_API(cuCtxSynchronize_v2);
  GuestCtx* c = ctx == nullptr ? CurrentCtx() : AsCtx(ctx);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r; CaptureForbidsSync(~uint64_t{0}, &r)) return r;
  // The channel is ordered across contexts: synchronizing it synchronizes `ctx` too.
  return Client::Get().Call(Op::kCtxSynchronize, nullptr, 0);
}

ORION_EXPORT CUresult CUDAAPI cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
  ORION_API(cuCtxGetLimit);
  if (pvalue == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CurrentCtx() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  LimitReq q{static_cast<uint32_t>(limit), 0, 0};
  U64Rep rep{};
  CUresult r = Client::Get().Call(Op::kCtxGetLimit, &q, sizeof q, &rep, sizeof rep);
  if (r == CUDA_SUCCESS) *pvalue = rep.value;
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
  ORION_API(cuCtxSetLimit);
  if (CurrentCtx() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  LimitReq q{static_cast<uint32_t>(limit), 0, value};
  return Client::Get().Call(Op::kCtxSetLimit, &q, sizeof q);
}

// ---- Peer access between the vGPUs of this process -------------------------------------------
// Device pointers are unique within a session and oriond's backend copies between any of them
// (sim: one address space; cuda: unified addressing, and real peer access enabled between the
// session's GPUs where the hardware allows it), so every pair of distinct vGPUs can access each
// other. Enabling is tracked here with the driver's errors (CUDA driver API, Peer Context Memory
// Access).
namespace {
std::mutex g_peer_mu;
std::set<std::pair<const GuestCtx*, const GuestCtx*>> g_peer;  // (context, peer it may access)
}  // namespace

ORION_EXPORT CUresult CUDAAPI cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  ORION_API(cuDeviceCanAccessPeer);
  if (canAccessPeer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckDevice(peerDev); r != CUDA_SUCCESS) return r;
  *canAccessPeer = dev != peerDev ? 1 : 0;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attrib, CUdevice srcDevice,
                                                      CUdevice dstDevice) {
  ORION_API(cuDeviceGetP2PAttribute);
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(srcDevice); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckDevice(dstDevice); r != CUDA_SUCCESS) return r;
  if (srcDevice == dstDevice) return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *value = 0; break;
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: *value = 1; break;
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: *value = 0; break;      // not promised across vGPUs
    case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: *value = 0; break;  // no arrays yet
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  ORION_API(cuCtxEnablePeerAccess);
  GuestCtx* cur = CurrentCtx();
  if (cur == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  GuestCtx* peer = AsCtx(peerContext);
  if (peer == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (peer->device == cur->device) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> l(g_peer_mu);
  if (!g_peer.insert({cur, peer}).second) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext) {
  ORION_API(cuCtxDisablePeerAccess);
  GuestCtx* cur = CurrentCtx();
  if (cur == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  GuestCtx* peer = AsCtx(peerContext);
  if (peer == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> l(g_peer_mu);
  if (g_peer.erase({cur, peer}) == 0) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  return CUDA_SUCCESS;
}

// No profiler is attached to a remoted context: as NVIDIA's driver does then, starting and
// stopping profiling succeed and do nothing (CUDA driver API: cuProfilerStart "enable profiling";
// with no profiler attached the call is a no-op). Both need a current context.
ORION_EXPORT CUresult CUDAAPI cuProfilerStart() {
  ORION_API(cuProfilerStart);
  return CurrentCtx() == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuProfilerStop() {
  ORION_API(cuProfilerStop);
  return CurrentCtx() == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxGetCacheConfig(CUfunc_cache* pconfig) {
  ORION_API(cuCtxGetCacheConfig);
  if (pconfig == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pconfig = CU_FUNC_CACHE_PREFER_NONE;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxSetCacheConfig(CUfunc_cache config) {
  ORION_API(cuCtxSetCacheConfig);
  (void)config;  // a preference only; the driver may ignore it (CUDA docs)
  return CurrentCtx() == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  ORION_API(cuCtxGetStreamPriorityRange);
  if (CurrentCtx() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (leastPriority != nullptr) *leastPriority = 0;
  if (greatestPriority != nullptr) *greatestPriority = -5;  // NVIDIA's range on sm_70+
  return CUDA_SUCCESS;
}

// ---- Errors ---------------------------------------------------------------------------------

ORION_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  ORION_API(cuGetErrorName);
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (static_cast<int>(error)) {
#define ORION_CUDA_ERROR(v, n, d) \
  case v:                         \
    *pStr = #n;                   \
    return CUDA_SUCCESS;
#include "cuda_errors.inc"
#undef ORION_CUDA_ERROR
    case 9: *pStr = "CUDA_ERROR_INVALID_CONFIGURATION"; return CUDA_SUCCESS;  // undocumented (api_exec.cpp)
    default: *pStr = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}

ORION_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  ORION_API(cuGetErrorString);
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (static_cast<int>(error)) {
#define ORION_CUDA_ERROR(v, n, d) \
  case v:                         \
    *pStr = d;                    \
    return CUDA_SUCCESS;
#include "cuda_errors.inc"
#undef ORION_CUDA_ERROR
    case 9: *pStr = "invalid configuration argument"; return CUDA_SUCCESS;
    default: *pStr = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // extern "C"
