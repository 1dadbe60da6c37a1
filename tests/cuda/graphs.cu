// CUDA graphs: stream capture (with a fork to a second stream and a join), instantiate, launch
// several times, whole-graph update, explicit construction (kernel, memset, memcpy, child graph,
// empty and event nodes), copies to and from host memory, and what capture refuses. Kernels are computed (the sim's PTX
// executor), so every result is checked by value. Lines: CHECK ... / DONE.
#include <cuda.h>

#include <cstdlib>

#include <algorithm>
#include <atomic>
#include <vector>

#include "orion_test.h"

__global__ void add(int* p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += v;
}
__global__ void twice(const int* a, int* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) b[i] = 2 * a[i];
}

static const int N = 1000;

static std::vector<int> Get(const int* d) {
  std::vector<int> h(N);
  CUDA_OK(cudaMemcpy(h.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost));
  return h;
}
static bool All(const std::vector<int>& v, int want, std::string* why) {
  for (int i = 0; i < N; ++i) {
    if (v[i] != want) {
      *why = ot::fmt("element %d is %d, want %d", i, v[i], want);
      return false;
    }
  }
  return true;
}

int main() {
  ot::init_output();
  CUDA_OK(cudaSetDevice(0));
  int *x, *y, *z, *w;
  CUDA_OK(cudaMalloc(&x, N * sizeof(int)));
  CUDA_OK(cudaMalloc(&y, N * sizeof(int)));
  CUDA_OK(cudaMalloc(&z, N * sizeof(int)));
  CUDA_OK(cudaMalloc(&w, N * sizeof(int)));
  CUDA_OK(cudaMemset(x, 0, N * sizeof(int)));
  CUDA_OK(cudaMemset(w, 0, N * sizeof(int)));
  CUDA_OK(cudaDeviceSynchronize());
  cudaStream_t s, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CUDA_OK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CUDA_OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  std::string why;

  // ---- Capture: x += 1; y = 0x01010101 bytes; z = 2x; fork: w += 3 on s2; join.
  auto capture = [&](int inc, cudaGraph_t* g) {
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    add<<<(N + 255) / 256, 256, 0, s>>>(x, N, inc);
    CUDA_OK(cudaMemsetAsync(y, 1, N * sizeof(int), s));
    CUDA_OK(cudaEventRecord(fork, s));
    CUDA_OK(cudaStreamWaitEvent(s2, fork, 0));  // s2 joins the capture
    add<<<(N + 255) / 256, 256, 0, s2>>>(w, N, 3);
    CUDA_OK(cudaEventRecord(join, s2));
    twice<<<(N + 255) / 256, 256, 0, s>>>(x, z, N);
    CUDA_OK(cudaStreamWaitEvent(s, join, 0));
    cudaStreamCaptureStatus st;
    unsigned long long id = 0;
    CUDA_OK(cudaStreamGetCaptureInfo(s2, &st, &id));
    ot::check(ot::fmt("capture%d_joined_stream_is_capturing", inc), st == cudaStreamCaptureStatusActive && id != 0);
    CUDA_OK(cudaStreamEndCapture(s, g));
    CUDA_OK(cudaStreamIsCapturing(s2, &st));
    ot::check(ot::fmt("capture%d_ended_for_joined_stream", inc), st == cudaStreamCaptureStatusNone);
  };
  cudaGraph_t g;
  capture(1, &g);
  size_t nodes = 0;
  CUDA_OK(cudaGraphGetNodes(g, nullptr, &nodes));
  ot::check("capture_node_count", nodes == 4, ot::fmt("%zu nodes", nodes));
  ot::check("capture_ran_nothing", All(Get(x), 0, &why) && All(Get(w), 0, &why), why);

  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
  for (int k = 0; k < 3; ++k) CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  ot::check_kernel("launch3_x", All(Get(x), 3, &why), why);
  ot::check_kernel("launch3_z", All(Get(z), 6, &why), why);
  ot::check_kernel("launch3_w", All(Get(w), 9, &why), why);
  ot::check("launch3_memset_y", All(Get(y), 0x01010101, &why), why);

  // ---- Whole-graph update: same topology, x += 10.
  cudaGraph_t g2;
  capture(10, &g2);
  cudaGraphExecUpdateResultInfo info{};
  CUDA_OK(cudaGraphExecUpdate(exec, g2, &info));
  ot::check("update_success", info.result == cudaGraphExecUpdateSuccess);
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  ot::check_kernel("updated_graph_adds_10", All(Get(x), 13, &why), why);
  ot::check_kernel("updated_graph_z", All(Get(z), 26, &why), why);

  // ---- Explicit construction: memset x = 0 -> kernel x += 7 -> child(copy x to z) -> empty.
  cudaGraph_t e, child;
  CUDA_OK(cudaGraphCreate(&e, 0));
  CUDA_OK(cudaGraphCreate(&child, 0));
  cudaGraphNode_t ms, kn, cp, ch, em;
  cudaMemsetParams mp{};
  mp.dst = x;
  mp.value = 0;
  mp.elementSize = 4;
  mp.width = N;
  mp.height = 1;
  CUDA_OK(cudaGraphAddMemsetNode(&ms, e, nullptr, 0, &mp));
  int n = N, v = 7;
  void* args[] = {&x, &n, &v};
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(add);
  kp.gridDim = dim3((N + 127) / 128);
  kp.blockDim = dim3(128);
  kp.kernelParams = args;
  CUDA_OK(cudaGraphAddKernelNode(&kn, e, &ms, 1, &kp));
  v = 99;  // the node holds the values it was given
  CUDA_OK(cudaGraphAddMemcpyNode1D(&cp, child, nullptr, 0, z, x, N * sizeof(int), cudaMemcpyDeviceToDevice));
  CUDA_OK(cudaGraphAddChildGraphNode(&ch, e, &kn, 1, child));
  CUDA_OK(cudaGraphAddEmptyNode(&em, e, &ch, 1));
  cudaGraphNodeType t;
  CUDA_OK(cudaGraphNodeGetType(ch, &t));
  ot::check("child_node_type", t == cudaGraphNodeTypeGraph);
  cudaGraphExec_t ee;
  CUDA_OK(cudaGraphInstantiate(&ee, e, 0));
  CUDA_OK(cudaGraphLaunch(ee, s));
  CUDA_OK(cudaStreamSynchronize(s));
  ot::check_kernel("explicit_x", All(Get(x), 7, &why), why);
  ot::check_kernel("explicit_child_copy", All(Get(z), 7, &why), why);
  // New kernel arguments for the instantiated graph only.
  v = 5;
  CUDA_OK(cudaGraphExecKernelNodeSetParams(ee, kn, &kp));
  CUDA_OK(cudaGraphLaunch(ee, s));
  CUDA_OK(cudaStreamSynchronize(s));
  ot::check_kernel("exec_kernel_params", All(Get(x), 5, &why), why);

  // ---- Refusals: a synchronizing call or a host copy in capture invalidates it, loudly.
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  add<<<4, 256, 0, s>>>(x, N, 1);
  ot::check("sync_in_capture_refused", cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
  cudaGraph_t bad = nullptr;
  ot::check("invalidated_capture_ends_with_error",
            cudaStreamEndCapture(s, &bad) == cudaErrorStreamCaptureInvalidated && bad == nullptr);
  cudaGetLastError();
  ot::check("legacy_stream_cannot_capture", cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal) != cudaSuccess);
  cudaGetLastError();
  // Nothing of the refused captures ran; the process goes on.
  CUDA_OK(cudaStreamSynchronize(s));
  ot::check_kernel("refused_captures_ran_nothing", All(Get(x), 5, &why), why);
  CUDA_OK(cudaGraphExecDestroy(exec));
  ot::check("destroyed_exec_refused", cudaGraphLaunch(exec, s) != cudaSuccess);
  cudaGetLastError();
  CUDA_OK(cudaGraphExecDestroy(ee));
  CUDA_OK(cudaGraphDestroy(g));
  CUDA_OK(cudaGraphDestroy(g2));
  // A child graph node's graph belongs to the node: it can be read, not destroyed by handle; once
  // the parent is destroyed, its nodes (the child's too) are no longer handles.
  cudaGraph_t inner = nullptr;
  CUDA_OK(cudaGraphChildGraphNodeGetGraph(ch, &inner));
  size_t inner_nodes = 0;
  CUDA_OK(cudaGraphGetNodes(inner, nullptr, &inner_nodes));
  ot::check("child_graph_readable", inner_nodes == 1, ot::fmt("%zu nodes", inner_nodes));
  ot::check("child_graph_not_destroyable", cudaGraphDestroy(inner) != cudaSuccess);
  cudaGetLastError();
  CUDA_OK(cudaGraphDestroy(e));
  ot::check("destroyed_graph_nodes_refused", cudaGraphNodeGetType(kn, &t) != cudaSuccess &&
                                                 cudaGraphGetNodes(inner, nullptr, &inner_nodes) != cudaSuccess);
  cudaGetLastError();
  CUDA_OK(cudaGraphDestroy(child));

  // Explicit host nodes: run at each launch after the nodes they depend on; their parameters can
  // be read, and changed in the instantiated graph.
  static std::atomic<int> first{0}, second{0};
  auto bump = [](void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); };
  cudaGraph_t hg = nullptr;
  CUDA_OK(cudaGraphCreate(&hg, 0));
  cudaGraphNode_t k1 = nullptr, hn = nullptr;
  CUDA_OK(cudaGraphAddKernelNode(&k1, hg, nullptr, 0, &kp));
  cudaHostNodeParams hp{};
  hp.fn = bump;
  hp.userData = &first;
  CUDA_OK(cudaGraphAddHostNode(&hn, hg, &k1, 1, &hp));
  cudaGraphNodeType ht{};
  cudaHostNodeParams back{};
  CUDA_OK(cudaGraphNodeGetType(hn, &ht));
  CUDA_OK(cudaGraphHostNodeGetParams(hn, &back));
  ot::check("host_node_type_and_params", ht == cudaGraphNodeTypeHost && back.userData == &first);
  cudaGraphExec_t he = nullptr;
  CUDA_OK(cudaGraphInstantiate(&he, hg, 0));
  CUDA_OK(cudaGraphLaunch(he, s));
  CUDA_OK(cudaGraphLaunch(he, s));
  CUDA_OK(cudaStreamSynchronize(s));
  hp.userData = &second;
  CUDA_OK(cudaGraphExecHostNodeSetParams(he, hn, &hp));
  CUDA_OK(cudaGraphLaunch(he, s));
  CUDA_OK(cudaStreamSynchronize(s));
  ot::check("host_node_runs_per_launch", first == 2 && second == 1, ot::fmt("%d %d", first.load(), second.load()));
  hp.fn = nullptr;
  ot::check("host_node_without_function_refused", cudaGraphAddHostNode(&hn, hg, nullptr, 0, &hp) != cudaSuccess);
  cudaGetLastError();
  CUDA_OK(cudaGraphExecDestroy(he));
  CUDA_OK(cudaGraphDestroy(hg));

  {
    // Copies to and from host memory in a graph, pageable and pinned, captured and explicit: each
    // launch reads the host source and writes the host destination in stream order (after a host
    // node that fills the source, before one that reads the destination).
    std::vector<int> src(N), dst(N, -1);
    int* pinned = nullptr;
    CUDA_OK(cudaMallocHost(&pinned, N * sizeof(int)));
    int* d = nullptr;
    CUDA_OK(cudaMalloc(&d, N * sizeof(int)));
    struct Fill {
      std::vector<int>* v;
      int base;
    } fill{&src, 0};
    auto fill_fn = [](void* p) {
      auto* f = static_cast<Fill*>(p);
      for (int i = 0; i < N; ++i) (*f->v)[i] = f->base + i;
      f->base += 1000;
    };
    static std::atomic<long> seen_sum{0};
    auto sum_fn = [](void* p) {
      long t = 0;
      for (int i = 0; i < N; ++i) t += static_cast<int*>(p)[i];
      seen_sum = t;
    };
    cudaGraph_t cg = nullptr;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CUDA_OK(cudaLaunchHostFunc(s, fill_fn, &fill));
    CUDA_OK(cudaMemcpyAsync(d, src.data(), N * sizeof(int), cudaMemcpyHostToDevice, s));  // pageable
    add<<<(N + 255) / 256, 256, 0, s>>>(d, N, 5);
    CUDA_OK(cudaMemcpyAsync(pinned, d, N * sizeof(int), cudaMemcpyDeviceToHost, s));  // pinned
    CUDA_OK(cudaLaunchHostFunc(s, sum_fn, pinned));
    CUDA_OK(cudaMemcpy2DAsync(dst.data(), sizeof(int), d, sizeof(int), sizeof(int), N, cudaMemcpyDeviceToHost,
                              s));  // pageable, 2D
    CUDA_OK(cudaStreamEndCapture(s, &cg));
    size_t nodes = 0;
    CUDA_OK(cudaGraphGetNodes(cg, nullptr, &nodes));
    ot::check("host_copies_captured", nodes == 6, ot::fmt("%zu nodes", nodes));
    cudaGraphExec_t ce = nullptr;
    CUDA_OK(cudaGraphInstantiate(&ce, cg, 0));
    bool ok = true;
    for (int launch = 0; launch < 3 && ok; ++launch) {
      CUDA_OK(cudaGraphLaunch(ce, s));
      CUDA_OK(cudaStreamSynchronize(s));
      const int base = launch * 1000;
      long want_sum = 0;
      for (int i = 0; i < N; ++i) {
        want_sum += base + i + 5;
        if (dst[i] != base + i + 5 || pinned[i] != base + i + 5) {
          why = ot::fmt("launch %d element %d: %d / %d, want %d", launch, i, dst[i], pinned[i], base + i + 5);
          ok = false;
          break;
        }
      }
      if (ok && seen_sum != want_sum) {
        why =
            ot::fmt("launch %d: the host node after the copy saw sum %ld, want %ld", launch, seen_sum.load(), want_sum);
        ok = false;
      }
    }
    ot::check_kernel("captured_host_copies_per_launch", ok, why);
    CUDA_OK(cudaGraphExecDestroy(ce));
    CUDA_OK(cudaGraphDestroy(cg));

    // Explicit: a 3D host-to-device copy node (2 slices of N/2), a kernel, a device-to-host node.
    cudaGraph_t eg = nullptr;
    CUDA_OK(cudaGraphCreate(&eg, 0));
    for (int i = 0; i < N; ++i) src[i] = 7 * i;
    cudaMemcpy3DParms up{};
    up.srcPtr = make_cudaPitchedPtr(src.data(), sizeof(int), 1, N / 2);
    up.dstPtr = make_cudaPitchedPtr(d, sizeof(int), 1, N / 2);
    up.extent = make_cudaExtent(sizeof(int), N / 2, 2);
    up.kind = cudaMemcpyHostToDevice;
    cudaGraphNode_t un = nullptr, an = nullptr, dn = nullptr;
    CUDA_OK(cudaGraphAddMemcpyNode(&un, eg, nullptr, 0, &up));
    int n_d = N, v_d = 1;
    void* args_d[] = {&d, &n_d, &v_d};
    cudaKernelNodeParams akp{};
    akp.func = reinterpret_cast<void*>(add);
    akp.gridDim = dim3((N + 255) / 256);
    akp.blockDim = dim3(256);
    akp.kernelParams = args_d;
    CUDA_OK(cudaGraphAddKernelNode(&an, eg, &un, 1, &akp));
    std::fill(dst.begin(), dst.end(), -1);
    CUDA_OK(cudaGraphAddMemcpyNode1D(&dn, eg, &an, 1, dst.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost));
    cudaGraphNodeType ut{};
    CUDA_OK(cudaGraphNodeGetType(un, &ut));
    cudaGraphExec_t ee2 = nullptr;
    CUDA_OK(cudaGraphInstantiate(&ee2, eg, 0));
    CUDA_OK(cudaGraphDestroy(eg));  // the instantiated graph keeps its copies
    CUDA_OK(cudaGraphLaunch(ee2, s));
    CUDA_OK(cudaStreamSynchronize(s));
    ok = ut == cudaGraphNodeTypeMemcpy;
    for (int i = 0; i < N && ok; ++i) {
      if (dst[i] != 7 * i + 1) {
        why = ot::fmt("element %d is %d, want %d", i, dst[i], 7 * i + 1);
        ok = false;
      }
    }
    ot::check_kernel("explicit_host_copy_nodes", ok, why);
    // A host copy with a device side out of its allocation is refused when the node is added.
    cudaGraph_t bg = nullptr;
    CUDA_OK(cudaGraphCreate(&bg, 0));
    ot::check("host_copy_node_out_of_bounds_refused",
              cudaGraphAddMemcpyNode1D(&dn, bg, nullptr, 0, d + N, src.data(), sizeof(int), cudaMemcpyHostToDevice) ==
                  cudaErrorInvalidValue);
    cudaGetLastError();
    CUDA_OK(cudaGraphDestroy(bg));
    CUDA_OK(cudaGraphExecDestroy(ee2));
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaFreeHost(pinned));
  }

  {
    // cudaGraphAddNode (the driver's cuGraphAddNode_v2): a memset node, then a kernel node after it.
    int* y = nullptr;
    CUDA_OK(cudaMalloc(&y, N * sizeof(int)));
    cudaGraph_t ng = nullptr;
    CUDA_OK(cudaGraphCreate(&ng, 0));
    cudaGraphNodeParams mp{};
    mp.type = cudaGraphNodeTypeMemset;
    mp.memset.dst = y;
    mp.memset.value = 4;
    mp.memset.elementSize = 4;
    mp.memset.width = N;
    mp.memset.height = 1;
    cudaGraphNode_t mn = nullptr, kn = nullptr, an = nullptr;
    CUDA_OK(cudaGraphAddNode(&mn, ng, nullptr, nullptr, 0, &mp));
    int n_y = N, v_y = 3;
    void* args_y[] = {&y, &n_y, &v_y};
    cudaGraphNodeParams kp{};
    kp.type = cudaGraphNodeTypeKernel;
    kp.kernel.func = reinterpret_cast<void*>(add);
    kp.kernel.gridDim = dim3((N + 255) / 256);
    kp.kernel.blockDim = dim3(256);
    kp.kernel.kernelParams = args_y;
    CUDA_OK(cudaGraphAddNode(&kn, ng, &mn, nullptr, 1, &kp));
    cudaGraphExec_t ne = nullptr;
    CUDA_OK(cudaGraphInstantiate(&ne, ng, 0));
    CUDA_OK(cudaGraphLaunch(ne, s));
    CUDA_OK(cudaStreamSynchronize(s));
    ot::check_kernel("add_node_memset_then_kernel", All(Get(y), 7, &why), why);
    // A memory allocation node: its fixed address comes back in the parameters (graph_mem.cu has more).
    cudaGraphNodeParams ap{};
    ap.type = cudaGraphNodeTypeMemAlloc;
    ap.alloc.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.alloc.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.alloc.bytesize = 1 << 20;
    ot::check("add_node_mem_alloc",
              cudaGraphAddNode(&an, ng, nullptr, nullptr, 0, &ap) == cudaSuccess && ap.alloc.dptr != nullptr);
    // A node type Orion does not build here (an external semaphore signal) is refused.
    cudaGraphNodeParams sp{};
    sp.type = cudaGraphNodeTypeExtSemaphoreSignal;
    ot::check("add_node_semaphore_signal_refused",
              cudaGraphAddNode(&an, ng, nullptr, nullptr, 0, &sp) == cudaErrorNotSupported);
    cudaGetLastError();
    CUDA_OK(cudaGraphExecDestroy(ne));
    CUDA_OK(cudaGraphDestroy(ng));
    CUDA_OK(cudaFree(y));
  }
  return ot::finish();
}
