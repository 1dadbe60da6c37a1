// guest/src/state.h — what the guest runtime knows locally: contexts, modules, functions, the
// mirror of the session's device allocations, and the coverage counters of every entry point.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "client.h"
#include "orion/common/frame.h"

namespace orion::guest {

// ---- Coverage --------------------------------------------------------------------------------
enum class Sym : uint32_t {
#define ORION_CUDA_SYMBOL(s) s,
#include "cuda_api.inc"
#undef ORION_CUDA_SYMBOL
  kCount
};
void CoverageHit(Sym s, bool real) noexcept;
const char* SymName(Sym s) noexcept;

// Every implemented entry point starts with ORION_API(name): counts the call (ORION_COVERAGE).
#define ORION_API(name) ::orion::guest::CoverageHit(::orion::guest::Sym::name, true)

// Status of a CUDA call that needs a connected session.
CUresult EnsureInit() noexcept;
// Status of a call that needs a connected session and a current context.
CUresult NeedCtx() noexcept;

// ---- Objects -----------------------------------------------------------------------------------
struct GuestCtx {
  uint64_t handle = 0;  // server id
  int device = 0;
  unsigned flags = 0;
  bool primary = false;
  unsigned long long id = 0;  // cuCtxGetId
};

struct GuestFunction;
struct GuestModule {
  uint64_t handle = 0;
  GuestCtx* ctx = nullptr;
  std::mutex mu;
  std::unordered_map<std::string, GuestFunction*> functions;
  std::vector<uint64_t> globals;  // device ranges registered in the mirror
};

struct GuestFunction {
  uint64_t handle = 0;
  GuestModule* module = nullptr;
  std::string name;
  std::vector<ParamInfo> params;
  uint32_t param_bytes = 0;
  // Not CUDA_SUCCESS: oriond said every launch fails (its backend cannot execute the kernel), and why.
  CUresult launch_error = CUDA_SUCCESS;
  LaunchRefusal launch_refusal = LaunchRefusal::kNone;
  std::atomic<bool> refusal_told{false};  // the refusal was logged (once per function)
};

// Registry of live objects of one kind, so handles from the application are validated before use.
template <typename T>
class Registry {
 public:
  void Add(T* p) {
    std::unique_lock l(mu_);
    set_.insert(p);
  }
  bool Remove(T* p) {
    std::unique_lock l(mu_);
    return set_.erase(p) != 0;
  }
  bool Has(const void* p) const {
    std::shared_lock l(mu_);
    return set_.count(static_cast<T*>(const_cast<void*>(p))) != 0;
  }

 private:
  mutable std::shared_mutex mu_;
  std::unordered_set<T*> set_;
};

// Handle ids (streams, events) that the server issued to this process, with a small value each
// (streams: flags and priority).
class IdSet {
 public:
  void Add(uint64_t id, uint64_t value = 0) {
    std::unique_lock l(mu_);
    set_[id] = value;
  }
  bool Remove(uint64_t id) {
    std::unique_lock l(mu_);
    return set_.erase(id) != 0;
  }
  bool Has(uint64_t id) const {
    std::shared_lock l(mu_);
    return set_.count(id) != 0;
  }
  bool Get(uint64_t id, uint64_t* value) const {
    std::shared_lock l(mu_);
    auto it = set_.find(id);
    if (it == set_.end()) return false;
    *value = it->second;
    return true;
  }

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<uint64_t, uint64_t> set_;
};

// kVmm: an accessible cuMemMap'ed range (no context; `device` is its physical allocation's).
// kIpc: another process's allocation opened with cuIpcOpenMemHandle (closed, never freed, here).
enum class RangeKind : uint8_t { kDevice, kGlobal, kMappedHost, kVmm, kIpc };
struct DeviceRange {
  uint64_t base = 0, bytes = 0;
  RangeKind kind = RangeKind::kDevice;
  GuestCtx* ctx = nullptr;
  void* host = nullptr;  // kMappedHost: the host pointer
  int device = 0;        // kVmm: the device (others: ctx->device)
};

// Mirror of device ranges the session owns: for immediate CUDA_ERROR_INVALID_VALUE like the real
// driver, cuMemGetAddressRange and cuPointerGetAttribute(s).
class Mirror {
 public:
  // Adds `r`; a kMappedHost range replaces the kMappedHost ranges it overlaps (mappings of pinned
  // memory since freed, at the same addresses).
  void Add(const DeviceRange& r);
  bool Remove(uint64_t base, DeviceRange* out);
  // Removes the kDevice range that starts exactly at `base` (a cuMemAlloc), atomically with the
  // check; false (nothing removed) if there is none.
  bool RemoveDevice(uint64_t base, DeviceRange* out);
  // The range containing [p, p+bytes), if any; a kVmm range may run on into the kVmm ranges that
  // adjoin it (the first is returned).
  bool Find(uint64_t p, uint64_t bytes, DeviceRange* out) const;
  // Drops the kMappedHost ranges of the pinned memory the program sees at `host` (freed or
  // unregistered).
  void RemoveMappedHost(const void* host);
  // Drops every range of a context that was destroyed or reset.
  void RemoveContext(const GuestCtx* ctx);

 private:
  mutable std::shared_mutex mu_;
  std::map<uint64_t, DeviceRange> ranges_;
};

// State::registered values: the size, and what kind of registration it is.
inline constexpr uint64_t kRegisteredOwned = uint64_t{1} << 63;     // our own memory (cuMemAllocHost fallback)
inline constexpr uint64_t kRegisteredInWindow = uint64_t{1} << 62;  // DEVICEMAP: its pages moved into the window
inline constexpr uint64_t kRegisteredSize = kRegisteredInWindow - 1;

struct State {
  std::mutex mu;
  std::vector<GuestCtx*> primary;  // per device; nullptr until retained
  std::vector<unsigned> primary_refs;
  std::vector<unsigned> primary_flags;
  Registry<GuestCtx> contexts;
  Registry<GuestModule> modules;
  Registry<GuestFunction> functions;
  IdSet streams;
  IdSet events;
  Mirror mirror;
  std::map<uintptr_t, uint64_t> registered;  // cuMemHostRegister'ed ranges: size | kRegistered* flags
  std::map<uintptr_t, uint64_t> managed;     // cuMemAllocManaged ranges (in the pinned heap): size
  std::atomic<unsigned long long> next_ctx_id{1};
};
State& S() noexcept;

// Calling thread's context stack (cuCtxPush/Pop/SetCurrent).
GuestCtx* CurrentCtx() noexcept;
void SetCurrentCtx(GuestCtx* c) noexcept;
std::vector<GuestCtx*>& CtxStack() noexcept;
uint64_t& ThreadContextHandle() noexcept;

// Stream handle from the application -> server id (0 = default). False if unknown.
bool StreamId(CUstream s, uint64_t* id) noexcept;
bool IsRegisteredHost(const void* p, uint64_t bytes) noexcept;
// Runs cudart's context-local-storage destructors for `ctx` (export_tables.cpp).
void RunContextDestructors(CUcontext ctx) noexcept;

// A module's function count and its index-th function (ModuleFunctionName op; api_exec.cpp).
// A device allocation is gone (cuMemFree): the memory pool that handed it out stops counting it
// (api_vmm.cpp).
void PoolFreed(uint64_t dptr) noexcept;

CUresult ModuleFunctionCount(CUmodule mod, unsigned* count) noexcept;
// A 2D copy where a side is a CUDA array (api_array.cpp); `src_z` / `dst_z`: the array slice
// (cuMemcpy3D, one slice at a time). Unified sides must already be resolved to host or device.
CUresult ArrayCopyBox(const CUDA_MEMCPY2D& k, size_t src_z, size_t dst_z, uint64_t stream) noexcept;
// The LaunchKernel(Ex) frame payload of a kernel node (api_exec.cpp), checked as a launch is; its
// stream field is set when the graph is launched.
CUresult KernelNodeFrame(const CUDA_KERNEL_NODE_PARAMS* p, Op* op, std::vector<uint8_t>* frame) noexcept;

// ---- Host functions (hostfunc.cpp) -------------------------------------------------------------
// Waits until the host functions that work on `stream` must follow (its own, and the implicit
// synchronization of the legacy default stream; ~0: all) have returned. One atomic load when none
// is queued. Called by the stream-ordered hooks below, so every such call passes through it.
void HostFuncGate(uint64_t stream) noexcept;
// Whether such host functions are still queued (cuStreamQuery answers CUDA_ERROR_NOT_READY).
bool HostFuncPending(uint64_t stream) noexcept;
// Queues `fn(data)` on `hs` as cuLaunchHostFunc does (a graph's host node at launch).
CUresult LaunchHostFunc(CUstream hs, CUhostFn fn, void* data) noexcept;

// ---- Stream capture and graphs (graph.cpp) ------------------------------------------------------
// A graph is kept in this process: its nodes are the frames their work would send (kernel launch,
// device-to-device copy, memset, event record and wait), checked when made; a graph launch sends
// them in a topological order on the launch stream, where oriond validates each as any frame.
// Whether some stream capture is under way in the process (one relaxed load).
bool CaptureActive() noexcept;
// When `stream` is being captured: records the frame (payload with the stream id at
// `stream_offset`) as a node of the capture's graph, sets *result and returns true. False when
// the stream is not capturing (the caller sends the frame).
bool CaptureFrame(uint64_t stream, Op op, const void* payload, uint32_t len, uint32_t stream_offset,
                  CUresult* result) noexcept;
// When `stream` is being captured, an operation on it failed (`what`, for the log): the capture is
// invalidated, so the graph it would end in never lacks that work silently.
void CaptureFailed(uint64_t stream, const std::string& what) noexcept;
// When `stream` is being captured, work `what` that Orion cannot put in a graph (a copy to or
// from host memory, a stream-ordered allocation): the capture is invalidated, as CUDA does with
// operations not permitted in capture; *result = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
bool CaptureRefuse(uint64_t stream, const char* what, CUresult* result) noexcept;
// cuMemAllocAsync / cuMemFreeAsync on a capturing stream: a memory-allocation node (*dptr is its
// fixed address) or a memory-free node of the capture (true, *result set). An allocation from a
// pool other than the default, or a free of memory no graph allocated, invalidates the capture.
bool CaptureMemAlloc(uint64_t stream, uint64_t bytes, bool default_pool, CUdeviceptr* dptr, CUresult* result) noexcept;
bool CaptureMemFree(uint64_t stream, uint64_t dptr, CUresult* result) noexcept;
// cuMemFree / cuMemFreeAsync of a graph allocation (true, *result set): it is marked free, its
// memory kept for the graph's next launch; false when `dptr` is no graph allocation.
bool GraphMemFree(uint64_t dptr, CUresult* result) noexcept;
// cuDeviceGetGraphMemAttribute (reset false) and cuDeviceSetGraphMemAttribute (reset true).
CUresult GraphMemAttribute(int device, int attr, uint64_t* value, bool reset) noexcept;
// cuLaunchHostFunc on a capturing stream: a host node of the capture (true, *result set).
bool CaptureHostFunc(uint64_t stream, CUhostFn fn, void* data, CUresult* result) noexcept;
// A copy to or from host memory (pageable or pinned; 1D, 2D or 3D, no array side) on a capturing
// stream: a memcpy node of the capture (true, *result set), run at each launch in stream order.
bool CaptureHostCopy(uint64_t stream, const CUDA_MEMCPY3D& copy, CUresult* result) noexcept;
// cuMemcpy3D(Async) on the current context (api_memory.cpp): what a graph's host copy runs.
CUresult Memcpy3D(const CUDA_MEMCPY3D* copy, CUstream hs, bool async) noexcept;
// Event record on a capturing stream (a dependency inside the capture, no frame), and a wait on
// an event recorded in a capture (the waiting stream joins that capture).
bool CaptureEventRecord(uint64_t event, uint64_t stream, unsigned flags, CUresult* result) noexcept;
bool CaptureStreamWait(uint64_t stream, uint64_t event, unsigned flags, CUresult* result) noexcept;
// A synchronizing call on `stream` (or on the context: `stream` = ~0) while capturing: not
// permitted; the capture is invalidated and *result = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
bool CaptureForbidsSync(uint64_t stream, CUresult* result) noexcept;
CUresult ModuleFunctionAt(CUmodule mod, unsigned index, CUfunction* out) noexcept;

// ---- Private tables (cuGetExportTable; export_tables.cpp, docs/spec/export-tables.md) ----------
// The table with this UUID, or nullptr: an unknown UUID is logged (once) and counted for
// ORION_COVERAGE, so is a table Orion declines on purpose. Thread-safe.
const void* FindExportTable(const CUuuid* id) noexcept;
// ORION_COVERAGE lines for the private tables and slots called so far; each table or slot counts as
// one entry point in `called` and in `real` (served) or `not_supported` (refused); `declined`
// counts tables that are refused by design (callers go on without them).
std::string ExportTableCoverage(size_t* called, size_t* real, size_t* not_supported, size_t* declined) noexcept;

}  // namespace orion::guest
