// solver.cu — NVIDIA's cuSOLVER, unmodified, on Orion: LU factorization with partial pivoting
// (cusolverDnSgetrf, n = 64) and a solve (cusolverDnSgetrs). Statuses must be success and the
// right-hand side copy must read back byte for byte; devInfo and the solution are checked only
// where kernels run (a GPU). lib_marks.h marks getrf and getrs in the sim launch log.
#include <cusolverDn.h>

#include <cmath>

#include "lib_marks.h"

using ot::check;
using ot::fmt;

#define SOLVER_OK(name, expr)                                                                                     \
  do {                                                                                                            \
    cusolverStatus_t s_ = (expr);                                                                                 \
    if (!check(name, s_ == CUSOLVER_STATUS_SUCCESS, fmt("status %d", static_cast<int>(s_)))) return ot::finish(); \
  } while (0)

int main() {
  ot::detect_device();
  const int n = 64;
  // A diagonally dominant matrix (column-major) and b = A * ones, so x = ones.
  std::vector<float> a(n * n), b(n, 0.f), x(n, 0.f);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < n; ++i)
      a[j * n + i] = i == j ? static_cast<float>(n) : static_cast<float>((i + 2 * j) % 3) - 1.f;
  }
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) b[i] += a[j * n + i];
  }
  float* da = static_cast<float*>(ot::upload(a.data(), a.size() * 4));
  float* db = static_cast<float*>(ot::upload(b.data(), b.size() * 4));
  float* db_copy = static_cast<float*>(ot::upload(b.data(), b.size() * 4));
  int* dpiv = nullptr;
  int* dinfo = nullptr;
  CUDA_OK(cudaMalloc(&dpiv, n * 4));
  CUDA_OK(cudaMalloc(&dinfo, 4));

  cusolverDnHandle_t h = nullptr;
  SOLVER_OK("solver_create", cusolverDnCreate(&h));
  int lwork = 0;
  SOLVER_OK("getrf_buffer_size", cusolverDnSgetrf_bufferSize(h, n, n, da, n, &lwork));
  float* work = nullptr;
  CUDA_OK(cudaMalloc(&work, static_cast<size_t>(lwork > 0 ? lwork : 1) * 4));
  ot::mark(1, "getrf");
  SOLVER_OK("getrf", cusolverDnSgetrf(h, n, n, da, n, work, dpiv, dinfo));
  check("getrf_sync", cudaDeviceSynchronize() == cudaSuccess);
  int info = -1;
  CUDA_OK(cudaMemcpy(&info, dinfo, 4, cudaMemcpyDeviceToHost));
  ot::check_sass_kernel("getrf_info", info == 0, fmt("devInfo %d", info));
  ot::mark(2, "getrs");
  SOLVER_OK("getrs", cusolverDnSgetrs(h, CUBLAS_OP_N, n, 1, da, n, dpiv, db, n, dinfo));
  check("getrs_sync", cudaDeviceSynchronize() == cudaSuccess);
  ot::check_device_bytes("rhs_copy_intact", db_copy, b.data(), b.size() * 4);
  CUDA_OK(cudaMemcpy(x.data(), db, x.size() * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += std::abs(x[i] - 1.f) > 1e-3f;
  ot::check_sass_kernel("getrs_result", bad == 0, fmt("%d entries of x wrong", bad));
  SOLVER_OK("solver_destroy", cusolverDnDestroy(h));
  return ot::finish();
}
