// two_clients.cu — one of two clients run at the same time: allocates ORION_GMEM/2 MiB (one
// cudaMalloc), fills it with a pattern unique to this process, sleeps argv[1] ms, reads it back
// and checks it. Memory operations only, so everything is checked on sim too.
//
// Usage: two_clients <sleep_ms> [seed]      (seed defaults to the pid)
// Prints, besides CHECK lines:
//   CLIENT pid=<pid> seed=<seed> mib=<n> phase=written     (after the pattern is on the device)
//   CLIENT pid=<pid> seed=<seed> mib=<n> phase=verified    (after the read-back)
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "orion_test.h"

using ot::check;
using ot::fmt;

static const size_t MiB = 1 << 20;

static void pattern(uint64_t seed, size_t off, uint64_t* w, size_t words) {
  for (size_t i = 0; i < words; ++i) {
    uint64_t x = (off / 8 + i) ^ (seed << 32) ^ 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    w[i] = x;
  }
}

int main(int argc, char** argv) {
  ot::detect_device();
  const long sleep_ms = argc > 1 ? atol(argv[1]) : 0;
  const uint64_t seed = argc > 2 ? strtoull(argv[2], nullptr, 0) : (uint64_t)getpid();
  const char* env = getenv("ORION_GMEM");
  if (!env || strtoull(env, nullptr, 10) < 2) {
    check("two_clients_env", false, "ORION_GMEM is not set (MiB, >= 2)");
    return ot::finish();
  }
  const size_t mib = strtoull(env, nullptr, 10) / 2;
  const size_t bytes = mib * MiB;
  char* d = nullptr;
  cudaError_t e = cudaMalloc((void**)&d, bytes);
  if (!check("two_clients_alloc", e == cudaSuccess, fmt("cudaMalloc(%zu MiB) -> %s", mib, cudaGetErrorName(e))))
    return ot::finish();

  const size_t chunk = std::min(bytes, 64 * MiB);
  std::vector<uint64_t> h(chunk / 8), g(chunk / 8);
  for (size_t off = 0; off < bytes; off += chunk) {
    size_t len = std::min(chunk, bytes - off);
    pattern(seed, off, h.data(), len / 8);
    CUDA_OK(cudaMemcpy(d + off, h.data(), len, cudaMemcpyHostToDevice));
  }
  CUDA_OK(cudaDeviceSynchronize());
  printf("CLIENT pid=%d seed=%llu mib=%zu phase=written\n", (int)getpid(), (unsigned long long)seed, mib);
  fflush(stdout);

  if (sleep_ms > 0) usleep((useconds_t)sleep_ms * 1000);

  std::string bad;
  for (size_t off = 0; off < bytes && bad.empty(); off += chunk) {
    size_t len = std::min(chunk, bytes - off);
    pattern(seed, off, h.data(), len / 8);
    CUDA_OK(cudaMemcpy(g.data(), d + off, len, cudaMemcpyDeviceToHost));
    long long i = ot::first_diff(g.data(), h.data(), len);
    if (i >= 0) bad = fmt("mismatch at byte %llu of %zu", (unsigned long long)(off + i), bytes);
  }
  check("two_clients_pattern", bad.empty(), bad);
  printf("CLIENT pid=%d seed=%llu mib=%zu phase=verified\n", (int)getpid(), (unsigned long long)seed, mib);
  CUDA_OK(cudaFree(d));
  return ot::finish();
}
