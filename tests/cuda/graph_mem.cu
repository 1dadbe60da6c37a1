// CUDA graph memory nodes (issue #20): memory-allocation and free nodes made explicitly and by
// stream capture (cudaMallocAsync / cudaFreeAsync), their fixed addresses across launches, an
// allocation that outlives its graph's launch until cudaFree(Async), relaunch rules, CUDA's
// restrictions on graphs with memory nodes, the quota charge and the device's graph-memory
// figures. Kernels are computed (the sim's PTX executor): results are checked by value.
// Lines: CHECK ... / DONE.
#include <cuda_runtime.h>

#include <vector>

#include "orion_test.h"

__global__ void add(int* p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += v;
}

static const int N = 4096;
static const size_t kBytes = N * sizeof(int);
static const size_t kBig = 64 << 20;  // an allocation the quota sees

static bool All(const int* d, int want, std::string* why) {
  std::vector<int> h(N);
  if (cudaMemcpy(h.data(), d, kBytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    *why = "cudaMemcpy failed";
    return false;
  }
  for (int i = 0; i < N; ++i) {
    if (h[i] != want) {
      *why = ot::fmt("element %d is %d, want %d", i, h[i], want);
      return false;
    }
  }
  return true;
}
static size_t FreeBytes() {
  size_t free = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free, &total));
  return free;
}
static uint64_t GraphMem(cudaGraphMemAttributeType a) {
  uint64_t v = ~0ull;
  CUDA_OK(cudaDeviceGetGraphMemAttribute(0, a, &v));
  return v;
}
static cudaMemAllocNodeParams AllocParams(size_t bytes) {
  cudaMemAllocNodeParams p{};
  p.poolProps.allocType = cudaMemAllocationTypePinned;
  p.poolProps.location.type = cudaMemLocationTypeDevice;
  p.poolProps.location.id = 0;
  p.bytesize = bytes;
  return p;
}
static const cudaMemsetParams& ms_of(void* p) {  // a memset of N ints to 0 at p
  static cudaMemsetParams ms;
  ms = cudaMemsetParams{};
  ms.dst = p;
  ms.elementSize = 4;
  ms.width = N;
  ms.height = 1;
  return ms;
}
static cudaKernelNodeParams AddParams(void** args) {
  cudaKernelNodeParams k{};
  k.func = reinterpret_cast<void*>(add);
  k.gridDim = dim3((N + 255) / 256);
  k.blockDim = dim3(256);
  k.kernelParams = args;
  return k;
}

int main() {
  ot::init_output();
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* out;
  CUDA_OK(cudaMalloc(&out, kBytes));
  std::string why;
  const size_t free0 = FreeBytes();

  // ---- Explicit: alloc -> memset 0 -> add 5 -> copy to `out` -> free, launched three times.
  {
    cudaGraph_t g;
    CUDA_OK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t an, mn, kn, cn, fn;
    cudaMemAllocNodeParams ap = AllocParams(kBig);
    CUDA_OK(cudaGraphAddMemAllocNode(&an, g, nullptr, 0, &ap));
    int* p = static_cast<int*>(ap.dptr);
    ot::check("alloc_node_gives_an_address", p != nullptr);
    ot::check("alloc_node_is_charged_to_the_quota", free0 - FreeBytes() >= kBig,
              ot::fmt("free went from %zu to %zu", free0, FreeBytes()));
    ot::check("graph_mem_figures_count_it",
              GraphMem(cudaGraphMemAttrReservedMemCurrent) == kBig && GraphMem(cudaGraphMemAttrUsedMemCurrent) == kBig);
    CUDA_OK(cudaGraphAddMemsetNode(&mn, g, &an, 1, &ms_of(p)));
    int n = N, v = 5;
    void* args[] = {&p, &n, &v};
    cudaKernelNodeParams kp = AddParams(args);
    CUDA_OK(cudaGraphAddKernelNode(&kn, g, &mn, 1, &kp));
    CUDA_OK(cudaGraphAddMemcpyNode1D(&cn, g, &kn, 1, out, p, kBytes, cudaMemcpyDeviceToDevice));
    CUDA_OK(cudaGraphAddMemFreeNode(&fn, g, &cn, 1, p));
    cudaMemAllocNodeParams got{};
    CUDA_OK(cudaGraphMemAllocNodeGetParams(an, &got));
    void* freed = nullptr;
    CUDA_OK(cudaGraphMemFreeNodeGetParams(fn, &freed));
    ot::check("node_params_read_back",
              got.dptr == p && got.bytesize == kBig && freed == p && got.poolProps.location.id == 0);
    cudaGraphNode_t again;
    ot::check("second_free_in_one_graph_refused",
              cudaGraphAddMemFreeNode(&again, g, &fn, 1, p) == cudaErrorInvalidValue);
    ot::check("free_node_of_non_graph_memory_refused",
              cudaGraphAddMemFreeNode(&again, g, &fn, 1, out) == cudaErrorInvalidValue);
    cudaGetLastError();
    cudaGraph_t copy;
    ot::check("clone_refused", cudaGraphClone(&copy, g) == cudaErrorInvalidValue);
    cudaGetLastError();
    cudaGraphExec_t e, e2;
    CUDA_OK(cudaGraphInstantiate(&e, g, 0));
    ot::check("second_instantiation_refused", cudaGraphInstantiate(&e2, g, 0) == cudaErrorInvalidValue);
    cudaGetLastError();
    bool each = true;
    for (int i = 0; i < 3 && each; ++i) {
      CUDA_OK(cudaMemset(out, 0, kBytes));
      CUDA_OK(cudaGraphLaunch(e, s));
      CUDA_OK(cudaStreamSynchronize(s));
      each = All(out, 5, &why);
    }
    ot::check_kernel("alloc_memset_kernel_copy_free_three_launches", each, why);
    ot::check("freed_in_its_graph_not_freed_outside", cudaFree(p) == cudaErrorInvalidValue);
    cudaGetLastError();
    CUDA_OK(cudaGraphExecDestroy(e));
    CUDA_OK(cudaGraphDestroy(g));
    ot::check("memory_back_when_no_graph_holds_it",
              FreeBytes() == free0 && GraphMem(cudaGraphMemAttrReservedMemCurrent) == 0,
              ot::fmt("free %zu, was %zu", FreeBytes(), free0));
    ot::check("high_watermark_kept", GraphMem(cudaGraphMemAttrReservedMemHigh) == kBig);
    uint64_t zero = 0;
    CUDA_OK(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrReservedMemHigh, &zero));
    ot::check("high_watermark_reset", GraphMem(cudaGraphMemAttrReservedMemHigh) == 0);
  }

  // ---- An allocation the graph does not free: valid after the launch, until cudaFree(Async).
  {
    cudaGraph_t g;
    CUDA_OK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t an, mn, kn;
    cudaMemAllocNodeParams ap = AllocParams(kBytes);
    CUDA_OK(cudaGraphAddMemAllocNode(&an, g, nullptr, 0, &ap));
    int* p = static_cast<int*>(ap.dptr);
    CUDA_OK(cudaGraphAddMemsetNode(&mn, g, &an, 1, &ms_of(p)));
    int n = N, v = 3;
    void* args[] = {&p, &n, &v};
    cudaKernelNodeParams kp = AddParams(args);
    CUDA_OK(cudaGraphAddKernelNode(&kn, g, &mn, 1, &kp));
    cudaGraph_t parent;
    CUDA_OK(cudaGraphCreate(&parent, 0));
    cudaGraphNode_t child;
    ot::check("child_graph_with_memory_nodes_refused",
              cudaGraphAddChildGraphNode(&child, parent, nullptr, 0, g) == cudaErrorInvalidValue);
    cudaGetLastError();
    CUDA_OK(cudaGraphDestroy(parent));
    cudaGraphExec_t e;
    CUDA_OK(cudaGraphInstantiate(&e, g, 0));
    CUDA_OK(cudaGraphLaunch(e, s));
    CUDA_OK(cudaStreamSynchronize(s));
    ot::check_kernel("allocation_readable_after_the_launch", All(p, 3, &why), why);
    ot::check("relaunch_before_the_free_refused", cudaGraphLaunch(e, s) == cudaErrorInvalidValue);
    cudaGetLastError();
    CUDA_OK(cudaFreeAsync(p, s));
    CUDA_OK(cudaGraphLaunch(e, s));  // same address again
    CUDA_OK(cudaStreamSynchronize(s));
    ot::check_kernel("same_address_next_launch", All(p, 3, &why), why);
    CUDA_OK(cudaFree(p));
    ot::check("double_free_refused", cudaFree(p) == cudaErrorInvalidValue);
    cudaGetLastError();
    CUDA_OK(cudaGraphExecDestroy(e));
    // Auto-free on launch: each launch frees what the last one left allocated.
    CUDA_OK(cudaGraphInstantiateWithFlags(&e, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    CUDA_OK(cudaGraphLaunch(e, s));
    CUDA_OK(cudaGraphLaunch(e, s));
    CUDA_OK(cudaStreamSynchronize(s));
    ot::check_kernel("auto_free_on_launch_relaunches", All(p, 3, &why), why);
    CUDA_OK(cudaGraphExecDestroy(e));
    CUDA_OK(cudaGraphDestroy(g));
    // Still allocated by the last launch: the memory outlives the graph until it is freed.
    ot::check("allocation_outlives_its_graph", GraphMem(cudaGraphMemAttrReservedMemCurrent) == kBytes);
    ot::check_kernel("allocation_usable_after_its_graph", All(p, 3, &why), why);
    CUDA_OK(cudaFree(p));
    ot::check("freed_after_its_graph", GraphMem(cudaGraphMemAttrReservedMemCurrent) == 0 && FreeBytes() == free0);
  }

  // ---- Stream capture: cudaMallocAsync / cudaFreeAsync become memory nodes.
  {
    cudaGraph_t g;
    int* p = nullptr;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CUDA_OK(cudaMallocAsync(&p, kBytes, s));
    CUDA_OK(cudaMemsetAsync(p, 0, kBytes, s));
    add<<<(N + 255) / 256, 256, 0, s>>>(p, N, 9);
    CUDA_OK(cudaMemcpyAsync(out, p, kBytes, cudaMemcpyDeviceToDevice, s));
    CUDA_OK(cudaFreeAsync(p, s));
    CUDA_OK(cudaStreamEndCapture(s, &g));
    size_t count = 0;
    CUDA_OK(cudaGraphGetNodes(g, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    CUDA_OK(cudaGraphGetNodes(g, nodes.data(), &count));
    int allocs = 0, frees = 0;
    for (auto nd : nodes) {
      cudaGraphNodeType t;
      CUDA_OK(cudaGraphNodeGetType(nd, &t));
      allocs += t == cudaGraphNodeTypeMemAlloc;
      frees += t == cudaGraphNodeTypeMemFree;
    }
    ot::check("capture_made_memory_nodes", allocs == 1 && frees == 1 && p != nullptr,
              ot::fmt("%d alloc, %d free nodes", allocs, frees));
    cudaGraphExec_t e;
    CUDA_OK(cudaGraphInstantiate(&e, g, 0));
    bool each = true;
    for (int i = 0; i < 2 && each; ++i) {
      CUDA_OK(cudaMemset(out, 0, kBytes));
      CUDA_OK(cudaGraphLaunch(e, s));
      CUDA_OK(cudaStreamSynchronize(s));
      each = All(out, 9, &why);
    }
    ot::check_kernel("captured_memory_nodes_two_launches", each, why);
    CUDA_OK(cudaGraphExecDestroy(e));
    CUDA_OK(cudaGraphDestroy(g));
    ot::check("captured_allocation_freed_with_its_graph", GraphMem(cudaGraphMemAttrReservedMemCurrent) == 0);
  }
  CUDA_OK(cudaFree(out));
  CUDA_OK(cudaStreamDestroy(s));
  return ot::finish();
}
