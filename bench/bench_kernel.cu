// The kernel orion_bench launches (its arithmetic never matters: on sim it does not run).
extern "C" __global__ void bench_kernel(int* p, int v) { p[threadIdx.x] += v; }
