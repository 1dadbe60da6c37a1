// kernel_params.cu — kernel parameter marshalling.
//
// For every successful launch it prints
//   LAUNCH <mangled kernel name> grid=<x>,<y>,<z> block=<x>,<y>,<z> params=<hex>
// where <hex> is the parameter buffer the driver receives, computed here from the values and
// the C++ ABI layout: each parameter at its offset (aligned to alignof(T)), padding bytes 00,
// two lowercase hex digits per byte, from offset 0 to the end of the last parameter. Device
// pointers appear with their real values (little-endian). A harness compares these lines, in
// order, with the daemon's launch log. Failing launches print no LAUNCH line.
// The kernels write what they received to device memory; those results are checked on a real
// GPU only. The parameter layout is also checked against cuFuncGetParamInfo (the driver's view).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "orion_test.h"

using ot::check;
using ot::fmt;

struct Params {
  int a;
  double b;
  char c[5];
  short d;
};
static_assert(offsetof(Params, a) == 0 && offsetof(Params, b) == 8 && offsetof(Params, c) == 16 &&
                  offsetof(Params, d) == 22 && sizeof(Params) == 24 && alignof(Params) == 8,
              "Params layout");

__device__ unsigned linear_gid(unsigned* total) {
  unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned tpb = blockDim.x * blockDim.y * blockDim.z;
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  *total = tpb * gridDim.x * gridDim.y * gridDim.z;
  return bx * tpb + t;
}

// out[gid] = scale * gid for gid < n; ((int*)out)[total threads] = n.
__global__ void k_ptr_scalar(float* out, int n, float scale) {
  unsigned total;
  unsigned gid = linear_gid(&total);
  if ((int)gid < n) out[gid] = scale * (float)gid;
  if (gid == 0) reinterpret_cast<int*>(out)[total] = n;
}

__global__ void k_struct(Params p, int* out, unsigned long long tag) {
  extern __shared__ int dyn_smem[];
  unsigned dyn;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  dyn_smem[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    long long bb = __double_as_longlong(p.b);
    out[0] = p.a;
    out[1] = (int)bb;
    out[2] = (int)(bb >> 32);
    for (int i = 0; i < 5; ++i) out[3 + i] = p.c[i];
    out[8] = p.d;
    out[9] = (int)tag;
    out[10] = (int)(tag >> 32);
    out[11] = (int)dyn;
    out[12] = gridDim.x;
    out[13] = blockDim.x + dyn_smem[blockDim.x - 1];  // 2*blockDim.x - 1
  }
}

__global__ void k_mixed(char p0, short p1, int p2, long long p3, float p4, double p5, unsigned char p6,
                        unsigned long long* p7, float4 p8, bool p9, unsigned short p10, double p11) {
  unsigned total;
  if (linear_gid(&total) != 0) return;
  p7[0] = (unsigned char)p0;
  p7[1] = (unsigned short)p1;
  p7[2] = (unsigned int)p2;
  p7[3] = (unsigned long long)p3;
  p7[4] = __float_as_uint(p4);
  p7[5] = (unsigned long long)__double_as_longlong(p5);
  p7[6] = p6;
  p7[7] = __float_as_uint(p8.x) | ((unsigned long long)__float_as_uint(p8.y) << 32);
  p7[8] = __float_as_uint(p8.z) | ((unsigned long long)__float_as_uint(p8.w) << 32);
  p7[9] = p9 ? 1 : 0;
  p7[10] = p10;
  p7[11] = (unsigned long long)__double_as_longlong(p11);
  p7[12] = gridDim.x * 10000 + gridDim.y * 100 + gridDim.z;
  p7[13] = blockDim.x * 10000 + blockDim.y * 100 + blockDim.z;
}

// Mangled names (Itanium ABI), as they appear in the cubin and the daemon's launch log.
static const char* kPtrScalarName = "_Z12k_ptr_scalarPfif";
static const char* kStructName = "_Z8k_struct6ParamsPiy";
static const char* kMixedName = "_Z7k_mixedcsixfdhPy6float4btd";

static void print_launch(const char* name, dim3 g, dim3 b, const ot::ParamBuf& pb) {
  printf("LAUNCH %s grid=%u,%u,%u block=%u,%u,%u params=%s\n", name, g.x, g.y, g.z, b.x, b.y, b.z, pb.hex().c_str());
}

template <class T>
static unsigned long long bits(T v) {
  unsigned long long r = 0;
  memcpy(&r, &v, sizeof v);
  return r;
}

// Compares the driver's cuFuncGetParamInfo with the layout in `pb`.
static void check_param_info(const char* label, const void* kernel, const ot::ParamBuf& pb) {
  typedef CUresult (*GetParamInfo)(CUfunction, size_t, size_t*, size_t*);
  void* fp = nullptr;
  cudaDriverEntryPointQueryResult qr = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion("cuFuncGetParamInfo", &fp, 12040, cudaEnableDefault, &qr);
  if (e != cudaSuccess || qr != cudaDriverEntryPointSuccess || !fp) {
    cudaGetLastError();
    check(fmt("paraminfo_%s", label), false,
          fmt("cuFuncGetParamInfo not available: %s query=%d", cudaGetErrorName(e), (int)qr));
    return;
  }
  cudaFunction_t f = nullptr;
  CUDA_OK(cudaGetFuncBySymbol(&f, kernel));
  std::string bad;
  for (size_t i = 0; i < pb.offsets.size(); ++i) {
    size_t off = ~(size_t)0, sz = ~(size_t)0;
    CUresult r = ((GetParamInfo)fp)((CUfunction)f, i, &off, &sz);
    if (r != CUDA_SUCCESS || off != pb.offsets[i] || sz != pb.sizes[i]) {
      bad = fmt("param %zu: result=%d offset=%zu size=%zu want offset=%zu size=%zu", i, (int)r, off, sz, pb.offsets[i],
                pb.sizes[i]);
      break;
    }
  }
  if (bad.empty()) {
    size_t off = 0, sz = 0;
    CUresult r = ((GetParamInfo)fp)((CUfunction)f, pb.offsets.size(), &off, &sz);
    if (r != CUDA_ERROR_INVALID_VALUE)
      bad = fmt("index %zu (one past the last) -> %d, want 1", pb.offsets.size(), (int)r);
  }
  check(fmt("paraminfo_%s", label), bad.empty(), bad);
}

int main() {
  ot::detect_device();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // ---- 1. k_ptr_scalar<<<(3,2,1), (32,4,1), 0, s>>> -----------------------------------------
  const dim3 g1(3, 2, 1), b1(32, 4, 1);
  const unsigned total1 = 3 * 2 * 32 * 4;
  float* out1 = nullptr;
  CUDA_OK(cudaMalloc((void**)&out1, (total1 + 1) * sizeof(float)));
  CUDA_OK(cudaMemset(out1, 0xFF, (total1 + 1) * sizeof(float)));
  const int n1 = 0x1234567;
  const float scale1 = 2.5f;
  k_ptr_scalar<<<g1, b1, 0, s>>>(out1, n1, scale1);
  CUDA_OK(cudaGetLastError());
  ot::ParamBuf pb1;
  pb1.add(out1);
  pb1.add(n1);
  pb1.add(scale1);
  print_launch(kPtrScalarName, g1, b1, pb1);
  check("layout_k_ptr_scalar", pb1.bytes.size() == 16 && pb1.offsets[1] == 8 && pb1.offsets[2] == 12,
        fmt("size=%zu", pb1.bytes.size()));

  // ---- 2. k_struct<<<(2,1,1), (3,1,1), 128, s>>> --------------------------------------------
  Params p;
  memset(&p, 0, sizeof p);  // padding bytes are 00 in the buffer the driver copies
  p.a = 0x11223344;
  p.b = 1.5;
  memcpy(p.c, "abcd", 5);
  p.d = 0x7788;
  const unsigned long long tag = 0xDEADBEEFCAFEF00Dull;
  int* out2 = nullptr;
  CUDA_OK(cudaMalloc((void**)&out2, 16 * sizeof(int)));
  CUDA_OK(cudaMemset(out2, 0, 16 * sizeof(int)));
  const dim3 g2(2, 1, 1), b2(3, 1, 1);
  k_struct<<<g2, b2, 128, s>>>(p, out2, tag);
  CUDA_OK(cudaGetLastError());
  ot::ParamBuf pb2;
  pb2.add(p);
  pb2.add(out2);
  pb2.add(tag);
  print_launch(kStructName, g2, b2, pb2);
  check(
      "layout_k_struct",
      pb2.bytes.size() == 40 && pb2.offsets[1] == 24 && pb2.offsets[2] == 32 && pb2.bytes[4] == 0 && pb2.bytes[21] == 0,
      fmt("size=%zu", pb2.bytes.size()));

  // ---- 3. k_mixed<<<(2,3,4), (8,4,2), 64, 0>>> -------------------------------------------------
  unsigned long long* out3 = nullptr;
  CUDA_OK(cudaMalloc((void**)&out3, 16 * sizeof(unsigned long long)));
  CUDA_OK(cudaMemset(out3, 0, 16 * sizeof(unsigned long long)));
  const char m0 = 'Z';
  const short m1 = (short)0xBEEF;
  const int m2 = 0x0A0B0C0D;
  const long long m3 = 0x1122334455667788ll;
  const float m4 = 3.25f;
  const double m5 = -2.0e10;
  const unsigned char m6 = 0xA5;
  const float4 m8 = make_float4(1.5f, -2.5f, 3.5f, 1e-3f);
  const bool m9 = true;
  const unsigned short m10 = 0xCAFE;
  const double m11 = 6.02214076e23;
  const dim3 g3(2, 3, 4), b3(8, 4, 2);
  k_mixed<<<g3, b3, 64, 0>>>(m0, m1, m2, m3, m4, m5, m6, out3, m8, m9, m10, m11);
  CUDA_OK(cudaGetLastError());
  ot::ParamBuf pb3;
  pb3.add(m0);
  pb3.add(m1);
  pb3.add(m2);
  pb3.add(m3);
  pb3.add(m4);
  pb3.add(m5);
  pb3.add(m6);
  pb3.add(out3);
  pb3.add(m8);
  pb3.add(m9);
  pb3.add(m10);
  pb3.add(m11);
  print_launch(kMixedName, g3, b3, pb3);
  {
    const size_t want_off[12] = {0, 2, 4, 8, 16, 24, 32, 40, 48, 64, 66, 72};
    bool ok = pb3.bytes.size() == 80;
    for (int i = 0; i < 12; ++i) ok = ok && pb3.offsets[i] == want_off[i];
    check("layout_k_mixed", ok, fmt("size=%zu", pb3.bytes.size()));
  }

  // ---- 4. cudaLaunchKernel with explicit args: k_ptr_scalar<<<(4,1,1), (64,1,1), 32, s>>> ----
  const dim3 g4(4, 1, 1), b4(64, 1, 1);
  const unsigned total4 = 4 * 64;
  float* out4 = nullptr;
  CUDA_OK(cudaMalloc((void**)&out4, (total4 + 1) * sizeof(float)));
  CUDA_OK(cudaMemset(out4, 0xFF, (total4 + 1) * sizeof(float)));
  int n4 = 100;
  float scale4 = -0.75f;
  {
    void* args[] = {&out4, &n4, &scale4};
    CUDA_OK(cudaLaunchKernel((const void*)k_ptr_scalar, g4, b4, args, 32, s));
  }
  ot::ParamBuf pb4;
  pb4.add(out4);
  pb4.add(n4);
  pb4.add(scale4);
  print_launch(kPtrScalarName, g4, b4, pb4);

  // ---- 5. cudaLaunchKernelEx: k_ptr_scalar<<<(1,1,2), (16,2,1), 0, s>>> ---------------------
  const dim3 g5(1, 1, 2), b5(16, 2, 1);
  const unsigned total5 = 2 * 16 * 2;
  float* out5 = nullptr;
  CUDA_OK(cudaMalloc((void**)&out5, (total5 + 1) * sizeof(float)));
  CUDA_OK(cudaMemset(out5, 0xFF, (total5 + 1) * sizeof(float)));
  const int n5 = 0x7FFFFFFF;
  const float scale5 = 0.125f;
  {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g5;
    cfg.blockDim = b5;
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    CUDA_OK(cudaLaunchKernelEx(&cfg, k_ptr_scalar, out5, n5, scale5));
  }
  ot::ParamBuf pb5;
  pb5.add(out5);
  pb5.add(n5);
  pb5.add(scale5);
  print_launch(kPtrScalarName, g5, b5, pb5);

  // ---- 6. Invalid configurations: no launch happens, no LAUNCH line --------------------------
  k_ptr_scalar<<<1, 2048, 0, s>>>(out1, 1, 1.0f);
  ot::expect_error("invalid_config_block_2048", cudaGetLastError(), cudaErrorInvalidConfiguration);
  {
    void* args[] = {&out4, &n4, &scale4};
    ot::expect_error("invalid_config_launchkernel_2048",
                     cudaLaunchKernel((const void*)k_ptr_scalar, dim3(1), dim3(2048), args, 0, s),
                     cudaErrorInvalidConfiguration);
  }
  k_ptr_scalar<<<1, dim3(1024, 2, 1), 0, s>>>(out1, 1, 1.0f);
  ot::expect_error("invalid_config_block_product", cudaGetLastError(), cudaErrorInvalidConfiguration);

  CUDA_OK(cudaStreamSynchronize(s));
  cudaError_t e = cudaDeviceSynchronize();
  check("synchronize_after_launches", e == cudaSuccess, cudaGetErrorName(e));

  // ---- Driver's view of the layouts -------------------------------------------------------------
  check_param_info("k_ptr_scalar", (const void*)k_ptr_scalar, pb1);
  check_param_info("k_struct", (const void*)k_struct, pb2);
  check_param_info("k_mixed", (const void*)k_mixed, pb3);

  // ---- Kernel results (real GPU only) -----------------------------------------------------------
  {
    std::vector<float> h(total1 + 1);
    CUDA_OK(cudaMemcpy(h.data(), out1, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    std::string bad;
    for (unsigned i = 0; i < total1 && bad.empty(); ++i)
      if (h[i] != scale1 * (float)i) bad = fmt("out[%u]=%g want %g", i, h[i], scale1 * (float)i);
    int nn;
    memcpy(&nn, &h[total1], 4);
    if (bad.empty() && nn != n1) bad = fmt("n=0x%x want 0x%x", nn, n1);
    ot::check_kernel("result_k_ptr_scalar", bad.empty(), bad);
  }
  {
    int h[16];
    CUDA_OK(cudaMemcpy(h, out2, sizeof h, cudaMemcpyDeviceToHost));
    unsigned long long bb = bits(p.b);
    int want[14] = {p.a, (int)bb, (int)(bb >> 32), 'a', 'b', 'c', 'd', 0, p.d, (int)tag, (int)(tag >> 32), 128, 2, 5};
    std::string bad;
    for (int i = 0; i < 14 && bad.empty(); ++i)
      if (h[i] != want[i]) bad = fmt("out[%d]=0x%x want 0x%x", i, h[i], want[i]);
    ot::check_kernel("result_k_struct", bad.empty(), bad);
  }
  {
    unsigned long long h[16];
    CUDA_OK(cudaMemcpy(h, out3, sizeof h, cudaMemcpyDeviceToHost));
    unsigned long long want[14] = {(unsigned char)m0,
                                   (unsigned short)m1,
                                   (unsigned int)m2,
                                   (unsigned long long)m3,
                                   bits(m4),
                                   bits(m5),
                                   m6,
                                   bits(m8.x) | (bits(m8.y) << 32),
                                   bits(m8.z) | (bits(m8.w) << 32),
                                   1,
                                   m10,
                                   bits(m11),
                                   20304,
                                   80402};
    std::string bad;
    for (int i = 0; i < 14 && bad.empty(); ++i)
      if (h[i] != want[i]) bad = fmt("out[%d]=0x%llx want 0x%llx", i, h[i], want[i]);
    ot::check_kernel("result_k_mixed", bad.empty(), bad);
  }
  {
    std::vector<float> h(total4 + 1);
    CUDA_OK(cudaMemcpy(h.data(), out4, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    std::string bad;
    for (unsigned i = 0; i < total4 && bad.empty(); ++i) {
      unsigned u;
      memcpy(&u, &h[i], 4);
      if ((int)i < n4 ? h[i] != scale4 * (float)i : u != 0xFFFFFFFFu) bad = fmt("out[%u] bits 0x%08x", i, u);
    }
    int nn;
    memcpy(&nn, &h[total4], 4);
    if (bad.empty() && nn != n4) bad = fmt("n=%d want %d", nn, n4);
    ot::check_kernel("result_launchkernel", bad.empty(), bad);
  }
  {
    std::vector<float> h(total5 + 1);
    CUDA_OK(cudaMemcpy(h.data(), out5, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    std::string bad;
    for (unsigned i = 0; i < total5 && bad.empty(); ++i)
      if (h[i] != scale5 * (float)i) bad = fmt("out[%u]=%g", i, h[i]);
    int nn;
    memcpy(&nn, &h[total5], 4);
    if (bad.empty() && nn != n5) bad = fmt("n=0x%x want 0x%x", nn, n5);
    ot::check_kernel("result_launchkernelex", bad.empty(), bad);
  }

  CUDA_OK(cudaFree(out1));
  CUDA_OK(cudaFree(out2));
  CUDA_OK(cudaFree(out3));
  CUDA_OK(cudaFree(out4));
  CUDA_OK(cudaFree(out5));
  CUDA_OK(cudaStreamDestroy(s));
  return ot::finish();
}
