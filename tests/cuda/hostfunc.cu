// Host functions in stream order (cudaLaunchHostFunc / cudaStreamAddCallback): a function sees the
// bytes an earlier async copy wrote; work issued after it waits until it returns (a copy from a
// buffer it fills carries its value); callbacks of a stream run once each, in order; cudaStreamQuery
// says not ready while one is pending; captured, they are graph host nodes run in stream order at
// each launch (stream callbacks are refused in capture). Kernels are computed (PTX executor).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "orion_test.h"

__global__ void add(int* p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += v;
}

static const int N = 4096;

struct Seen {
  const int* host = nullptr;  // the pinned buffer an earlier DtoH filled
  int want = 0;
  std::atomic<int> calls{0};
  bool values_ok = false;
};
static void CheckValues(void* p) {
  auto* s = static_cast<Seen*>(p);
  bool ok = true;
  for (int i = 0; i < N; ++i) ok &= s->host[i] == s->want;
  s->values_ok = ok;
  s->calls++;
}

struct Slow {
  int* pinned = nullptr;
  std::atomic<bool> done{false};
};
static void SlowFill(void* p) {
  auto* s = static_cast<Slow*>(p);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int i = 0; i < N; ++i) s->pinned[i] = 777;
  s->done = true;
}

struct Order {
  std::vector<int> seen;
  std::atomic<int> status_bad{0};
  cudaStream_t expect{};
};
struct Tag {
  Order* order;
  int value;
};
static void CUDART_CB Callback(cudaStream_t s, cudaError_t status, void* p) {
  auto* t = static_cast<Tag*>(p);
  if (status != cudaSuccess || s != t->order->expect) t->order->status_bad++;
  t->order->seen.push_back(t->value);
}
// A host node's function: records its tag in order.
static void CUDART_CB Record(void* p) {
  auto* t = static_cast<Tag*>(p);
  t->order->seen.push_back(t->value);
}

int main() {
  ot::init_output();
  CUDA_OK(cudaSetDevice(0));
  int* d = nullptr;
  CUDA_OK(cudaMalloc(&d, N * sizeof(int)));
  int *h = nullptr, *h2 = nullptr, *fill = nullptr;
  CUDA_OK(cudaMallocHost(&h, N * sizeof(int)));
  CUDA_OK(cudaMallocHost(&h2, N * sizeof(int)));
  CUDA_OK(cudaMallocHost(&fill, N * sizeof(int)));
  for (int i = 0; i < N; ++i) h[i] = 5;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));

  // 1. The function sees what the stream's earlier async copy wrote (5 + 1 computed on device).
  Seen seen;
  seen.host = h2;
  seen.want = 6;
  CUDA_OK(cudaMemcpyAsync(d, h, N * sizeof(int), cudaMemcpyHostToDevice, s));
  add<<<N / 256, 256, 0, s>>>(d, N, 1);
  CUDA_OK(cudaMemcpyAsync(h2, d, N * sizeof(int), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaLaunchHostFunc(s, CheckValues, &seen));
  add<<<N / 256, 256, 0, s>>>(d, N, 10);
  CUDA_OK(cudaStreamSynchronize(s));
  ot::check_kernel("host_func_sees_prior_copy", seen.values_ok);
  ot::check("host_func_ran_once", seen.calls == 1, ot::fmt("%d calls", seen.calls.load()));

  // 2. Asynchronous, and later work waits for it: the call returns before the 200 ms function
  // ends; a copy issued after it, from the buffer the function fills, carries the function's value.
  for (int i = 0; i < N; ++i) fill[i] = -1;
  Slow slow;
  slow.pinned = fill;
  auto t0 = std::chrono::steady_clock::now();
  CUDA_OK(cudaLaunchHostFunc(s, SlowFill, &slow));
  const double call_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const bool returned_first = !slow.done.load();
  ot::check("launch_host_func_is_async", returned_first && call_ms < 150, ot::fmt("%.1f ms", call_ms));
  ot::check("stream_query_not_ready_while_pending", cudaStreamQuery(s) == cudaErrorNotReady);
  CUDA_OK(cudaMemcpyAsync(d, fill, N * sizeof(int), cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaMemcpyAsync(h2, d, N * sizeof(int), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  bool all777 = true;
  for (int i = 0; i < N; ++i) all777 &= h2[i] == 777;
  ot::check("later_work_waits_for_host_func", all777, ot::fmt("h2[0]=%d", h2[0]));
  ot::check("stream_query_ready_after", cudaStreamQuery(s) == cudaSuccess);

  // 3. Callbacks: once each, in order, with the stream and its status.
  Order order;
  order.expect = s;
  std::vector<Tag> tags(100);
  for (int i = 0; i < 100; ++i) {
    tags[i] = Tag{&order, i};
    if (i % 10 == 0) add<<<N / 256, 256, 0, s>>>(d, N, 1);
    CUDA_OK(cudaStreamAddCallback(s, Callback, &tags[i], 0));
  }
  CUDA_OK(cudaDeviceSynchronize());
  bool in_order = order.seen.size() == 100;
  for (int i = 0; in_order && i < 100; ++i) in_order = order.seen[i] == i;
  ot::check("callbacks_in_order_once", in_order, ot::fmt("%zu callbacks", order.seen.size()));
  ot::check("callbacks_get_stream_and_success", order.status_bad == 0);
  ot::check("bad_flags_refused", cudaStreamAddCallback(s, Callback, &tags[0], 1) == cudaErrorInvalidValue);
  cudaGetLastError();

  // 4. In a capture: cudaLaunchHostFunc becomes a host node; each launch of the graph runs it in
  // stream order, between the kernels around it. A stream callback is not permitted in capture.
  Order gorder;
  gorder.expect = s;
  Tag ga{&gorder, 1}, gb{&gorder, 2};
  CUDA_OK(cudaMemset(d, 0, N * sizeof(int)));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  add<<<N / 256, 256, 0, s>>>(d, N, 1);
  CUDA_OK(cudaLaunchHostFunc(s, Record, &ga));
  add<<<N / 256, 256, 0, s>>>(d, N, 10);
  CUDA_OK(cudaLaunchHostFunc(s, Record, &gb));
  cudaGraph_t g = nullptr;
  CUDA_OK(cudaStreamEndCapture(s, &g));
  size_t nodes = 0;
  CUDA_OK(cudaGraphGetNodes(g, nullptr, &nodes));
  cudaGraphExec_t ge = nullptr;
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CUDA_OK(cudaGraphLaunch(ge, s));
  CUDA_OK(cudaStreamSynchronize(s));
  std::vector<int> got(N);
  CUDA_OK(cudaMemcpy(got.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost));
  ot::check("captured_host_nodes_run_in_order", nodes == 4 && gorder.seen == std::vector<int>({1, 2, 1, 2, 1, 2}),
            ot::fmt("%zu nodes, %zu calls", nodes, gorder.seen.size()));
  ot::check_kernel("graph_kernels_around_host_nodes", got[0] == 33 && got[N - 1] == 33, ot::fmt("d[0]=%d", got[0]));
  CUDA_OK(cudaGraphExecDestroy(ge));
  CUDA_OK(cudaGraphDestroy(g));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  ot::check("stream_callback_in_capture_refused",
            cudaStreamAddCallback(s, Callback, &tags[0], 0) == cudaErrorStreamCaptureUnsupported);
  g = nullptr;
  (void)cudaStreamEndCapture(s, &g);
  cudaGetLastError();
  CUDA_OK(cudaStreamDestroy(s));
  return ot::finish();
}
