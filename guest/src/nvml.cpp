// Orion's libnvidia-ml.so.1: NVML's vGPU view for a client process (issue #9, item 5).
//
// What it shows: the vGPUs this process has (ORION_VGPU), with the name, UUID, PCI bus id and
// compute capability CUDA reports for them (the same DeviceInfo from oriond's Welcome), memory as
// oriond accounts it for this session (total = the vGPU quota, ORION_GMEM), and the calling process
// as the one compute process on each (every process is its own consumer of its vGPUs). Sensors
// Orion has no data for (temperature, power, clocks, utilization, ...) and everything else answer
// NVML_ERROR_NOT_SUPPORTED, each logged once by name (nvml_stubs.cpp).
//
// Data path: the process's own libcuda.so.1 (Orion's), through orion_nvml_query
// (nvml_bridge.h), so a process using both NVML and CUDA (PyTorch) has one channel to oriond.
// nvmlInit, nvmlDeviceGetCount and nvmlDeviceGetHandleByIndex open no session (PyTorch's
// PYTORCH_NVML_BASED_CUDA_CHECK=1 stays fork-safe); the first call that needs oriond's answer
// (name, UUID, PCI, memory, processes) opens it, as cuInit would, without creating a CUDA context.
//
// Thread-safety: every entry point is safe to call from any thread. No exception leaves it.
#include <cuda.h>
#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "log.h"
#include "orion/common/text.h"
#include "nvml_abi.h"
#include "nvml_bridge.h"
#include "nvml_coverage.h"

using namespace orion;
using namespace orion::guest;

#define ORION_NVML_EXPORT extern "C" __attribute__((visibility("default")))
// Every implemented entry point starts with NVML_API(name): counts the call (ORION_COVERAGE).
#define NVML_API(name) ::orion::guest::NvmlCoverageHit(::orion::guest::NvmlSym::name, true)

struct nvmlDevice_st {
  unsigned index;
};

namespace {

using QueryFn = int (*)(uint32_t, uint32_t, uint32_t, void*, uint32_t) noexcept;

struct Nvml {
  std::mutex mu;
  unsigned refs = 0;                    // nvmlInit minus nvmlShutdown calls
  std::atomic<QueryFn> query{nullptr};  // set once, never reset (the library is never closed)
  bool have_devices = false;            // `devices` fetched (under mu)
  NvmlDevices devices{};
  nvmlDevice_st handles[kMaxDevices];
};

Nvml& N() {
  static Nvml* n = [] {
    auto* p = new Nvml();  // leaked: exit handlers may still call in
    for (unsigned i = 0; i < kMaxDevices; ++i) p->handles[i].index = i;
    return p;
  }();
  return *n;
}

// Finds Orion's orion_nvml_query: in the libcuda.so.1 the process already has, else in the
// libcuda.so.1 beside this library (<prefix>/lib/orion), else wherever the loader finds one.
// Never dlclose'd. Called under N().mu.
QueryFn LoadBridge() {
  if (QueryFn q = N().query.load(std::memory_order_acquire)) return q;
  auto sym = [](void* h) -> QueryFn {
    return h == nullptr ? nullptr : reinterpret_cast<QueryFn>(dlsym(h, "orion_nvml_query"));
  };
  QueryFn q = sym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD));
  if (q == nullptr) {
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&LoadBridge), &self) != 0 && self.dli_fname != nullptr) {
      std::string dir = self.dli_fname;
      const size_t slash = dir.rfind('/');
      if (slash != std::string::npos) q = sym(dlopen((dir.substr(0, slash) + "/libcuda.so.1").c_str(), RTLD_NOW));
    }
  }
  if (q == nullptr) q = sym(dlopen("libcuda.so.1", RTLD_NOW));
  if (q == nullptr) {
    LogError(
        "libnvidia-ml.so.1 (Orion): no Orion libcuda.so.1 with orion_nvml_query found (install both from "
        "<prefix>/lib/orion); NVML answers NVML_ERROR_DRIVER_NOT_LOADED");
    return nullptr;
  }
  N().query.store(q, std::memory_order_release);
  return q;
}

// One documented map from the bridge's CUresult to nvmlReturn_t. A session that cannot be opened
// or broke is the driver being unreachable: NVML_ERROR_DRIVER_NOT_LOADED before the session
// existed (no oriond), NVML_ERROR_GPU_IS_LOST after.
nvmlReturn_t FromCu(int r, const char* what) {
  if (r == CUDA_SUCCESS) return NVML_SUCCESS;
  if (r == CUDA_ERROR_NOT_SUPPORTED) return NVML_ERROR_NOT_SUPPORTED;  // oriond measures no such thing here
  LogWarn(std::string("NVML ") + what + ": Orion's driver answered CUresult " + std::to_string(r));
  switch (r) {
    case CUDA_ERROR_INVALID_VALUE: return NVML_ERROR_INVALID_ARGUMENT;
    case CUDA_ERROR_OUT_OF_MEMORY: return NVML_ERROR_MEMORY;
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_DEVICE_UNAVAILABLE: return NVML_ERROR_GPU_IS_LOST;
    default: return NVML_ERROR_DRIVER_NOT_LOADED;
  }
}

nvmlReturn_t NeedInit() {
  std::lock_guard<std::mutex> l(N().mu);
  return N().refs == 0 ? NVML_ERROR_UNINITIALIZED : NVML_SUCCESS;
}

// The session's devices (opens the session on first use). `*out` stays valid: fetched once.
nvmlReturn_t Devices(const NvmlDevices** out, const char* what) {
  Nvml& n = N();
  std::lock_guard<std::mutex> l(n.mu);
  if (n.refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (!n.have_devices) {
    QueryFn q = LoadBridge();
    if (q == nullptr) return NVML_ERROR_DRIVER_NOT_LOADED;
    int r = q(kNvmlBridgeAbi, static_cast<uint32_t>(NvmlQuery::kDevices), 0, &n.devices, sizeof n.devices);
    if (r != CUDA_SUCCESS) return FromCu(r, what);
    n.have_devices = true;
  }
  *out = &n.devices;
  return NVML_SUCCESS;
}

nvmlReturn_t Count(unsigned* count) {
  Nvml& n = N();
  std::lock_guard<std::mutex> l(n.mu);
  if (n.refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (n.have_devices) {
    *count = n.devices.device_count;
    return NVML_SUCCESS;
  }
  QueryFn q = LoadBridge();
  if (q == nullptr) return NVML_ERROR_DRIVER_NOT_LOADED;
  uint32_t c = 0;
  if (int r = q(kNvmlBridgeAbi, static_cast<uint32_t>(NvmlQuery::kVgpuCount), 0, &c, sizeof c); r != CUDA_SUCCESS) {
    return FromCu(r, "nvmlDeviceGetCount");
  }
  *count = c;
  return NVML_SUCCESS;
}

// The device a handle names, with the session's facts about it.
nvmlReturn_t Dev(nvmlDevice_t h, const DeviceInfo** info, unsigned* index, const char* what) {
  if (h == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  Nvml& n = N();
  const auto* begin = &n.handles[0];
  if (h < begin || h >= begin + kMaxDevices) return NVML_ERROR_INVALID_ARGUMENT;  // not a handle of ours
  const NvmlDevices* d = nullptr;
  if (nvmlReturn_t r = Devices(&d, what); r != NVML_SUCCESS) return r;
  if (h->index >= d->device_count) return NVML_ERROR_INVALID_ARGUMENT;
  if (info != nullptr) *info = &d->devices[h->index];
  if (index != nullptr) *index = h->index;
  return NVML_SUCCESS;
}

// Copies `s` with its NUL into buf[0, length); NVML_ERROR_INSUFFICIENT_SIZE when it does not fit.
nvmlReturn_t PutString(const std::string& s, char* buf, unsigned length) {
  if (buf == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (s.size() + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return NVML_SUCCESS;
}

std::string UuidText(const uint8_t u[16]) {
  char t[48];
  std::snprintf(t, sizeof t, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return t;
}

struct PciAddr {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
};
// "dddd:bb:dd.f" or "dddddddd:bb:dd.f" (hex, any case), or "bb:dd.f" (domain 0).
bool ParsePci(const char* s, PciAddr* a) {
  if (s == nullptr) return false;
  char tail = 0;
  if (std::sscanf(s, "%x:%x:%x.%x%c", &a->domain, &a->bus, &a->device, &a->function, &tail) == 4) return true;
  *a = PciAddr{};
  return std::sscanf(s, "%x:%x.%x%c", &a->bus, &a->device, &a->function, &tail) == 3;
}

nvmlReturn_t Memory(unsigned index, DeviceMemoryRep* m) {
  QueryFn q = N().query.load(std::memory_order_acquire);  // loaded by Dev() before
  if (q == nullptr) return NVML_ERROR_DRIVER_NOT_LOADED;
  return FromCu(q(kNvmlBridgeAbi, static_cast<uint32_t>(NvmlQuery::kMemory), index, m, sizeof *m),
                "memory information");
}

// nvmlDeviceGetComputeRunningProcesses, all versions: the calling process, with what oriond
// charges this session on that vGPU. `Info` is the caller's entry layout.
template <typename Info>
nvmlReturn_t ComputeProcesses(nvmlDevice_t device, unsigned* infoCount, Info* infos, const char* what) {
  if (infoCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned index = 0;
  if (nvmlReturn_t r = Dev(device, nullptr, &index, what); r != NVML_SUCCESS) return r;
  DeviceMemoryRep m{};
  if (nvmlReturn_t r = Memory(index, &m); r != NVML_SUCCESS) return r;
  const unsigned have = *infoCount;
  *infoCount = 1;
  if (have < 1 || infos == nullptr) return NVML_ERROR_INSUFFICIENT_SIZE;
  Info e{};
  e.pid = static_cast<unsigned>(getpid());
  e.usedGpuMemory = m.allocated + m.context_overhead;
  if constexpr (sizeof(Info) == sizeof(nvmlProcessInfo_v2_t)) {
    e.gpuInstanceId = 0xFFFFFFFFu;  // no MIG
    e.computeInstanceId = 0xFFFFFFFFu;
  }
  infos[0] = e;
  return NVML_SUCCESS;
}

nvmlReturn_t Init(unsigned flags) {
  if ((flags & ~unsigned{NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH}) != 0) return NVML_ERROR_INVALID_ARGUMENT;
  Nvml& n = N();
  std::lock_guard<std::mutex> l(n.mu);
  if (LoadBridge() == nullptr) return NVML_ERROR_DRIVER_NOT_LOADED;
  // A process that counts its devices with NVML and then starts its workers (PyTorch's
  // device_count(), then torch.multiprocessing.spawn) opens no session: its workers still meet
  // on one vGPU share, named here.
  EnsureShareToken();
  ++n.refs;
  return NVML_SUCCESS;
}

const char* ErrorText(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "ECC is not supported on this vGPU";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
  }
  return "Unknown Error";
}

}  // namespace

// ---- Initialisation and system ---------------------------------------------------------------

ORION_NVML_EXPORT nvmlReturn_t nvmlInit_v2() noexcept {
  NVML_API(nvmlInit_v2);
  return Init(0);
}
ORION_NVML_EXPORT nvmlReturn_t nvmlInit() noexcept {
  NVML_API(nvmlInit);
  return Init(0);
}
ORION_NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) noexcept {
  NVML_API(nvmlInitWithFlags);
  return Init(flags);
}

ORION_NVML_EXPORT nvmlReturn_t nvmlShutdown() noexcept {
  NVML_API(nvmlShutdown);
  Nvml& n = N();
  std::lock_guard<std::mutex> l(n.mu);
  if (n.refs == 0) return NVML_ERROR_UNINITIALIZED;
  --n.refs;  // the session stays: it is the process's, shared with CUDA
  return NVML_SUCCESS;
}

ORION_NVML_EXPORT const char* nvmlErrorString(nvmlReturn_t result) noexcept {
  NvmlCoverageHit(NvmlSym::nvmlErrorString, true);
  return ErrorText(result);
}

// Orion's version stands where the kernel driver's would (Orion has no kernel driver in a client).
ORION_NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) noexcept {
  NVML_API(nvmlSystemGetDriverVersion);
  if (nvmlReturn_t r = NeedInit(); r != NVML_SUCCESS) return r;
  return PutString(ORION_VERSION_STRING, version, length);
}

ORION_NVML_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned int length) noexcept {
  NVML_API(nvmlSystemGetNVMLVersion);
  if (nvmlReturn_t r = NeedInit(); r != NVML_SUCCESS) return r;
  return PutString(std::to_string(NVML_API_VERSION) + "." + ORION_VERSION_STRING, version, length);
}

static nvmlReturn_t CudaDriverVersion(int* v, const char* what) {
  if (v == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const NvmlDevices* d = nullptr;
  if (nvmlReturn_t r = Devices(&d, what); r != NVML_SUCCESS) return r;
  *v = d->driver_version;
  return NVML_SUCCESS;
}
ORION_NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* cudaDriverVersion) noexcept {
  NVML_API(nvmlSystemGetCudaDriverVersion);
  return CudaDriverVersion(cudaDriverVersion, "nvmlSystemGetCudaDriverVersion");
}
ORION_NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* cudaDriverVersion) noexcept {
  NVML_API(nvmlSystemGetCudaDriverVersion_v2);
  return CudaDriverVersion(cudaDriverVersion, "nvmlSystemGetCudaDriverVersion_v2");
}

// ---- Devices ---------------------------------------------------------------------------------

ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) noexcept {
  NVML_API(nvmlDeviceGetCount_v2);
  if (deviceCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return Count(deviceCount);
}
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int* deviceCount) noexcept {
  NVML_API(nvmlDeviceGetCount);
  if (deviceCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return Count(deviceCount);
}

static nvmlReturn_t HandleByIndex(unsigned index, nvmlDevice_t* device) {
  if (device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned count = 0;
  if (nvmlReturn_t r = Count(&count); r != NVML_SUCCESS) return r;
  if (index >= count || index >= kMaxDevices) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &N().handles[index];
  return NVML_SUCCESS;
}
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) noexcept {
  NVML_API(nvmlDeviceGetHandleByIndex_v2);
  return HandleByIndex(index, device);
}
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) noexcept {
  NVML_API(nvmlDeviceGetHandleByIndex);
  return HandleByIndex(index, device);
}

ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) noexcept {
  NVML_API(nvmlDeviceGetHandleByUUID);
  if (uuid == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const NvmlDevices* d = nullptr;
  if (nvmlReturn_t r = Devices(&d, "nvmlDeviceGetHandleByUUID"); r != NVML_SUCCESS) return r;
  for (unsigned i = 0; i < d->device_count; ++i) {
    if (strcasecmp(UuidText(d->devices[i].uuid).c_str(), uuid) == 0) {
      *device = &N().handles[i];
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t HandleByPci(const char* pciBusId, nvmlDevice_t* device) {
  if (pciBusId == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  PciAddr want;
  if (!ParsePci(pciBusId, &want)) return NVML_ERROR_INVALID_ARGUMENT;
  const NvmlDevices* d = nullptr;
  if (nvmlReturn_t r = Devices(&d, "nvmlDeviceGetHandleByPciBusId"); r != NVML_SUCCESS) return r;
  for (unsigned i = 0; i < d->device_count; ++i) {
    PciAddr have;
    if (ParsePci(d->devices[i].pci_bus_id, &have) && have.domain == want.domain && have.bus == want.bus &&
        have.device == want.device) {
      *device = &N().handles[i];
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId, nvmlDevice_t* device) noexcept {
  NVML_API(nvmlDeviceGetHandleByPciBusId_v2);
  return HandleByPci(pciBusId, device);
}
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char* pciBusId, nvmlDevice_t* device) noexcept {
  NVML_API(nvmlDeviceGetHandleByPciBusId);
  return HandleByPci(pciBusId, device);
}

ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) noexcept {
  NVML_API(nvmlDeviceGetName);
  const DeviceInfo* info = nullptr;
  if (nvmlReturn_t r = Dev(device, &info, nullptr, "nvmlDeviceGetName"); r != NVML_SUCCESS) return r;
  return PutString(std::string(info->name, strnlen(info->name, sizeof info->name)), name, length);
}

ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) noexcept {
  NVML_API(nvmlDeviceGetUUID);
  const DeviceInfo* info = nullptr;
  if (nvmlReturn_t r = Dev(device, &info, nullptr, "nvmlDeviceGetUUID"); r != NVML_SUCCESS) return r;
  return PutString(UuidText(info->uuid), uuid, length);
}

ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) noexcept {
  NVML_API(nvmlDeviceGetIndex);
  if (index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return Dev(device, nullptr, index, "nvmlDeviceGetIndex");
}

// The vGPU's index in this process stands for the /dev/nvidia<minor> a local GPU would have.
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int* minorNumber) noexcept {
  NVML_API(nvmlDeviceGetMinorNumber);
  if (minorNumber == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return Dev(device, nullptr, minorNumber, "nvmlDeviceGetMinorNumber");
}

// NVML's generic brand: oriond does not tell the client the physical board's brand.
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t* type) noexcept {
  NVML_API(nvmlDeviceGetBrand);
  if (type == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (nvmlReturn_t r = Dev(device, nullptr, nullptr, "nvmlDeviceGetBrand"); r != NVML_SUCCESS) return r;
  *type = NVML_BRAND_NVIDIA;
  return NVML_SUCCESS;
}

// The bus id cuDeviceGetPCIBusId reports for the vGPU (oriond's DeviceInfo::pci_bus_id). Vendor
// 0x10DE; the PCI device and subsystem ids are 0 (oriond does not send them).
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) noexcept {
  NVML_API(nvmlDeviceGetPciInfo_v3);
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const DeviceInfo* info = nullptr;
  if (nvmlReturn_t r = Dev(device, &info, nullptr, "nvmlDeviceGetPciInfo_v3"); r != NVML_SUCCESS) return r;
  char text[sizeof info->pci_bus_id + 1] = {};
  std::memcpy(text, info->pci_bus_id, sizeof info->pci_bus_id);
  PciAddr a;
  if (!ParsePci(text, &a)) return NVML_ERROR_UNKNOWN;
  nvmlPciInfo_t p{};
  std::snprintf(p.busIdLegacy, sizeof p.busIdLegacy, "%04X:%02X:%02X.0", a.domain & 0xFFFFu, a.bus & 0xFFu,
                a.device & 0x1Fu);
  std::snprintf(p.busId, sizeof p.busId, "%08X:%02X:%02X.0", a.domain, a.bus & 0xFFu, a.device & 0x1Fu);
  p.domain = a.domain;
  p.bus = a.bus;
  p.device = a.device;
  p.pciDeviceId = 0x10DE;
  *pci = p;
  return NVML_SUCCESS;
}

ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major,
                                                                  int* minor) noexcept {
  NVML_API(nvmlDeviceGetCudaComputeCapability);
  if (major == nullptr || minor == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const DeviceInfo* info = nullptr;
  if (nvmlReturn_t r = Dev(device, &info, nullptr, "nvmlDeviceGetCudaComputeCapability"); r != NVML_SUCCESS) return r;
  *major = info->attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
  *minor = info->attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
  return NVML_SUCCESS;
}

// A vGPU belongs to no multi-node NVLink fabric: state NVML_GPU_FABRIC_STATE_NOT_SUPPORTED (0),
// which is what NVML answers for such GPUs (PyTorch's expandable segments ask it before choosing
// the shareable handle type). nvmlGpuFabricInfoV_t: u32 version (size in the low 24 bits, struct
// version above: v2 is 36 bytes, v3 40), then clusterUuid[16], status, cliqueId, state (u8), ...
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, void* info) noexcept {
  NVML_API(nvmlDeviceGetGpuFabricInfoV);
  if (info == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (nvmlReturn_t r = Dev(device, nullptr, nullptr, "nvmlDeviceGetGpuFabricInfoV"); r != NVML_SUCCESS) return r;
  unsigned version = 0;
  std::memcpy(&version, info, sizeof version);
  const unsigned size = version & 0xFFFFFFu, major = version >> 24;
  if ((major != 2 || size != 36) && (major != 3 || size != 40)) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  std::memset(static_cast<unsigned char*>(info) + sizeof version, 0, size - sizeof version);
  return NVML_SUCCESS;
}

// ---- Memory and processes (oriond's account, op DeviceMemoryInfo) ---------------------------

// total = the vGPU quota; used = the session's allocations + its context's charge; free = the rest.
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) noexcept {
  NVML_API(nvmlDeviceGetMemoryInfo);
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned index = 0;
  if (nvmlReturn_t r = Dev(device, nullptr, &index, "nvmlDeviceGetMemoryInfo"); r != NVML_SUCCESS) return r;
  DeviceMemoryRep m{};
  if (nvmlReturn_t r = Memory(index, &m); r != NVML_SUCCESS) return r;
  const unsigned long long used = m.allocated + m.context_overhead;
  memory->total = m.quota;
  memory->used = used;
  memory->free = m.quota > used ? m.quota - used : 0;
  return NVML_SUCCESS;
}

// The vGPU's own utilization: the share of wall time its tenant's kernels ran on the physical GPU,
// as oriond's compute-share scheduler measures it (over the time since its last sample, 0.1-1 s,
// NVML's sample period). `memory` is the same figure: the sim's executor reads and writes device
// memory throughout a kernel, and copies are not counted. NVML_ERROR_NOT_SUPPORTED where oriond
// measures nothing (the cuda backend does not schedule compute yet).
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                             nvmlUtilization_t* utilization) noexcept {
  NVML_API(nvmlDeviceGetUtilizationRates);
  if (utilization == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned index = 0;
  if (nvmlReturn_t r = Dev(device, nullptr, &index, "nvmlDeviceGetUtilizationRates"); r != NVML_SUCCESS) return r;
  QueryFn q = N().query.load(std::memory_order_acquire);  // loaded by Dev()
  if (q == nullptr) return NVML_ERROR_DRIVER_NOT_LOADED;
  DeviceUtilizationRep u{};
  if (nvmlReturn_t r =
          FromCu(q(kNvmlBridgeAbi, static_cast<uint32_t>(NvmlQuery::kUtilization), index, &u, sizeof u), "utilization");
      r != NVML_SUCCESS)
    return r;
  utilization->gpu = (u.gpu_permille + 5) / 10;
  utilization->memory = utilization->gpu;
  return NVML_SUCCESS;
}

// v2 splits `used`: reserved = the context's charge, used = the allocations.
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) noexcept {
  NVML_API(nvmlDeviceGetMemoryInfo_v2);
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  unsigned index = 0;
  if (nvmlReturn_t r = Dev(device, nullptr, &index, "nvmlDeviceGetMemoryInfo_v2"); r != NVML_SUCCESS) return r;
  DeviceMemoryRep m{};
  if (nvmlReturn_t r = Memory(index, &m); r != NVML_SUCCESS) return r;
  const unsigned long long taken = m.allocated + m.context_overhead;
  memory->total = m.quota;
  memory->reserved = m.context_overhead;
  memory->used = m.allocated;
  memory->free = m.quota > taken ? m.quota - taken : 0;
  return NVML_SUCCESS;
}

ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int* infoCount,
                                                                       nvmlProcessInfo_t* infos) noexcept {
  NVML_API(nvmlDeviceGetComputeRunningProcesses_v3);
  return ComputeProcesses(device, infoCount, infos, "nvmlDeviceGetComputeRunningProcesses_v3");
}
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int* infoCount,
                                                                       nvmlProcessInfo_v2_t* infos) noexcept {
  NVML_API(nvmlDeviceGetComputeRunningProcesses_v2);
  return ComputeProcesses(device, infoCount, infos, "nvmlDeviceGetComputeRunningProcesses_v2");
}
// The unversioned symbol keeps NVML's first layout (nvmlProcessInfo_v1_t, 16 bytes per entry), as
// binaries built against old headers expect. (PyTorch's c10 looks this name up for its
// out-of-memory report; with the one entry Orion lists, pid and memory sit where it reads them.)
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int* infoCount,
                                                                    nvmlProcessInfo_v1_t* infos) noexcept {
  NVML_API(nvmlDeviceGetComputeRunningProcesses);
  return ComputeProcesses(device, infoCount, infos, "nvmlDeviceGetComputeRunningProcesses");
}

// No graphics contexts exist through Orion: an empty list, truthfully.
static nvmlReturn_t NoGraphics(nvmlDevice_t device, unsigned* infoCount, const char* what) {
  if (infoCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (nvmlReturn_t r = Dev(device, nullptr, nullptr, what); r != NVML_SUCCESS) return r;
  *infoCount = 0;
  return NVML_SUCCESS;
}
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int* infoCount,
                                                                        nvmlProcessInfo_t*) noexcept {
  NVML_API(nvmlDeviceGetGraphicsRunningProcesses_v3);
  return NoGraphics(device, infoCount, "nvmlDeviceGetGraphicsRunningProcesses_v3");
}
ORION_NVML_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int* infoCount,
                                                                        nvmlProcessInfo_v2_t*) noexcept {
  NVML_API(nvmlDeviceGetGraphicsRunningProcesses_v2);
  return NoGraphics(device, infoCount, "nvmlDeviceGetGraphicsRunningProcesses_v2");
}
