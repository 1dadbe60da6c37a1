// quota.cu — the vGPU memory quota (env ORION_GMEM, MiB) is enforced by cudaMalloc.
//
// Prints (besides CHECK lines):
//   QUOTA gmem_mib=<ORION_GMEM> allocated_mib=<n>
// The allocation loop is capped at ORION_GMEM + 1024 chunks, so it ends on a GPU without a quota.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "orion_test.h"

using ot::check;
using ot::fmt;

static const size_t MiB = 1 << 20;

int main() {
  ot::detect_device();
  const char* env = getenv("ORION_GMEM");
  if (!env || !*env || strtoull(env, nullptr, 10) == 0) {
    check("quota_env", false, "ORION_GMEM is not set (MiB)");
    return ot::finish();
  }
  const unsigned long long gmem = strtoull(env, nullptr, 10);

  std::vector<char*> chunks;
  cudaError_t last = cudaSuccess;
  for (unsigned long long i = 0; i < gmem + 1024; ++i) {
    char* p = nullptr;
    last = cudaMalloc((void**)&p, MiB);
    if (last != cudaSuccess) break;
    chunks.push_back(p);
  }
  cudaGetLastError();
  const unsigned long long got = chunks.size();
  printf("QUOTA gmem_mib=%llu allocated_mib=%llu\n", gmem, got);
  check("quota_failure_is_oom", last == cudaErrorMemoryAllocation,
        fmt("last cudaMalloc -> %s (%d) after %llu MiB", cudaGetErrorName(last), (int)last, got));
  check("quota_upper_bound", got <= gmem, fmt("allocated %llu MiB > ORION_GMEM %llu MiB", got, gmem));
  check("quota_lower_bound", got + 64 >= gmem,
        fmt("allocated %llu MiB < ORION_GMEM-64 = %lld MiB", got, (long long)gmem - 64));

  // Chunks are distinct and do not overlap.
  std::vector<char*> sorted = chunks;
  std::sort(sorted.begin(), sorted.end());
  bool overlap = false;
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i] < sorted[i - 1] + MiB) overlap = true;
  check("quota_chunks_disjoint", !overlap, "two 1 MiB allocations overlap");

  // Memory at quota still works: write and read the first and last chunk.
  if (!chunks.empty()) {
    unsigned char w[256], r[256];
    for (int i = 0; i < 256; ++i) w[i] = (unsigned char)(i ^ 0x5A);
    bool ok = true;
    for (char* p : {chunks.front(), chunks.back()}) {
      CUDA_OK(cudaMemcpy(p + MiB - 256, w, 256, cudaMemcpyHostToDevice));
      memset(r, 0, 256);
      CUDA_OK(cudaMemcpy(r, p + MiB - 256, 256, cudaMemcpyDeviceToHost));
      ok = ok && memcmp(r, w, 256) == 0;
    }
    check("quota_memory_usable", ok, "readback mismatch");
  }

  for (char* p : chunks) CUDA_OK(cudaFree(p));
  chunks.clear();

  // One allocation bigger than the quota fails cleanly.
  char* big = nullptr;
  cudaError_t e = cudaMalloc((void**)&big, (size_t)(gmem + 1) * MiB);
  ot::expect_error("quota_oversize_single", e, cudaErrorMemoryAllocation);
  if (e == cudaSuccess) CUDA_OK(cudaFree(big));

  // After freeing, memory is available again: 1 MiB, then half of what fit before in one piece.
  char* p = nullptr;
  e = cudaMalloc((void**)&p, MiB);
  check("quota_alloc_after_free", e == cudaSuccess, fmt("cudaMalloc(1 MiB) -> %s", cudaGetErrorName(e)));
  if (e == cudaSuccess) CUDA_OK(cudaFree(p));
  cudaGetLastError();
  if (got >= 2) {
    e = cudaMalloc((void**)&p, (size_t)(got / 2) * MiB);
    check("quota_half_after_free", e == cudaSuccess, fmt("cudaMalloc(%llu MiB) -> %s", got / 2, cudaGetErrorName(e)));
    if (e == cudaSuccess) CUDA_OK(cudaFree(p));
    cudaGetLastError();
  }
  size_t fr = 0, tot = 0;
  CUDA_OK(cudaMemGetInfo(&fr, &tot));
  check("quota_meminfo_total", tot == gmem * MiB, fmt("total=%zu want %llu", tot, gmem * MiB));
  CUDA_OK(cudaDeviceSynchronize());
  return ot::finish();
}
