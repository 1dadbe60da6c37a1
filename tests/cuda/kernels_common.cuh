// kernels_common.cuh — kernels shared by the compute test program (tests/cuda/compute.cu) and the
// PTX executor's unit-test fixture (tests/data/ptx_kernels.cu), with the host reference of the
// divergent one (divergent_value.h).
#pragma once

#include "divergent_value.h"

__global__ void vadd(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

// C = A * B for n x n matrices, 16 x 16 tiles in shared memory (n need not be a multiple).
constexpr int kTile = 16;
__global__ void matmul(const float* A, const float* B, float* C, int n) {
  __shared__ float as[kTile][kTile], bs[kTile][kTile];
  int r = blockIdx.y * kTile + threadIdx.y, c = blockIdx.x * kTile + threadIdx.x;
  float acc = 0;
  for (int k0 = 0; k0 < n; k0 += kTile) {
    as[threadIdx.y][threadIdx.x] = (r < n && k0 + threadIdx.x < n) ? A[r * n + k0 + threadIdx.x] : 0.f;
    bs[threadIdx.y][threadIdx.x] = (c < n && k0 + threadIdx.y < n) ? B[(k0 + threadIdx.y) * n + c] : 0.f;
    __syncthreads();
    for (int k = 0; k < kTile; ++k) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
    __syncthreads();
  }
  if (r < n && c < n) C[r * n + c] = acc;
}

// Counts bytes into 256 bins: shared-memory atomics per block, then global atomics.
__global__ void histogram(const unsigned char* in, unsigned* h, int n) {
  __shared__ unsigned sh[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) sh[i] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) atomicAdd(&sh[in[i]], 1u);
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) atomicAdd(&h[i], sh[i]);
}

// Every lane takes its own path through loops and branches, then the warp votes.
__global__ void divergent(int* out) {
  const int t = threadIdx.x;
  const int v = DivergentValue(t);
  unsigned ballot = __ballot_sync(0xffffffff, v & 1);
  out[t] = v ^ (int)ballot;
}
