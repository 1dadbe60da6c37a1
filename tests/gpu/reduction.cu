// reduction: the sum of 64M ints with a two-pass block reduction (pass 1: each block sums a
// grid-stride share into a 64-bit partial; pass 2: one block sums the partials); exact check.
// TIME reduction = both passes + D2H of the 8-byte result + sync (input already on the device).
#include <vector>

#include "e2e.h"

constexpr int kThreads = 512;

__device__ long long block_sum(long long v) {
  __shared__ long long warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  }
  return v;  // valid in thread 0
}

__global__ void pass1(const int* __restrict__ in, size_t n, long long* __restrict__ partial) {
  long long v = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) v += in[i];
  v = block_sum(v);
  if (threadIdx.x == 0) partial[blockIdx.x] = v;
}

__global__ void pass2(const long long* __restrict__ partial, int n, long long* __restrict__ out) {
  long long v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += partial[i];
  v = block_sum(v);
  if (threadIdx.x == 0) *out = v;
}

int main() {
  cudaDeviceProp p = e2e::start("reduction");
  const size_t n = size_t(64) << 20;
  std::vector<int> h(n);
  e2e::Lcg rng(4);
  long long expect = 0;
  for (size_t i = 0; i < n; ++i) {
    h[i] = static_cast<int>(rng.next() % 2000001u) - 1000000 + 37;  // mixed signs, a non-zero mean
    expect += h[i];
  }
  int* din;
  long long *dpartial, *dout;
  const int blocks = p.multiProcessorCount * 8;
  E2E_CK(cudaMalloc(&din, n * sizeof(int)));
  E2E_CK(cudaMalloc(&dpartial, blocks * sizeof(long long)));
  E2E_CK(cudaMalloc(&dout, sizeof(long long)));
  E2E_CK(cudaMemcpy(din, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  long long got = 0;
  const double ms = e2e::timed(
      "reduction",
      [&] {
        pass1<<<blocks, kThreads>>>(din, n, dpartial);
        E2E_CK_LAUNCH();
        pass2<<<1, kThreads>>>(dpartial, blocks, dout);
        E2E_CK_LAUNCH();
        E2E_CK(cudaMemcpy(&got, dout, sizeof got, cudaMemcpyDeviceToHost));
        E2E_CK(cudaDeviceSynchronize());
      },
      [&] {
        E2E_CK(cudaMemset(dout, 0, sizeof(long long)));
        E2E_CK(cudaMemset(dpartial, 0, blocks * sizeof(long long)));
        E2E_CK(cudaDeviceSynchronize());
        got = 0x5a5a5a5a5a5a5a5all;
      });
  printf("INFO %d blocks x %d threads, %.1f GB/s read\n", blocks, kThreads, n * sizeof(int) / (ms * 1e6));
  E2E_CK(cudaFree(din));
  E2E_CK(cudaFree(dpartial));
  E2E_CK(cudaFree(dout));
  if (got != expect) e2e::fail("sum %lld, expected %lld", got, expect);
  printf("INFO sum %lld over %zu ints\n", got, n);
  return e2e::pass();
}
