// Mapped pinned memory from cudaHostRegister(cudaHostRegisterMapped) (CU_MEMHOSTREGISTER_DEVICEMAP):
// a kernel reads and writes the program's own buffer (malloc'ed, not page aligned) through the
// device pointer cudaHostGetDevicePointer gives, with no copy; the host sees the kernel's writes
// after a synchronization, a kernel sees the host's later writes; bytes next to the buffer on the
// same pages are untouched and stay writable; after cudaHostUnregister the buffer keeps its bytes
// and stays the program's memory. Over a network transport it is refused (no shared memory).
// Usage: mapped_register [expect-refused]
#include <sys/mman.h>

#include <cstdlib>

#include "orion_test.h"

__global__ void triple_plus(int* p, int n, int add) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 3 + add;
}

int main(int argc, char** argv) {
  ot::init_output();
  const bool expect_refused = argc > 1 && std::string(argv[1]) == "expect-refused";
  const int n = 5000;  // 20000 bytes: spans several pages
  char* raw = static_cast<char*>(std::malloc(n * sizeof(int) + 8192));
  int* buf = reinterpret_cast<int*>(raw + 100);    // not page aligned
  char* before = raw + 96;                         // bytes of "another object" on the first page
  char* after = reinterpret_cast<char*>(buf + n);  // ... and on the last
  std::memset(before, 0x5a, 4);
  std::memset(after, 0x6b, 16);
  for (int i = 0; i < n; ++i) buf[i] = i;
  cudaError_t e = cudaHostRegister(buf, n * sizeof(int), cudaHostRegisterMapped);
  if (expect_refused) {
    ot::check("mapped_register_refused_over_network", e == cudaErrorNotSupported, cudaGetErrorName(e));
    (void)cudaGetLastError();
    // Plain registration (copy-through) still works there.
    ot::check("plain_register_works", cudaHostRegister(buf, n * sizeof(int), cudaHostRegisterDefault) == cudaSuccess);
    ot::check("plain_unregister_works", cudaHostUnregister(buf) == cudaSuccess);
    return ot::finish();
  }
  ot::check("mapped_register", e == cudaSuccess, cudaGetErrorName(e));
  int* dev = nullptr;
  e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), buf, 0);
  ot::check("device_pointer", e == cudaSuccess && dev != nullptr, cudaGetErrorName(e));
  triple_plus<<<(n + 255) / 256, 256>>>(dev, n, 1);
  e = cudaDeviceSynchronize();
  bool ok = e == cudaSuccess;
  for (int i = 0; i < n; ++i) ok &= buf[i] == i * 3 + 1;
  ot::check_kernel("kernel_writes_seen_by_host", ok, ot::fmt("%s buf[7]=%d", cudaGetErrorName(e), buf[7]));
  for (int i = 0; i < n; ++i) buf[i] = -i;  // the host writes; the next kernel reads them
  triple_plus<<<(n + 255) / 256, 256>>>(dev, n, 0);
  cudaDeviceSynchronize();
  ok = true;
  for (int i = 0; i < n; ++i) ok &= buf[i] == -3 * i;
  ot::check_kernel("host_writes_seen_by_kernel", ok, ot::fmt("buf[7]=%d", buf[7]));
  bool neighbours = before[0] == 0x5a && before[3] == 0x5a && after[0] == 0x6b && after[15] == 0x6b;
  before[1] = 1;  // still ordinary, writable memory
  after[1] = 2;
  ot::check("neighbours_untouched", neighbours && before[1] == 1 && after[1] == 2);
  // A copy from the registered buffer works as from any host memory.
  int* d2 = nullptr;
  cudaMalloc(&d2, n * sizeof(int));
  cudaMemcpy(d2, buf, n * sizeof(int), cudaMemcpyHostToDevice);
  std::vector<int> back(n);
  cudaMemcpy(back.data(), d2, n * sizeof(int), cudaMemcpyDeviceToHost);
  ot::check("copy_from_registered", std::memcmp(back.data(), buf, n * sizeof(int)) == 0);
  ot::check("register_twice_refused",
            cudaHostRegister(buf + 10, 64, cudaHostRegisterMapped) == cudaErrorHostMemoryAlreadyRegistered);
  (void)cudaGetLastError();
  e = cudaHostUnregister(buf);
  ok = e == cudaSuccess;
  for (int i = 0; i < n; ++i) ok &= buf[i] == -3 * i;
  buf[0] = 12345;  // still the program's memory
  ok &= buf[0] == 12345 && before[1] == 1 && after[1] == 2;
  ot::check("unregister_keeps_bytes", ok, cudaGetErrorName(e));
  // Registered again, mapped again: the kernel sees the current bytes.
  ot::check("register_again", cudaHostRegister(buf, n * sizeof(int), cudaHostRegisterMapped) == cudaSuccess);
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), buf, 0);
  triple_plus<<<1, 1>>>(dev, 1, 0);
  cudaDeviceSynchronize();
  ot::check_kernel("second_registration_mapped", buf[0] == 3 * 12345, ot::fmt("%d", buf[0]));
  cudaHostUnregister(buf);
  // Shared (or file-backed) memory must stay what it is: refused, and still shared afterwards.
  void* shared = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  static_cast<int*>(shared)[0] = 42;
  e = cudaHostRegister(shared, 8192, cudaHostRegisterMapped);
  ot::check("shared_mapping_refused", e == cudaErrorNotSupported && static_cast<int*>(shared)[0] == 42,
            cudaGetErrorName(e));
  (void)cudaGetLastError();
  munmap(shared, 8192);
  cudaFree(d2);
  std::free(raw);
  return ot::finish();
}
