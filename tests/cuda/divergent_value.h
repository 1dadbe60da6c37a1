// divergent_value.h — the per-thread value of the `divergent` test kernel (kernels_common.cuh),
// for the device and, as the reference, for host code (compute.cu, ptx/src/ptx_test.cpp).
#pragma once

#ifdef __CUDACC__
#define ORION_HOST_DEVICE __host__ __device__
#else
#define ORION_HOST_DEVICE
#endif

ORION_HOST_DEVICE inline int DivergentValue(int t) {
  int v = 0;
  if (t % 3 == 0) {
    for (int k = 0; k < t; ++k) v += k;
  } else if (t % 3 == 1) {
    v = -t;
    while (v < 100) v = (v < 0 ? -v : v) * 2 + 7;
  } else {
#ifdef __CUDA_ARCH__
    v = __popc(t) * 1000 + __clz(t);
#else
    v = __builtin_popcount(static_cast<unsigned>(t)) * 1000 + (t == 0 ? 32 : __builtin_clz(static_cast<unsigned>(t)));
#endif
  }
  return v;
}

// What out[t] of a block of `threads` (a multiple of 32) holds after `divergent`.
inline void DivergentReference(int threads, int* out) {
  for (int w = 0; w < threads / 32; ++w) {
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l)
      if (DivergentValue(w * 32 + l) & 1) ballot |= 1u << l;
    for (int l = 0; l < 32; ++l) out[w * 32 + l] = DivergentValue(w * 32 + l) ^ static_cast<int>(ballot);
  }
}
