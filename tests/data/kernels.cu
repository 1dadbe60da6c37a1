// Fixture source for fatbin/src/fatbin_test.cpp. Compiled at test build time by nvcc (see
// fatbin/CMakeLists.txt) into fatbins, a cubin and PTX. The test asserts the parameter layouts the C++
// ABI gives these signatures, so keep the two files in step.
#include <cstdint>

struct S {  // sizeof 24, alignof 8: a@0, b@8, c@16
  int a;
  double b;
  char c[5];
};
struct __align__(16) A16 {
  float x, y, z, w;
};  // sizeof 16, alignof 16
struct Huge {
  char x[20000];
};  // > 4 KiB of params: EIATTR_KPARAM_INFO_V2 (0x45)

__device__ int dvar[10];        // 40 bytes, .nv.global
__constant__ float cvar[7];     // 28 bytes, .nv.constant3
__device__ double dinit = 3.0;  // 8 bytes, initialised: .nv.global.init
__managed__ int mvar;           // 4 bytes

extern "C" __global__ void k_ptr(float* p) { p[0] = cvar[1] + static_cast<float>(dinit); }
__global__ void k_int(int x) { dvar[0] = x; }
__global__ void k_float(float x) { dvar[1] = static_cast<int>(x); }
__global__ void k_struct(S s) { dvar[2] = s.a + s.c[4] + static_cast<int>(s.b); }
__global__ void k_mixed(int* p, int i, float f, S s, char c) { p[0] = i + static_cast<int>(f) + s.a + c; }
__global__ void k_many(char a, short b, int c, long long d, double e, char f, float* g, S h, char i) {
  g[0] = static_cast<float>(a + b + c + d + e + f + h.a + i + dvar[0] + cvar[1] + mvar);
}
__global__ void k_align(char a, A16 v, char b, double2 d, float* p) { p[0] = a + v.x + b + static_cast<float>(d.y); }
__global__ void k_huge(char a, Huge h, int c, float* p) { p[0] = a + h.x[19999] + c; }
__global__ void k_empty() {}
template <typename T>
__global__ void k_tmpl(T* p, T v) {
  p[0] = v;
}
template __global__ void k_tmpl<int>(int*, int);
template __global__ void k_tmpl<double>(double*, double);
__device__ __noinline__ int helper(int x) { return x * 3; }  // not a kernel
__global__ void k_call(int* p) { p[0] = helper(p[1]); }
