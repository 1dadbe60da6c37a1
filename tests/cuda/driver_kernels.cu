// driver_kernels.cu — device code for driver_api.cpp. Built with `nvcc -fatbin` at build time and
// embedded into driver_api as a byte array (bin2c), then loaded with cuModuleLoadData.
// Kernels are extern "C", so their names are plain (drv_fill, drv_axpy).

__device__ int drv_global[16];                  // written by the host with cuModuleGetGlobal + cuMemcpyHtoD
__device__ int drv_init[4] = {11, 22, 33, 44};  // initialised from the module image

// out[i] = val + i, for i < n
extern "C" __global__ void drv_fill(int* out, int n, int val) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = val + i;
}

// out[i] = in[i] * drv_global[i % 16] + drv_init[i % 4] + add + tag, for i < n
extern "C" __global__ void drv_axpy(const int* in, int* out, long long add, int n, int tag) {
  int i = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x * blockDim.y + threadIdx.y * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * drv_global[i % 16] + drv_init[i % 4] + (int)add + tag;
}
