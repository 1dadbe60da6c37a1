// guest/src/nvml_bridge.h — the private call from Orion's libnvidia-ml.so.1 into Orion's
// libcuda.so.1 (both built from this tree; not a public interface).
//
// libnvidia-ml.so.1 must not open a second channel to oriond (a VM may have only one ivshmem
// device), so it asks the process's libcuda.so.1, which owns the one Client, through one exported
// function. libnvidia-ml finds it with dlopen("libcuda.so.1") + dlsym("orion_nvml_query"); the ABI
// number guards against a libcuda.so.1 from another Orion build.
//
//   NvmlDevices d{};
//   CUresult r = query(kNvmlBridgeAbi, NvmlQuery::kDevices, 0, &d, sizeof d);
//
// Thread-safety: orion_nvml_query is safe to call from any thread. It never creates a CUDA context.
#pragma once

#include <cstdint>

#include "orion/common/frame.h"

namespace orion::guest {

inline constexpr uint32_t kNvmlBridgeAbi = 1;

enum class NvmlQuery : uint32_t {
  // out: uint32_t, the number of vGPUs this process has: the session's device count once connected,
  // else the count it will ask for (ORION_VGPU, parsed as the Hello does). Opens no session, so
  // PyTorch's PYTORCH_NVML_BASED_CUDA_CHECK=1 stays fork-safe.
  kVgpuCount = 1,
  // out: NvmlDevices. Opens the process's session (as cuInit does, without creating contexts).
  kDevices = 2,
  // device: vGPU index; out: DeviceMemoryRep, oriond's account for this session (op DeviceMemoryInfo).
  kMemory = 3,
  // device: vGPU index; out: DeviceUtilizationRep (op DeviceUtilization).
  kUtilization = 4,
};

struct NvmlDevices {
  int32_t driver_version;  // the server driver's cuDriverGetVersion (e.g. 13000)
  uint32_t device_count;   // <= kMaxDevices
  DeviceInfo devices[kMaxDevices];
};

}  // namespace orion::guest

// Returns a CUresult: CUDA_SUCCESS; CUDA_ERROR_INVALID_VALUE (wrong abi, unknown query, out too
// small, bad device index); the session's error when it cannot be opened or the call fails.
// `out` is written only on success. Owned by the caller.
extern "C" int orion_nvml_query(uint32_t abi, uint32_t what, uint32_t device, void* out, uint32_t out_bytes) noexcept;
