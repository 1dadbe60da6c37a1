// streams_overlap: 64M floats (256 MiB) in pinned host memory (cudaMallocHost), processed serially
// (one stream: all H2D, then the kernel, then all D2H) and in 4 streams (per chunk: async H2D,
// kernel, async D2H), so that copies in both directions overlap with compute. Both results checked.
// TIME streams_overlap_serial / streams_overlap_streamed: std::chrono, final sync included.
// INFO lines carry the same intervals measured with CUDA events.
#include <cmath>
#include <cstring>

#include "e2e.h"

constexpr int kStreams = 4;
constexpr int kIters = 48;  // enough arithmetic per element that the kernel costs about what a copy does

__global__ void work(const float* __restrict__ in, float* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float x = in[i], y = 0.0f;
#pragma unroll 4
    for (int k = 0; k < kIters; ++k) y = fmaf(y, 0.5f, x);  // converges towards 2x; exact sequence below
    out[i] = y;
  }
}

static float expected(float x) {
  float y = 0.0f;
  for (int k = 0; k < kIters; ++k) y = fmaf(y, 0.5f, x);
  return y;
}

int main() {
  cudaDeviceProp p = e2e::start("streams_overlap");
  const size_t n = size_t(64) << 20, bytes = n * sizeof(float), chunk = n / kStreams;
  printf("INFO asyncEngineCount %d, concurrentKernels %d\n", p.asyncEngineCount, p.concurrentKernels);
  float *hin, *hout, *din, *dout;
  E2E_CK(cudaMallocHost(&hin, bytes));
  E2E_CK(cudaMallocHost(&hout, bytes));
  E2E_CK(cudaMalloc(&din, bytes));
  E2E_CK(cudaMalloc(&dout, bytes));
  // kDistinct distinct inputs, so that the host computes each expected value once (host fmaf is slow).
  constexpr size_t kDistinct = 4099;
  static float table[kDistinct];
  for (size_t v = 0; v < kDistinct; ++v) table[v] = expected(static_cast<float>(v) * 0.25f - 300.0f);
  for (size_t i = 0; i < n; ++i) hin[i] = static_cast<float>(i % kDistinct) * 0.25f - 300.0f;
  cudaStream_t s[kStreams];
  for (auto& st : s) E2E_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  E2E_CK(cudaEventCreate(&e0));
  E2E_CK(cudaEventCreate(&e1));
  const int threads = 256, blocks = p.multiProcessorCount * 8;

  auto poison = [&] {
    E2E_CK(cudaMemset(dout, 0xff, bytes));
    E2E_CK(cudaDeviceSynchronize());
    memset(hout, 0xff, bytes);
  };
  auto check = [&](const char* what) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; ++i)
      if (hout[i] != table[i % kDistinct] && bad++ == 0) first = i;
    if (bad != 0)
      e2e::fail("%s: %zu of %zu wrong, first at %zu: %g for input %g (expected %g)", what, bad, n, first, hout[first],
                hin[first], table[first % kDistinct]);
  };
  float ev_ms = 0;

  const double serial = e2e::timed(
      "streams_overlap_serial",
      [&] {
        E2E_CK(cudaEventRecord(e0, s[0]));
        E2E_CK(cudaMemcpyAsync(din, hin, bytes, cudaMemcpyHostToDevice, s[0]));
        work<<<blocks, threads, 0, s[0]>>>(din, dout, n);
        E2E_CK_LAUNCH();
        E2E_CK(cudaMemcpyAsync(hout, dout, bytes, cudaMemcpyDeviceToHost, s[0]));
        E2E_CK(cudaEventRecord(e1, s[0]));
        E2E_CK(cudaDeviceSynchronize());
      },
      poison);
  E2E_CK(cudaEventElapsedTime(&ev_ms, e0, e1));
  printf("INFO events serial %.3f ms\n", ev_ms);
  check("serial");

  const double streamed = e2e::timed(
      "streams_overlap_streamed",
      [&] {
        E2E_CK(cudaEventRecord(e0, s[0]));
        for (int k = 1; k < kStreams; ++k) E2E_CK(cudaStreamWaitEvent(s[k], e0, 0));
        for (int k = 0; k < kStreams; ++k) {
          const size_t off = k * chunk, cnt = (k == kStreams - 1) ? n - off : chunk;
          E2E_CK(cudaMemcpyAsync(din + off, hin + off, cnt * sizeof(float), cudaMemcpyHostToDevice, s[k]));
          work<<<blocks / kStreams, threads, 0, s[k]>>>(din + off, dout + off, cnt);
          E2E_CK_LAUNCH();
          E2E_CK(cudaMemcpyAsync(hout + off, dout + off, cnt * sizeof(float), cudaMemcpyDeviceToHost, s[k]));
        }
        // e1 in s[0] after every stream's work: join the other streams into s[0] first.
        for (int k = 1; k < kStreams; ++k) {
          cudaEvent_t j;
          E2E_CK(cudaEventCreateWithFlags(&j, cudaEventDisableTiming));
          E2E_CK(cudaEventRecord(j, s[k]));
          E2E_CK(cudaStreamWaitEvent(s[0], j, 0));
          E2E_CK(cudaEventDestroy(j));
        }
        E2E_CK(cudaEventRecord(e1, s[0]));
        E2E_CK(cudaDeviceSynchronize());
      },
      poison);
  E2E_CK(cudaEventElapsedTime(&ev_ms, e0, e1));
  printf("INFO events streamed %.3f ms; chrono speedup %.2fx\n", ev_ms, serial / streamed);
  check("streamed");

  for (auto& st : s) E2E_CK(cudaStreamDestroy(st));
  E2E_CK(cudaEventDestroy(e0));
  E2E_CK(cudaEventDestroy(e1));
  E2E_CK(cudaFreeHost(hin));
  E2E_CK(cudaFreeHost(hout));
  E2E_CK(cudaFree(din));
  E2E_CK(cudaFree(dout));
  return e2e::pass();
}
