// Exported driver API: CUDA graphs — stream capture (cuStreamBeginCapture .. cuStreamEndCapture),
// explicit construction (cuGraphCreate, cuGraphAdd*Node), instantiation, update and launch.
//
// Design (docs/spec/frames.md, "Graphs"): a graph lives in the client process. Each node holds the
// frame its work sends — LaunchKernel(Ex), MemcpyDtoD, Memcpy2D (device to device), Memset,
// EventRecord, StreamWaitEvent — built and checked by the same code as the direct call (capture
// records the frame a call would have sent). cuGraphInstantiate flattens the graph (child graphs
// included) into its frames in a topological order (nodes can only depend on nodes added before
// them, so insertion order is one); cuGraphLaunch sends them on the launch stream, where oriond
// validates each frame like any other (no new trust), and stream order gives every dependency.
// What does not fit a graph here fails loudly: allocations from a memory pool other than the
// device's default in capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, capture invalidated) and
// copies with an array side.
// Memory-allocation and free nodes (explicit, or cuMemAllocAsync / cuMemFreeAsync captured): the
// allocation is made when its node is (a device allocation of the node's context, charged to the
// vGPU's quota from then on, as a GPU's graph memory pool reserves it), so its address is fixed
// across launches as CUDA promises; a launch marks it allocated and a free node, cuMemFree or
// cuMemFreeAsync marks it free again (the memory stays with the graph for the next launch). A
// launch of a graph whose allocation was not freed since the last one fails with
// CUDA_ERROR_INVALID_VALUE unless instantiated with AUTO_FREE_ON_LAUNCH. The memory is freed when
// no graph or executable graph holds its node and it is not allocated. CUDA's restrictions on
// such graphs hold: one instantiation at a time, no clone, no child graph node. Host nodes (explicit, or
// cuLaunchHostFunc captured) are queued at launch as cuLaunchHostFunc does (hostfunc.cpp). A copy
// to or from host memory (pageable or pinned, captured or explicit) is a memcpy node that runs
// as such a host function: once the work before it on the launch stream is done, it copies
// through the data window on an internal stream of its context and waits for the copy, and the
// work after it waits for it (so it reads and writes host memory in stream order, at each launch).
// Independent branches run one after another on the launch stream (correct, but without the
// overlap a GPU could give them).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "export.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

namespace {

struct GuestGraph;

// A memory-allocation node's allocation (the header says how it lives). Requires the lock.
struct GraphMem {
  uint64_t dptr = 0;
  uint64_t bytes = 0;
  int device = 0;
  const GuestGraph* graph = nullptr;  // the graph its allocation node was made in (null once destroyed)
  bool freed_in_graph = false;        // that graph frees it too (then nothing else may)
  bool live = false;                  // allocated by a launch and not freed since
  int holders = 0;                    // graphs and executable graphs that hold its node
  bool released = false;              // the memory is freed (no graph holds it any more)
};

// A memcpy node with a host side: the copy, the context it runs in (checked when it runs).
struct HostCopy {
  CUDA_MEMCPY3D copy{};
  GuestCtx* ctx = nullptr;
};
void RunHostCopy(void* data);

struct GraphNode {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  Op op = Op::kNop;  // the frame (not for EMPTY / GRAPH nodes)
  std::vector<uint8_t> payload;
  uint32_t stream_offset = 0;  // where the stream id goes in the payload
  std::vector<GraphNode*> deps;
  std::unique_ptr<GuestGraph> child;  // GRAPH nodes: a copy of the child graph
  CUDA_KERNEL_NODE_PARAMS kernel{};   // KERNEL nodes: as given (kernelParams point into `args`)
  std::vector<void*> args;
  CUDA_MEMSET_NODE_PARAMS memset{};  // MEMSET nodes
  uint64_t event = 0;                // EVENT_RECORD / WAIT_EVENT nodes
  CUDA_HOST_NODE_PARAMS host{};      // HOST nodes: the function runs in this process (hostfunc.cpp)
  // MEMCPY nodes with a host side: `host` is {RunHostCopy, copy.get()}, shared with the frames.
  std::shared_ptr<const HostCopy> copy;
  std::shared_ptr<GraphMem> mem;  // MEM_ALLOC and MEM_FREE nodes: the allocation
};

struct GuestGraph {
  std::vector<std::unique_ptr<GraphNode>> nodes;  // insertion order: a topological order
  bool child = false;          // a child graph node's copy: owned by the node, not destroyable by handle
  bool has_mem_nodes = false;  // memory-allocation or free nodes (CUDA's restrictions apply)
};

constexpr size_t kBatchBytes = 32 * 1024;  // one Batch frame's payload at most (<= kMaxPayload)

struct Frame {
  Op op;
  std::vector<uint8_t> payload;
  uint32_t stream_offset;
  CUDA_HOST_NODE_PARAMS host{};          // a HOST node: no frame; the function is queued in stream order
  std::shared_ptr<const HostCopy> copy;  // a host copy's (host.userData points into it)
};
// What a launch sends, built from the frames once (and again after they change): Batch payloads
// with the offsets of their stream ids, and the host nodes and unbatchable frames between them.
struct Segment {
  enum Kind { kBatch, kSingle, kHost } kind = kBatch;
  std::vector<uint8_t> payload;          // kBatch: the Batch payload; kSingle: the frame's payload
  std::vector<uint32_t> stream_offsets;  // where stream ids go in `payload`
  Op op = Op::kBatch;                    // kSingle: the frame's op
  CUDA_HOST_NODE_PARAMS host{};          // kHost
  std::shared_ptr<const HostCopy> copy;  // kHost of a host copy: keeps host.userData alive
};
struct GuestExec {
  std::vector<Frame> frames;
  std::vector<Segment> plan;
  bool dirty = true;                         // `plan` must be rebuilt from `frames`
  std::map<const GraphNode*, size_t> index;  // source node -> its frame (cuGraphExec*SetParams)
  std::vector<const GraphNode*> order;       // source nodes of the top-level graph, as flattened
  unsigned long long flags = 0;
  const GuestGraph* source = nullptr;                 // the graph it was made from (null once destroyed)
  std::vector<std::shared_ptr<GraphMem>> mem_allocs;  // its allocation nodes' allocations, in order
  std::vector<std::shared_ptr<GraphMem>> mem_frees;   // its free nodes' allocations, in order
};

struct Capture {
  GuestGraph* graph = nullptr;
  uint64_t id = 0;
  uint64_t origin = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  bool invalidated = false;
  std::map<uint64_t, GraphNode*> tail;  // per stream in the capture: its last node (or none)
};

struct Graphs {
  std::mutex mu;
  std::set<GuestGraph*> graphs;                             // every live graph, child copies included (Register)
  std::unordered_map<const GraphNode*, GuestGraph*> owner;  // every node of those graphs
  std::set<GuestExec*> execs;
  std::map<uint64_t, std::shared_ptr<Capture>> capturing;  // stream id -> its capture
  std::map<uint64_t, std::pair<std::weak_ptr<Capture>, GraphNode*>> captured_events;
  uint64_t next_capture_id = 1;
  std::map<uint64_t, std::shared_ptr<GraphMem>> mem;   // graph allocations by address
  std::map<int, std::array<uint64_t, 4>> mem_figures;  // per device: CUgraphMem_attribute values
};
Graphs& G() {
  static Graphs* g = new Graphs;  // never destroyed: calls may come from atexit handlers
  return *g;
}
std::atomic<int> g_captures{0};
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

// Bounded, as every table a program can grow: nodes per graph and graphs per process.
constexpr size_t kMaxGraphNodes = size_t{1} << 20;
constexpr size_t kMaxGraphs = size_t{1} << 16;

GuestGraph* AsGraph(CUgraph g) {  // requires the lock
  auto* p = reinterpret_cast<GuestGraph*>(g);
  return G().graphs.count(p) != 0 ? p : nullptr;
}
GuestExec* AsExec(CUgraphExec e) {  // requires the lock
  auto* p = reinterpret_cast<GuestExec*>(e);
  return G().execs.count(p) != 0 ? p : nullptr;
}
// A node handle from the application, validated (one lookup), with its graph; nullptr if unknown.
GraphNode* AsNode(CUgraphNode h, GuestGraph** graph = nullptr) {  // requires the lock
  auto it = G().owner.find(reinterpret_cast<const GraphNode*>(h));
  if (it == G().owner.end()) return nullptr;
  if (graph != nullptr) *graph = it->second;
  return const_cast<GraphNode*>(it->first);
}
// Makes a graph and its nodes, child copies included, known to handle lookups; Unregister undoes
// it (before the graph is freed). Require the lock.
void Register(GuestGraph* g) {
  G().graphs.insert(g);
  for (auto& n : g->nodes) {
    G().owner[n.get()] = g;
    if (n->child) {
      n->child->child = true;
      Register(n->child.get());
    }
  }
}
void Unregister(GuestGraph* g) {
  G().graphs.erase(g);
  for (auto& n : g->nodes) {
    G().owner.erase(n.get());
    if (n->child) Unregister(n->child.get());
  }
}
// Appends a node to a registered graph. Requires the lock.
GraphNode* Append(GuestGraph* g, std::unique_ptr<GraphNode> node) {
  GraphNode* n = node.get();
  g->nodes.push_back(std::move(node));
  G().owner[n] = g;
  if (n->child) {
    n->child->child = true;
    Register(n->child.get());
  }
  return n;
}

// A node whose work is the frame `q` (its stream id, at `stream_offset`, set at each launch).
template <typename Req>
std::unique_ptr<GraphNode> FrameNode(CUgraphNodeType type, Op op, const Req& q, uint32_t stream_offset) {
  auto node = std::make_unique<GraphNode>();
  node->type = type;
  node->op = op;
  node->payload.assign(reinterpret_cast<const uint8_t*>(&q), reinterpret_cast<const uint8_t*>(&q) + sizeof q);
  node->stream_offset = stream_offset;
  return node;
}

// Makes `node` a memcpy node that runs `copy` as a host function (the header says how).
void SetHostCopy(GraphNode* node, std::shared_ptr<const HostCopy> copy) {
  node->type = CU_GRAPH_NODE_TYPE_MEMCPY;
  node->host.fn = RunHostCopy;
  node->host.userData = const_cast<HostCopy*>(copy.get());
  node->copy = std::move(copy);
}

// The internal stream each context's host copies run on (non-blocking: it waits for no other
// stream), made at the first one; keyed by the context's id (never reused).
CUresult CopyStream(const GuestCtx* ctx, CUstream* out) {
  static std::mutex mu;
  static auto* streams = new std::map<uint64_t, CUstream>;  // never destroyed: used at exit too
  std::lock_guard l(mu);
  if (auto it = streams->find(ctx->id);
      it != streams->end() && S().streams.Has(reinterpret_cast<uint64_t>(it->second))) {
    *out = it->second;
    return CUDA_SUCCESS;
  }
  StreamCreateReq q{CU_STREAM_NON_BLOCKING, 0};
  HandleRep rep{};
  if (CUresult r = Client::Get().Call(Op::kStreamCreate, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS) return r;
  S().streams.Add(rep.handle, uint64_t{CU_STREAM_NON_BLOCKING} << 32);
  (*streams)[ctx->id] = *out = reinterpret_cast<CUstream>(rep.handle);
  return CUDA_SUCCESS;
}

// A host copy node's work, on the host-function thread once the work before it is done: the copy
// on its context's copy stream, waited for. A failure (its context destroyed, a pointer freed) is
// logged and marks the context's stream work failed, as an asynchronous error would.
void RunHostCopy(void* data) {
  const auto* job = static_cast<const HostCopy*>(data);
  if (!S().contexts.Has(reinterpret_cast<CUcontext>(job->ctx))) {
    LogError("a graph's copy to or from host memory did not run: its context was destroyed");
    return;
  }
  std::vector<GuestCtx*>& stack = CtxStack();
  stack.push_back(job->ctx);
  SetCurrentCtx(job->ctx);
  CUstream s = nullptr;
  CUresult r = CopyStream(job->ctx, &s);
  if (r == CUDA_SUCCESS) r = Memcpy3D(&job->copy, s, true);
  if (r == CUDA_SUCCESS) {
    HandleReq q{reinterpret_cast<uint64_t>(s)};
    r = Client::Get().Call(Op::kStreamSynchronize, &q, sizeof q);
  }
  stack.pop_back();
  SetCurrentCtx(CurrentCtx());
  if (r != CUDA_SUCCESS) {
    LogError("a graph's copy to or from host memory failed: CUDA error " + std::to_string(static_cast<int>(r)));
  }
}

// A launch's host copy: `data` is a std::shared_ptr<const HostCopy> made for it (then freed).
void RunHeldHostCopy(void* data) {
  std::unique_ptr<std::shared_ptr<const HostCopy>> held(static_cast<std::shared_ptr<const HostCopy>*>(data));
  RunHostCopy(const_cast<HostCopy*>(held->get()));
}

std::unique_ptr<GuestGraph> Clone(const GuestGraph& g, std::map<const GraphNode*, GraphNode*>* map) {
  auto out = std::make_unique<GuestGraph>();
  for (auto& n : g.nodes) {
    auto c = std::make_unique<GraphNode>();
    c->type = n->type;
    c->op = n->op;
    c->payload = n->payload;
    c->stream_offset = n->stream_offset;
    c->kernel = n->kernel;
    c->args = n->args;
    c->memset = n->memset;
    c->event = n->event;
    c->host = n->host;
    c->copy = n->copy;
    for (GraphNode* d : n->deps) c->deps.push_back((*map)[d]);
    if (n->child) c->child = Clone(*n->child, map);
    (*map)[n.get()] = c.get();
    out->nodes.push_back(std::move(c));
  }
  return out;
}

void Flatten(const GuestGraph& g, GuestExec* e, bool top) {
  for (auto& n : g.nodes) {
    if (top) e->order.push_back(n.get());
    if (n->type == CU_GRAPH_NODE_TYPE_GRAPH) {
      Flatten(*n->child, e, false);
    } else if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
      e->mem_allocs.push_back(n->mem);
    } else if (n->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
      e->mem_frees.push_back(n->mem);
    } else if (n->type != CU_GRAPH_NODE_TYPE_EMPTY) {
      e->index[n.get()] = e->frames.size();
      e->frames.push_back(Frame{n->op, n->payload, n->stream_offset, n->host, n->copy});
    }
  }
}

// Adds a node to `g` after `deps` (validated). Requires the lock.
CUresult AddNode(GuestGraph* g, const CUgraphNode* deps, size_t n, std::unique_ptr<GraphNode> node, CUgraphNode* out) {
  if (g->nodes.size() >= kMaxGraphNodes) return CUDA_ERROR_OUT_OF_MEMORY;
  if (n != 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; ++i) {
    GuestGraph* of = nullptr;
    GraphNode* d = AsNode(deps[i], &of);
    if (d == nullptr || of != g) return CUDA_ERROR_INVALID_VALUE;
    node->deps.push_back(d);
  }
  GraphNode* added = Append(g, std::move(node));
  if (out != nullptr) *out = reinterpret_cast<CUgraphNode>(added);
  return CUDA_SUCCESS;
}
// The explicit API's common end: the graph handle checked, the node added after `deps`.
CUresult AddToGraph(CUgraph hg, const CUgraphNode* deps, size_t n, std::unique_ptr<GraphNode> node, CUgraphNode* out) {
  std::lock_guard l(G().mu);
  GuestGraph* g = AsGraph(hg);
  if (g == nullptr || g->child) return CUDA_ERROR_INVALID_VALUE;
  return AddNode(g, deps, n, std::move(node), out);
}
// Appends a captured node on `stream`, after the stream's last one. Requires the lock.
CUresult AppendCaptured(Capture* c, uint64_t stream, std::unique_ptr<GraphNode> node) {
  if (c->graph->nodes.size() >= kMaxGraphNodes) return CUDA_ERROR_OUT_OF_MEMORY;
  if (GraphNode* t = c->tail[stream]; t != nullptr) node->deps.push_back(t);
  c->tail[stream] = Append(c->graph, std::move(node));
  return CUDA_SUCCESS;
}

// Ends every capture `c` holds a stream of. Requires the lock.
void EndCaptureLocked(const std::shared_ptr<Capture>& c) {
  for (auto it = G().capturing.begin(); it != G().capturing.end();) {
    if (it->second == c)
      it = G().capturing.erase(it);
    else
      ++it;
  }
  g_captures.fetch_sub(1, std::memory_order_relaxed);
}

std::shared_ptr<Capture> CaptureOf(uint64_t stream) {  // requires the lock
  auto it = G().capturing.find(stream);
  return it != G().capturing.end() ? it->second : nullptr;
}

// `permitted`: CUDA allows it in capture and Orion does not serve it (else CUDA forbids it too).
void Invalidate(Capture* c, const char* what, bool permitted = true) {
  if (!c->invalidated) {
    LogWarn(std::string(what) +
            (permitted ? " in stream capture is not supported by Orion"
                       : " is not permitted while a stream is captured (CUDA)") +
            "; the capture is invalidated");
  }
  c->invalidated = true;
}

// The capture `stream` records into, or nullptr: then *answered says whether the call is answered
// (*result = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: its capture was invalidated) or the stream is
// not capturing (the caller does the work itself). Requires the lock.
std::shared_ptr<Capture> LiveCapture(uint64_t stream, CUresult* result, bool* answered) {
  auto c = CaptureOf(stream);
  *answered = c != nullptr && c->invalidated;
  if (*answered) *result = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  return *answered ? nullptr : c;
}

// When `stream` is being captured: a node made by `make` is appended to its capture (*result says
// whether that worked; an invalidated capture refuses it) and true is returned. False when the
// stream is not capturing: the caller does the work itself.
template <class Make>
bool CaptureNode(uint64_t stream, CUresult* result, Make make) noexcept {
  HostFuncGate(stream);
  if (g_captures.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard l(G().mu);
  bool answered = false;
  auto c = LiveCapture(stream, result, &answered);
  if (c == nullptr) return answered;
  auto node = std::make_unique<GraphNode>();
  make(node.get());
  *result = AppendCaptured(c.get(), stream, std::move(node));
  return true;
}

// ---- Graph memory (the header says how it lives) ------------------------------------------------
// The device's graph-memory figures after a change (CUgraphMem_attribute order: used, used high,
// reserved, reserved high). Orion holds a graph allocation from its node's creation, so what is
// used and what is reserved are the same bytes. Requires the lock.
void UpdateMemFigures(int device) {
  uint64_t held = 0;
  for (const auto& [d, m] : G().mem)
    if (m->device == device) held += m->bytes;
  auto& f = G().mem_figures[device];
  f[0] = f[2] = held;
  f[1] = std::max(f[1], held);
  f[3] = std::max(f[3], held);
}
// Frees `m`'s memory when nothing holds it any more and it is not allocated: its address goes to
// `to_free` (FreeGraphMemory frees it without the lock). Requires the lock.
void MaybeRelease(const std::shared_ptr<GraphMem>& m, std::vector<uint64_t>* to_free) {
  if (m->holders > 0 || m->live || m->released) return;
  m->released = true;
  G().mem.erase(m->dptr);
  UpdateMemFigures(m->device);
  to_free->push_back(m->dptr);
}
void DropMem(const std::shared_ptr<GraphMem>& m, std::vector<uint64_t>* to_free) {  // requires the lock
  --m->holders;
  MaybeRelease(m, to_free);
}
void FreeGraphMemory(const std::vector<uint64_t>& dptrs) {  // without the lock
  for (const uint64_t d : dptrs) {
    if (!S().mirror.RemoveDevice(d, nullptr)) continue;
    MemFreeReq q{d};
    if (CUresult r = Client::Get().Call(Op::kMemFree, &q, sizeof q); r != CUDA_SUCCESS)
      LogError("freeing a graph allocation failed: CUDA error " + std::to_string(static_cast<int>(r)));
  }
}
// Whether graph `g` has a free node for `m`. Requires the lock.
bool FreesIt(const GuestGraph& g, const GraphMem* m) {
  return std::any_of(g.nodes.begin(), g.nodes.end(),
                     [&](const auto& n) { return n->type == CU_GRAPH_NODE_TYPE_MEM_FREE && n->mem.get() == m; });
}
// Checks allocation-node parameters (one device's pinned memory, read-write access for it alone).
CUresult CheckMemAllocParams(const CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  if (p == nullptr || p->bytesize == 0 || p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      (p->accessDescCount != 0 && p->accessDescs == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  if (p->poolProps.location.id < 0 || static_cast<size_t>(p->poolProps.location.id) >= Client::Get().devices().size())
    return CUDA_ERROR_INVALID_DEVICE;
  if (p->poolProps.handleTypes != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_INVALID_VALUE;  // CUDA: IPC is not
  for (size_t i = 0; i < p->accessDescCount; ++i) {
    const CUmemAccessDesc& a = p->accessDescs[i];
    if (a.location.type != CU_MEM_LOCATION_TYPE_DEVICE || a.location.id != p->poolProps.location.id ||
        a.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      LogWarn("a graph allocation with peer access is not supported by Orion");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  if (p->poolProps.location.id != CurrentCtx()->device) {
    LogWarn("a graph allocation on a device other than the current context's is not supported by Orion");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}
// Makes the allocation of a new allocation node (on the current context, without the lock).
CUresult NewGraphMem(uint64_t bytes, std::shared_ptr<GraphMem>* out) {
  auto m = std::make_shared<GraphMem>();
  CUdeviceptr d = 0;
  if (CUresult r = cuMemAlloc_v2(&d, bytes); r != CUDA_SUCCESS) return r;
  m->dptr = d;
  m->bytes = bytes;
  m->device = CurrentCtx()->device;
  m->holders = 1;  // its node's graph
  *out = std::move(m);
  return CUDA_SUCCESS;
}
// Records `m`, the allocation of a new allocation node of `g`. Requires the lock.
void RegisterMem(GuestGraph* g, const std::shared_ptr<GraphMem>& m) {
  m->graph = g;
  G().mem[m->dptr] = m;
  g->has_mem_nodes = true;
  UpdateMemFigures(m->device);
}

}  // namespace

// ---- Hooks used by the direct calls (state.h) ----------------------------------------------------
namespace orion::guest {

bool CaptureActive() noexcept { return g_captures.load(std::memory_order_relaxed) > 0; }

bool CaptureFrame(uint64_t stream, Op op, const void* payload, uint32_t len, uint32_t stream_offset,
                  CUresult* result) noexcept {
  return CaptureNode(stream, result, [&](GraphNode* node) {
    switch (op) {
      case Op::kLaunchKernel:
      case Op::kLaunchKernelEx: node->type = CU_GRAPH_NODE_TYPE_KERNEL; break;
      case Op::kMemset: node->type = CU_GRAPH_NODE_TYPE_MEMSET; break;
      case Op::kEventRecord: node->type = CU_GRAPH_NODE_TYPE_EVENT_RECORD; break;
      case Op::kStreamWaitEvent: node->type = CU_GRAPH_NODE_TYPE_WAIT_EVENT; break;
      default: node->type = CU_GRAPH_NODE_TYPE_MEMCPY; break;
    }
    node->op = op;
    node->payload.assign(static_cast<const uint8_t*>(payload), static_cast<const uint8_t*>(payload) + len);
    node->stream_offset = stream_offset;
  });
}

void CaptureFailed(uint64_t stream, const std::string& what) noexcept {
  if (!CaptureActive()) return;
  std::lock_guard l(G().mu);
  auto c = CaptureOf(stream);
  if (c == nullptr) return;
  if (!c->invalidated) LogWarn(what + " failed in stream capture; the capture is invalidated");
  c->invalidated = true;
}

bool CaptureRefuse(uint64_t stream, const char* what, CUresult* result) noexcept {
  HostFuncGate(stream);
  if (!CaptureActive()) return false;
  std::lock_guard l(G().mu);
  auto c = CaptureOf(stream);
  if (c == nullptr) return false;
  Invalidate(c.get(), what);
  *result = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return true;
}

bool CaptureMemAlloc(uint64_t stream, uint64_t bytes, bool default_pool, CUdeviceptr* dptr, CUresult* result) noexcept {
  HostFuncGate(stream);
  if (!CaptureActive()) return false;
  {
    std::lock_guard l(G().mu);
    bool answered = false;
    auto c = LiveCapture(stream, result, &answered);
    if (c == nullptr) return answered;
    if (!default_pool) {
      Invalidate(c.get(), "an allocation from a memory pool other than the device's default");
      *result = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
      return true;
    }
  }
  std::shared_ptr<GraphMem> m;
  try {
    *result = NewGraphMem(bytes, &m);
  } catch (const std::bad_alloc&) {
    *result = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (*result != CUDA_SUCCESS) {
    CaptureFailed(stream, "a stream-ordered allocation");
    return true;
  }
  std::vector<uint64_t> to_free;
  {
    std::lock_guard l(G().mu);
    auto c = CaptureOf(stream);
    if (c == nullptr || c->invalidated) {  // the capture ended or failed meanwhile
      *result = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
      to_free.push_back(m->dptr);
    } else {
      auto node = std::make_unique<GraphNode>();
      node->type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
      node->mem = m;
      *result = AppendCaptured(c.get(), stream, std::move(node));
      if (*result == CUDA_SUCCESS) {
        RegisterMem(c->graph, m);
        *dptr = m->dptr;
      } else {
        to_free.push_back(m->dptr);
      }
    }
  }
  FreeGraphMemory(to_free);
  return true;
}

bool CaptureMemFree(uint64_t stream, uint64_t dptr, CUresult* result) noexcept {
  HostFuncGate(stream);
  if (!CaptureActive()) return false;
  std::lock_guard l(G().mu);
  bool answered = false;
  auto c = LiveCapture(stream, result, &answered);
  if (c == nullptr) return answered;
  auto it = G().mem.find(dptr);
  if (it == G().mem.end()) {
    Invalidate(c.get(), "a stream-ordered free of memory no graph allocated");
    *result = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return true;
  }
  const std::shared_ptr<GraphMem> m = it->second;
  if (FreesIt(*c->graph, m.get()) || (m->freed_in_graph && m->graph != c->graph)) {
    *result = CUDA_ERROR_INVALID_VALUE;  // CUDA: freed once, and only in its own graph when it frees it
    return true;
  }
  auto node = std::make_unique<GraphNode>();
  node->type = CU_GRAPH_NODE_TYPE_MEM_FREE;
  node->mem = m;
  *result = AppendCaptured(c.get(), stream, std::move(node));
  if (*result == CUDA_SUCCESS) {
    c->graph->has_mem_nodes = true;
    if (m->graph == c->graph) m->freed_in_graph = true;
  }
  return true;
}

bool GraphMemFree(uint64_t dptr, CUresult* result) noexcept {
  std::vector<uint64_t> to_free;
  {
    std::lock_guard l(G().mu);
    auto it = G().mem.find(dptr);
    if (it == G().mem.end()) return false;
    const std::shared_ptr<GraphMem> m = it->second;
    if (m->freed_in_graph || !m->live) {
      // CUDA: an allocation its own graph frees is freed nowhere else; one not allocated is no
      // allocation to free.
      *result = CUDA_ERROR_INVALID_VALUE;
      return true;
    }
    m->live = false;
    MaybeRelease(m, &to_free);
  }
  FreeGraphMemory(to_free);
  *result = CUDA_SUCCESS;
  return true;
}

CUresult GraphMemAttribute(int device, int attr, uint64_t* value, bool reset) noexcept {
  if (attr < CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT || attr > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  auto& f = G().mem_figures[device];
  if (reset) {  // only the high watermarks, and only to 0 (then they are the current figure)
    if ((attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) || *value != 0)
      return CUDA_ERROR_INVALID_VALUE;
    f[attr] = 0;
    UpdateMemFigures(device);
    return CUDA_SUCCESS;
  }
  *value = f[attr];
  return CUDA_SUCCESS;
}

bool CaptureHostFunc(uint64_t stream, CUhostFn fn, void* data, CUresult* result) noexcept {
  return CaptureNode(stream, result, [&](GraphNode* node) {
    node->type = CU_GRAPH_NODE_TYPE_HOST;
    node->host.fn = fn;
    node->host.userData = data;
  });
}

bool CaptureHostCopy(uint64_t stream, const CUDA_MEMCPY3D& copy, CUresult* result) noexcept {
  std::shared_ptr<HostCopy> c;
  try {
    c = std::make_shared<HostCopy>(HostCopy{copy, CurrentCtx()});
  } catch (const std::bad_alloc&) {
    return CaptureRefuse(stream, "a copy to or from host memory (no memory for its node)", result);
  }
  return CaptureNode(stream, result, [&](GraphNode* node) { SetHostCopy(node, std::move(c)); });
}

bool CaptureEventRecord(uint64_t event, uint64_t stream, unsigned flags, CUresult* result) noexcept {
  HostFuncGate(stream);
  if (!CaptureActive()) return false;
  std::lock_guard l(G().mu);
  auto c = CaptureOf(stream);
  if (c == nullptr) {
    G().captured_events.erase(event);  // recorded outside any capture again
    return false;
  }
  if (c->invalidated) {
    *result = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    return true;
  }
  if ((flags & CU_EVENT_RECORD_EXTERNAL) != 0) {  // an event record node: recorded at each launch
    auto node = FrameNode(CU_GRAPH_NODE_TYPE_EVENT_RECORD, Op::kEventRecord, EventRecordReq{event, 0},
                          offsetof(EventRecordReq, stream));
    node->event = event;
    *result = AppendCaptured(c.get(), stream, std::move(node));
    return true;
  }
  G().captured_events[event] = {c, c->tail[stream]};  // a dependency inside the capture only
  *result = CUDA_SUCCESS;
  return true;
}

bool CaptureStreamWait(uint64_t stream, uint64_t event, unsigned flags, CUresult* result) noexcept {
  HostFuncGate(stream);
  if (!CaptureActive()) return false;
  std::lock_guard l(G().mu);
  auto c = CaptureOf(stream);
  auto ev = G().captured_events.find(event);
  std::shared_ptr<Capture> ec = ev != G().captured_events.end() ? ev->second.first.lock() : nullptr;
  if (ec != nullptr && (flags & CU_EVENT_WAIT_EXTERNAL) == 0) {
    if (c != nullptr && c != ec) {  // two captures cannot be merged
      Invalidate(c.get(), "a wait on an event of another capture", false);
      *result = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
      return true;
    }
    // The stream joins the capture (fork), or already in it (join): its next node depends on the
    // event's; with one launch stream at replay, stream order covers both.
    if (c == nullptr) {
      if (stream == 0) {
        Invalidate(ec.get(), "joining the legacy default stream", false);
        *result = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        return true;
      }
      G().capturing[stream] = ec;
    }
    ec->tail[stream] = ev->second.second;
    *result = CUDA_SUCCESS;
    return true;
  }
  if (c == nullptr) return false;
  if (c->invalidated) {
    *result = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    return true;
  }
  // A wait on an event from outside the capture: an event wait node, waited on at each launch.
  auto node = FrameNode(CU_GRAPH_NODE_TYPE_WAIT_EVENT, Op::kStreamWaitEvent, StreamWaitEventReq{0, event, 0, 0},
                        offsetof(StreamWaitEventReq, stream));
  node->event = event;
  *result = AppendCaptured(c.get(), stream, std::move(node));
  return true;
}

bool CaptureForbidsSync(uint64_t stream, CUresult* result) noexcept {
  HostFuncGate(stream);
  if (!CaptureActive()) return false;
  std::lock_guard l(G().mu);
  std::shared_ptr<Capture> c;
  if (stream == ~uint64_t{0}) {
    // The context: any capture that is not relaxed (CUDA: unsafe while capturing).
    for (auto& [s, cap] : G().capturing) {
      if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED) c = cap;
    }
  } else {
    c = CaptureOf(stream);
  }
  if (c == nullptr) return false;
  Invalidate(c.get(), "a synchronizing call", false);
  *result = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return true;
}

}  // namespace orion::guest

// ---- Stream capture -----------------------------------------------------------------------------
namespace {

CUresult BeginCapture(CUstream hs, CUstreamCaptureMode mode) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t sid = 0;
  if (!StreamId(hs, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  if (sid == 0) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy default stream cannot capture
  std::lock_guard l(G().mu);
  if (G().capturing.count(sid) != 0) return CUDA_ERROR_ILLEGAL_STATE;
  if (G().graphs.size() >= kMaxGraphs) return CUDA_ERROR_OUT_OF_MEMORY;
  auto c = std::make_shared<Capture>();
  c->graph = new GuestGraph;
  G().graphs.insert(c->graph);
  c->id = G().next_capture_id++;
  c->origin = sid;
  c->mode = mode;
  c->tail[sid] = nullptr;
  G().capturing[sid] = c;
  g_captures.fetch_add(1, std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

CUresult EndCapture(CUstream hs, CUgraph* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t sid = 0;
  if (!StreamId(hs, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard l(G().mu);
  auto c = CaptureOf(sid);
  if (c == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  if (c->origin != sid) {  // only the stream that began it ends it; the capture is lost
    Invalidate(c.get(), "ending a capture on a stream that joined it", false);
    EndCaptureLocked(c);
    Unregister(c->graph);
    delete c->graph;
    *out = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  }
  EndCaptureLocked(c);
  if (c->invalidated) {
    Unregister(c->graph);
    delete c->graph;
    *out = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *out = reinterpret_cast<CUgraph>(c->graph);
  return CUDA_SUCCESS;
}

CUresult CaptureInfo(CUstream hs, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                     const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* num_deps) {
  uint64_t sid = 0;
  if (!Client::Get().connected()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!StreamId(hs, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (edges != nullptr) *edges = nullptr;
  std::lock_guard l(G().mu);
  auto c = CaptureOf(sid);
  *status = c == nullptr ? CU_STREAM_CAPTURE_STATUS_NONE
                         : (c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE);
  if (id != nullptr) *id = c != nullptr ? c->id : 0;
  if (graph != nullptr) *graph = c != nullptr ? reinterpret_cast<CUgraph>(c->graph) : nullptr;
  // The dependency set of the stream's next node: its last captured node (the array stays valid
  // until the next capture call on the stream, as CUDA says).
  static thread_local CUgraphNode dep;
  GraphNode* t = c != nullptr ? c->tail[sid] : nullptr;
  dep = reinterpret_cast<CUgraphNode>(t);
  if (deps != nullptr) *deps = t != nullptr ? &dep : nullptr;
  if (num_deps != nullptr) *num_deps = t != nullptr ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult Instantiate(CUgraphExec* out, CUgraph hg, unsigned long long flags) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  // Auto-free and device launch need graph memory nodes or device-side launch: not served.
  if ((flags & ~static_cast<unsigned long long>(CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                                                CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY |
                                                CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)) != 0)
    return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard l(G().mu);
  GuestGraph* g = AsGraph(hg);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (G().execs.size() >= kMaxGraphs) return CUDA_ERROR_OUT_OF_MEMORY;
  if (g->has_mem_nodes &&
      std::any_of(G().execs.begin(), G().execs.end(), [g](const GuestExec* x) { return x->source == g; })) {
    LogWarn("cuGraphInstantiate: a graph with memory nodes has one instantiation at a time (CUDA)");
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* e = new GuestExec;
  e->flags = flags;
  e->source = g;
  Flatten(*g, e, true);
  for (const auto& m : e->mem_allocs) ++m->holders;
  G().execs.insert(e);
  *out = reinterpret_cast<CUgraphExec>(e);
  return CUDA_SUCCESS;
}

// Rebuilds e->plan from e->frames. Requires the lock.
void BuildPlan(GuestExec* e) {
  e->plan.clear();
  for (const Frame& f : e->frames) {
    if (f.host.fn != nullptr) {
      Segment h;
      h.kind = Segment::kHost;
      h.host = f.host;
      h.copy = f.copy;
      e->plan.push_back(std::move(h));
      continue;
    }
    const size_t padded = (f.payload.size() + 7) & ~size_t{7};
    if (!OpBatchable(static_cast<uint16_t>(f.op)) || sizeof(BatchEntry) + padded > kBatchBytes) {
      Segment one;
      one.kind = Segment::kSingle;
      one.op = f.op;
      one.payload = f.payload;
      one.stream_offsets.push_back(f.stream_offset);
      e->plan.push_back(std::move(one));
      continue;
    }
    if (e->plan.empty() || e->plan.back().kind != Segment::kBatch ||
        e->plan.back().payload.size() + sizeof(BatchEntry) + padded > kBatchBytes) {
      e->plan.emplace_back();
    }
    Segment& b = e->plan.back();
    const BatchEntry entry{static_cast<uint16_t>(f.op), 0, static_cast<uint32_t>(f.payload.size())};
    const size_t at = b.payload.size();
    b.payload.resize(at + sizeof entry + padded, 0);
    std::memcpy(b.payload.data() + at, &entry, sizeof entry);
    std::memcpy(b.payload.data() + at + sizeof entry, f.payload.data(), f.payload.size());
    b.stream_offsets.push_back(static_cast<uint32_t>(at + sizeof entry + f.stream_offset));
  }
  e->dirty = false;
}

// A launch's effect on its graph allocations: each allocation node's becomes allocated (refused
// while still allocated from the launch before, unless AUTO_FREE_ON_LAUNCH frees it first) and
// each free node's becomes free. Requires the lock.
CUresult LaunchGraphMemory(GuestExec* e) {
  const bool auto_free = (e->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0;
  for (const auto& m : e->mem_allocs) {
    if (m->live && !auto_free) {
      LogWarn("cuGraphLaunch: the graph's allocation at " + std::to_string(m->dptr) +
              " is still allocated from its last launch (free it first, or instantiate with AUTO_FREE_ON_LAUNCH)");
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (const auto& m : e->mem_frees) {
    const bool here = std::find(e->mem_allocs.begin(), e->mem_allocs.end(), m) != e->mem_allocs.end();
    if (m->released || (!m->live && !here)) return CUDA_ERROR_INVALID_VALUE;  // nothing allocated to free
  }
  for (const auto& m : e->mem_allocs) m->live = true;
  for (const auto& m : e->mem_frees) m->live = false;
  return CUDA_SUCCESS;
}

CUresult LaunchGraph(CUgraphExec he, CUstream hs) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t sid = 0;
  if (!StreamId(hs, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  if (CaptureActive()) {
    // Launched into a capturing stream: every frame becomes a node of that capture.
    std::vector<Frame> frames;
    bool mem_nodes = false;
    {
      std::lock_guard l(G().mu);
      GuestExec* e = AsExec(he);
      if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
      frames = e->frames;
      mem_nodes = !e->mem_allocs.empty() || !e->mem_frees.empty();
    }
    if (CUresult r; mem_nodes && CaptureRefuse(sid, "a graph with memory nodes launched into a capture", &r)) return r;
    // The first frame tells whether the launch stream is capturing (recorded) or not (sent below).
    bool captured = false;
    for (Frame& f : frames) {
      CUresult r = CUDA_SUCCESS;
      bool took = false;
      if (f.copy != nullptr) {
        took = CaptureNode(sid, &r, [&](GraphNode* node) { SetHostCopy(node, f.copy); });
      } else if (f.host.fn != nullptr) {
        took = CaptureHostFunc(sid, f.host.fn, f.host.userData, &r);
      } else {
        std::memcpy(f.payload.data() + f.stream_offset, &sid, sizeof sid);
        took = CaptureFrame(sid, f.op, f.payload.data(), static_cast<uint32_t>(f.payload.size()), f.stream_offset, &r);
      }
      if (!took) break;
      if (r != CUDA_SUCCESS) return r;
      captured = true;
    }
    if (captured) return CUDA_SUCCESS;
  }
  // One Batch frame per kBatchBytes of nodes (a launch costs a frame, not one per node); a host
  // node is queued in stream order between them as cuLaunchHostFunc does.
  std::vector<Segment> plan;
  {
    std::lock_guard l(G().mu);
    GuestExec* e = AsExec(he);
    if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = LaunchGraphMemory(e); r != CUDA_SUCCESS) return r;
    if (e->dirty) BuildPlan(e);
    plan = e->plan;
  }
  for (Segment& seg : plan) {
    if (seg.kind == Segment::kHost && seg.copy != nullptr) {
      // The copy outlives this launch's plan (the exec may be destroyed before it runs).
      auto* held = new (std::nothrow) std::shared_ptr<const HostCopy>(seg.copy);
      if (held == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
      if (CUresult r = LaunchHostFunc(hs, RunHeldHostCopy, held); r != CUDA_SUCCESS) {
        delete held;
        return r;
      }
      continue;
    }
    if (seg.kind == Segment::kHost) {
      if (CUresult r = LaunchHostFunc(hs, seg.host.fn, seg.host.userData); r != CUDA_SUCCESS) return r;
      continue;
    }
    for (uint32_t off : seg.stream_offsets) std::memcpy(seg.payload.data() + off, &sid, sizeof sid);
    HostFuncGate(sid);  // the work after a host function waits for it to return
    if (CUresult r = Client::Get().Send(seg.op, seg.payload.data(), static_cast<uint32_t>(seg.payload.size()));
        r != CUDA_SUCCESS)
      return r;
  }
  return CUDA_SUCCESS;
}

// Memset node parameters -> the Memset frame (checked as cuMemsetD2D*Async is).
CUresult MemsetFrame(const CUDA_MEMSET_NODE_PARAMS* p, std::vector<uint8_t>* frame) {
  if (p == nullptr || (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4) || p->width == 0 ||
      p->height == 0)
    return CUDA_ERROR_INVALID_VALUE;
  uint64_t row = 0, span = 0;
  if (!CheckedMul(p->width, p->elementSize, &row)) return CUDA_ERROR_INVALID_VALUE;
  if (p->height > 1 ? !Span2D(p->height, p->pitch, row, &span) : (span = row, false)) return CUDA_ERROR_INVALID_VALUE;
  if (!S().mirror.Find(p->dst, span, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  MemsetReq q{p->dst, p->width, p->height, p->height > 1 ? p->pitch : 0, 0, p->value, p->elementSize};
  frame->assign(reinterpret_cast<uint8_t*>(&q), reinterpret_cast<uint8_t*>(&q) + sizeof q);
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuStreamBeginCapture(CUstream hs) {
  ORION_API(cuStreamBeginCapture);
  return BeginCapture(hs, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
ORION_EXPORT CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hs) {
  ORION_API(cuStreamBeginCapture_ptsz);
  return BeginCapture(hs, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
ORION_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hs, CUstreamCaptureMode mode) {
  ORION_API(cuStreamBeginCapture_v2);
  return BeginCapture(hs, mode);
}
ORION_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hs, CUstreamCaptureMode mode) {
  ORION_API(cuStreamBeginCapture_v2_ptsz);
  return BeginCapture(hs, mode);
}
ORION_EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream hs, CUgraph* graph) {
  ORION_API(cuStreamEndCapture);
  return EndCapture(hs, graph);
}
ORION_EXPORT CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hs, CUgraph* graph) {
  ORION_API(cuStreamEndCapture_ptsz);
  return EndCapture(hs, graph);
}
ORION_EXPORT CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  ORION_API(cuThreadExchangeStreamCaptureMode);
  if (mode == nullptr || *mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_capture_mode);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuStreamIsCapturing(CUstream hs, CUstreamCaptureStatus* status) {
  ORION_API(cuStreamIsCapturing);
  return CaptureInfo(hs, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}
ORION_EXPORT CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream hs, CUstreamCaptureStatus* status) {
  ORION_API(cuStreamIsCapturing_ptsz);
  return CaptureInfo(hs, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}
ORION_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream hs, CUstreamCaptureStatus* status, cuuint64_t* id) {
  ORION_API(cuStreamGetCaptureInfo);
  return CaptureInfo(hs, status, id, nullptr, nullptr, nullptr, nullptr);
}
ORION_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_ptsz(CUstream hs, CUstreamCaptureStatus* status, cuuint64_t* id) {
  ORION_API(cuStreamGetCaptureInfo_ptsz);
  return CaptureInfo(hs, status, id, nullptr, nullptr, nullptr, nullptr);
}
ORION_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hs, CUstreamCaptureStatus* status, cuuint64_t* id,
                                                        CUgraph* graph, const CUgraphNode** deps, size_t* n) {
  ORION_API(cuStreamGetCaptureInfo_v2);
  return CaptureInfo(hs, status, id, graph, deps, nullptr, n);
}
ORION_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v2_ptsz(CUstream hs, CUstreamCaptureStatus* status, cuuint64_t* id,
                                                             CUgraph* graph, const CUgraphNode** deps, size_t* n) {
  ORION_API(cuStreamGetCaptureInfo_v2_ptsz);
  return CaptureInfo(hs, status, id, graph, deps, nullptr, n);
}
ORION_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hs, CUstreamCaptureStatus* status, cuuint64_t* id,
                                                        CUgraph* graph, const CUgraphNode** deps,
                                                        const CUgraphEdgeData** edges, size_t* n) {
  ORION_API(cuStreamGetCaptureInfo_v3);
  return CaptureInfo(hs, status, id, graph, deps, edges, n);
}
ORION_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(CUstream hs, CUstreamCaptureStatus* status, cuuint64_t* id,
                                                             CUgraph* graph, const CUgraphNode** deps,
                                                             const CUgraphEdgeData** edges, size_t* n) {
  ORION_API(cuStreamGetCaptureInfo_v3_ptsz);
  return CaptureInfo(hs, status, id, graph, deps, edges, n);
}

// ---- Graphs -------------------------------------------------------------------------------------
ORION_EXPORT CUresult CUDAAPI cuGraphCreate(CUgraph* graph, unsigned int flags) {
  ORION_API(cuGraphCreate);
  if (graph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  std::lock_guard l(G().mu);
  if (G().graphs.size() >= kMaxGraphs) return CUDA_ERROR_OUT_OF_MEMORY;
  auto* g = new GuestGraph;
  G().graphs.insert(g);
  *graph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphDestroy(CUgraph hg) {
  ORION_API(cuGraphDestroy);
  std::unique_lock l(G().mu);
  GuestGraph* g = AsGraph(hg);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (g->child) return CUDA_ERROR_INVALID_VALUE;  // a child graph node's copy belongs to its node
  for (auto& [s, c] : G().capturing)
    if (c->graph == g) return CUDA_ERROR_ILLEGAL_STATE;  // still being captured into
  std::vector<uint64_t> to_free;
  if (g->has_mem_nodes) {
    for (GuestExec* e : G().execs)
      if (e->source == g) e->source = nullptr;
    for (auto& n : g->nodes) {
      if (n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) continue;
      n->mem->graph = nullptr;
      DropMem(n->mem, &to_free);
    }
  }
  Unregister(g);
  delete g;
  l.unlock();
  FreeGraphMemory(to_free);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphClone(CUgraph* out, CUgraph hg) {
  ORION_API(cuGraphClone);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GuestGraph* g = AsGraph(hg);
  if (g == nullptr || g->has_mem_nodes) return CUDA_ERROR_INVALID_VALUE;  // CUDA: no clone with memory nodes
  if (G().graphs.size() >= kMaxGraphs) return CUDA_ERROR_OUT_OF_MEMORY;
  std::map<const GraphNode*, GraphNode*> map;
  GuestGraph* c = Clone(*g, &map).release();
  Register(c);
  *out = reinterpret_cast<CUgraph>(c);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphGetNodes(CUgraph hg, CUgraphNode* nodes, size_t* count) {
  ORION_API(cuGraphGetNodes);
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GuestGraph* g = AsGraph(hg);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (nodes != nullptr) {
    for (size_t i = 0; i < std::min(*count, g->nodes.size()); ++i)
      nodes[i] = reinterpret_cast<CUgraphNode>(g->nodes[i].get());
  }
  *count = g->nodes.size();
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphGetRootNodes(CUgraph hg, CUgraphNode* nodes, size_t* count) {
  ORION_API(cuGraphGetRootNodes);
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GuestGraph* g = AsGraph(hg);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t n = 0;
  for (auto& node : g->nodes) {
    if (!node->deps.empty()) continue;
    if (nodes != nullptr && n < *count) nodes[n] = reinterpret_cast<CUgraphNode>(node.get());
    ++n;
  }
  *count = n;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hn, CUgraphNodeType* type) {
  ORION_API(cuGraphNodeGetType);
  if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GraphNode* n = AsNode(hn);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *type = n->type;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n) {
  ORION_API(cuGraphAddEmptyNode);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return AddToGraph(hg, deps, n, std::make_unique<GraphNode>(), out);
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                                      const CUDA_KERNEL_NODE_PARAMS* p) {
  ORION_API(cuGraphAddKernelNode_v2);
  if (out == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<GraphNode>();
  node->type = CU_GRAPH_NODE_TYPE_KERNEL;
  if (CUresult r = KernelNodeFrame(p, &node->op, &node->payload); r != CUDA_SUCCESS) return r;
  node->stream_offset = offsetof(LaunchReq, stream);
  node->kernel = *p;
  node->kernel.kernelParams = nullptr;  // the node keeps the values (in its frame), not the pointers
  node->kernel.extra = nullptr;
  return AddToGraph(hg, deps, n, std::move(node), out);
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                                   const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  ORION_API(cuGraphAddKernelNode);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v2{};
  v2.func = p->func;
  v2.gridDimX = p->gridDimX;
  v2.gridDimY = p->gridDimY;
  v2.gridDimZ = p->gridDimZ;
  v2.blockDimX = p->blockDimX;
  v2.blockDimY = p->blockDimY;
  v2.blockDimZ = p->blockDimZ;
  v2.sharedMemBytes = p->sharedMemBytes;
  v2.kernelParams = p->kernelParams;
  v2.extra = p->extra;
  return cuGraphAddKernelNode_v2(out, hg, deps, n, &v2);
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                                   const CUDA_MEMSET_NODE_PARAMS* p, CUcontext ctx) {
  ORION_API(cuGraphAddMemsetNode);
  (void)ctx;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  auto node = std::make_unique<GraphNode>();
  node->type = CU_GRAPH_NODE_TYPE_MEMSET;
  node->op = Op::kMemset;
  if (CUresult r = MemsetFrame(p, &node->payload); r != CUDA_SUCCESS) return r;
  node->stream_offset = offsetof(MemsetReq, stream);
  node->memset = *p;
  return AddToGraph(hg, deps, n, std::move(node), out);
}

// Device-to-device copies of 1 or 2 dimensions are frames; a copy with a host side (or of 3
// dimensions) runs as a host copy at each launch; array sides are refused.
ORION_EXPORT CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                                   const CUDA_MEMCPY3D* p, CUcontext ctx) {
  ORION_API(cuGraphAddMemcpyNode);
  (void)ctx;
  if (out == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  auto dev_side = [](CUmemorytype t, CUdeviceptr d) {
    return t == CU_MEMORYTYPE_DEVICE || (t == CU_MEMORYTYPE_UNIFIED && S().mirror.Find(d, 1, nullptr));
  };
  if (p->srcMemoryType == CU_MEMORYTYPE_ARRAY || p->dstMemoryType == CU_MEMORYTYPE_ARRAY) {
    LogWarn("cuGraphAddMemcpyNode: copies to or from CUDA arrays are not served by Orion in graphs");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (p->reserved0 != nullptr || p->reserved1 != nullptr || p->srcLOD != 0 || p->dstLOD != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (!dev_side(p->srcMemoryType, p->srcDevice) || !dev_side(p->dstMemoryType, p->dstDevice) || p->Depth > 1 ||
      p->srcZ != 0 || p->dstZ != 0) {
    // A host side (or a 3D copy): checked now as cuMemcpy3D checks it, run at each launch as a
    // host copy (the header says how).
    if (p->WidthInBytes == 0 || p->Height == 0 || p->Depth == 0) return CUDA_ERROR_INVALID_VALUE;
    auto host_ok = [](CUmemorytype t, const void* h, CUdeviceptr d) {
      return t == CU_MEMORYTYPE_HOST ? h != nullptr : t == CU_MEMORYTYPE_UNIFIED ? d != 0 : t == CU_MEMORYTYPE_DEVICE;
    };
    if (!host_ok(p->srcMemoryType, p->srcHost, p->srcDevice) || !host_ok(p->dstMemoryType, p->dstHost, p->dstDevice))
      return CUDA_ERROR_INVALID_VALUE;
    auto dev_span_ok = [](CUmemorytype t, CUdeviceptr base, size_t x, size_t y, size_t z, size_t pitch, size_t height,
                          size_t w, size_t h, size_t depth) {
      if (!(t == CU_MEMORYTYPE_DEVICE || (t == CU_MEMORYTYPE_UNIFIED && S().mirror.Find(base, 1, nullptr))))
        return true;  // a host side: read or written when the node runs
      uint64_t slice = 0, off = 0, first = 0, span = 0;
      return CheckedMul(height, pitch, &slice) && CheckedMul(z, slice, &off) && CheckedAdd(off, y * pitch + x, &off) &&
             CheckedAdd(base, off, &first) && CheckedMul(depth - 1, slice, &span) &&
             CheckedAdd(span, (h - 1) * pitch + w, &span) && S().mirror.Find(first, span, nullptr);
    };
    if (!dev_span_ok(p->srcMemoryType, p->srcDevice, p->srcXInBytes, p->srcY, p->srcZ, p->srcPitch,
                     p->Depth > 1 ? p->srcHeight : 0, p->WidthInBytes, p->Height, p->Depth) ||
        !dev_span_ok(p->dstMemoryType, p->dstDevice, p->dstXInBytes, p->dstY, p->dstZ, p->dstPitch,
                     p->Depth > 1 ? p->dstHeight : 0, p->WidthInBytes, p->Height, p->Depth))
      return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<HostCopy> c;
    std::unique_ptr<GraphNode> node;
    try {
      c = std::make_shared<HostCopy>(HostCopy{*p, CurrentCtx()});
      node = std::make_unique<GraphNode>();
    } catch (const std::bad_alloc&) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    SetHostCopy(node.get(), std::move(c));
    return AddToGraph(hg, deps, n, std::move(node), out);
  }
  if (p->WidthInBytes == 0 || p->Height == 0) return CUDA_ERROR_INVALID_VALUE;
  auto first = [](CUdeviceptr base, size_t x, size_t y, size_t pitch, uint64_t* at) {
    uint64_t off = 0;
    return CheckedMul(y, pitch, &off) && CheckedAdd(off, x, &off) && CheckedAdd(base, off, at);
  };
  uint64_t src = 0, dst = 0, span_s = 0, span_d = 0;
  const bool rows = p->Height > 1;
  if (!first(p->srcDevice, p->srcXInBytes, p->srcY, p->srcPitch, &src) ||
      !first(p->dstDevice, p->dstXInBytes, p->dstY, p->dstPitch, &dst) ||
      (rows && (!Span2D(p->Height, p->srcPitch, p->WidthInBytes, &span_s) ||
                !Span2D(p->Height, p->dstPitch, p->WidthInBytes, &span_d))))
    return CUDA_ERROR_INVALID_VALUE;
  if (!rows) span_s = span_d = p->WidthInBytes;
  if (!S().mirror.Find(src, span_s, nullptr) || !S().mirror.Find(dst, span_d, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  auto node = !rows ? FrameNode(CU_GRAPH_NODE_TYPE_MEMCPY, Op::kMemcpyDtoD, MemcpyReq{dst, src, p->WidthInBytes, 0},
                                offsetof(MemcpyReq, stream))
                    : FrameNode(CU_GRAPH_NODE_TYPE_MEMCPY, Op::kMemcpy2D,
                                Memcpy2DReq{src, p->srcPitch, dst, p->dstPitch, p->WidthInBytes, p->Height, 0,
                                            kSideDevice, kSideDevice},
                                offsetof(Memcpy2DReq, stream));
  return AddToGraph(hg, deps, n, std::move(node), out);
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddHostNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                                 const CUDA_HOST_NODE_PARAMS* p) {
  ORION_API(cuGraphAddHostNode);
  if (out == nullptr || p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<GraphNode>();
  node->type = CU_GRAPH_NODE_TYPE_HOST;
  node->host = *p;
  return AddToGraph(hg, deps, n, std::move(node), out);
}

ORION_EXPORT CUresult CUDAAPI cuGraphHostNodeGetParams(CUgraphNode hn, CUDA_HOST_NODE_PARAMS* p) {
  ORION_API(cuGraphHostNodeGetParams);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GraphNode* node = AsNode(hn);
  if (node == nullptr || node->type != CU_GRAPH_NODE_TYPE_HOST) return CUDA_ERROR_INVALID_VALUE;
  *p = node->host;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphHostNodeSetParams(CUgraphNode hn, const CUDA_HOST_NODE_PARAMS* p) {
  ORION_API(cuGraphHostNodeSetParams);
  if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GraphNode* node = AsNode(hn);
  if (node == nullptr || node->type != CU_GRAPH_NODE_TYPE_HOST) return CUDA_ERROR_INVALID_VALUE;
  node->host = *p;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphExecHostNodeSetParams(CUgraphExec he, CUgraphNode hn,
                                                           const CUDA_HOST_NODE_PARAMS* p) {
  ORION_API(cuGraphExecHostNodeSetParams);
  if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GuestExec* e = AsExec(he);
  GraphNode* node = AsNode(hn);
  if (e == nullptr || node == nullptr || node->type != CU_GRAPH_NODE_TYPE_HOST) return CUDA_ERROR_INVALID_VALUE;
  auto it = e->index.find(node);
  if (it == e->index.end()) return CUDA_ERROR_INVALID_VALUE;  // not a node of the graph it was made from
  e->frames[it->second].host = *p;
  e->dirty = true;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddEventRecordNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                                        CUevent ev) {
  ORION_API(cuGraphAddEventRecordNode);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto e = reinterpret_cast<uint64_t>(ev);
  if (!S().events.Has(e)) return CUDA_ERROR_INVALID_HANDLE;
  auto node = FrameNode(CU_GRAPH_NODE_TYPE_EVENT_RECORD, Op::kEventRecord, EventRecordReq{e, 0},
                        offsetof(EventRecordReq, stream));
  node->event = e;
  return AddToGraph(hg, deps, n, std::move(node), out);
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddEventWaitNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                                      CUevent ev) {
  ORION_API(cuGraphAddEventWaitNode);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto e = reinterpret_cast<uint64_t>(ev);
  if (!S().events.Has(e)) return CUDA_ERROR_INVALID_HANDLE;
  auto node = FrameNode(CU_GRAPH_NODE_TYPE_WAIT_EVENT, Op::kStreamWaitEvent, StreamWaitEventReq{0, e, 0, 0},
                        offsetof(StreamWaitEventReq, stream));
  node->event = e;
  return AddToGraph(hg, deps, n, std::move(node), out);
}

// cuGraphAddNode (CUDA 12.2) and cuGraphAddNode_v2 (12.3, with edge data): one entry point for
// every node type, served by the type's own cuGraphAdd*Node. Edges must be plain full-completion
// dependencies (all-zero CUgraphEdgeData); the node types Orion does not build here (external
// semaphores, batch memory operations, conditional) are refused.
static CUresult AddNodeOfParams(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, const CUgraphEdgeData* edges,
                                size_t n, CUgraphNodeParams* p) {
  if (out == nullptr || p == nullptr || (deps == nullptr && n != 0)) return CUDA_ERROR_INVALID_VALUE;
  if (p->reserved0[0] != 0 || p->reserved0[1] != 0 || p->reserved0[2] != 0 || p->reserved2 != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (edges != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      if (edges[i].from_port != 0 || edges[i].to_port != 0 || edges[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT) {
        LogWarn("cuGraphAddNode: edges other than full-completion dependencies are not supported by Orion");
        return CUDA_ERROR_NOT_SUPPORTED;
      }
    }
  }
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_EMPTY: return cuGraphAddEmptyNode(out, hg, deps, n);
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const CUDA_KERNEL_NODE_PARAMS_v3& k = p->kernel;
      CUDA_KERNEL_NODE_PARAMS v2{};
      v2.func = k.func;
      v2.gridDimX = k.gridDimX;
      v2.gridDimY = k.gridDimY;
      v2.gridDimZ = k.gridDimZ;
      v2.blockDimX = k.blockDimX;
      v2.blockDimY = k.blockDimY;
      v2.blockDimZ = k.blockDimZ;
      v2.sharedMemBytes = k.sharedMemBytes;
      v2.kernelParams = k.kernelParams;
      v2.extra = k.extra;
      v2.kern = k.kern;
      v2.ctx = k.ctx;
      return cuGraphAddKernelNode_v2(out, hg, deps, n, &v2);
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const CUDA_MEMSET_NODE_PARAMS_v2& m = p->memset;
      const CUDA_MEMSET_NODE_PARAMS v1{m.dst, m.pitch, m.value, m.elementSize, m.width, m.height};
      return cuGraphAddMemsetNode(out, hg, deps, n, &v1, m.ctx);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      if (p->memcpy.flags != 0 || p->memcpy.reserved != 0) return CUDA_ERROR_INVALID_VALUE;
      return cuGraphAddMemcpyNode(out, hg, deps, n, &p->memcpy.copyParams, p->memcpy.copyCtx);
    case CU_GRAPH_NODE_TYPE_HOST: {
      const CUDA_HOST_NODE_PARAMS v1{p->host.fn, p->host.userData};
      return cuGraphAddHostNode(out, hg, deps, n, &v1);
    }
    case CU_GRAPH_NODE_TYPE_GRAPH:
      if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE) {
        LogWarn("cuGraphAddNode: moving a child graph into its parent is not supported by Orion (clone it)");
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      return cuGraphAddChildGraphNode(out, hg, deps, n, p->graph.graph);
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
      static_assert(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS_v2) == sizeof(CUDA_MEM_ALLOC_NODE_PARAMS), "same fields");
      CUDA_MEM_ALLOC_NODE_PARAMS v1{};
      std::memcpy(&v1, &p->alloc, sizeof v1);
      const CUresult r = cuGraphAddMemAllocNode(out, hg, deps, n, &v1);
      p->alloc.dptr = v1.dptr;
      return r;
    }
    case CU_GRAPH_NODE_TYPE_MEM_FREE: return cuGraphAddMemFreeNode(out, hg, deps, n, p->free.dptr);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return cuGraphAddEventRecordNode(out, hg, deps, n, p->eventRecord.event);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return cuGraphAddEventWaitNode(out, hg, deps, n, p->eventWait.event);
    default: {
      static std::atomic<bool> told{false};
      if (!told.exchange(true))
        LogWarn("cuGraphAddNode of node type " + std::to_string(static_cast<int>(p->type)) +
                " is not supported by Orion; returning CUDA_ERROR_NOT_SUPPORTED");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                             CUgraphNodeParams* p) {
  ORION_API(cuGraphAddNode);
  return AddNodeOfParams(out, hg, deps, nullptr, n, p);
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                                                const CUgraphEdgeData* edges, size_t n, CUgraphNodeParams* p) {
  ORION_API(cuGraphAddNode_v2);
  return AddNodeOfParams(out, hg, deps, edges, n, p);
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                                     CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  ORION_API(cuGraphAddMemAllocNode);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckMemAllocParams(p); r != CUDA_SUCCESS) return r;
  {
    std::lock_guard l(G().mu);
    GuestGraph* g = AsGraph(hg);
    if (g == nullptr || g->child) return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_ptr<GraphMem> m;
  if (CUresult r = NewGraphMem(p->bytesize, &m); r != CUDA_SUCCESS) return r;
  auto node = std::make_unique<GraphNode>();
  node->type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  node->mem = m;
  CUresult r = CUDA_SUCCESS;
  {
    std::lock_guard l(G().mu);
    GuestGraph* g = AsGraph(hg);  // again: the graph may be gone meanwhile
    r = g == nullptr || g->child ? CUDA_ERROR_INVALID_VALUE : AddNode(g, deps, n, std::move(node), out);
    if (r == CUDA_SUCCESS) RegisterMem(g, m);
  }
  if (r != CUDA_SUCCESS) {
    FreeGraphMemory({m->dptr});
    return r;
  }
  p->dptr = m->dptr;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddMemFreeNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                                    CUdeviceptr dptr) {
  ORION_API(cuGraphAddMemFreeNode);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GuestGraph* g = AsGraph(hg);
  auto it = G().mem.find(dptr);
  if (g == nullptr || g->child || it == G().mem.end()) return CUDA_ERROR_INVALID_VALUE;
  const std::shared_ptr<GraphMem> m = it->second;
  // CUDA: an allocation is freed once in a graph, and only in its own graph when that graph frees it.
  if (FreesIt(*g, m.get()) || (m->freed_in_graph && m->graph != g)) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<GraphNode>();
  node->type = CU_GRAPH_NODE_TYPE_MEM_FREE;
  node->mem = m;
  if (CUresult r = AddNode(g, deps, n, std::move(node), out); r != CUDA_SUCCESS) return r;
  g->has_mem_nodes = true;
  if (m->graph == g) m->freed_in_graph = true;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphMemAllocNodeGetParams(CUgraphNode hn, CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  ORION_API(cuGraphMemAllocNodeGetParams);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GraphNode* n = AsNode(hn);
  if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
  *p = CUDA_MEM_ALLOC_NODE_PARAMS{};
  p->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p->poolProps.location.id = n->mem->device;
  p->bytesize = n->mem->bytes;
  p->dptr = n->mem->dptr;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphMemFreeNodeGetParams(CUgraphNode hn, CUdeviceptr* dptr) {
  ORION_API(cuGraphMemFreeNodeGetParams);
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GraphNode* n = AsNode(hn);
  if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEM_FREE) return CUDA_ERROR_INVALID_VALUE;
  *dptr = n->mem->dptr;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                                       CUgraph child) {
  ORION_API(cuGraphAddChildGraphNode);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GuestGraph* g = AsGraph(hg);
  GuestGraph* c = AsGraph(child);
  // CUDA: a graph with memory nodes is a child only when moved into its parent (not served here).
  if (g == nullptr || g->child || c == nullptr || g == c || c->has_mem_nodes) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<GraphNode>();
  node->type = CU_GRAPH_NODE_TYPE_GRAPH;
  std::map<const GraphNode*, GraphNode*> map;
  node->child = Clone(*c, &map);  // the node holds a copy (CUDA: the child graph is cloned)
  return AddNode(g, deps, n, std::move(node), out);
}

ORION_EXPORT CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hn, CUgraph* out) {
  ORION_API(cuGraphChildGraphNodeGetGraph);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GraphNode* n = AsNode(hn);
  if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
  // A graph the caller may query but not destroy or add to (it belongs to the node).
  *out = reinterpret_cast<CUgraph>(n->child.get());
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode hn, CUDA_KERNEL_NODE_PARAMS* p) {
  ORION_API(cuGraphKernelNodeGetParams_v2);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GraphNode* n = AsNode(hn);
  if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
  {
    *p = n->kernel;
    // kernelParams point at the values the node holds (inside its frame), as the driver's copy.
    GuestFunction* f = reinterpret_cast<GuestFunction*>(
        n->kernel.func != nullptr ? n->kernel.func : reinterpret_cast<CUfunction>(n->kernel.kern));
    const size_t head = n->op == Op::kLaunchKernelEx ? sizeof(LaunchExReq) : sizeof(LaunchReq);
    n->args.clear();
    if (S().functions.Has(f)) {
      for (const ParamInfo& pi : f->params) n->args.push_back(n->payload.data() + head + pi.offset);
    }
    p->kernelParams = n->args.empty() ? nullptr : n->args.data();
    p->extra = nullptr;
  }
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphKernelNodeSetParams_v2(CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS* p) {
  ORION_API(cuGraphKernelNodeSetParams_v2);
  Op op;
  std::vector<uint8_t> frame;
  if (CUresult r = KernelNodeFrame(p, &op, &frame); r != CUDA_SUCCESS) return r;
  std::lock_guard l(G().mu);
  GraphNode* n = AsNode(hn);
  if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
  n->op = op;
  n->payload = std::move(frame);
  n->kernel = *p;
  n->kernel.kernelParams = nullptr;
  n->kernel.extra = nullptr;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec he, CUgraphNode hn,
                                                                const CUDA_KERNEL_NODE_PARAMS* p) {
  ORION_API(cuGraphExecKernelNodeSetParams_v2);
  Op op;
  std::vector<uint8_t> frame;
  if (CUresult r = KernelNodeFrame(p, &op, &frame); r != CUDA_SUCCESS) return r;
  std::lock_guard l(G().mu);
  GuestExec* e = AsExec(he);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = e->index.find(reinterpret_cast<GraphNode*>(hn));
  if (it == e->index.end() ||
      (e->frames[it->second].op != Op::kLaunchKernel && e->frames[it->second].op != Op::kLaunchKernelEx))
    return CUDA_ERROR_INVALID_VALUE;
  e->frames[it->second] = Frame{op, std::move(frame), static_cast<uint32_t>(offsetof(LaunchReq, stream)), {}, nullptr};
  e->dirty = true;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* out, CUgraph hg, unsigned long long flags) {
  ORION_API(cuGraphInstantiateWithFlags);
  return Instantiate(out, hg, flags);
}
ORION_EXPORT CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* out, CUgraph hg, CUgraphNode* err_node, char* log,
                                                 size_t log_size) {
  ORION_API(cuGraphInstantiate);
  if (err_node != nullptr) *err_node = nullptr;
  if (log != nullptr && log_size > 0) log[0] = '\0';
  return Instantiate(out, hg, 0);
}
ORION_EXPORT CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* out, CUgraph hg, CUgraphNode* err_node, char* log,
                                                    size_t log_size) {
  ORION_API(cuGraphInstantiate_v2);
  if (err_node != nullptr) *err_node = nullptr;
  if (log != nullptr && log_size > 0) log[0] = '\0';
  return Instantiate(out, hg, 0);
}
static CUresult InstantiateWithParams(CUgraphExec* out, CUgraph hg, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  p->hErrNode_out = nullptr;
  const CUresult r = Instantiate(out, hg, p->flags);
  p->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}
ORION_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* out, CUgraph hg,
                                                           CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  ORION_API(cuGraphInstantiateWithParams);
  return InstantiateWithParams(out, hg, p);
}
ORION_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec* out, CUgraph hg,
                                                                CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  ORION_API(cuGraphInstantiateWithParams_ptsz);
  return InstantiateWithParams(out, hg, p);
}

ORION_EXPORT CUresult CUDAAPI cuGraphExecGetFlags(CUgraphExec he, cuuint64_t* flags) {
  ORION_API(cuGraphExecGetFlags);
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(G().mu);
  GuestExec* e = AsExec(he);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = e->flags;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec he) {
  ORION_API(cuGraphExecDestroy);
  std::unique_lock l(G().mu);
  GuestExec* e = AsExec(he);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<uint64_t> to_free;
  for (const auto& m : e->mem_allocs) DropMem(m, &to_free);
  G().execs.erase(e);
  delete e;
  l.unlock();
  FreeGraphMemory(to_free);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuGraphLaunch(CUgraphExec he, CUstream hs) {
  ORION_API(cuGraphLaunch);
  return LaunchGraph(he, hs);
}
ORION_EXPORT CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec he, CUstream hs) {
  ORION_API(cuGraphLaunch_ptsz);
  return LaunchGraph(he, hs);
}
// Uploading prepares device-side state; here the frames are ready at instantiation.
ORION_EXPORT CUresult CUDAAPI cuGraphUpload(CUgraphExec he, CUstream hs) {
  ORION_API(cuGraphUpload);
  uint64_t sid = 0;
  if (!StreamId(hs, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard l(G().mu);
  return AsExec(he) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
ORION_EXPORT CUresult CUDAAPI cuGraphUpload_ptsz(CUgraphExec he, CUstream hs) {
  ORION_API(cuGraphUpload_ptsz);
  uint64_t sid = 0;
  if (!StreamId(hs, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard l(G().mu);
  return AsExec(he) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// Whole-graph update: the same topology (node count and types, in order); each node's parameters
// (kernel configuration and arguments, copy and memset ranges, events) come from the new graph.
ORION_EXPORT CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec he, CUgraph hg, CUgraphExecUpdateResultInfo* info) {
  ORION_API(cuGraphExecUpdate_v2);
  std::lock_guard l(G().mu);
  GuestExec* e = AsExec(he);
  GuestGraph* g = AsGraph(hg);
  if (e == nullptr || g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestExec fresh;
  Flatten(*g, &fresh, true);
  auto fail = [&](CUgraphExecUpdateResult why, const GraphNode* at) {
    if (info != nullptr) {
      info->result = why;
      info->errorNode = reinterpret_cast<CUgraphNode>(const_cast<GraphNode*>(at));
      info->errorFromNode = nullptr;
    }
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  };
  if (g->has_mem_nodes || !e->mem_allocs.empty() || !e->mem_frees.empty())
    return fail(CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED, nullptr);  // memory nodes: not updated here
  if (fresh.order.size() != e->order.size() || fresh.frames.size() != e->frames.size())
    return fail(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, nullptr);
  for (size_t i = 0; i < fresh.order.size(); ++i) {
    if (fresh.order[i]->type != e->order[i]->type || fresh.order[i]->deps.size() != e->order[i]->deps.size())
      return fail(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, fresh.order[i]);
  }
  for (size_t i = 0; i < fresh.frames.size(); ++i) {
    if (fresh.frames[i].op != e->frames[i].op) return fail(CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED, nullptr);
  }
  // Keep the node -> frame index of the exec's own nodes (cuGraphExec*SetParams name those).
  e->frames = std::move(fresh.frames);
  e->dirty = true;
  if (info != nullptr) {
    info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    info->errorNode = nullptr;
    info->errorFromNode = nullptr;
  }
  return CUDA_SUCCESS;
}

}  // extern "C"
