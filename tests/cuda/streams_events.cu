// streams_events.cu — streams, events, cudaStreamWaitEvent ordering across streams.
// The memset/copy chains are checked everywhere (memory operations run on sim too); the kernel
// chain's results only on a real GPU.
#include <cuda_runtime.h>

#include <vector>

#include "orion_test.h"

using ot::check;
using ot::fmt;

// Spins ~`cycles` clocks per thread, then fills p[i] = v: a slow producer, so a consumer that
// does not wait for it would observe the old contents on a real GPU.
__global__ void k_spin_fill(int* p, int n, int v, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v;
}

// out[i] = in[i] * m + i
__global__ void k_axpi(int* out, const int* in, int n, int m) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i] * m + i;
}

static const size_t MiB = 1 << 20;

static void memset_chain(cudaStream_t s1, cudaStream_t s2, int round) {
  const size_t n = (size_t)(8 + round * 4) * MiB + round * 3;  // at most 3 x 16 MiB live
  const size_t off = 4096 + 17 * round, len = MiB + 5;
  unsigned char *a, *b, *c, *h;
  CUDA_OK(cudaMalloc((void**)&a, n));
  CUDA_OK(cudaMalloc((void**)&b, n));
  CUDA_OK(cudaMalloc((void**)&c, n));
  CUDA_OK(cudaMallocHost((void**)&h, n));
  CUDA_OK(cudaMemset(a, 0xA0, n));
  CUDA_OK(cudaMemset(b, 0xB0, n));
  CUDA_OK(cudaMemset(c, 0xC0, n));
  CUDA_OK(cudaDeviceSynchronize());
  memset(h, 0, n);

  cudaEvent_t e1, e2, start, stop;
  CUDA_OK(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
  CUDA_OK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  const int v1 = 0x11 + round, v2 = 0x22 + round;

  CUDA_OK(cudaEventRecord(start, s1));
  CUDA_OK(cudaMemsetAsync(a, v1, n, s1));
  CUDA_OK(cudaEventRecord(e1, s1));
  CUDA_OK(cudaStreamWaitEvent(s2, e1, 0));
  CUDA_OK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s2));
  CUDA_OK(cudaMemsetAsync(b + off, v2, len, s2));
  CUDA_OK(cudaEventRecord(e2, s2));
  CUDA_OK(cudaStreamWaitEvent(s1, e2, 0));
  CUDA_OK(cudaMemcpyAsync(c, b, n, cudaMemcpyDeviceToDevice, s1));
  CUDA_OK(cudaMemcpyAsync(h, c, n, cudaMemcpyDeviceToHost, s1));
  CUDA_OK(cudaEventRecord(stop, s1));
  CUDA_OK(cudaStreamSynchronize(s1));

  std::vector<unsigned char> want(n, (unsigned char)v1);
  memset(want.data() + off, v2, len);
  check(fmt("chain_memset_copy_r%d", round), memcmp(h, want.data(), n) == 0, ot::diff_details(h, want.data(), n));

  CUDA_OK(cudaEventSynchronize(stop));
  float ms = -1.0f;
  CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
  check(fmt("elapsed_nonnegative_r%d", round), ms >= 0.0f, fmt("elapsed=%f ms", ms));
  cudaError_t q1 = cudaEventQuery(e1), q2 = cudaEventQuery(e2), qs = cudaEventQuery(stop);
  check(fmt("event_query_after_sync_r%d", round), q1 == cudaSuccess && q2 == cudaSuccess && qs == cudaSuccess,
        fmt("e1=%s e2=%s stop=%s", cudaGetErrorName(q1), cudaGetErrorName(q2), cudaGetErrorName(qs)));
  cudaError_t sq1 = cudaStreamQuery(s1), sq2 = cudaStreamQuery(s2);
  // s2 finished before e2 fired, which s1 waited for.
  check(fmt("stream_query_after_sync_r%d", round), sq1 == cudaSuccess && sq2 == cudaSuccess,
        fmt("s1=%s s2=%s", cudaGetErrorName(sq1), cudaGetErrorName(sq2)));

  if (round == 0) {
    float z = -1.0f;
    CUDA_OK(cudaEventElapsedTime(&z, start, start));
    check("elapsed_same_event_zero", z == 0.0f, fmt("elapsed=%f", z));
    float bad = 0;
    ot::expect_failure("elapsed_disable_timing_fails", cudaEventElapsedTime(&bad, e1, e2));
  }

  CUDA_OK(cudaEventDestroy(e1));
  CUDA_OK(cudaEventDestroy(e2));
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  CUDA_OK(cudaFree(a));
  CUDA_OK(cudaFree(b));
  CUDA_OK(cudaFree(c));
  CUDA_OK(cudaFreeHost(h));
}

static void kernel_chain(cudaStream_t s1, cudaStream_t s2) {
  const int n = 1 << 20;
  int *a, *b, *c, *h;
  CUDA_OK(cudaMalloc((void**)&a, n * sizeof(int)));
  CUDA_OK(cudaMalloc((void**)&b, n * sizeof(int)));
  CUDA_OK(cudaMalloc((void**)&c, n * sizeof(int)));
  CUDA_OK(cudaMallocHost((void**)&h, n * sizeof(int)));
  CUDA_OK(cudaMemset(a, 0, n * sizeof(int)));
  CUDA_OK(cudaMemset(b, 0, n * sizeof(int)));
  CUDA_OK(cudaMemset(c, 0, n * sizeof(int)));
  CUDA_OK(cudaDeviceSynchronize());
  cudaEvent_t e1, e2;
  CUDA_OK(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
  CUDA_OK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
  k_spin_fill<<<128, 256, 0, s1>>>(a, n, 5, 4000000LL);  // ~2 ms on a real GPU
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaEventRecord(e1, s1));
  CUDA_OK(cudaStreamWaitEvent(s2, e1, 0));
  k_axpi<<<256, 256, 0, s2>>>(b, a, n, 3);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaEventRecord(e2, s2));
  CUDA_OK(cudaStreamWaitEvent(s1, e2, 0));
  k_axpi<<<256, 256, 0, s1>>>(c, b, n, 2);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpyAsync(h, c, n * sizeof(int), cudaMemcpyDeviceToHost, s1));
  CUDA_OK(cudaStreamSynchronize(s1));
  int bad = -1;
  for (int i = 0; i < n; ++i)
    if (h[i] != (5 * 3 + i) * 2 + i) {
      bad = i;
      break;
    }
  ot::check_kernel("chain_kernels", bad < 0,
                   bad < 0 ? "" : fmt("c[%d]=%d want %d", bad, h[bad], (5 * 3 + bad) * 2 + bad));
  CUDA_OK(cudaEventDestroy(e1));
  CUDA_OK(cudaEventDestroy(e2));
  CUDA_OK(cudaFree(a));
  CUDA_OK(cudaFree(b));
  CUDA_OK(cudaFree(c));
  CUDA_OK(cudaFreeHost(h));
}

// Eight streams, each fills its own slice and copies it back; one cudaDeviceSynchronize.
static void many_streams() {
  const int ns = 8;
  const size_t slice = 2 * MiB + 7;
  cudaStream_t st[ns];
  unsigned char* d;
  unsigned char* h;
  CUDA_OK(cudaMalloc((void**)&d, ns * slice));
  CUDA_OK(cudaMallocHost((void**)&h, ns * slice));
  memset(h, 0, ns * slice);
  for (int i = 0; i < ns; ++i) {
    CUDA_OK(i % 2 ? cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking) : cudaStreamCreate(&st[i]));
    CUDA_OK(cudaMemsetAsync(d + i * slice, 0x40 + i, slice, st[i]));
    CUDA_OK(cudaMemsetAsync(d + i * slice + 100, 0x80 + i, 3, st[i]));
    CUDA_OK(cudaMemcpyAsync(h + i * slice, d + i * slice, slice, cudaMemcpyDeviceToHost, st[i]));
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<unsigned char> want(ns * slice);
  for (int i = 0; i < ns; ++i) {
    memset(want.data() + i * slice, 0x40 + i, slice);
    memset(want.data() + i * slice + 100, 0x80 + i, 3);
  }
  check("many_streams_memsets", memcmp(h, want.data(), ns * slice) == 0, ot::diff_details(h, want.data(), ns * slice));
  for (int i = 0; i < ns; ++i) {
    cudaError_t q = cudaStreamQuery(st[i]);
    check(fmt("stream_query_idle_%d", i), q == cudaSuccess, cudaGetErrorName(q));
    CUDA_OK(cudaStreamDestroy(st[i]));
  }
  CUDA_OK(cudaFree(d));
  CUDA_OK(cudaFreeHost(h));
}

static void misc_events() {
  // Waiting on an event that was never recorded is a no-op.
  cudaStream_t s;
  cudaEvent_t e;
  CUDA_OK(cudaStreamCreate(&s));
  CUDA_OK(cudaEventCreate(&e));
  cudaError_t w = cudaStreamWaitEvent(s, e, 0);
  check("wait_unrecorded_event", w == cudaSuccess, cudaGetErrorName(w));
  cudaError_t q = cudaEventQuery(e);
  check("query_unrecorded_event", q == cudaSuccess, cudaGetErrorName(q));
  CUDA_OK(cudaStreamSynchronize(s));

  // Event on the legacy default stream, waited on by a created stream.
  int* d;
  int hv = 0;
  CUDA_OK(cudaMalloc((void**)&d, sizeof(int)));
  CUDA_OK(cudaMemsetAsync(d, 0x5A, sizeof(int), 0));
  CUDA_OK(cudaEventRecord(e, 0));
  CUDA_OK(cudaStreamWaitEvent(s, e, 0));
  CUDA_OK(cudaMemcpyAsync(&hv, d, sizeof(int), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  check("default_stream_event", hv == 0x5A5A5A5A, fmt("got 0x%08x", hv));

  // Stream priorities.
  int lo = 0, hi = 0;
  CUDA_OK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t sp;
  CUDA_OK(cudaStreamCreateWithPriority(&sp, cudaStreamNonBlocking, hi));
  int got = 12345;
  CUDA_OK(cudaStreamGetPriority(sp, &got));
  check("stream_priority", got == hi, fmt("got %d want %d (range %d..%d)", got, hi, lo, hi));
  unsigned int flags = 0;
  CUDA_OK(cudaStreamGetFlags(sp, &flags));
  check("stream_flags", flags == cudaStreamNonBlocking, fmt("got %u", flags));
  CUDA_OK(cudaStreamDestroy(sp));

  CUDA_OK(cudaEventDestroy(e));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(d));
}

// cudaStreamSetAttribute / cudaStreamGetAttribute: an L2 access policy window and the
// synchronization policy round-trip, the priority is the stream's, bad values are refused.
static void stream_attributes() {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, 1 << 20));
  cudaStreamAttrValue v{};
  CUDA_OK(cudaStreamGetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &v));
  // A stream whose policy was never set: the sim says Auto; an H100 with driver 580.159 says -1
  // (bench/results/2026-11-27-gpu-e2e-h100.txt, natively and through Orion's cuda backend alike).
  check("attr_sync_policy_default_auto", v.syncPolicy == cudaSyncPolicyAuto || (int)v.syncPolicy == -1,
        fmt("got %d", (int)v.syncPolicy));
  v = cudaStreamAttrValue{};
  v.accessPolicyWindow.base_ptr = d;
  v.accessPolicyWindow.num_bytes = 1 << 20;
  v.accessPolicyWindow.hitRatio = 0.6f;
  v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  cudaError_t e = cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v);
  check("attr_window_set", e == cudaSuccess, cudaGetErrorName(e));
  cudaStreamAttrValue got{};
  CUDA_OK(cudaStreamGetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &got));
  check("attr_window_round_trip",
        got.accessPolicyWindow.base_ptr == d && got.accessPolicyWindow.num_bytes == (1 << 20) &&
            got.accessPolicyWindow.hitRatio == 0.6f && got.accessPolicyWindow.hitProp == cudaAccessPropertyPersisting &&
            got.accessPolicyWindow.missProp == cudaAccessPropertyStreaming,
        fmt("ptr %p bytes %zu ratio %f", got.accessPolicyWindow.base_ptr, got.accessPolicyWindow.num_bytes,
            got.accessPolicyWindow.hitRatio));
  v = cudaStreamAttrValue{};
  v.syncPolicy = cudaSyncPolicyYield;
  CUDA_OK(cudaStreamSetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &v));
  got = cudaStreamAttrValue{};
  CUDA_OK(cudaStreamGetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &got));
  check("attr_sync_policy_round_trip", got.syncPolicy == cudaSyncPolicyYield, fmt("got %d", (int)got.syncPolicy));
  // Refused values: a hit ratio above 1, a window larger than the device's maximum.
  int max_window = 0;
  CUDA_OK(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, 0));
  v = cudaStreamAttrValue{};
  v.accessPolicyWindow.base_ptr = d;
  v.accessPolicyWindow.num_bytes = 1 << 20;
  v.accessPolicyWindow.hitRatio = 1.5f;
  check("attr_bad_hit_ratio_refused",
        cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v) == cudaErrorInvalidValue);
  cudaGetLastError();
  v.accessPolicyWindow.hitRatio = 0.5f;
  v.accessPolicyWindow.num_bytes = static_cast<size_t>(max_window) + 1;
  check("attr_window_over_max_refused",
        max_window > 0 && cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v) == cudaErrorInvalidValue,
        fmt("max %d", max_window));
  cudaGetLastError();
  // The priority attribute is the stream's priority.
  int lo = 0, hi = 0;
  CUDA_OK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t sp;
  CUDA_OK(cudaStreamCreateWithPriority(&sp, cudaStreamNonBlocking, hi));
  got = cudaStreamAttrValue{};
  CUDA_OK(cudaStreamGetAttribute(sp, cudaStreamAttributePriority, &got));
  check("attr_priority_is_the_streams", got.priority == hi, fmt("got %d want %d", got.priority, hi));
  CUDA_OK(cudaStreamDestroy(sp));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(d));
}

int main() {
  ot::detect_device();
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  for (int r = 0; r < 3; ++r) memset_chain(s1, s2, r);
  kernel_chain(s1, s2);
  many_streams();
  misc_events();
  stream_attributes();
  CUDA_OK(cudaStreamDestroy(s1));
  CUDA_OK(cudaStreamDestroy(s2));
  cudaError_t e = cudaDeviceSynchronize();
  check("device_synchronize", e == cudaSuccess, cudaGetErrorName(e));
  return ot::finish();
}
