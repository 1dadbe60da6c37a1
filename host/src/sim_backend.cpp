// The sim backend: a GPU-less executor. Device memory is host RAM (lazily committed anonymous
// mappings) at device-like addresses; modules are parsed from their fatbinary/cubin/PTX so kernel
// parameter layouts are known; kernels run on the PTX executor (orion/ptx). A kernel the executor
// cannot run (no PTX a GPU would JIT, or PTX it does not implement) fails its launch, unless the
// daemon was started with --sim-unexecutable skip (API-level testing: results are not computed).
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

namespace orion::host {
namespace {

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

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

constexpr int kSimMaxAccessPolicyWindow = 134213632;                // bytes, as an H100 SXM reports
constexpr uint64_t kSimTensorMapTag = 0x314d544e4f49524full;        // "ORIONTM1": a tensor map the sim encoded
constexpr uint64_t kSimTensorMapIm2colTag = 0x324d544e4f49524full;  // "ORIONTM2": an im2col one

// Attributes of the simulated device: an sm_90-class GPU (values as an H100 SXM reports them).
void FillSimAttributes(int32_t* a, uint32_t pgpu) {
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

  Status Init(const std::vector<Placement>& placements) override {
    placements_ = placements;
    if (!opt_.launch_log.empty() && log_fd_ < 0) {
      return InvalidArgument("cannot open the sim launch log " + opt_.launch_log);
    }
    return Status::Ok();
  }

  void DescribeDevice(uint32_t dev, DeviceInfo* out) override {
    const Placement& p = placements_.at(dev);
    std::snprintf(out->name, sizeof out->name, "Orion Simulated GPU");
    const uint8_t uuid[16] = {'O', 'R', 'I', 'O', 'N', '-', 'S', 'I',
                              'M', 0,   0,   0,   0,   0,   0,   static_cast<uint8_t>(p.pgpu)};
    std::memcpy(out->uuid, uuid, 16);
    FillSimAttributes(out->attributes, p.pgpu);
    std::snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "0000:%02x:00.0", 0x10 + p.pgpu);
    out->pgpu = p.pgpu;
    out->vgpu = p.vgpu;
  }
  int DriverVersion() override { return opt_.driver_version; }
  std::string ErrorDetail() const override { return last_error_; }
  uint64_t ContextOverhead(uint32_t) override { return 0; }
  CUresult RegisterWindow(void* base, uint64_t bytes) override {
    window_ = static_cast<uint8_t*>(base);
    window_bytes_ = bytes;
    return CUDA_SUCCESS;
  }

  CUresult PrimaryCtxRetain(uint32_t dev, void** ctx) override {
    *ctx = reinterpret_cast<void*>(uintptr_t{0x1000} + dev);
    return CUDA_SUCCESS;
  }
  CUresult PrimaryCtxReset(uint32_t) override { return CUDA_SUCCESS; }
  CUresult CtxCreate(uint32_t dev, uint32_t, void** ctx) override {
    *ctx = reinterpret_cast<void*>(uintptr_t{0x2000} + (next_ctx_++ << 8) + dev);
    return CUDA_SUCCESS;
  }
  CUresult CtxDestroy(void*) override { return CUDA_SUCCESS; }
  CUresult SetCurrent(void*) override { return CUDA_SUCCESS; }
  CUresult CtxSynchronize() override { return Synced(FlushBlocking(true)); }
  CUresult CtxSetLimit(uint32_t limit, uint64_t value) override {
    if (limit > CU_LIMIT_MAX) return CUDA_ERROR_INVALID_VALUE;
    limits_[limit] = value;
    return CUDA_SUCCESS;
  }
  CUresult CtxGetLimit(uint32_t limit, uint64_t* value) override {
    if (limit > CU_LIMIT_MAX) return CUDA_ERROR_INVALID_VALUE;
    auto it = limits_.find(limit);
    static const uint64_t kDefaults[] = {1024, 1048576, 8388608, 2, 2048, 0, 128};
    *value = it != limits_.end() ? it->second : (limit < 7 ? kDefaults[limit] : 0);
    return CUDA_SUCCESS;
  }

  CUresult MemAlloc(uint64_t bytes, uint64_t* dptr) override {
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    const uint64_t span = (bytes + kSimAlign - 1) & ~(kSimAlign - 1);
    // MAP_NORESERVE: pages are committed when touched, as device memory would be by the app.
    void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = TakeAddress(span);
    blocks_[*dptr] = Block{span, static_cast<uint8_t*>(p), true};
    return CUDA_SUCCESS;
  }
  CUresult MemFree(uint64_t dptr) override {
    (void)FlushBlocking(true);  // cuMemFree synchronizes the device; a fault stays sticky
    auto it = blocks_.find(dptr);
    if (it == blocks_.end()) return CUDA_ERROR_INVALID_VALUE;
    GiveAddress(dptr, it->second.bytes);
    Release(it->second);
    blocks_.erase(it);
    ipc_imports_.erase(dptr);
    return CUDA_SUCCESS;
  }

  // CUDA IPC. Export: the allocation moves, in place and with its bytes, into its ticket's memfd
  // (mapped over the same host address), so an importing worker maps the very same pages.
  CUresult IpcExportMemory(uint64_t dptr, uint64_t, IpcHandle* out) override {
    auto it = blocks_.find(dptr);
    if (it == blocks_.end() || !it->second.owned || ipc_imports_.count(dptr) != 0) return CUDA_ERROR_INVALID_VALUE;
    Block& b = it->second;
    if (b.ipc_fd < 0) {
      (void)FlushBlocking(true);  // nothing in flight writes the bytes being moved
      auto fd = CreateIpcTicket(kIpcMemory, b.bytes, b.bytes, nullptr, &b.ipc);
      if (!fd.ok()) {
        last_error_ = fd.status().message();
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
      void* tmp = ::mmap(nullptr, b.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, kIpcDataOffset);
      if (tmp == MAP_FAILED) {
        ::close(*fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
      std::memcpy(tmp, b.host, b.bytes);
      ::munmap(tmp, b.bytes);
      void* at = ::mmap(b.host, b.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, *fd, kIpcDataOffset);
      if (at == MAP_FAILED) {  // cannot happen once the first mapping worked; the old bytes are gone then
        ::close(*fd);
        return CUDA_ERROR_UNKNOWN;
      }
      b.ipc_fd = *fd;
    }
    *out = b.ipc;
    return CUDA_SUCCESS;
  }
  CUresult IpcImportMemory(const IpcHandle& h, uint64_t* dptr, uint64_t* bytes) override {
    auto fd = OpenIpcTicket(h, kIpcMemory, nullptr);
    if (!fd.ok()) {
      last_error_ = fd.status().message();
      return CUDA_ERROR_INVALID_VALUE;
    }
    void* p = ::mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, kIpcDataOffset);
    if (p == MAP_FAILED) {
      ::close(*fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = TakeAddress(h.bytes);
    *bytes = h.bytes;
    blocks_[*dptr] = Block{h.bytes, static_cast<uint8_t*>(p), true, *fd};  // kept: the import's share
    ipc_imports_.insert(*dptr);
    return CUDA_SUCCESS;
  }
  CUresult IpcCloseMemory(uint64_t dptr) override {
    if (ipc_imports_.count(dptr) == 0) return CUDA_ERROR_INVALID_VALUE;
    return MemFree(dptr);
  }
  int IpcTicketFd(uint64_t dptr) const override {
    auto it = blocks_.find(dptr);
    return it != blocks_.end() ? it->second.ipc_fd : -1;
  }
  // Events: the sim completes work when its stream is flushed, so an interprocess event's record
  // flushes its stream first (see EventRecord): a record is complete once oriond has taken it, and
  // an imported event has nothing left to wait for.
  CUresult IpcExportEvent(void* event, IpcHandle* out) override {
    auto* e = static_cast<SimEvent*>(event);
    if ((e->flags & CU_EVENT_INTERPROCESS) == 0) return CUDA_ERROR_INVALID_VALUE;
    if (e->ipc_fd < 0) {
      auto fd = CreateIpcTicket(kIpcEvent, 0, 0, nullptr, &e->ipc);
      if (!fd.ok()) {
        last_error_ = fd.status().message();
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
      e->ipc_fd = *fd;
    }
    *out = e->ipc;
    return CUDA_SUCCESS;
  }
  CUresult IpcImportEvent(const IpcHandle& h, void** event) override {
    auto fd = OpenIpcTicket(h, kIpcEvent, nullptr);
    if (!fd.ok()) {
      last_error_ = fd.status().message();
      return CUDA_ERROR_INVALID_VALUE;
    }
    ::close(*fd);
    auto e = std::make_unique<SimEvent>();
    e->flags = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
    e->recorded = true;
    *event = e.get();
    events_.emplace(e.get(), std::move(e));
    return CUDA_SUCCESS;
  }
  CUresult MemGetInfo(uint64_t* free, uint64_t* total) override {
    *free = *total = 0;
    for (const Placement& p : placements_) *total = std::max(*total, p.quota_bytes);
    *free = *total;
    return CUDA_SUCCESS;
  }
  CUresult MemcpyHtoD(uint64_t dst, const void* src, uint64_t bytes, void* stream) override {
    if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    uint8_t* d = Host(dst, bytes);
    if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(d, src, bytes);
    return CUDA_SUCCESS;
  }
  CUresult MemcpyDtoH(void* dst, uint64_t src, uint64_t bytes, void* stream, bool) override {
    if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    uint8_t* s = Host(src, bytes);
    if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(dst, s, bytes);
    return CUDA_SUCCESS;
  }
  CUresult MemcpyDtoD(uint64_t dst, uint64_t src, uint64_t bytes, void* stream) override {
    if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    uint8_t* d = Host(dst, bytes);
    uint8_t* s = Host(src, bytes);
    if (d == nullptr || s == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::memmove(d, s, bytes);
    return CUDA_SUCCESS;
  }
  CUresult Memcpy2D(uint64_t dst, void* dst_host, uint64_t dst_pitch, uint64_t src, const void* src_host,
                    uint64_t src_pitch, uint64_t width, uint64_t height, void* stream) override {
    if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
    for (uint64_t r = 0; r < height; ++r) {
      uint8_t* d =
          dst_host != nullptr ? static_cast<uint8_t*>(dst_host) + r * dst_pitch : Host(dst + r * dst_pitch, width);
      const uint8_t* s = src_host != nullptr ? static_cast<const uint8_t*>(src_host) + r * src_pitch
                                             : Host(src + r * src_pitch, width);
      if (d == nullptr || s == nullptr) return CUDA_ERROR_INVALID_VALUE;
      std::memmove(d, s, width);
    }
    return CUDA_SUCCESS;
  }
  CUresult ArrayCreate(const ArraySpec& spec, void** array) override {
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    auto a = std::make_unique<SimArray>();
    a->spec = spec;
    a->texel = FormatBytes(spec.format) * spec.channels;
    a->row_bytes = spec.width * a->texel;
    a->rows = std::max<uint64_t>(spec.height, 1);
    a->slices = std::max<uint64_t>(spec.depth, 1);
    try {
      a->data.assign(a->row_bytes * a->rows * a->slices, 0);
    } catch (const std::bad_alloc&) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *array = a.get();
    arrays_.emplace(a.get(), std::move(a));
    return CUDA_SUCCESS;
  }
  CUresult ArrayDestroy(void* array) override {
    (void)FlushBlocking(true);  // like cuMemFree: nothing in flight may still read it
    return arrays_.erase(array) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  }
  CUresult MemcpyArray(const CopySide& dst, const CopySide& src, uint64_t width, uint64_t height,
                       void* stream) override {
    if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    for (uint64_t r = 0; r < height; ++r) {
      uint8_t* d = Row(dst, r, width);
      const uint8_t* s = Row(src, r, width);
      if (d == nullptr || s == nullptr) return CUDA_ERROR_INVALID_VALUE;
      std::memmove(d, s, width);
    }
    return CUDA_SUCCESS;
  }
  CUresult MipmappedArrayCreate(const ArraySpec& spec, uint32_t levels, void** mipmap) override {
    auto m = std::make_unique<SimMipmap>();
    for (uint32_t l = 0; l < levels; ++l) {
      ArraySpec ls = spec;
      ls.width = std::max<uint64_t>(spec.width >> l, 1);
      if (spec.height != 0) ls.height = std::max<uint64_t>(spec.height >> l, 1);
      if (spec.depth != 0) ls.depth = std::max<uint64_t>(spec.depth >> l, 1);
      void* a = nullptr;
      if (CUresult r = ArrayCreate(ls, &a); r != CUDA_SUCCESS) {
        for (void* made : m->levels) arrays_.erase(made);
        return r;
      }
      m->levels.push_back(a);
    }
    *mipmap = m.get();
    mipmaps_.emplace(m.get(), std::move(m));
    return CUDA_SUCCESS;
  }
  CUresult MipmappedArrayGetLevel(void* mipmap, uint32_t level, void** array) override {
    auto it = mipmaps_.find(mipmap);
    if (it == mipmaps_.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (level >= it->second->levels.size()) return CUDA_ERROR_INVALID_VALUE;
    *array = it->second->levels[level];
    return CUDA_SUCCESS;
  }
  CUresult MipmappedArrayDestroy(void* mipmap) override {
    (void)FlushBlocking(true);
    auto it = mipmaps_.find(mipmap);
    if (it == mipmaps_.end()) return CUDA_ERROR_INVALID_HANDLE;
    for (void* a : it->second->levels) arrays_.erase(a);
    mipmaps_.erase(it);
    return CUDA_SUCCESS;
  }
  CUresult TexObjectCreate(const TexSpec& spec, uint64_t* object) override {
    if (spec.res_type == CU_RESOURCE_TYPE_ARRAY && arrays_.count(spec.array) == 0) return CUDA_ERROR_INVALID_HANDLE;
    if (spec.res_type == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY && mipmaps_.count(spec.mipmap) == 0)
      return CUDA_ERROR_INVALID_HANDLE;
    const uint64_t id = next_object_++;
    (spec.surface ? surfaces_ : textures_)[id] = spec;
    *object = id;
    return CUDA_SUCCESS;
  }
  CUresult TexObjectDestroy(uint64_t object, bool surface) override {
    (void)FlushBlocking(true);  // launches in flight may still read through it
    return (surface ? surfaces_ : textures_).erase(object) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  CUresult Memset(uint64_t dst, uint32_t value, uint32_t elem, uint64_t width, uint64_t height, uint64_t pitch,
                  void* stream) override {
    if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
    for (uint64_t r = 0; r < height; ++r) {
      uint8_t* d = Host(dst + r * pitch, width * elem);
      if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
      if (elem == 1) {
        std::memset(d, static_cast<int>(value & 0xFF), width);
      } else {
        for (uint64_t i = 0; i < width; ++i) std::memcpy(d + i * elem, &value, elem);  // LE: low bytes
      }
    }
    return CUDA_SUCCESS;
  }
  CUresult MemAddressReserve(uint64_t bytes, uint64_t alignment, uint64_t, uint64_t* addr) override {
    // The fixed address is a hint (CUDA: "fixed starting address range requested"); addresses
    // here come from the same 2 MiB-granular space as cuMemAlloc's.
    void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *addr = TakeAddress(bytes, alignment);
    reservations_[*addr] = SimReservation{bytes, static_cast<uint8_t*>(p)};
    return CUDA_SUCCESS;
  }
  CUresult MemAddressFree(uint64_t addr, uint64_t bytes) override {
    auto it = reservations_.find(addr);
    if (it == reservations_.end() || it->second.bytes != bytes) return CUDA_ERROR_INVALID_VALUE;
    ::munmap(it->second.host, it->second.bytes);
    GiveAddress(addr, bytes);
    reservations_.erase(it);
    return CUDA_SUCCESS;
  }
  CUresult MemCreate(uint32_t, uint64_t bytes, void** handle) override {
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    auto phys = std::make_unique<SimPhysical>(SimPhysical{bytes, static_cast<uint8_t*>(p)});
    *handle = phys.get();
    physical_.emplace(phys.get(), std::move(phys));
    return CUDA_SUCCESS;
  }
  CUresult MemRelease(void* handle) override {
    auto it = physical_.find(static_cast<SimPhysical*>(handle));
    if (it == physical_.end()) return CUDA_ERROR_INVALID_HANDLE;
    ::munmap(it->second->home, it->second->bytes);  // mappings keep their pages until unmapped
    physical_.erase(it);
    return CUDA_SUCCESS;
  }
  CUresult MemMap(uint64_t addr, uint64_t bytes, uint64_t offset, void* handle) override {
    auto ph = physical_.find(static_cast<SimPhysical*>(handle));
    uint8_t* at = ReservedHost(addr, bytes);
    if (ph == physical_.end() || at == nullptr || offset > ph->second->bytes || bytes > ph->second->bytes - offset)
      return CUDA_ERROR_INVALID_VALUE;
    void* m = ::mremap(ph->second->home + offset, 0, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, at);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
  }
  CUresult MemUnmap(uint64_t addr, uint64_t bytes) override {
    (void)FlushBlocking(true);  // like cuMemFree: nothing in flight may still use the range
    uint8_t* at = ReservedHost(addr, bytes);
    if (at == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (auto it = blocks_.lower_bound(addr); it != blocks_.end() && it->first < addr + bytes;) it = blocks_.erase(it);
    // Back to an inaccessible hole of the reservation; the pages go when no mapping holds them.
    void* m = ::mmap(at, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return m == MAP_FAILED ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS;
  }
  CUresult MemSetAccess(uint64_t addr, uint64_t bytes, uint32_t, uint32_t flags) override {
    uint8_t* at = ReservedHost(addr, bytes);
    if (at == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (auto it = blocks_.lower_bound(addr); it != blocks_.end() && it->first < addr + bytes;) it = blocks_.erase(it);
    // Readable (or read-write) ranges become device memory for copies and kernels, one block per
    // granule so that a later partial unmap or revoke splits nothing.
    if (flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
      for (uint64_t off = 0; off < bytes; off += kVmmGranularity) {
        blocks_[addr + off] = Block{std::min(kVmmGranularity, bytes - off), at + off, false};
      }
    }
    return CUDA_SUCCESS;
  }

  bool SameAddressMapping() const override { return true; }
  CUresult HostGetDevicePointer(void* host, uint64_t bytes, uint64_t want, uint64_t* dptr) override {
    if (want != 0 && MapAtClientAddress(static_cast<uint8_t*>(host), bytes, want)) {
      *dptr = want;
      return CUDA_SUCCESS;
    }
    for (auto& [addr, b] : blocks_) {
      if (!b.owned && b.host == host) {
        *dptr = addr;
        return CUDA_SUCCESS;
      }
    }
    *dptr = TakeAddress(bytes);
    blocks_[*dptr] = Block{bytes, static_cast<uint8_t*>(host), false};
    return CUDA_SUCCESS;
  }

  CUresult ModuleLoad(std::span<const uint8_t> image, void** module) override {
    auto parsed = fatbin::ParseImage(image, 90);
    if (!parsed.ok()) {
      last_error_ = parsed.status().message();
      return CUDA_ERROR_INVALID_IMAGE;
    }
    // The arch of the PTX a GPU would JIT (0: the image is PTX text), from the entry headers alone.
    const auto arch = fatbin::PtxArch(image, 90);
    // PTX text newer than this driver's PTX ISA is refused at load, as the driver's JIT refuses it.
    if (parsed->from_ptx && arch.ok() && *arch == 0) {
      const std::string_view text(reinterpret_cast<const char*>(image.data()), image.size());
      if (CUresult r = CheckPtxVersion(text); r != CUDA_SUCCESS) return r;
    }
    auto m = std::make_unique<SimModule>();
    m->info = std::move(*parsed);
    // Keep the image for the executor only if it has PTX a GPU would run, by the driver's rule: a
    // GPU runs the module's SASS for its own arch when there is one (only sm_90 cubins run on this
    // sm_90 device) and JIT-compiles the PTX otherwise. PTX of another arch can differ from that
    // SASS (libraries tune block sizes per arch). Most library modules are SASS only: no copy.
    if (opt_.execute) {
      if (!arch.ok()) {
        m->ptx_tried = true;
        m->ptx_error = arch.status().message();
      } else if (m->info.sm_arch == 90 && *arch != 0 && *arch != 90) {
        m->ptx_tried = true;
        m->refusal_kind = LaunchRefusal::kPtxOtherArch;
        m->ptx_error = "a GPU would run the module's sm_90 SASS, and its PTX is for compute_" + std::to_string(*arch) +
                       " (SASS only for this device)";
      } else if (*arch > 90) {
        m->ptx_tried = true;
        m->refusal_kind = LaunchRefusal::kPtxOtherArch;
        m->ptx_error = "its only PTX is for compute_" + std::to_string(*arch) +
                       ", newer than this sm_90 device (a GPU finds no image it can run either)";
      } else {
        m->image.assign(image.begin(), image.end());
      }
    }
    *module = m.get();
    modules_.push_back(std::move(m));
    return CUDA_SUCCESS;
  }
  CUresult ModuleUnload(void* module) override {
    (void)FlushBlocking(true);
    auto it = std::find_if(modules_.begin(), modules_.end(), [&](auto& m) { return m.get() == module; });
    if (it == modules_.end()) return CUDA_ERROR_INVALID_HANDLE;
    for (auto& [name, addr] : (*it)->globals) (void)MemFree(addr);
    modules_.erase(it);
    return CUDA_SUCCESS;
  }
  CUresult ModuleGetFunction(void* module, const char* name, void** function, KernelLayout* layout) override {
    auto* m = static_cast<SimModule*>(module);
    const fatbin::Kernel* k = m->info.FindKernel(name);
    if (k == nullptr) return CUDA_ERROR_NOT_FOUND;
    auto f = std::make_unique<SimFunction>(SimFunction{m, k, {}, -1, CUDA_SUCCESS, {}, {}});
    layout->params.clear();
    for (const auto& p : k->params) layout->params.push_back({p.offset, p.size});
    layout->param_bytes = k->param_bytes;
    // Known from the module alone (no image the executor can use): the client refuses the launches
    // itself, synchronously. Refusals found at the first launch (a kernel the executor cannot
    // lower) come back from LaunchKernel.
    if (opt_.execute && !opt_.skip_unexecutable && m->ptx_tried && m->program == nullptr) {
      layout->launch_error = m->ptx_refusal;
      layout->launch_refusal = m->refusal_kind;
    }
    *function = f.get();
    functions_.push_back(std::move(f));
    return CUDA_SUCCESS;
  }
  CUresult ModuleFunctionNames(void* module, std::vector<std::string>* names) override {
    names->clear();
    for (const fatbin::Kernel& k : static_cast<SimModule*>(module)->info.kernels) names->push_back(k.name);
    return CUDA_SUCCESS;
  }
  CUresult ModuleGetGlobal(void* module, const char* name, uint64_t* dptr, uint64_t* bytes) override {
    auto* m = static_cast<SimModule*>(module);
    const fatbin::Global* g = m->info.FindGlobal(name);
    if (g == nullptr) return CUDA_ERROR_NOT_FOUND;
    auto it = m->globals.find(name);
    if (it == m->globals.end()) {
      uint64_t addr = 0;
      if (CUresult r = MemAlloc(std::max<uint64_t>(g->size, 1), &addr); r != CUDA_SUCCESS) return r;
      if (!g->init.empty()) std::memcpy(Host(addr, g->init.size()), g->init.data(), g->init.size());
      it = m->globals.emplace(name, addr).first;
    }
    *dptr = it->second;
    *bytes = g->size;
    return CUDA_SUCCESS;
  }
  CUresult FuncGetAttribute(void* function, int attribute, int* value) override {
    auto* f = static_cast<SimFunction*>(function);
    if (auto it = f->attributes.find(attribute); it != f->attributes.end()) {
      *value = it->second;
      return CUDA_SUCCESS;
    }
    switch (attribute) {
      case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
      case CU_FUNC_ATTRIBUTE_PTX_VERSION:
      case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
        *value = f->module->info.sm_arch != 0 ? static_cast<int>(f->module->info.sm_arch) : 90;
        break;
      case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = 49152; break;
      case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 32; break;  // not read from the cubin: a plausible value
      default:
        if (attribute < 0 || attribute >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
        *value = 0;
    }
    return CUDA_SUCCESS;
  }
  CUresult FuncSetAttribute(void* function, int attribute, int value) override {
    if (attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES &&
        (value < 0 || static_cast<uint64_t>(value) > kSimMaxSharedPerBlock))
      return CUDA_ERROR_INVALID_VALUE;
    if (attribute < 0 || attribute >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    static_cast<SimFunction*>(function)->attributes[attribute] = value;
    return CUDA_SUCCESS;
  }

  // Largest cluster this function may use: 8 (portable), 16 with the non-portable attribute.
  static uint64_t MaxCluster(const SimFunction* f) {
    auto it = f->attributes.find(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED);
    return it != f->attributes.end() && it->second != 0 ? kSimMaxClusterSize : kSimPortableClusterSize;
  }
  void UseComputeGate(ComputeGate* gate) override { gate_ = gate; }
  // The executor runs up to `workers` blocks at once, each with its threads' local memory and its
  // shared memory: what a launch holds on oriond's host while it runs.
  uint64_t LaunchScratchBytes(void* function, const LaunchSpec& l) override {
    auto* f = static_cast<SimFunction*>(function);
    if (!opt_.execute || f == nullptr || !Runnable(f)) return 0;
    const uint64_t workers = opt_.workers != 0 ? opt_.workers : std::max(1u, std::thread::hardware_concurrency());
    return workers * (f->resources.local_per_thread * l.threads() + f->resources.shared_static + l.shared_mem);
  }
  bool GatesCompute() const override { return true; }
  // The session checked the grid, block and dynamic shared memory against the attribute table
  // (LaunchSpec); what depends on the function is checked here.
  CUresult LaunchKernel(void* function, const LaunchSpec& l) override {
    auto* f = static_cast<SimFunction*>(function);
    if (l.cluster_size() == 0 || l.cluster_size() > MaxCluster(f)) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    for (int d = 0; d < 3; ++d) {
      if (l.grid[d] % l.cluster[d] != 0) return CUDA_ERROR_INVALID_CLUSTER_SIZE;  // the grid is whole clusters
    }
    if (l.params.size() != f->kernel->param_bytes) return CUDA_ERROR_INVALID_VALUE;
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    if (!opt_.execute && !told_not_executing_) {
      told_not_executing_ = true;
      notices_.push_back(
          "this oriond runs with --sim-execute none: kernels are validated and logged, NEVER executed; "
          "no result a kernel should write is computed");
    }
    if (l.cooperative()) {
      // Every block must be resident at once: the occupancy model's blocks per SM times the SMs.
      int per_sm = 0;
      (void)OccupancyMaxBlocks(function, static_cast<uint32_t>(l.threads()), l.shared_mem, 0, &per_sm);
      if (l.blocks() > static_cast<uint64_t>(per_sm) * kSimSms) return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    // Launches on a stream other than the legacy default stream are deferred until something
    // orders them (see Flush): stream order is all CUDA promises, so a program that forgot a
    // cuStreamWaitEvent reads stale data here too, every time, instead of by luck on a GPU.
    Pending p;
    p.seq = ++seq_;
    p.f = f;
    p.launch = l;
    p.stream = l.stream;
    p.gate = gate_;
    // A kernel the executor cannot run fails here, synchronously, and nothing is queued for it
    // (unless --sim-unexecutable skip: then it is queued and skipped, and the client is told).
    if (opt_.execute && !opt_.skip_unexecutable && !Runnable(f)) {
      if (warned_.insert(f->kernel->name).second)
        notices_.push_back("kernel " + f->kernel->name + " cannot run on the sim backend: " + f->why +
                           "; its launches fail with " +
                           (LaunchErrorName(f->refusal) != nullptr ? LaunchErrorName(f->refusal)
                                                                   : std::to_string(static_cast<int>(f->refusal))));
      LogLaunch(p, "refused:" + std::to_string(static_cast<int>(f->refusal)));
      last_error_ = "kernel " + f->kernel->name + ": " + f->why;
      return f->refusal;
    }
    if (opt_.execute && f->runnable == 1 && f->resources.shared_static + l.shared_mem > kSimMaxSharedPerBlock) {
      last_error_ = "kernel " + f->kernel->name + ": " + std::to_string(f->resources.shared_static) +
                    " bytes of static and " + std::to_string(l.shared_mem) +
                    " of dynamic shared memory exceed a block's " + std::to_string(kSimMaxSharedPerBlock);
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (l.stream != nullptr && opt_.execute) {
      p.owned.assign(l.params.begin(), l.params.end());  // the frame's bytes are gone after this call
      p.launch.params = p.owned;                         // (a moved vector keeps its buffer)
      LogLaunch(p, "deferred");
      queues_[l.stream].push_back(std::move(p));
      return CUDA_SUCCESS;
    }
    if (CUresult r = FlushBlocking(); r != CUDA_SUCCESS) return r;
    std::string exec;
    const CUresult result = Execute(p, &exec);
    LogLaunch(p, exec);
    return result;
  }

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
  CUresult Execute(const Pending& p, std::string* exec_out) {
    SimFunction* f = p.f;
    if (sticky_ != CUDA_SUCCESS) {
      *exec_out = "error:" + std::to_string(static_cast<int>(sticky_));
      return sticky_;
    }
    std::string exec = "off";
    CUresult result = CUDA_SUCCESS;
    if (opt_.execute) {
      if (!Runnable(f)) {  // --sim-unexecutable skip (otherwise refused at LaunchKernel)
        exec = "skipped";
        if (warned_.insert(f->kernel->name).second)
          notices_.push_back("kernel " + f->kernel->name + " was NOT executed (--sim-unexecutable skip): " + f->why +
                             "; what it should have written is not computed");
      } else {
        ptx::Program* prog = f->module->program.get();
        ptx::LaunchConfig cfg;
        std::memcpy(cfg.grid, p.launch.grid, sizeof cfg.grid);
        std::memcpy(cfg.block, p.launch.block, sizeof cfg.block);
        cfg.dynamic_smem = p.launch.shared_mem;
        cfg.params = p.launch.params.data();
        cfg.param_bytes = static_cast<uint32_t>(p.launch.params.size());
        cfg.var_addrs = f->module->var_addrs.data();
        cfg.timeout_ms = opt_.kernel_timeout_ms;
        cfg.workers = opt_.workers != 0 ? opt_.workers : std::max(1u, std::thread::hardware_concurrency());
        cfg.printf_out = &output_;
        uint64_t workspace = 0;
        if (p.launch.cooperative()) {
          if (CUresult w = MemAlloc(64, &workspace); w != CUDA_SUCCESS) return w;
          std::memset(Host(workspace, 64), 0, 64);
          cfg.cooperative = true;
          cfg.grid_workspace = workspace;
        }
        // The kernel runs when its vGPU's compute share lets it, and holds the device meanwhile.
        if (p.gate != nullptr) p.gate->Enter();
        const ptx::LaunchResult r = ptx::Launch(*prog, f->kernel->name, cfg, *this);
        if (p.gate != nullptr) p.gate->Leave();
        if (workspace != 0) (void)MemFree(workspace);
        executed_lane_instructions_ += r.thread_instructions;
        if (r.code == CUDA_SUCCESS) {
          exec = "ran";
        } else {
          exec = "error:" + std::to_string(static_cast<int>(r.code));
          last_error_ = r.message;
          notices_.push_back("kernel " + f->kernel->name + " failed (" + std::to_string(static_cast<int>(r.code)) +
                             "): " + r.message);
          result = r.code;
          // As on a GPU, a fault in a kernel leaves the context unusable; a kernel the executor
          // cannot run fails alone.
          if (r.code != CUDA_ERROR_NOT_SUPPORTED && r.code != CUDA_ERROR_INVALID_VALUE) sticky_ = r.code;
        }
      }
    }
    *exec_out = exec;
    return result;
  }

  // The launch log (--sim-launch-log): one JSON object per line (JSON Lines), written with one
  // write() so lines from concurrent sessions never interleave (O_APPEND). A launch:
  //   {"sess":7,"event":"launch","kernel":"_Z3addPiii","grid":[1,1,1],"block":[32,1,1],"smem":0,
  //    "stream":0,"cooperative":false,"cluster":[1,1,1],"params":"<hex>","exec":"ran"}
  // where exec is ran, off (--sim-execute none), skipped (--sim-unexecutable skip), deferred (queued
  // on a stream: its outcome comes later in a "ran" line), refused:<CUresult> or error:<CUresult>.
  // A deferred launch's outcome, when its stream runs it:
  //   {"sess":7,"event":"ran","kernel":"_Z3addPiii","stream":94...,"exec":"ran"}
  void WriteLogLine(const nlohmann::json& j) {
    const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    ssize_t w = ::write(log_fd_, line.data(), line.size());
    (void)w;
  }
  void LogLaunch(const Pending& p, const std::string& exec) {
    if (log_fd_ < 0) return;
    const LaunchSpec& l = p.launch;
    static const char* kHex = "0123456789abcdef";
    std::string params;
    params.reserve(2 * l.params.size());
    for (const uint8_t b : l.params) {
      params += kHex[b >> 4];
      params += kHex[b & 15];
    }
    WriteLogLine({{"sess", opt_.session_id},
                  {"event", "launch"},
                  {"kernel", p.f->kernel->name},
                  {"grid", l.grid},
                  {"block", l.block},
                  {"smem", l.shared_mem},
                  {"stream", reinterpret_cast<uintptr_t>(l.stream)},
                  {"cooperative", l.cooperative()},
                  {"cluster", l.cluster},
                  {"params", params},
                  {"exec", exec}});
  }

  // Executes the deferred launches of `stream` in order and returns the sticky error, if any. A
  // launch that fails without poisoning the context (an instruction the executor lacks) is kept in
  // async_error_ and reported by the next synchronizing call, as CUDA reports asynchronous errors.
  CUresult Flush(void* stream) {
    auto it = queues_.find(stream);
    if (it == queues_.end() || it->second.empty()) return sticky_;
    std::deque<Pending> q = std::move(it->second);
    queues_.erase(it);
    for (Pending& p : q) RunItem(p);
    return sticky_;
  }
  // Runs one queued item: a launch, an event record (the event completes), or a wait (the
  // awaited stream runs up to the awaited record first).
  void RunItem(Pending& p) {
    switch (p.kind) {
      case Pending::kRecord:
        if (p.event->pending_seq == p.seq) p.event->pending_seq = 0;
        p.event->recorded = true;
        p.event->ns = NowNs();
        return;
      case Pending::kWait: (void)FlushUntil(p.wait_stream, p.wait_seq); return;
      case Pending::kLaunch: {
        std::string exec;
        const CUresult r = Execute(p, &exec);
        LogOutcome(p, exec);
        if (r != CUDA_SUCCESS && async_error_ == CUDA_SUCCESS) async_error_ = r;
        return;
      }
    }
  }
  // Runs `stream`'s queue up to and including the item numbered `seq`.
  CUresult FlushUntil(void* stream, uint64_t seq) {
    for (;;) {
      auto it = queues_.find(stream);
      if (it == queues_.end() || it->second.empty() || it->second.front().seq > seq) break;
      Pending p = std::move(it->second.front());
      it->second.pop_front();
      RunItem(p);
    }
    return sticky_;
  }
  // Everything the legacy default stream waits for: every queue except non-blocking streams',
  // in launch order (`all`: the non-blocking ones too, for device-wide synchronization).
  CUresult FlushBlocking(bool all = false) {
    for (;;) {
      // The queue holding the oldest pending launch goes first: launch order is kept across streams.
      void* next = nullptr;
      uint64_t oldest = UINT64_MAX;
      for (auto& [s, q] : queues_) {
        if (q.empty() || (!all && (stream_flags_[s] & CU_STREAM_NON_BLOCKING) != 0)) continue;
        if (q.front().seq < oldest) oldest = q.front().seq, next = s;
      }
      if (next == nullptr) break;
      std::deque<Pending>& q = queues_[next];
      Pending p = std::move(q.front());
      q.pop_front();
      RunItem(p);
    }
    return sticky_;
  }
  CUresult FlushFor(void* stream) { return stream != nullptr ? Flush(stream) : FlushBlocking(); }
  // For synchronizing calls: the sticky error, else the first asynchronous one not yet reported.
  CUresult Synced(CUresult sticky) {
    if (sticky != CUDA_SUCCESS) return sticky;
    return std::exchange(async_error_, CUDA_SUCCESS);
  }
  void LogOutcome(const Pending& p, const std::string& exec) {
    if (log_fd_ < 0) return;
    WriteLogLine({{"sess", opt_.session_id},
                  {"event", "ran"},
                  {"kernel", p.f->kernel->name},
                  {"stream", reinterpret_cast<uintptr_t>(p.stream)},
                  {"exec", exec}});
  }

  std::vector<std::string> TakeNotices() override { return std::exchange(notices_, {}); }
  std::string TakeOutput() override { return std::exchange(output_, {}); }

  CUresult OccupancyMaxBlocks(void*, uint32_t block_size, uint64_t dynamic_smem, uint32_t, int* blocks) override {
    // Simulated occupancy from the sm_90 limits: threads, blocks and shared memory per SM.
    const uint32_t warps = (block_size + 31) / 32;
    uint64_t by_threads = 2048 / (uint64_t{warps} * 32);
    uint64_t by_smem = dynamic_smem == 0 ? 32 : kSimSharedPerSm / (dynamic_smem + kSimReservedSharedPerBlock);
    *blocks = static_cast<int>(std::min<uint64_t>({32, by_threads, by_smem}));
    return CUDA_SUCCESS;
  }

  CUresult OccupancyMaxClusters(void* function, const uint32_t[3], const uint32_t block[3], uint32_t shared_mem,
                                const uint32_t cluster[3], int* clusters) override {
    auto* f = static_cast<SimFunction*>(function);
    const uint64_t csize = uint64_t{cluster[0]} * cluster[1] * cluster[2];
    if (csize == 0 || csize > MaxCluster(f)) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    int per_sm = 0;
    if (CUresult r = OccupancyMaxBlocks(function, block[0] * block[1] * block[2], shared_mem, 0, &per_sm);
        r != CUDA_SUCCESS)
      return r;
    // A cluster's blocks all live in one GPC.
    uint64_t n = 0;
    for (int sms : kSimGpcSms) n += static_cast<uint64_t>(sms) * static_cast<uint64_t>(per_sm) / csize;
    *clusters = static_cast<int>(n);
    return CUDA_SUCCESS;
  }

  CUresult OccupancyAvailableSmem(void* function, int num_blocks, int block_size, uint64_t* bytes) override {
    int static_smem = 0;
    (void)FuncGetAttribute(function, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &static_smem);
    if (block_size > 1024) return CUDA_ERROR_INVALID_VALUE;
    const int64_t avail = std::min<int64_t>(static_cast<int64_t>(kSimSharedPerSm) / num_blocks -
                                                static_cast<int64_t>(kSimReservedSharedPerBlock),
                                            static_cast<int64_t>(kSimMaxSharedPerBlock)) -
                          static_smem;
    *bytes = avail > 0 ? static_cast<uint64_t>(avail) : 0;
    return CUDA_SUCCESS;
  }

  CUresult StreamCreate(uint32_t flags, int, void** stream) override {
    *stream = reinterpret_cast<void*>(next_stream_++);
    stream_flags_[*stream] = flags;
    return CUDA_SUCCESS;
  }
  CUresult StreamDestroy(void* stream) override {
    // Work queued on a destroyed stream still completes (CUDA: cuStreamDestroy does not wait, the
    // work is not lost).
    const CUresult r = Flush(stream);
    stream_flags_.erase(stream);
    stream_attrs_.erase(stream);
    return r;
  }
  // A tensor map in Orion's own layout (the executor runs no TMA, so nothing reads it but a
  // program's own cuTensorMap* calls): a tag word, then the parameters as given.
  CUresult TensorMapEncodeTiled(const TensorMapEncodeReq& q, uint64_t out[16]) override {
    std::memset(out, 0, 16 * sizeof(uint64_t));
    out[0] = kSimTensorMapTag;
    out[1] = q.global_address;
    out[2] = uint64_t{q.data_type} | uint64_t{q.rank} << 8 | uint64_t{q.interleave} << 16 | uint64_t{q.swizzle} << 24 |
             uint64_t{q.l2_promotion} << 32 | uint64_t{q.oob_fill} << 40;
    for (uint32_t i = 0; i < 5; ++i) out[3 + i] = q.global_dim[i];
    for (uint32_t i = 0; i < 4; ++i) out[8 + i] = q.global_strides[i];
    for (uint32_t i = 0; i < 5; ++i) {
      out[12 + i / 2] |= uint64_t{q.box_dim[i] & 0x1ff} << (32 * (i % 2));
      out[15] |= uint64_t{q.element_strides[i] & 0xf} << (4 * i);
    }
    return CUDA_SUCCESS;
  }
  // An im2col map in Orion's own layout: a second tag, the tiled fields (no box), the corners and
  // the channels and pixels per column.
  CUresult TensorMapEncodeIm2col(const TensorMapIm2colReq& q, uint64_t out[16]) override {
    (void)TensorMapEncodeTiled(q.base, out);
    out[0] = kSimTensorMapIm2colTag;
    out[12] = out[13] = 0;
    for (uint32_t i = 0; i < 3; ++i) {
      out[12] |= uint64_t{static_cast<uint16_t>(q.lower_corner[i])} << (16 * i);
      out[13] |= uint64_t{static_cast<uint16_t>(q.upper_corner[i])} << (16 * i);
    }
    out[14] = uint64_t{q.channels_per_pixel} | uint64_t{q.pixels_per_column} << 32;
    return CUDA_SUCCESS;
  }
  // The address is word 1 of either layout; a map the sim did not encode is refused, as the
  // driver refuses a map it cannot read.
  CUresult TensorMapReplaceAddress(const uint64_t map[16], uint64_t address, uint64_t out[16]) override {
    if (map[0] != kSimTensorMapTag && map[0] != kSimTensorMapIm2colTag) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(out, map, 16 * sizeof(uint64_t));
    out[1] = address;
    return CUDA_SUCCESS;
  }
  // Stream attributes are kept and returned; the sim has no L2 for an access policy window to
  // shape, and its streams' work runs in the order Flush gives whatever the sync policy.
  CUresult StreamAttribute(void* stream, uint32_t attr, bool set, uint8_t value[64]) override {
    auto& attrs = stream_attrs_[stream];
    auto it = attrs.find(attr);
    if (set) {
      if (attr == CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW) {
        CUaccessPolicyWindow w{};
        std::memcpy(&w, value, sizeof w);
        if (w.num_bytes > static_cast<size_t>(kSimMaxAccessPolicyWindow)) return CUDA_ERROR_INVALID_VALUE;
      }
      std::array<uint8_t, 64>& v = attrs[attr];
      std::memcpy(v.data(), value, v.size());
      return CUDA_SUCCESS;
    }
    std::memset(value, 0, 64);
    if (it != attrs.end()) {
      std::memcpy(value, it->second.data(), 64);
    } else if (attr == CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY) {
      const uint32_t automatic = CU_SYNC_POLICY_AUTO;  // the driver's default
      std::memcpy(value, &automatic, sizeof automatic);
    }
    return CUDA_SUCCESS;
  }
  // Everything ran in order already: launches execute when they arrive (see LaunchKernel).
  CUresult StreamSynchronize(void* stream) override { return Synced(FlushFor(stream)); }
  CUresult StreamQuery(void* stream) override { return Synced(FlushFor(stream)); }
  // Records and waits are stream-ordered like launches: a wait on a stream holds that stream's
  // later work until the awaited record is reached (running the other stream up to it). A program
  // that drops a wait, or records too early, reads stale data here deterministically.
  CUresult StreamWaitEvent(void* stream, void* event, uint32_t) override {
    auto* e = static_cast<SimEvent*>(event);
    if (e->pending_seq == 0) return sticky_;  // nothing to wait for: recorded and reached, or never recorded
    if (stream == nullptr || !opt_.execute) return FlushUntil(e->pending_stream, e->pending_seq);
    Pending w;
    w.kind = Pending::kWait;
    w.seq = ++seq_;
    w.event = e;
    w.wait_seq = e->pending_seq;
    w.wait_stream = e->pending_stream;
    w.stream = stream;
    queues_[stream].push_back(std::move(w));
    return sticky_;
  }
  CUresult EventCreate(uint32_t flags, void** event) override {
    auto e = std::make_unique<SimEvent>();
    e->flags = flags;
    *event = e.get();
    events_.emplace(e.get(), std::move(e));
    return CUDA_SUCCESS;
  }
  CUresult EventDestroy(void* event) override {
    auto* e = static_cast<SimEvent*>(event);
    if (events_.count(e) == 0) return CUDA_ERROR_INVALID_HANDLE;
    // Queued records and waits point at it: run everything first (cuEventDestroy of a pending
    // event is legal; its work completes).
    (void)FlushBlocking(true);
    if (e->ipc_fd >= 0) ::close(e->ipc_fd);
    events_.erase(e);
    return CUDA_SUCCESS;
  }
  CUresult EventRecord(void* event, void* stream) override {
    auto* e = static_cast<SimEvent*>(event);
    if (stream == nullptr || !opt_.execute || (e->flags & CU_EVENT_INTERPROCESS) != 0) {
      if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
      e->recorded = true;
      e->pending_seq = 0;
      e->ns = NowNs();
      return CUDA_SUCCESS;
    }
    Pending rec;
    rec.kind = Pending::kRecord;
    rec.seq = ++seq_;
    rec.event = e;
    rec.stream = stream;
    e->recorded = false;
    e->pending_seq = rec.seq;
    e->pending_stream = stream;
    queues_[stream].push_back(std::move(rec));
    return sticky_;
  }
  CUresult EventSynchronize(void* event) override {
    auto* e = static_cast<SimEvent*>(event);
    if (e->pending_seq != 0) return Synced(FlushUntil(e->pending_stream, e->pending_seq));
    return sticky_;
  }
  CUresult EventQuery(void* event) override { return EventSynchronize(event); }
  CUresult EventElapsedTime(void* start, void* end, float* ms) override {
    auto* a = static_cast<SimEvent*>(start);
    auto* b = static_cast<SimEvent*>(end);
    if (a->pending_seq != 0 || b->pending_seq != 0) return CUDA_ERROR_NOT_READY;
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    *ms = static_cast<float>(static_cast<double>(static_cast<int64_t>(b->ns - a->ns)) / 1e6);
    return CUDA_SUCCESS;
  }

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
  bool View(const std::unordered_map<uint64_t, TexSpec>& objects, uint64_t handle, ptx::ImageView* out) {
    auto it = objects.find(handle);
    if (it == objects.end()) return false;
    const TexSpec& t = it->second;
    ptx::ImageView v;
    if (t.res_type == CU_RESOURCE_TYPE_ARRAY || t.res_type == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY) {
      // A mipmapped texture samples its level 0 here (the executor refuses tex.level / tex.grad).
      void* array = t.array;
      if (t.res_type == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY) {
        auto m = mipmaps_.find(t.mipmap);
        if (m == mipmaps_.end() || m->second->levels.empty()) return false;
        array = m->second->levels[0];
      }
      auto a = arrays_.find(array);
      if (a == arrays_.end()) return false;
      const SimArray& arr = *a->second;
      v.data = const_cast<uint8_t*>(arr.data.data());
      v.bytes = arr.data.size();
      v.format = arr.spec.format;
      v.channels = arr.spec.channels;
      v.dims = arr.spec.depth != 0 ? 3 : arr.spec.height != 0 ? 2 : 1;
      v.layered = (arr.spec.flags & CUDA_ARRAY3D_LAYERED) != 0;
      v.cubemap = (arr.spec.flags & CUDA_ARRAY3D_CUBEMAP) != 0;
      v.width = arr.spec.width;
      v.height = arr.rows;
      v.depth = arr.slices;
      v.row_pitch = arr.row_bytes;
      v.slice_pitch = arr.row_bytes * arr.rows;
    } else {
      const uint64_t texel = FormatBytes(t.format) * t.channels;
      const bool linear = t.res_type == CU_RESOURCE_TYPE_LINEAR;
      const uint64_t bytes = linear ? t.width * texel : (t.height - 1) * t.pitch + t.width * texel;
      uint8_t* host = Host(t.dptr, bytes);
      if (host == nullptr) return false;  // its allocation is gone
      v.data = host;
      v.bytes = bytes;
      v.format = t.format;
      v.channels = t.channels;
      v.dims = linear ? 1 : 2;
      v.width = t.width;
      v.height = linear ? 1 : t.height;
      v.row_pitch = linear ? t.width * texel : t.pitch;
      v.slice_pitch = v.row_pitch * v.height;
    }
    for (int i = 0; i < 3; ++i) v.address_mode[i] = t.address_mode[i];
    for (int i = 0; i < 4; ++i) v.border_color[i] = t.border_color[i];
    if (t.res_type == CU_RESOURCE_TYPE_LINEAR) {
      // tex1Dfetch past the end of linear memory reads 0 on a GPU (CUDA C++ Programming Guide,
      // "Texture Fetching": linear memory has no addressing mode but border).
      v.address_mode[0] = CU_TR_ADDRESS_MODE_BORDER;
      for (float& c : v.border_color) c = 0.0f;
    }
    v.filter_mode = t.filter_mode;
    v.normalized_coords = (t.flags & CU_TRSF_NORMALIZED_COORDINATES) != 0;
    v.read_as_integer = (t.flags & CU_TRSF_READ_AS_INTEGER) != 0;
    *out = v;
    return true;
  }
  // Row `r` of a MemcpyArray side, `width` bytes of it; nullptr if outside its memory.
  uint8_t* Row(const CopySide& c, uint64_t r, uint64_t width) {
    if (c.kind == kSideWindow) return static_cast<uint8_t*>(c.host) + r * c.pitch;
    if (c.kind == kSideDevice) return Host(c.dptr + r * c.pitch, width);
    auto a = arrays_.find(c.array);
    if (a == arrays_.end()) return nullptr;
    SimArray& arr = *a->second;
    const uint64_t off = (c.z * arr.rows + c.y + r) * arr.row_bytes + c.x;
    return off <= arr.data.size() && width <= arr.data.size() - off ? arr.data.data() + off : nullptr;
  }
  static uint64_t FormatBytes(uint32_t format) { return ArrayFormatBytes(format); }

  // CUDA_ERROR_UNSUPPORTED_PTX_VERSION (with last_error_) when `text` declares a PTX ISA newer than
  // the driver version this backend reports JIT-compiles.
  CUresult CheckPtxVersion(std::string_view text) {
    const int driver = opt_.driver_version;
    const uint32_t v = ptx::PtxIsaVersion(text), max = ptx::MaxPtxIsaVersion(driver);
    if (v <= max) return CUDA_SUCCESS;
    last_error_ = "PTX .version " + std::to_string(v / 100) + "." + std::to_string(v % 100) +
                  " is newer than this driver (" + std::to_string(driver / 1000) + "." +
                  std::to_string(driver % 1000 / 10) + ") supports (PTX ISA " + std::to_string(max / 100) + "." +
                  std::to_string(max % 100) + ")";
    return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
  }

  // Whether the executor can run `f` (decided once, at its first launch); when not, `f->refusal`
  // and `f->why` say what its launches fail with and why.
  bool Runnable(SimFunction* f) {
    if (f->runnable >= 0) return f->runnable != 0;
    ptx::Program* prog = ProgramOf(f->module);
    if (prog == nullptr) {
      f->refusal = f->module->ptx_refusal;
      f->why = f->module->ptx_error;
    } else if (Status s = ptx::Prepare(*prog, f->kernel->name); !s.ok()) {
      const bool absent = s.code() == Code::kNotFound;
      f->refusal = absent ? CUDA_ERROR_NO_BINARY_FOR_GPU : CUDA_ERROR_NOT_SUPPORTED;
      f->why = absent ? "the module's PTX does not define it" : s.message();
    } else if (auto res = ptx::Resources(*prog, f->kernel->name); res.ok()) {
      // What the device cannot hold (hostile or not, a GPU's compiler refuses it): refused, not
      // allocated on oriond's host.
      f->resources = *res;
      if (res->shared_static > kSimMaxStaticShared) {
        f->refusal = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
        f->why = "it declares " + std::to_string(res->shared_static) +
                 " bytes of static shared memory; an sm_90 block has at most 49152";
      } else if (res->local_per_thread > kSimMaxLocalPerThread) {
        f->refusal = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
        f->why = "it needs " + std::to_string(res->local_per_thread) +
                 " bytes of local memory per thread; an sm_90 thread has at most 524288";
      }
    }
    f->runnable = f->refusal == CUDA_SUCCESS ? 1 : 0;
    return f->runnable != 0;
  }

  // The module's PTX program, parsed at its first launch; nullptr (with ptx_error) if none.
  ptx::Program* ProgramOf(SimModule* m) {
    if (m->ptx_tried) return m->program.get();
    m->ptx_tried = true;
    auto ptx = fatbin::ExtractPtx(m->image, 90);
    std::vector<uint8_t>().swap(m->image);
    if (!ptx.ok()) {
      m->ptx_error = ptx.status().message();
      return nullptr;
    }
    if (CUresult r = CheckPtxVersion(ptx->text); r != CUDA_SUCCESS) {
      m->ptx_refusal = r;
      m->refusal_kind = LaunchRefusal::kPtxVersion;
      m->ptx_error = last_error_;
      return nullptr;
    }
    auto prog = ptx::Parse(ptx->text);
    if (!prog.ok()) {
      m->ptx_refusal = CUDA_ERROR_NOT_SUPPORTED;  // PTX a GPU would run, in a form the executor does not take
      m->refusal_kind = LaunchRefusal::kPtxUnsupported;
      m->ptx_error = "its PTX did not parse: " + prog.status().message();
      return nullptr;
    }
    // Module variables live in device memory, shared with cuModuleGetGlobal.
    for (const ptx::ModuleVar& v : ptx::Vars(**prog)) {
      auto it = m->globals.find(v.name);
      if (it == m->globals.end()) {
        uint64_t addr = 0;
        if (MemAlloc(std::max<uint64_t>(v.size, 1), &addr) != CUDA_SUCCESS) {
          m->ptx_error = "no memory for its variable " + v.name;
          return nullptr;
        }
        if (!v.init.empty()) std::memcpy(Host(addr, v.size), v.init.data(), std::min<uint64_t>(v.init.size(), v.size));
        it = m->globals.emplace(v.name, addr).first;
      }
      m->var_addrs.push_back(it->second);
    }
    m->program = std::move(*prog);
    return m->program.get();
  }
  static void Release(Block& b) {
    if (b.owned && b.host != nullptr) ::munmap(b.host, b.bytes);
    if (b.ipc_fd >= 0) ::close(b.ipc_fd);
    b.ipc_fd = -1;
    b.host = nullptr;
  }
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
  uint8_t* ReservedHost(uint64_t addr, uint64_t bytes) {
    auto it = reservations_.upper_bound(addr);
    if (it == reservations_.begin()) return nullptr;
    --it;
    const uint64_t off = addr - it->first;
    if (off >= it->second.bytes || bytes > it->second.bytes - off) return nullptr;
    return it->second.host + off;
  }

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
  bool MapAtClientAddress(uint8_t* host, uint64_t bytes, uint64_t want) {
    if (bytes == 0 || want + bytes < want || want < 4096) return false;
    if (want < next_addr_ && want + bytes > kSimBase) return false;  // among the sim's own addresses
    uint64_t lo = want, hi = want + bytes;
    const auto delta = reinterpret_cast<uintptr_t>(host) - want;
    std::vector<uint64_t> overlapping;
    bool stale = false;
    auto it = blocks_.upper_bound(want);
    if (it != blocks_.begin()) --it;
    for (; it != blocks_.end() && it->first < want + bytes; ++it) {
      const Block& b = it->second;
      if (it->first + b.bytes <= want) continue;
      if (b.owned || b.ipc_fd >= 0) return false;
      if (reinterpret_cast<uintptr_t>(b.host) - it->first == delta) {
        lo = std::min(lo, it->first);
        hi = std::max(hi, it->first + b.bytes);
      } else {
        stale = true;
      }
      overlapping.push_back(it->first);
    }
    if (stale) (void)FlushBlocking(true);
    for (uint64_t a : overlapping) blocks_.erase(a);
    blocks_[lo] = Block{hi - lo, host - (want - lo), false};
    return true;
  }

  uint64_t TakeAddress(uint64_t bytes, uint64_t alignment = 0) {
    const uint64_t span = Granules(bytes);
    const uint64_t align = std::max<uint64_t>(alignment, 2ull << 20);
    for (auto it = free_addrs_.begin(); it != free_addrs_.end(); ++it) {
      const uint64_t start = it->first, len = it->second;
      const uint64_t addr = (start + align - 1) & ~(align - 1);
      if (addr - start > len || len - (addr - start) < span) continue;
      free_addrs_.erase(it);
      if (addr > start) free_addrs_[start] = addr - start;
      if (start + len > addr + span) free_addrs_[addr + span] = start + len - (addr + span);
      return addr;
    }
    uint64_t addr = (next_addr_ + align - 1) & ~(align - 1);
    // Step over window memory mapped at its client's addresses (MapAtClientAddress).
    for (auto it = blocks_.lower_bound(next_addr_); it != blocks_.end() && it->first < addr + span;
         it = blocks_.lower_bound(next_addr_)) {
      addr = (it->first + it->second.bytes + align - 1) & ~(align - 1);
      if (it->first > next_addr_) GiveAddress(next_addr_, it->first - next_addr_);
      next_addr_ = it->first + it->second.bytes;
    }
    if (addr > next_addr_) GiveAddress(next_addr_, addr - next_addr_);
    next_addr_ = addr + span;
    return addr;
  }
  void GiveAddress(uint64_t addr, uint64_t bytes) {
    uint64_t span = Granules(bytes);
    auto next = free_addrs_.find(addr + span);  // merge with the free range after ...
    if (next != free_addrs_.end()) {
      span += next->second;
      free_addrs_.erase(next);
    }
    auto it = free_addrs_.lower_bound(addr);  // ... and the one before
    if (it != free_addrs_.begin() && std::prev(it)->first + std::prev(it)->second == addr) {
      std::prev(it)->second += span;
      return;
    }
    free_addrs_[addr] = span;
  }

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

}  // namespace

std::unique_ptr<Backend> MakeSimBackend(const SimOptions& options) { return std::make_unique<SimBackend>(options); }

std::vector<PhysicalGpu> SimPhysicalGpus(uint32_t count, uint64_t mem_mib) {
  std::vector<PhysicalGpu> gpus;
  for (uint32_t i = 0; i < count; ++i) {
    gpus.push_back({i, "Orion Simulated GPU", mem_mib << 20, "GPU-orion-sim-" + std::to_string(i)});
  }
  return gpus;
}

}  // namespace orion::host
