// host/src/sim_backend.h — the sim backend's SimBackend, private to host/src. A GPU-less executor. Device memory is
// host RAM (lazily committed anonymous mappings) at device-like addresses; modules are parsed from their
// fatbinary/cubin/PTX so kernel parameter layouts are known; kernels run on the PTX executor (orion/ptx). A kernel the
// executor cannot run (no PTX a GPU would JIT, or PTX it does not implement) fails its launch, unless the daemon was
// started with --sim-unexecutable skip (API-level testing: results are not computed).
//
// The class is split by job: sim_module.cpp (devices, modules, functions, limits), sim_memory.cpp
// (device memory, copies, arrays and texture objects, VMM, IPC), sim_streams.cpp (launches, the
// deferred-launch queues, streams, events, occupancy, tensor maps); sim_backend.cpp makes it.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <thread>

#include <nlohmann/json.hpp>

#include "orion/host/backend.h"
#include "orion/fatbin/fatbin.h"
#include "orion/host/ipc_ticket.h"
#include "orion/ptx/ptx.h"

namespace orion::host::sim {

constexpr uint64_t kSimBase = 0x200000000000ull;  // far from where Linux places user mappings
constexpr uint64_t kSimAlign = 512;               // cudaMalloc alignment is at least 256
// sm_90 limits (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"):
// statically declared shared memory per block, shared memory per block with the opt-in (what
// CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN says; the session checks launches against
// it), shared memory per SM and what the GPU reserves of it per block, and local memory per thread.
constexpr uint64_t kSimMaxStaticShared = 48 * 1024;
constexpr uint64_t kSimMaxSharedPerBlock = 232448;
constexpr uint64_t kSimSharedPerSm = 233472;
constexpr uint64_t kSimReservedSharedPerBlock = 1024;
constexpr uint64_t kSimMaxLocalPerThread = 512 * 1024;

inline uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

constexpr int kSimMaxAccessPolicyWindow = 134213632;                // bytes, as an H100 SXM reports
constexpr uint64_t kSimTensorMapTag = 0x314d544e4f49524full;        // "ORIONTM1": a tensor map the sim encoded
constexpr uint64_t kSimTensorMapIm2colTag = 0x324d544e4f49524full;  // "ORIONTM2": an im2col one

// Attributes of the simulated device: an sm_90-class GPU (values as an H100 SXM reports them).
inline void FillSimAttributes(int32_t* a, uint32_t pgpu) {
  auto set = [&](CUdevice_attribute k, int v) {
    if (static_cast<int>(k) < static_cast<int>(kMaxDeviceAttributes)) a[k] = v;
  };
  set(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024);
  set(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024);
  set(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024);
  set(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64);
  set(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647);
  set(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535);
  set(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535);
  set(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152);
  set(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536);
  set(CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32);
  set(CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647);
  set(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536);
  set(CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000);
  set(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512);
  set(CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1);
  set(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132);
  set(CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0);
  set(CU_DEVICE_ATTRIBUTE_INTEGRATED, 0);
  set(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1);
  set(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_COMPUTEMODE_DEFAULT);
  set(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH, 131072);
  set(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH, 131072);
  set(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT, 65536);
  set(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH, 16384);
  set(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT, 16384);
  set(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH, 16384);
  set(CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT, 512);
  set(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1);
  set(CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1);
  set(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, static_cast<int>(0x10 + pgpu));
  set(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0);
  set(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0);
  set(CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0);
  set(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000);
  set(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120);
  set(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52428800);
  set(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048);
  set(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 5);
  set(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1);
  set(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9);
  set(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0);
  set(CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1);
  set(CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1);
  set(CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1);
  set(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, static_cast<int>(kSimSharedPerSm));
  set(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536);
  set(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0);
  set(CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, 0);
  set(CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO, 2);
  set(CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1);
  set(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 0);
  set(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1);  // the executor runs all blocks at once
  set(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, static_cast<int>(kSimMaxSharedPerBlock));
  set(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32);
  set(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, static_cast<int>(kSimReservedSharedPerBlock));
  set(CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, 32505856);
  set(CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE, kSimMaxAccessPolicyWindow);
  set(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1);
}

struct Block {
  uint64_t bytes = 0;
  uint8_t* host = nullptr;  // backing memory
  bool owned = true;        // false: an alias (window memory, or a VMM mapping inside a reservation)
  int ipc_fd = -1;          // exported (cuIpcGetMemHandle): its ticket, which now backs `host`;
                            // imported: the importer's open of it (its shared flock)
  IpcHandle ipc{};
};

// Virtual memory management. A reservation is host address space with no access (PROT_NONE) at
// a device address range; a physical allocation is shared anonymous memory (its "home" mapping);
// cuMemMap makes a second mapping of the same pages inside the reservation (mremap with old size
// 0 duplicates a shared mapping, Linux mremap(2)), so two mappings of one handle alias, as on a GPU.
struct SimReservation {
  uint64_t bytes = 0;
  uint8_t* host = nullptr;
};
struct SimPhysical {
  uint64_t bytes = 0;
  uint8_t* home = nullptr;
};

struct SimModule {
  fatbin::Module info;
  std::unordered_map<std::string, uint64_t> globals;  // name -> device address
  // The executor's view, built at the first launch: the image is kept until then.
  std::vector<uint8_t> image;
  bool ptx_tried = false;
  std::shared_ptr<ptx::Program> program;  // null: no PTX (or it did not parse)
  std::string ptx_error;
  CUresult ptx_refusal = CUDA_ERROR_NO_BINARY_FOR_GPU;    // what a launch returns when `program` is null
  LaunchRefusal refusal_kind = LaunchRefusal::kSassOnly;  // and why
  std::vector<uint64_t> var_addrs;                        // device address of each ptx::Vars() entry
};
struct SimFunction {
  SimModule* module;
  const fatbin::Kernel* kernel;
  std::map<int, int> attributes;  // set with cuFuncSetAttribute
  // Whether the executor can run it: decided at its first launch (-1 until then); when it cannot,
  // the error its launches fail with and why.
  int runnable = -1;
  CUresult refusal = CUDA_SUCCESS;
  std::string why;
  ptx::KernelResources resources;  // once runnable
};

// The simulated device's 132 SMs in GPCs (an H100 SXM has 8 GPCs of 16-18 usable SMs); thread-block
// clusters are scheduled within one GPC.
constexpr int kSimGpcSms[] = {18, 18, 16, 16, 16, 16, 16, 16};
constexpr uint64_t kSimSms = 132;                // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr uint64_t kSimPortableClusterSize = 8;  // CUDA: larger needs the non-portable attribute
constexpr uint64_t kSimMaxClusterSize = 16;
struct SimEvent {
  uint32_t flags = 0;
  int ipc_fd = -1;  // exported: its ticket
  IpcHandle ipc{};
  bool recorded = false;  // its record has been reached (completed)
  uint64_t ns = 0;
  uint64_t pending_seq = 0;  // the seq of its latest record still queued (0: none)
  void* pending_stream = nullptr;
};

// A CUDA array: its texels stored linearly, rows of row_bytes, slices of rows rows (the layout of
// a real GPU's arrays is opaque; nothing can tell the difference but speed).
struct SimArray {
  Backend::ArraySpec spec;
  uint64_t texel = 0, row_bytes = 0, rows = 0, slices = 0;
  std::vector<uint8_t> data;
};

// A mipmapped array: its levels are SimArrays (in arrays_, owned here through their handles).
struct SimMipmap {
  std::vector<void*> levels;
};

class SimBackend final : public Backend, private ptx::GlobalMemory {
 public:
  explicit SimBackend(SimOptions o) : opt_(std::move(o)) {
    if (!opt_.launch_log.empty()) {
      log_fd_ = ::open(opt_.launch_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    }
  }
  ~SimBackend() override {
    for (auto& [addr, b] : blocks_) Release(b);
    for (auto& [addr, r] : reservations_) ::munmap(r.host, r.bytes);
    for (auto& [p, ph] : physical_) ::munmap(ph->home, ph->bytes);
    if (log_fd_ >= 0) ::close(log_fd_);
  }
  const char* name() const override { return "sim"; }

  Status Init(const std::vector<Placement>& placements) override;

  void DescribeDevice(uint32_t dev, DeviceInfo* out) override;
  int DriverVersion() override { return opt_.driver_version; }
  std::string ErrorDetail() const override { return last_error_; }
  uint64_t ContextOverhead(uint32_t) override { return 0; }
  CUresult RegisterWindow(void* base, uint64_t bytes) override;

  CUresult PrimaryCtxRetain(uint32_t dev, void** ctx) override;
  CUresult PrimaryCtxReset(uint32_t) override { return CUDA_SUCCESS; }
  CUresult CtxCreate(uint32_t dev, uint32_t, void** ctx) override;
  CUresult CtxDestroy(void*) override { return CUDA_SUCCESS; }
  CUresult SetCurrent(void*) override { return CUDA_SUCCESS; }
  CUresult CtxSynchronize() override { return Synced(FlushBlocking(true)); }
  CUresult CtxSetLimit(uint32_t limit, uint64_t value) override;
  CUresult CtxGetLimit(uint32_t limit, uint64_t* value) override;

  CUresult MemAlloc(uint64_t bytes, uint64_t* dptr) override;
  CUresult MemFree(uint64_t dptr) override;

  // CUDA IPC. Export: the allocation moves, in place and with its bytes, into its ticket's memfd
  // (mapped over the same host address), so an importing worker maps the very same pages.
  CUresult IpcExportMemory(uint64_t dptr, uint64_t, IpcHandle* out) override;
  CUresult IpcImportMemory(const IpcHandle& h, uint64_t* dptr, uint64_t* bytes) override;
  CUresult IpcCloseMemory(uint64_t dptr) override;
  int IpcTicketFd(uint64_t dptr) const override;
  // Events: the sim completes work when its stream is flushed, so an interprocess event's record
  // flushes its stream first (see EventRecord): a record is complete once oriond has taken it, and
  // an imported event has nothing left to wait for.
  CUresult IpcExportEvent(void* event, IpcHandle* out) override;
  CUresult IpcImportEvent(const IpcHandle& h, void** event) override;
  CUresult MemGetInfo(uint64_t* free, uint64_t* total) override;
  CUresult MemcpyHtoD(uint64_t dst, const void* src, uint64_t bytes, void* stream) override;
  CUresult MemcpyDtoH(void* dst, uint64_t src, uint64_t bytes, void* stream, bool) override;
  uint8_t* HostView(uint64_t dptr, uint64_t bytes) override;
  CUresult MemcpyDtoD(uint64_t dst, uint64_t src, uint64_t bytes, void* stream) override;
  CUresult Memcpy2D(uint64_t dst, void* dst_host, uint64_t dst_pitch, uint64_t src, const void* src_host,
                    uint64_t src_pitch, uint64_t width, uint64_t height, void* stream) override;
  CUresult ArrayCreate(const ArraySpec& spec, void** array) override;
  CUresult ArrayDestroy(void* array) override;
  CUresult MemcpyArray(const CopySide& dst, const CopySide& src, uint64_t width, uint64_t height,
                       void* stream) override;
  CUresult MipmappedArrayCreate(const ArraySpec& spec, uint32_t levels, void** mipmap) override;
  CUresult MipmappedArrayGetLevel(void* mipmap, uint32_t level, void** array) override;
  CUresult MipmappedArrayDestroy(void* mipmap) override;
  CUresult TexObjectCreate(const TexSpec& spec, uint64_t* object) override;
  CUresult TexObjectDestroy(uint64_t object, bool surface) override;
  CUresult Memset(uint64_t dst, uint32_t value, uint32_t elem, uint64_t width, uint64_t height, uint64_t pitch,
                  void* stream) override;
  CUresult MemAddressReserve(uint64_t bytes, uint64_t alignment, uint64_t, uint64_t* addr) override;
  CUresult MemAddressFree(uint64_t addr, uint64_t bytes) override;
  CUresult MemCreate(uint32_t, uint64_t bytes, void** handle) override;
  CUresult MemRelease(void* handle) override;
  CUresult MemMap(uint64_t addr, uint64_t bytes, uint64_t offset, void* handle) override;
  CUresult MemUnmap(uint64_t addr, uint64_t bytes) override;
  CUresult MemSetAccess(uint64_t addr, uint64_t bytes, uint32_t, uint32_t flags) override;

  bool SameAddressMapping() const override { return true; }
  CUresult HostGetDevicePointer(void* host, uint64_t bytes, uint64_t want, uint64_t* dptr) override;

  CUresult ModuleLoad(std::span<const uint8_t> image, void** module) override;
  CUresult ModuleUnload(void* module) override;
  CUresult ModuleGetFunction(void* module, const char* name, void** function, KernelLayout* layout) override;
  CUresult ModuleFunctionNames(void* module, std::vector<std::string>* names) override;
  CUresult ModuleGetGlobal(void* module, const char* name, uint64_t* dptr, uint64_t* bytes) override;
  CUresult MemAllocAt(uint64_t bytes, uint64_t addr) override;
  CUresult ModuleGlobals(void* module, std::vector<ModuleGlobal>* out) override;
  CUresult ModulePlaceGlobal(void* module, const ModuleGlobal& g) override;
  CUresult FuncGetAttribute(void* function, int attribute, int* value) override;
  CUresult FuncSetAttribute(void* function, int attribute, int value) override;

  // Largest cluster this function may use: 8 (portable), 16 with the non-portable attribute.
  static uint64_t MaxCluster(const SimFunction* f) {
    auto it = f->attributes.find(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED);
    return it != f->attributes.end() && it->second != 0 ? kSimMaxClusterSize : kSimPortableClusterSize;
  }
  void UseComputeGate(ComputeGate* gate) override { gate_ = gate; }
  // The executor runs up to `workers` blocks at once, each with its threads' local memory and its
  // shared memory: what a launch holds on oriond's host while it runs.
  uint64_t LaunchScratchBytes(void* function, const LaunchSpec& l) override;
  bool GatesCompute() const override { return true; }
  // The session checked the grid, block and dynamic shared memory against the attribute table
  // (LaunchSpec); what depends on the function is checked here.
  CUresult LaunchKernel(void* function, const LaunchSpec& l) override;

  // Runs one launch (when the module has PTX for its kernel); `exec` gets the launch log outcome.
  struct Pending {
    enum Kind : uint8_t { kLaunch, kRecord, kWait } kind = kLaunch;
    SimEvent* event = nullptr;    // kRecord / kWait
    uint64_t wait_seq = 0;        // kWait: the record it waits for
    void* wait_stream = nullptr;  // kWait: that record's stream
    uint64_t seq = 0;
    SimFunction* f = nullptr;
    LaunchSpec launch;  // kLaunch; its params are the frame's bytes, or `owned` once deferred
    std::vector<uint8_t> owned;
    void* stream = nullptr;
    ComputeGate* gate = nullptr;  // the launching vGPU's compute share (null: none)
  };
  CUresult Execute(const Pending& p, std::string* exec_out);

  // The launch log (--sim-launch-log): one JSON object per line (JSON Lines), written with one
  // write() so lines from concurrent sessions never interleave (O_APPEND). A launch:
  //   {"sess":7,"event":"launch","kernel":"_Z3addPiii","grid":[1,1,1],"block":[32,1,1],"smem":0,
  //    "stream":0,"cooperative":false,"cluster":[1,1,1],"params":"<hex>","exec":"ran"}
  // where exec is ran, off (--sim-execute none), skipped (--sim-unexecutable skip), deferred (queued
  // on a stream: its outcome comes later in a "ran" line), refused:<CUresult> or error:<CUresult>.
  // A deferred launch's outcome, when its stream runs it:
  //   {"sess":7,"event":"ran","kernel":"_Z3addPiii","stream":94...,"exec":"ran"}
  void WriteLogLine(const nlohmann::json& j);
  void LogLaunch(const Pending& p, const std::string& exec);

  // Executes the deferred launches of `stream` in order and returns the sticky error, if any. A
  // launch that fails without poisoning the context (an instruction the executor lacks) is kept in
  // async_error_ and reported by the next synchronizing call, as CUDA reports asynchronous errors.
  CUresult Flush(void* stream);
  // Runs one queued item: a launch, an event record (the event completes), or a wait (the
  // awaited stream runs up to the awaited record first).
  void RunItem(Pending& p);
  // Runs `stream`'s queue up to and including the item numbered `seq`.
  CUresult FlushUntil(void* stream, uint64_t seq);
  // Everything the legacy default stream waits for: every queue except non-blocking streams',
  // in launch order (`all`: the non-blocking ones too, for device-wide synchronization).
  CUresult FlushBlocking(bool all = false);
  CUresult FlushFor(void* stream) { return stream != nullptr ? Flush(stream) : FlushBlocking(); }
  // For synchronizing calls: the sticky error, else the first asynchronous one not yet reported.
  CUresult Synced(CUresult sticky) {
    if (sticky != CUDA_SUCCESS) return sticky;
    return std::exchange(async_error_, CUDA_SUCCESS);
  }
  void LogOutcome(const Pending& p, const std::string& exec);

  std::vector<std::string> TakeNotices() override { return std::exchange(notices_, {}); }
  std::string TakeOutput() override { return std::exchange(output_, {}); }

  CUresult OccupancyMaxBlocks(void*, uint32_t block_size, uint64_t dynamic_smem, uint32_t, int* blocks) override;

  CUresult OccupancyMaxClusters(void* function, const uint32_t[3], const uint32_t block[3], uint32_t shared_mem,
                                const uint32_t cluster[3], int* clusters) override;

  CUresult OccupancyAvailableSmem(void* function, int num_blocks, int block_size, uint64_t* bytes) override;

  CUresult StreamCreate(uint32_t flags, int, void** stream) override;
  CUresult StreamDestroy(void* stream) override;
  // A tensor map in Orion's own layout (the executor runs no TMA, so nothing reads it but a
  // program's own cuTensorMap* calls): a tag word, then the parameters as given.
  CUresult TensorMapEncodeTiled(const TensorMapEncodeReq& q, uint64_t out[16]) override;
  // An im2col map in Orion's own layout: a second tag, the tiled fields (no box), the corners and
  // the channels and pixels per column.
  CUresult TensorMapEncodeIm2col(const TensorMapIm2colReq& q, uint64_t out[16]) override;
  // The address is word 1 of either layout; a map the sim did not encode is refused, as the
  // driver refuses a map it cannot read.
  CUresult TensorMapReplaceAddress(const uint64_t map[16], uint64_t address, uint64_t out[16]) override;
  // Stream attributes are kept and returned; the sim has no L2 for an access policy window to
  // shape, and its streams' work runs in the order Flush gives whatever the sync policy.
  CUresult StreamAttribute(void* stream, uint32_t attr, bool set, uint8_t value[64]) override;
  // Everything ran in order already: launches execute when they arrive (see LaunchKernel).
  CUresult StreamSynchronize(void* stream) override { return Synced(FlushFor(stream)); }
  CUresult StreamQuery(void* stream) override { return Synced(FlushFor(stream)); }
  // Records and waits are stream-ordered like launches: a wait on a stream holds that stream's
  // later work until the awaited record is reached (running the other stream up to it). A program
  // that drops a wait, or records too early, reads stale data here deterministically.
  CUresult StreamWaitEvent(void* stream, void* event, uint32_t) override;
  CUresult EventCreate(uint32_t flags, void** event) override;
  CUresult EventDestroy(void* event) override;
  CUresult EventRecord(void* event, void* stream) override;
  CUresult EventSynchronize(void* event) override;
  CUresult EventQuery(void* event) override { return EventSynchronize(event); }
  CUresult EventElapsedTime(void* start, void* end, float* ms) override;

 private:
  // ptx::GlobalMemory: the executor reaches device memory only through the session's blocks.
  bool Find(uint64_t addr, ptx::GlobalMemory::Span* out) override {
    auto it = blocks_.upper_bound(addr);
    if (it == blocks_.begin()) return false;
    --it;
    if (addr - it->first >= it->second.bytes || it->second.host == nullptr) return false;
    *out = ptx::GlobalMemory::Span{it->first, it->second.bytes, it->second.host};
    return true;
  }
  // The texture / surface objects the executor reads through; a linear or pitched texture's memory
  // is looked up again at each use, so one whose allocation was freed reads nothing.
  bool FindTexture(uint64_t handle, ptx::ImageView* out) override { return View(textures_, handle, out); }
  bool FindSurface(uint64_t handle, ptx::ImageView* out) override { return View(surfaces_, handle, out); }
  bool View(const std::unordered_map<uint64_t, TexSpec>& objects, uint64_t handle, ptx::ImageView* out);
  // Row `r` of a MemcpyArray side, `width` bytes of it; nullptr if outside its memory.
  uint8_t* Row(const CopySide& c, uint64_t r, uint64_t width);
  static uint64_t FormatBytes(uint32_t format) { return ArrayFormatBytes(format); }

  // CUDA_ERROR_UNSUPPORTED_PTX_VERSION (with last_error_) when `text` declares a PTX ISA newer than
  // the driver version this backend reports JIT-compiles.
  CUresult CheckPtxVersion(std::string_view text);

  // Whether the executor can run `f` (decided once, at its first launch); when not, `f->refusal`
  // and `f->why` say what its launches fail with and why.
  bool Runnable(SimFunction* f);

  // The module's PTX program, parsed at its first launch; nullptr (with ptx_error) if none.
  ptx::Program* ProgramOf(SimModule* m);
  static void Release(Block& b);
  // Host memory behind device range [dptr, dptr+bytes), or nullptr.
  // A range may run on into the blocks that follow when their host memory is contiguous too
  // (the granules of one VMM mapping or of adjacent mappings in one reservation).
  uint8_t* Host(uint64_t dptr, uint64_t bytes) {
    auto it = blocks_.upper_bound(dptr);
    if (it == blocks_.begin()) return nullptr;
    --it;
    const uint64_t off = dptr - it->first;
    if (off > it->second.bytes || it->second.host == nullptr) return nullptr;
    uint8_t* const start = it->second.host + off;
    uint64_t have = it->second.bytes - off;
    while (have < bytes) {
      auto next = std::next(it);
      if (next == blocks_.end() || next->first != it->first + it->second.bytes ||
          next->second.host != it->second.host + it->second.bytes)
        return nullptr;
      it = next;
      have += it->second.bytes;
    }
    return start;
  }
  // Host address of [addr, addr+bytes) inside one reservation, or nullptr.
  uint8_t* ReservedHost(uint64_t addr, uint64_t bytes);

  // Device addresses, in 2 MiB granules as a GPU hands them out. Freed ranges are handed out again
  // (lowest first, as the CUDA driver tends to), so that client bugs that touch or forget an
  // address after its free show up on sim too.
  static uint64_t Granules(uint64_t bytes) { return (bytes + (2ull << 20) - 1) & ~((2ull << 20) - 1); }
  // `alignment`: 0, or a power of two (larger alignments leave the skipped granules free).
  // Window memory [host, host+bytes) at device address `want`, the client's own address for it
  // (unified addressing). Only above the addresses the sim hands out (TakeAddress steps over such
  // blocks), and only over other window blocks: one at the same host-to-device offset is merged in
  // (the same pages, mapped again), one at another offset is stale (the client maps only pinned
  // memory it holds, and its address was freed and reused) and is dropped once nothing in flight
  // can use it. False: the range collides with device memory; the caller picks an address.
  bool MapAtClientAddress(uint8_t* host, uint64_t bytes, uint64_t want);

  uint64_t TakeAddress(uint64_t bytes, uint64_t alignment = 0);
  // [addr, addr + Granules(bytes)) itself, when it is free: granule-aligned, in the sim's address
  // space, and neither handed out nor window memory. False (nothing taken) otherwise. For
  // cuMemAddressReserve's fixed address, and a migrated session's ranges (docs/design/migration.md).
  bool TakeAddressAt(uint64_t addr, uint64_t bytes);
  void GiveAddress(uint64_t addr, uint64_t bytes);

  SimOptions opt_;
  int log_fd_ = -1;
  std::vector<Placement> placements_;
  uint8_t* window_ = nullptr;
  uint64_t window_bytes_ = 0;
  std::map<uint64_t, Block> blocks_;
  std::unordered_map<void*, std::unique_ptr<SimArray>> arrays_;    // by handle (the SimArray's address)
  std::unordered_map<void*, std::unique_ptr<SimMipmap>> mipmaps_;  // by handle
  std::unordered_map<uint64_t, TexSpec> textures_, surfaces_;      // objects, by value
  uint64_t next_object_ = 1;                                       // texture and surface object values
  std::unordered_set<uint64_t> ipc_imports_;                       // blocks mapped from another session's ticket
  std::map<uint64_t, SimReservation> reservations_;                // by device address
  std::unordered_map<SimPhysical*, std::unique_ptr<SimPhysical>> physical_;  // cuMemCreate'd
  uint64_t next_addr_ = kSimBase;
  std::map<uint64_t, uint64_t> free_addrs_;  // address -> bytes (2 MiB granules), handed out again
  uintptr_t next_ctx_ = 1;
  uintptr_t next_stream_ = 0x5000;
  std::map<uint32_t, uint64_t> limits_;
  std::vector<std::unique_ptr<SimModule>> modules_;
  std::vector<std::unique_ptr<SimFunction>> functions_;
  std::unordered_map<SimEvent*, std::unique_ptr<SimEvent>> events_;
  std::string last_error_;
  ComputeGate* gate_ = nullptr;     // UseComputeGate: the compute share of the next launches
  CUresult sticky_ = CUDA_SUCCESS;  // a kernel fault: every later call fails with it
  std::vector<std::string> notices_;
  // Stream attributes set with cuStreamSetAttribute, by stream and CUstreamAttrID.
  std::map<void*, std::map<uint32_t, std::array<uint8_t, 64>>> stream_attrs_;
  std::unordered_set<std::string> warned_;       // kernels already reported as not executed
  bool told_not_executing_ = false;              // --sim-execute none was announced to the client
  std::string output_;                           // device printf text not yet taken
  std::map<void*, std::deque<Pending>> queues_;  // deferred launches per stream (never the default)
  std::map<void*, uint32_t> stream_flags_;       // CU_STREAM_NON_BLOCKING: not ordered with the default stream
  uint64_t seq_ = 0;                             // launch order across streams
  CUresult async_error_ = CUDA_SUCCESS;          // a deferred launch's non-sticky failure, not yet reported
  uint64_t executed_lane_instructions_ = 0;
};

}  // namespace orion::host::sim
