// Graph launch cost (issue #13, "graph launch is one frame"): 40 launches of a graph of 500 empty
// kernels against the same 500 x 40 launches issued directly, in one run. Prints the issue time
// (until the calls return) and the total (until the stream is idle), per graph launch. Run by hand
// (bench/results/2026-11-24-graph-launch.txt): oriond --sim-execute none isolates the frame path.
#include <chrono>
#include <cstdio>
__global__ void nothing() {}
int main() {
  const int nodes = 500, launches = 40;
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaGraph_t g;
  cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  for (int i = 0; i < nodes; ++i) nothing<<<1, 1, 0, s>>>();
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&ge, g, 0);
  cudaGraphLaunch(ge, s);
  cudaStreamSynchronize(s);
  auto t0 = std::chrono::steady_clock::now();
  for (int l = 0; l < launches; ++l) cudaGraphLaunch(ge, s);
  auto t1 = std::chrono::steady_clock::now();
  cudaStreamSynchronize(s);
  auto t2 = std::chrono::steady_clock::now();
  for (int l = 0; l < launches; ++l)
    for (int i = 0; i < nodes; ++i) nothing<<<1, 1, 0, s>>>();
  auto t3 = std::chrono::steady_clock::now();
  cudaStreamSynchronize(s);
  auto t4 = std::chrono::steady_clock::now();
  auto us = [](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
  printf("graph: issue %.1f us/launch, total %.1f us/launch; direct: issue %.1f us/500 launches, total %.1f; err=%s\n",
         us(t0, t1) / launches, us(t0, t2) / launches, us(t2, t3) / launches, us(t2, t4) / launches,
         cudaGetErrorString(cudaGetLastError()));
}
