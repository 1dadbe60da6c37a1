// samples — compute kernels of the kinds NVIDIA's cuda-samples time (written here, not copied):
// a tiled matrix multiply of matrixMul's default size, a two-level sum reduction, a block-wise
// inclusive scan, a tiled transpose, Black-Scholes option pricing, and a 256-bin histogram with
// shared-memory atomics. Each result is checked against the host. The sim backend's speed on whole
// programs is measured with these (scripts/bench-sim, issue #26); test_sim.py checks their results
// with the PTX translator on and off.
//
//   samples [matmul|reduce|scan|transpose|blackscholes|histogram|all] [LAUNCHES]   (default: all 1)
//
// Each kernel is launched LAUNCHES times (as the samples repeat theirs to time them); its result is
// checked after the last. Output: orion_test.h's CHECK lines (one per kernel's result), and
//   TIME <name> <launch> <milliseconds>   each launch's time by CUDA events (launch to completion)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "orion_test.h"

namespace {

constexpr int kTile = 16;

// C[h x w] = A[h x k] * B[k x w], 16x16 tiles in shared memory (dimensions multiples of 16).
__global__ void matmul(const float* a, const float* b, float* c, int h, int k, int w) {
  __shared__ float as[kTile][kTile];
  __shared__ float bs[kTile][kTile];
  const int row = blockIdx.y * kTile + threadIdx.y, col = blockIdx.x * kTile + threadIdx.x;
  float acc = 0;
  for (int t = 0; t < k; t += kTile) {
    as[threadIdx.y][threadIdx.x] = a[row * k + t + threadIdx.x];
    bs[threadIdx.y][threadIdx.x] = b[(t + threadIdx.y) * w + col];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile; ++i) acc += as[threadIdx.y][i] * bs[i][threadIdx.x];
    __syncthreads();
  }
  c[row * w + col] = acc;
}

// Per block: the sum of its 2 * 256 elements (a tree in shared memory, then the last warp's shuffles).
__global__ void reduce(const int* in, int* partial, int n) {
  __shared__ int s[256];
  const int t = threadIdx.x, i = blockIdx.x * 512 + t;
  int v = (i < n ? in[i] : 0) + (i + 256 < n ? in[i + 256] : 0);
  s[t] = v;
  __syncthreads();
  for (int half = 128; half >= 32; half >>= 1) {
    if (t < half) s[t] = v = v + s[t + half];
    __syncthreads();
  }
  if (t < 32) {
    for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
    if (t == 0) partial[blockIdx.x] = v;
  }
}

// Inclusive scan of each block's 512 elements (Hillis-Steele in shared memory, double-buffered).
__global__ void scan(const unsigned* in, unsigned* out) {
  __shared__ unsigned buf[2][512];
  const int t = threadIdx.x, base = blockIdx.x * 512;
  int cur = 0;
  buf[0][t] = in[base + t];
  __syncthreads();
  for (int d = 1; d < 512; d <<= 1) {
    buf[cur ^ 1][t] = t >= d ? buf[cur][t] + buf[cur][t - d] : buf[cur][t];
    cur ^= 1;
    __syncthreads();
  }
  out[base + t] = buf[cur][t];
}

// out[w x h] = in[h x w] transposed through a padded 32x32 shared tile (32x8 threads per block).
__global__ void transpose(const float* in, float* out, int h, int w) {
  __shared__ float tile[32][33];
  const int x = blockIdx.x * 32 + threadIdx.x;
  for (int j = threadIdx.y; j < 32; j += 8) tile[j][threadIdx.x] = in[(blockIdx.y * 32 + j) * w + x];
  __syncthreads();
  const int ox = blockIdx.y * 32 + threadIdx.x;
  for (int j = threadIdx.y; j < 32; j += 8) out[(blockIdx.x * 32 + j) * h + ox] = tile[threadIdx.x][j];
}

__host__ __device__ float cnd(float d) {  // the cumulative normal distribution (Abramowitz-Stegun 26.2.17)
  const float k = 1.0f / (1.0f + 0.2316419f * fabsf(d));
  const float poly =
      k * (0.31938153f + k * (-0.356563782f + k * (1.781477937f + k * (-1.821255978f + k * 1.330274429f))));
  const float v = 0.39894228040143267794f * expf(-0.5f * d * d) * poly;
  return d > 0 ? 1.0f - v : v;
}

__host__ __device__ void price(float s, float x, float t, float r, float vol, float* call, float* put) {
  const float sq = sqrtf(t);
  const float d1 = (logf(s / x) + (r + 0.5f * vol * vol) * t) / (vol * sq);
  const float d2 = d1 - vol * sq;
  const float e = expf(-r * t);
  *call = s * cnd(d1) - x * e * cnd(d2);
  *put = x * e * (1.0f - cnd(d2)) - s * (1.0f - cnd(d1));
}

__global__ void blackscholes(const float* s, const float* x, const float* t, float* call, float* put, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    price(s[i], x[i], t[i], 0.02f, 0.30f, &call[i], &put[i]);
}

// 256 bins: per-block counts in shared memory, added to the global ones at the end.
__global__ void histogram(const unsigned char* in, unsigned* bins, int n) {
  __shared__ unsigned local[256];
  local[threadIdx.x] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) atomicAdd(&local[in[i]], 1u);
  __syncthreads();
  atomicAdd(&bins[threadIdx.x], local[threadIdx.x]);
}

int g_launches = 1;

// Times what `launch` enqueues, by events; prints TIME.
template <class F>
void TimedOnce(const char* name, int i, F launch) {
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  CUDA_OK(cudaEventRecord(a));
  launch();
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaEventRecord(b));
  CUDA_OK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, a, b));
  printf("TIME %s %d %.3f\n", name, i, ms);
  CUDA_OK(cudaEventDestroy(a));
  CUDA_OK(cudaEventDestroy(b));
}

// g_launches launches of what `launch` enqueues, each timed.
template <class F>
void Timed(const char* name, F launch) {
  for (int i = 0; i < g_launches; ++i) TimedOnce(name, i, launch);
}

template <class T>
T* Device(const std::vector<T>& v) {
  return static_cast<T*>(ot::upload(v.data(), v.size() * sizeof(T)));
}
template <class T>
std::vector<T> Host(const T* d, size_t n) {
  std::vector<T> v(n);
  CUDA_OK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

void Matmul() {
  // matrixMul's default: A 320x320, B 320x640.
  const int h = 320, k = 320, w = 640;
  std::vector<float> a(static_cast<size_t>(h) * k), b(static_cast<size_t>(k) * w);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) - 3;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) * 0.5f;
  float *da = Device(a), *db = Device(b), *dc;
  CUDA_OK(cudaMalloc(&dc, static_cast<size_t>(h) * w * 4));
  Timed("matmul", [&] { matmul<<<dim3(w / kTile, h / kTile), dim3(kTile, kTile)>>>(da, db, dc, h, k, w); });
  const auto c = Host(dc, static_cast<size_t>(h) * w);
  long long bad = -1;
  for (int i = 0; i < h && bad < 0; ++i)
    for (int j = 0; j < w; ++j) {
      float acc = 0;
      for (int q = 0; q < k; ++q) acc += a[static_cast<size_t>(i) * k + q] * b[static_cast<size_t>(q) * w + j];
      if (c[static_cast<size_t>(i) * w + j] != acc) {  // small integers and halves: every sum is exact
        bad = i * w + j;
        break;
      }
    }
  ot::check_kernel("matmul", bad < 0, ot::fmt("C[%lld] differs from the host's", bad));
  cudaFree(da), cudaFree(db), cudaFree(dc);
}

void Reduce() {
  const int n = 1 << 24;
  std::vector<int> in(n);
  long long want = 0;
  for (int i = 0; i < n; ++i) want += in[i] = (i * 2654435761u >> 20) % 1000 - 500;
  int* din = Device(in);
  const int blocks = (n + 511) / 512;
  int* dpart;
  CUDA_OK(cudaMalloc(&dpart, blocks * 4));
  Timed("reduce", [&] { reduce<<<blocks, 256>>>(din, dpart, n); });
  long long got = 0;
  for (int v : Host(dpart, blocks)) got += v;
  ot::check_kernel("reduce", got == want, ot::fmt("sum %lld, want %lld", got, want));
  cudaFree(din), cudaFree(dpart);
}

void Scan() {
  const int blocks = 8192, n = blocks * 512;
  std::vector<unsigned> in(n);
  for (int i = 0; i < n; ++i) in[i] = (i * 40503u) % 97;
  unsigned *din = Device(in), *dout;
  CUDA_OK(cudaMalloc(&dout, n * 4));
  Timed("scan", [&] { scan<<<blocks, 512>>>(din, dout); });
  const auto out = Host(dout, n);
  long long bad = -1;
  for (int b = 0; b < blocks && bad < 0; ++b) {
    unsigned acc = 0;
    for (int i = 0; i < 512; ++i) {
      acc += in[b * 512 + i];
      if (out[b * 512 + i] != acc) {
        bad = b * 512 + i;
        break;
      }
    }
  }
  ot::check_kernel("scan", bad < 0, ot::fmt("element %lld differs from the host's", bad));
  cudaFree(din), cudaFree(dout);
}

void Transpose() {
  const int h = 2048, w = 2048;
  std::vector<float> in(static_cast<size_t>(h) * w);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  float *din = Device(in), *dout;
  CUDA_OK(cudaMalloc(&dout, in.size() * 4));
  Timed("transpose", [&] { transpose<<<dim3(w / 32, h / 32), dim3(32, 8)>>>(din, dout, h, w); });
  const auto out = Host(dout, in.size());
  long long bad = -1;
  for (int i = 0; i < h && bad < 0; ++i)
    for (int j = 0; j < w; ++j)
      if (out[static_cast<size_t>(j) * h + i] != in[static_cast<size_t>(i) * w + j]) {
        bad = i * w + j;
        break;
      }
  ot::check_kernel("transpose", bad < 0, ot::fmt("element %lld misplaced", bad));
  cudaFree(din), cudaFree(dout);
}

void BlackScholes() {
  const int n = 1 << 20;
  std::vector<float> s(n), x(n), t(n);
  for (int i = 0; i < n; ++i) {
    s[i] = 5.0f + static_cast<float>(i % 251) * 0.1f;
    x[i] = 1.0f + static_cast<float>(i % 997) * 0.1f;
    t[i] = 0.25f + static_cast<float>(i % 41) * 0.25f;
  }
  float *ds = Device(s), *dx = Device(x), *dt = Device(t), *dcall, *dput;
  CUDA_OK(cudaMalloc(&dcall, n * 4));
  CUDA_OK(cudaMalloc(&dput, n * 4));
  Timed("blackscholes", [&] { blackscholes<<<480, 128>>>(ds, dx, dt, dcall, dput, n); });
  const auto call = Host(dcall, n), put = Host(dput, n);
  double worst = 0;
  for (int i = 0; i < n; ++i) {
    float c, p;
    price(s[i], x[i], t[i], 0.02f, 0.30f, &c, &p);
    worst = std::max({worst, std::fabs(static_cast<double>(call[i]) - c), std::fabs(static_cast<double>(put[i]) - p)});
  }
  // The GPU's expf/logf (and the sim's host libm) differ by an ulp or two: prices agree to 1e-3.
  ot::check_kernel("blackscholes", worst < 1e-3, ot::fmt("largest difference from the host's price %g", worst));
  cudaFree(ds), cudaFree(dx), cudaFree(dt), cudaFree(dcall), cudaFree(dput);
}

void Histogram() {
  const int n = 1 << 24;
  std::vector<unsigned char> in(n);
  std::vector<unsigned> want(256, 0);
  for (int i = 0; i < n; ++i) ++want[in[i] = static_cast<unsigned char>((i * 2654435761u) >> 24)];
  unsigned char* din = Device(in);
  unsigned* dbins;
  CUDA_OK(cudaMalloc(&dbins, 256 * 4));
  Timed("histogram", [&] {
    CUDA_OK(cudaMemset(dbins, 0, 256 * 4));  // each launch counts from zero
    histogram<<<240, 256>>>(din, dbins, n);
  });
  const auto bins = Host(dbins, 256);
  ot::check_kernel("histogram", bins == want, "some bin's count differs from the host's");
  cudaFree(din), cudaFree(dbins);
}

}  // namespace

int main(int argc, char** argv) {
  ot::detect_device();
  const std::string mode = argc > 1 ? argv[1] : "all";
  if (argc > 2) g_launches = std::max(1, std::atoi(argv[2]));
  const bool all = mode == "all";
  if (all || mode == "matmul") Matmul();
  if (all || mode == "reduce") Reduce();
  if (all || mode == "scan") Scan();
  if (all || mode == "transpose") Transpose();
  if (all || mode == "blackscholes") BlackScholes();
  if (all || mode == "histogram") Histogram();
  return ot::finish();
}
