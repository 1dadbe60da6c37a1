// move_texture.cu — a program whose CUDA arrays, texture object and surface object are made before a
// loop and used across it while its session may move to another oriond (issue #24): each iteration
// a kernel reads every texel of one array through the texture object (point sampling), adds the
// iteration's number, and writes the sum through the surface object into a second array; the program
// copies that array back, checks every value, and synchronizes (a call it waits on: where a move
// happens), then sleeps PAUSE_MS. The results do not depend on where each iteration ran.
//
// Usage: move_texture [ITERATIONS=30] [PAUSE_MS=50]
// Output: "READY" after the setup, "ITER <i> <sum of the values read back>" per iteration, three
// CHECK lines, DONE.
#include <cuda_runtime.h>
#include <unistd.h>

#include <vector>

#include "orion_test.h"

constexpr int kW = 64, kH = 32;

__global__ void step(cudaTextureObject_t src, cudaSurfaceObject_t dst, float add) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < kW && y < kH) surf2Dwrite(tex2D<float>(src, x + 0.5f, y + 0.5f) + add, dst, x * (int)sizeof(float), y);
}

int main(int argc, char** argv) {
  ot::init_output();
  ot::detect_device();
  const int iterations = argc > 1 ? atoi(argv[1]) : 30;
  const int pause_ms = argc > 2 ? atoi(argv[2]) : 50;
  std::vector<float> texels(kW * kH);
  for (int y = 0; y < kH; ++y) {
    for (int x = 0; x < kW; ++x) texels[y * kW + x] = static_cast<float>((x * 3 + y * 7) % 101);
  }
  const cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
  cudaArray_t src = nullptr, dst = nullptr;
  CUDA_OK(cudaMallocArray(&src, &fd, kW, kH));
  CUDA_OK(cudaMallocArray(&dst, &fd, kW, kH, cudaArraySurfaceLoadStore));
  CUDA_OK(cudaMemcpy2DToArray(src, 0, 0, texels.data(), kW * sizeof(float), kW * sizeof(float), kH,
                              cudaMemcpyHostToDevice));
  cudaResourceDesc rd{};
  rd.resType = cudaResourceTypeArray;
  rd.res.array.array = src;
  cudaTextureDesc td{};
  td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
  td.filterMode = cudaFilterModePoint;
  td.readMode = cudaReadModeElementType;
  cudaTextureObject_t tex = 0;
  CUDA_OK(cudaCreateTextureObject(&tex, &rd, &td, nullptr));
  rd.res.array.array = dst;
  cudaSurfaceObject_t surf = 0;
  CUDA_OK(cudaCreateSurfaceObject(&surf, &rd));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  printf("READY\n");
  std::vector<float> got(kW * kH);
  bool each_ok = true;
  for (int i = 1; i <= iterations; ++i) {
    step<<<dim3(kW / 16, kH / 16), dim3(16, 16), 0, s>>>(tex, surf, static_cast<float>(i));
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy2DFromArrayAsync(got.data(), kW * sizeof(float), dst, 0, 0, kW * sizeof(float), kH,
                                       cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    double sum = 0;
    for (int k = 0; k < kW * kH; ++k) {
      sum += got[k];
      if (got[k] != texels[k] + static_cast<float>(i)) each_ok = false;
    }
    printf("ITER %d %.0f\n", i, sum);
    usleep(pause_ms * 1000);
  }
  std::vector<float> kept(kW * kH);
  CUDA_OK(cudaMemcpy2DFromArray(kept.data(), kW * sizeof(float), src, 0, 0, kW * sizeof(float), kH,
                                cudaMemcpyDeviceToHost));
  ot::check("every_iteration_sampled_and_wrote_its_values", each_ok);
  ot::check("the_sampled_array_kept_its_texels", kept == texels);
  ot::check("objects_and_arrays_destroyed", cudaDestroyTextureObject(tex) == cudaSuccess &&
                                                cudaDestroySurfaceObject(surf) == cudaSuccess &&
                                                cudaFreeArray(src) == cudaSuccess && cudaFreeArray(dst) == cudaSuccess);
  CUDA_OK(cudaStreamDestroy(s));
  return ot::finish();
}
