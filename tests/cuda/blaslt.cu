// blaslt.cu — NVIDIA's cuBLASLt, unmodified, on Orion: a heuristic query and an FP32 matmul
// (D = A * B, 128 x 96 x 64, with a workspace). Statuses must be success and the inputs must read
// back byte for byte; the product is checked only where kernels run (a GPU). lib_marks.h marks the
// matmul in the sim launch log.
#include <cublasLt.h>

#include <cmath>

#include "lib_marks.h"

using ot::check;
using ot::fmt;

#define LT_OK(name, expr)                                                                                       \
  do {                                                                                                          \
    cublasStatus_t s_ = (expr);                                                                                 \
    if (!check(name, s_ == CUBLAS_STATUS_SUCCESS, fmt("status %d", static_cast<int>(s_)))) return ot::finish(); \
  } while (0)

int main() {
  ot::detect_device();
  const int m = 128, n = 96, k = 64;
  std::vector<float> a(m * k), b(k * n), d(m * n, 0.f);
  for (int i = 0; i < m * k; ++i) a[i] = static_cast<float>(i % 5) - 2.f;
  for (int i = 0; i < k * n; ++i) b[i] = static_cast<float>(i % 3) - 1.f;
  float* da = static_cast<float*>(ot::upload(a.data(), a.size() * 4));
  float* db = static_cast<float*>(ot::upload(b.data(), b.size() * 4));
  float* dd = static_cast<float*>(ot::upload(d.data(), d.size() * 4));
  const size_t ws_bytes = 4 << 20;
  void* ws = nullptr;
  CUDA_OK(cudaMalloc(&ws, ws_bytes));

  cublasLtHandle_t lt = nullptr;
  LT_OK("lt_create", cublasLtCreate(&lt));
  cublasLtMatmulDesc_t op = nullptr;
  LT_OK("lt_desc", cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  LT_OK("lt_layout_a", cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m));
  LT_OK("lt_layout_b", cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k));
  LT_OK("lt_layout_d", cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m));
  cublasLtMatmulPreference_t pref = nullptr;
  LT_OK("lt_pref", cublasLtMatmulPreferenceCreate(&pref));
  LT_OK("lt_pref_ws", cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                           sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t heur[4] = {};
  int found = 0;
  LT_OK("lt_heuristic", cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 4, heur, &found));
  if (!check("lt_heuristic_found", found > 0, fmt("%d algorithms", found))) return ot::finish();
  const float alpha = 1.f, beta = 0.f;
  ot::mark(1, "lt_matmul");
  LT_OK("lt_matmul",
        cublasLtMatmul(lt, op, &alpha, da, la, db, lb, &beta, dd, ld, dd, ld, &heur[0].algo, ws, ws_bytes, nullptr));
  check("lt_sync", cudaDeviceSynchronize() == cudaSuccess);
  ot::check_device_bytes("lt_a_intact", da, a.data(), a.size() * 4);
  ot::check_device_bytes("lt_b_intact", db, b.data(), b.size() * 4);
  CUDA_OK(cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0;
      for (int p = 0; p < k; ++p) want += double(a[p * m + i]) * b[j * k + p];
      if (std::abs(d[j * m + i] - want) > 1e-3 * (1 + std::abs(want))) ++bad;
    }
  }
  ot::check_sass_kernel("lt_result", bad == 0, fmt("%d entries wrong", bad));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  LT_OK("lt_destroy", cublasLtDestroy(lt));
  return ot::finish();
}
