// matrix_mul: C = A * B, 1024 x 1024 floats, tiled shared-memory kernel (32 x 32 tiles); 4096
// sampled entries checked against a double-precision CPU reference (relative error <= 1e-3), after
// each timed section.
// TIME matrix_mul     = 10 kernel launches + sync (inputs already on the device).
// TIME matrix_mul_e2e = H2D of A and B + one kernel + D2H of C + sync.
#include <cmath>
#include <cstring>
#include <vector>

#include "e2e.h"

constexpr int kTile = 32;

__global__ void sgemm_tiled(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int n) {
  __shared__ float as[kTile][kTile];
  __shared__ float bs[kTile][kTile + 1];
  const int row = blockIdx.y * kTile + threadIdx.y, col = blockIdx.x * kTile + threadIdx.x;
  float acc = 0.0f;
  for (int t = 0; t < n; t += kTile) {
    as[threadIdx.y][threadIdx.x] = (row < n && t + threadIdx.x < n) ? A[size_t(row) * n + t + threadIdx.x] : 0.0f;
    bs[threadIdx.y][threadIdx.x] = (col < n && t + threadIdx.y < n) ? B[size_t(t + threadIdx.y) * n + col] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
    __syncthreads();
  }
  if (row < n && col < n) C[size_t(row) * n + col] = acc;
}

int main() {
  e2e::start("matrix_mul");
  const int n = 1024;
  const size_t elems = size_t(n) * n, bytes = elems * sizeof(float);
  std::vector<float> A(elems), B(elems), C(elems);
  e2e::Lcg rng(2);
  for (auto& x : A) x = rng.unit();  // [0, 1): no cancellation, so a relative bound is meaningful
  for (auto& x : B) x = rng.unit();
  float *dA, *dB, *dC;
  E2E_CK(cudaMalloc(&dA, bytes));
  E2E_CK(cudaMalloc(&dB, bytes));
  E2E_CK(cudaMalloc(&dC, bytes));
  const dim3 block(kTile, kTile), grid((n + kTile - 1) / kTile, (n + kTile - 1) / kTile);
  auto poison = [&] {
    E2E_CK(cudaMemset(dC, 0xff, bytes));
    E2E_CK(cudaDeviceSynchronize());
    memset(C.data(), 0xff, bytes);
  };
  auto check = [&](const char* what) {
    int bad = 0;
    double worst = 0;
    e2e::Lcg pick(3);
    const int samples = 4096;
    for (int s = 0; s < samples; ++s) {
      const int i = static_cast<int>(pick.next() % n), j = static_cast<int>(pick.next() % n);
      double ref = 0;
      for (int k = 0; k < n; ++k) ref += double(A[size_t(i) * n + k]) * B[size_t(k) * n + j];
      const double got = C[size_t(i) * n + j], rel = std::fabs(got - ref) / std::fmax(std::fabs(ref), 1e-30);
      if (!(rel <= 1e-3) && bad++ == 0)
        printf("INFO %s: first bad entry C[%d][%d] = %g, reference %g\n", what, i, j, got, ref);
      if (rel > worst || rel != rel) worst = rel;
    }
    if (bad != 0) e2e::fail("%s: %d of %d sampled entries off by more than 1e-3 (worst %g)", what, bad, samples, worst);
    printf("INFO %s: %d sampled entries, worst relative error %.2e\n", what, samples, worst);
  };
  E2E_CK(cudaMemcpy(dA, A.data(), bytes, cudaMemcpyHostToDevice));
  E2E_CK(cudaMemcpy(dB, B.data(), bytes, cudaMemcpyHostToDevice));
  const int reps = 10;
  const double ms = e2e::timed(
      "matrix_mul",
      [&] {
        for (int r = 0; r < reps; ++r) sgemm_tiled<<<grid, block>>>(dA, dB, dC, n);
        E2E_CK_LAUNCH();
        E2E_CK(cudaDeviceSynchronize());
      },
      poison);
  printf("INFO %.1f GFLOP/s (tiled kernel)\n", 2.0 * n * n * n * reps / (ms * 1e6));
  E2E_CK(cudaMemcpy(C.data(), dC, bytes, cudaMemcpyDeviceToHost));
  check("kernels");
  e2e::timed(
      "matrix_mul_e2e",
      [&] {
        E2E_CK(cudaMemcpy(dA, A.data(), bytes, cudaMemcpyHostToDevice));
        E2E_CK(cudaMemcpy(dB, B.data(), bytes, cudaMemcpyHostToDevice));
        sgemm_tiled<<<grid, block>>>(dA, dB, dC, n);
        E2E_CK_LAUNCH();
        E2E_CK(cudaMemcpy(C.data(), dC, bytes, cudaMemcpyDeviceToHost));
        E2E_CK(cudaDeviceSynchronize());
      },
      poison);
  check("e2e");
  E2E_CK(cudaFree(dA));
  E2E_CK(cudaFree(dB));
  E2E_CK(cudaFree(dC));
  return e2e::pass();
}
