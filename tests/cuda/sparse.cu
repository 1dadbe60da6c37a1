// sparse.cu — NVIDIA's cuSPARSE, unmodified, on Orion: y = A * x with the generic API (CSR SpMV,
// FP32; buffer size query, then cusparseSpMV). Statuses must be success and the matrix and vector
// must read back byte for byte; y is checked only where kernels run (a GPU). lib_marks.h marks the
// SpMV in the sim launch log.
#include <cusparse.h>

#include <cmath>

#include "lib_marks.h"

using ot::check;
using ot::fmt;

#define SP_OK(name, expr)                                                                                         \
  do {                                                                                                            \
    cusparseStatus_t s_ = (expr);                                                                                 \
    if (!check(name, s_ == CUSPARSE_STATUS_SUCCESS, fmt("status %d", static_cast<int>(s_)))) return ot::finish(); \
  } while (0)

int main() {
  ot::detect_device();
  // A: n x n tridiagonal (2 on the diagonal, -1 beside it), in CSR.
  const int n = 1000;
  std::vector<int> rows(n + 1), cols;
  std::vector<float> vals, x(n), y(n, 0.f);
  for (int i = 0; i < n; ++i) {
    rows[i] = static_cast<int>(cols.size());
    for (int j = i - 1; j <= i + 1; ++j) {
      if (j < 0 || j >= n) continue;
      cols.push_back(j);
      vals.push_back(j == i ? 2.f : -1.f);
    }
    x[i] = static_cast<float>(i % 4);
  }
  rows[n] = static_cast<int>(cols.size());
  const int nnz = rows[n];
  int* drows = static_cast<int*>(ot::upload(rows.data(), rows.size() * 4));
  int* dcols = static_cast<int*>(ot::upload(cols.data(), cols.size() * 4));
  float* dvals = static_cast<float*>(ot::upload(vals.data(), vals.size() * 4));
  float* dx = static_cast<float*>(ot::upload(x.data(), x.size() * 4));
  float* dy = static_cast<float*>(ot::upload(y.data(), y.size() * 4));

  cusparseHandle_t h = nullptr;
  SP_OK("sparse_create", cusparseCreate(&h));
  cusparseSpMatDescr_t a = nullptr;
  cusparseDnVecDescr_t vx = nullptr, vy = nullptr;
  SP_OK("csr_create", cusparseCreateCsr(&a, n, n, nnz, drows, dcols, dvals, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                                        CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
  SP_OK("dnvec_x", cusparseCreateDnVec(&vx, n, dx, CUDA_R_32F));
  SP_OK("dnvec_y", cusparseCreateDnVec(&vy, n, dy, CUDA_R_32F));
  const float alpha = 1.f, beta = 0.f;
  size_t bytes = 0;
  SP_OK("spmv_buffer_size", cusparseSpMV_bufferSize(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, a, vx, &beta, vy,
                                                    CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, &bytes));
  void* buf = nullptr;
  CUDA_OK(cudaMalloc(&buf, bytes > 0 ? bytes : 1));
  ot::mark(1, "spmv");
  SP_OK("spmv", cusparseSpMV(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, a, vx, &beta, vy, CUDA_R_32F,
                             CUSPARSE_SPMV_ALG_DEFAULT, buf));
  check("spmv_sync", cudaDeviceSynchronize() == cudaSuccess);
  ot::check_device_bytes("spmv_rows_intact", drows, rows.data(), rows.size() * 4);
  ot::check_device_bytes("spmv_cols_intact", dcols, cols.data(), cols.size() * 4);
  ot::check_device_bytes("spmv_vals_intact", dvals, vals.data(), vals.size() * 4);
  ot::check_device_bytes("spmv_x_intact", dx, x.data(), x.size() * 4);
  CUDA_OK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    double want = 2.0 * x[i] - (i > 0 ? x[i - 1] : 0) - (i + 1 < n ? x[i + 1] : 0);
    if (std::abs(y[i] - want) > 1e-4) ++bad;
  }
  ot::check_sass_kernel("spmv_result", bad == 0, fmt("%d entries wrong", bad));
  cusparseDestroySpMat(a);
  cusparseDestroyDnVec(vx);
  cusparseDestroyDnVec(vy);
  SP_OK("sparse_destroy", cusparseDestroy(h));
  return ot::finish();
}
