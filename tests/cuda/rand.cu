// rand.cu — NVIDIA's cuRAND host API, unmodified, on Orion: a Philox generator filling device
// memory with uniform floats and 32-bit integers. Statuses must be success; the values are checked
// only where kernels run (a GPU: in [0, 1), not all equal). A guard area after the output must read
// back byte for byte (set before, never written by cuRAND). lib_marks.h marks each generate call.
#include <curand.h>

#include "lib_marks.h"

using ot::check;
using ot::fmt;

int main() {
  ot::detect_device();
  const size_t n = 1 << 16;
  float* du = nullptr;
  unsigned* di = nullptr;
  const size_t guard = 4096;
  std::vector<unsigned char> pattern(guard);
  ot::Rng(7).fill(pattern.data(), guard);
  CUDA_OK(cudaMalloc(&du, n * 4 + guard));
  CUDA_OK(cudaMemcpy(reinterpret_cast<char*>(du) + n * 4, pattern.data(), guard, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&di, n * 4));
  curandGenerator_t g = nullptr;
  curandStatus_t s = curandCreateGenerator(&g, CURAND_RNG_PSEUDO_PHILOX4_32_10);
  check("rand_create", s == CURAND_STATUS_SUCCESS, fmt("status %d", static_cast<int>(s)));
  if (s != CURAND_STATUS_SUCCESS) return ot::finish();
  check("rand_seed", curandSetPseudoRandomGeneratorSeed(g, 1234ULL) == CURAND_STATUS_SUCCESS);
  ot::mark(1, "generate_uniform");
  s = curandGenerateUniform(g, du, n);
  check("generate_uniform", s == CURAND_STATUS_SUCCESS, fmt("status %d", static_cast<int>(s)));
  ot::mark(2, "generate");
  s = curandGenerate(g, di, n);
  check("generate", s == CURAND_STATUS_SUCCESS, fmt("status %d", static_cast<int>(s)));
  check("rand_sync", cudaDeviceSynchronize() == cudaSuccess);
  ot::check_device_bytes("uniform_guard_intact", reinterpret_cast<char*>(du) + n * 4, pattern.data(), guard);
  std::vector<float> u(n);
  std::vector<unsigned> v(n);
  CUDA_OK(cudaMemcpy(u.data(), du, n * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(v.data(), di, n * 4, cudaMemcpyDeviceToHost));
  size_t out_of_range = 0, same = 0;
  for (size_t i = 0; i < n; ++i) {
    out_of_range += !(u[i] >= 0.f && u[i] <= 1.f);
    same += i > 0 && v[i] == v[i - 1];
  }
  ot::check_sass_kernel("uniform_range", out_of_range == 0, fmt("%zu values outside [0, 1]", out_of_range));
  ot::check_sass_kernel("integers_vary", same < n / 100, fmt("%zu repeats", same));
  check("rand_destroy", curandDestroyGenerator(g) == CURAND_STATUS_SUCCESS);
  return ot::finish();
}
