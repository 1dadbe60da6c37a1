// JIT linking through the driver API (cuLinkCreate / cuLinkAddFile / cuLinkAddData /
// cuLinkComplete), as numba-style tools and CuPy's -rdc=true use it: a kernel in one PTX module
// (tests/data/link_a.cu, added from a file) calls a function and reads a variable of another
// (link_b.cu, added as a fatbinary with PTX), the device runtime library is added as a library
// input; the linked image loads with cuModuleLoadData and the kernel's values are computed.
// Errors: an undefined reference fails cuLinkComplete with the symbol in the error log; SASS
// inputs are refused loudly; handles are checked.
// Usage: jit_link <link_a.ptx> <link_b.fatbin>
#include <cuda.h>

#include <fstream>
#include <iterator>

#include "orion_test.h"

#define CU(e)                                                                                \
  do {                                                                                       \
    CUresult _r = (e);                                                                       \
    if (_r != CUDA_SUCCESS) {                                                                \
      const char* _n = nullptr;                                                              \
      cuGetErrorName(_r, &_n);                                                               \
      printf("CUDA_ERROR %s %d %s:%d %s\n", _n ? _n : "?", (int)_r, __FILE__, __LINE__, #e); \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

int main(int argc, char** argv) {
  ot::init_output();
  if (argc < 3) {
    fprintf(stderr, "usage: jit_link link_a.ptx link_b.fatbin\n");
    return 2;
  }
  std::ifstream fb(argv[2], std::ios::binary);
  std::vector<char> fatbin((std::istreambuf_iterator<char>(fb)), std::istreambuf_iterator<char>());
  CU(cuInit(0));
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));

  char info[512] = "unset", error[512] = "unset";
  CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
                         CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_OPTIMIZATION_LEVEL};
  void* vals[] = {info, (void*)(uintptr_t)sizeof info, error, (void*)(uintptr_t)sizeof error, (void*)(uintptr_t)3};
  CUlinkState link;
  CU(cuLinkCreate(5, opts, vals, &link));
  CU(cuLinkAddFile(link, CU_JIT_INPUT_PTX, argv[1], 0, nullptr, nullptr));
  CU(cuLinkAddData(link, CU_JIT_INPUT_FATBINARY, fatbin.data(), fatbin.size(), "link_b", 0, nullptr, nullptr));
  CU(cuLinkAddFile(link, CU_JIT_INPUT_LIBRARY, "/usr/local/cuda/lib64/libcudadevrt.a", 0, nullptr, nullptr));
  void* image = nullptr;
  size_t image_size = 0;
  CU(cuLinkComplete(link, &image, &image_size));
  ot::check("link_complete", image != nullptr && image_size > 0 && error[0] == '\0' && std::string(info) != "unset",
            ot::fmt("size %zu info '%s' error '%s'", image_size, info, error));
  CUmodule mod;
  CU(cuModuleLoadData(&mod, image));
  CU(cuLinkDestroy(link));  // the loaded module does not need the link state
  CUfunction apply;
  CU(cuModuleGetFunction(&apply, mod, "apply"));
  const int n = 300;
  std::vector<int> in(n), out(n);
  for (int i = 0; i < n; ++i) in[i] = i * 5 - 100;
  CUdeviceptr d;
  CU(cuMemAlloc(&d, n * sizeof(int)));
  CU(cuMemcpyHtoD(d, in.data(), n * sizeof(int)));
  int nn = n;
  void* params[] = {&d, &nn};
  CU(cuLaunchKernel(apply, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr));
  CU(cuMemcpyDtoH(out.data(), d, n * sizeof(int)));
  bool ok = true;
  for (int i = 0; i < n; ++i) ok &= out[i] == in[i] * 3 + 7;
  ot::check_kernel("linked_kernel_computes", ok, ot::fmt("out[1]=%d want %d", out[1], in[1] * 3 + 7));
  CUdeviceptr bias;
  size_t bias_size = 0;
  CU(cuModuleGetGlobal(&bias, &bias_size, mod, "bias"));
  int bias_value = 0;
  CU(cuMemcpyDtoH(&bias_value, bias, sizeof bias_value));
  ot::check("linked_global_from_second_module", bias_size == 4 && bias_value == 7,
            ot::fmt("%zu %d", bias_size, bias_value));

  // A module alone with an undefined reference: cuLinkComplete fails and says which.
  // (The driver wrote the log sizes it used back into vals: give the buffer sizes again.)
  error[0] = '\0';
  vals[1] = (void*)(uintptr_t)sizeof info;
  vals[3] = (void*)(uintptr_t)sizeof error;
  CUlinkState lone;
  CU(cuLinkCreate(4, opts, vals, &lone));
  CU(cuLinkAddFile(lone, CU_JIT_INPUT_PTX, argv[1], 0, nullptr, nullptr));
  CUresult r = cuLinkComplete(lone, &image, &image_size);
  ot::check("undefined_reference_fails",
            r == CUDA_ERROR_NOT_FOUND && std::string(error).find("_Z5scalei") != std::string::npos,
            ot::fmt("result %d error '%s'", (int)r, error));
  // SASS inputs are refused, loudly; a destroyed state is not a handle any more.
  const unsigned char elf[] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0};
  r = cuLinkAddData(lone, CU_JIT_INPUT_CUBIN, (void*)elf, sizeof elf, "sass", 0, nullptr, nullptr);
  ot::check("cubin_input_refused", r == CUDA_ERROR_NOT_SUPPORTED, ot::fmt("%d", (int)r));
  CU(cuLinkDestroy(lone));
  r = cuLinkDestroy(lone);
  ot::check("destroyed_state_refused", r == CUDA_ERROR_INVALID_HANDLE, ot::fmt("%d", (int)r));
  CU(cuMemFree(d));
  CU(cuModuleUnload(mod));
  return ot::finish();
}
