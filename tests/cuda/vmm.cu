// Virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, ...) and
// stream-ordered memory pools, as PyTorch's expandable segments and cudaMallocAsync backend use them.
//
// Run with ORION_GMEM=<MiB> (the quota is checked against cuMemCreate). Lines: CHECK ... / DONE.
// Kernels are computed (the sim's PTX executor), so a kernel writing across two mappings is
// checked by value.
#include <cuda.h>

#include <cstdlib>

#include "orion_test.h"

#define CU_OK(expr)                                                                             \
  do {                                                                                          \
    CUresult _r = (expr);                                                                       \
    if (_r != CUDA_SUCCESS) {                                                                   \
      const char* _n = nullptr;                                                                 \
      cuGetErrorName(_r, &_n);                                                                  \
      printf("CUDA_ERROR %s %d %s:%d %s\n", _n ? _n : "?", (int)_r, __FILE__, __LINE__, #expr); \
      exit(2);                                                                                  \
    }                                                                                           \
  } while (0)

__global__ void fill_index(unsigned* p, size_t n, unsigned salt) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (unsigned)i * 2654435761u + salt;
}

static CUmemAllocationProp Prop(int dev) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // as PyTorch asks
  return p;
}

static size_t FreeBytes() {
  size_t f = 0, t = 0;
  CUDA_OK(cudaMemGetInfo(&f, &t));
  return f;
}

int main() {
  ot::init_output();
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaFree(nullptr));  // the primary context
  int vmm = 0, pools = 0, posix = 0;
  CUDA_OK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0));
  CU_OK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  CU_OK(cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
  ot::check("attr_vmm_supported", vmm == 1, ot::fmt("%d", vmm));
  ot::check("attr_pools_supported", pools == 1, ot::fmt("%d", pools));
  ot::check("attr_no_shareable_handles", posix == 0, ot::fmt("%d", posix));

  const CUmemAllocationProp prop = Prop(0);
  size_t gran = 0;
  CU_OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  ot::check("granularity_2mib", gran == (2u << 20), ot::fmt("%zu", gran));

  // An expandable segment: reserve 16 MiB, grow it by mapping 2 MiB, then 4 MiB, side by side.
  const size_t reserve = 16u << 20;
  CUdeviceptr base = 0;
  CU_OK(cuMemAddressReserve(&base, reserve, 0, 0, 0));
  ot::check("reserve_aligned", base != 0 && base % gran == 0, ot::fmt("0x%llx", (unsigned long long)base));
  const size_t free0 = FreeBytes();
  CUmemGenericAllocationHandle h1 = 0, h2 = 0;
  CU_OK(cuMemCreate(&h1, gran, &prop, 0));
  CU_OK(cuMemCreate(&h2, 2 * gran, &prop, 0));
  const size_t free1 = FreeBytes();
  ot::check("create_charges_quota", free0 - free1 == 3 * gran, ot::fmt("free %zu -> %zu", free0, free1));
  CU_OK(cuMemMap(base, gran, 0, h1, 0));
  CU_OK(cuMemMap(base + gran, 2 * gran, 0, h2, 0));
  // Not yet accessible: a copy into the mapping is refused.
  std::vector<uint8_t> src(3 * gran), back(3 * gran);
  ot::Rng rng(2024);
  rng.fill(src.data(), src.size());
  ot::check("no_access_before_set_access", cuMemcpyHtoD(base, src.data(), 64) != CUDA_SUCCESS);
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_OK(cuMemSetAccess(base, 3 * gran, &acc, 1));
  unsigned long long got_flags = 0;
  CU_OK(cuMemGetAccess(&got_flags, &acc.location, base + gran + 5));
  ot::check("get_access", got_flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, ot::fmt("%llu", got_flags));

  // One copy across both mappings, byte-exact both ways.
  CU_OK(cuMemcpyHtoD(base, src.data(), src.size()));
  CU_OK(cuMemcpyDtoH(back.data(), base, back.size()));
  ot::check("copy_across_mappings", src == back, ot::diff_details(back.data(), src.data(), src.size()));
  // A range running into the unmapped rest of the reservation is refused.
  ot::check("copy_into_unmapped_refused", cuMemcpyHtoD(base + 3 * gran - 16, src.data(), 32) != CUDA_SUCCESS);

  // A kernel writes the whole segment; every word is checked.
  const size_t n = 3 * gran / sizeof(unsigned);
  fill_index<<<64, 256>>>(reinterpret_cast<unsigned*>(base), n, 7u);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<unsigned> words(n);
  CU_OK(cuMemcpyDtoH(words.data(), base, n * sizeof(unsigned)));
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += words[i] != (unsigned)i * 2654435761u + 7u;
  ot::check_kernel("kernel_across_mappings", bad == 0, ot::fmt("%zu of %zu words wrong", bad, n));

  // Aliasing: h2 mapped a second time in another reservation shows the same bytes.
  CUdeviceptr other = 0;
  CU_OK(cuMemAddressReserve(&other, 2 * gran, 0, 0, 0));
  CU_OK(cuMemMap(other, 2 * gran, 0, h2, 0));
  CU_OK(cuMemSetAccess(other, 2 * gran, &acc, 1));
  std::vector<uint8_t> alias(2 * gran);
  CU_OK(cuMemcpyDtoH(alias.data(), other, alias.size()));
  std::vector<uint8_t> want(reinterpret_cast<uint8_t*>(words.data()) + gran,
                            reinterpret_cast<uint8_t*>(words.data()) + 3 * gran);
  ot::check("second_mapping_aliases", alias == want, ot::diff_details(alias.data(), want.data(), want.size()));
  const uint32_t marker = 0xC0FFEE11u;
  CU_OK(cuMemsetD32(other + 64, marker, 1));
  uint32_t seen = 0;
  CU_OK(cuMemcpyDtoH(&seen, base + gran + 64, 4));
  ot::check("write_through_alias", seen == marker, ot::fmt("0x%x", seen));

  // Handle bookkeeping: properties and retain.
  CUmemAllocationProp got{};
  CU_OK(cuMemGetAllocationPropertiesFromHandle(&got, h2));
  ot::check("props_from_handle", got.location.id == 0 && got.type == CU_MEM_ALLOCATION_TYPE_PINNED);
  CUmemGenericAllocationHandle again = 0;
  CU_OK(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(base + gran + 100)));
  ot::check("retain_gives_handle", again == h2);
  CU_OK(cuMemRelease(again));

  // Hostile or wrong use is refused, nothing changes.
  CUmemGenericAllocationHandle h3 = 0;
  ot::check("create_unaligned_refused", cuMemCreate(&h3, gran + 4096, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
  ot::check("map_overlap_refused", cuMemMap(base + gran, gran, 0, h1, 0) == CUDA_ERROR_INVALID_VALUE);
  ot::check("map_outside_reservation_refused", cuMemMap(base + reserve, gran, 0, h1, 0) == CUDA_ERROR_INVALID_VALUE);
  ot::check("map_past_handle_refused", cuMemMap(base + 4 * gran, 2 * gran, 0, h1, 0) == CUDA_ERROR_INVALID_VALUE);
  ot::check("map_bad_handle_refused", cuMemMap(base + 4 * gran, gran, 0, 0xdead000, 0) != CUDA_SUCCESS);
  ot::check("free_reservation_with_mappings_refused", cuMemAddressFree(base, reserve) == CUDA_ERROR_INVALID_VALUE);
  ot::check("unmap_partial_refused", cuMemUnmap(base + gran, gran) == CUDA_ERROR_INVALID_VALUE);
  int fd = -1;
  ot::check("export_not_supported", cuMemExportToShareableHandle(&fd, h1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                                 0) == CUDA_ERROR_NOT_SUPPORTED);
  CUresult big = cuMemCreate(&h3, ((size_t)atoll(getenv("ORION_GMEM") ? getenv("ORION_GMEM") : "512") << 20), &prop, 0);
  ot::check("create_past_quota_refused", big == CUDA_ERROR_OUT_OF_MEMORY, ot::fmt("%d", (int)big));

  // Release while mapped: the memory lives (and stays charged) until its last mapping goes.
  CU_OK(cuMemRelease(h2));
  CU_OK(cuMemcpyDtoH(&seen, other + 64, 4));
  ot::check("released_but_mapped_still_readable", seen == marker, ot::fmt("0x%x", seen));
  ot::check("released_still_charged", FreeBytes() == free1, ot::fmt("%zu vs %zu", FreeBytes(), free1));
  CU_OK(cuMemUnmap(other, 2 * gran));
  CU_OK(cuMemAddressFree(other, 2 * gran));
  ot::check("unmapped_alias_refused", cuMemcpyDtoH(&seen, other + 64, 4) != CUDA_SUCCESS);
  CU_OK(cuMemUnmap(base, 3 * gran));  // both mappings at once
  CU_OK(cuMemRelease(h1));
  CU_OK(cuMemAddressFree(base, reserve));
  ot::check("all_returned_to_quota", FreeBytes() == free0, ot::fmt("%zu vs %zu", FreeBytes(), free0));

  // A fixed address (cuMemAddressReserve's `addr`, a hint): a free range is given where asked; one
  // that is taken, or off the granularity, gives a usable range elsewhere, never an error.
  CUdeviceptr at = 0, again_at = 0, off = 0;
  CU_OK(cuMemAddressReserve(&at, 2 * gran, 0, base + gran, 0));
  ot::check("reserve_at_free_fixed_address", at == base + gran,
            ot::fmt("asked 0x%llx got 0x%llx", (unsigned long long)(base + gran), (unsigned long long)at));
  CU_OK(cuMemAddressReserve(&again_at, gran, 0, at, 0));
  ot::check("reserve_at_taken_address_goes_elsewhere",
            again_at != 0 && again_at % gran == 0 && (again_at + gran <= at || again_at >= at + 2 * gran),
            ot::fmt("0x%llx", (unsigned long long)again_at));
  CU_OK(cuMemAddressReserve(&off, gran, 0, base + 4096, 0));
  ot::check("reserve_at_unaligned_address_goes_elsewhere", off != 0 && off % gran == 0 && off != at,
            ot::fmt("0x%llx", (unsigned long long)off));
  CU_OK(cuMemAddressFree(at, 2 * gran));
  CU_OK(cuMemAddressFree(again_at, gran));
  CU_OK(cuMemAddressFree(off, gran));

  // Stream-ordered pools: the default pool counts what it hands out; a pool with maxSize is bounded.
  cudaMemPool_t def;
  CUDA_OK(cudaDeviceGetDefaultMemPool(&def, 0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  void* a = nullptr;
  CUDA_OK(cudaMallocAsync(&a, 3u << 20, s));
  cuuint64_t used = 0, high = 0;
  CUDA_OK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &used));
  ot::check("pool_counts_used", used == (3u << 20), ot::fmt("%llu", (unsigned long long)used));
  CUDA_OK(cudaFreeAsync(a, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &used));
  CUDA_OK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrUsedMemHigh, &high));
  ot::check("pool_counts_free", used == 0 && high == (3u << 20),
            ot::fmt("%llu %llu", (unsigned long long)used, (unsigned long long)high));
  cuuint64_t threshold = ~0ull;
  CUDA_OK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));
  CUDA_OK(cudaMemPoolTrimTo(def, 0));
  cudaMemPoolProps pp{};
  pp.allocType = cudaMemAllocationTypePinned;
  pp.location.type = cudaMemLocationTypeDevice;
  pp.location.id = 0;
  pp.maxSize = 4u << 20;
  cudaMemPool_t mine;
  CUDA_OK(cudaMemPoolCreate(&mine, &pp));
  void* b = nullptr;
  CUDA_OK(cudaMallocFromPoolAsync(&b, 3u << 20, mine, s));
  void* c = nullptr;
  ot::check("pool_max_size_enforced", cudaMallocFromPoolAsync(&c, 2u << 20, mine, s) == cudaErrorMemoryAllocation);
  cudaGetLastError();
  std::vector<uint8_t> pv(3u << 20), pb(3u << 20);
  rng.fill(pv.data(), pv.size());
  CUDA_OK(cudaMemcpyAsync(b, pv.data(), pv.size(), cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaMemcpyAsync(pb.data(), b, pb.size(), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaFreeAsync(b, s));
  CUDA_OK(cudaStreamSynchronize(s));
  ot::check("pool_roundtrip", pv == pb, ot::diff_details(pb.data(), pv.data(), pv.size()));
  CUDA_OK(cudaMemPoolDestroy(mine));
  CUDA_OK(cudaStreamDestroy(s));
  return ot::finish();
}
