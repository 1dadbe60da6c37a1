// NVIDIA's cuBLAS, unmodified, on top of Orion's libcuda.so.1: handle creation (which loads its
// kernel libraries and asks for cudart's private tables), SGEMM, and the result on a real GPU.
#include <cublas_v2.h>

#include "orion_test.h"

int main() {
  ot::detect_device();
  // 1024: smaller GEMMs take a cuBLAS path through undocumented private-table slots (README, limits).
  const int n = 1024;
  std::vector<float> a(n * n), b(n * n), c(n * n, 0.f);
  for (int i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>(i % 7) - 3.f;
    b[i] = static_cast<float>(i % 5) - 2.f;
  }
  float *da, *db, *dc;
  CUDA_OK(cudaMalloc(&da, n * n * 4));
  CUDA_OK(cudaMalloc(&db, n * n * 4));
  CUDA_OK(cudaMalloc(&dc, n * n * 4));
  CUDA_OK(cudaMemcpy(da, a.data(), n * n * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db, b.data(), n * n * 4, cudaMemcpyHostToDevice));
  cublasHandle_t h = nullptr;
  cublasStatus_t st = cublasCreate(&h);
  ot::check("cublas_create", st == CUBLAS_STATUS_SUCCESS, ot::fmt("status %d", static_cast<int>(st)));
  if (st != CUBLAS_STATUS_SUCCESS) return ot::finish();
  const float alpha = 1.f, beta = 0.f;
  st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, da, n, db, n, &beta, dc, n);
  ot::check("cublas_sgemm", st == CUBLAS_STATUS_SUCCESS, ot::fmt("status %d", static_cast<int>(st)));
  ot::check("sync", cudaDeviceSynchronize() == cudaSuccess);
  CUDA_OK(cudaMemcpy(c.data(), dc, n * n * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; i += 17) {
    for (int j = 0; j < n; j += 13) {
      double want = 0;
      for (int k = 0; k < n; ++k) want += double(a[k * n + i]) * b[j * n + k];  // column-major
      if (std::abs(c[j * n + i] - want) > 1e-3 * (1 + std::abs(want))) ++bad;
    }
  }
  ot::check_sass_kernel("sgemm_result", bad == 0, ot::fmt("%d sampled entries wrong", bad));
  ot::check("cublas_destroy", cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
  return ot::finish();
}
