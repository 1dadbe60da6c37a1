// unexecutable.cu — kernels the sim backend cannot execute must fail, never "succeed" with nothing
// computed (issue #20). Built with sm_90 SASS only (no PTX), so its own kernel is such a kernel on
// sim and runs on an sm_90 GPU.
//
// Checks, on sim (default oriond, --sim-unexecutable refuse):
//   * the runtime launch of the SASS-only kernel fails at the launch itself with
//     cudaErrorNoKernelImageForDevice (what a driver says for a kernel with no image for the
//     device), every time; nothing is written; the context stays usable;
//   * a PTX module whose .version is newer than the driver's PTX ISA fails cuModuleLoadData with
//     CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
//   * a PTX kernel using what the executor does not implement (mma: tensor cores) loads, and its
//     launch fails with CUDA_ERROR_NOT_SUPPORTED, reported by the next synchronizing call; the
//     context stays usable.
// With `api-level` as argument (oriond --sim-unexecutable skip) the launch is accepted and nothing
// is computed: the check is that the buffer is untouched, so a test can see nothing was faked.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "orion_test.h"

using ot::check;
using ot::fmt;

__global__ void fill(int* p, int v) { p[threadIdx.x] = v; }

static const char* kNewPtx = ".version 9.9\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\nret;\n}\n";
static const char* kMmaPtx =
    ".version 8.0\n.target sm_80\n.address_size 64\n"
    ".visible .entry mma_k(.param .u64 p)\n{\n.reg .b32 %r<12>;\n.reg .f32 %f<8>;\n.reg .b64 %rd<2>;\n"
    "ld.param.u64 %rd1, [p];\n"
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, "
    "{%f1, %f2, %f3, %f4};\n"
    "st.global.f32 [%rd1], %f1;\nret;\n}\n";

static int untouched(int* d, int pattern) {
  std::vector<int> h(32);
  CUDA_OK(cudaMemcpy(h.data(), d, 32 * 4, cudaMemcpyDeviceToHost));
  int n = 0;
  for (int v : h) n += v == pattern;
  return n;
}

int main(int argc, char** argv) {
  ot::detect_device();
  const bool api_level = argc > 1 && std::strcmp(argv[1], "api-level") == 0;
  const int pattern = 0x11111111;
  int* d = nullptr;
  CUDA_OK(cudaMalloc(&d, 32 * 4));
  CUDA_OK(cudaMemset(d, 0x11, 32 * 4));
  fill<<<1, 32>>>(d, 7);
  const cudaError_t launch = cudaGetLastError();
  const cudaError_t sync = cudaDeviceSynchronize();
  if (!ot::is_sim()) {
    check("gpu_runs_sass", launch == cudaSuccess && sync == cudaSuccess && untouched(d, 7) == 32);
    return ot::finish();
  }
  if (api_level) {
    // --sim-unexecutable skip: accepted, not run, and the buffer shows it.
    check("api_level_launch_accepted", launch == cudaSuccess && sync == cudaSuccess,
          fmt("launch %s, sync %s", cudaGetErrorName(launch), cudaGetErrorName(sync)));
    check("api_level_nothing_computed", untouched(d, pattern) == 32);
    return ot::finish();
  }
  check("sass_only_launch_refused", launch == cudaErrorNoKernelImageForDevice,
        fmt("got %s (%d)", cudaGetErrorName(launch), static_cast<int>(launch)));
  check("context_usable_after_refusal", sync == cudaSuccess, cudaGetErrorName(sync));
  check("refused_launch_wrote_nothing", untouched(d, pattern) == 32);
  fill<<<2, 32>>>(d, 8);
  const cudaError_t again = cudaGetLastError();
  check("every_launch_refused", again == cudaErrorNoKernelImageForDevice, cudaGetErrorName(again));
  // In a stream capture the refused launch invalidates the capture: no graph lacks it silently.
  cudaStream_t cs;
  CUDA_OK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
  fill<<<1, 32, 0, cs>>>(d, 9);
  const cudaError_t in_capture = cudaGetLastError();
  cudaGraph_t g = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(cs, &g);
  check("refused_launch_invalidates_capture",
        in_capture == cudaErrorNoKernelImageForDevice && ended == cudaErrorStreamCaptureInvalidated && g == nullptr,
        fmt("launch %s, end capture %s", cudaGetErrorName(in_capture), cudaGetErrorName(ended)));
  cudaGetLastError();
  CUDA_OK(cudaStreamDestroy(cs));

  // Driver API: a PTX ISA newer than this driver's is refused at load.
  CUmodule m = nullptr;
  CUresult r = cuModuleLoadData(&m, kNewPtx);
  check("newer_ptx_version_refused", r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION, fmt("got %d", static_cast<int>(r)));
  // A PTX kernel with an instruction the executor does not implement: loads, its launch fails.
  r = cuModuleLoadData(&m, kMmaPtx);
  check("mma_module_loads", r == CUDA_SUCCESS, fmt("got %d", static_cast<int>(r)));
  if (r == CUDA_SUCCESS) {
    CUfunction f = nullptr;
    check("mma_get_function", cuModuleGetFunction(&f, m, "mma_k") == CUDA_SUCCESS);
    CUdeviceptr p = reinterpret_cast<CUdeviceptr>(d);
    void* args[] = {&p};
    r = cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr);
    const CUresult s = cuCtxSynchronize();
    // The refusal comes back from the launch or from the next synchronizing call.
    check("unimplemented_instruction_launch_fails",
          (r == CUDA_ERROR_NOT_SUPPORTED && s == CUDA_SUCCESS) || (r == CUDA_SUCCESS && s == CUDA_ERROR_NOT_SUPPORTED),
          fmt("launch %d, synchronize %d", static_cast<int>(r), static_cast<int>(s)));
    check("context_usable_after_unimplemented", cuCtxSynchronize() == CUDA_SUCCESS);
    check("unimplemented_wrote_nothing", untouched(d, pattern) == 32);
    check("mma_module_unloads", cuModuleUnload(m) == CUDA_SUCCESS);
  }
  // The context still computes what it can: a copy and a memset.
  CUDA_OK(cudaMemset(d, 0, 32 * 4));
  check("memset_after_refusals", untouched(d, 0) == 32);
  CUDA_OK(cudaFree(d));
  return ot::finish();
}
