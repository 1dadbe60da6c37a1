// memcpy_bw: 256 MiB host<->device copies from pageable (new[]) and pinned (cudaMallocHost) memory.
// For each source kind and direction: TIME memcpy_<h2d|d2h>_<pageable|pinned> = the mean of 4 copies
// (each timed run: 4 copies + sync, after one warm-up run), and a BW line with the same name.
// Correctness: a pattern copied H2D and back D2H arrives intact, for both kinds.
#include <cstring>
#include <memory>

#include "e2e.h"

int main() {
  e2e::start("memcpy_bw");
  const size_t bytes = size_t(256) << 20, words = bytes / 4;
  const int reps = 4;
  void* dbuf;
  E2E_CK(cudaMalloc(&dbuf, bytes));
  std::unique_ptr<uint32_t[]> psrc(new uint32_t[words]), pdst(new uint32_t[words]);
  uint32_t *hsrc, *hdst;
  E2E_CK(cudaMallocHost(&hsrc, bytes));
  E2E_CK(cudaMallocHost(&hdst, bytes));
  for (size_t i = 0; i < words; ++i) psrc[i] = hsrc[i] = static_cast<uint32_t>(i * 2654435761u) ^ 0xa5a5a5a5u;
  memset(pdst.get(), 0, bytes);  // touch every page before timing
  memset(hdst, 0, bytes);
  struct Kind {
    const char* name;
    uint32_t* src;
    uint32_t* dst;
  } kinds[] = {{"pageable", psrc.get(), pdst.get()}, {"pinned", hsrc, hdst}};
  for (const Kind& k : kinds) {
    char name[64];
    snprintf(name, sizeof name, "memcpy_h2d_%s", k.name);
    double ms = e2e::measure([&] {
                  for (int r = 0; r < reps; ++r) E2E_CK(cudaMemcpy(dbuf, k.src, bytes, cudaMemcpyHostToDevice));
                  E2E_CK(cudaDeviceSynchronize());
                }) /
                reps;
    printf("TIME %s %.3f\nBW %s %.2f\n", name, ms, name, bytes / (ms * 1e6));
    snprintf(name, sizeof name, "memcpy_d2h_%s", k.name);
    ms = e2e::measure(
             [&] {
               for (int r = 0; r < reps; ++r) E2E_CK(cudaMemcpy(k.dst, dbuf, bytes, cudaMemcpyDeviceToHost));
               E2E_CK(cudaDeviceSynchronize());
             },
             [&] { memset(k.dst, 0, bytes); }) /
         reps;
    printf("TIME %s %.3f\nBW %s %.2f\n", name, ms, name, bytes / (ms * 1e6));
    if (memcmp(k.src, k.dst, bytes) != 0) {
      size_t i = 0;
      while (k.src[i] == k.dst[i]) ++i;
      e2e::fail("%s round trip: word %zu is %08x, expected %08x", k.name, i, k.dst[i], k.src[i]);
    }
  }
  E2E_CK(cudaFreeHost(hsrc));
  E2E_CK(cudaFreeHost(hdst));
  E2E_CK(cudaFree(dbuf));
  return e2e::pass();
}
