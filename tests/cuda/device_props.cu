// device_props.cu — device count, versions, properties; attributes must agree between
// cudaGetDeviceProperties and cudaDeviceGetAttribute.
//
// Prints (besides CHECK lines):
//   PROP deviceCount=<n>
//   PROP driverVersion=<n>          PROP runtimeVersion=<n>
//   PROP name=<name>
//   PROP totalGlobalMem=<bytes>
//   PROP major=<m> minor=<n>
//   PROP multiProcessorCount=<n>
//   PROP uuid=<32 lowercase hex digits>
//   PROP pciBusId=<string>
//   PROP memGetInfo free=<bytes> total=<bytes>
#include <cuda_runtime.h>

#include "orion_test.h"

using ot::check;
using ot::fmt;

int main() {
  ot::init_output();
  int count = -1;
  CUDA_OK(cudaGetDeviceCount(&count));
  printf("PROP deviceCount=%d\n", count);
  check("device_count", count >= 1, fmt("count=%d", count));

  int drv = 0, rt = 0;
  CUDA_OK(cudaDriverGetVersion(&drv));
  CUDA_OK(cudaRuntimeGetVersion(&rt));
  printf("PROP driverVersion=%d\n", drv);
  printf("PROP runtimeVersion=%d\n", rt);
  check("runtime_version", rt == CUDART_VERSION, fmt("runtime=%d CUDART_VERSION=%d", rt, CUDART_VERSION));
  check("driver_version", drv >= 13000 && drv / 1000 >= rt / 1000, fmt("driver=%d runtime=%d", drv, rt));

  cudaDeviceProp p = ot::detect_device();
  int dev = -1;
  CUDA_OK(cudaGetDevice(&dev));
  check("current_device_0", dev == 0, fmt("device=%d", dev));

  printf("PROP name=%s\n", p.name);
  printf("PROP totalGlobalMem=%zu\n", p.totalGlobalMem);
  printf("PROP major=%d minor=%d\n", p.major, p.minor);
  printf("PROP multiProcessorCount=%d\n", p.multiProcessorCount);
  printf("PROP uuid=%s\n", ot::hex(p.uuid.bytes, sizeof p.uuid.bytes).c_str());
  char bus[64] = {0};
  CUDA_OK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
  printf("PROP pciBusId=%s\n", bus);
  size_t fr = 0, tot = 0;
  CUDA_OK(cudaMemGetInfo(&fr, &tot));
  printf("PROP memGetInfo free=%zu total=%zu\n", fr, tot);

  check("name_nonempty", p.name[0] != 0, "empty name");
  check("total_mem_positive", p.totalGlobalMem > 0, "0");
  check("compute_capability", p.major >= 7 && p.minor >= 0, fmt("%d.%d", p.major, p.minor));
  check("warp_size_32", p.warpSize == 32, fmt("%d", p.warpSize));
  check("max_threads_per_block_1024", p.maxThreadsPerBlock == 1024, fmt("%d", p.maxThreadsPerBlock));
  check("sm_count_positive", p.multiProcessorCount > 0, fmt("%d", p.multiProcessorCount));
  bool uuid_zero = true;
  for (char c : p.uuid.bytes)
    if (c) uuid_zero = false;
  check("uuid_nonzero", !uuid_zero, "all-zero uuid");
  check("meminfo_total_eq_props", tot == p.totalGlobalMem,
        fmt("memGetInfo total=%zu totalGlobalMem=%zu", tot, p.totalGlobalMem));
  check("meminfo_free_le_total", fr <= tot, fmt("free=%zu total=%zu", fr, tot));

  if (const char* q = getenv("ORION_GMEM")) {
    unsigned long long mib = strtoull(q, nullptr, 10);
    check("quota_total_mem", p.totalGlobalMem == mib << 20,
          fmt("totalGlobalMem=%zu ORION_GMEM=%llu MiB (%llu bytes)", p.totalGlobalMem, mib, mib << 20));
  }

  struct A {
    const char* name;
    cudaDeviceAttr attr;
    long long prop;
  } attrs[] = {
      {"MaxThreadsPerBlock", cudaDevAttrMaxThreadsPerBlock, p.maxThreadsPerBlock},
      {"MaxBlockDimX", cudaDevAttrMaxBlockDimX, p.maxThreadsDim[0]},
      {"MaxBlockDimY", cudaDevAttrMaxBlockDimY, p.maxThreadsDim[1]},
      {"MaxBlockDimZ", cudaDevAttrMaxBlockDimZ, p.maxThreadsDim[2]},
      {"MaxGridDimX", cudaDevAttrMaxGridDimX, p.maxGridSize[0]},
      {"MaxGridDimY", cudaDevAttrMaxGridDimY, p.maxGridSize[1]},
      {"MaxGridDimZ", cudaDevAttrMaxGridDimZ, p.maxGridSize[2]},
      {"MaxSharedMemoryPerBlock", cudaDevAttrMaxSharedMemoryPerBlock, (long long)p.sharedMemPerBlock},
      {"MaxSharedMemoryPerBlockOptin", cudaDevAttrMaxSharedMemoryPerBlockOptin, (long long)p.sharedMemPerBlockOptin},
      {"MaxSharedMemoryPerMultiprocessor", cudaDevAttrMaxSharedMemoryPerMultiprocessor,
       (long long)p.sharedMemPerMultiprocessor},
      {"TotalConstantMemory", cudaDevAttrTotalConstantMemory, (long long)p.totalConstMem},
      {"WarpSize", cudaDevAttrWarpSize, p.warpSize},
      {"MaxRegistersPerBlock", cudaDevAttrMaxRegistersPerBlock, p.regsPerBlock},
      {"MultiProcessorCount", cudaDevAttrMultiProcessorCount, p.multiProcessorCount},
      {"ComputeCapabilityMajor", cudaDevAttrComputeCapabilityMajor, p.major},
      {"ComputeCapabilityMinor", cudaDevAttrComputeCapabilityMinor, p.minor},
      {"L2CacheSize", cudaDevAttrL2CacheSize, p.l2CacheSize},
      {"MaxThreadsPerMultiProcessor", cudaDevAttrMaxThreadsPerMultiProcessor, p.maxThreadsPerMultiProcessor},
      {"MaxBlocksPerMultiprocessor", cudaDevAttrMaxBlocksPerMultiprocessor, p.maxBlocksPerMultiProcessor},
      {"GlobalMemoryBusWidth", cudaDevAttrGlobalMemoryBusWidth, p.memoryBusWidth},
      {"PciBusId", cudaDevAttrPciBusId, p.pciBusID},
      {"PciDeviceId", cudaDevAttrPciDeviceId, p.pciDeviceID},
      {"UnifiedAddressing", cudaDevAttrUnifiedAddressing, p.unifiedAddressing},
      {"ConcurrentKernels", cudaDevAttrConcurrentKernels, p.concurrentKernels},
      {"AsyncEngineCount", cudaDevAttrAsyncEngineCount, p.asyncEngineCount},
      {"Integrated", cudaDevAttrIntegrated, p.integrated},
      {"CanMapHostMemory", cudaDevAttrCanMapHostMemory, p.canMapHostMemory},
      {"ManagedMemory", cudaDevAttrManagedMemory, p.managedMemory},
      {"EccEnabled", cudaDevAttrEccEnabled, p.ECCEnabled},
  };
  for (const A& a : attrs) {
    int v = -12345;
    cudaError_t e = cudaDeviceGetAttribute(&v, a.attr, 0);
    if (e != cudaSuccess) {
      cudaGetLastError();
      check(fmt("attr_%s", a.name), false, fmt("cudaDeviceGetAttribute -> %s", cudaGetErrorName(e)));
      continue;
    }
    check(fmt("attr_%s", a.name), (long long)v == a.prop, fmt("attribute=%d property=%lld", v, a.prop));
  }

  // Out-of-range device ordinals.
  cudaDeviceProp q;
  ot::expect_error("props_invalid_device", cudaGetDeviceProperties(&q, count), cudaErrorInvalidDevice);
  int v = 0;
  ot::expect_error("attr_invalid_device", cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, count),
                   cudaErrorInvalidDevice);
  ot::expect_error("set_invalid_device", cudaSetDevice(count), cudaErrorInvalidDevice);
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaDeviceSynchronize());
  return ot::finish();
}
