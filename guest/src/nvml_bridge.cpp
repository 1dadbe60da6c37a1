// libcuda.so.1's side of guest/src/nvml_bridge.h: answers Orion's libnvidia-ml.so.1 from the
// process's one Client (no second channel, no CUDA context).
#include "nvml_bridge.h"

#include <algorithm>
#include <cstring>

#include "export.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

namespace {
// One of oriond's per-vGPU NVML ops (DeviceReq{device, 0} -> Rep) into `out`.
template <typename Rep>
CUresult DeviceCall(Client& c, Op op, uint32_t device, void* out, uint32_t out_bytes) {
  if (out_bytes < sizeof(Rep)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = c.Connect(); r != CUDA_SUCCESS) return r;
  if (device >= c.devices().size()) return CUDA_ERROR_INVALID_VALUE;
  DeviceReq q{device, 0};
  Rep rep{};
  if (CUresult r = c.Call(op, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS) return r;
  std::memcpy(out, &rep, sizeof rep);
  return CUDA_SUCCESS;
}
}  // namespace

extern "C" ORION_EXPORT int orion_nvml_query(uint32_t abi, uint32_t what, uint32_t device, void* out,
                                             uint32_t out_bytes) noexcept {
  if (abi != kNvmlBridgeAbi || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Client& c = Client::Get();
  switch (static_cast<NvmlQuery>(what)) {
    case NvmlQuery::kVgpuCount: {
      if (out_bytes < sizeof(uint32_t)) return CUDA_ERROR_INVALID_VALUE;
      uint32_t n = 0;
      if (c.connected()) {
        n = static_cast<uint32_t>(c.devices().size());
      } else if (CUresult r = RequestedVgpuCount(&n); r != CUDA_SUCCESS) {
        return r;
      }
      std::memcpy(out, &n, sizeof n);
      return CUDA_SUCCESS;
    }
    case NvmlQuery::kDevices: {
      if (out_bytes < sizeof(NvmlDevices)) return CUDA_ERROR_INVALID_VALUE;
      if (CUresult r = c.Connect(); r != CUDA_SUCCESS) return r;
      auto* d = static_cast<NvmlDevices*>(out);
      std::memset(d, 0, sizeof *d);
      d->driver_version = c.welcome().driver_version;
      const size_t n = std::min<size_t>(c.devices().size(), kMaxDevices);
      d->device_count = static_cast<uint32_t>(n);
      std::memcpy(d->devices, c.devices().data(), n * sizeof(DeviceInfo));
      return CUDA_SUCCESS;
    }
    case NvmlQuery::kMemory: return DeviceCall<DeviceMemoryRep>(c, Op::kDeviceMemoryInfo, device, out, out_bytes);
    case NvmlQuery::kUtilization:
      return DeviceCall<DeviceUtilizationRep>(c, Op::kDeviceUtilization, device, out, out_bytes);
  }
  return CUDA_ERROR_INVALID_VALUE;
}
