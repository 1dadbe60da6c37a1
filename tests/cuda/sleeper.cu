// sleeper.cu — initialises CUDA, allocates device memory (argv[1] MiB, default 64), touches it,
// prints "READY" (flushed) and then sleeps forever. The harness SIGKILLs it and checks that its
// vGPU (memory, context) is released.
//
// Output: "DEVICE name=<name> sim=<0|1>", "SLEEPER pid=<pid> mib=<n>", then "READY".
#include <cuda_runtime.h>
#include <unistd.h>

#include "orion_test.h"

int main(int argc, char** argv) {
  ot::detect_device();
  const size_t mib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 64;
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, mib << 20));
  CUDA_OK(cudaMemset(d, 0x5A, mib << 20));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  CUDA_OK(cudaDeviceSynchronize());
  printf("SLEEPER pid=%d mib=%zu\n", (int)getpid(), mib);
  printf("READY\n");
  fflush(stdout);
  for (;;) pause();
}
