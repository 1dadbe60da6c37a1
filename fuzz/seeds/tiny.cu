// Source of the small module images in fuzz/corpus (fuzz/seeds/make: nvcc -fatbin / -cubin / -ptx).
// A kernel with pointer, scalar and struct parameters, one with none, a __device__ variable with an
// initialiser and a __constant__ one: the shapes fatbin.cpp and the PTX executor look for, in few
// bytes.
struct P {
  int a;
  double b;
};
__device__ int dval = 7;
__constant__ float cval[4];
extern "C" __global__ void add(float* out, const float* in, int n, P p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + cval[i & 3] + static_cast<float>(p.b) + p.a + dval;
}
extern "C" __global__ void nop() {}
