// cuda_backend.cpp — the "cuda" executor: a session worker's calls run on the real CUDA driver.
//
// The driver is dlopen'ed (never linked), so oriond builds and starts on machines without one.
// Every entry point is resolved with dlsym under its exact exported, versioned name
// (cuMemAlloc_v2, cuMemcpyHtoDAsync_v2, ...); the function types come from <cuda.h> itself
// (decltype of the declaration the header's #define maps the plain name to), so a signature can
// not drift from the toolkit's. Return values are CUresults, verbatim (backend.h).
//
// Choices that a reader of the CUDA documentation should know about (references are to the
// CUDA 13.0 <cuda.h> doc comments):
//  * Modules are libraries: cuLibraryLoadData is context-independent, so a module handle stays
//    valid whatever context the client makes current. Without CU_LIBRARY_BINARY_IS_PRESERVED
//    "the driver [allocates and maintains] its own copy of code" (CUlibraryOption), so the
//    image buffer need not outlive ModuleLoad.
//  * A function handle is the CUkernel from cuLibraryGetKernel. cuLaunchKernel documents that a
//    context-less CUkernel may be passed "by casting to ::CUfunction"; the context then comes
//    from the stream, or the current context for a NULL stream. Attributes use
//    cuKernelGetAttribute / cuKernelSetAttribute for the current context's device; occupancy
//    uses the CUfunction cuKernelGetFunction returns for the current context.
//  * The parameter layout comes from cuKernelGetParamInfo (driver >= 12.4), index 0, 1, ...
//    until CUDA_ERROR_INVALID_VALUE ("paramIndex must be less than the number of parameters").
//    Launches pass the packed buffer with CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE.
//  * The data window is cuMemHostRegister'ed PORTABLE | DEVICEMAP. Registration needs a current
//    context, so it happens lazily: at RegisterWindow if a context is current, else in the primary
//    context ContextOverhead retains at the handshake, else at the next SetCurrent / CtxCreate /
//    window copy. If the context that holds the registration is
//    destroyed or reset, the registration is assumed gone and redone on the next occasion
//    (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED counts as success). If registration fails, copies
//    still work as pageable copies and HostGetDevicePointer answers CUDA_ERROR_NOT_SUPPORTED.
//  * Copies that read the window (HtoD, 2D from the window) synchronise their stream before
//    returning: the client reuses window bytes as soon as the worker reports the frame done, so
//    the DMA must have read them. (A later optimisation: record an event and only wait for it
//    when the window space is about to be reused.) DtoH with async=false synchronises too;
//    async=true leaves the copy in stream order (its destination is registered window memory).
//  * The driver library is never dlclose'd: driver threads may still run code from it.
//
// Thread-safety: none (backend.h). No exception escapes; nothing is logged here.

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "orion/common/frame.h"
#include "orion/common/status.h"
#include "orion/host/backend.h"
#include "orion/host/compute_share.h"

namespace orion::host {
namespace {

// ---- The driver API, resolved with dlsym ----------------------------------------------------
//
// X(member, exported_name): `exported_name` is both the dlsym name and the identifier <cuda.h>
// declares with that signature (the header #defines e.g. cuMemAlloc to cuMemAlloc_v2). Never
// pass a plain name that <cuda.h> #defines (cuMemAlloc, cuCtxCreate, cuEventElapsedTime): the
// argument would be macro-expanded in decltype but not in the string.
#define ORION_CUDA_REQUIRED(X)                                                      \
  X(init, cuInit)                                                                   \
  X(driverGetVersion, cuDriverGetVersion)                                           \
  X(deviceGet, cuDeviceGet)                                                         \
  X(deviceGetCount, cuDeviceGetCount)                                               \
  X(deviceGetName, cuDeviceGetName)                                                 \
  X(deviceGetUuid, cuDeviceGetUuid_v2)                                              \
  X(deviceGetAttribute, cuDeviceGetAttribute)                                       \
  X(deviceGetPCIBusId, cuDeviceGetPCIBusId)                                         \
  X(deviceTotalMem, cuDeviceTotalMem_v2)                                            \
  X(primaryCtxRetain, cuDevicePrimaryCtxRetain)                                     \
  X(primaryCtxRelease, cuDevicePrimaryCtxRelease_v2)                                \
  X(primaryCtxReset, cuDevicePrimaryCtxReset_v2)                                    \
  X(ctxDestroy, cuCtxDestroy_v2)                                                    \
  X(ctxSetCurrent, cuCtxSetCurrent)                                                 \
  X(ctxGetCurrent, cuCtxGetCurrent)                                                 \
  X(ctxGetDevice, cuCtxGetDevice)                                                   \
  X(ctxSynchronize, cuCtxSynchronize)                                               \
  X(ctxSetLimit, cuCtxSetLimit)                                                     \
  X(ctxGetLimit, cuCtxGetLimit)                                                     \
  X(memAlloc, cuMemAlloc_v2)                                                        \
  X(memFree, cuMemFree_v2)                                                          \
  X(memGetInfo, cuMemGetInfo_v2)                                                    \
  X(memcpyHtoDAsync, cuMemcpyHtoDAsync_v2)                                          \
  X(memcpyDtoHAsync, cuMemcpyDtoHAsync_v2)                                          \
  X(memcpyDtoDAsync, cuMemcpyDtoDAsync_v2)                                          \
  X(memcpy2DAsync, cuMemcpy2DAsync_v2)                                              \
  X(memcpy3DAsync, cuMemcpy3DAsync_v2)                                              \
  X(array3DCreate, cuArray3DCreate_v2)                                              \
  X(arrayDestroy, cuArrayDestroy)                                                   \
  X(mipmappedArrayCreate, cuMipmappedArrayCreate)                                   \
  X(mipmappedArrayGetLevel, cuMipmappedArrayGetLevel)                               \
  X(mipmappedArrayDestroy, cuMipmappedArrayDestroy)                                 \
  X(texObjectCreate, cuTexObjectCreate)                                             \
  X(texObjectDestroy, cuTexObjectDestroy)                                           \
  X(surfObjectCreate, cuSurfObjectCreate)                                           \
  X(surfObjectDestroy, cuSurfObjectDestroy)                                         \
  X(memsetD8Async, cuMemsetD8Async)                                                 \
  X(memsetD16Async, cuMemsetD16Async)                                               \
  X(memsetD32Async, cuMemsetD32Async)                                               \
  X(memsetD2D8Async, cuMemsetD2D8Async)                                             \
  X(memsetD2D16Async, cuMemsetD2D16Async)                                           \
  X(memsetD2D32Async, cuMemsetD2D32Async)                                           \
  X(memHostRegister, cuMemHostRegister_v2)                                          \
  X(memHostUnregister, cuMemHostUnregister)                                         \
  X(memAddressReserve, cuMemAddressReserve)                                         \
  X(memAddressFree, cuMemAddressFree)                                               \
  X(memCreate, cuMemCreate)                                                         \
  X(memRelease, cuMemRelease)                                                       \
  X(memMap, cuMemMap)                                                               \
  X(memUnmap, cuMemUnmap)                                                           \
  X(memSetAccess, cuMemSetAccess)                                                   \
  X(ipcGetMemHandle, cuIpcGetMemHandle)                                             \
  X(ipcOpenMemHandle, cuIpcOpenMemHandle_v2)                                        \
  X(ipcCloseMemHandle, cuIpcCloseMemHandle)                                         \
  X(ipcGetEventHandle, cuIpcGetEventHandle)                                         \
  X(ipcOpenEventHandle, cuIpcOpenEventHandle)                                       \
  X(memHostGetDevicePointer, cuMemHostGetDevicePointer_v2)                          \
  X(libraryLoadData, cuLibraryLoadData)                                             \
  X(libraryUnload, cuLibraryUnload)                                                 \
  X(libraryGetKernel, cuLibraryGetKernel)                                           \
  X(libraryGetGlobal, cuLibraryGetGlobal)                                           \
  X(kernelGetParamInfo, cuKernelGetParamInfo)                                       \
  X(kernelGetAttribute, cuKernelGetAttribute)                                       \
  X(kernelSetAttribute, cuKernelSetAttribute)                                       \
  X(kernelGetFunction, cuKernelGetFunction)                                         \
  X(launchKernel, cuLaunchKernel)                                                   \
  X(launchKernelEx, cuLaunchKernelEx)                                               \
  X(occupancyMaxActiveClusters, cuOccupancyMaxActiveClusters)                       \
  X(occupancyAvailableDynamicSMem, cuOccupancyAvailableDynamicSMemPerBlock)         \
  X(occupancyMaxActiveBlocks, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags) \
  X(streamCreateWithPriority, cuStreamCreateWithPriority)                           \
  X(streamDestroy, cuStreamDestroy_v2)                                              \
  X(streamSynchronize, cuStreamSynchronize)                                         \
  X(streamQuery, cuStreamQuery)                                                     \
  X(streamWaitEvent, cuStreamWaitEvent)                                             \
  X(eventCreate, cuEventCreate)                                                     \
  X(eventDestroy, cuEventDestroy_v2)                                                \
  X(eventRecord, cuEventRecord)                                                     \
  X(eventSynchronize, cuEventSynchronize)                                           \
  X(eventQuery, cuEventQuery)

// cuCtxCreate_v2 (CUDA 3.2 .. 12.4 signature); <cuda.h> 13 declares it only internally.
using CtxCreateV2Fn = CUresult(CUDAAPI*)(CUcontext* pctx, unsigned int flags, CUdevice dev);

struct Api {
#define ORION_CUDA_MEMBER(member, fn) decltype(&::fn) member = nullptr;
  ORION_CUDA_REQUIRED(ORION_CUDA_MEMBER)
#undef ORION_CUDA_MEMBER
  // One of these two (cuCtxCreate_v4 preferred, driver >= 12.5).
  decltype(&::cuCtxCreate_v4) ctxCreateV4 = nullptr;
  CtxCreateV2Fn ctxCreateV2 = nullptr;
  // cuEventElapsedTime_v2 (driver >= 12.8), else cuEventElapsedTime: same signature.
  decltype(&::cuEventElapsedTime_v2) eventElapsedTime = nullptr;
  // Optional: only for error messages.
  decltype(&::cuGetErrorName) getErrorName = nullptr;
  // Optional (driver >= 12.4): a module's kernels, for ModuleFunctionNames.
  decltype(&::cuLibraryGetKernelCount) libraryGetKernelCount = nullptr;
  decltype(&::cuLibraryEnumerateKernels) libraryEnumerateKernels = nullptr;
  decltype(&::cuKernelGetName) kernelGetName = nullptr;
  // Optional: peer access between a session's GPUs (guests see every pair of vGPUs as peers).
  decltype(&::cuDeviceCanAccessPeer) deviceCanAccessPeer = nullptr;
  decltype(&::cuCtxEnablePeerAccess) ctxEnablePeerAccess = nullptr;
  // Optional (driver >= 11.0): stream attributes (the access policy window, the sync policy).
  decltype(&::cuStreamGetAttribute) streamGetAttribute = nullptr;
  decltype(&::cuTensorMapEncodeTiled) tensorMapEncodeTiled = nullptr;
  decltype(&::cuTensorMapEncodeIm2col) tensorMapEncodeIm2col = nullptr;
  decltype(&::cuTensorMapReplaceAddress) tensorMapReplaceAddress = nullptr;
  decltype(&::cuStreamSetAttribute) streamSetAttribute = nullptr;
};

template <typename F>
bool Sym(void* lib, const char* name, F* out) {
  void* p = dlsym(lib, name);
  if (p == nullptr) return false;
  *out = reinterpret_cast<F>(p);
  return true;
}

Status MissingSymbol(const std::string& path, const char* name, const char* hint) {
  std::string m = "CUDA driver '" + path + "' does not export " + name;
  if (hint != nullptr) m += std::string(" (") + hint + ")";
  return FailedPrecondition(std::move(m));
}

// Resolves every entry point the backend uses; an error names the first one missing.
Status LoadApi(void* lib, const std::string& path, Api* api) {
#define ORION_CUDA_LOAD(member, fn) \
  if (!Sym(lib, #fn, &api->member)) return MissingSymbol(path, #fn, hint_for(#fn));
  auto hint_for = [](const char* fn) -> const char* {
    std::string_view n(fn);
    if (n == "cuKernelGetParamInfo") return "needs a driver for CUDA 12.4 or newer";
    if (n.starts_with("cuLibrary") || n.starts_with("cuKernel")) return "needs a driver for CUDA 12.0 or newer";
    return "not a CUDA driver, or one too old";
  };
  ORION_CUDA_REQUIRED(ORION_CUDA_LOAD)
#undef ORION_CUDA_LOAD
  if (!Sym(lib, "cuCtxCreate_v4", &api->ctxCreateV4) && !Sym(lib, "cuCtxCreate_v2", &api->ctxCreateV2)) {
    return MissingSymbol(path, "cuCtxCreate_v4 or cuCtxCreate_v2", nullptr);
  }
  if (!Sym(lib, "cuEventElapsedTime_v2", &api->eventElapsedTime) &&
      !Sym(lib, "cuEventElapsedTime", &api->eventElapsedTime)) {
    return MissingSymbol(path, "cuEventElapsedTime_v2 or cuEventElapsedTime", nullptr);
  }
  (void)Sym(lib, "cuGetErrorName", &api->getErrorName);
  (void)Sym(lib, "cuLibraryGetKernelCount", &api->libraryGetKernelCount);
  (void)Sym(lib, "cuLibraryEnumerateKernels", &api->libraryEnumerateKernels);
  (void)Sym(lib, "cuKernelGetName", &api->kernelGetName);
  (void)Sym(lib, "cuDeviceCanAccessPeer", &api->deviceCanAccessPeer);
  (void)Sym(lib, "cuCtxEnablePeerAccess", &api->ctxEnablePeerAccess);
  (void)Sym(lib, "cuStreamGetAttribute", &api->streamGetAttribute);
  (void)Sym(lib, "cuTensorMapEncodeTiled", &api->tensorMapEncodeTiled);  // CUDA 12.0
  (void)Sym(lib, "cuTensorMapEncodeIm2col", &api->tensorMapEncodeIm2col);
  (void)Sym(lib, "cuTensorMapReplaceAddress", &api->tensorMapReplaceAddress);
  (void)Sym(lib, "cuStreamSetAttribute", &api->streamSetAttribute);
  return Status::Ok();
}

// dlopen's the driver; the handle is never closed (see the file comment).
Result<void*> OpenDriver(const std::string& path) {
  if (path.empty()) return InvalidArgument("CUDA driver path is empty");
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    return Unavailable(e != nullptr ? std::string(e) : path + ": cannot be loaded");
  }
  return lib;
}

// Names for the results that matter when the driver cannot answer cuGetErrorName itself (the
// link stub, a broken install).
const char* FallbackErrorName(CUresult r) noexcept {
  switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_DEVICE_UNAVAILABLE: return "CUDA_ERROR_DEVICE_UNAVAILABLE";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_DEVICE_NOT_LICENSED: return "CUDA_ERROR_DEVICE_NOT_LICENSED";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_OPERATING_SYSTEM: return "CUDA_ERROR_OPERATING_SYSTEM";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_SYSTEM_NOT_READY: return "CUDA_ERROR_SYSTEM_NOT_READY";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: return nullptr;
  }
}

// "CUDA_ERROR_NO_DEVICE (100)".
std::string ErrorText(const Api& api, CUresult r) {
  const char* name = nullptr;
  if (api.getErrorName == nullptr || api.getErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) {
    name = FallbackErrorName(r);
  }
  std::string s = name != nullptr ? name : "CUresult";
  s += " (" + std::to_string(static_cast<int>(r)) + ")";
  return s;
}

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
std::string FormatUuid(const CUuuid& u) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    const auto b = static_cast<unsigned char>(u.bytes[i]);
    s += kHex[b >> 4];
    s += kHex[b & 0xF];
  }
  return s;
}

inline CUstream Stream(void* s) { return static_cast<CUstream>(s); }
inline CUevent Event(void* e) { return static_cast<CUevent>(e); }
inline CUcontext Ctx(void* c) { return static_cast<CUcontext>(c); }
inline CUkernel Kernel(void* k) { return static_cast<CUkernel>(k); }
inline CUlibrary Library(void* m) { return static_cast<CUlibrary>(m); }

constexpr uint32_t kFatbinMagic = 0xBA55ED50u;         // fatbin container
constexpr uint32_t kFatbinWrapperMagic = 0x466243B1u;  // __fatBinC_Wrapper_t (holds a pointer)
// Upper bound on cuKernelGetParamInfo indices tried: CUDA allows 32764 bytes of parameters and a
// parameter takes at least one byte, so no kernel has more.
constexpr size_t kMaxParamProbe = 32768;

// ---- The backend ----------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const Api& api) : api_(api) {}
  // The worker's stdout becomes a non-blocking pipe of 1 MiB (the driver's default printf FIFO):
  // device printf is read back from it (TakeOutput); past 1 MiB unread, the driver's writes fail
  // and the text is lost rather than stalling the worker, as a full printf FIFO loses it on a GPU.
  void CaptureStdout() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return;
    (void)::fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
    if (::dup2(fds[1], 1) < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      return;
    }
    ::close(fds[1]);
    out_fd_ = fds[0];
  }
  // See the file comment: no dlclose, no driver calls (turns_ stops its keeper thread; a turn still
  // held ends with the process: oriond frees the device of a dead holder).
  ~CudaBackend() override = default;

  const char* name() const override { return "cuda"; }

  Status Init(const std::vector<Placement>& placements) override {
    CaptureStdout();
    try {
      if (placements.empty()) return InvalidArgument("cuda backend: a session needs at least one placement");
      const CUresult r = api_.init(0);
      if (r != CUDA_SUCCESS) return Unavailable("cuInit failed: " + ErrorText(api_, r));
      std::vector<CUdevice> devices;
      devices.reserve(placements.size());
      for (size_t i = 0; i < placements.size(); ++i) {
        const uint32_t pgpu = placements[i].pgpu;
        if (pgpu > static_cast<uint32_t>(INT_MAX)) {
          return InvalidArgument("placement " + std::to_string(i) + ": physical GPU " + std::to_string(pgpu) +
                                 " is out of range");
        }
        CUdevice d = 0;
        const CUresult g = api_.deviceGet(&d, static_cast<int>(pgpu));
        if (g != CUDA_SUCCESS) {
          return Unavailable("placement " + std::to_string(i) + ": cuDeviceGet(" + std::to_string(pgpu) +
                             ") failed: " + ErrorText(api_, g));
        }
        devices.push_back(d);
      }
      placements_ = placements;
      devices_ = std::move(devices);
      // Same-address mapping of window memory needs unified addressing and a device address
      // equal to the host address of registered memory (CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_
      // FOR_REGISTERED_MEM, cuMemHostRegister doc) on every GPU of the session.
      same_address_ = api_.memHostUnregister != nullptr;
      for (const CUdevice d : devices_) {
        int ua = 0, hp = 0;
        (void)api_.deviceGetAttribute(&ua, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, d);
        (void)api_.deviceGetAttribute(&hp, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, d);
        same_address_ = same_address_ && ua == 1 && hp == 1;
      }
      const long pg = ::sysconf(_SC_PAGESIZE);
      page_ = pg > 0 ? static_cast<uint64_t>(pg) : 4096;
      return Status::Ok();
    } catch (...) {
      return Internal("cuda backend: out of memory in Init");
    }
  }

  void DescribeDevice(uint32_t dev, DeviceInfo* out) override {
    if (out == nullptr || dev >= devices_.size()) return;
    const CUdevice d = devices_[dev];
    // Everything but total_mem, which the worker fills from the quota.
    std::memset(out->name, 0, sizeof(out->name));
    std::memset(out->uuid, 0, sizeof(out->uuid));
    std::memset(out->attributes, 0, sizeof(out->attributes));
    std::memset(out->pci_bus_id, 0, sizeof(out->pci_bus_id));
    out->luid_low = 0;
    out->reserved = 0;
    out->pgpu = placements_[dev].pgpu;
    out->vgpu = placements_[dev].vgpu;

    // At most sizeof - 1 characters, so the zeroed last byte stays a terminator.
    if (api_.deviceGetName(out->name, static_cast<int>(sizeof(out->name) - 1), d) != CUDA_SUCCESS) {
      std::memset(out->name, 0, sizeof(out->name));
    }
    out->name[sizeof(out->name) - 1] = '\0';

    CUuuid uuid{};
    if (api_.deviceGetUuid(&uuid, d) == CUDA_SUCCESS) {
      static_assert(sizeof(uuid.bytes) == sizeof(out->uuid));
      std::memcpy(out->uuid, uuid.bytes, sizeof(out->uuid));
    }

    // Every index the wire struct has room for: ids a newer driver knows beyond this header's
    // CU_DEVICE_ATTRIBUTE_MAX are useful to a newer client runtime, and unknown ids simply fail
    // (CUDA_ERROR_INVALID_VALUE) and stay 0. Index 0 is not an attribute.
    for (uint32_t a = 1; a < kMaxDeviceAttributes; ++a) {
      int v = 0;
      if (api_.deviceGetAttribute(&v, static_cast<CUdevice_attribute>(a), d) == CUDA_SUCCESS) out->attributes[a] = v;
    }

    char bus[64] = {};
    if (api_.deviceGetPCIBusId(bus, static_cast<int>(sizeof(bus)), d) == CUDA_SUCCESS) {
      bus[sizeof(bus) - 1] = '\0';
      std::string_view b(bus);
      // The field holds "dddd:bb:dd.f". A driver that prints an 8-digit domain ("00000000:3B:00.0",
      // nvidia-smi style) has leading zeros to spare.
      while (b.size() > 1 && b[0] == '0' && b.find(':') > 4 && b.find(':') != std::string_view::npos)
        b.remove_prefix(1);
      const size_t n = std::min(b.size(), sizeof(out->pci_bus_id) - 1);
      std::memcpy(out->pci_bus_id, b.data(), n);
    }
  }

  int DriverVersion() override {
    int v = 0;
    if (api_.driverGetVersion(&v) != CUDA_SUCCESS) return 0;
    return v;
  }

  // A context's cost, measured once per physical GPU: with the device's primary context current,
  // free memory before and after creating one more context (cuMemGetInfo needs a current context,
  // so "before any context" cannot be observed). The first context of a process may cost a little
  // more (process-wide state); other processes allocating meanwhile add noise. 0 on failure (not
  // cached, so a later call measures again). The calling thread's current context is restored.
  //
  // After a successful measurement the backend keeps its retain on the primary context (the
  // worker charges the overhead from the handshake on, and never releases primary contexts
  // either), so the client's first cuDevicePrimaryCtxRetain finds it ready instead of paying for
  // a second creation; and the window is registered in it, the longest-lived context there is.
  uint64_t ContextOverhead(uint32_t dev) override {
    if (dev >= devices_.size()) return 0;
    const CUdevice d = devices_[dev];
    if (auto it = overhead_.find(d); it != overhead_.end()) return it->second;

    CUcontext prev = nullptr;
    if (api_.ctxGetCurrent(&prev) != CUDA_SUCCESS) prev = nullptr;
    CUcontext primary = nullptr;
    if (api_.primaryCtxRetain(&primary, d) != CUDA_SUCCESS) return 0;

    // The GPU's free memory before and after a second context is made: what one context costs.
    // Other processes (tenants starting at the same time) allocate meanwhile too, which only makes
    // a sample larger, so the smallest of up to kSamples counts, and two samples within 4 MiB of each
    // other end the measuring (seen on an H100: four sessions starting together measured 2.7 GB
    // where one alone measures ~500 MiB, bench/results/2026-11-27-compute-share-cuda.txt).
    constexpr int kSamples = 4;
    constexpr uint64_t kAgree = 4ull << 20;
    bool ok = false;
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < kSamples && api_.ctxSetCurrent(primary) == CUDA_SUCCESS; ++i) {
      size_t free_before = 0, free_after = 0, total = 0;
      if (api_.memGetInfo(&free_before, &total) != CUDA_SUCCESS) break;
      CUcontext extra = nullptr;
      if (CreateContext(d, 0, &extra) != CUDA_SUCCESS) break;  // pushed: now current
      const bool got = api_.memGetInfo(&free_after, &total) == CUDA_SUCCESS;
      (void)api_.ctxDestroy(extra);  // pops it
      if (!got) break;
      const uint64_t sample = free_before > free_after ? free_before - free_after : 0;
      const bool agrees = ok && (sample > best ? sample - best : best - sample) <= kAgree;
      best = std::min(best, sample);
      ok = true;
      if (agrees) break;
    }
    if (ok) {
      try {
        primary_[d] = primary;
        overhead_[d] = best;
      } catch (...) {
        ok = false;
      }
    }
    if (ok && api_.ctxSetCurrent(primary) == CUDA_SUCCESS) {
      window_failed_ctx_ = nullptr;
      EnsureWindow();
    }
    (void)api_.ctxSetCurrent(prev);
    if (!ok) {
      (void)api_.primaryCtxRelease(d);
      return 0;
    }
    return overhead_[d];
  }

  CUresult RegisterWindow(void* base, uint64_t bytes) override {
    if (base == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    window_base_ = base;
    window_bytes_ = bytes;
    window_registered_ = false;
    window_owner_ = nullptr;
    window_failed_ctx_ = nullptr;
    window_error_ = CUDA_SUCCESS;
    EnsureWindow();
    // Deferred (no current context yet) counts as success; an immediate failure is reported for
    // the caller's log, but the backend keeps working without the registration.
    return window_registered_ ? CUDA_SUCCESS : window_error_;
  }

  // ---- Contexts ----

  CUresult PrimaryCtxRetain(uint32_t dev, void** ctx) override {
    if (dev >= devices_.size()) return CUDA_ERROR_INVALID_DEVICE;
    CUcontext c = nullptr;
    const CUresult r = api_.primaryCtxRetain(&c, devices_[dev]);
    if (r != CUDA_SUCCESS) return r;
    try {
      primary_[devices_[dev]] = c;
    } catch (...) {
    }
    window_failed_ctx_ = nullptr;  // a new context event: registration may be retried
    EnablePeers(devices_[dev], c);
    *ctx = c;
    return CUDA_SUCCESS;
  }

  // The guest reports every pair of a session's vGPUs as peers: where the GPUs can reach each
  // other, kernels on one may then use the other's memory (copies work in any case, by unified
  // addressing). Best effort: errors (already enabled, no P2P) leave copies correct.
  void EnablePeers(CUdevice d, CUcontext c) {
    if (api_.deviceCanAccessPeer == nullptr || api_.ctxEnablePeerAccess == nullptr) return;
    CUcontext saved = nullptr;
    (void)api_.ctxGetCurrent(&saved);
    for (const auto& [d2, c2] : primary_) {
      if (d2 == d || c2 == nullptr) continue;
      int ab = 0, ba = 0;
      if (api_.deviceCanAccessPeer(&ab, d, d2) == CUDA_SUCCESS && ab != 0 && api_.ctxSetCurrent(c) == CUDA_SUCCESS)
        (void)api_.ctxEnablePeerAccess(c2, 0);
      if (api_.deviceCanAccessPeer(&ba, d2, d) == CUDA_SUCCESS && ba != 0 && api_.ctxSetCurrent(c2) == CUDA_SUCCESS)
        (void)api_.ctxEnablePeerAccess(c, 0);
    }
    (void)api_.ctxSetCurrent(saved);
  }

  CUresult PrimaryCtxReset(uint32_t dev) override {
    if (dev >= devices_.size()) return CUDA_ERROR_INVALID_DEVICE;
    const CUdevice d = devices_[dev];
    turns_.Forget(nullptr);  // before the driver call: the keeper must not query them meanwhile
    const CUresult r = api_.primaryCtxReset(d);
    if (r != CUDA_SUCCESS) return r;
    // The reset destroys the primary context's state, host registrations included.
    CUcontext primary = nullptr;
    if (auto it = primary_.find(d); it != primary_.end()) primary = it->second;
    if (window_registered_ && (window_owner_ == nullptr || (primary != nullptr && window_owner_ == primary))) {
      window_registered_ = false;
      window_owner_ = nullptr;
    }
    ForgetAliasRegistrations(primary);
    window_failed_ctx_ = nullptr;
    return CUDA_SUCCESS;
  }

  CUresult CtxCreate(uint32_t dev, uint32_t flags, void** ctx) override {
    if (dev >= devices_.size()) return CUDA_ERROR_INVALID_DEVICE;
    CUcontext c = nullptr;
    const CUresult r = CreateContext(devices_[dev], flags, &c);
    if (r != CUDA_SUCCESS) return r;
    *ctx = c;
    window_failed_ctx_ = nullptr;
    EnsureWindow();  // the new context is current (cuCtxCreate pushes it)
    return CUDA_SUCCESS;
  }

  CUresult CtxDestroy(void* ctx) override {
    turns_.Forget(nullptr);  // before the driver call: the keeper must not query them meanwhile
    const CUresult r = api_.ctxDestroy(Ctx(ctx));
    if (r != CUDA_SUCCESS) return r;
    if (window_registered_ && (window_owner_ == nullptr || window_owner_ == Ctx(ctx))) {
      window_registered_ = false;
      window_owner_ = nullptr;
    }
    ForgetAliasRegistrations(Ctx(ctx));
    window_failed_ctx_ = nullptr;
    return CUDA_SUCCESS;
  }

  CUresult SetCurrent(void* ctx) override {
    const CUresult r = api_.ctxSetCurrent(Ctx(ctx));
    if (r == CUDA_SUCCESS && ctx != nullptr) EnsureWindow();
    return r;
  }

  CUresult CtxSynchronize() override { return Synced(api_.ctxSynchronize()); }

  CUresult CtxSetLimit(uint32_t limit, uint64_t value) override {
    return api_.ctxSetLimit(static_cast<CUlimit>(limit), static_cast<size_t>(value));
  }

  CUresult CtxGetLimit(uint32_t limit, uint64_t* value) override {
    size_t v = 0;
    const CUresult r = api_.ctxGetLimit(&v, static_cast<CUlimit>(limit));
    if (r == CUDA_SUCCESS) *value = v;
    return r;
  }

  // ---- Memory ----

  CUresult MemAlloc(uint64_t bytes, uint64_t* dptr) override {
    CUdeviceptr p = 0;
    const CUresult r = api_.memAlloc(&p, static_cast<size_t>(bytes));
    if (r == CUDA_SUCCESS) *dptr = p;
    return r;
  }

  CUresult MemFree(uint64_t dptr) override {
    const CUresult r = api_.memFree(static_cast<CUdeviceptr>(dptr));
    if (r == CUDA_SUCCESS) {
      if (auto t = mem_tickets_.find(dptr); t != mem_tickets_.end()) {
        ::close(t->second.first);
        mem_tickets_.erase(t);
      }
    }
    return r;
  }

  // CUDA IPC: the driver's own handles, carried inside Orion's tickets (orion/host/ipc_ticket.h),
  // so an application only ever holds a handle that names a ticket and its secret.
  CUresult IpcExportMemory(uint64_t dptr, uint64_t bytes, IpcHandle* out) override {
    if (auto t = mem_tickets_.find(dptr); t != mem_tickets_.end()) {
      *out = t->second.second;
      return CUDA_SUCCESS;
    }
    CUipcMemHandle real{};
    if (CUresult r = api_.ipcGetMemHandle(&real, dptr); r != CUDA_SUCCESS) return r;
    auto fd = CreateIpcTicket(kIpcMemory, bytes, 0, reinterpret_cast<const uint8_t*>(real.reserved), out);
    if (!fd.ok()) return CUDA_ERROR_OUT_OF_MEMORY;
    mem_tickets_[dptr] = {*fd, *out};
    return CUDA_SUCCESS;
  }
  CUresult IpcImportMemory(const IpcHandle& h, uint64_t* dptr, uint64_t* bytes) override {
    CUipcMemHandle real{};
    auto fd = OpenIpcTicket(h, kIpcMemory, reinterpret_cast<uint8_t*>(real.reserved));
    if (!fd.ok()) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = 0;
    if (CUresult r = api_.ipcOpenMemHandle(&p, real, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS); r != CUDA_SUCCESS) {
      ::close(*fd);
      return r;
    }
    *dptr = p;
    *bytes = h.bytes;
    import_tickets_[p] = *fd;  // kept while the import lives: the importer's share (ipc_ticket.h)
    return CUDA_SUCCESS;
  }
  CUresult IpcCloseMemory(uint64_t dptr) override {
    const CUresult r = api_.ipcCloseMemHandle(dptr);
    if (auto t = import_tickets_.find(dptr); r == CUDA_SUCCESS && t != import_tickets_.end()) {
      ::close(t->second);
      import_tickets_.erase(t);
    }
    return r;
  }
  int IpcTicketFd(uint64_t dptr) const override {
    if (auto t = mem_tickets_.find(dptr); t != mem_tickets_.end()) return t->second.first;
    if (auto t = import_tickets_.find(dptr); t != import_tickets_.end()) return t->second;
    return -1;
  }
  CUresult IpcExportEvent(void* event, IpcHandle* out) override {
    if (auto t = event_tickets_.find(event); t != event_tickets_.end()) {
      *out = t->second.second;
      return CUDA_SUCCESS;
    }
    CUipcEventHandle real{};
    if (CUresult r = api_.ipcGetEventHandle(&real, Event(event)); r != CUDA_SUCCESS) return r;
    auto fd = CreateIpcTicket(kIpcEvent, 0, 0, reinterpret_cast<const uint8_t*>(real.reserved), out);
    if (!fd.ok()) return CUDA_ERROR_OUT_OF_MEMORY;
    event_tickets_[event] = {*fd, *out};
    return CUDA_SUCCESS;
  }
  CUresult IpcImportEvent(const IpcHandle& h, void** event) override {
    CUipcEventHandle real{};
    auto fd = OpenIpcTicket(h, kIpcEvent, reinterpret_cast<uint8_t*>(real.reserved));
    if (!fd.ok()) return CUDA_ERROR_INVALID_VALUE;
    ::close(*fd);
    CUevent e = nullptr;
    if (CUresult r = api_.ipcOpenEventHandle(&e, real); r != CUDA_SUCCESS) return r;
    *event = e;
    return CUDA_SUCCESS;
  }

  CUresult MemGetInfo(uint64_t* free, uint64_t* total) override {
    size_t f = 0, t = 0;
    const CUresult r = api_.memGetInfo(&f, &t);
    if (r == CUDA_SUCCESS) {
      *free = f;
      *total = t;
    }
    return r;
  }

  // The window bytes are reused by the client as soon as the frame is done, so the copy must
  // have read them before this returns: stream-synchronise (see the file comment).
  CUresult MemcpyHtoD(uint64_t dst, const void* src, uint64_t bytes, void* stream) override {
    EnsureWindow();
    const CUresult r =
        api_.memcpyHtoDAsync(static_cast<CUdeviceptr>(dst), src, static_cast<size_t>(bytes), Stream(stream));
    if (r != CUDA_SUCCESS) return r;
    return api_.streamSynchronize(Stream(stream));
  }

  CUresult MemcpyDtoH(void* dst, uint64_t src, uint64_t bytes, void* stream, bool async) override {
    EnsureWindow();
    const CUresult r =
        api_.memcpyDtoHAsync(dst, static_cast<CUdeviceptr>(src), static_cast<size_t>(bytes), Stream(stream));
    if (r != CUDA_SUCCESS || async) return r;
    return Synced(api_.streamSynchronize(Stream(stream)));
  }

  CUresult MemcpyDtoD(uint64_t dst, uint64_t src, uint64_t bytes, void* stream) override {
    return api_.memcpyDtoDAsync(static_cast<CUdeviceptr>(dst), static_cast<CUdeviceptr>(src),
                                static_cast<size_t>(bytes), Stream(stream));
  }

  CUresult Memcpy2D(uint64_t dst, void* dst_host, uint64_t dst_pitch, uint64_t src, const void* src_host,
                    uint64_t src_pitch, uint64_t width, uint64_t height, void* stream) override {
    const bool host_side = dst_host != nullptr || src_host != nullptr;
    if (host_side) EnsureWindow();
    CUDA_MEMCPY2D c;
    std::memset(&c, 0, sizeof(c));
    if (src_host != nullptr) {
      c.srcMemoryType = CU_MEMORYTYPE_HOST;
      c.srcHost = src_host;
    } else {
      c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
      c.srcDevice = static_cast<CUdeviceptr>(src);
    }
    c.srcPitch = static_cast<size_t>(src_pitch);
    if (dst_host != nullptr) {
      c.dstMemoryType = CU_MEMORYTYPE_HOST;
      c.dstHost = dst_host;
    } else {
      c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
      c.dstDevice = static_cast<CUdeviceptr>(dst);
    }
    c.dstPitch = static_cast<size_t>(dst_pitch);
    c.WidthInBytes = static_cast<size_t>(width);
    c.Height = static_cast<size_t>(height);
    const CUresult r = api_.memcpy2DAsync(&c, Stream(stream));
    if (r != CUDA_SUCCESS || !host_side) return r;
    // A window source must have been read, a window destination written, before the reply.
    return api_.streamSynchronize(Stream(stream));
  }

  static CUDA_ARRAY3D_DESCRIPTOR Descriptor(const ArraySpec& spec) {
    CUDA_ARRAY3D_DESCRIPTOR d;
    std::memset(&d, 0, sizeof d);
    d.Width = static_cast<size_t>(spec.width);
    d.Height = static_cast<size_t>(spec.height);
    d.Depth = static_cast<size_t>(spec.depth);
    d.Format = static_cast<CUarray_format>(spec.format);
    d.NumChannels = spec.channels;
    d.Flags = spec.flags;
    return d;
  }
  CUresult ArrayCreate(const ArraySpec& spec, void** array) override {
    const CUDA_ARRAY3D_DESCRIPTOR d = Descriptor(spec);
    CUarray a = nullptr;
    const CUresult r = api_.array3DCreate(&a, &d);
    if (r == CUDA_SUCCESS) *array = a;
    return r;
  }
  CUresult ArrayDestroy(void* array) override { return api_.arrayDestroy(static_cast<CUarray>(array)); }

  CUresult MemcpyArray(const CopySide& dst, const CopySide& src, uint64_t width, uint64_t height,
                       void* stream) override {
    const bool host_side = dst.kind == kSideWindow || src.kind == kSideWindow;
    if (host_side) EnsureWindow();
    CUDA_MEMCPY3D c;
    std::memset(&c, 0, sizeof c);
    auto side = [&](const CopySide& x, CUmemorytype* type, const void** host, CUdeviceptr* dev, CUarray* arr,
                    size_t* pitch, size_t* h, size_t* xb, size_t* y, size_t* z) {
      if (x.kind == kSideArray) {
        *type = CU_MEMORYTYPE_ARRAY;
        *arr = static_cast<CUarray>(x.array);
        *xb = static_cast<size_t>(x.x);
        *y = static_cast<size_t>(x.y);
        *z = static_cast<size_t>(x.z);
        return;
      }
      *type = x.kind == kSideWindow ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      if (x.kind == kSideWindow)
        *host = x.host;
      else
        *dev = static_cast<CUdeviceptr>(x.dptr);
      *pitch = static_cast<size_t>(x.pitch);
      *h = static_cast<size_t>(height);
    };
    const void* src_host = nullptr;
    const void* dst_host = nullptr;
    side(src, &c.srcMemoryType, &src_host, &c.srcDevice, &c.srcArray, &c.srcPitch, &c.srcHeight, &c.srcXInBytes,
         &c.srcY, &c.srcZ);
    side(dst, &c.dstMemoryType, &dst_host, &c.dstDevice, &c.dstArray, &c.dstPitch, &c.dstHeight, &c.dstXInBytes,
         &c.dstY, &c.dstZ);
    c.srcHost = src_host;
    c.dstHost = const_cast<void*>(dst_host);
    c.WidthInBytes = static_cast<size_t>(width);
    c.Height = static_cast<size_t>(height);
    c.Depth = 1;
    const CUresult r = api_.memcpy3DAsync(&c, Stream(stream));
    if (r != CUDA_SUCCESS || !host_side) return r;
    // A window source must have been read, a window destination written, before the reply.
    return api_.streamSynchronize(Stream(stream));
  }

  CUresult MipmappedArrayCreate(const ArraySpec& spec, uint32_t levels, void** mipmap) override {
    const CUDA_ARRAY3D_DESCRIPTOR d = Descriptor(spec);
    CUmipmappedArray m = nullptr;
    const CUresult r = api_.mipmappedArrayCreate(&m, &d, levels);
    if (r == CUDA_SUCCESS) *mipmap = m;
    return r;
  }
  CUresult MipmappedArrayGetLevel(void* mipmap, uint32_t level, void** array) override {
    CUarray a = nullptr;
    const CUresult r = api_.mipmappedArrayGetLevel(&a, static_cast<CUmipmappedArray>(mipmap), level);
    if (r == CUDA_SUCCESS) *array = a;
    return r;
  }
  CUresult MipmappedArrayDestroy(void* mipmap) override {
    return api_.mipmappedArrayDestroy(static_cast<CUmipmappedArray>(mipmap));
  }

  CUresult TexObjectCreate(const TexSpec& t, uint64_t* object) override {
    if (*object != 0) return CUDA_ERROR_NOT_SUPPORTED;  // the driver chooses the value
    CUDA_RESOURCE_DESC rd;
    std::memset(&rd, 0, sizeof rd);
    rd.resType = static_cast<CUresourcetype>(t.res_type);
    if (t.res_type == CU_RESOURCE_TYPE_ARRAY) {
      rd.res.array.hArray = static_cast<CUarray>(t.array);
    } else if (t.res_type == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY) {
      rd.res.mipmap.hMipmappedArray = static_cast<CUmipmappedArray>(t.mipmap);
    } else if (t.res_type == CU_RESOURCE_TYPE_LINEAR) {
      rd.res.linear.devPtr = static_cast<CUdeviceptr>(t.dptr);
      rd.res.linear.format = static_cast<CUarray_format>(t.format);
      rd.res.linear.numChannels = t.channels;
      rd.res.linear.sizeInBytes = static_cast<size_t>(t.width * TexelBytes(t.format, t.channels));
    } else {
      rd.res.pitch2D.devPtr = static_cast<CUdeviceptr>(t.dptr);
      rd.res.pitch2D.format = static_cast<CUarray_format>(t.format);
      rd.res.pitch2D.numChannels = t.channels;
      rd.res.pitch2D.width = static_cast<size_t>(t.width);
      rd.res.pitch2D.height = static_cast<size_t>(t.height);
      rd.res.pitch2D.pitchInBytes = static_cast<size_t>(t.pitch);
    }
    if (t.surface) {
      CUsurfObject o = 0;
      const CUresult r = api_.surfObjectCreate(&o, &rd);
      if (r == CUDA_SUCCESS) *object = o;
      return r;
    }
    CUDA_TEXTURE_DESC td;
    std::memset(&td, 0, sizeof td);
    for (int i = 0; i < 3; ++i) td.addressMode[i] = static_cast<CUaddress_mode>(t.address_mode[i]);
    td.filterMode = static_cast<CUfilter_mode>(t.filter_mode);
    td.flags = t.flags;
    for (int i = 0; i < 4; ++i) td.borderColor[i] = t.border_color[i];
    td.mipmapFilterMode = static_cast<CUfilter_mode>(t.mipmap_filter);
    td.maxAnisotropy = t.max_anisotropy;
    td.mipmapLevelBias = t.mipmap_bias;
    td.minMipmapLevelClamp = t.min_level;
    td.maxMipmapLevelClamp = t.max_level;
    CUtexObject o = 0;
    const CUresult r = api_.texObjectCreate(&o, &rd, &td, nullptr);
    if (r == CUDA_SUCCESS) *object = o;
    return r;
  }
  CUresult TexObjectDestroy(uint64_t object, bool surface) override {
    return surface ? api_.surfObjectDestroy(static_cast<CUsurfObject>(object))
                   : api_.texObjectDestroy(static_cast<CUtexObject>(object));
  }
  static uint64_t TexelBytes(uint32_t format, uint32_t channels) { return ArrayFormatBytes(format) * channels; }

  CUresult Memset(uint64_t dst, uint32_t value, uint32_t elem_size, uint64_t width, uint64_t height, uint64_t pitch,
                  void* stream) override {
    const auto p = static_cast<CUdeviceptr>(dst);
    const auto w = static_cast<size_t>(width);
    const auto h = static_cast<size_t>(height);
    const auto pt = static_cast<size_t>(pitch);
    const CUstream s = Stream(stream);
    switch (elem_size) {
      case 1: {
        const auto v = static_cast<unsigned char>(value);
        return h == 1 ? api_.memsetD8Async(p, v, w, s) : api_.memsetD2D8Async(p, pt, v, w, h, s);
      }
      case 2: {
        const auto v = static_cast<unsigned short>(value);
        return h == 1 ? api_.memsetD16Async(p, v, w, s) : api_.memsetD2D16Async(p, pt, v, w, h, s);
      }
      case 4: {
        const auto v = static_cast<unsigned int>(value);
        return h == 1 ? api_.memsetD32Async(p, v, w, s) : api_.memsetD2D32Async(p, pt, v, w, h, s);
      }
      default: return CUDA_ERROR_INVALID_VALUE;
    }
  }

  // Virtual memory management: the driver's own calls; physical memory is pinned device memory
  // of the placement's GPU (CUDA driver API reference, cuMemCreate / CUmemAllocationProp).
  CUresult MemAddressReserve(uint64_t bytes, uint64_t alignment, uint64_t fixed_addr, uint64_t* addr) override {
    CUdeviceptr p = 0;
    const CUresult r = api_.memAddressReserve(&p, bytes, alignment, fixed_addr, 0);
    if (r == CUDA_SUCCESS) *addr = p;
    return r;
  }
  CUresult MemAddressFree(uint64_t addr, uint64_t bytes) override { return api_.memAddressFree(addr, bytes); }
  CUresult MemCreate(uint32_t dev, uint64_t bytes, void** handle) override {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = devices_[dev];
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = api_.memCreate(&h, bytes, &prop, 0);
    if (r == CUDA_SUCCESS) *handle = reinterpret_cast<void*>(static_cast<uintptr_t>(h));
    return r;
  }
  CUresult MemRelease(void* handle) override {
    return api_.memRelease(static_cast<CUmemGenericAllocationHandle>(reinterpret_cast<uintptr_t>(handle)));
  }
  CUresult MemMap(uint64_t addr, uint64_t bytes, uint64_t offset, void* handle) override {
    return api_.memMap(addr, bytes, offset,
                       static_cast<CUmemGenericAllocationHandle>(reinterpret_cast<uintptr_t>(handle)), 0);
  }
  CUresult MemUnmap(uint64_t addr, uint64_t bytes) override { return api_.memUnmap(addr, bytes); }
  CUresult MemSetAccess(uint64_t addr, uint64_t bytes, uint32_t dev, uint32_t flags) override {
    CUmemAccessDesc d{};
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = devices_[dev];
    d.flags = static_cast<CUmemAccess_flags>(flags);
    return api_.memSetAccess(addr, bytes, &d, 1);
  }

  // With `want` (the client's address of the bytes) and same-address mapping (Init), the window's
  // pages are mapped a second time in this worker at `want` and that alias is registered: its device
  // address is then `want` itself, so a pinned or managed pointer works in kernels unchanged
  // (docs/spec/managed-memory.md). Where that fails (the address is taken in this worker, the
  // driver refuses), the window registration's own device address is returned, and the client
  // translates host pointers in copies (ErrorDetail says why).
  bool SameAddressMapping() const override { return same_address_; }
  std::string ErrorDetail() const override { return last_error_; }
  CUresult HostGetDevicePointer(void* host, uint64_t bytes, uint64_t want, uint64_t* dptr) override {
    EnsureWindow();
    if (want != 0 && same_address_) {
      const CUresult a = MapAtClientAddress(static_cast<uint8_t*>(host), bytes, want);
      if (a == CUDA_SUCCESS) {
        *dptr = want;
        return CUDA_SUCCESS;
      }
    }
    if (!window_registered_) return CUDA_ERROR_NOT_SUPPORTED;
    CUdeviceptr p = 0;
    const CUresult r = api_.memHostGetDevicePointer(&p, host, 0);
    if (r == CUDA_SUCCESS) *dptr = p;
    return r;
  }

  // ---- Modules ----

  CUresult ModuleLoad(std::span<const uint8_t> image, void** module) override {
    try {
      if (image.size() < 4) return CUDA_ERROR_INVALID_IMAGE;
      uint32_t magic = 0;
      std::memcpy(&magic, image.data(), sizeof(magic));
      const void* code = image.data();
      std::vector<uint8_t> ptx;  // a NUL-terminated copy, if needed
      if (magic == kFatbinWrapperMagic) {
        // Holds a pointer into the client's address space: the driver would dereference it.
        return CUDA_ERROR_INVALID_IMAGE;
      } else if (magic == kFatbinMagic) {
        // The driver reads header_size + payload_size bytes: they must lie inside the image.
        if (image.size() < 16) return CUDA_ERROR_INVALID_IMAGE;
        uint16_t header_size = 0;
        uint64_t payload_size = 0;
        std::memcpy(&header_size, image.data() + 6, sizeof(header_size));
        std::memcpy(&payload_size, image.data() + 8, sizeof(payload_size));
        if (header_size > image.size() || payload_size > image.size() - header_size) return CUDA_ERROR_INVALID_IMAGE;
      } else if (!(image[0] == 0x7F && image[1] == 'E' && image[2] == 'L' && image[3] == 'F')) {
        // PTX must be NUL-terminated (cuLibraryLoadData): make sure the driver stops in bounds.
        if (image.back() != 0) {
          ptx.assign(image.begin(), image.end());
          ptx.push_back(0);
          code = ptx.data();
        }
      }
      CUlibrary lib = nullptr;
      const CUresult r = api_.libraryLoadData(&lib, code, nullptr, nullptr, 0, nullptr, nullptr, 0);
      if (r == CUDA_SUCCESS) *module = lib;
      return r;
    } catch (...) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }

  CUresult ModuleUnload(void* module) override { return api_.libraryUnload(Library(module)); }

  CUresult ModuleGetFunction(void* module, const char* name, void** function, KernelLayout* layout) override {
    try {
      CUkernel k = nullptr;
      CUresult r = api_.libraryGetKernel(&k, Library(module), name);
      if (r != CUDA_SUCCESS) return r;
      std::vector<ParamInfo> params;
      uint64_t end = 0;
      for (size_t i = 0; i < kMaxParamProbe; ++i) {
        size_t off = 0, size = 0;
        r = api_.kernelGetParamInfo(k, i, &off, &size);
        if (r == CUDA_ERROR_INVALID_VALUE) break;  // i == the number of parameters
        if (r != CUDA_SUCCESS) return r;
        if (off > UINT32_MAX || size > UINT32_MAX) return CUDA_ERROR_NOT_SUPPORTED;
        params.push_back(ParamInfo{static_cast<uint32_t>(off), static_cast<uint32_t>(size)});
        end = std::max<uint64_t>(end, uint64_t{off} + size);
      }
      if (end > UINT32_MAX) return CUDA_ERROR_NOT_SUPPORTED;
      layout->params = std::move(params);
      layout->param_bytes = static_cast<uint32_t>(end);
      *function = k;  // a CUkernel; LaunchKernel passes it as a CUfunction (documented)
      return CUDA_SUCCESS;
    } catch (...) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }

  CUresult ModuleFunctionNames(void* module, std::vector<std::string>* names) override {
    if (api_.libraryGetKernelCount == nullptr || api_.libraryEnumerateKernels == nullptr ||
        api_.kernelGetName == nullptr) {
      return CUDA_ERROR_NOT_SUPPORTED;  // a driver older than 12.4
    }
    try {
      unsigned n = 0;
      CUresult r = api_.libraryGetKernelCount(&n, Library(module));
      if (r != CUDA_SUCCESS) return r;
      std::vector<CUkernel> ks(n);
      if (n != 0 && (r = api_.libraryEnumerateKernels(ks.data(), n, Library(module))) != CUDA_SUCCESS) return r;
      names->clear();
      for (CUkernel k : ks) {
        const char* name = nullptr;
        if ((r = api_.kernelGetName(&name, k)) != CUDA_SUCCESS) return r;
        names->push_back(name != nullptr ? name : "");
      }
      return CUDA_SUCCESS;
    } catch (...) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }

  CUresult ModuleGetGlobal(void* module, const char* name, uint64_t* dptr, uint64_t* bytes) override {
    CUdeviceptr p = 0;
    size_t n = 0;
    const CUresult r = api_.libraryGetGlobal(&p, &n, Library(module), name);  // current context's copy
    if (r == CUDA_SUCCESS) {
      *dptr = p;
      *bytes = n;
    }
    return r;
  }

  CUresult FuncGetAttribute(void* function, int attribute, int* value) override {
    return api_.kernelGetAttribute(value, static_cast<CUfunction_attribute>(attribute), Kernel(function),
                                   CurrentDevice());
  }

  CUresult FuncSetAttribute(void* function, int attribute, int value) override {
    return api_.kernelSetAttribute(static_cast<CUfunction_attribute>(attribute), value, Kernel(function),
                                   CurrentDevice());
  }

  // A launch configuration with one attribute, the cluster dimensions (`attr` must outlive it).
  static CUlaunchConfig ClusterConfig(const uint32_t grid[3], const uint32_t block[3], uint32_t shared_mem,
                                      const uint32_t cluster[3], CUlaunchAttribute* attr) {
    attr->id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr->value.clusterDim.x = cluster[0];
    attr->value.clusterDim.y = cluster[1];
    attr->value.clusterDim.z = cluster[2];
    CUlaunchConfig cfg{};
    cfg.gridDimX = grid[0];
    cfg.gridDimY = grid[1];
    cfg.gridDimZ = grid[2];
    cfg.blockDimX = block[0];
    cfg.blockDimY = block[1];
    cfg.blockDimZ = block[2];
    cfg.sharedMemBytes = shared_mem;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
  }

  CUresult LaunchKernel(void* function, const LaunchSpec& l) override {
    // cuLaunchKernel: "the API can also be used to launch context-less kernel ::CUkernel by
    // querying the handle using ::cuLibraryGetKernel() and then passing it to the API by casting
    // to ::CUfunction" (<cuda.h>, CUDA 13.0). The parameter buffer is copied at launch.
    const auto f = static_cast<CUfunction>(function);
    launched_ = true;
    TurnGuard turn(this, Stream(l.stream));
    size_t size = l.params.size();
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<uint8_t*>(l.params.data()), CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &size, CU_LAUNCH_PARAM_END};
    void** with = l.params.empty() ? nullptr : extra;
    if (l.cluster_size() > 1 || l.cooperative()) {
      CUlaunchAttribute attrs[2]{};
      CUlaunchConfig cfg = ClusterConfig(l.grid, l.block, l.shared_mem, l.cluster, &attrs[0]);
      cfg.hStream = Stream(l.stream);
      if (l.cluster_size() == 1) cfg.numAttrs = 0;  // pre-sm_90 GPUs have no clusters
      if (l.cooperative()) {
        attrs[cfg.numAttrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attrs[cfg.numAttrs].value.cooperative = 1;
        cfg.attrs = attrs;
        ++cfg.numAttrs;
      }
      return api_.launchKernelEx(&cfg, f, nullptr, with);
    }
    return api_.launchKernel(f, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.shared_mem,
                             Stream(l.stream), nullptr, with);
  }

  // ---- Compute share (issue #21; ARCHITECTURE.md §11) ----
  // Kernels run asynchronously here: the device is held in turns that span launches (ComputeTurns,
  // compute_share.h says how); a turn's streams are polled with cuStreamQuery on its keeper thread.
  void UseComputeGate(ComputeGate* gate) override { gate_ = gate; }
  bool GatesCompute() const override { return true; }

  static bool DefaultStream(CUstream s) { return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD; }
  // On the keeper thread: whether work launched on the stream is pending. A default stream is the
  // one of the context it was launched in, made current on that thread first.
  bool StreamBusy(const ComputeTurns::Stream& s) {
    if (s.first != nullptr) (void)api_.ctxSetCurrent(Ctx(s.first));
    return api_.streamQuery(Stream(s.second)) == CUDA_ERROR_NOT_READY;
  }

  // Holds the current gate's turn across one launch on `s` (no gate: nothing).
  class TurnGuard {
   public:
    TurnGuard(CudaBackend* b, CUstream s) : turns_(&b->turns_), gate_(b->gate_) {
      if (gate_ == nullptr) return;
      CUcontext c = nullptr;
      if (DefaultStream(s)) (void)b->api_.ctxGetCurrent(&c);
      turns_->BeginLaunch(gate_, {c, s});
    }
    ~TurnGuard() {
      if (gate_ != nullptr) turns_->EndLaunch(gate_);
    }
    TurnGuard(const TurnGuard&) = delete;
    TurnGuard& operator=(const TurnGuard&) = delete;

   private:
    ComputeTurns* turns_;
    ComputeGate* gate_;
  };

  // Device printf: the driver prints it on this worker's stdout at synchronizing calls; the worker's
  // stdout is a pipe (CaptureStdout), read here once after each synchronizing call that follows a
  // launch (not on every reply: no system call on the hot path).
  std::string TakeOutput() override {
    if (!synced_ || out_fd_ < 0) return "";
    synced_ = false;
    std::fflush(stdout);
    std::string out;
    char buf[16384];
    while (out.size() < kMaxPendingOutput) {
      const ssize_t n = ::read(out_fd_, buf, sizeof buf);
      if (n <= 0) break;  // EAGAIN: nothing more now
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

  CUresult OccupancyMaxBlocks(void* function, uint32_t block_size, uint64_t dynamic_smem, uint32_t flags,
                              int* blocks) override {
    if (block_size > static_cast<uint32_t>(INT_MAX)) return CUDA_ERROR_INVALID_VALUE;
    CUfunction f = nullptr;
    const CUresult r = api_.kernelGetFunction(&f, Kernel(function));  // for the current context
    if (r != CUDA_SUCCESS) return r;
    return api_.occupancyMaxActiveBlocks(blocks, f, static_cast<int>(block_size), static_cast<size_t>(dynamic_smem),
                                         flags);
  }

  CUresult OccupancyMaxClusters(void* function, const uint32_t grid[3], const uint32_t block[3], uint32_t shared_mem,
                                const uint32_t cluster[3], int* clusters) override {
    CUfunction f = nullptr;
    const CUresult r = api_.kernelGetFunction(&f, Kernel(function));
    if (r != CUDA_SUCCESS) return r;
    CUlaunchAttribute attr{};
    const CUlaunchConfig cfg = ClusterConfig(grid, block, shared_mem, cluster, &attr);
    return api_.occupancyMaxActiveClusters(clusters, f, &cfg);
  }

  CUresult OccupancyAvailableSmem(void* function, int num_blocks, int block_size, uint64_t* bytes) override {
    CUfunction f = nullptr;
    const CUresult r = api_.kernelGetFunction(&f, Kernel(function));
    if (r != CUDA_SUCCESS) return r;
    size_t n = 0;
    const CUresult q = api_.occupancyAvailableDynamicSMem(&n, f, num_blocks, block_size);
    *bytes = n;
    return q;
  }

  // ---- Streams and events ----

  CUresult StreamCreate(uint32_t flags, int priority, void** stream) override {
    CUstream s = nullptr;
    const CUresult r = api_.streamCreateWithPriority(&s, flags, priority);
    if (r == CUDA_SUCCESS) *stream = s;
    return r;
  }
  CUresult StreamDestroy(void* stream) override {
    turns_.Forget(stream);
    return api_.streamDestroy(Stream(stream));
  }
  CUresult StreamAttribute(void* stream, uint32_t attr, bool set, uint8_t value[64]) override {
    if (api_.streamGetAttribute == nullptr || api_.streamSetAttribute == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    CUstreamAttrValue v{};
    static_assert(sizeof v == 64, "CUstreamAttrValue is the 64-byte CUlaunchAttributeValue");
    const auto id = static_cast<CUstreamAttrID>(attr);
    if (set) {
      std::memcpy(&v, value, sizeof v);
      if (CUresult r = api_.streamSetAttribute(Stream(stream), id, &v); r != CUDA_SUCCESS) return r;
    }
    const CUresult r = api_.streamGetAttribute(Stream(stream), id, &v);
    if (r == CUDA_SUCCESS) std::memcpy(value, &v, sizeof v);
    return r;
  }
  CUresult TensorMapEncodeTiled(const TensorMapEncodeReq& q, uint64_t out[16]) override {
    if (api_.tensorMapEncodeTiled == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    CUtensorMap map{};  // aligned as its type says (64 bytes, or 128 in newer headers)
    static_assert(sizeof map == 16 * sizeof(uint64_t), "CUtensorMap is 16 words");
    const CUresult r = api_.tensorMapEncodeTiled(
        &map, static_cast<CUtensorMapDataType>(q.data_type), q.rank, reinterpret_cast<void*>(q.global_address),
        q.global_dim, q.global_strides, q.box_dim, q.element_strides, static_cast<CUtensorMapInterleave>(q.interleave),
        static_cast<CUtensorMapSwizzle>(q.swizzle), static_cast<CUtensorMapL2promotion>(q.l2_promotion),
        static_cast<CUtensorMapFloatOOBfill>(q.oob_fill));
    if (r == CUDA_SUCCESS) std::memcpy(out, &map, sizeof map);
    return r;
  }
  CUresult TensorMapEncodeIm2col(const TensorMapIm2colReq& q, uint64_t out[16]) override {
    if (api_.tensorMapEncodeIm2col == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    CUtensorMap map{};
    const TensorMapEncodeReq& b = q.base;
    const CUresult r = api_.tensorMapEncodeIm2col(
        &map, static_cast<CUtensorMapDataType>(b.data_type), b.rank, reinterpret_cast<void*>(b.global_address),
        b.global_dim, b.global_strides, q.lower_corner, q.upper_corner, q.channels_per_pixel, q.pixels_per_column,
        b.element_strides, static_cast<CUtensorMapInterleave>(b.interleave), static_cast<CUtensorMapSwizzle>(b.swizzle),
        static_cast<CUtensorMapL2promotion>(b.l2_promotion), static_cast<CUtensorMapFloatOOBfill>(b.oob_fill));
    if (r == CUDA_SUCCESS) std::memcpy(out, &map, sizeof map);
    return r;
  }
  CUresult TensorMapReplaceAddress(const uint64_t map[16], uint64_t address, uint64_t out[16]) override {
    if (api_.tensorMapReplaceAddress == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    CUtensorMap m{};
    std::memcpy(&m, map, sizeof m);
    const CUresult r = api_.tensorMapReplaceAddress(&m, reinterpret_cast<void*>(address));
    if (r == CUDA_SUCCESS) std::memcpy(out, &m, sizeof m);
    return r;
  }
  CUresult StreamSynchronize(void* stream) override { return Synced(api_.streamSynchronize(Stream(stream))); }
  CUresult StreamQuery(void* stream) override { return api_.streamQuery(Stream(stream)); }
  CUresult StreamWaitEvent(void* stream, void* event, uint32_t flags) override {
    return api_.streamWaitEvent(Stream(stream), Event(event), flags);
  }
  CUresult EventCreate(uint32_t flags, void** event) override {
    CUevent e = nullptr;
    const CUresult r = api_.eventCreate(&e, flags);
    if (r == CUDA_SUCCESS) *event = e;
    return r;
  }
  CUresult EventDestroy(void* event) override {
    if (auto t = event_tickets_.find(event); t != event_tickets_.end()) {
      ::close(t->second.first);
      event_tickets_.erase(t);
    }
    return api_.eventDestroy(Event(event));
  }
  CUresult EventRecord(void* event, void* stream) override { return api_.eventRecord(Event(event), Stream(stream)); }
  CUresult EventSynchronize(void* event) override { return Synced(api_.eventSynchronize(Event(event))); }
  CUresult EventQuery(void* event) override { return api_.eventQuery(Event(event)); }
  CUresult EventElapsedTime(void* start, void* end, float* ms) override {
    return api_.eventElapsedTime(ms, Event(start), Event(end));
  }

 private:
  CUresult CreateContext(CUdevice d, uint32_t flags, CUcontext* out) {
    if (api_.ctxCreateV4 != nullptr) return api_.ctxCreateV4(out, nullptr, flags, d);
    return api_.ctxCreateV2(out, flags, d);
  }

  // The current context's device; without one, the session's first device (for the
  // context-independent kernel attribute calls).
  CUdevice CurrentDevice() {
    CUdevice d = 0;
    if (api_.ctxGetCurrent != nullptr) {
      CUcontext c = nullptr;
      if (api_.ctxGetCurrent(&c) == CUDA_SUCCESS && c != nullptr && api_.ctxGetDevice(&d) == CUDA_SUCCESS) return d;
    }
    return devices_.empty() ? 0 : devices_[0];
  }

  // ---- Window memory at the client's addresses (HostGetDevicePointer with `want`) ----
  // One alias: [addr, addr+bytes) of this worker's address space maps the window pages at `src`
  // (the same pages twice, mremap with old_size 0 of a shared mapping, mremap(2)), registered
  // PORTABLE | DEVICEMAP in `owner` while `registered`.
  struct Alias {
    uint64_t bytes = 0;
    uint8_t* src = nullptr;
    bool registered = false;
    CUcontext owner = nullptr;
  };
  // A client can make at most this many aliases (each a mapping and a driver registration);
  // further pinned ranges get the window's own device address.
  static constexpr size_t kMaxAliases = 4096;

  CUresult AliasFail(CUresult r, std::string why) {
    last_error_ = std::move(why);
    return r;
  }

  // Maps the window bytes [host, host+bytes) at device (and worker) address `want`, page by page:
  // pages an alias with the same window offset already maps are kept; an alias at another offset
  // is memory the client freed and mapped again elsewhere, dropped once the current context's
  // work is done. Errors leave earlier aliases as they were.
  CUresult MapAtClientAddress(uint8_t* host, uint64_t bytes, uint64_t want) {
    const uint64_t pg = page_;
    const uint64_t off = want % pg;
    if (bytes == 0 || want + bytes < want || want + bytes > UINT64_MAX - pg ||
        reinterpret_cast<uintptr_t>(host) % pg != off)
      return AliasFail(CUDA_ERROR_INVALID_VALUE, "window range and client address differ in their page offset");
    const uint64_t lo = want - off;
    const uint64_t hi = (want + bytes + pg - 1) / pg * pg;
    uint8_t* const src_lo = host - off;
    auto* const wb = static_cast<uint8_t*>(window_base_);
    if (wb == nullptr || src_lo < wb || src_lo + (hi - lo) > wb + window_bytes_)
      return AliasFail(CUDA_ERROR_INVALID_VALUE, "the range's pages reach outside the data window");
    CUcontext cur = nullptr;
    if (api_.ctxGetCurrent(&cur) != CUDA_SUCCESS || cur == nullptr)
      return AliasFail(CUDA_ERROR_INVALID_CONTEXT, "no current context to register the range in");
    // The client maps the window where this worker does: the window's own registration serves.
    if (reinterpret_cast<uint64_t>(src_lo) == lo) {
      CUdeviceptr p = 0;
      if (window_registered_ && api_.memHostGetDevicePointer(&p, host, 0) == CUDA_SUCCESS && p == want)
        return CUDA_SUCCESS;
      return AliasFail(CUDA_ERROR_NOT_SUPPORTED, "the window is not registered at its own address");
    }
    const auto same_offset = [&](uint64_t addr, const Alias& a) {
      return reinterpret_cast<uint64_t>(a.src) - addr == reinterpret_cast<uint64_t>(src_lo) - lo;
    };
    std::vector<std::pair<uint64_t, uint64_t>> kept;  // [from, to) already mapped at this offset
    std::vector<uint64_t> stale;
    auto it = aliases_.upper_bound(lo);
    if (it != aliases_.begin()) --it;
    for (; it != aliases_.end() && it->first < hi; ++it) {
      if (it->first + it->second.bytes <= lo) continue;
      if (same_offset(it->first, it->second)) {
        kept.emplace_back(it->first, it->first + it->second.bytes);
      } else {
        stale.push_back(it->first);
      }
    }
    if (!stale.empty()) {
      (void)api_.ctxSynchronize();  // the device may still read the old mapping
      for (const uint64_t a : stale) DropAlias(a);
    }
    if (aliases_unregistered_) RegisterAliases();
    for (const auto& [from, to] : kept) {
      if (!aliases_.at(from).registered)
        return AliasFail(CUDA_ERROR_NOT_SUPPORTED, "an alias could not be re-registered");
    }
    uint64_t at = lo;
    for (const auto& [from, to] : kept) {
      if (from > at) {
        if (CUresult r = MapAlias(at, from - at, src_lo + (at - lo), cur); r != CUDA_SUCCESS) return r;
      }
      at = std::max(at, to);
    }
    if (at < hi) return MapAlias(at, hi - at, src_lo + (at - lo), cur);
    return CUDA_SUCCESS;
  }

  CUresult MapAlias(uint64_t addr, uint64_t bytes, uint8_t* src, CUcontext cur) {
    if (aliases_.size() >= kMaxAliases)
      return AliasFail(CUDA_ERROR_OUT_OF_MEMORY, "the session has " + std::to_string(kMaxAliases) + " aliases");
    void* at = reinterpret_cast<void*>(addr);
    // Reserve the address first: MREMAP_FIXED would replace whatever is there (the driver's own
    // mappings included); MAP_FIXED_NOREPLACE fails on any overlap.
    void* r = ::mmap(at, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (r == MAP_FAILED || r != at) {
      if (r != MAP_FAILED) ::munmap(r, bytes);  // a kernel without MAP_FIXED_NOREPLACE took it as a hint
      return AliasFail(CUDA_ERROR_NOT_SUPPORTED, "address " + Hex(addr) + " (+" + std::to_string(bytes) +
                                                     " bytes) is taken in the worker's address space");
    }
    void* m = ::mremap(src, 0, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, at);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::munmap(at, bytes);
      return AliasFail(CUDA_ERROR_NOT_SUPPORTED, std::string("mremap of the window pages failed: ") + std::strerror(e));
    }
    const CUresult reg = api_.memHostRegister(at, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    CUdeviceptr p = 0;
    const CUresult dp = reg == CUDA_SUCCESS ? api_.memHostGetDevicePointer(&p, at, 0) : reg;
    if (reg != CUDA_SUCCESS || dp != CUDA_SUCCESS || p != addr) {
      if (reg == CUDA_SUCCESS) (void)api_.memHostUnregister(at);
      ::munmap(at, bytes);
      if (reg != CUDA_SUCCESS) return AliasFail(reg, "cuMemHostRegister of the alias failed: " + ErrorText(api_, reg));
      if (dp != CUDA_SUCCESS)
        return AliasFail(dp, "cuMemHostGetDevicePointer of the alias failed: " + ErrorText(api_, dp));
      return AliasFail(CUDA_ERROR_NOT_SUPPORTED,
                       "the driver gave the alias device address " + Hex(p) + ", not its host address");
    }
    try {
      aliases_[addr] = Alias{bytes, src, true, cur};
    } catch (...) {
      (void)api_.memHostUnregister(at);
      ::munmap(at, bytes);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
  }

  void DropAlias(uint64_t addr) {
    auto it = aliases_.find(addr);
    if (it == aliases_.end()) return;
    if (it->second.registered) (void)api_.memHostUnregister(reinterpret_cast<void*>(addr));
    ::munmap(reinterpret_cast<void*>(addr), it->second.bytes);
    aliases_.erase(it);
  }

  // A destroyed or reset context took its registrations with it; the mappings stay and are
  // registered again in the next current context (EnsureWindow).
  void ForgetAliasRegistrations(CUcontext gone) {
    for (auto& [addr, a] : aliases_) {
      if (a.registered && (a.owner == gone || a.owner == nullptr)) {
        a.registered = false;
        aliases_unregistered_ = true;
      }
    }
  }
  void RegisterAliases() {
    CUcontext cur = nullptr;
    if (api_.ctxGetCurrent(&cur) != CUDA_SUCCESS || cur == nullptr) return;
    aliases_unregistered_ = false;
    for (auto& [addr, a] : aliases_) {
      if (a.registered) continue;
      const CUresult r = api_.memHostRegister(reinterpret_cast<void*>(addr), a.bytes,
                                              CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
      a.registered = r == CUDA_SUCCESS || r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
      a.owner = r == CUDA_SUCCESS ? cur : nullptr;
    }
  }
  static std::string Hex(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "%#llx", static_cast<unsigned long long>(v));
    return b;
  }

  // Registers the window in the current context if it is not registered yet. Cheap when done.
  // A failure is not retried in the same context until a context event (retain, create,
  // destroy, reset) clears window_failed_ctx_ or another context becomes current.
  void EnsureWindow() {
    if (aliases_unregistered_) RegisterAliases();
    if (window_base_ == nullptr || window_registered_) return;
    CUcontext cur = nullptr;
    if (api_.ctxGetCurrent(&cur) != CUDA_SUCCESS || cur == nullptr || cur == window_failed_ctx_) return;
    const CUresult r = api_.memHostRegister(window_base_, static_cast<size_t>(window_bytes_),
                                            CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    if (r == CUDA_SUCCESS) {
      window_registered_ = true;
      window_owner_ = cur;
      window_error_ = CUDA_SUCCESS;
    } else if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
      window_registered_ = true;  // still registered from an earlier context: owner unknown
      window_owner_ = nullptr;
      window_error_ = CUDA_SUCCESS;
    } else {
      window_failed_ctx_ = cur;
      window_error_ = r;
    }
  }

  Api api_;                // from a driver handle that is never dlclose'd
  int out_fd_ = -1;        // read end of the worker's stdout (device printf)
  bool launched_ = false;  // a kernel was launched in this session
  bool synced_ = false;    // a synchronizing call since then: TakeOutput reads the pipe once
  CUresult Synced(CUresult r) {
    synced_ = synced_ || launched_;
    return r;
  }
  std::vector<Placement> placements_;
  std::vector<CUdevice> devices_;                              // per placement
  std::map<uint64_t, std::pair<int, IpcHandle>> mem_tickets_;  // exported allocations: ticket fd, handle
  std::map<uint64_t, int> import_tickets_;                     // imports: the importer's open of the ticket
  std::map<void*, std::pair<int, IpcHandle>> event_tickets_;   // exported events
  std::map<CUdevice, uint64_t> overhead_;                      // ContextOverhead, per physical GPU
  std::map<CUdevice, CUcontext> primary_;                      // primary context handles handed out

  void* window_base_ = nullptr;
  uint64_t window_bytes_ = 0;
  bool window_registered_ = false;
  CUcontext window_owner_ = nullptr;       // context that registered it; nullptr = unknown
  CUcontext window_failed_ctx_ = nullptr;  // last context a registration failed in
  CUresult window_error_ = CUDA_SUCCESS;   // last registration failure

  bool same_address_ = false;          // window memory can be mapped at the client's addresses (Init)
  uint64_t page_ = 4096;               // the worker's page size
  std::map<uint64_t, Alias> aliases_;  // client (and device) address -> alias of window pages
  bool aliases_unregistered_ = false;  // an alias lost its registration with its context
  std::string last_error_;             // why the last same-address mapping failed (ErrorDetail)

  ComputeGate* gate_ = nullptr;  // UseComputeGate: the compute share of the next launches
  // Last member: destroyed first, it stops its keeper thread before the other members go.
  ComputeTurns turns_{[this](const ComputeTurns::Stream& st) { return StreamBusy(st); }};
};

// ---- Probe (runs in a child process) --------------------------------------------------------

constexpr int kProbeTimeoutMs = 10'000;
constexpr size_t kProbeMaxOutput = 1 << 20;

bool WriteAll(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = write(fd, s.data(), s.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    s.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

// Child side. Output lines:
//   GPU <index> <total_mem_bytes> <uuid> <name...>
//   ERR <message>
//   END
// then the child _exits.
std::string ProbeInChild(const std::string& path) {
  auto lib = OpenDriver(path);
  if (!lib.ok()) return "ERR " + OneLine(lib.status().message()) + "\n";
  Api api;
  if (Status s = LoadApi(*lib, path, &api); !s.ok()) return "ERR " + OneLine(s.message()) + "\n";
  CUresult r = api.init(0);
  if (r != CUDA_SUCCESS) return "ERR cuInit failed: " + ErrorText(api, r) + "\n";
  int count = 0;
  r = api.deviceGetCount(&count);
  if (r != CUDA_SUCCESS) return "ERR cuDeviceGetCount failed: " + ErrorText(api, r) + "\n";
  if (count <= 0) return "ERR no CUDA device (cuDeviceGetCount returned 0)\n";
  std::string out;
  for (int i = 0; i < count; ++i) {
    const std::string where = "device " + std::to_string(i) + ": ";
    CUdevice d = 0;
    if ((r = api.deviceGet(&d, i)) != CUDA_SUCCESS)
      return "ERR " + where + "cuDeviceGet failed: " + ErrorText(api, r) + "\n";
    char name[kNameLen] = {};
    if ((r = api.deviceGetName(name, static_cast<int>(sizeof(name) - 1), d)) != CUDA_SUCCESS) {
      return "ERR " + where + "cuDeviceGetName failed: " + ErrorText(api, r) + "\n";
    }
    size_t total = 0;
    if ((r = api.deviceTotalMem(&total, d)) != CUDA_SUCCESS) {
      return "ERR " + where + "cuDeviceTotalMem failed: " + ErrorText(api, r) + "\n";
    }
    CUuuid uuid{};
    if ((r = api.deviceGetUuid(&uuid, d)) != CUDA_SUCCESS) {
      return "ERR " + where + "cuDeviceGetUuid failed: " + ErrorText(api, r) + "\n";
    }
    out +=
        "GPU " + std::to_string(i) + " " + std::to_string(total) + " " + FormatUuid(uuid) + " " + OneLine(name) + "\n";
  }
  out += "END\n";
  return out;
}

[[noreturn]] void ChildMain(const std::string& path, int fd) {
  int code = 0;
  try {
    if (!WriteAll(fd, ProbeInChild(path))) code = 2;
  } catch (...) {
    (void)WriteAll(fd, "ERR probe child failed (out of memory)\n");
    code = 3;
  }
  _exit(code);
}

bool ParseU64(std::string_view s, uint64_t* v) {
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size();
}

// Parses the child's output (see ProbeInChild).
Result<std::vector<PhysicalGpu>> ParseProbe(std::string_view text, const std::string& exit_note) {
  std::vector<PhysicalGpu> gpus;
  bool end = false;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) break;  // a partial line: the child died mid-write
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    if (line.starts_with("ERR ")) return Unavailable(std::string(line.substr(4)));
    if (line == "END") {
      end = true;
      break;
    }
    if (!line.starts_with("GPU ")) return Internal("CUDA probe: unexpected output '" + std::string(line) + "'");
    line.remove_prefix(4);
    std::string_view f[3];
    for (auto& field : f) {
      const size_t sp = line.find(' ');
      if (sp == std::string_view::npos) return Internal("CUDA probe: malformed line");
      field = line.substr(0, sp);
      line.remove_prefix(sp + 1);
    }
    uint64_t index = 0, mem = 0;
    if (!ParseU64(f[0], &index) || !ParseU64(f[1], &mem) || index > UINT32_MAX) {
      return Internal("CUDA probe: malformed line");
    }
    PhysicalGpu g;
    g.index = static_cast<uint32_t>(index);
    g.total_mem = mem;
    g.uuid = std::string(f[2]);
    g.name = std::string(line);
    gpus.push_back(std::move(g));
  }
  if (!end) return Unavailable("CUDA probe gave no answer (" + exit_note + ")");
  if (gpus.empty()) return Unavailable("no CUDA device");
  return gpus;
}

Result<std::vector<PhysicalGpu>> ProbeImpl(const CudaOptions& options) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Internal(std::string("CUDA probe: pipe2: ") + std::strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    close(fds[0]);
    close(fds[1]);
    return Internal(std::string("CUDA probe: fork: ") + std::strerror(e));
  }
  if (pid == 0) {
    close(fds[0]);
    ChildMain(options.driver_path, fds[1]);
  }
  close(fds[1]);

  std::string text;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kProbeTimeoutMs);
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (n == 0) {
      timed_out = true;
      break;
    }
    const ssize_t got = read(fds[0], buf, sizeof(buf));
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      break;
    }
    if (got == 0) break;  // EOF: the child is done
    text.append(buf, static_cast<size_t>(got));
    if (text.size() > kProbeMaxOutput) break;
  }
  close(fds[0]);
  if (timed_out) (void)kill(pid, SIGKILL);

  // Reap the child. ECHILD (a SIGCHLD handler of the caller reaped it first) is fine: the
  // answer is judged by what the child wrote.
  std::string exit_note = "exit status unknown";
  int status = 0;
  pid_t w;
  do {
    w = waitpid(pid, &status, 0);
  } while (w < 0 && errno == EINTR);
  if (w == pid) {
    if (WIFEXITED(status)) {
      exit_note = "child exited with status " + std::to_string(WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
      exit_note = "child killed by signal " + std::to_string(WTERMSIG(status));
    }
  }
  if (timed_out) {
    return Unavailable("CUDA probe timed out after " + std::to_string(kProbeTimeoutMs / 1000) + " s (driver '" +
                       options.driver_path + "' hung in initialisation?)");
  }
  return ParseProbe(text, exit_note);
}

}  // namespace

Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaOptions& options) {
  try {
    auto lib = OpenDriver(options.driver_path);
    if (!lib.ok()) return lib.status();
    Api api;
    if (Status s = LoadApi(*lib, options.driver_path, &api); !s.ok()) return s;
    return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(api));
  } catch (...) {
    return Internal("cuda backend: out of memory");
  }
}

Result<std::vector<PhysicalGpu>> ProbeCudaGpus(const CudaOptions& options) {
  try {
    return ProbeImpl(options);
  } catch (...) {
    return Internal("CUDA probe: out of memory");
  }
}

}  // namespace orion::host
