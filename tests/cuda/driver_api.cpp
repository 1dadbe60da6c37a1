// driver_api.cpp — a pure CUDA driver API program (linked with -lcuda: the toolkit's stub at link
// time, Orion's libcuda.so.1 at run time through LD_LIBRARY_PATH).
//
// The module is driver_kernels.cu, compiled with `nvcc -fatbin` at build time and embedded as
// the array driver_kernels_fatbin (bin2c, header generated into the build directory).
//
// Prints, besides CHECK lines:
//   DEVICE name=<name> sim=<0|1>
//   PROP totalMem=<bytes> major=<m> minor=<n> driverVersion=<v>
//   LAUNCH <kernel> grid=<x>,<y>,<z> block=<x>,<y>,<z> params=<hex>   (same format as kernel_params)
// On error: CUDA_ERROR <name> <code> <file>:<line> <expression>, exit 2.
#include <cuda.h>

#include <vector>

#include "driver_kernels_fatbin.h"
#include "orion_test.h"

using ot::check;
using ot::fmt;

static const char* err_name(CUresult r) {
  const char* s = nullptr;
  if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) return "CUDA_ERROR_UNKNOWN_CODE";
  return s;
}

#define CU_OK(expr)                                                                            \
  do {                                                                                         \
    CUresult r_ = (expr);                                                                      \
    if (r_ != CUDA_SUCCESS) {                                                                  \
      printf("CUDA_ERROR %s %d %s:%d %s\n", err_name(r_), (int)r_, __FILE__, __LINE__, #expr); \
      fflush(stdout);                                                                          \
      exit(2);                                                                                 \
    }                                                                                          \
  } while (0)

static void print_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         const ot::ParamBuf& pb) {
  printf("LAUNCH %s grid=%u,%u,%u block=%u,%u,%u params=%s\n", name, gx, gy, gz, bx, by, bz, pb.hex().c_str());
}

static void check_param_info(const char* label, CUfunction f, const ot::ParamBuf& pb) {
  std::string bad;
  for (size_t i = 0; i < pb.offsets.size() && bad.empty(); ++i) {
    size_t off = ~(size_t)0, sz = ~(size_t)0;
    CUresult r = cuFuncGetParamInfo(f, i, &off, &sz);
    if (r != CUDA_SUCCESS || off != pb.offsets[i] || sz != pb.sizes[i])
      bad = fmt("param %zu: %s offset=%zu size=%zu want offset=%zu size=%zu", i, err_name(r), off, sz, pb.offsets[i],
                pb.sizes[i]);
  }
  if (bad.empty()) {
    size_t off = 0, sz = 0;
    CUresult r = cuFuncGetParamInfo(f, pb.offsets.size(), &off, &sz);
    if (r != CUDA_ERROR_INVALID_VALUE)
      bad = fmt("one past the last param -> %s, want CUDA_ERROR_INVALID_VALUE", err_name(r));
  }
  check(fmt("paraminfo_%s", label), bad.empty(), bad);
}

static std::vector<int> dtoh_ints(CUdeviceptr d, size_t n) {
  std::vector<int> v(n);
  CU_OK(cuMemcpyDtoH(v.data(), d, n * sizeof(int)));
  return v;
}

int main() {
  ot::init_output();
  CU_OK(cuInit(0));
  int drv = 0;
  CU_OK(cuDriverGetVersion(&drv));
  int count = 0;
  CU_OK(cuDeviceGetCount(&count));
  check("device_count", count >= 1, fmt("count=%d", count));
  CUdevice dev;
  CU_OK(cuDeviceGet(&dev, 0));
  char name[256] = {0};
  CU_OK(cuDeviceGetName(name, sizeof name, dev));
  ot::is_sim() = ot::name_is_sim(name);
  printf("DEVICE name=%s sim=%d\n", name, ot::is_sim() ? 1 : 0);
  size_t total = 0;
  CU_OK(cuDeviceTotalMem(&total, dev));
  int major = 0, minor = 0;
  CU_OK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CU_OK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  printf("PROP totalMem=%zu major=%d minor=%d driverVersion=%d\n", total, major, minor, drv);
  check("device_name", name[0] != 0, "empty");
  check("total_mem", total > 0, "0");
  if (const char* q = getenv("ORION_GMEM"))
    check("quota_total_mem", total == (size_t)strtoull(q, nullptr, 10) << 20,
          fmt("total=%zu ORION_GMEM=%s MiB", total, q));

  // ---- A created context: make current, use, destroy ------------------------------------------
  {
    CUcontext c2 = nullptr, cur = nullptr;
    CU_OK(cuCtxCreate(&c2, nullptr, 0, dev));
    CU_OK(cuCtxGetCurrent(&cur));
    check("ctx_create_current", cur == c2 && c2 != nullptr, "cuCtxCreate did not make the context current");
    CUdeviceptr d;
    CU_OK(cuMemAlloc(&d, 1000 * sizeof(int)));
    CU_OK(cuMemsetD32(d, 0x01020304u, 1000));
    std::vector<int> v = dtoh_ints(d, 1000);
    bool ok = true;
    for (int x : v) ok = ok && x == 0x01020304;
    check("ctx_create_memset", ok, "wrong contents");
    CU_OK(cuMemFree(d));
    CU_OK(cuCtxDestroy(c2));
  }

  // ---- Primary context ----------------------------------------------------------------------------
  CUcontext ctx = nullptr, cur = nullptr;
  CU_OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU_OK(cuCtxSetCurrent(ctx));
  CU_OK(cuCtxGetCurrent(&cur));
  CUdevice cdev = -1;
  CU_OK(cuCtxGetDevice(&cdev));
  check("primary_ctx_current", cur == ctx && cdev == dev,
        fmt("current=%p ctx=%p device=%d", (void*)cur, (void*)ctx, (int)cdev));

  size_t fr = 0, tot = 0;
  CU_OK(cuMemGetInfo(&fr, &tot));
  check("meminfo", tot == total && fr <= tot, fmt("free=%zu total=%zu deviceTotal=%zu", fr, tot, total));

  // ---- Module ------------------------------------------------------------------------------------
  CUmodule mod;
  CU_OK(cuModuleLoadData(&mod, driver_kernels_fatbin));
  CUfunction ffill, faxpy, fnone = nullptr;
  CU_OK(cuModuleGetFunction(&ffill, mod, "drv_fill"));
  CU_OK(cuModuleGetFunction(&faxpy, mod, "drv_axpy"));
  CUresult r = cuModuleGetFunction(&fnone, mod, "drv_no_such_kernel");
  check("get_function_not_found", r == CUDA_ERROR_NOT_FOUND, fmt("got %s", err_name(r)));

  // ---- Memory ------------------------------------------------------------------------------------
  const int N = 1024;
  CUdeviceptr d1, d2, d3;
  CU_OK(cuMemAlloc(&d1, N * sizeof(int)));
  CU_OK(cuMemAlloc(&d2, N * sizeof(int)));
  CU_OK(cuMemAlloc(&d3, N * sizeof(int)));
  {
    std::vector<int> h(N), back(N, 0);
    for (int i = 0; i < N; ++i) h[i] = i * 2654435761u;
    CU_OK(cuMemcpyHtoD(d1, h.data(), N * sizeof(int)));
    CU_OK(cuMemcpyDtoH(back.data(), d1, N * sizeof(int)));
    check("memcpy_htod_dtoh", back == h, ot::diff_details(back.data(), h.data(), N * sizeof(int)));
    CU_OK(cuMemcpyDtoD(d2, d1, N * sizeof(int)));
    back = dtoh_ints(d2, N);
    check("memcpy_dtod", back == h, ot::diff_details(back.data(), h.data(), N * sizeof(int)));
  }
  CU_OK(cuMemsetD32(d1, 0xDEADBEEFu, N));
  CU_OK(cuMemsetD32(d2, 0xDEADBEEFu, N));
  CU_OK(cuMemsetD32(d3 + 4 * 3, 0xA5A5A5A5u, 5));
  {
    std::vector<int> v = dtoh_ints(d1, N);
    bool ok = true;
    for (int x : v) ok = ok && (unsigned)x == 0xDEADBEEFu;
    check("memset_d32", ok, "wrong contents");
    v = dtoh_ints(d3, 8);
    ok = true;
    for (int i = 3; i < 8; ++i) ok = ok && (unsigned)v[i] == 0xA5A5A5A5u;
    check("memset_d32_offset", ok, "wrong contents");
  }
  CU_OK(cuMemsetD8(d3, 0x00, N * sizeof(int)));

  // ---- Module globals -------------------------------------------------------------------------
  CUdeviceptr g = 0, gi = 0;
  size_t gbytes = 0, gibytes = 0;
  CU_OK(cuModuleGetGlobal(&g, &gbytes, mod, "drv_global"));
  CU_OK(cuModuleGetGlobal(&gi, &gibytes, mod, "drv_init"));
  check("global_sizes", gbytes == 16 * sizeof(int) && gibytes == 4 * sizeof(int) && g && gi,
        fmt("drv_global=%zu bytes drv_init=%zu bytes", gbytes, gibytes));
  int gvals[16];
  for (int i = 0; i < 16; ++i) gvals[i] = i - 7;
  CU_OK(cuMemcpyHtoD(g, gvals, sizeof gvals));
  {
    int back[16] = {0};
    CU_OK(cuMemcpyDtoH(back, g, sizeof back));
    check("global_write_read", memcmp(back, gvals, sizeof gvals) == 0, ot::diff_details(back, gvals, sizeof gvals));
    int init[4] = {0};
    CU_OK(cuMemcpyDtoH(init, gi, sizeof init));
    const int want[4] = {11, 22, 33, 44};
    check("global_initializer", memcmp(init, want, sizeof want) == 0,
          fmt("drv_init = {%d,%d,%d,%d} want {11,22,33,44}", init[0], init[1], init[2], init[3]));
  }

  // ---- Parameter layout as the driver sees it ------------------------------------------------
  CUstream st;
  CU_OK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CUevent ev0, ev1;
  CU_OK(cuEventCreate(&ev0, CU_EVENT_DEFAULT));
  CU_OK(cuEventCreate(&ev1, CU_EVENT_DEFAULT));

  // Launch 1: drv_fill, kernelParams form.
  int n1 = 600, val1 = 0x100;
  ot::ParamBuf pf1;
  pf1.add(d1);
  pf1.add(n1);
  pf1.add(val1);
  check_param_info("drv_fill", ffill, pf1);
  CU_OK(cuEventRecord(ev0, st));
  {
    void* params[] = {&d1, &n1, &val1};
    CU_OK(cuLaunchKernel(ffill, 5, 1, 1, 128, 1, 1, 0, st, params, nullptr));
  }
  print_launch("drv_fill", 5, 1, 1, 128, 1, 1, pf1);

  // Launch 2: drv_axpy, CU_LAUNCH_PARAM_BUFFER_POINTER form; reads d1 written by launch 1.
  const long long add2 = 0x100000007ll;  // (int)add2 == 7
  const int n2 = 500, tag2 = -3;
  ot::ParamBuf pa;
  pa.add(d1);
  pa.add(d2);
  pa.add(add2);
  pa.add(n2);
  pa.add(tag2);
  check_param_info("drv_axpy", faxpy, pa);
  check("layout_drv_axpy", pa.bytes.size() == 32 && pa.offsets[2] == 16 && pa.offsets[3] == 24 && pa.offsets[4] == 28,
        fmt("size=%zu", pa.bytes.size()));
  {
    std::vector<uint8_t> buf = pa.bytes;
    size_t size = buf.size();
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    CU_OK(cuLaunchKernel(faxpy, 2, 2, 1, 16, 8, 1, 16, st, nullptr, extra));
  }
  print_launch("drv_axpy", 2, 2, 1, 16, 8, 1, pa);
  CU_OK(cuEventRecord(ev1, st));

  // Launch 3: drv_fill again, buffer form, on the NULL stream.
  int n3 = 64, val3 = -5;
  ot::ParamBuf pf3;
  pf3.add(d3);
  pf3.add(n3);
  pf3.add(val3);
  {
    std::vector<uint8_t> buf = pf3.bytes;
    size_t size = buf.size();
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    CU_OK(cuLaunchKernel(ffill, 1, 1, 1, 64, 1, 1, 0, nullptr, nullptr, extra));
  }
  print_launch("drv_fill", 1, 1, 1, 64, 1, 1, pf3);

  // An invalid block size fails and launches nothing.
  {
    void* params[] = {&d1, &n1, &val1};
    r = cuLaunchKernel(ffill, 1, 1, 1, 2048, 1, 1, 0, st, params, nullptr);
    check("invalid_block_2048", r != CUDA_SUCCESS, fmt("got %s", err_name(r)));
  }

  CU_OK(cuEventSynchronize(ev1));
  r = cuEventQuery(ev1);
  check("event_query_after_sync", r == CUDA_SUCCESS, err_name(r));
  float ms = -1.0f;
  CU_OK(cuEventElapsedTime(&ms, ev0, ev1));
  check("event_elapsed_nonnegative", ms >= 0.0f, fmt("%f ms", ms));
  CU_OK(cuStreamSynchronize(st));
  r = cuStreamQuery(st);
  check("stream_query_after_sync", r == CUDA_SUCCESS, err_name(r));
  CU_OK(cuCtxSynchronize());

  // ---- Kernel results (real GPU only) ---------------------------------------------------------
  {
    std::vector<int> v = dtoh_ints(d1, N);
    std::string bad;
    for (int i = 0; i < N && bad.empty(); ++i) {
      int want = i < n1 ? val1 + i : (int)0xDEADBEEFu;
      if (v[i] != want) bad = fmt("d1[%d]=%d want %d", i, v[i], want);
    }
    ot::check_kernel("result_drv_fill", bad.empty(), bad);
    v = dtoh_ints(d2, N);
    bad.clear();
    const int init[4] = {11, 22, 33, 44};
    for (int i = 0; i < N && bad.empty(); ++i) {
      int want = i < n2 ? (val1 + i) * gvals[i % 16] + init[i % 4] + 7 + tag2 : (int)0xDEADBEEFu;
      if (v[i] != want) bad = fmt("d2[%d]=%d want %d", i, v[i], want);
    }
    ot::check_kernel("result_drv_axpy_extra", bad.empty(), bad);
    v = dtoh_ints(d3, N);
    bad.clear();
    for (int i = 0; i < N && bad.empty(); ++i) {
      int want = i < n3 ? val3 + i : 0;
      if (v[i] != want) bad = fmt("d3[%d]=%d want %d", i, v[i], want);
    }
    ot::check_kernel("result_drv_fill_extra", bad.empty(), bad);
  }

  // ---- Teardown ----------------------------------------------------------------------------------
  CU_OK(cuEventDestroy(ev0));
  CU_OK(cuEventDestroy(ev1));
  CU_OK(cuStreamDestroy(st));
  CU_OK(cuMemFree(d1));
  CU_OK(cuMemFree(d2));
  CU_OK(cuMemFree(d3));
  r = cuModuleUnload(mod);
  check("module_unload", r == CUDA_SUCCESS, err_name(r));
  CU_OK(cuCtxSynchronize());
  CU_OK(cuDevicePrimaryCtxRelease(dev));
  return ot::finish();
}
