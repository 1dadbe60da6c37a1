// Managed memory and unified addressing for pinned memory on a shared-memory channel (the sim
// backend maps the channel's pinned heap at the program's own addresses):
// - cudaMallocManaged memory written on the host, read and written by kernels, read back on the
//   host after a synchronization; cudaPointerGetAttributes calls it managed; prefetch, advice and
//   stream attachment are accepted for it and refused for other memory; cudaFree frees it.
// - A cudaHostAlloc pointer and a cudaHostRegister(Mapped) pointer given to a kernel as they are
//   (no cudaHostGetDevicePointer), and cudaHostGetDevicePointer returning the host pointer itself.
// - Pinned memory freed and allocated again at overlapping addresses is mapped afresh.
// Usage: managed [expect-unsupported]   (network transports: no memory both ends address)
#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "orion_test.h"

__global__ void add(int* p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += v;
}

__global__ void iota(int* p, int n, int base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = base + i;
}

// The first index where p[i] != base + i*step (n: none).
static int first_wrong(const int* p, int n, int base, int step) {
  for (int i = 0; i < n; ++i)
    if (p[i] != base + i * step) return i;
  return n;
}

int main(int argc, char** argv) {
  ot::init_output();
  const bool expect_unsupported = argc > 1 && std::string(argv[1]) == "expect-unsupported";
  CUDA_OK(cudaSetDevice(0));
  int managed_attr = -1, host_ptr_attr = -1, map_attr = -1, concurrent = -1;
  CUDA_OK(cudaDeviceGetAttribute(&managed_attr, cudaDevAttrManagedMemory, 0));
  CUDA_OK(cudaDeviceGetAttribute(&host_ptr_attr, cudaDevAttrCanUseHostPointerForRegisteredMem, 0));
  CUDA_OK(cudaDeviceGetAttribute(&map_attr, cudaDevAttrCanMapHostMemory, 0));
  CUDA_OK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0));
  const int n = 1 << 16;
  if (expect_unsupported) {
    ot::check("network_reports_no_managed_memory", managed_attr == 0 && host_ptr_attr == 0 && map_attr == 0,
              ot::fmt("managed %d, host pointer %d, map host %d", managed_attr, host_ptr_attr, map_attr));
    int* m = nullptr;
    const cudaError_t e = cudaMallocManaged(&m, n * sizeof(int));
    ot::check("network_refuses_managed_memory", e == cudaErrorNotSupported, ot::fmt("%d", static_cast<int>(e)));
    return ot::finish();
  }
  ot::check("attributes_report_managed_and_host_pointers",
            managed_attr == 1 && host_ptr_attr == 1 && map_attr == 1 && concurrent == 0,
            ot::fmt("managed %d, host pointer %d, map host %d, concurrent %d", managed_attr, host_ptr_attr, map_attr,
                    concurrent));

  // Managed memory: host, kernel, host, kernel, host.
  int* m = nullptr;
  CUDA_OK(cudaMallocManaged(&m, n * sizeof(int)));
  for (int i = 0; i < n; ++i) m[i] = 3 * i;
  add<<<n / 256, 256>>>(m, n, 5);
  CUDA_OK(cudaDeviceSynchronize());
  int bad = first_wrong(m, n, 5, 3);
  ot::check_kernel("managed_written_on_host_read_by_kernel", bad == n,
                   ot::fmt("m[%d] = %d", bad, bad < n ? m[bad] : 0));
  for (int i = 0; i < n; ++i) m[i] -= 5;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemLocation dev0{};
  dev0.type = cudaMemLocationTypeDevice;
  dev0.id = 0;
  cudaMemLocation host{};
  host.type = cudaMemLocationTypeHost;
  const cudaError_t pf = cudaMemPrefetchAsync(m, n * sizeof(int), dev0, 0, s);
  add<<<n / 256, 256, 0, s>>>(m, n, 1000);
  const cudaError_t pb = cudaMemPrefetchAsync(m, n * sizeof(int), host, 0, s);
  CUDA_OK(cudaStreamSynchronize(s));
  bad = first_wrong(m, n, 1000, 3);
  ot::check_kernel(
      "managed_prefetched_in_stream_order", pf == cudaSuccess && pb == cudaSuccess && bad == n,
      ot::fmt("prefetch %d/%d, m[%d] = %d", static_cast<int>(pf), static_cast<int>(pb), bad, bad < n ? m[bad] : 0));
  ot::check("managed_advice_accepted",
            cudaMemAdvise(m, n * sizeof(int), cudaMemAdviseSetReadMostly, dev0) == cudaSuccess &&
                cudaMemAdvise(m, n * sizeof(int), cudaMemAdviseSetPreferredLocation, dev0) == cudaSuccess &&
                cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachSingle) == cudaSuccess);
  {
    // What the advice and prefetches said, read back per page (cuMemRangeGetAttribute(s)).
    const size_t all = n * sizeof(int);
    int rm = -1, pref = -1, last = -1, acc[3] = {7, 7, 7};
    CUDA_OK(cudaMemRangeGetAttribute(&rm, 4, cudaMemRangeAttributeReadMostly, m, all));
    CUDA_OK(cudaMemRangeGetAttribute(&pref, 4, cudaMemRangeAttributePreferredLocation, m, all));
    CUDA_OK(cudaMemRangeGetAttribute(&last, 4, cudaMemRangeAttributeLastPrefetchLocation, m, all));
    CUDA_OK(cudaMemAdvise(m, all, cudaMemAdviseSetAccessedBy, dev0));
    CUDA_OK(cudaMemRangeGetAttribute(acc, sizeof acc, cudaMemRangeAttributeAccessedBy, m, all));
    ot::check("range_attributes_read_back_the_advice",
              rm == 1 && pref == 0 && last == cudaCpuDeviceId && acc[0] == 0 && acc[1] == cudaInvalidDeviceId &&
                  acc[2] == cudaInvalidDeviceId,
              ot::fmt("read mostly %d, preferred %d, last prefetch %d, accessed by {%d, %d, %d}", rm, pref, last,
                      acc[0], acc[1], acc[2]));
    // Advice on the first page only: the whole range no longer agrees, the first page does.
    CUDA_OK(cudaMemAdvise(m, 4096, cudaMemAdviseSetPreferredLocation, host));
    CUDA_OK(cudaMemAdvise(m, 4096, cudaMemAdviseUnsetReadMostly, dev0));
    int pref_all = 0, pref_first = 0, rm_all = -1, rm_rest = -1;
    CUDA_OK(cudaMemRangeGetAttribute(&pref_all, 4, cudaMemRangeAttributePreferredLocation, m, all));
    CUDA_OK(cudaMemRangeGetAttribute(&pref_first, 4, cudaMemRangeAttributePreferredLocation, m + 8, 64));
    CUDA_OK(cudaMemRangeGetAttribute(&rm_all, 4, cudaMemRangeAttributeReadMostly, m, all));
    CUDA_OK(cudaMemRangeGetAttribute(&rm_rest, 4, cudaMemRangeAttributeReadMostly, m + 1024, all - 4096));
    ot::check("range_attributes_are_per_page",
              pref_all == cudaInvalidDeviceId && pref_first == cudaCpuDeviceId && rm_all == 0 && rm_rest == 1,
              ot::fmt("preferred %d / first page %d, read mostly %d / rest %d", pref_all, pref_first, rm_all, rm_rest));
    static int plain[4];
    int d = 0;
    ot::check("range_attribute_of_other_memory_refused",
              cudaMemRangeGetAttribute(&d, 4, cudaMemRangeAttributeReadMostly, plain, 4) == cudaErrorInvalidValue &&
                  cudaMemRangeGetAttribute(&d, 8, cudaMemRangeAttributeReadMostly, m, all) == cudaErrorInvalidValue);
    (void)cudaGetLastError();
  }
  cudaPointerAttributes pa{};
  CUDA_OK(cudaPointerGetAttributes(&pa, m + 10));
  ot::check("managed_pointer_attributes", pa.type == cudaMemoryTypeManaged && pa.devicePointer == m + 10,
            ot::fmt("type %d", static_cast<int>(pa.type)));

  // Non-managed memory: refused by the managed-only calls.
  int* d = nullptr;
  CUDA_OK(cudaMalloc(&d, n * sizeof(int)));
  const cudaError_t pd = cudaMemPrefetchAsync(d, n * sizeof(int), dev0, 0, s);
  const cudaError_t pm = cudaMemPrefetchAsync(m, (n + 1) * sizeof(int), dev0, 0, s);
  ot::check("prefetch_of_other_memory_refused", pd == cudaErrorInvalidValue && pm == cudaErrorInvalidValue,
            ot::fmt("device memory %d, past the end %d", static_cast<int>(pd), static_cast<int>(pm)));
  (void)cudaGetLastError();

  // A pinned host pointer in a kernel, as it is.
  int* pinned = nullptr;
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), n * sizeof(int), cudaHostAllocDefault));
  void* pinned_dev = nullptr;
  CUDA_OK(cudaHostGetDevicePointer(&pinned_dev, pinned, 0));
  iota<<<n / 256, 256>>>(pinned, n, 7);
  CUDA_OK(cudaDeviceSynchronize());
  bad = first_wrong(pinned, n, 7, 1);
  ot::check_kernel("pinned_host_pointer_in_a_kernel", bad == n && pinned_dev == pinned,
                   ot::fmt("device pointer %p for %p, pinned[%d] = %d", pinned_dev, static_cast<void*>(pinned), bad,
                           bad < n ? pinned[bad] : 0));

  // Registered (mapped) host memory in a kernel, as it is.
  const size_t reg_bytes = 3 * 4096 + 100;
  auto* reg = static_cast<int*>(std::aligned_alloc(4096, 4 * 4096));
  const int rn = static_cast<int>(reg_bytes / sizeof(int));
  for (int i = 0; i < rn; ++i) reg[i] = -1;
  CUDA_OK(cudaHostRegister(reg, reg_bytes, cudaHostRegisterMapped));
  iota<<<(rn + 255) / 256, 256>>>(reg, rn, 100);
  CUDA_OK(cudaDeviceSynchronize());
  bad = first_wrong(reg, rn, 100, 1);
  ot::check_kernel("registered_host_pointer_in_a_kernel", bad == rn,
                   ot::fmt("reg[%d] = %d", bad, bad < rn ? reg[bad] : 0));
  CUDA_OK(cudaHostUnregister(reg));
  bad = first_wrong(reg, rn, 100, 1);
  ot::check("registered_bytes_kept_after_unregister", bad == rn, ot::fmt("reg[%d]", bad));
  std::free(reg);

  // Freed and allocated again: pinned memory at overlapping addresses maps afresh.
  CUDA_OK(cudaFreeHost(pinned));
  int* a = nullptr;
  int* b = nullptr;
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&a), n / 2 * sizeof(int), cudaHostAllocDefault));
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&b), n * sizeof(int), cudaHostAllocDefault));
  iota<<<n / 2 / 256, 256>>>(a, n / 2, 11);
  iota<<<n / 256, 256>>>(b, n, 22);
  CUDA_OK(cudaDeviceSynchronize());
  const int bad_a = first_wrong(a, n / 2, 11, 1), bad_b = first_wrong(b, n, 22, 1);
  ot::check_kernel("pinned_memory_reused_maps_afresh", bad_a == n / 2 && bad_b == n,
                   ot::fmt("a wrong at %d, b wrong at %d", bad_a, bad_b));
  CUDA_OK(cudaFreeHost(a));
  CUDA_OK(cudaFreeHost(b));

  CUDA_OK(cudaFree(m));
  ot::check("managed_freed_once", cudaFree(m) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  CUDA_OK(cudaFree(d));
  return ot::finish();
}
