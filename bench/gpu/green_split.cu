// bench/gpu/green_split.cu — does a green context confine a kernel to its SMs on this GPU and driver?
//
// The question behind issue #21 item 3 (a `cap` session as a spatial partition): before the cuda
// backend gives each capped session a green context, measure on the real device that
//   1. cuDeviceGetDevResource / cuDevSmResourceSplitByCount / cuDevResourceGenerateDesc /
//      cuGreenCtxCreate work here (CUDA >= 12.4; a gVisor or Firecracker sandbox may refuse them), and
//      what the SM granularity is (CUDA driver API, "Green Contexts": sm.minSmPartitionSize and
//      sm.smCoscheduledAlignment; 8 SMs on compute capability 9.0);
//   2. a compute-bound grid much larger than the GPU takes time inversely proportional to the SMs of
//      the context it runs in (full device against partitions of about 25% and 50%);
//   3. two green contexts run side by side each at the speed of their own partition.
// Kernels come from a context-independent library (cuLibraryLoadData), so one image serves every
// context. Output: one line per measurement, key=value, then "DONE ok" or "DONE FAIL <why>".
//
// Build: nvcc -O2 -arch=native -o green_split green_split.cu -lcuda
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

// A compute-bound block: `iters` dependent FMAs per thread, written out so they are not elided.
const char* kPtx = R"(
.version 8.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 out, .param .u32 iters) {
  .reg .pred %p;
  .reg .b32 %r<4>;
  .reg .f32 %f<4>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [iters];
  mov.u32 %r2, %tid.x;
  cvt.rn.f32.u32 %f1, %r2;
  mov.f32 %f2, 0f3F800000;
  mov.u32 %r3, 0;
LOOP:
  fma.rn.f32 %f1, %f1, 0f3F7FFFFE, %f2;
  add.u32 %r3, %r3, 1;
  setp.lt.u32 %p, %r3, %r1;
  @%p bra LOOP;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r2, 4;
  add.u64 %rd2, %rd2, %rd3;
  st.global.f32 [%rd2], %f1;
  ret;
}
)";

bool Check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::printf("error: %s -> %s (%d)\n", what, name ? name : "?", static_cast<int>(r));
  return false;
}
#define CK(x)                            \
  do {                                   \
    if (!Check((x), #x)) {               \
      std::printf("DONE FAIL %s\n", #x); \
      return 1;                          \
    }                                    \
  } while (0)

struct Part {
  CUgreenCtx green = nullptr;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  unsigned sms = 0;
};

}  // namespace

int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  char name[128] = {};
  cuDeviceGetName(name, sizeof name, dev);
  int driver = 0;
  cuDriverGetVersion(&driver);
  CUcontext primary;
  CK(cuDevicePrimaryCtxRetain(&primary, dev));
  CK(cuCtxSetCurrent(primary));
  CUdevResource all{};
  CK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  std::printf("device=\"%s\" driver=%d sm_count=%u min_partition=%u alignment=%u\n", name, driver, all.sm.smCount,
              all.sm.minSmPartitionSize, all.sm.smCoscheduledAlignment);

  CUlibrary lib;
  CK(cuLibraryLoadData(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kern;
  CK(cuLibraryGetKernel(&kern, lib, "spin"));
  CUdeviceptr out;
  CK(cuMemAlloc(&out, 1024 * sizeof(float)));

  const unsigned blocks = all.sm.smCount * 16;  // many waves on any partition
  unsigned iters = 20000;
  auto run = [&](CUcontext ctx, CUstream s, double* ms) -> bool {
    if (!Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent")) return false;
    CUevent a, b;
    if (!Check(cuEventCreate(&a, CU_EVENT_DEFAULT), "cuEventCreate") || !Check(cuEventCreate(&b, 0), "cuEventCreate"))
      return false;
    void* args[] = {&out, &iters};
    Check(cuEventRecord(a, s), "cuEventRecord");
    if (!Check(cuLaunchKernel(reinterpret_cast<CUfunction>(kern), blocks, 1, 1, 256, 1, 1, 0, s, args, nullptr),
               "cuLaunchKernel"))
      return false;
    Check(cuEventRecord(b, s), "cuEventRecord");
    if (!Check(cuEventSynchronize(b), "cuEventSynchronize")) return false;
    float f = 0;
    cuEventElapsedTime(&f, a, b);
    *ms = f;
    cuEventDestroy(a);
    cuEventDestroy(b);
    return true;
  };

  CUstream full_stream;
  CK(cuStreamCreate(&full_stream, CU_STREAM_NON_BLOCKING));
  double full_ms = 0, warm = 0;
  if (!run(primary, full_stream, &warm) || !run(primary, full_stream, &full_ms)) {
    std::printf("DONE FAIL full-device launch\n");
    return 1;
  }
  std::printf("context=full sms=%u blocks=%u iters=%u ms=%.3f\n", all.sm.smCount, blocks, iters, full_ms);

  // Partitions of about 25% and 50%: minCount rounded up to the alignment, as the cuda backend would.
  bool ok = true;
  std::vector<Part> parts;
  for (unsigned pct : {25u, 50u}) {
    const unsigned align = std::max(1u, all.sm.smCoscheduledAlignment);
    unsigned want = (all.sm.smCount * pct + 99) / 100;
    want = std::max(all.sm.minSmPartitionSize, (want + align - 1) / align * align);
    CUdevResource got{}, rest{};
    unsigned groups = 1;
    CK(cuDevSmResourceSplitByCount(&got, &groups, &all, &rest, 0, want));
    CUdevResourceDesc desc;
    CK(cuDevResourceGenerateDesc(&desc, &got, 1));
    Part p;
    CK(cuGreenCtxCreate(&p.green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CK(cuCtxFromGreenCtx(&p.ctx, p.green));
    CK(cuGreenCtxStreamCreate(&p.stream, p.green, CU_STREAM_NON_BLOCKING, 0));
    p.sms = got.sm.smCount;
    double ms = 0;
    if (!run(p.ctx, p.stream, &warm) || !run(p.ctx, p.stream, &ms)) {
      std::printf("DONE FAIL green-context launch\n");
      return 1;
    }
    const double expect = static_cast<double>(all.sm.smCount) / p.sms;
    const double seen = ms / full_ms;
    std::printf("context=green pct=%u asked=%u sms=%u ms=%.3f slowdown=%.2f expected=%.2f\n", pct, want, p.sms, ms,
                seen, expect);
    if (std::fabs(seen - expect) / expect > 0.25) ok = false;
    // What a program that never heard of green contexts does with the converted context current:
    // cuStreamCreate, and the NULL stream. Informational: whether the cuda backend can hand a
    // capped session a green-derived context and let its streams follow without further mapping.
    CUstream plain;
    CK(cuCtxSetCurrent(p.ctx));
    CK(cuStreamCreate(&plain, CU_STREAM_NON_BLOCKING));
    double plain_ms = 0, null_ms = 0;
    if (run(p.ctx, plain, &warm) && run(p.ctx, plain, &plain_ms) && run(p.ctx, nullptr, &warm) &&
        run(p.ctx, nullptr, &null_ms)) {
      std::printf("context=green pct=%u stream=cuStreamCreate slowdown=%.2f stream=null slowdown=%.2f\n", pct,
                  plain_ms / full_ms, null_ms / full_ms);
    }
    parts.push_back(p);
  }

  // Side by side: both partitions at once, each timed by its own events, from one thread (launches
  // are asynchronous; each context current while its work is queued).
  {
    CUevent a[2], b[2];
    for (int i = 0; i < 2; ++i) {
      CK(cuCtxSetCurrent(parts[i].ctx));
      CK(cuEventCreate(&a[i], 0));
      CK(cuEventCreate(&b[i], 0));
    }
    void* args[] = {&out, &iters};
    for (int i = 0; i < 2; ++i) {
      CK(cuCtxSetCurrent(parts[i].ctx));
      CK(cuEventRecord(a[i], parts[i].stream));
      CK(cuLaunchKernel(reinterpret_cast<CUfunction>(kern), blocks, 1, 1, 256, 1, 1, 0, parts[i].stream, args,
                        nullptr));
      CK(cuEventRecord(b[i], parts[i].stream));
    }
    for (int i = 0; i < 2; ++i) {
      CK(cuCtxSetCurrent(parts[i].ctx));
      CK(cuEventSynchronize(b[i]));
      float f = 0;
      cuEventElapsedTime(&f, a[i], b[i]);
      std::printf("concurrent=green sms=%u ms=%.3f alone_expected=%.3f\n", parts[i].sms, f,
                  full_ms * all.sm.smCount / parts[i].sms);
    }
  }
  std::printf("DONE %s\n", ok ? "ok" : "FAIL slowdown not proportional to SMs");
  return ok ? 0 : 1;
}
