// memory.cu — memory operations through the CUDA runtime, checked byte for byte.
// Every memory operation really happens on the sim backend too, so all data checks run there;
// only the one kernel (writing through a mapped host pointer) is skipped on sim.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "orion_test.h"

using ot::check;
using ot::fmt;

static const size_t MiB = 1 << 20;

__global__ void k_write_mapped(unsigned char* p, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = (unsigned char)(i * 7 + 3);
}

static void roundtrips(ot::Rng& rng) {
  std::vector<size_t> sizes = {1, 7, 4096, 65537, 1 << 20, 3 * MiB + 5, 64 * MiB};
  ot::Rng pick(12345);
  for (int i = 0; i < 13; ++i) {  // log-uniform in [1, 64 MiB]
    int bits = (int)(pick.next() % 26);
    size_t lo = (size_t)1 << bits;
    sizes.push_back(lo + pick.next() % lo);
  }
  for (size_t n : sizes) {
    std::vector<unsigned char> src(n), dst(n);
    rng.fill(src.data(), n);
    memset(dst.data(), ~src[0], n);
    void* d = nullptr;
    CUDA_OK(cudaMalloc(&d, n));
    CUDA_OK(cudaMemcpy(d, src.data(), n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dst.data(), d, n, cudaMemcpyDeviceToHost));
    check(fmt("roundtrip_%zu", n), memcmp(src.data(), dst.data(), n) == 0, ot::diff_details(dst.data(), src.data(), n));
    if (n >= 4096) {  // a partial read from an odd offset inside the allocation
      size_t off = n / 3 + 1, len = n / 2 - 3;
      std::vector<unsigned char> part(len, 0);
      CUDA_OK(cudaMemcpy(part.data(), (char*)d + off, len, cudaMemcpyDeviceToHost));
      check(fmt("partial_read_%zu", n), memcmp(part.data(), src.data() + off, len) == 0,
            ot::diff_details(part.data(), src.data() + off, len));
    }
    CUDA_OK(cudaFree(d));
  }
}

static void memsets(ot::Rng& rng) {
  const size_t n = MiB + 3;
  std::vector<unsigned char> mirror(n), got(n);
  rng.fill(mirror.data(), n);
  unsigned char* d = nullptr;
  CUDA_OK(cudaMalloc(&d, n));
  CUDA_OK(cudaMemcpy(d, mirror.data(), n, cudaMemcpyHostToDevice));
  struct Op {
    size_t off, len;
    int val;
  } ops[] = {
      {0, 1, 0xAB},           {1, 7, 0x00},     {13, 4093, 0x5C},
      {4097, 65535, 0xFF},    {n - 1, 1, 0x11}, {333, 0, 0x22},
      {100001, 300001, 0x7E}, {65536, 3, 0x01}, {n - 77, 77, 0x1FE /* only the low byte (0xFE) counts */},
  };
  for (const Op& o : ops) {
    CUDA_OK(cudaMemset(d + o.off, o.val, o.len));
    memset(mirror.data() + o.off, o.val & 0xFF, o.len);
  }
  CUDA_OK(cudaMemcpy(got.data(), d, n, cudaMemcpyDeviceToHost));
  check("memset_odd_offsets", memcmp(got.data(), mirror.data(), n) == 0,
        ot::diff_details(got.data(), mirror.data(), n));

  // Whole large allocation.
  const size_t big = 3 * MiB + 5;
  unsigned char* d2 = nullptr;
  CUDA_OK(cudaMalloc(&d2, big));
  CUDA_OK(cudaMemset(d2, 0xC3, big));
  std::vector<unsigned char> g2(big, 0), w2(big, 0xC3);
  CUDA_OK(cudaMemcpy(g2.data(), d2, big, cudaMemcpyDeviceToHost));
  check("memset_large", memcmp(g2.data(), w2.data(), big) == 0, ot::diff_details(g2.data(), w2.data(), big));
  CUDA_OK(cudaFree(d2));
  CUDA_OK(cudaFree(d));
}

static void d2d(ot::Rng& rng) {
  const size_t na = 2 * MiB + 9, nb = 2 * MiB + 33;
  std::vector<unsigned char> a(na), want(nb, 0), got(nb);
  rng.fill(a.data(), na);
  unsigned char *da = nullptr, *db = nullptr;
  CUDA_OK(cudaMalloc(&da, na));
  CUDA_OK(cudaMalloc(&db, nb));
  CUDA_OK(cudaMemcpy(da, a.data(), na, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(db, 0, nb));
  CUDA_OK(cudaMemcpy(db + 5, da + 17, MiB + 3, cudaMemcpyDeviceToDevice));
  memcpy(want.data() + 5, a.data() + 17, MiB + 3);
  CUDA_OK(cudaMemcpy(db + MiB + 100, da, 999, cudaMemcpyDefault));
  memcpy(want.data() + MiB + 100, a.data(), 999);
  // Overlap-free copy within the same allocation.
  CUDA_OK(cudaMemcpy(db + 2 * MiB, db + 5, 33, cudaMemcpyDeviceToDevice));
  memcpy(want.data() + 2 * MiB, want.data() + 5, 33);
  CUDA_OK(cudaMemcpy(got.data(), db, nb, cudaMemcpyDeviceToHost));
  check("memcpy_d2d", memcmp(got.data(), want.data(), nb) == 0, ot::diff_details(got.data(), want.data(), nb));
  CUDA_OK(cudaFree(da));
  CUDA_OK(cudaFree(db));
}

static void memcpy2d(ot::Rng& rng) {
  const size_t w = 333, h = 17, spitch = 400, hpitch = 350;
  unsigned char* d = nullptr;
  size_t pitch = 0;
  CUDA_OK(cudaMallocPitch((void**)&d, &pitch, w, h));
  printf("INFO mallocpitch width=%zu pitch=%zu\n", w, pitch);
  check("mallocpitch_pitch", pitch >= w, fmt("pitch=%zu width=%zu", pitch, w));
  CUDA_OK(cudaMemset(d, 0xEE, pitch * h));

  std::vector<unsigned char> src(spitch * h);
  rng.fill(src.data(), src.size());
  CUDA_OK(cudaMemcpy2D(d, pitch, src.data(), spitch, w, h, cudaMemcpyHostToDevice));

  // Read the whole pitched block linearly: rows match, padding untouched.
  std::vector<unsigned char> lin(pitch * h), want(pitch * h, 0xEE);
  for (size_t r = 0; r < h; ++r) memcpy(want.data() + r * pitch, src.data() + r * spitch, w);
  CUDA_OK(cudaMemcpy(lin.data(), d, pitch * h, cudaMemcpyDeviceToHost));
  check("memcpy2d_h2d", memcmp(lin.data(), want.data(), lin.size()) == 0,
        ot::diff_details(lin.data(), want.data(), lin.size()));

  // D2H into a host pitch of 350; gaps keep their 0x77.
  std::vector<unsigned char> dst(hpitch * h, 0x77), wdst(hpitch * h, 0x77);
  for (size_t r = 0; r < h; ++r) memcpy(wdst.data() + r * hpitch, src.data() + r * spitch, w);
  CUDA_OK(cudaMemcpy2D(dst.data(), hpitch, d, pitch, w, h, cudaMemcpyDeviceToHost));
  check("memcpy2d_d2h", memcmp(dst.data(), wdst.data(), dst.size()) == 0,
        ot::diff_details(dst.data(), wdst.data(), dst.size()));

  // D2D: a 300x16 sub-rectangle starting at column 3, row 1 into a second pitched buffer.
  unsigned char* d2 = nullptr;
  size_t pitch2 = 0;
  CUDA_OK(cudaMallocPitch((void**)&d2, &pitch2, w, h));
  CUDA_OK(cudaMemset(d2, 0, pitch2 * h));
  CUDA_OK(cudaMemcpy2D(d2, pitch2, d + pitch + 3, pitch, 300, 16, cudaMemcpyDeviceToDevice));
  std::vector<unsigned char> lin2(pitch2 * h), want2(pitch2 * h, 0);
  for (size_t r = 0; r < 16; ++r) memcpy(want2.data() + r * pitch2, src.data() + (r + 1) * spitch + 3, 300);
  CUDA_OK(cudaMemcpy(lin2.data(), d2, lin2.size(), cudaMemcpyDeviceToHost));
  check("memcpy2d_d2d", memcmp(lin2.data(), want2.data(), lin2.size()) == 0,
        ot::diff_details(lin2.data(), want2.data(), lin2.size()));

  // A destination pitch smaller than the width is invalid.
  ot::expect_failure("memcpy2d_bad_pitch", cudaMemcpy2D(d2, 16, src.data(), spitch, 64, 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaFree(d2));
  CUDA_OK(cudaFree(d));
}

static void async_copies(ot::Rng& rng) {
  const size_t n = 8 * MiB + 1;
  unsigned char *hs = nullptr, *hd = nullptr, *d = nullptr;
  CUDA_OK(cudaMallocHost((void**)&hs, n));
  CUDA_OK(cudaMallocHost((void**)&hd, n));
  CUDA_OK(cudaMalloc((void**)&d, n));
  rng.fill(hs, n);
  memset(hd, 0, n);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  CUDA_OK(cudaMemcpyAsync(d, hs, n, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaMemsetAsync(d + 1000, 0x3C, 5000, s));
  CUDA_OK(cudaMemcpyAsync(hd, d, n, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  memset(hs + 1000, 0x3C, 5000);
  check("memcpy_async_stream", memcmp(hd, hs, n) == 0, ot::diff_details(hd, hs, n));

  // Plain (synchronous) cudaMemcpy with pinned buffers.
  rng.fill(hs, n);
  CUDA_OK(cudaMemcpy(d, hs, n, cudaMemcpyHostToDevice));
  memset(hd, 0, n);
  CUDA_OK(cudaMemcpy(hd, d, n, cudaMemcpyDeviceToHost));
  check("pinned_mallochost_roundtrip", memcmp(hd, hs, n) == 0, ot::diff_details(hd, hs, n));

  cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  CUDA_OK(cudaPointerGetAttributes(&a, hs));
  check("ptrattr_pinned", a.type == cudaMemoryTypeHost && a.hostPointer == hs,
        fmt("type=%d hostPointer=%p want type=%d hostPointer=%p", (int)a.type, a.hostPointer, (int)cudaMemoryTypeHost,
            (void*)hs));

  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(d));
  CUDA_OK(cudaFreeHost(hd));
  CUDA_OK(cudaFreeHost(hs));
}

static void mapped_and_registered(ot::Rng& rng) {
  const size_t n = 2 * MiB + 11;
  unsigned char* h = nullptr;
  CUDA_OK(cudaHostAlloc((void**)&h, n, cudaHostAllocMapped));
  void* dp = nullptr;
  // Mapped host memory needs memory the GPU can reach: Orion gives it over shared memory (and a
  // real GPU does); over a network transport it must be refused with cudaErrorNotSupported.
  const cudaError_t map_err = cudaHostGetDevicePointer(&dp, h, 0);
  const bool mapped = map_err == cudaSuccess;
  if (!mapped) {
    cudaGetLastError();
    printf("MAPPED unsupported %s\n", cudaGetErrorName(map_err));
    check("hostalloc_mapped_refused_cleanly", map_err == cudaErrorNotSupported,
          fmt("got %s", cudaGetErrorName(map_err)));
  } else {
    check("hostalloc_mapped_devptr", dp != nullptr, "device pointer is NULL");
  }
  cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  CUDA_OK(cudaPointerGetAttributes(&a, h));
  check("ptrattr_mapped", a.type == cudaMemoryTypeHost, fmt("type=%d want %d", (int)a.type, (int)cudaMemoryTypeHost));

  unsigned char* d = nullptr;
  CUDA_OK(cudaMalloc((void**)&d, n));
  std::vector<unsigned char> want(n), got(n);
  rng.fill(want.data(), n);
  memcpy(h, want.data(), n);
  CUDA_OK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
  memset(h, 0, n);
  CUDA_OK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
  check("hostalloc_mapped_roundtrip", memcmp(h, want.data(), n) == 0, ot::diff_details(h, want.data(), n));

  // The mapped device address used as a device-side source (copy engine reads host memory).
  if (mapped) {
    rng.fill(want.data(), n);
    memcpy(h, want.data(), n);
    CUDA_OK(cudaMemcpy(d, dp, n, cudaMemcpyDeviceToDevice));
    CUDA_OK(cudaMemcpy(got.data(), d, n, cudaMemcpyDeviceToHost));
    check("hostalloc_mapped_devptr_d2d", memcmp(got.data(), want.data(), n) == 0,
          ot::diff_details(got.data(), want.data(), n));

    // A kernel writing through the mapped device pointer (results only on a real GPU).
    memset(h, 0, n);
    k_write_mapped<<<64, 256>>>((unsigned char*)dp, n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    {
      size_t bad = n;
      for (size_t i = 0; i < n; ++i)
        if (h[i] != (unsigned char)(i * 7 + 3)) {
          bad = i;
          break;
        }
      ot::check_kernel("mapped_kernel_write", bad == n, fmt("first wrong byte at %zu", bad));
    }
  }  // mapped
  CUDA_OK(cudaFree(d));
  CUDA_OK(cudaFreeHost(h));

  // cudaHostRegister of a malloc'd (unaligned size) buffer.
  const size_t m = MiB + 123;
  unsigned char* buf = (unsigned char*)malloc(m);
  unsigned char* back = (unsigned char*)malloc(m);
  CUDA_OK(cudaHostRegister(buf, m, cudaHostRegisterDefault));
  memset(&a, 0, sizeof a);
  CUDA_OK(cudaPointerGetAttributes(&a, buf));
  check("ptrattr_registered", a.type == cudaMemoryTypeHost,
        fmt("type=%d want %d", (int)a.type, (int)cudaMemoryTypeHost));
  rng.fill(buf, m);
  unsigned char* d3 = nullptr;
  CUDA_OK(cudaMalloc((void**)&d3, m));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  CUDA_OK(cudaMemcpyAsync(d3, buf, m, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaStreamSynchronize(s));
  memcpy(back, buf, m);
  memset(buf, 0, m);
  CUDA_OK(cudaMemcpyAsync(buf, d3, m, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  check("hostregister_roundtrip", memcmp(buf, back, m) == 0, ot::diff_details(buf, back, m));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaHostUnregister(buf));
  CUDA_OK(cudaFree(d3));
  free(buf);
  free(back);
}

static void attributes_and_info(const cudaDeviceProp& prop) {
  size_t fr = 0, tot = 0;
  CUDA_OK(cudaMemGetInfo(&fr, &tot));
  check("meminfo_free_le_total", tot > 0 && fr <= tot, fmt("free=%zu total=%zu", fr, tot));
  check("meminfo_total_eq_props", tot == prop.totalGlobalMem,
        fmt("cudaMemGetInfo total=%zu totalGlobalMem=%zu", tot, prop.totalGlobalMem));

  char* d = nullptr;
  CUDA_OK(cudaMalloc((void**)&d, 4 * MiB));
  cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  CUDA_OK(cudaPointerGetAttributes(&a, d));
  check("ptrattr_device", a.type == cudaMemoryTypeDevice && a.device == 0 && a.devicePointer == d,
        fmt("type=%d device=%d devicePointer=%p want type=%d device=0 devicePointer=%p", (int)a.type, a.device,
            a.devicePointer, (int)cudaMemoryTypeDevice, (void*)d));
  memset(&a, 0, sizeof a);
  CUDA_OK(cudaPointerGetAttributes(&a, d + 12345));
  check("ptrattr_device_interior", a.type == cudaMemoryTypeDevice && a.devicePointer == d + 12345,
        fmt("type=%d devicePointer=%p", (int)a.type, a.devicePointer));
  CUDA_OK(cudaFree(d));

  int local = 0;
  memset(&a, 0, sizeof a);
  cudaError_t e = cudaPointerGetAttributes(&a, &local);
  check("ptrattr_unregistered", e == cudaSuccess && a.type == cudaMemoryTypeUnregistered,
        fmt("err=%s type=%d", cudaGetErrorName(e), (int)a.type));
  cudaGetLastError();
}

static void invalid_cases() {
  std::vector<unsigned char> h(16384, 0x5A);
  char* d = nullptr;
  CUDA_OK(cudaMalloc((void**)&d, 4096));
  CUDA_OK(cudaFree(d));
  ot::expect_error("invalid_h2d_freed", cudaMemcpy(d, h.data(), 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  ot::expect_error("invalid_d2h_freed", cudaMemcpy(h.data(), d, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);

  CUDA_OK(cudaMalloc((void**)&d, 4096));
  ot::expect_error("invalid_h2d_past_end", cudaMemcpy(d, h.data(), 8192, cudaMemcpyHostToDevice),
                   cudaErrorInvalidValue);
  ot::expect_error("invalid_h2d_tail_past_end", cudaMemcpy(d + 4000, h.data(), 200, cudaMemcpyHostToDevice),
                   cudaErrorInvalidValue);
  ot::expect_error("invalid_d2h_past_end", cudaMemcpy(h.data(), d + 1, 4096, cudaMemcpyDeviceToHost),
                   cudaErrorInvalidValue);
  ot::expect_error("invalid_memset_past_end", cudaMemset(d + 2048, 0, 4096), cudaErrorInvalidValue);

  ot::expect_failure("invalid_free_bogus", cudaFree((void*)0xdeadbeef000ull));
  ot::expect_failure("invalid_free_interior", cudaFree(d + 8));
  CUDA_OK(cudaFree(d));
  ot::expect_failure("invalid_double_free", cudaFree(d));
  check("free_null_ok", cudaFree(nullptr) == cudaSuccess, "cudaFree(NULL) failed");

  // None of the above may leave a sticky or deferred error behind.
  cudaError_t e = cudaDeviceSynchronize();
  check("no_deferred_error", e == cudaSuccess, fmt("cudaDeviceSynchronize -> %s", cudaGetErrorName(e)));
  std::vector<unsigned char> back(4096, 0);
  CUDA_OK(cudaMalloc((void**)&d, 4096));
  CUDA_OK(cudaMemcpy(d, h.data(), 4096, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(back.data(), d, 4096, cudaMemcpyDeviceToHost));
  check("valid_after_invalid", memcmp(back.data(), h.data(), 4096) == 0, ot::diff_details(back.data(), h.data(), 4096));
  CUDA_OK(cudaFree(d));
}

int main() {
  cudaDeviceProp prop = ot::detect_device();
  ot::Rng rng(0x0123456789ABCDEFull);
  roundtrips(rng);
  memsets(rng);
  d2d(rng);
  memcpy2d(rng);
  async_copies(rng);
  mapped_and_registered(rng);
  attributes_and_info(prop);
  invalid_cases();
  CUDA_OK(cudaDeviceSynchronize());
  return ot::finish();
}
