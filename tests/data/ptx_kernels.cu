#include <cstdio>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
#include "../cuda/kernels_common.cuh"

__global__ void reduce(const int* in, int* out, int n) {
  int v = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) v += in[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
  __shared__ int ws[32];
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? ws[threadIdx.x] : 0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    if (threadIdx.x == 0) atomicAdd(out, v);
  }
}
__global__ void pr(int x, double d) { printf("hello %d %f from %d\n", x, d, threadIdx.x); }
struct S {
  int a;
  double b;
  char c[3];
};
__global__ void st(S s, double* o) { o[threadIdx.x] = s.a + s.b + s.c[1] + sqrt((double)threadIdx.x); }
__global__ void hf(const __half* a, __half* b, int n) {
  int i = threadIdx.x;
  if (i < n) b[i] = __hadd(a[i], __float2half(1.5f)) * a[i];
}
__global__ void asrt(int x) { assert(x != threadIdx.x); }
__global__ void coop(int* d, int n) {
  cg::grid_group g = cg::this_grid();
  d[g.thread_rank()] = 1;
  g.sync();
  if (g.thread_rank() == 0) {
    int s = 0;
    for (int i = 0; i < n; i++) s += d[i];
    d[0] = s;
  }
}
__global__ void scan(int* d) {
  __shared__ int t[256];
  int i = threadIdx.x;
  t[i] = d[i];
  __syncthreads();
  for (int o = 1; o < 256; o <<= 1) {
    int v = i >= o ? t[i - o] : 0;
    __syncthreads();
    t[i] += v;
    __syncthreads();
  }
  d[i] = t[i];
}
__global__ void math(float* f) {
  int i = threadIdx.x;
  f[i] = sinf(f[i]) + expf(f[i]) + __fdividef(1.f, f[i] + 1) + rsqrtf(f[i] + 2) + tanhf(f[i]);
}
// Texture and surface objects (tex / suld / sust in unified mode).
__global__ void tex_fetch(cudaTextureObject_t t, float* o, int n) {
  int i = threadIdx.x;
  if (i < n) o[i] = tex1Dfetch<float>(t, i - 2);
}
__global__ void tex_2d(cudaTextureObject_t t, float* o, const float2* xy, int n) {
  int i = threadIdx.x;
  if (i < n) o[i] = tex2D<float>(t, xy[i].x, xy[i].y);
}
__global__ void tex_2d4(cudaTextureObject_t t, float4* o, const float2* xy, int n) {
  int i = threadIdx.x;
  if (i < n) o[i] = tex2D<float4>(t, xy[i].x, xy[i].y);
}
__global__ void tex_2du8(cudaTextureObject_t t, uchar4* o, const float2* xy, int n) {
  int i = threadIdx.x;
  if (i < n) o[i] = tex2D<uchar4>(t, xy[i].x, xy[i].y);
}
__global__ void tex_3d(cudaTextureObject_t t, float* o, const float4* xyz, int n) {
  int i = threadIdx.x;
  if (i < n) o[i] = tex3D<float>(t, xyz[i].x, xyz[i].y, xyz[i].z);
}
__global__ void surf_scale(cudaSurfaceObject_t s) {
  int x = threadIdx.x, y = blockIdx.x;
  float v = surf2Dread<float>(s, x * 4, y);
  surf2Dwrite(v * 2.0f + 1.0f, s, x * 4, y);
}
__global__ void surf_rgba(cudaSurfaceObject_t s) {
  int x = threadIdx.x;
  surf1Dwrite(make_uchar4(x, x + 1, x + 2, 255 - x), s, x * 4);
}
__global__ void surf_modes(cudaSurfaceObject_t s, int* o, int x, int y) {
  o[0] = surf2Dread<int>(s, x * 4, y, cudaBoundaryModeClamp);
  o[1] = surf2Dread<int>(s, x * 4, y, cudaBoundaryModeZero);
  surf2Dwrite(-1, s, x * 4, y, cudaBoundaryModeZero);
}
__global__ void surf_trap(cudaSurfaceObject_t s, int x, int y) { surf2Dwrite(7, s, x * 4, y); }

// warpSize (nvcc writes it as the predefined WARP_SZ) and forward progress between the warps of a
// block: a warp spinning on memory that another warp writes must let that warp run.
__global__ void warp_size_lane(int* o) { o[threadIdx.x] = threadIdx.x / warpSize * 1000 + threadIdx.x % warpSize; }
__global__ void spin_until_set(int* o, int sleep) {
  __shared__ volatile int flag;
  if (threadIdx.x == 0) flag = 0;
  __syncthreads();
  if (threadIdx.x < 32) {
    while (flag == 0) {
      if (sleep) __nanosleep(100);
    }
    o[threadIdx.x] = flag;
  } else {
    if (threadIdx.x == 32) flag = 42;  // the second warp releases the first
    o[threadIdx.x] = -1;
  }
}
__global__ void warp_software_barrier(unsigned* count, unsigned* o) {
  if (threadIdx.x % 32 == 0) {
    atomicAdd(count, 1u);
    while (atomicAdd(count, 0u) < blockDim.x / 32) {
    }
  }
  __syncwarp();
  o[threadIdx.x] = atomicAdd(count, 0u);
}
