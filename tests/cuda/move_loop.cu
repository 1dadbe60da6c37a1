// move_loop.cu — a program that computes in a loop while its session may move to another oriond
// (issue #24): its device memory, a stream, two events, a module variable and a kernel are made
// before the loop and used across it. Each iteration adds i to every element on the stream, copies
// a slice back and checks it, and synchronizes (a call the program waits on: where a move happens),
// then sleeps PAUSE_MS. The results do not depend on where each iteration ran. EXTRA_MIB more device
// memory is state for a move to carry (scripts/bench-migration): with FILL "bytes" each 64 MiB chunk
// of it is set to its own byte value before the loop (a move compresses it to almost nothing), with
// "random" to pseudo-random bytes (splitmix64 of the 8-byte word's index: nothing compresses them);
// one 4 KiB slice per chunk is checked after the loop.
//
// Usage: move_loop [ITERATIONS=40] [PAUSE_MS=50] [EXTRA_MIB=0] [FILL=bytes|random]
// Output: "READY" after the setup, "ITER <i> <sum of the slice> <µs its calls took>" per iteration
// (the longest is a move's pause as the program sees it), CHECK lines (a fifth with EXTRA_MIB), DONE.
#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "orion_test.h"

__device__ unsigned long long calls;

__global__ void add(int* a, int n, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] += v;
  if (i == 0) atomicAdd(&calls, 1ull);
}

// The random fill's 8-byte word at index k (splitmix64: any word computed on its own).
uint64_t RandomWord(uint64_t k) {
  uint64_t z = (k + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The byte the extra memory holds at `at` (kChunk: the size of a chunk of one byte value).
unsigned char ExtraByte(bool random, size_t at, size_t chunk) {
  if (random) return static_cast<unsigned char>(RandomWord(at / 8) >> (8 * (at % 8)));
  return static_cast<unsigned char>((at / chunk * 37 + 11) & 0xff);
}

int main(int argc, char** argv) {
  ot::init_output();
  ot::detect_device();
  const int iterations = argc > 1 ? atoi(argv[1]) : 40;
  const int pause_ms = argc > 2 ? atoi(argv[2]) : 50;
  const size_t extra = (argc > 3 ? strtoull(argv[3], nullptr, 10) : 0) << 20;
  const bool random = argc > 4 && std::string(argv[4]) == "random";
  if (argc > 4 && !random && std::string(argv[4]) != "bytes") {
    fprintf(stderr, "move_loop: FILL is bytes or random, not %s\n", argv[4]);
    return 2;
  }
  constexpr size_t kChunk = 64 << 20;
  unsigned char* big = nullptr;
  if (extra != 0) {
    CUDA_OK(cudaMalloc(&big, extra));
    std::vector<uint64_t> words(random ? kChunk / 8 : 0);
    for (size_t off = 0; off < extra; off += kChunk) {
      const size_t bytes = std::min(kChunk, extra - off);
      if (!random) {
        CUDA_OK(cudaMemset(big + off, ExtraByte(false, off, kChunk), bytes));
        continue;
      }
      for (size_t w = 0; w < bytes / 8; ++w) words[w] = RandomWord(off / 8 + w);
      CUDA_OK(cudaMemcpy(big + off, words.data(), bytes, cudaMemcpyHostToDevice));
    }
  }
  const int n = 1 << 16;
  int* a = nullptr;
  CUDA_OK(cudaMalloc(&a, n * sizeof(int)));
  CUDA_OK(cudaMemset(a, 0, n * sizeof(int)));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  const unsigned long long zero = 0;
  CUDA_OK(cudaMemcpyToSymbol(calls, &zero, sizeof zero));
  CUDA_OK(cudaEventRecord(start, s));
  CUDA_OK(cudaStreamSynchronize(s));
  printf("READY\n");
  std::vector<int> slice(256);
  bool each_ok = true;
  for (int i = 1; i <= iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    add<<<(n + 255) / 256, 256, 0, s>>>(a, n, i);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpyAsync(slice.data(), a + (i * 997) % (n - 256), slice.size() * sizeof(int), cudaMemcpyDeviceToHost,
                            s));
    CUDA_OK(cudaStreamSynchronize(s));
    const long long us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    long long sum = 0;
    const int want = i * (i + 1) / 2;
    for (int v : slice) {
      sum += v;
      if (v != want) each_ok = false;
    }
    printf("ITER %d %lld %lld\n", i, sum, us);
    usleep(pause_ms * 1000);
  }
  CUDA_OK(cudaEventRecord(stop, s));
  CUDA_OK(cudaEventSynchronize(stop));
  float ms = -1;
  const cudaError_t elapsed = cudaEventElapsedTime(&ms, start, stop);
  std::vector<int> all(n);
  CUDA_OK(cudaMemcpy(all.data(), a, n * sizeof(int), cudaMemcpyDeviceToHost));
  const int want = iterations * (iterations + 1) / 2;
  int wrong = 0;
  for (int v : all) wrong += v != want;
  unsigned long long got_calls = 0;
  CUDA_OK(cudaMemcpyFromSymbol(&got_calls, calls, sizeof got_calls));
  ot::check("every_iteration_read_back_its_sum", each_ok);
  ot::check("all_elements_hold_the_sum", wrong == 0, ot::fmt("%d of %d wrong (want %d)", wrong, n, want));
  ot::check("module_variable_counts_every_launch", got_calls == static_cast<unsigned long long>(iterations),
            ot::fmt("calls=%llu want %d", got_calls, iterations));
  if (extra != 0) {
    std::vector<unsigned char> got(4096);
    size_t bad_chunks = 0;
    for (size_t off = 0; off < extra; off += kChunk) {
      const size_t at = off + (std::min(kChunk, extra - off) - got.size()) / 2;
      CUDA_OK(cudaMemcpy(got.data(), big + at, got.size(), cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < got.size(); ++j) {
        if (got[j] != ExtraByte(random, at + j, kChunk)) {
          ++bad_chunks;
          break;
        }
      }
    }
    ot::check("extra_memory_kept_its_bytes", bad_chunks == 0,
              ot::fmt("%zu of %zu chunks wrong", bad_chunks, (extra + kChunk - 1) / kChunk));
    CUDA_OK(cudaFree(big));
  }
  ot::check("events_across_the_loop", elapsed == cudaSuccess && ms >= 0,
            ot::fmt("cudaEventElapsedTime: %s, %.3f ms", cudaGetErrorString(elapsed), ms));
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(a));
  return ot::finish();
}
