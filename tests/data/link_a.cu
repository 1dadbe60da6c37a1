// JIT-linking fixture, part A (compiled with -rdc=true -ptx): a kernel calling a function and
// reading a variable defined in link_b.cu. Linked by the guest's cuLinkComplete (ptx/src/link.cpp),
// checked in ptx/src/link_test.cpp and tests/cuda/jit_link.cpp.
extern __device__ int scale(int x);
extern __device__ int bias;

extern "C" __global__ void apply(int* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = scale(a[i]) + bias;
}
