// A compute-bound tenant for the compute-share tests and bench: from START to STOP (wall clock,
// ms since the epoch) it launches a kernel that computes ITERS dependent multiply-adds per thread
// and waits for it, again and again; it counts the kernels that finished before STOP. Kernels are
// identical, so two tenants' counts compare their device time. Prints:
//   KERNELS <n> MS <window ms> CHECK <value a kernel wrote, from a recomputation on the host>
// Usage: spin START_MS STOP_MS ITERS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "orion_test.h"

__global__ void burn(float* out, int iters) {
  float x = static_cast<float>(threadIdx.x) * 0.001f;
  for (int i = 0; i < iters; ++i) x = x * 0.999f + 0.25f;
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}

static long long NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: spin START_MS STOP_MS ITERS\n");
    return 2;
  }
  const long long start = std::atoll(argv[1]), stop = std::atoll(argv[2]);
  const int iters = std::atoi(argv[3]);
  float* d = nullptr;
  CUDA_OK(cudaMalloc(&d, 4 * 128 * sizeof(float)));
  burn<<<4, 128>>>(d, 1);  // module loaded and first launch done before the window
  CUDA_OK(cudaDeviceSynchronize());
  while (NowMs() < start) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  long long kernels = 0;
  while (true) {
    burn<<<4, 128>>>(d, iters);
    CUDA_OK(cudaDeviceSynchronize());
    if (NowMs() > stop) break;
    ++kernels;
  }
  float x = 7 * 0.001f, got = 0;
  for (int i = 0; i < iters; ++i) x = x * 0.999f + 0.25f;
  CUDA_OK(cudaMemcpy(&got, d + 7, sizeof got, cudaMemcpyDeviceToHost));
  std::printf("KERNELS %lld MS %lld CHECK %s\n", kernels, stop - start, got == x ? "ok" : "wrong");
  return 0;
}
