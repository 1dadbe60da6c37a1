// vector_add: 16M floats; H2D of both inputs, c = a + b, D2H; every element checked.
// TIME vector_add = H2D (2 x 64 MiB, pageable) + kernel + D2H (64 MiB) + sync.
#include <cmath>
#include <cstring>
#include <vector>

#include "e2e.h"

__global__ void vadd(const float* a, const float* b, float* c, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    c[i] = a[i] + b[i];
}

int main() {
  e2e::start("vector_add");
  const size_t n = size_t(16) << 20, bytes = n * sizeof(float);
  std::vector<float> a(n), b(n), c(n);
  e2e::Lcg rng(1);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 1000003) * 0.5f;
    b[i] = rng.unit() * 100.0f - 50.0f;
  }
  float *da, *db, *dc;
  E2E_CK(cudaMalloc(&da, bytes));
  E2E_CK(cudaMalloc(&db, bytes));
  E2E_CK(cudaMalloc(&dc, bytes));
  const int threads = 256, blocks = static_cast<int>((n + threads - 1) / threads);
  e2e::timed(
      "vector_add",
      [&] {
        E2E_CK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
        E2E_CK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
        vadd<<<blocks, threads>>>(da, db, dc, n);
        E2E_CK_LAUNCH();
        E2E_CK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
        E2E_CK(cudaDeviceSynchronize());
      },
      [&] {
        E2E_CK(cudaMemset(dc, 0xff, bytes));  // NaN everywhere: a run that computed nothing fails the check
        E2E_CK(cudaDeviceSynchronize());
        memset(c.data(), 0xff, bytes);
      });
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i) {
    if (c[i] != a[i] + b[i]) {  // one IEEE addition: bit-exact on host and device
      if (bad++ == 0) first = i;
    }
  }
  E2E_CK(cudaFree(da));
  E2E_CK(cudaFree(db));
  E2E_CK(cudaFree(dc));
  if (bad != 0)
    e2e::fail("%zu of %zu elements wrong, first at %zu: %g + %g gave %g", bad, n, first, a[first], b[first], c[first]);
  printf("INFO checked %zu elements\n", n);
  return e2e::pass();
}
