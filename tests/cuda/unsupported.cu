// unsupported.cu — graphics-interop entry points, which a remoting driver does not implement,
// must fail with CUDA_ERROR_NOT_SUPPORTED / cudaErrorNotSupported (801) instead of succeeding,
// and must leave the context usable.
//
// Prints, for each function tried:
//   UNSUPPORTED <function> -> <numeric code> <error name>
//   UNSUPPORTED <function> -> not-found          (driver symbol not exported by cuGetProcAddress)
// The handles passed are bogus: a remoting driver must refuse before touching them.
#include <cuda.h>
#include <cuda_runtime.h>

#include <vector>

#include "orion_test.h"

using ot::check;
using ot::fmt;

static void runtime_call(const char* fn, cudaError_t e) {
  cudaGetLastError();
  printf("UNSUPPORTED %s -> %d %s\n", fn, (int)e, cudaGetErrorName(e));
  check(fmt("runtime_%s", fn), e == cudaErrorNotSupported,
        fmt("got %s (%d) want cudaErrorNotSupported (801)", cudaGetErrorName(e), (int)e));
}

static CUresult cuGetErrorName_fp(CUresult r, const char** s) {
  typedef CUresult (*Fn)(CUresult, const char**);
  static Fn fn = nullptr;
  if (!fn) {
    void* fp = nullptr;
    cudaDriverEntryPointQueryResult qr;
    if (cudaGetDriverEntryPointByVersion("cuGetErrorName", &fp, 6000, cudaEnableDefault, &qr) != cudaSuccess ||
        qr != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return CUDA_ERROR_NOT_FOUND;
    }
    fn = (Fn)fp;
  }
  return fn(r, s);
}

// Looks the driver function up through cuGetProcAddress (via the runtime) and calls it.
// A symbol that is not exported at all is also accepted (reported as not-found).
template <class Fn, class Call>
static void driver_call(const char* fn, int version, Call call) {
  void* fp = nullptr;
  cudaDriverEntryPointQueryResult qr = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion(fn, &fp, version, cudaEnableDefault, &qr);
  cudaGetLastError();
  if (e != cudaSuccess || qr != cudaDriverEntryPointSuccess || fp == nullptr) {
    printf("UNSUPPORTED %s -> not-found\n", fn);
    check(fmt("driver_%s", fn), qr == cudaDriverEntryPointSymbolNotFound,
          fmt("lookup: %s query=%d", cudaGetErrorName(e), (int)qr));
    return;
  }
  CUresult r = call((Fn)fp);
  const char* name = nullptr;
  if (cuGetErrorName_fp(r, &name) != CUDA_SUCCESS || !name) name = "?";
  printf("UNSUPPORTED %s -> %d %s\n", fn, (int)r, name);
  check(fmt("driver_%s", fn), r == CUDA_ERROR_NOT_SUPPORTED, fmt("got %d (%s) want 801", (int)r, name));
}

int main() {
  ot::detect_device();
  CUDA_OK(cudaFree(nullptr));  // make sure the context exists

  cudaGraphicsResource_t bogus = reinterpret_cast<cudaGraphicsResource_t>(0x1000);
  runtime_call("cudaGraphicsMapResources", cudaGraphicsMapResources(1, &bogus, 0));
  void* mp = nullptr;
  size_t msz = 0;
  runtime_call("cudaGraphicsResourceGetMappedPointer", cudaGraphicsResourceGetMappedPointer(&mp, &msz, bogus));
  runtime_call("cudaGraphicsUnmapResources", cudaGraphicsUnmapResources(1, &bogus, 0));

  CUgraphicsResource cbogus = reinterpret_cast<CUgraphicsResource>(0x1000);
  typedef CUresult (*MapFn)(unsigned int, CUgraphicsResource*, CUstream);
  typedef CUresult (*PtrFn)(CUdeviceptr*, size_t*, CUgraphicsResource);
  driver_call<MapFn>("cuGraphicsMapResources", 3000, [&](MapFn f) { return f(1, &cbogus, nullptr); });
  driver_call<PtrFn>("cuGraphicsResourceGetMappedPointer", 3020, [&](PtrFn f) {
    CUdeviceptr p = 0;
    size_t s = 0;
    return f(&p, &s, cbogus);
  });
  driver_call<MapFn>("cuGraphicsUnmapResources", 3000, [&](MapFn f) { return f(1, &cbogus, nullptr); });

  // The context is still usable afterwards.
  std::vector<unsigned char> h(4096), back(4096, 0);
  for (size_t i = 0; i < h.size(); ++i) h[i] = (unsigned char)(i * 13 + 1);
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, h.size()));
  CUDA_OK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(back.data(), d, h.size(), cudaMemcpyDeviceToHost));
  check("usable_after_unsupported", back == h, ot::diff_details(back.data(), h.data(), h.size()));
  CUDA_OK(cudaFree(d));
  cudaError_t e = cudaDeviceSynchronize();
  check("synchronize_after_unsupported", e == cudaSuccess, cudaGetErrorName(e));
  return ot::finish();
}
