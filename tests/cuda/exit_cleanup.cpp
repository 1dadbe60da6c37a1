// exit_cleanup.cpp — libraries call the driver from exit handlers (cuFFT's cufftDestroy, run from
// PyTorch's static plan cache, pushes and pops contexts and frees memory). Those run after the main
// thread's thread_local destructors, so the driver must not keep per-thread state in objects with
// destructors (issue #20: the context stack was a thread_local std::vector, and writing to it at
// exit corrupted the heap). A static object's destructor does what cuFFT does: it pushes the
// context many times (enough to grow any stack storage), pops back, frees its allocation, and
// prints EXIT_HANDLER_OK; a corrupted heap aborts instead.
#include <cuda.h>

#include <cstdio>

namespace {

struct AtExit {
  CUcontext ctx = nullptr;
  CUdeviceptr mem = 0;
  ~AtExit() {
    if (ctx == nullptr) return;
    bool ok = true;
    for (int i = 0; i < 64; ++i) ok = ok && cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
    CUcontext cur = nullptr;
    ok = ok && cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx;
    for (int i = 0; i < 64; ++i) ok = ok && cuCtxPopCurrent(&cur) == CUDA_SUCCESS && cur == ctx;
    ok = ok && cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
    ok = ok && cuMemFree(mem) == CUDA_SUCCESS;
    std::printf("EXIT_HANDLER_%s\n", ok ? "OK" : "FAILED");
    std::fflush(stdout);
  }
} g_at_exit;  // constructed before main, destroyed after the main thread's thread_local objects

}  // namespace

int main() {
  CUdevice dev = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&g_at_exit.ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(g_at_exit.ctx) != CUDA_SUCCESS ||
      cuMemAlloc(&g_at_exit.mem, 4096) != CUDA_SUCCESS) {
    std::printf("SETUP_FAILED\n");
    return 1;
  }
  // The main thread's context stack is in use before exit, as in any CUDA program.
  CUcontext cur = nullptr;
  for (int i = 0; i < 3; ++i) cuCtxPushCurrent(g_at_exit.ctx);
  for (int i = 0; i < 3; ++i) cuCtxPopCurrent(&cur);
  std::printf("MAIN_DONE\n");
  return 0;
}
