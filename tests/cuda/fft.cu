// fft.cu — NVIDIA's cuFFT, unmodified, on Orion: a 1D C2C plan executed forward (n = 1024,
// batch 2) and a 1D R2C plan (n = 4096). Statuses must be CUFFT_SUCCESS, the input of the
// out-of-place transforms must read back byte for byte, and results are checked only where kernels
// run (a GPU: a constant signal transforms to a single spike). lib_marks.h marks each exec.
#include <cufft.h>

#include <cmath>

#include "lib_marks.h"

using ot::check;
using ot::fmt;

int main() {
  ot::detect_device();
  // C2C, out of place.
  {
    const int n = 1024, batch = 2;
    std::vector<cufftComplex> in(n * batch), out(n * batch);
    for (int i = 0; i < n * batch; ++i) in[i] = {1.f, 0.f};
    auto* din = static_cast<cufftComplex*>(ot::upload(in.data(), in.size() * sizeof(cufftComplex)));
    cufftComplex* dout = nullptr;
    CUDA_OK(cudaMalloc(&dout, out.size() * sizeof(cufftComplex)));
    cufftHandle plan = 0;
    cufftResult r = cufftPlan1d(&plan, n, CUFFT_C2C, batch);
    check("c2c_plan", r == CUFFT_SUCCESS, fmt("cufftResult %d", static_cast<int>(r)));
    if (r == CUFFT_SUCCESS) {
      ot::mark(1, "c2c_exec");
      r = cufftExecC2C(plan, din, dout, CUFFT_FORWARD);
      check("c2c_exec", r == CUFFT_SUCCESS, fmt("cufftResult %d", static_cast<int>(r)));
      check("c2c_sync", cudaDeviceSynchronize() == cudaSuccess);
      ot::check_device_bytes("c2c_input_intact", din, in.data(), in.size() * sizeof(cufftComplex));
      CUDA_OK(cudaMemcpy(out.data(), dout, out.size() * sizeof(cufftComplex), cudaMemcpyDeviceToHost));
      bool ok = std::abs(out[0].x - n) < 1e-2 && std::abs(out[n].x - n) < 1e-2 && std::abs(out[1].x) < 1e-2;
      ot::check_sass_kernel("c2c_result", ok, fmt("out[0]=%f out[1]=%f", out[0].x, out[1].x));
      check("c2c_destroy", cufftDestroy(plan) == CUFFT_SUCCESS);
    }
    CUDA_OK(cudaFree(din));
    CUDA_OK(cudaFree(dout));
  }
  // R2C, out of place.
  {
    const int n = 4096;
    std::vector<float> in(n, 2.f);
    std::vector<cufftComplex> out(n / 2 + 1);
    auto* din = static_cast<float*>(ot::upload(in.data(), in.size() * 4));
    cufftComplex* dout = nullptr;
    CUDA_OK(cudaMalloc(&dout, out.size() * sizeof(cufftComplex)));
    cufftHandle plan = 0;
    cufftResult r = cufftPlan1d(&plan, n, CUFFT_R2C, 1);
    check("r2c_plan", r == CUFFT_SUCCESS, fmt("cufftResult %d", static_cast<int>(r)));
    if (r == CUFFT_SUCCESS) {
      ot::mark(2, "r2c_exec");
      r = cufftExecR2C(plan, din, dout);
      check("r2c_exec", r == CUFFT_SUCCESS, fmt("cufftResult %d", static_cast<int>(r)));
      check("r2c_sync", cudaDeviceSynchronize() == cudaSuccess);
      ot::check_device_bytes("r2c_input_intact", din, in.data(), in.size() * 4);
      CUDA_OK(cudaMemcpy(out.data(), dout, out.size() * sizeof(cufftComplex), cudaMemcpyDeviceToHost));
      bool ok = std::abs(out[0].x - 2.f * n) < 1e-1 && std::abs(out[1].x) < 1e-2;
      ot::check_sass_kernel("r2c_result", ok, fmt("out[0]=%f out[1]=%f", out[0].x, out[1].x));
      check("r2c_destroy", cufftDestroy(plan) == CUFFT_SUCCESS);
    }
    CUDA_OK(cudaFree(din));
    CUDA_OK(cudaFree(dout));
  }
  return ot::finish();
}
