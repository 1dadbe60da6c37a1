// ORION_VGPU=2: the program sees two CUDA devices, each with its quota as its memory, and each
// device's allocations, copies and stream-ordered allocations work independently. Also
// cudaMallocAsync / cudaFreeAsync on every device.
#include <cstdlib>

#include "orion_test.h"

int main() {
  ot::init_output();
  int n = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  const char* vgpu = getenv("ORION_VGPU");
  const char* gmem = getenv("ORION_GMEM");
  printf("DEVICES count=%d\n", n);
  if (vgpu != nullptr) ot::check("device_count", n == atoi(vgpu), ot::fmt("%d devices, ORION_VGPU=%s", n, vgpu));
  // Each vGPU has its own UUID (two vGPUs packed onto one GPU included).
  if (n >= 2) {
    cudaDeviceProp p0, p1;
    CUDA_OK(cudaGetDeviceProperties(&p0, 0));
    CUDA_OK(cudaGetDeviceProperties(&p1, 1));
    ot::check("vgpu_uuids_differ", memcmp(&p0.uuid, &p1.uuid, sizeof p0.uuid) != 0, ot::hex(&p0.uuid, sizeof p0.uuid));
  }
  ot::Rng rng(77);
  for (int d = 0; d < n; ++d) {
    CUDA_OK(cudaSetDevice(d));
    cudaDeviceProp p;
    CUDA_OK(cudaGetDeviceProperties(&p, d));
    if (gmem != nullptr) {
      ot::check(ot::fmt("device%d_memory_is_quota", d), p.totalGlobalMem == (size_t)atoll(gmem) << 20,
                ot::fmt("%zu bytes", p.totalGlobalMem));
    }
    const size_t bytes = (5u << 20) + 3 + d;
    std::vector<uint8_t> src(bytes), back(bytes);
    rng.fill(src.data(), bytes);
    void* dp = nullptr;
    CUDA_OK(cudaMalloc(&dp, bytes));
    CUDA_OK(cudaMemcpy(dp, src.data(), bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(back.data(), dp, bytes, cudaMemcpyDeviceToHost));
    ot::check(ot::fmt("device%d_roundtrip", d), src == back, ot::diff_details(back.data(), src.data(), bytes));
    int cur = -1;
    CUDA_OK(cudaGetDevice(&cur));
    cudaPointerAttributes a{};
    CUDA_OK(cudaPointerGetAttributes(&a, dp));
    ot::check(ot::fmt("device%d_pointer_device", d), a.device == d && cur == d, ot::fmt("attr device %d", a.device));
    // Stream-ordered allocation on this device.
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    void* ap = nullptr;
    CUDA_OK(cudaMallocAsync(&ap, bytes, s));
    CUDA_OK(cudaMemcpyAsync(ap, dp, bytes, cudaMemcpyDeviceToDevice, s));
    std::vector<uint8_t> via(bytes);
    CUDA_OK(cudaMemcpyAsync(via.data(), ap, bytes, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaFreeAsync(ap, s));
    CUDA_OK(cudaStreamSynchronize(s));
    ot::check(ot::fmt("device%d_malloc_async_roundtrip", d), via == src,
              ot::diff_details(via.data(), src.data(), bytes));
    ot::check(ot::fmt("device%d_freed_async_pointer_rejected", d),
              cudaMemcpy(via.data(), ap, 16, cudaMemcpyDeviceToHost) != cudaSuccess);
    cudaGetLastError();
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaFree(dp));
  }
  return ot::finish();
}
