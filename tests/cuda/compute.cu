// compute — kernels whose results are checked on the host, through Orion (on sim: the PTX executor).
//
//   compute            every kernel below; CHECK lines; device printf lines "DEVPRINTF ..." on stdout
//   compute assert     a kernel whose assert fails: the sync returns cudaErrorAssert (sticky)
//   compute oob        a kernel writing outside its allocation: cudaErrorIllegalAddress (sticky)
//   compute coop       a cooperative launch whose blocks exchange data across grid.sync()
//   compute peer       (ORION_VGPU=2) peer access between the two vGPUs: the attribute, enabling,
//                      cudaMemcpyPeer byte for byte, a kernel on device 0 reading device 1's memory
//   compute streams    a consumer on stream B sees a producer's data on stream A through an event
//                      wait; on sim, without the wait it deterministically reads stale data
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <cassert>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "orion_test.h"

#include "kernels_common.cuh"

__global__ void reduce(const int* in, unsigned long long* out, int n) {
  long long v = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) v += in[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
  __shared__ long long ws[32];
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? ws[threadIdx.x] : 0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    if (threadIdx.x == 0) atomicAdd(out, (unsigned long long)v);
  }
}

__global__ void scan(int* d) {  // inclusive, one block of 512
  __shared__ int t[512];
  int i = threadIdx.x;
  t[i] = d[i];
  __syncthreads();
  for (int o = 1; o < 512; o <<= 1) {
    int v = i >= o ? t[i - o] : 0;
    __syncthreads();
    t[i] += v;
    __syncthreads();
  }
  d[i] = t[i];
}

struct Particle {
  double x, y;
  int id;
  char tag[3];
};
__global__ void by_value(Particle p, double scale, double* out) {
  int i = threadIdx.x;
  out[i] = (p.x * i + p.y) * scale + p.id + p.tag[i % 3] + sqrt((double)i) + exp(-0.5 * i);
}

__global__ void halves(const __half* a, __half* b, float* f, int n) {
  int i = threadIdx.x;
  if (i < n) {
    __half h = __hfma(a[i], __float2half(0.5f), __float2half(-1.0f));
    b[i] = h;
    f[i] = __half2float(h) + __half2float(__hmul(a[i], a[i]));
  }
}

__global__ void hello(int x) {
  printf("DEVPRINTF block %d thread %d x=%d pi=%.3f\n", blockIdx.x, threadIdx.x, x, 3.14159);
}

// Phase 1 writes one value per thread; after grid.sync() every thread reads a value written by a
// thread of another block. Without a real grid-wide barrier the reads see zeros.
__global__ void grid_exchange(int* a, int* out, int n) {
  namespace cg = cooperative_groups;
  cg::grid_group g = cg::this_grid();
  const int i = (int)g.thread_rank();
  a[i] = i * 3 + 1;
  g.sync();
  const int j = (i + blockDim.x * 5 + 7) % n;  // in a block five blocks later
  out[i] = a[j] + i;
  g.sync();
  a[i] = 0;
}

__global__ void fill(int* p, int n, int v) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) p[i] = v;
}
__global__ void copy_plus(const int* src, int* dst, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) dst[i] = src[i] + 1;
}

__global__ void asserting(int bad) { assert(threadIdx.x != bad); }

__global__ void oob(int* p, int n) { p[n + 1000000 + threadIdx.x] = 1; }

static int normal() {
  ot::detect_device();
  // vector add
  {
    const int n = 100003;
    std::vector<float> a(n), b(n), c(n);
    for (int i = 0; i < n; ++i) a[i] = 0.25f * i, b[i] = 7.0f - i;
    float *da, *db, *dc;
    CUDA_OK(cudaMalloc(&da, n * 4));
    CUDA_OK(cudaMalloc(&db, n * 4));
    CUDA_OK(cudaMalloc(&dc, n * 4));
    CUDA_OK(cudaMemcpy(da, a.data(), n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, b.data(), n * 4, cudaMemcpyHostToDevice));
    vadd<<<(n + 255) / 256, 256>>>(da, db, dc, n);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(c.data(), dc, n * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; ++i) bad += c[i] != a[i] + b[i];
    ot::check_kernel("vadd", bad == 0, ot::fmt("%d of %d wrong", bad, n));
    cudaFree(da), cudaFree(db), cudaFree(dc);
  }
  // tiled matmul, edges not a multiple of the tile
  {
    const int n = 70;
    std::vector<float> A(n * n), B(n * n), C(n * n);
    for (int i = 0; i < n * n; ++i) A[i] = (i % 11) - 5.0f, B[i] = (i % 7) * 0.5f;
    float *dA, *dB, *dC;
    CUDA_OK(cudaMalloc(&dA, n * n * 4));
    CUDA_OK(cudaMalloc(&dB, n * n * 4));
    CUDA_OK(cudaMalloc(&dC, n * n * 4));
    CUDA_OK(cudaMemcpy(dA, A.data(), n * n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dB, B.data(), n * n * 4, cudaMemcpyHostToDevice));
    matmul<<<dim3((n + kTile - 1) / kTile, (n + kTile - 1) / kTile), dim3(kTile, kTile)>>>(dA, dB, dC, n);
    CUDA_OK(cudaMemcpy(C.data(), dC, n * n * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        float acc = 0;
        for (int k = 0; k < n; ++k) acc += A[i * n + k] * B[k * n + j];
        bad += std::fabs(C[i * n + j] - acc) > 1e-3f * std::max(1.0f, std::fabs(acc));
      }
    ot::check_kernel("matmul_shared_tiles", bad == 0, ot::fmt("%d entries wrong", bad));
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
  }
  // warp-shuffle reduction with a 64-bit atomic
  {
    const int n = 1 << 18;
    std::vector<int> v(n);
    for (int i = 0; i < n; ++i) v[i] = (i * 7919) % 2001 - 1000;
    int* dv;
    unsigned long long* dsum;
    CUDA_OK(cudaMalloc(&dv, n * 4));
    CUDA_OK(cudaMalloc(&dsum, 8));
    CUDA_OK(cudaMemcpy(dv, v.data(), n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dsum, 0, 8));
    reduce<<<16, 256>>>(dv, dsum, n);
    unsigned long long got = 0;
    CUDA_OK(cudaMemcpy(&got, dsum, 8, cudaMemcpyDeviceToHost));
    const long long want = std::accumulate(v.begin(), v.end(), 0LL);
    ot::check_kernel("shuffle_reduction", (long long)got == want, ot::fmt("got %lld want %lld", (long long)got, want));
    cudaFree(dv), cudaFree(dsum);
  }
  // block scan
  {
    std::vector<int> v(512), want(512), got(512);
    for (int i = 0; i < 512; ++i) v[i] = (i * 13) % 17 - 8;
    std::partial_sum(v.begin(), v.end(), want.begin());
    int* d;
    CUDA_OK(cudaMalloc(&d, 512 * 4));
    CUDA_OK(cudaMemcpy(d, v.data(), 512 * 4, cudaMemcpyHostToDevice));
    scan<<<1, 512>>>(d);
    CUDA_OK(cudaMemcpy(got.data(), d, 512 * 4, cudaMemcpyDeviceToHost));
    ot::check_kernel("scan", got == want, ot::diff_details(got.data(), want.data(), 512 * 4));
    cudaFree(d);
  }
  // histogram: shared and global atomics
  {
    const int n = 200000;
    std::vector<unsigned char> v(n);
    for (int i = 0; i < n; ++i) v[i] = (unsigned char)((i * 131) ^ (i >> 5));
    std::vector<unsigned> want(256, 0), got(256);
    for (unsigned char x : v) ++want[x];
    unsigned char* dv;
    unsigned* dh;
    CUDA_OK(cudaMalloc(&dv, n));
    CUDA_OK(cudaMalloc(&dh, 256 * 4));
    CUDA_OK(cudaMemcpy(dv, v.data(), n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dh, 0, 256 * 4));
    histogram<<<8, 256>>>(dv, dh, n);
    CUDA_OK(cudaMemcpy(got.data(), dh, 256 * 4, cudaMemcpyDeviceToHost));
    ot::check_kernel("histogram_atomics", got == want, ot::diff_details(got.data(), want.data(), 256 * 4));
    cudaFree(dv), cudaFree(dh);
  }
  // divergence inside a warp
  {
    std::vector<int> got(64), want(64);
    int* d;
    CUDA_OK(cudaMalloc(&d, 64 * 4));
    divergent<<<1, 64>>>(d);
    CUDA_OK(cudaMemcpy(got.data(), d, 64 * 4, cudaMemcpyDeviceToHost));
    DivergentReference(64, want.data());
    ot::check_kernel("divergent_warp", got == want, ot::diff_details(got.data(), want.data(), 64 * 4));
    cudaFree(d);
  }
  // struct by value, double precision
  {
    Particle p{1.5, -2.25, 40, {3, -5, 9}};
    double* d;
    std::vector<double> got(32);
    CUDA_OK(cudaMalloc(&d, 32 * 8));
    by_value<<<1, 32>>>(p, 0.75, d);
    CUDA_OK(cudaMemcpy(got.data(), d, 32 * 8, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 32; ++i) {
      const double want = (p.x * i + p.y) * 0.75 + p.id + p.tag[i % 3] + std::sqrt((double)i) + std::exp(-0.5 * i);
      bad += std::fabs(got[i] - want) > 1e-12 * std::max(1.0, std::fabs(want));
    }
    ot::check_kernel("struct_by_value_double", bad == 0, ot::fmt("%d wrong", bad));
    cudaFree(d);
  }
  // half precision
  {
    const int n = 64;
    std::vector<__half> a(n), b(n);
    std::vector<float> f(n);
    for (int i = 0; i < n; ++i) a[i] = __float2half(0.125f * i - 3.0f);
    __half *da, *db;
    float* df;
    CUDA_OK(cudaMalloc(&da, n * 2));
    CUDA_OK(cudaMalloc(&db, n * 2));
    CUDA_OK(cudaMalloc(&df, n * 4));
    CUDA_OK(cudaMemcpy(da, a.data(), n * 2, cudaMemcpyHostToDevice));
    halves<<<1, n>>>(da, db, df, n);
    CUDA_OK(cudaMemcpy(b.data(), db, n * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(f.data(), df, n * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; ++i) {
      const float x = __half2float(a[i]);
      const float h = __half2float(__float2half(std::fma(x, 0.5f, -1.0f)));
      const float sq = __half2float(__float2half(x * x));
      bad += __half2float(b[i]) != h || f[i] != h + sq;
    }
    ot::check_kernel("half_precision", bad == 0, ot::fmt("%d wrong", bad));
    cudaFree(da), cudaFree(db), cudaFree(df);
  }
  // Profiling brackets (no profiler attached): succeed, as with NVIDIA's driver.
  ot::check("profiler_start_stop", cudaProfilerStart() == cudaSuccess && cudaProfilerStop() == cudaSuccess);
  // device printf reaches this process's stdout, in order with its own lines
  printf("HOST before printf kernel\n");
  hello<<<2, 2>>>(42);
  CUDA_OK(cudaDeviceSynchronize());
  printf("HOST after printf kernel\n");
  return ot::finish();
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "assert") {
    ot::detect_device();
    asserting<<<2, 64>>>(37);
    cudaError_t e = cudaDeviceSynchronize();
    ot::expect_error("assert_sync", e, cudaErrorAssert);
    int* p;
    ot::expect_error("assert_sticky", cudaMalloc(&p, 16), cudaErrorAssert);
    return ot::finish();
  }
  if (mode == "coop") {
    ot::detect_device();
    int coop = 0;
    CUDA_OK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    ot::check("coop_attribute", coop == 1, ot::fmt("cudaDevAttrCooperativeLaunch = %d", coop));
    const int blocks = 12, threads = 128, n = blocks * threads;
    int *a, *out;
    CUDA_OK(cudaMalloc(&a, n * 4));
    CUDA_OK(cudaMalloc(&out, n * 4));
    CUDA_OK(cudaMemset(out, 0, n * 4));
    int nn = n;
    void* args[] = {&a, &out, &nn};
    CUDA_OK(cudaLaunchCooperativeKernel((void*)grid_exchange, blocks, threads, args, 0, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<int> got(n), zeros(n);
    CUDA_OK(cudaMemcpy(got.data(), out, n * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(zeros.data(), a, n * 4, cudaMemcpyDeviceToHost));
    int bad = 0, nonzero = 0;
    for (int i = 0; i < n; ++i) {
      const int j = (i + threads * 5 + 7) % n;
      bad += got[i] != j * 3 + 1 + i;
      nonzero += zeros[i] != 0;
    }
    ot::check_kernel("coop_grid_sync", bad == 0 && nonzero == 0, ot::fmt("%d wrong, %d not cleared", bad, nonzero));
    // A grid that cannot be resident at once is refused, as by the driver.
    int per_sm = 0, sms = 0;
    CUDA_OK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_exchange, threads, 0));
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int too_many = per_sm * sms + 1;
    ot::expect_error("coop_too_large",
                     cudaLaunchCooperativeKernel((void*)grid_exchange, too_many, threads, args, 0, nullptr),
                     cudaErrorCooperativeLaunchTooLarge);
    return ot::finish();
  }
  if (mode == "peer") {
    ot::detect_device();
    int n_dev = 0, can01 = 0, can00 = 1;
    CUDA_OK(cudaGetDeviceCount(&n_dev));
    if (!ot::check("two_devices", n_dev == 2, ot::fmt("%d devices", n_dev))) return ot::finish();
    CUDA_OK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CUDA_OK(cudaDeviceCanAccessPeer(&can00, 0, 0));
    ot::check("can_access_peer", can01 == 1 && can00 == 0, ot::fmt("0->1 %d, 0->0 %d", can01, can00));
    const int n = 1 << 16;
    std::vector<int> host(n), back(n);
    for (int i = 0; i < n; ++i) host[i] = i * 7 - 3;
    int *d0, *d1, *out;
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaMalloc(&d1, n * 4));
    CUDA_OK(cudaMemcpy(d1, host.data(), n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMalloc(&d0, n * 4));
    CUDA_OK(cudaMalloc(&out, n * 4));
    ot::check("enable_peer", cudaDeviceEnablePeerAccess(1, 0) == cudaSuccess);
    ot::expect_error("enable_peer_twice", cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
    CUDA_OK(cudaMemcpyPeer(d0, 0, d1, 1, n * 4));
    CUDA_OK(cudaMemcpy(back.data(), d0, n * 4, cudaMemcpyDeviceToHost));
    ot::check("memcpy_peer", back == host, ot::diff_details(back.data(), host.data(), n * 4));
    copy_plus<<<16, 256>>>(d1, out, n);  // on device 0, reading device 1's memory
    CUDA_OK(cudaMemcpy(back.data(), out, n * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; ++i) bad += back[i] != host[i] + 1;
    ot::check_kernel("kernel_reads_peer_memory", bad == 0, ot::fmt("%d wrong", bad));
    ot::check("disable_peer", cudaDeviceDisablePeerAccess(1) == cudaSuccess);
    ot::expect_error("disable_peer_twice", cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
    return ot::finish();
  }
  if (mode == "streams") {
    ot::detect_device();
    const int n = 4096;
    int *x, *y;
    CUDA_OK(cudaMalloc(&x, n * 4));
    CUDA_OK(cudaMalloc(&y, n * 4));
    cudaStream_t a, b;
    cudaEvent_t done;
    CUDA_OK(cudaStreamCreate(&a));
    CUDA_OK(cudaStreamCreate(&b));
    CUDA_OK(cudaEventCreate(&done));
    std::vector<int> got(n);
    auto count = [&](int want) {
      int k = 0;
      for (int v : got) k += v == want;
      return k;
    };
    // With the dependency: B waits for A's event, so the consumer sees every 7.
    CUDA_OK(cudaMemset(x, 0, n * 4));
    CUDA_OK(cudaMemset(y, 0, n * 4));
    fill<<<8, 128, 0, a>>>(x, n, 7);
    CUDA_OK(cudaEventRecord(done, a));
    CUDA_OK(cudaStreamWaitEvent(b, done, 0));
    copy_plus<<<8, 128, 0, b>>>(x, y, n);
    CUDA_OK(cudaStreamSynchronize(b));
    CUDA_OK(cudaMemcpy(got.data(), y, n * 4, cudaMemcpyDeviceToHost));
    ot::check_kernel("stream_wait_orders", count(8) == n, ot::fmt("%d of %d saw the producer", count(8), n));
    // Without it, nothing orders the two streams: on sim the consumer runs first, every time.
    CUDA_OK(cudaMemset(x, 0, n * 4));
    CUDA_OK(cudaMemset(y, 0, n * 4));
    fill<<<8, 128, 0, a>>>(x, n, 9);
    copy_plus<<<8, 128, 0, b>>>(x, y, n);
    CUDA_OK(cudaStreamSynchronize(b));
    CUDA_OK(cudaMemcpy(got.data(), y, n * 4, cudaMemcpyDeviceToHost));
    if (ot::is_sim())
      ot::check("missing_wait_reads_stale", count(1) == n, ot::fmt("%d of %d read stale data", count(1), n));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(got.data(), x, n * 4, cudaMemcpyDeviceToHost));
    ot::check_kernel("producer_ran_by_sync", count(9) == n, ot::fmt("%d of %d", count(9), n));
    return ot::finish();
  }
  if (mode == "oob") {
    ot::detect_device();
    int* p;
    CUDA_OK(cudaMalloc(&p, 4096));
    oob<<<1, 32>>>(p, 1024);
    cudaError_t e = cudaDeviceSynchronize();
    ot::expect_error("oob_sync", e, cudaErrorIllegalAddress);
    int h = 0;
    ot::expect_error("oob_sticky", cudaMemcpy(&h, p, 4, cudaMemcpyDeviceToHost), cudaErrorIllegalAddress);
    return ot::finish();
  }
  return normal();
}
