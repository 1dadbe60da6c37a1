// cublas_sgemm: C = A * B with cuBLAS SGEMM (full FP32 math mode), 2048 x 2048; 1024 sampled entries
// checked against a double-precision CPU reference (relative error <= 1e-3).
// Linked with -lcublas: the real cuBLAS, on top of whichever libcuda.so.1 the loader finds.
// TIME cublas_sgemm = 10 SGEMM calls + sync (inputs already on the device).
#include <cublas_v2.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "e2e.h"

#define CK_BLAS(call)                                                                              \
  do {                                                                                             \
    cublasStatus_t st_ = (call);                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                              \
      e2e::fail("%s:%d %s -> cublas status %d", __FILE__, __LINE__, #call, static_cast<int>(st_)); \
  } while (0)

int main() {
  e2e::start("cublas_sgemm");
  const int n = 2048;
  const size_t elems = size_t(n) * n, bytes = elems * sizeof(float);
  // Column-major, as cuBLAS expects: X(i, j) = X[i + j * n].
  std::vector<float> A(elems), B(elems), C(elems);
  e2e::Lcg rng(5);
  for (auto& x : A) x = rng.unit();
  for (auto& x : B) x = rng.unit();
  float *dA, *dB, *dC;
  E2E_CK(cudaMalloc(&dA, bytes));
  E2E_CK(cudaMalloc(&dB, bytes));
  E2E_CK(cudaMalloc(&dC, bytes));
  E2E_CK(cudaMemcpy(dA, A.data(), bytes, cudaMemcpyHostToDevice));
  E2E_CK(cudaMemcpy(dB, B.data(), bytes, cudaMemcpyHostToDevice));
  cublasHandle_t h;
  CK_BLAS(cublasCreate(&h));
  CK_BLAS(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  int ver = 0;
  CK_BLAS(cublasGetVersion(h, &ver));
  printf("INFO cuBLAS version %d\n", ver);
  const float alpha = 1.0f, beta = 0.0f;
  const int reps = 10;
  const double ms = e2e::timed(
      "cublas_sgemm",
      [&] {
        for (int r = 0; r < reps; ++r)
          CK_BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, dA, n, dB, n, &beta, dC, n));
        E2E_CK(cudaDeviceSynchronize());
      },
      [&] {
        E2E_CK(cudaMemset(dC, 0xff, bytes));
        E2E_CK(cudaDeviceSynchronize());
      });
  printf("INFO %.1f GFLOP/s\n", 2.0 * n * n * n * reps / (ms * 1e6));
  E2E_CK(cudaMemcpy(C.data(), dC, bytes, cudaMemcpyDeviceToHost));
  int bad = 0;
  double worst = 0;
  e2e::Lcg pick(6);
  const int samples = 1024;
  for (int s = 0; s < samples; ++s) {
    const int i = static_cast<int>(pick.next() % n), j = static_cast<int>(pick.next() % n);
    double ref = 0;
    for (int k = 0; k < n; ++k) ref += double(A[i + size_t(k) * n]) * B[k + size_t(j) * n];
    const double got = C[i + size_t(j) * n], rel = std::fabs(got - ref) / std::fmax(std::fabs(ref), 1e-30);
    if (!(rel <= 1e-3)) {
      if (bad++ == 0) printf("INFO first bad entry C(%d,%d) = %g, reference %g\n", i, j, got, ref);
    }
    if (rel > worst || rel != rel) worst = rel;
  }
  CK_BLAS(cublasDestroy(h));
  E2E_CK(cudaFree(dA));
  E2E_CK(cudaFree(dB));
  E2E_CK(cudaFree(dC));
  if (bad != 0) e2e::fail("%d of %d sampled entries off by more than 1e-3 (worst %g)", bad, samples, worst);
  printf("INFO %d sampled entries, worst relative error %.2e\n", samples, worst);
  return e2e::pass();
}
