// lib_marks.h — markers in the sim launch log for the library test programs (blas.cu, fft.cu, ...).
//
// A library call launches kernels the program cannot name in advance. To tie launches to calls,
// a program calls ot::mark(id, "what") right before each library call: it launches the empty
// kernel orion_mark(id) and prints "MARK <id> <what>". In the launch log every launch between the
// orion_mark launch with params <id as u32 LE hex> and the next marker belongs to that call
// (tests/integration/test_libraries.py splits the log this way). Kernels run in stream order on one
// channel, so the log's order is the program's.
#pragma once

#include "orion_test.h"

__global__ void orion_mark(unsigned id) { (void)id; }

namespace ot {
inline void mark(unsigned id, const char* what) {
  CUDA_OK(cudaDeviceSynchronize());
  orion_mark<<<1, 1>>>(id);
  CUDA_OK(cudaGetLastError());
  printf("MARK %u %s\n", id, what);
}
}  // namespace ot
