// many_launches: 100000 launches of an empty kernel, then one sync (launch overhead).
// TIME many_launches = 100000 launches + sync. Correctness: the launches report no error, and
// (untimed) 10000 launches of a counting kernel leave the counter at exactly 10000.
#include "e2e.h"

__global__ void empty() {}
__global__ void count(unsigned int* c) { atomicAdd(c, 1u); }

int main() {
  e2e::start("many_launches");
  const int n = 100000;
  const double ms = e2e::timed("many_launches", [&] {
    for (int i = 0; i < n; ++i) empty<<<1, 1>>>();
    E2E_CK_LAUNCH();
    E2E_CK(cudaDeviceSynchronize());
  });
  printf("INFO %.3f us per launch, %.0f launches/s\n", ms * 1000.0 / n, n / (ms / 1000.0));
  unsigned int* dc;
  E2E_CK(cudaMalloc(&dc, sizeof(unsigned int)));
  E2E_CK(cudaMemset(dc, 0, sizeof(unsigned int)));
  const int m = 10000;
  for (int i = 0; i < m; ++i) count<<<1, 1>>>(dc);
  E2E_CK_LAUNCH();
  unsigned int got = 0;
  E2E_CK(cudaMemcpy(&got, dc, sizeof got, cudaMemcpyDeviceToHost));
  E2E_CK(cudaFree(dc));
  if (got != static_cast<unsigned int>(m)) e2e::fail("counting kernel ran %u times, expected %d", got, m);
  return e2e::pass();
}
