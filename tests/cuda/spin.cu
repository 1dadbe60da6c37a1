// A compute-bound tenant for the compute-share tests and bench: from START to STOP (wall clock,
// ms since the epoch) it launches a kernel that computes ITERS dependent multiply-adds per thread
// and waits for it, again and again; it counts the kernels that finished before STOP. Kernels are
// identical, so two tenants' counts compare their device time. Prints:
//   KERNELS <n> MS <window ms> CHECK <value a kernel wrote, from a recomputation on the host>
// With a 4th argument `nvml`, it then asks NVML (dlopen'ed libnvidia-ml.so.1: Orion's, beside its
// libcuda) for device 0's utilization, at once after its last kernel, and prints
//   UTIL <gpu %> <memory %>        (or UTIL error <nvmlReturn_t>)
// With SPIN_TRACE=FILE it writes one line per kernel of the window: its launch and its completion
// as seen by the program (µs since the epoch), for latency and transition figures (bench/).
// With SPIN_WARM=1 it launches the same kernels, uncounted, from its start until START instead of
// sleeping: a tenant already saturating when the window opens (a cap's token bucket in its steady
// state rather than full from the idle wait), so short windows measure the steady rate.
// With SPIN_GAP_MS=N it sleeps N ms before each kernel of the window, the device idle meanwhile (on
// the sim, a CPU that idled runs the next kernel slower: scripts/bench-compute's figure).
// Usage: spin START_MS STOP_MS ITERS [nvml]
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "orion_test.h"

__global__ void burn(float* out, int iters) {
  float x = static_cast<float>(threadIdx.x) * 0.001f;
  for (int i = 0; i < iters; ++i) x = x * 0.999f + 0.25f;
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}

static long long NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

static long long NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: spin START_MS STOP_MS ITERS [nvml]\n");
    return 2;
  }
  const long long start = std::atoll(argv[1]), stop = std::atoll(argv[2]);
  const int iters = std::atoi(argv[3]);
  float* d = nullptr;
  CUDA_OK(cudaMalloc(&d, 4 * 128 * sizeof(float)));
  burn<<<4, 128>>>(d, 1);  // module loaded and first launch done before the window
  CUDA_OK(cudaDeviceSynchronize());
  const char* warm = std::getenv("SPIN_WARM");
  if (warm != nullptr && std::string(warm) == "1") {
    while (NowMs() < start) {
      burn<<<4, 128>>>(d, iters);
      CUDA_OK(cudaDeviceSynchronize());
    }
  }
  while (NowMs() < start) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const char* trace_path = std::getenv("SPIN_TRACE");
  FILE* trace = trace_path != nullptr ? std::fopen(trace_path, "w") : nullptr;
  long long kernels = 0;
  const char* gap = std::getenv("SPIN_GAP_MS");
  const int gap_ms = gap != nullptr ? std::atoi(gap) : 0;
  while (true) {
    if (gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
    const long long t0 = NowUs();
    burn<<<4, 128>>>(d, iters);
    CUDA_OK(cudaDeviceSynchronize());
    if (NowMs() > stop) break;
    if (trace != nullptr) std::fprintf(trace, "%lld %lld\n", t0, NowUs());
    ++kernels;
  }
  if (trace != nullptr) std::fclose(trace);
  float x = 7 * 0.001f, got = 0;
  for (int i = 0; i < iters; ++i) x = std::fma(x, 0.999f, 0.25f);  // nvcc contracts the kernel's to fma.rn.f32
  CUDA_OK(cudaMemcpy(&got, d + 7, sizeof got, cudaMemcpyDeviceToHost));
  std::printf("KERNELS %lld MS %lld CHECK %s\n", kernels, stop - start, got == x ? "ok" : "wrong");
  if (argc == 5) {
    struct Util {
      unsigned gpu, memory;
    };
    void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    using InitFn = int (*)();
    using HandleFn = int (*)(unsigned, void**);
    using UtilFn = int (*)(void*, Util*);
    auto init = nvml ? reinterpret_cast<InitFn>(dlsym(nvml, "nvmlInit_v2")) : nullptr;
    auto handle = nvml ? reinterpret_cast<HandleFn>(dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2")) : nullptr;
    auto util = nvml ? reinterpret_cast<UtilFn>(dlsym(nvml, "nvmlDeviceGetUtilizationRates")) : nullptr;
    void* dev = nullptr;
    Util u{};
    int r = init && handle && util ? init() : -1;
    if (r == 0) r = handle(0, &dev);
    if (r == 0) r = util(dev, &u);
    if (r == 0) {
      std::printf("UTIL %u %u\n", u.gpu, u.memory);
    } else {
      std::printf("UTIL error %d\n", r);
    }
  }
  return 0;
}
