// Unified addressing for pinned memory in the driver's copy and memset calls: a cuMemHostAlloc
// pointer given where a device address is expected (what XLA's autotuner does with its redzone
// checker: cuMemsetD32Async on an 8-byte pinned buffer, then cuMemcpyDtoHAsync from it) works in
// stream order, as on a GPU with unified addressing: a memset after a kernel on the same stream
// fills the buffer after the kernel wrote it; device-to-device and host-to-device copies accept it
// too. A pointer that is neither device nor pinned memory is still refused.
// Usage: pinned_as_device [expect-refused]   (network transports: no shared memory, refused)
#include <cuda.h>

#include <cstring>
#include <vector>

#include "orion_test.h"

__global__ void fill(int* p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + i;
}

int main(int argc, char** argv) {
  ot::init_output();
  const bool expect_refused = argc > 1 && std::string(argv[1]) == "expect-refused";
  CUDA_OK(cudaSetDevice(0));
  const int n = 4096;
  unsigned* pinned = nullptr;
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), n * sizeof(unsigned), cudaHostAllocDefault));
  int* d = nullptr;
  CUDA_OK(cudaMalloc(&d, n * sizeof(int)));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const CUdeviceptr as_dev = reinterpret_cast<CUdeviceptr>(pinned);
  CUstream cs = reinterpret_cast<CUstream>(s);

  for (int i = 0; i < n; ++i) pinned[i] = 1;
  const CUresult ms = cuMemsetD32Async(as_dev, 0xdeadbeefu, n, cs);
  if (expect_refused) {
    ot::check("pinned_memset_refused_over_network", ms == CUDA_ERROR_INVALID_VALUE,
              ot::fmt("%d", static_cast<int>(ms)));
    return ot::finish();
  }
  ot::check("pinned_memset_accepted", ms == CUDA_SUCCESS, ot::fmt("%d", static_cast<int>(ms)));
  CUDA_OK(cudaStreamSynchronize(s));
  bool ok = true;
  for (int i = 0; i < n && ok; ++i) ok = pinned[i] == 0xdeadbeefu;
  ot::check("pinned_memset_wrote_host_memory", ok, ot::fmt("pinned[0]=%#x", pinned[0]));

  // Stream order: a kernel writes d, d is copied into the pinned buffer as a device address, then
  // the pinned buffer is read back through cuMemcpyDtoHAsync as a device address.
  fill<<<n / 256, 256, 0, s>>>(d, n, 100);
  const CUresult dd = cuMemcpyDtoDAsync(as_dev, reinterpret_cast<CUdeviceptr>(d), n * sizeof(int), cs);
  std::vector<int> back(n, -1);
  const CUresult dh = cuMemcpyDtoHAsync(back.data(), as_dev, n * sizeof(int), cs);
  CUDA_OK(cudaStreamSynchronize(s));
  ok = dd == CUDA_SUCCESS && dh == CUDA_SUCCESS;
  std::string why = ot::fmt("DtoD %d, DtoH %d", static_cast<int>(dd), static_cast<int>(dh));
  for (int i = 0; i < n && ok; ++i) {
    if (back[i] != 100 + i || static_cast<int>(pinned[i]) != 100 + i) {
      why = ot::fmt("element %d: read back %d, pinned %d, want %d", i, back[i], static_cast<int>(pinned[i]), 100 + i);
      ok = false;
    }
  }
  ot::check_kernel("pinned_as_device_in_stream_order", ok, why);

  // Host-to-device into the pinned buffer's device address, then a memset of part of it (D8).
  std::vector<unsigned> src(n);
  for (int i = 0; i < n; ++i) src[i] = 7u * i;
  CUDA_OK(static_cast<cudaError_t>(cuMemcpyHtoD(as_dev, src.data(), n * sizeof(unsigned))));
  CUDA_OK(static_cast<cudaError_t>(cuMemsetD8(as_dev + 4, 0xab, 4)));
  ok = pinned[0] == 0 && pinned[1] == 0xababababu && pinned[2] == 14;
  ot::check("pinned_htod_and_memset_d8", ok, ot::fmt("%#x %#x %#x", pinned[0], pinned[1], pinned[2]));

  // Past the allocation's end, or plain host memory: refused as before.
  ot::check("past_the_pinned_buffer_refused", cuMemsetD32(as_dev + 4, 0, n) == CUDA_ERROR_INVALID_VALUE);
  std::vector<unsigned> plain(16);
  ot::check("pageable_memory_refused",
            cuMemsetD32(reinterpret_cast<CUdeviceptr>(plain.data()), 0, 16) == CUDA_ERROR_INVALID_VALUE);
  CUDA_OK(cudaFreeHost(pinned));
  CUDA_OK(cudaFree(d));
  return ot::finish();
}
