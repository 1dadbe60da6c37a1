// blas.cu — NVIDIA's cuBLAS, unmodified, on Orion: SGEMM/DGEMM/HGEMM at n = 1, 7, 64, 256, 1024
// (the sizes take different cuBLAS/cuBLASLt paths, some through private driver tables),
// cublasSgemmStridedBatched and cublasSdot. Each call must return CUBLAS_STATUS_SUCCESS and its
// inputs must read back byte for byte; results are checked only where kernels run (a GPU).
// Before each call ot::mark() puts a marker in the sim launch log (lib_marks.h).
// Usage: blas [filter]   runs only the cases whose name contains filter.
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>

#include "lib_marks.h"

using ot::check;
using ot::fmt;

static unsigned g_mark = 0;
static const char* g_filter = nullptr;
static bool wanted(const std::string& name) { return g_filter == nullptr || name.find(g_filter) != std::string::npos; }

static double to_double(float v) { return v; }
static double to_double(double v) { return v; }
static double to_double(__half v) { return __half2float(v); }
template <class T>
static T from_double(double v) {
  return static_cast<T>(v);
}
template <>
__half from_double<__half>(double v) {
  return __float2half(static_cast<float>(v));
}

static cublasStatus_t gemm(cublasHandle_t h, int n, const float* a, const float* b, float* c) {
  const float one = 1.f, zero = 0.f;
  return cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
}
static cublasStatus_t gemm(cublasHandle_t h, int n, const double* a, const double* b, double* c) {
  const double one = 1., zero = 0.;
  return cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
}
static cublasStatus_t gemm(cublasHandle_t h, int n, const __half* a, const __half* b, __half* c) {
  const __half one = __float2half(1.f), zero = __float2half(0.f);
  return cublasHgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
}

// C = A * B (column-major, n x n) with small integer entries, exact in every type for these sizes.
template <class T>
static void gemm_case(cublasHandle_t h, const char* type, int n) {
  std::string name = fmt("%sgemm_%d", type, n);
  if (!wanted(name)) return;
  const size_t nn = static_cast<size_t>(n) * n;
  std::vector<T> a(nn), b(nn), c(nn, from_double<T>(0));
  for (size_t i = 0; i < nn; ++i) {
    a[i] = from_double<T>(static_cast<double>(i % 3) - 1.);
    b[i] = from_double<T>(static_cast<double>(i % 5 == 0));
  }
  T* da = static_cast<T*>(ot::upload(a.data(), nn * sizeof(T)));
  T* db = static_cast<T*>(ot::upload(b.data(), nn * sizeof(T)));
  T* dc = static_cast<T*>(ot::upload(c.data(), nn * sizeof(T)));
  ot::mark(++g_mark, name.c_str());
  cublasStatus_t st = gemm(h, n, da, db, dc);
  check(name, st == CUBLAS_STATUS_SUCCESS, fmt("status %d", static_cast<int>(st)));
  check(name + "_sync", cudaDeviceSynchronize() == cudaSuccess);
  ot::check_device_bytes(name + "_a_intact", da, a.data(), nn * sizeof(T));
  ot::check_device_bytes(name + "_b_intact", db, b.data(), nn * sizeof(T));
  CUDA_OK(cudaMemcpy(c.data(), dc, nn * sizeof(T), cudaMemcpyDeviceToHost));
  int bad = 0;
  const int step = n > 64 ? 37 : 1;
  for (int i = 0; i < n; i += step) {
    for (int j = 0; j < n; j += step) {
      double want = 0;
      for (int k = 0; k < n; ++k)
        want += to_double(a[static_cast<size_t>(k) * n + i]) * to_double(b[static_cast<size_t>(j) * n + k]);
      if (std::abs(to_double(c[static_cast<size_t>(j) * n + i]) - want) > 1e-3 * (1 + std::abs(want))) ++bad;
    }
  }
  ot::check_sass_kernel(name + "_result", bad == 0, fmt("%d sampled entries wrong", bad));
  CUDA_OK(cudaFree(da));
  CUDA_OK(cudaFree(db));
  CUDA_OK(cudaFree(dc));
}

static void strided_batched(cublasHandle_t h) {
  if (!wanted("sgemm_strided_batched")) return;
  const int n = 64, batch = 3;
  const size_t nn = static_cast<size_t>(n) * n, total = nn * batch;
  std::vector<float> a(total), b(total), c(total, 0.f);
  for (size_t i = 0; i < total; ++i) {
    a[i] = static_cast<float>(i % 4) - 2.f;
    b[i] = static_cast<float>(i % 3);
  }
  float* da = static_cast<float*>(ot::upload(a.data(), total * 4));
  float* db = static_cast<float*>(ot::upload(b.data(), total * 4));
  float* dc = static_cast<float*>(ot::upload(c.data(), total * 4));
  const float one = 1.f, zero = 0.f;
  ot::mark(++g_mark, "sgemm_strided_batched");
  cublasStatus_t st = cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, da, n, nn, db, n, nn, &zero,
                                                dc, n, nn, batch);
  check("sgemm_strided_batched", st == CUBLAS_STATUS_SUCCESS, fmt("status %d", static_cast<int>(st)));
  check("sgemm_strided_batched_sync", cudaDeviceSynchronize() == cudaSuccess);
  ot::check_device_bytes("sgemm_strided_batched_a_intact", da, a.data(), total * 4);
  ot::check_device_bytes("sgemm_strided_batched_b_intact", db, b.data(), total * 4);
  CUDA_OK(cudaMemcpy(c.data(), dc, total * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int p = 0; p < batch; ++p) {
    for (int i = 0; i < n; i += 5) {
      for (int j = 0; j < n; j += 7) {
        double want = 0;
        for (int k = 0; k < n; ++k) want += double(a[p * nn + k * n + i]) * b[p * nn + j * n + k];
        if (std::abs(c[p * nn + j * n + i] - want) > 1e-3 * (1 + std::abs(want))) ++bad;
      }
    }
  }
  ot::check_sass_kernel("sgemm_strided_batched_result", bad == 0, fmt("%d sampled entries wrong", bad));
  CUDA_OK(cudaFree(da));
  CUDA_OK(cudaFree(db));
  CUDA_OK(cudaFree(dc));
}

static void sdot(cublasHandle_t h) {
  if (!wanted("sdot")) return;
  const int n = 1000;
  std::vector<float> x(n), y(n);
  double want = 0;
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 7) - 3.f;
    y[i] = static_cast<float>(i % 2);
    want += double(x[i]) * y[i];
  }
  float* dx = static_cast<float*>(ot::upload(x.data(), n * 4));
  float* dy = static_cast<float*>(ot::upload(y.data(), n * 4));
  float result = -12345.f;
  ot::mark(++g_mark, "sdot");
  cublasStatus_t st = cublasSdot(h, n, dx, 1, dy, 1, &result);  // host pointer mode: synchronous
  check("sdot", st == CUBLAS_STATUS_SUCCESS, fmt("status %d", static_cast<int>(st)));
  ot::check_device_bytes("sdot_x_intact", dx, x.data(), n * 4);
  ot::check_device_bytes("sdot_y_intact", dy, y.data(), n * 4);
  ot::check_sass_kernel("sdot_result", std::abs(result - want) < 1e-3, fmt("got %f want %f", result, want));
  CUDA_OK(cudaFree(dx));
  CUDA_OK(cudaFree(dy));
}

int main(int argc, char** argv) {
  if (argc > 1) g_filter = argv[1];
  ot::detect_device();
  cublasHandle_t h = nullptr;
  cublasStatus_t st = cublasCreate(&h);
  check("cublas_create", st == CUBLAS_STATUS_SUCCESS, fmt("status %d", static_cast<int>(st)));
  if (st != CUBLAS_STATUS_SUCCESS) return ot::finish();
  for (int n : {1, 7, 64, 256, 1024}) {
    gemm_case<float>(h, "s", n);
    gemm_case<double>(h, "d", n);
    gemm_case<__half>(h, "h", n);
  }
  strided_batched(h);
  sdot(h);
  check("cublas_destroy", cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
  return ot::finish();
}
