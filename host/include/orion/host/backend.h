// orion/host/backend.h — what a session worker executes on: the real CUDA driver or the simulator.
//
// A Backend lives in one session worker process and serves that session only. The worker has
// already validated everything it passes in: handles are the backend's own values from its earlier
// replies, device ranges lie inside allocations of this session, host pointers lie inside the
// session's data window. Backends return CUresult values verbatim (they travel to the client).
//
//   auto b = MakeSimBackend(sim_options);
//   b->Init(placements);
//   void* ctx; b->PrimaryCtxRetain(0, &ctx); b->SetCurrent(ctx);
//   uint64_t p; b->MemAlloc(1 << 20, &p);
//
// Thread-safety: none; a worker calls its backend from one thread.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "orion/common/frame.h"
#include "orion/host/compute_share.h"
#include "orion/common/status.h"
#include "orion/host/ipc_ticket.h"
#include "orion/pool/pool.h"

namespace orion::host {

// The pool's types (orion/pool/pool.h), as the backends and the daemon name them.
using pool::PhysicalGpu;
using pool::Placement;

struct KernelLayout {
  std::vector<ParamInfo> params;  // in ordinal order
  uint32_t param_bytes = 0;
  // Set when the backend already knows every launch will fail (the sim: no image it can execute).
  CUresult launch_error = CUDA_SUCCESS;
  LaunchRefusal launch_refusal = LaunchRefusal::kNone;
};

// One kernel launch as the session checked it (the shape of cuLaunchKernelEx's CUlaunchConfig):
// built once from the wire (LaunchReq, LaunchExReq) by Session::Launch and handed to the backend
// as is. The session has checked `grid`, `block` and `shared_mem` against the device's attribute
// table (CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_*, _MAX_BLOCK_DIM_*, _MAX_THREADS_PER_BLOCK,
// _MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), `flags` against kLaunchCooperative, and `params` against
// the function's layout (param_bytes long). What depends on the function (its cluster limit, its
// static shared memory) is the backend's to check.
struct LaunchSpec {
  uint32_t grid[3] = {1, 1, 1};     // blocks per dimension
  uint32_t block[3] = {1, 1, 1};    // threads per block per dimension
  uint32_t shared_mem = 0;          // dynamic shared memory per block, bytes
  uint32_t cluster[3] = {1, 1, 1};  // blocks per cluster ({1,1,1}: no cluster)
  uint32_t flags = 0;               // kLaunchCooperative (frame.h)
  void* stream = nullptr;           // the backend's stream (null: the context's default stream)
  std::span<const uint8_t> params;  // the parameter buffer; borrowed for the call (the frame's bytes)

  uint64_t threads() const { return uint64_t{block[0]} * block[1] * block[2]; }
  uint64_t blocks() const { return uint64_t{grid[0]} * grid[1] * grid[2]; }
  uint64_t cluster_size() const { return uint64_t{cluster[0]} * cluster[1] * cluster[2]; }
  bool cooperative() const { return (flags & kLaunchCooperative) != 0; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "sim" or "cuda"

  // Prepares the session's devices (one per placement, in order).
  virtual Status Init(const std::vector<Placement>& placements) = 0;
  // The session's view of device `dev` (an index into the placements): name, uuid, attributes;
  // total_mem is filled by the worker from the quota.
  virtual void DescribeDevice(uint32_t dev, DeviceInfo* out) = 0;
  virtual int DriverVersion() = 0;
  // Bytes a context costs on the GPU (counted in the quota).
  virtual uint64_t ContextOverhead(uint32_t dev) = 0;
  // Makes [base, base+bytes) (the session's data window) usable for copies and device mapping.
  virtual CUresult RegisterWindow(void* base, uint64_t bytes) = 0;

  // Contexts. `dev` indexes the placements.
  virtual CUresult PrimaryCtxRetain(uint32_t dev, void** ctx) = 0;
  virtual CUresult PrimaryCtxReset(uint32_t dev) = 0;
  virtual CUresult CtxCreate(uint32_t dev, uint32_t flags, void** ctx) = 0;
  virtual CUresult CtxDestroy(void* ctx) = 0;
  virtual CUresult SetCurrent(void* ctx) = 0;
  virtual CUresult CtxSynchronize() = 0;
  virtual CUresult CtxSetLimit(uint32_t limit, uint64_t value) = 0;
  virtual CUresult CtxGetLimit(uint32_t limit, uint64_t* value) = 0;

  // Memory, in the current context.
  virtual CUresult MemAlloc(uint64_t bytes, uint64_t* dptr) = 0;
  virtual CUresult MemFree(uint64_t dptr) = 0;
  virtual CUresult MemGetInfo(uint64_t* free, uint64_t* total) = 0;  // physical; the worker clamps
  virtual CUresult MemcpyHtoD(uint64_t dst, const void* src, uint64_t bytes, void* stream) = 0;
  // `async`: completes in stream order (destination in the window); else before returning.
  virtual CUresult MemcpyDtoH(void* dst, uint64_t src, uint64_t bytes, void* stream, bool async) = 0;
  virtual CUresult MemcpyDtoD(uint64_t dst, uint64_t src, uint64_t bytes, void* stream) = 0;
  // Device memory [dptr, dptr+bytes) as host memory the caller may read and write in place, every
  // stream's work before it finished; nullptr when the backend's memory is not the host's (a GPU's),
  // the range is not one mapping, or a stream failed. Valid until the memory is freed or a stream
  // runs again. A move streams a session's memory from and into it without a staging copy (issue #24).
  virtual uint8_t* HostView(uint64_t /*dptr*/, uint64_t /*bytes*/) { return nullptr; }
  // 2D copy; a side is a device address, or a host address inside the window (`*_host` non-null).
  virtual CUresult Memcpy2D(uint64_t dst, void* dst_host, uint64_t dst_pitch, uint64_t src, const void* src_host,
                            uint64_t src_pitch, uint64_t width, uint64_t height, void* stream) = 0;
  virtual CUresult Memset(uint64_t dst, uint32_t value, uint32_t elem_size, uint64_t width, uint64_t height,
                          uint64_t pitch, void* stream) = 0;
  // Device address of window memory [host, host+bytes) (mapped pinned memory). `want` (0: none) is
  // the address the client's process sees those bytes at: a backend that can (SameAddressMapping)
  // gives them that very device address when it collides with nothing, so a pinned host pointer is
  // its own device pointer (unified addressing, CUDA's cuMemHostAlloc doc); otherwise an address of
  // its own. The worker checked [host, host+bytes) lies in the session's window.
  virtual CUresult HostGetDevicePointer(void* host, uint64_t bytes, uint64_t want, uint64_t* dptr) = 0;
  // Whether HostGetDevicePointer can honour `want` (then managed memory can live in the window).
  virtual bool SameAddressMapping() const { return false; }

  // Virtual memory management (the worker has validated every range: multiples of
  // kVmmGranularity, inside the session's own reservations and physical allocations, and charged
  // the quota). A reservation is address space only; `MemCreate` makes `bytes` of physical memory
  // on device `dev`; `MemMap` places [offset, offset+bytes) of it at `addr` (an unmapped part of a
  // reservation), accessible once `MemSetAccess` grants `flags` (CUmemAccess_flags) to `dev`.
  // `MemRelease` may come while mappings remain: the memory lives until the last `MemUnmap`.
  virtual CUresult MemAddressReserve(uint64_t bytes, uint64_t alignment, uint64_t fixed_addr, uint64_t* addr) = 0;
  virtual CUresult MemAddressFree(uint64_t addr, uint64_t bytes) = 0;
  virtual CUresult MemCreate(uint32_t dev, uint64_t bytes, void** handle) = 0;
  virtual CUresult MemRelease(void* handle) = 0;
  virtual CUresult MemMap(uint64_t addr, uint64_t bytes, uint64_t offset, void* handle) = 0;
  virtual CUresult MemUnmap(uint64_t addr, uint64_t bytes) = 0;
  virtual CUresult MemSetAccess(uint64_t addr, uint64_t bytes, uint32_t dev, uint32_t flags) = 0;

  // CUDA IPC between sessions (orion/host/ipc_ticket.h). Export: `dptr` is the start of one of
  // this session's allocations (`bytes` long), `event` one of its events created with
  // CU_EVENT_INTERPROCESS; exporting again returns the same handle. Import: the handle is hostile
  // input, checked by OpenIpcTicket; the mapping or event stays until closed (or the session ends).
  virtual CUresult IpcExportMemory(uint64_t dptr, uint64_t bytes, IpcHandle* out) = 0;
  virtual CUresult IpcImportMemory(const IpcHandle& h, uint64_t* dptr, uint64_t* bytes) = 0;
  virtual CUresult IpcCloseMemory(uint64_t dptr) = 0;
  // The ticket fd behind an exported allocation or an import (owned by the backend, open until the
  // allocation is freed or the import closed), or -1: for the charges of orion/host/ipc_ticket.h.
  virtual int IpcTicketFd(uint64_t dptr) const = 0;
  virtual CUresult IpcExportEvent(void* event, IpcHandle* out) = 0;
  virtual CUresult IpcImportEvent(const IpcHandle& h, void** event) = 0;

  // CUDA arrays, texture and surface objects. The worker has validated the descriptor (formats,
  // channel counts, extents) and charged the array to the quota; it destroys an array only when no
  // texture or surface object of its still refers to it. `MemcpyArray` copies a `width` x `height`
  // box (bytes x rows) of one slice: each side is device memory (`dptr`, `pitch`), window memory
  // (`host`, `pitch`) or an array (`array`, origin `x` bytes, `y`, `z`), all inside their bounds.
  // Texture objects on LINEAR / PITCH2D memory name a range inside one of the session's allocations.
  struct ArraySpec {
    uint64_t width = 0, height = 0, depth = 0;  // CUDA's convention: height 0 = 1D, depth 0 = 2D
    uint32_t format = 0, channels = 1, flags = 0;
  };
  struct CopySide {
    uint32_t kind = kSideDevice;  // kSideDevice, kSideWindow, kSideArray
    uint64_t dptr = 0;
    void* host = nullptr;
    void* array = nullptr;
    uint64_t pitch = 0;
    uint64_t x = 0, y = 0, z = 0;
  };
  struct TexSpec {
    uint32_t res_type = 0;                                // CU_RESOURCE_TYPE_ARRAY, LINEAR, PITCH2D
    void* array = nullptr;                                // ARRAY
    uint64_t dptr = 0, width = 0, height = 0, pitch = 0;  // LINEAR (width in texels), PITCH2D
    uint32_t format = 0, channels = 1;                    // LINEAR, PITCH2D
    void* mipmap = nullptr;                               // MIPMAPPED_ARRAY
    bool surface = false;
    uint32_t address_mode[3] = {};
    uint32_t filter_mode = 0, flags = 0;
    float border_color[4] = {};
    uint32_t mipmap_filter = 0, max_anisotropy = 0;
    float mipmap_bias = 0, min_level = 0, max_level = 0;
  };
  virtual CUresult ArrayCreate(const ArraySpec& spec, void** array) = 0;
  virtual CUresult ArrayDestroy(void* array) = 0;
  virtual CUresult MemcpyArray(const CopySide& dst, const CopySide& src, uint64_t width, uint64_t height,
                               void* stream) = 0;
  // A mipmapped array of `levels` levels; its levels are arrays owned by it (MipmappedArrayGetLevel
  // returns the same one each time; they go with MipmappedArrayDestroy).
  virtual CUresult MipmappedArrayCreate(const ArraySpec& spec, uint32_t levels, void** mipmap) = 0;
  virtual CUresult MipmappedArrayGetLevel(void* mipmap, uint32_t level, void** array) = 0;
  virtual CUresult MipmappedArrayDestroy(void* mipmap) = 0;
  // *object in: the value the object must have (a moved session's, issue #24), or 0 for the
  // backend's choice; out: its value. A value taken, or one the backend cannot give (a GPU's
  // driver chooses its own): CUDA_ERROR_INVALID_VALUE, or CUDA_ERROR_NOT_SUPPORTED.
  virtual CUresult TexObjectCreate(const TexSpec& spec, uint64_t* object) = 0;
  virtual CUresult TexObjectDestroy(uint64_t object, bool surface) = 0;

  // Why the last call failed, when the backend knows more than its CUresult (e.g. which part of a
  // module image it could not parse); "" otherwise.
  virtual std::string ErrorDetail() const { return ""; }
  // Things the worker should log once (e.g. "kernel K was not executed: no PTX"); cleared by the call.
  virtual std::vector<std::string> TakeNotices() { return {}; }
  // Device printf text produced since the last call (the sim executor's; "" otherwise).
  virtual std::string TakeOutput() { return ""; }

  // Modules: `image` is a fatbin, cubin or PTX, already size-checked.
  virtual CUresult ModuleLoad(std::span<const uint8_t> image, void** module) = 0;
  virtual CUresult ModuleUnload(void* module) = 0;
  virtual CUresult ModuleGetFunction(void* module, const char* name, void** function, KernelLayout* layout) = 0;
  virtual CUresult ModuleGetGlobal(void* module, const char* name, uint64_t* dptr, uint64_t* bytes) = 0;
  // The names of the module's functions (kernels), in a stable order (cuModuleEnumerateFunctions).
  virtual CUresult ModuleFunctionNames(void* module, std::vector<std::string>* names) = 0;
  virtual CUresult FuncGetAttribute(void* function, int attribute, int* value) = 0;
  virtual CUresult FuncSetAttribute(void* function, int attribute, int value) = 0;
  // The compute-share gate the next launches run under (the launching context's vGPU's; null:
  // none). A backend that cannot gate its kernels ignores it (the session log says so).
  virtual void UseComputeGate(ComputeGate* gate) { (void)gate; }
  // Device memory a launch of `function` holds besides its allocations while it runs (local memory
  // for its resident threads, and shared memory), as a GPU reserves it: the worker charges it to
  // the vGPU's quota (0: none to charge).
  virtual uint64_t LaunchScratchBytes(void* function, const LaunchSpec& launch) {
    (void)function, (void)launch;
    return 0;
  }
  virtual bool GatesCompute() const { return false; }
  // Launches `function` as `launch` describes (its params are only borrowed: a backend that runs
  // the launch later copies them).
  virtual CUresult LaunchKernel(void* function, const LaunchSpec& launch) = 0;
  virtual CUresult OccupancyMaxBlocks(void* function, uint32_t block_size, uint64_t dynamic_smem, uint32_t flags,
                                      int* blocks) = 0;
  virtual CUresult OccupancyMaxClusters(void* function, const uint32_t grid[3], const uint32_t block[3],
                                        uint32_t shared_mem, const uint32_t cluster[3], int* clusters) = 0;
  virtual CUresult OccupancyAvailableSmem(void* function, int num_blocks, int block_size, uint64_t* bytes) = 0;

  // Streams and events; a null stream is the current context's default stream.
  virtual CUresult StreamCreate(uint32_t flags, int priority, void** stream) = 0;
  // cuStreamGetAttribute / cuStreamSetAttribute of CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW or
  // _SYNCHRONIZATION_POLICY (the session checked the id and the value): `value` (64 bytes, a
  // CUstreamAttrValue) is set from, or filled with, the attribute. `stream` may be null (the
  // default stream).
  virtual CUresult StreamAttribute(void* stream, uint32_t attr, bool set, uint8_t value[64]) = 0;
  // cuTensorMapEncodeTiled of `q` (checked by the session: its requirements hold and its global
  // address is the session's device memory) into `out` (a CUtensorMap, 16 words).
  virtual CUresult TensorMapEncodeTiled(const TensorMapEncodeReq& q, uint64_t out[16]) = 0;
  // cuTensorMapEncodeIm2col of `q` (checked likewise) into `out`.
  virtual CUresult TensorMapEncodeIm2col(const TensorMapIm2colReq& q, uint64_t out[16]) {
    (void)q, (void)out;
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  // cuTensorMapReplaceAddress: `map` (a client's copy of a map; any bytes) with its global address
  // replaced by `address` (checked: 16-byte aligned, the session's device memory), into `out`.
  virtual CUresult TensorMapReplaceAddress(const uint64_t map[16], uint64_t address, uint64_t out[16]) {
    (void)map, (void)address, (void)out;
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult StreamDestroy(void* stream) = 0;
  virtual CUresult StreamSynchronize(void* stream) = 0;
  virtual CUresult StreamQuery(void* stream) = 0;
  virtual CUresult StreamWaitEvent(void* stream, void* event, uint32_t flags) = 0;
  virtual CUresult EventCreate(uint32_t flags, void** event) = 0;
  virtual CUresult EventDestroy(void* event) = 0;
  virtual CUresult EventRecord(void* event, void* stream) = 0;
  virtual CUresult EventSynchronize(void* event) = 0;
  virtual CUresult EventQuery(void* event) = 0;
  virtual CUresult EventElapsedTime(void* start, void* end, float* ms) = 0;

  // Live migration (issue #24; host/src/session_snapshot.cpp): a restored session gets its memory
  // back at the device addresses its program holds. A backend that cannot place memory answers
  // CUDA_ERROR_NOT_SUPPORTED, and a session on it cannot move.
  //  - MemAllocAt: cuMemAlloc's memory, `bytes` long, at exactly `addr`; CUDA_ERROR_ALREADY_MAPPED
  //    when the range is not free.
  //  - ModuleGlobals: the device variables of `module` that have an address so far, with the bytes
  //    that address spans (what a copy of their contents reads).
  //  - ModulePlaceGlobal: gives variable `g.name` of `module`, loaded and not launched or looked up
  //    yet, the address `g.addr` and `g.bytes` of memory, as ModuleGlobals described it elsewhere;
  //    CUDA_ERROR_NOT_FOUND for a name the module does not have.
  struct ModuleGlobal {
    std::string name;
    uint64_t addr = 0;
    uint64_t bytes = 0;
  };
  virtual CUresult MemAllocAt(uint64_t bytes, uint64_t addr) {
    (void)bytes, (void)addr;
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult ModuleGlobals(void* module, std::vector<ModuleGlobal>* out) {
    (void)module, (void)out;
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult ModulePlaceGlobal(void* module, const ModuleGlobal& g) {
    (void)module, (void)g;
    return CUDA_ERROR_NOT_SUPPORTED;
  }
};

// Simulator: no GPU. Memory is host RAM at device-like addresses; modules are parsed; launches are
// validated, appended to `launch_log` (if not empty), and executed on the CPU by the PTX executor
// (orion/ptx) when the module carries PTX for the kernel and `execute` is on.
struct SimOptions {
  std::string launch_log;  // file, appended; "" = none
  uint32_t session_id = 0;
  bool execute = true;  // --sim-execute ptx (true) | none (validate and log only)
  // --sim-unexecutable refuse (false, the default) | skip. A kernel the executor cannot run (no PTX
  // a GPU would JIT: SASS only, or PTX for another arch; PTX it cannot parse or an instruction it
  // does not implement) fails its launch with CUDA_ERROR_NO_BINARY_FOR_GPU (no usable image, as a
  // driver says for a kernel with none for the device) or CUDA_ERROR_NOT_SUPPORTED (usable PTX the
  // executor does not implement). `skip` accepts the launch and runs nothing: API-level tests only.
  bool skip_unexecutable = false;
  // --sim-driver-version: the driver version the sim reports (cuDriverGetVersion), and so the newest
  // PTX ISA it accepts (ptx::MaxPtxIsaVersion). Default: the CUDA headers this build implements.
  // A host whose programs' NVRTC is newer (e.g. 13.2 from pip wheels) needs a driver that new, on
  // a GPU as here.
  int driver_version = CUDA_VERSION;
  uint64_t kernel_timeout_ms = 600000;  // --sim-kernel-timeout: a longer launch ends with LAUNCH_TIMEOUT
  uint32_t workers = 0;                 // host threads per launch; 0: the machine's cores
};
std::unique_ptr<Backend> MakeSimBackend(const SimOptions& options);
// The simulated physical GPUs the daemon offers (`count` GPUs of `mem_mib` each).
std::vector<PhysicalGpu> SimPhysicalGpus(uint32_t count, uint64_t mem_mib);

// Real CUDA driver, dlopen'ed from `driver_path` (default "libcuda.so.1").
struct CudaOptions {
  std::string driver_path = "libcuda.so.1";
};
Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaOptions& options);
// Probes the real driver in a child process (the daemon must not initialise CUDA before it forks
// session workers). Returns the GPUs, or an error when no driver or no GPU answers.
Result<std::vector<PhysicalGpu>> ProbeCudaGpus(const CudaOptions& options);

}  // namespace orion::host
