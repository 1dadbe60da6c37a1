// vadd_shared.cu — a vector add built with `-cudart shared` (the runtime is libcudart.so.13,
// which loads libcuda.so.1 the same way the static runtime does). Copies are checked everywhere,
// the sum only on a real GPU. Prints a LAUNCH line in the kernel_params format.
#include <cuda_runtime.h>

#include <vector>

#include "orion_test.h"

using ot::check;
using ot::fmt;

__global__ void vadd(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

int main() {
  ot::detect_device();
  const int n = (1 << 20) + 3;
  std::vector<float> a(n), b(n), c(n, -1.0f), back(n);
  for (int i = 0; i < n; ++i) {
    a[i] = (float)i * 0.5f;
    b[i] = (float)(n - i);
  }
  float *da, *db, *dc;
  CUDA_OK(cudaMalloc((void**)&da, n * sizeof(float)));
  CUDA_OK(cudaMalloc((void**)&db, n * sizeof(float)));
  CUDA_OK(cudaMalloc((void**)&dc, n * sizeof(float)));
  CUDA_OK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dc, 0, n * sizeof(float)));
  CUDA_OK(cudaMemcpy(back.data(), da, n * sizeof(float), cudaMemcpyDeviceToHost));
  check("copy_roundtrip", back == a, ot::diff_details(back.data(), a.data(), n * sizeof(float)));

  const int block = 256, grid = (n + block - 1) / block;
  vadd<<<grid, block>>>(da, db, dc, n);
  CUDA_OK(cudaGetLastError());
  ot::ParamBuf pb;
  pb.add((const float*)da);
  pb.add((const float*)db);
  pb.add(dc);
  pb.add(n);
  printf("LAUNCH _Z4vaddPKfS0_Pfi grid=%d,1,1 block=%d,1,1 params=%s\n", grid, block, pb.hex().c_str());
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
  std::string bad;
  for (int i = 0; i < n && bad.empty(); ++i)
    if (c[i] != a[i] + b[i]) bad = fmt("c[%d]=%g want %g", i, c[i], a[i] + b[i]);
  ot::check_kernel("vadd_result", bad.empty(), bad);
  CUDA_OK(cudaFree(da));
  CUDA_OK(cudaFree(db));
  CUDA_OK(cudaFree(dc));
  return ot::finish();
}
