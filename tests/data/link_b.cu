// JIT-linking fixture, part B: the definitions link_a.cu refers to.
__device__ int bias = 7;

__device__ __noinline__ int scale(int x) { return x * 3; }
