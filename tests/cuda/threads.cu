// Many application threads share the process's one Orion channel: each thread has its own stream,
// allocations, copies, memsets and launches, all interleaved. Every thread's data must come back
// intact (one ordered channel, enqueued under a lock, executed in order by oriond).
#include <thread>
#include <vector>

#include "orion_test.h"

__global__ void touch(int* p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += v;
}

int main() {
  ot::detect_device();
  const int kThreads = 8, kIters = 40;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([t, &errors] {
      cudaStream_t s;
      if (cudaStreamCreate(&s) != cudaSuccess) {
        errors[t] = "stream";
        return;
      }
      ot::Rng rng(1000 + t);
      for (int it = 0; it < kIters; ++it) {
        const size_t n = 1 + rng.next() % (3 << 20);
        std::vector<uint8_t> src(n), back(n);
        rng.fill(src.data(), n);
        void* d = nullptr;
        if (cudaMalloc(&d, n + 64) != cudaSuccess) {
          errors[t] = "malloc";
          return;
        }
        cudaMemsetAsync(d, 0x5a, n + 64, s);
        cudaMemcpyAsync(d, src.data(), n, cudaMemcpyHostToDevice, s);
        touch<<<1, 32, 0, s>>>(static_cast<int*>(d) + (n + 3) / 4, 0, t);  // n = 0: writes nothing
        cudaMemcpyAsync(back.data(), d, n, cudaMemcpyDeviceToHost, s);
        uint8_t tail[64];
        cudaMemcpyAsync(tail, static_cast<uint8_t*>(d) + n, 64, cudaMemcpyDeviceToHost, s);
        if (cudaStreamSynchronize(s) != cudaSuccess) {
          errors[t] = "sync";
          return;
        }
        if (memcmp(src.data(), back.data(), n) != 0) {
          errors[t] = ot::fmt("iteration %d: %s", it, ot::diff_details(back.data(), src.data(), n).c_str());
          return;
        }
        for (int k = 0; k < 64; ++k) {
          if (tail[k] != 0x5a) {
            errors[t] = ot::fmt("iteration %d: memset tail byte %d", it, k);
            return;
          }
        }
        cudaFree(d);
      }
      cudaStreamDestroy(s);
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) ot::check(ot::fmt("thread_%d", t), errors[t].empty(), errors[t]);
  ot::check("device_sync", cudaDeviceSynchronize() == cudaSuccess);
  return ot::finish();
}
