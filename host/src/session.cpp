#include "orion/host/session.h"

#include "module_images.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <algorithm>
#include <filesystem>
#include <set>
#include <deque>
#include <cstring>
#include <fstream>
#include <map>
#include <unordered_map>

#include "orion/common/clock.h"
#include "orion/common/text.h"
#include "orion/fatbin/fatbin.h"
#include "orion/ivshmem/doorbell.h"
#include "orion/ivshmem/ring.h"

namespace orion::host {
namespace {

using ivshmem::ChannelLayout;

enum class Kind : uint8_t { kCtx, kModule, kFunction, kStream, kEvent, kMemHandle };

struct Obj {
  Kind kind;
  void* backend = nullptr;
  uint32_t dev = 0;     // contexts, physical allocations
  uint64_t owner = 0;   // function: its module; module/stream/event: its context
  KernelLayout layout;  // functions
  uint64_t bytes = 0;   // physical allocations (cuMemCreate): size, charged to the quota
};

// Virtual memory management: a reserved address range, and a mapping of a physical allocation
// inside one. A physical allocation lives (and stays charged) while its handle is unreleased or
// any mapping of it remains.
struct Reservation {
  uint64_t bytes;
  uint32_t mappings = 0;
};
struct Mapping {
  uint64_t bytes;
  uint64_t physical;        // key of physicals_
  bool accessible = false;  // cuMemSetAccess granted: a device range for copies and launches
};
struct Physical {
  void* backend;
  uint64_t bytes;
  uint32_t dev;
  uint32_t mappings = 0;
  bool released = false;  // cuMemRelease'd: its handle is gone, the memory lives while mapped
};

struct Alloc {
  uint64_t bytes;
  uint32_t dev;
  bool counted;          // counts against the quota (device allocations; not globals or mapped memory)
  uint64_t charged = 0;  // what it costs against the quota: bytes rounded up to kAllocGranularity
  bool vmm = false;      // an accessible VMM mapping (charged through its physical allocation)
  bool window = false;   // window (pinned) memory mapped for the device (HostGetDevicePointer)
};

// A CUDA array of the session. Its handle dies at cuArrayDestroy; the array itself (and its quota
// charge) lives on while texture or surface objects still refer to it, so no object ever reads freed
// memory.
struct ArrayRec {
  void* backend = nullptr;
  uint32_t dev = 0;
  uint64_t charged = 0;
  uint32_t format = 0, channels = 0, flags = 0;
  uint64_t width = 0, height = 0, depth = 0;  // as created (CUDA's convention: 0 = absent dimension)
  uint64_t texel = 0;                         // bytes per element
  uint64_t row_bytes = 0, rows = 0, slices = 0;
  uint32_t objects = 0;  // texture and surface objects on it
  bool destroyed = false;
  uint64_t mipmap = 0;  // a level of this mipmapped array (which owns it)
};
// A mipmapped array: its levels are ArrayRecs owned by it (made at MipmappedArrayGetLevel), charged
// with it; it lives while texture or surface objects use it or one of its levels.
struct MipmapRec {
  void* backend = nullptr;
  uint32_t dev = 0;
  uint64_t charged = 0;
  uint32_t format = 0, channels = 0, flags = 0, levels = 0;
  uint64_t width = 0, height = 0, depth = 0;
  std::vector<uint64_t> level_ids;  // 0 until asked for
  uint32_t objects = 0;             // objects on it or on its levels
  bool destroyed = false;
};
struct TexRec {
  uint64_t array = 0;   // its array's id (0: linear or pitched memory, or a mipmapped array)
  uint64_t mipmap = 0;  // the mipmapped array it uses, itself or through one of its levels
  uint32_t dev = 0;
};

uint64_t FormatBytes(uint32_t format) { return ArrayFormatBytes(format); }
// An array's record with its geometry (extents already checked: the products cannot overflow).
ArrayRec ArrayGeometry(uint32_t format, uint32_t channels, uint32_t flags, uint64_t width, uint64_t height,
                       uint64_t depth) {
  ArrayRec a;
  a.format = format;
  a.channels = channels;
  a.flags = flags;
  a.width = width;
  a.height = height;
  a.depth = depth;
  a.texel = FormatBytes(format) * channels;
  a.row_bytes = width * a.texel;
  a.rows = std::max<uint64_t>(height, 1);
  a.slices = std::max<uint64_t>(depth, 1);
  return a;
}
bool IntegerFormat32(uint32_t format) {
  return format == CU_AD_FORMAT_UNSIGNED_INT32 || format == CU_AD_FORMAT_SIGNED_INT32;
}
// cuTensorMapEncodeTiled's requirements on its parameters (CUDA driver API reference, "Tensor Map
// Object Management"), checked before any driver sees them: false with what is wrong.
// Element bytes by CUtensorMapDataType (packed types: 1).
constexpr uint32_t kTensorElemBytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4, 1, 1, 1};
static_assert(sizeof kTensorElemBytes / sizeof kTensorElemBytes[0] == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B + 1);
// The swizzle span in bytes (none: no limit).
uint64_t SwizzleSpan(uint32_t swizzle) {
  return swizzle == CU_TENSOR_MAP_SWIZZLE_NONE  ? ~uint64_t{0}
         : swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 32
         : swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                                                : 128;
}
// `im2col`: cuTensorMapEncodeIm2col's common part, which has no box (box_dim all 0): its pixel box
// is checked by Im2colValid.
bool TensorMapValid(const TensorMapEncodeReq& q, const char** why, bool im2col = false) {
  const uint32_t* const kElemBytes = kTensorElemBytes;
  const bool packed16 =
      q.data_type == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B || q.data_type == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B;
  const bool packed = packed16 || q.data_type == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B;
  *why = "a data type, interleave, swizzle, L2 promotion or OOB fill that does not exist";
  if (q.data_type > CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B || q.interleave > CU_TENSOR_MAP_INTERLEAVE_32B ||
      q.swizzle > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B || q.l2_promotion > CU_TENSOR_MAP_L2_PROMOTION_L2_256B ||
      q.oob_fill > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA)
    return false;
  *why = "rank must be 1..5 (3..5 interleaved)";
  if (q.rank == 0 || q.rank > 5 || (q.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && q.rank < 3)) return false;
  const uint64_t align = q.interleave == CU_TENSOR_MAP_INTERLEAVE_32B || packed16 ? 32 : 16;
  *why = "the global address must be 16-byte aligned (32 for 32B interleave and 16-byte-aligned packed types)";
  if (q.global_address % align != 0) return false;
  for (uint32_t i = 0; i < 5; ++i) {
    const bool used = i < q.rank;
    *why = "each global dimension must be 1..2^32 (0 past the rank)";
    if (used ? q.global_dim[i] == 0 || q.global_dim[i] > (uint64_t{1} << 32) : q.global_dim[i] != 0) return false;
    *why = "each box dimension must be 1..256 and each element stride 1..8 (0 past the rank)";
    if (im2col && q.box_dim[i] != 0) return false;
    if (used ? (!im2col && (q.box_dim[i] == 0 || q.box_dim[i] > 256)) || q.element_strides[i] == 0 ||
                   q.element_strides[i] > 8
             : q.box_dim[i] != 0 || q.element_strides[i] != 0)
      return false;
  }
  for (uint32_t i = 0; i < 4; ++i) {
    *why = "each global stride must be a multiple of 16 (32 when 32B-aligned) below 2^40 (0 past rank - 1)";
    if (i + 1 < q.rank
            ? q.global_strides[i] % align != 0 || q.global_strides[i] >= (uint64_t{1} << 40) || q.global_strides[i] == 0
            : q.global_strides[i] != 0)
      return false;
  }
  const uint64_t inner = uint64_t{q.box_dim[0]} * kElemBytes[q.data_type];
  *why = "the box's inner dimension must be a multiple of 16 bytes without interleave";
  if (!im2col && q.interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && !packed && inner % 16 != 0) return false;
  *why = "the box's inner dimension must fit the swizzle span";
  if (!im2col && q.interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && !packed && inner > SwizzleSpan(q.swizzle))
    return false;
  *why = "32B interleave needs the 32B swizzle";
  if (q.interleave == CU_TENSOR_MAP_INTERLEAVE_32B && q.swizzle != CU_TENSOR_MAP_SWIZZLE_32B) return false;
  *why = "NaN OOB fill needs a floating-point, unpacked data type";
  const bool fp = q.data_type >= CU_TENSOR_MAP_DATA_TYPE_FLOAT16 && q.data_type <= CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ;
  if (q.oob_fill != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE && !fp) return false;
  *why = "";
  return true;
}

// cuTensorMapEncodeIm2col's requirements (CUDA 13.0 <cuda.h> doc comment): the common ones above,
// rank 3..5, rank - 2 corner offsets in the rank's range ([-32768, 32767], [-128, 127], [-16, 15]),
// 0 past them, 1..256 channels per pixel (128 for the 16-byte-aligned packed types), 1..1024 pixels
// per column, and without interleave the inner dimension (channels x element bytes) within the
// swizzle span.
bool Im2colValid(const TensorMapIm2colReq& q, const char** why) {
  if (!TensorMapValid(q.base, why, true)) return false;
  const TensorMapEncodeReq& b = q.base;
  *why = "an im2col tensor has rank 3..5";
  if (b.rank < 3) return false;
  const int32_t limit = b.rank == 3 ? 32768 : b.rank == 4 ? 128 : 16;
  for (uint32_t i = 0; i < 3; ++i) {
    *why = "each pixel-box corner offset must be within the rank's range (0 past rank - 2)";
    const bool used = i < b.rank - 2;
    for (const int32_t c : {q.lower_corner[i], q.upper_corner[i]}) {
      if (used ? c < -limit || c > limit - 1 : c != 0) return false;
    }
  }
  const bool packed16 =
      b.data_type == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B || b.data_type == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B;
  *why = "channels per pixel must be 1..256 (128 for the 16-byte-aligned packed types)";
  if (q.channels_per_pixel == 0 || q.channels_per_pixel > 256 || (packed16 && q.channels_per_pixel != 128))
    return false;
  *why = "pixels per column must be 1..1024";
  if (q.pixels_per_column == 0 || q.pixels_per_column > 1024) return false;
  const bool packed = packed16 || b.data_type == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B;
  *why = "the channels of a pixel must fit the swizzle span";
  if (b.interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && !packed &&
      uint64_t{q.channels_per_pixel} * kTensorElemBytes[b.data_type] > SwizzleSpan(b.swizzle))
    return false;
  *why = "";
  return true;
}

// The stream attributes StreamAttribute serves, and whether a value to set is one (CUDA driver
// API, CUstreamAttrValue: CUaccessPolicyWindow's hitRatio in [0, 1] and CUaccessProperty values;
// CUsynchronizationPolicy 1..4). The window's address range is a cache hint, never accessed.
bool StreamAttrValid(uint32_t attr, bool set, const uint8_t value[64]) {
  if (attr == CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW) {
    if (!set) return true;
    CUaccessPolicyWindow w{};
    std::memcpy(&w, value, sizeof w);
    const auto prop_ok = [](CUaccessProperty p) {
      return p == CU_ACCESS_PROPERTY_NORMAL || p == CU_ACCESS_PROPERTY_STREAMING || p == CU_ACCESS_PROPERTY_PERSISTING;
    };
    return w.hitRatio >= 0.0f && w.hitRatio <= 1.0f && prop_ok(w.hitProp) && prop_ok(w.missProp);
  }
  if (attr == CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY) {
    if (!set) return true;
    uint32_t policy = 0;
    std::memcpy(&policy, value, sizeof policy);
    return policy >= CU_SYNC_POLICY_AUTO && policy <= CU_SYNC_POLICY_BLOCKING_SYNC;
  }
  return false;
}
// Extents a GPU of compute capability 7.5+ accepts (CUDA C++ Programming Guide, "Features and
// Technical Specifications": maximum 1D / 2D / 3D CUDA array and texture sizes).
constexpr uint64_t kMaxArray1D = uint64_t{1} << 17, kMaxArray2DW = uint64_t{1} << 17, kMaxArray2DH = uint64_t{1} << 16;
constexpr uint64_t kMaxArray3D = uint64_t{1} << 14, kMaxTexLinear = uint64_t{1} << 27;
// Layered and cubemap arrays (same table): 1D layered 32768 x 2048 layers, 2D layered 32768 x
// 32768 x 2048 layers, cubemap 32768 x 32768, cubemap layered 32768 x 32768 x 2046 layers (of 6 faces).
constexpr uint64_t kMaxLayeredW = uint64_t{1} << 15, kMaxLayers = 2048, kMaxCubeLayers = 2046;

class Session {
 public:
  Session(const SessionParams& p, std::unique_ptr<Backend> b, std::unique_ptr<SessionChannel> ch)
      : p_(p), b_(std::move(b)), ch_(std::move(ch)), layout_(ch_->layout()), window_(ch_->window()) {
    used_.assign(p_.placements.size(), 0);
  }

  int Run(const FrameHeader& hello_header, const HelloReq& hello);
  // The session's last log line on how it waited while idle.
  void LogWaits() const {
    const std::string w = ch_->WaitStats();
    p_.log->info("sess={} idle waits: {}{}naps={}", p_.session_id, w, w.empty() ? "" : ", ", naps_);
    for (size_t d = 0; d < gates_.size(); ++d) {
      if (gates_[d] == nullptr) continue;
      p_.log->info("sess={} compute: vGPU {}: its tenant used {:.3f} s of device time and waited {:.3f} s for it",
                   p_.session_id, d, static_cast<double>(gates_[d]->busy_ns()) / 1e9,
                   static_cast<double>(gates_[d]->throttled_ns()) / 1e9);
    }
  }

 private:
  // Executes one frame. Returns false on a protocol violation (message in *why).
  bool Dispatch(const FrameHeader& h, const uint8_t* payload, std::vector<uint8_t>* reply, int32_t* status,
                std::string* why);
  bool Reply(const FrameHeader& req, int32_t status, const void* payload, uint32_t len);
  Obj* Find(uint64_t id, Kind k) {
    auto it = handles_.find(id);
    return it != handles_.end() && it->second.kind == k ? &it->second : nullptr;
  }
  uint64_t AddHandle(Obj o) {
    const uint64_t id = next_handle_;
    next_handle_ += 0x10;
    handles_.emplace(id, std::move(o));
    return id;
  }
  bool Stream(uint64_t id, void** out) {
    if (id == 0) {
      *out = nullptr;
      return true;
    }
    Obj* o = Find(id, Kind::kStream);
    if (o == nullptr) return false;
    *out = o->backend;
    return true;
  }
  // Whether [p, p+bytes) lies inside one allocation of this session, or runs through accessible
  // VMM mappings that adjoin (cuMemMap'ed side by side in one reservation, as PyTorch's
  // expandable segments grow).
  bool DeviceRange(uint64_t p, uint64_t bytes) const {
    auto it = allocs_.upper_bound(p);
    if (it == allocs_.begin()) return false;
    --it;
    const uint64_t off = p - it->first;
    if (off >= it->second.bytes) return false;
    uint64_t have = it->second.bytes - off;
    while (have < bytes && it->second.vmm) {
      auto next = std::next(it);
      if (next == allocs_.end() || !next->second.vmm || next->first != it->first + it->second.bytes) return false;
      it = next;
      have += it->second.bytes;
    }
    return bytes <= have;
  }
  // The reservation holding [addr, addr+bytes), or end().
  std::map<uint64_t, Reservation>::iterator ReservationOf(uint64_t addr, uint64_t bytes) {
    auto it = reservations_.upper_bound(addr);
    if (it == reservations_.begin()) return reservations_.end();
    --it;
    const uint64_t off = addr - it->first;
    return off < it->second.bytes && bytes <= it->second.bytes - off ? it : reservations_.end();
  }
  // Whether [addr, addr+bytes) is exactly whole VMM mappings side by side (cuMemUnmap and
  // cuMemSetAccess take no part of one); [*first, *end) are they.
  bool WholeMappings(uint64_t addr, uint64_t bytes, std::map<uint64_t, Mapping>::iterator* first,
                     std::map<uint64_t, Mapping>::iterator* end) {
    *first = *end = mappings_.find(addr);
    uint64_t covered = 0;
    while (*end != mappings_.end() && (*end)->first == addr + covered && covered < bytes)
      covered += ((*end)++)->second.bytes;
    return *first != mappings_.end() && bytes != 0 && covered == bytes;
  }
  // Charges `bytes` of device `dev` to its quota (rounded up to `granule`); false, with the Orion
  // log line, when it would exceed it.
  bool Charge(uint32_t dev, uint64_t bytes, uint64_t granule, const char* op, const char* call, uint64_t* charged);
  void Uncharge(uint32_t dev, uint64_t charged) {
    used_[dev] -= charged;
    PublishUsed(dev);
  }
  // Frees a physical allocation that is released and no longer mapped.
  void MaybeFreePhysical(uint64_t id) {
    auto it = physicals_.find(id);
    if (it == physicals_.end() || !it->second.released || it->second.mappings != 0) return;
    Uncharge(it->second.dev, it->second.bytes);
    physicals_.erase(it);
  }
  bool WindowRange(uint64_t off, uint64_t bytes) const {
    return off <= layout_.window_bytes && bytes <= layout_.window_bytes - off;
  }
  uint32_t CurrentDev() const { return cur_dev_; }
  bool HandlesFull() const {
    return handles_.size() + arrays_.size() + texobjs_.size() + mipmaps_.size() >= kMaxSessionHandles;
  }
  MipmapRec* LiveMipmap(uint64_t id) {
    auto it = mipmaps_.find(id);
    return it != mipmaps_.end() && !it->second.destroyed ? &it->second : nullptr;
  }
  // Destroys mipmapped array `id` (and its levels) once destroyed and unused.
  void MaybeFreeMipmap(uint64_t id) {
    auto it = mipmaps_.find(id);
    if (it == mipmaps_.end() || !it->second.destroyed || it->second.objects != 0) return;
    for (uint64_t level : it->second.level_ids) arrays_.erase(level);
    (void)b_->MipmappedArrayDestroy(it->second.backend);
    Uncharge(it->second.dev, it->second.charged);
    mipmaps_.erase(it);
  }
  // A live (not destroyed) array of this session.
  ArrayRec* LiveArray(uint64_t id) {
    auto it = arrays_.find(id);
    if (it == arrays_.end() || it->second.destroyed) return nullptr;
    if (it->second.mipmap != 0 && LiveMipmap(it->second.mipmap) == nullptr) return nullptr;  // its owner is gone
    return &it->second;
  }
  // Destroys array `id` in the backend and gives its quota back once nothing refers to it.
  void MaybeFreeArray(uint64_t id) {
    auto it = arrays_.find(id);
    if (it == arrays_.end() || !it->second.destroyed || it->second.objects != 0 || it->second.mipmap != 0) return;
    (void)b_->ArrayDestroy(it->second.backend);
    Uncharge(it->second.dev, it->second.charged);
    arrays_.erase(it);
  }
  // A CUDA array descriptor Orion serves: CUDA_ERROR_NOT_SUPPORTED (logged) for a format or flags it
  // does not, CUDA_ERROR_INVALID_VALUE for extents or channels no GPU takes.
  CUresult CheckArrayDesc(const ArrayCreateReq& q, const char* op);
  // A tensor map whose parameters were checked (`ok`; else `bad` says why) and whose global address
  // must be the session's device memory, encoded into `*rep` by `encode` (op: the entry point's name).
  template <typename Encode>
  CUresult EncodeTensorMap(const char* op, bool ok, const char* bad, uint64_t address, Encode encode,
                           TensorMapRep* rep) {
    if (!ok || !DeviceRange(address, 1)) {
      p_.log->warn("sess={} {} refused: {}", p_.session_id, op,
                   *bad != '\0' ? bad : "the global address is not this session's device memory");
      return CUDA_ERROR_INVALID_VALUE;
    }
    return encode(rep->opaque);
  }
  // Checks one side of a MemcpyArray and fills the backend's view of it.
  bool CopySideOk(uint32_t side, uint64_t at, uint64_t pitch, uint64_t x, uint64_t y, uint64_t z, uint64_t width,
                  uint64_t height, Backend::CopySide* out);

  SessionParams p_;
  std::unique_ptr<Backend> b_;
  std::unique_ptr<SessionChannel> ch_;
  uint64_t naps_ = 0;  // idle naps (a client that cannot ring)
  ChannelLayout layout_{};
  uint8_t* window_ = nullptr;
  bool same_address_warned_ = false;  // HostGetDevicePointer could not honour the client's address
  std::unordered_map<uint64_t, Obj> handles_;
  std::unordered_map<void*, uint64_t> primary_ids_;                       // backend primary context -> handle
  std::unordered_map<void*, uint64_t> function_ids_;                      // backend function -> handle
  std::unordered_map<uint64_t, std::vector<uint64_t>> module_functions_;  // module -> its function handles
  uint64_t next_handle_ = 0x10000;
  std::map<uint64_t, Alloc> allocs_;
  std::set<uint64_t> ipc_exports_;        // allocations with an IPC handle
  std::set<uint64_t> ipc_event_exports_;  // events with an IPC handle (each holds a ticket fd)
  std::set<uint64_t> ipc_imports_;        // allocations opened from another session's handle
  // IPC memory that outlives a free (orion/host/ipc_ticket.h): this session's exports it freed while
  // importers still held them (charged here until the last one closes), and the imports it pays for
  // because their exporter is gone (dptr -> charge).
  struct Lingering {
    int fd;  // a dup of the revoked ticket
    uint32_t dev;
    uint64_t charged;
  };
  std::vector<Lingering> lingering_;
  std::map<uint64_t, uint64_t> adopted_;
  std::chrono::steady_clock::time_point ipc_swept_{};
  void SweepIpc(bool now = false);
  uint64_t ChargeOver(uint32_t dev, uint64_t bytes) {  // a charge that may exceed the quota
    const uint64_t c = (bytes + kAllocGranularity - 1) & ~(kAllocGranularity - 1);
    used_[dev] += c;
    PublishUsed(dev);
    return c;
  }
  std::unordered_map<uint64_t, ArrayRec> arrays_;        // CUDA arrays, by handle
  std::map<std::pair<uint64_t, bool>, TexRec> texobjs_;  // (object value, is a surface) -> its record
  std::unordered_map<uint64_t, MipmapRec> mipmaps_;      // mipmapped arrays, by handle
  std::map<uint64_t, Reservation> reservations_;         // VMM address ranges, by start
  uint64_t reserved_bytes_ = 0;                          // their sum (at most kMaxReservedBytes)
  std::map<uint64_t, Mapping> mappings_;                 // VMM mappings, by start
  std::unordered_map<uint64_t, Physical> physicals_;     // by id; handles_ holds the unreleased ones
  uint64_t next_physical_ = 1;
  std::vector<uint64_t> used_;                       // bytes allocated per device (quota)
  std::vector<uint64_t> overhead_;                   // context bytes per device (quota)
  std::vector<std::unique_ptr<ComputeGate>> gates_;  // per device: its compute share (null: none)
  std::vector<uint64_t> scratch_;  // per device: local and shared memory charged for launches (LaunchScratchBytes)
  std::vector<uint64_t> metered_;  // what this session has on its hold's meter per device
  // Tells oriond (and through it the controller) what this session holds on device `d`, and moves
  // the hold's meter by what changed (a charge already put its bytes there: see Charge).
  void PublishUsed(uint32_t d) {
    if (d >= kMaxDevices || d >= used_.size() || d >= overhead_.size()) return;
    const uint64_t now = used_[d] + overhead_[d];
    if (p_.hold_used != nullptr && d < metered_.size()) {
      p_.hold_used[d].fetch_add(now - metered_[d], std::memory_order_relaxed);  // modulo 2^64: a decrease too
      metered_[d] = now;
    }
    if (p_.used_out != nullptr) p_.used_out[d].store(now, std::memory_order_relaxed);
  }
  // What is left of device `d`'s quota for this session: its own, and its hold's for all sessions.
  uint64_t QuotaLeft(uint32_t d) const {
    const uint64_t quota = p_.placements[d].quota_bytes, taken = used_[d] + overhead_[d];
    uint64_t left = quota > taken ? quota - taken : 0;
    if (p_.hold_used != nullptr && d < p_.hold_quota.size()) {
      const uint64_t all = p_.hold_used[d].load(std::memory_order_relaxed);
      left = std::min(left, p_.hold_quota[d] > all ? p_.hold_quota[d] - all : 0);
    }
    return left;
  }
  uint64_t cur_ctx_ = 0;
  uint32_t cur_dev_ = 0;
  int32_t deferred_ = 0;
  bool violation_ = false;
  // Module images by content hash: complete ones (memory and the host's disk cache), and the one
  // being uploaded.
  ModuleImages images_{p_.cache_dir, p_.cache_max_bytes};
  std::string upload_hex_;
  std::vector<uint8_t> upload_;
  std::string output_;   // device printf text not yet taken by the client (at most kMaxPendingOutput)
  std::string notices_;  // backend notices for the client's log, one per line (at most kMaxPendingNotices)
  uint64_t upload_received_ = 0;
};

bool Session::Reply(const FrameHeader& req, int32_t status, const void* payload, uint32_t len) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kProtocolVersion;
  h.op = req.op;
  h.seq = req.seq;
  h.payload_len = len;
  h.status = status;
  h.deferred = deferred_;
  deferred_ = 0;
  // Device printf text the backend produced (sim: at launches; cuda: at synchronizing calls).
  if (std::string out = b_->TakeOutput(); !out.empty() && output_.size() < kMaxPendingOutput)
    output_.append(out, 0, std::min<size_t>(out.size(), kMaxPendingOutput - output_.size()));
  if (!output_.empty() || !notices_.empty()) h.flags |= kFlagOutputPending;
  Status s = ch_->Reply(h, payload, len);
  if (s.ok()) return true;
  if (s.code() == Code::kDataLoss) {
    p_.log->error("sess={} protocol violation: {}", p_.session_id, s.message());
    ch_->Closing(CUDA_ERROR_ILLEGAL_STATE);
    violation_ = true;
  } else {
    p_.log->info("sess={} cannot answer the client: {}", p_.session_id, s.message());
  }
  return false;
}

// The NUL-terminated name after a ModuleSymbolReq.
bool Name(const uint8_t* payload, uint32_t len, const ModuleSymbolReq& q, std::string* name) {
  if (q.name_len == 0 || q.name_len > 4 * kNameLen || len != sizeof q + q.name_len) return false;
  const char* s = reinterpret_cast<const char*>(payload + sizeof q);
  if (s[q.name_len - 1] != '\0') return false;
  *name = std::string(s, q.name_len - 1);
  return name->find('\0') == std::string::npos;
}

#define ORION_WANT(cond, msg) \
  do {                        \
    if (!(cond)) {            \
      *why = (msg);           \
      return false;           \
    }                         \
  } while (0)

// Cases that serve several ops decode one request type for all of them (ops.def must agree).
static_assert(std::is_same_v<OpRequestT<Op::kMemcpyDtoH>, OpRequestT<Op::kMemcpyDtoHAsync>>);
static_assert(std::is_same_v<OpRequestT<Op::kModuleGetFunction>, OpRequestT<Op::kModuleGetGlobal>>);
static_assert(std::is_same_v<OpRequestT<Op::kFuncGetAttribute>, OpRequestT<Op::kFuncSetAttribute>>);
static_assert(std::is_same_v<OpRequestT<Op::kStreamDestroy>, OpRequestT<Op::kStreamSynchronize>>);
static_assert(std::is_same_v<OpRequestT<Op::kStreamDestroy>, OpRequestT<Op::kStreamQuery>>);
static_assert(std::is_same_v<OpRequestT<Op::kEventDestroy>, OpRequestT<Op::kEventSynchronize>>);
static_assert(std::is_same_v<OpRequestT<Op::kEventDestroy>, OpRequestT<Op::kEventQuery>>);

bool Session::Dispatch(const FrameHeader& h, const uint8_t* payload, std::vector<uint8_t>* reply, int32_t* status,
                       std::string* why) {
  const uint32_t len = h.payload_len;
  reply->clear();
  // The checkpoint: nothing below runs for a payload whose length is not the one ops.def gives its
  // op; each case then reads its request once, with DecodeReq, typed by ops.def.
  ORION_WANT(static_cast<Op>(h.op) != Op::kHello, "second Hello");
  ORION_WANT(static_cast<Op>(h.op) != Op::kRdmaConnect, "RdmaConnect inside the frame stream");
  if (static_cast<Op>(h.op) != Op::kBatch && !CheckRequestShape(h.op, len, why)) return false;
  auto put = [&](const auto& v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    reply->insert(reply->end(), b, b + sizeof v);
  };
  CUresult r = CUDA_SUCCESS;
  switch (static_cast<Op>(h.op)) {
    case Op::kGoodbye:
    case Op::kNop:
    case Op::kNopAsync:
    case Op::kSync: break;
    case Op::kTakeOutput: {
      // A record takes at most half its ring (RingProducer::Reserve): on a small channel (4 MiB: a
      // 64 KiB reply ring) a full kMaxPayload reply would never fit, and the session would wait for
      // room until the client's lease ran out. The client asks again while kFlagOutputPending is set.
      const uint64_t ring_max = layout_.reply_ring_bytes / 2 - ivshmem::kStampBytes - sizeof(FrameHeader);
      const size_t room = std::min<uint64_t>(kMaxPayload, ring_max) - sizeof(OutputRep);
      const size_t n = std::min<size_t>(output_.size(), room);
      const size_t m = std::min<size_t>(notices_.size(), room - n);
      put(OutputRep{static_cast<uint32_t>(n), static_cast<uint32_t>(m)});
      reply->insert(reply->end(), output_.begin(), output_.begin() + static_cast<std::ptrdiff_t>(n));
      reply->insert(reply->end(), notices_.begin(), notices_.begin() + static_cast<std::ptrdiff_t>(m));
      output_.erase(0, n);
      notices_.erase(0, m);
      break;
    }

    case Op::kCtxCreate: {
      const auto q = DecodeReq<Op::kCtxCreate>(payload);
      if (q.device >= p_.placements.size()) {
        r = CUDA_ERROR_INVALID_DEVICE;
        break;
      }
      if (HandlesFull()) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      void* ctx = nullptr;
      r = b_->CtxCreate(q.device, q.flags, &ctx);
      if (r == CUDA_SUCCESS) {
        const uint64_t id = AddHandle({Kind::kCtx, ctx, q.device, 0, {}});
        put(HandleRep{id});
        cur_ctx_ = id;
        cur_dev_ = q.device;
      }
      break;
    }
    case Op::kCtxDestroy: {
      const auto q = DecodeReq<Op::kCtxDestroy>(payload);
      Obj* o = Find(q.handle, Kind::kCtx);
      if (o == nullptr) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        break;
      }
      r = b_->CtxDestroy(o->backend);
      if (r == CUDA_SUCCESS) {
        handles_.erase(q.handle);
        if (cur_ctx_ == q.handle) cur_ctx_ = 0;
      }
      break;
    }
    case Op::kCtxSetCurrent: {
      const auto q = DecodeReq<Op::kCtxSetCurrent>(payload);
      Obj* o = Find(q.handle, Kind::kCtx);
      if (o == nullptr) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        break;
      }
      r = b_->SetCurrent(o->backend);
      if (r == CUDA_SUCCESS) {
        cur_ctx_ = q.handle;
        cur_dev_ = o->dev;
      }
      break;
    }
    case Op::kCtxSynchronize: r = b_->CtxSynchronize(); break;
    case Op::kPrimaryCtxRetain: {
      const auto q = DecodeReq<Op::kPrimaryCtxRetain>(payload);
      if (q.device >= p_.placements.size()) {
        r = CUDA_ERROR_INVALID_DEVICE;
        break;
      }
      void* ctx = nullptr;
      r = b_->PrimaryCtxRetain(q.device, &ctx);
      if (r == CUDA_SUCCESS) {
        uint64_t& id = primary_ids_[ctx];
        if (id == 0 || Find(id, Kind::kCtx) == nullptr) id = AddHandle({Kind::kCtx, ctx, q.device, 0, {}});
        put(HandleRep{id});
        if (cur_ctx_ == 0) {
          cur_ctx_ = id;
          cur_dev_ = q.device;
          r = b_->SetCurrent(ctx);
        }
      }
      break;
    }
    case Op::kPrimaryCtxRelease: break;
    case Op::kPrimaryCtxReset: {
      const auto q = DecodeReq<Op::kPrimaryCtxReset>(payload);
      if (q.device >= p_.placements.size()) {
        r = CUDA_ERROR_INVALID_DEVICE;
        break;
      }
      r = b_->PrimaryCtxReset(q.device);
      if (r == CUDA_SUCCESS) {
        // The reset frees the context's allocations, arrays, texture and surface objects.
        // VMM mappings are not a context's: they stay.
        for (auto it = texobjs_.begin(); it != texobjs_.end();) {
          if (it->second.dev != q.device) {
            ++it;
            continue;
          }
          (void)b_->TexObjectDestroy(it->first.first, it->first.second);
          if (it->second.array != 0) --arrays_[it->second.array].objects;
          it = texobjs_.erase(it);
        }
        for (auto it = mipmaps_.begin(); it != mipmaps_.end();) {
          if (it->second.dev != q.device) {
            ++it;
            continue;
          }
          for (uint64_t level : it->second.level_ids) arrays_.erase(level);
          (void)b_->MipmappedArrayDestroy(it->second.backend);
          Uncharge(it->second.dev, it->second.charged);
          it = mipmaps_.erase(it);
        }
        for (auto it = arrays_.begin(); it != arrays_.end();) {
          if (it->second.dev != q.device) {
            ++it;
            continue;
          }
          (void)b_->ArrayDestroy(it->second.backend);
          Uncharge(it->second.dev, it->second.charged);
          it = arrays_.erase(it);
        }
        for (auto it = allocs_.begin(); it != allocs_.end();) {
          if (it->second.dev == q.device && !it->second.vmm) {
            if (it->second.counted) used_[q.device] -= it->second.charged;
            PublishUsed(q.device);
            (void)b_->MemFree(it->first);
            it = allocs_.erase(it);
          } else {
            ++it;
          }
        }
      }
      break;
    }
    case Op::kCtxSetLimit: {
      const auto q = DecodeReq<Op::kCtxSetLimit>(payload);
      r = cur_ctx_ == 0 ? CUDA_ERROR_INVALID_CONTEXT : b_->CtxSetLimit(q.limit, q.value);
      break;
    }
    case Op::kCtxGetLimit: {
      const auto q = DecodeReq<Op::kCtxGetLimit>(payload);
      uint64_t v = 0;
      r = cur_ctx_ == 0 ? CUDA_ERROR_INVALID_CONTEXT : b_->CtxGetLimit(q.limit, &v);
      put(U64Rep{v});
      break;
    }

    case Op::kMemAlloc: {
      const auto q = DecodeReq<Op::kMemAlloc>(payload);
      if (cur_ctx_ == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        break;
      }
      if (q.bytes == 0) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      // Each allocation costs at least the driver's allocation granularity (kAllocGranularity):
      // many tiny allocations cannot hold more device memory than the quota.
      uint64_t charged = 0;
      if (!Charge(cur_dev_, q.bytes, kAllocGranularity, "MemAlloc", "cuMemAlloc", &charged)) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      uint64_t dptr = 0;
      r = b_->MemAlloc(q.bytes, &dptr);
      if (r == CUDA_SUCCESS) {
        allocs_[dptr] = {q.bytes, cur_dev_, true, charged};
        put(U64Rep{dptr});
      } else {
        Uncharge(cur_dev_, charged);
      }
      break;
    }
    case Op::kMemFree: {
      const auto q = DecodeReq<Op::kMemFree>(payload);
      auto it = allocs_.find(q.dptr);
      if (it == allocs_.end() || !it->second.counted) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      // An exported allocation: revoke its ticket, and keep the charge while importers map it.
      int ticket = -1;
      if (ipc_exports_.count(q.dptr) != 0) {
        const int fd = b_->IpcTicketFd(q.dptr);
        if (fd >= 0) ticket = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (ticket >= 0) RevokeIpcTicket(ticket);
      }
      r = b_->MemFree(q.dptr);
      if (r == CUDA_SUCCESS) {
        if (ticket >= 0 && IpcTicketImported(ticket)) {
          p_.log->info(
              "sess={} op=MemFree {:#x}: an importer still maps it; its {} MB stay on this session's quota "
              "until the last importer closes it",
              p_.session_id, q.dptr, it->second.charged >> 20);
          lingering_.push_back({ticket, it->second.dev, it->second.charged});
          ticket = -1;
        } else {
          Uncharge(it->second.dev, it->second.charged);
        }
        allocs_.erase(it);
        ipc_exports_.erase(q.dptr);
      }
      if (ticket >= 0) ::close(ticket);
      break;
    }
    case Op::kMemGetInfo: {
      if (cur_ctx_ == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        break;
      }
      SweepIpc(true);
      uint64_t free = 0, total = 0;
      r = b_->MemGetInfo(&free, &total);
      const uint64_t quota = p_.placements[cur_dev_].quota_bytes;
      // The vGPU's view: total = quota; free = what is left of it, for this process and the others
      // on its hold (never more than the GPU has).
      MemGetInfoRep rep{std::min(free, QuotaLeft(cur_dev_)), quota};
      if (std::string(b_->name()) == "sim") rep.free = QuotaLeft(cur_dev_);
      put(rep);
      break;
    }
    case Op::kDeviceMemoryInfo: {
      // NVML's view of one vGPU (guest libnvidia-ml.so.1): needs no context. Hostile input: the
      // device index is checked against this session's placements, the flags must be 0.
      const auto q = DecodeReq<Op::kDeviceMemoryInfo>(payload);
      if (q.device >= p_.placements.size() || q.flags != 0) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      put(DeviceMemoryRep{p_.placements[q.device].quota_bytes, used_[q.device], overhead_[q.device]});
      break;
    }
    case Op::kDeviceUtilization: {
      // NVML's utilization of one vGPU: its tenant's device time, measured by the compute-share
      // scheduler, which only a backend that gates compute keeps (GatesCompute).
      const auto q = DecodeReq<Op::kDeviceUtilization>(payload);
      if (q.device >= p_.placements.size() || q.flags != 0) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      if (q.device >= gates_.size() || gates_[q.device] == nullptr || !b_->GatesCompute()) {
        r = CUDA_ERROR_NOT_SUPPORTED;
        break;
      }
      const ComputeGate& g = *gates_[q.device];
      put(DeviceUtilizationRep{g.utilization_permille(), g.ratio(), g.busy_ns(), g.throttled_ns()});
      break;
    }
    case Op::kMemcpyHtoD: {
      const auto q = DecodeReq<Op::kMemcpyHtoD>(payload);
      void* s = nullptr;
      if (!WindowRange(q.src, q.bytes)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      if (!DeviceRange(q.dst, q.bytes) || !Stream(q.stream, &s)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->MemcpyHtoD(q.dst, window_ + q.src, q.bytes, s);
      break;
    }
    case Op::kMemcpyDtoH:
    case Op::kMemcpyDtoHAsync: {
      const auto q = DecodeReq<Op::kMemcpyDtoH>(payload);
      void* s = nullptr;
      if (!WindowRange(q.dst, q.bytes)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      if (!DeviceRange(q.src, q.bytes) || !Stream(q.stream, &s)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->MemcpyDtoH(window_ + q.dst, q.src, q.bytes, s, static_cast<Op>(h.op) == Op::kMemcpyDtoHAsync);
      break;
    }
    case Op::kMemcpyDtoD: {
      const auto q = DecodeReq<Op::kMemcpyDtoD>(payload);
      void* s = nullptr;
      if (!DeviceRange(q.dst, q.bytes) || !DeviceRange(q.src, q.bytes) || !Stream(q.stream, &s)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->MemcpyDtoD(q.dst, q.src, q.bytes, s);
      break;
    }
    case Op::kMemcpy2D: {
      const auto q = DecodeReq<Op::kMemcpy2D>(payload);
      void* s = nullptr;
      if (q.width_bytes == 0 || q.height == 0) break;
      uint64_t src_span = 0, dst_span = 0;
      if (q.src_side > kSideWindow || q.dst_side > kSideWindow || !Stream(q.stream, &s) ||
          !Span2D(q.height, q.src_pitch, q.width_bytes, &src_span) ||
          !Span2D(q.height, q.dst_pitch, q.width_bytes, &dst_span)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      const bool src_ok = q.src_side == kSideWindow ? WindowRange(q.src, src_span) : DeviceRange(q.src, src_span);
      const bool dst_ok = q.dst_side == kSideWindow ? WindowRange(q.dst, dst_span) : DeviceRange(q.dst, dst_span);
      if (!src_ok || !dst_ok) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->Memcpy2D(q.dst_side == kSideDevice ? q.dst : 0, q.dst_side == kSideWindow ? window_ + q.dst : nullptr,
                       q.dst_pitch, q.src_side == kSideDevice ? q.src : 0,
                       q.src_side == kSideWindow ? window_ + q.src : nullptr, q.src_pitch, q.width_bytes, q.height, s);
      break;
    }
    case Op::kMemset: {
      const auto q = DecodeReq<Op::kMemset>(payload);
      void* s = nullptr;
      uint64_t row_bytes = 0, span = 0;
      if ((q.elem_size != 1 && q.elem_size != 2 && q.elem_size != 4) || !CheckedMul(q.width, q.elem_size, &row_bytes) ||
          !Span2D(q.height, q.height > 1 ? q.pitch : row_bytes, row_bytes, &span) || !Stream(q.stream, &s)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      if (!DeviceRange(q.dst, span)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->Memset(q.dst, q.value, q.elem_size, q.width, q.height, q.pitch, s);
      break;
    }
    case Op::kBatch: {
      size_t off = 0;
      while (off < len) {
        BatchEntry e;
        ORION_WANT(len - off >= sizeof e, "truncated Batch entry");
        std::memcpy(&e, payload + off, sizeof e);  // read once: the guest may change the bytes
        off += sizeof e;
        ORION_WANT(e.reserved == 0 && OpBatchable(e.op) && e.len <= len - off, "bad Batch entry");
        if (!CheckRequestShape(e.op, e.len, why)) {  // the checkpoint, for each entry as for a frame
          *why = std::string("entry ") + OpName(e.op) + ": " + *why;
          return false;
        }
        if (static_cast<Op>(e.op) == Op::kMemcpy2D) {
          // Window bytes do not travel with a batch (network transports): device to device only.
          const auto m = DecodeReq<Op::kMemcpy2D>(payload + off);
          ORION_WANT(m.src_side == kSideDevice && m.dst_side == kSideDevice, "Batch Memcpy2D with a window side");
        }
        FrameHeader sub = h;
        sub.op = e.op;
        sub.payload_len = e.len;
        sub.flags = 0;
        int32_t st = 0;
        std::vector<uint8_t> ignored;
        if (!Dispatch(sub, payload + off, &ignored, &st, why)) {
          *why = std::string("entry ") + OpName(e.op) + ": " + *why;
          return false;
        }
        if (st != 0 && r == CUDA_SUCCESS) r = static_cast<CUresult>(st);  // the first error, deferred
        off += std::min<size_t>((e.len + 7u) & ~size_t{7}, len - off);
      }
      break;
    }
    case Op::kArrayCreate: {
      const auto q = DecodeReq<Op::kArrayCreate>(payload);
      if (cur_ctx_ == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        break;
      }
      if (r = CheckArrayDesc(q, "ArrayCreate"); r != CUDA_SUCCESS) break;
      if (HandlesFull()) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      ArrayRec a = ArrayGeometry(q.format, q.channels, q.flags, q.width, q.height, q.depth);
      a.dev = cur_dev_;
      if (!Charge(cur_dev_, a.row_bytes * a.rows * a.slices, kAllocGranularity, "ArrayCreate", "cuArray3DCreate",
                  &a.charged)) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      Backend::ArraySpec spec{q.width, q.height, q.depth, q.format, q.channels, q.flags};
      r = b_->ArrayCreate(spec, &a.backend);
      if (r != CUDA_SUCCESS) {
        Uncharge(cur_dev_, a.charged);
        break;
      }
      const uint64_t id = next_handle_;
      next_handle_ += 0x10;
      arrays_.emplace(id, a);
      put(HandleRep{id});
      break;
    }
    case Op::kArrayDestroy: {
      const auto q = DecodeReq<Op::kArrayDestroy>(payload);
      ArrayRec* a = LiveArray(q.handle);
      if (a == nullptr || a->mipmap != 0) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }  // a level goes with its owner
      a->destroyed = true;
      MaybeFreeArray(q.handle);
      break;
    }
    case Op::kMipmappedArrayCreate: {
      const auto q = DecodeReq<Op::kMipmappedArrayCreate>(payload);
      if (cur_ctx_ == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        break;
      }
      const ArrayCreateReq& a = q.array;
      const uint64_t fb = FormatBytes(a.format);
      if ((a.flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0) {
        p_.log->warn("sess={} op=MipmappedArrayCreate: layered and cubemap mipmapped arrays are not served",
                     p_.session_id);
        r = CUDA_ERROR_NOT_SUPPORTED;
        break;
      }
      if (r = CheckArrayDesc(a, "MipmappedArrayCreate"); r != CUDA_SUCCESS) break;
      const uint64_t largest = std::max({a.width, a.height, a.depth});
      uint32_t max_levels = 1;
      while ((largest >> max_levels) != 0 && max_levels < 64) ++max_levels;
      if (q.reserved != 0 || q.levels == 0 || q.levels > max_levels) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      if (HandlesFull()) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      uint64_t bytes = 0;
      for (uint32_t l = 0; l < q.levels; ++l) {
        const uint64_t lw = std::max<uint64_t>(a.width >> l, 1), lh = std::max<uint64_t>(a.height >> l, 1),
                       ld = std::max<uint64_t>(a.depth >> l, 1);
        bytes += lw * fb * a.channels * lh * ld;  // bounded by the extents above: no overflow
      }
      MipmapRec m;
      m.dev = cur_dev_;
      m.format = a.format;
      m.channels = a.channels;
      m.flags = a.flags;
      m.levels = q.levels;
      m.width = a.width;
      m.height = a.height;
      m.depth = a.depth;
      m.level_ids.assign(q.levels, 0);
      if (!Charge(cur_dev_, bytes, kAllocGranularity, "MipmappedArrayCreate", "cuMipmappedArrayCreate", &m.charged)) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      Backend::ArraySpec spec{a.width, a.height, a.depth, a.format, a.channels, a.flags};
      r = b_->MipmappedArrayCreate(spec, q.levels, &m.backend);
      if (r != CUDA_SUCCESS) {
        Uncharge(cur_dev_, m.charged);
        break;
      }
      const uint64_t id = next_handle_;
      next_handle_ += 0x10;
      mipmaps_.emplace(id, std::move(m));
      put(HandleRep{id});
      break;
    }
    case Op::kMipmappedArrayGetLevel: {
      const auto q = DecodeReq<Op::kMipmappedArrayGetLevel>(payload);
      MipmapRec* m = LiveMipmap(q.mipmap);
      if (m == nullptr || q.reserved != 0) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      if (q.level >= m->levels) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      if (m->level_ids[q.level] == 0) {
        ArrayRec a = ArrayGeometry(m->format, m->channels, m->flags, std::max<uint64_t>(m->width >> q.level, 1),
                                   m->height != 0 ? std::max<uint64_t>(m->height >> q.level, 1) : 0,
                                   m->depth != 0 ? std::max<uint64_t>(m->depth >> q.level, 1) : 0);
        r = b_->MipmappedArrayGetLevel(m->backend, q.level, &a.backend);
        if (r != CUDA_SUCCESS) break;
        a.dev = m->dev;
        a.mipmap = q.mipmap;
        const uint64_t id = next_handle_;
        next_handle_ += 0x10;
        arrays_.emplace(id, a);
        m->level_ids[q.level] = id;
      }
      put(HandleRep{m->level_ids[q.level]});
      break;
    }
    case Op::kMipmappedArrayDestroy: {
      const auto q = DecodeReq<Op::kMipmappedArrayDestroy>(payload);
      MipmapRec* m = LiveMipmap(q.handle);
      if (m == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      m->destroyed = true;
      MaybeFreeMipmap(q.handle);
      break;
    }
    case Op::kMemcpyArray: {
      const auto q = DecodeReq<Op::kMemcpyArray>(payload);
      void* s = nullptr;
      if (q.width_bytes == 0 || q.height == 0) break;
      Backend::CopySide src, dst;
      if (!Stream(q.stream, &s) ||
          !CopySideOk(q.src_side, q.src, q.src_pitch, q.src_x, q.src_y, q.src_z, q.width_bytes, q.height, &src) ||
          !CopySideOk(q.dst_side, q.dst, q.dst_pitch, q.dst_x, q.dst_y, q.dst_z, q.width_bytes, q.height, &dst)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->MemcpyArray(dst, src, q.width_bytes, q.height, s);
      break;
    }
    case Op::kTexObjectCreate: {
      const auto q = DecodeReq<Op::kTexObjectCreate>(payload);
      if (cur_ctx_ == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        break;
      }
      Backend::TexSpec t;
      t.res_type = q.res_type;
      t.surface = q.surface != 0;
      t.filter_mode = q.filter_mode;
      t.flags = q.flags;
      for (int i = 0; i < 3; ++i) t.address_mode[i] = q.address_mode[i];
      for (int i = 0; i < 4; ++i) std::memcpy(&t.border_color[i], &q.border_color[i], 4);
      bool ok = q.surface <= 1 && q.reserved == 0 && q.filter_mode <= CU_TR_FILTER_MODE_LINEAR &&
                q.address_mode[0] <= CU_TR_ADDRESS_MODE_BORDER && q.address_mode[1] <= CU_TR_ADDRESS_MODE_BORDER &&
                q.address_mode[2] <= CU_TR_ADDRESS_MODE_BORDER;
      if ((q.flags & ~uint32_t{CU_TRSF_READ_AS_INTEGER | CU_TRSF_NORMALIZED_COORDINATES}) != 0) {
        p_.log->warn(
            "sess={} op=TexObjectCreate: texture flags {:#x} not served (sRGB, seamless cubemap, "
            "trilinear optimisation)",
            p_.session_id, q.flags);
        r = CUDA_ERROR_NOT_SUPPORTED;
        break;
      }
      uint64_t array_id = 0, texel = 0, mipmap_id = 0;
      uint32_t format = q.format;
      if (q.res_type == CU_RESOURCE_TYPE_ARRAY) {
        ArrayRec* a = LiveArray(q.res);
        // A surface needs an array made for surface load/store (CUDA: CUDA_ARRAY3D_SURFACE_LDST).
        ok = ok && a != nullptr && (!t.surface || (a->flags & CUDA_ARRAY3D_SURFACE_LDST) != 0);
        if (ok) {
          array_id = q.res;
          mipmap_id = a->mipmap;  // a level keeps its mipmapped array alive too
          t.array = a->backend;
          format = a->format;
          t.format = a->format;
          t.channels = a->channels;
        }
      } else if (!t.surface && q.res_type == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY) {
        MipmapRec* m = LiveMipmap(q.res);
        ok = ok && m != nullptr && q.mipmap_filter <= CU_TR_FILTER_MODE_LINEAR && q.max_anisotropy <= 16;
        if (ok) {
          mipmap_id = q.res;
          t.mipmap = m->backend;
          format = m->format;
          t.format = m->format;
          t.channels = m->channels;
          t.mipmap_filter = q.mipmap_filter;
          t.max_anisotropy = q.max_anisotropy;
          std::memcpy(&t.mipmap_bias, &q.mipmap_bias, 4);
          std::memcpy(&t.min_level, &q.min_level, 4);
          std::memcpy(&t.max_level, &q.max_level, 4);
        }
      } else if (!t.surface && (q.res_type == CU_RESOURCE_TYPE_LINEAR || q.res_type == CU_RESOURCE_TYPE_PITCH2D)) {
        texel = FormatBytes(q.format) * q.channels;
        uint64_t span = 0;
        ok = ok && texel != 0 && (q.channels == 1 || q.channels == 2 || q.channels == 4) && q.width != 0;
        if (q.res_type == CU_RESOURCE_TYPE_LINEAR) {
          ok = ok && q.width <= kMaxTexLinear && q.height == 0 && q.pitch == 0 && CheckedMul(q.width, texel, &span);
        } else {
          ok = ok && q.width <= kMaxArray2DW && q.height != 0 && q.height <= kMaxArray2DH &&
               q.pitch >= q.width * texel && Span2D(q.height, q.pitch, q.width * texel, &span);
        }
        ok = ok && q.res % texel == 0 && DeviceRange(q.res, span);
        t.dptr = q.res;
        t.width = q.width;
        t.height = q.height;
        t.pitch = q.pitch;
        t.format = q.format;
        t.channels = q.channels;
      } else {
        ok = false;
      }
      // Linear filtering returns interpolated floats: not for 32-bit integers nor integer reads.
      if (ok && !t.surface && q.filter_mode == CU_TR_FILTER_MODE_LINEAR &&
          (IntegerFormat32(format) || (q.flags & CU_TRSF_READ_AS_INTEGER) != 0)) {
        ok = false;
      }
      if (!ok) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      if (HandlesFull()) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      uint64_t object = 0;
      r = b_->TexObjectCreate(t, &object);
      if (r != CUDA_SUCCESS) break;
      if (!texobjs_.emplace(std::make_pair(object, t.surface), TexRec{array_id, mipmap_id, cur_dev_}).second) {
        p_.log->error("sess={} op=TexObjectCreate: the backend returned object {:#x} twice", p_.session_id, object);
        (void)b_->TexObjectDestroy(object, t.surface);
        r = CUDA_ERROR_UNKNOWN;
        break;
      }
      if (array_id != 0) ++arrays_[array_id].objects;
      if (mipmap_id != 0) ++mipmaps_[mipmap_id].objects;
      put(U64Rep{object});
      break;
    }
    case Op::kTexObjectDestroy: {
      const auto q = DecodeReq<Op::kTexObjectDestroy>(payload);
      auto it = q.surface <= 1 ? texobjs_.find({q.object, q.surface != 0}) : texobjs_.end();
      if (it == texobjs_.end()) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->TexObjectDestroy(q.object, q.surface != 0);
      if (r != CUDA_SUCCESS) break;
      const uint64_t array_id = it->second.array, mipmap_id = it->second.mipmap;
      texobjs_.erase(it);
      if (array_id != 0) {
        --arrays_[array_id].objects;
        MaybeFreeArray(array_id);
      }
      if (mipmap_id != 0) {
        --mipmaps_[mipmap_id].objects;
        MaybeFreeMipmap(mipmap_id);
      }
      break;
    }
    case Op::kMemAddressReserve: {
      const auto q = DecodeReq<Op::kMemAddressReserve>(payload);
      const bool pow2 = q.alignment == 0 || (q.alignment & (q.alignment - 1)) == 0;
      uint64_t total = 0;
      if (q.bytes == 0 || q.bytes % kVmmGranularity != 0 || !pow2 || q.alignment > (uint64_t{1} << 40)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      if (!CheckedAdd(reserved_bytes_, q.bytes, &total) || total > kMaxReservedBytes || HandlesFull()) {
        p_.log->warn("sess={} op=MemAddressReserve: {} MiB more would exceed the session's {} TiB of address space",
                     p_.session_id, q.bytes >> 20, kMaxReservedBytes >> 40);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      uint64_t addr = 0;
      r = b_->MemAddressReserve(q.bytes, q.alignment, q.fixed_addr, &addr);
      if (r == CUDA_SUCCESS) {
        reservations_[addr] = Reservation{q.bytes};
        reserved_bytes_ = total;
        put(U64Rep{addr});
      }
      break;
    }
    case Op::kMemAddressFree: {
      const auto q = DecodeReq<Op::kMemAddressFree>(payload);
      auto it = reservations_.find(q.addr);
      // The whole reservation, with nothing mapped in it any more.
      if (it == reservations_.end() || it->second.bytes != q.bytes || it->second.mappings != 0) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->MemAddressFree(q.addr, q.bytes);
      if (r == CUDA_SUCCESS) {
        reserved_bytes_ -= q.bytes;
        reservations_.erase(it);
      }
      break;
    }
    case Op::kMemCreate: {
      const auto q = DecodeReq<Op::kMemCreate>(payload);
      if (q.device >= p_.placements.size() || q.bytes == 0 || q.bytes % kVmmGranularity != 0 || q.flags != 0) {
        r = q.device >= p_.placements.size() ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE;
        break;
      }
      if (HandlesFull()) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      uint64_t charged = 0;
      if (!Charge(q.device, q.bytes, kVmmGranularity, "MemCreate", "cuMemCreate", &charged)) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      void* backend_handle = nullptr;
      r = b_->MemCreate(q.device, q.bytes, &backend_handle);
      if (r != CUDA_SUCCESS) {
        Uncharge(q.device, charged);
        break;
      }
      const uint64_t pid = next_physical_++;
      physicals_[pid] = Physical{backend_handle, q.bytes, q.device};
      Obj o{Kind::kMemHandle, backend_handle, q.device, pid, {}};
      o.bytes = q.bytes;
      put(HandleRep{AddHandle(std::move(o))});
      break;
    }
    case Op::kMemRelease: {
      const auto q = DecodeReq<Op::kMemRelease>(payload);
      Obj* o = Find(q.handle, Kind::kMemHandle);
      if (o == nullptr) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      const uint64_t pid = o->owner;
      r = b_->MemRelease(o->backend);
      if (r != CUDA_SUCCESS) break;
      handles_.erase(q.handle);
      physicals_[pid].released = true;
      MaybeFreePhysical(pid);
      break;
    }
    case Op::kMemMap: {
      const auto q = DecodeReq<Op::kMemMap>(payload);
      Obj* o = Find(q.handle, Kind::kMemHandle);
      if (o == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      auto res = ReservationOf(q.addr, q.bytes);
      const bool aligned = q.bytes != 0 && (q.addr | q.bytes | q.offset) % kVmmGranularity == 0;
      if (!aligned || res == reservations_.end() || q.offset > o->bytes || q.bytes > o->bytes - q.offset) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      // Nothing mapped in the range yet.
      auto after = mappings_.lower_bound(q.addr);
      const bool overlaps =
          (after != mappings_.end() && after->first < q.addr + q.bytes) ||
          (after != mappings_.begin() && std::prev(after)->first + std::prev(after)->second.bytes > q.addr);
      if (overlaps) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      const uint64_t pid = o->owner;
      r = b_->MemMap(q.addr, q.bytes, q.offset, o->backend);
      if (r != CUDA_SUCCESS) break;
      mappings_[q.addr] = Mapping{q.bytes, pid};
      ++res->second.mappings;
      ++physicals_[pid].mappings;
      break;
    }
    case Op::kMemUnmap: {
      const auto q = DecodeReq<Op::kMemUnmap>(payload);
      std::map<uint64_t, Mapping>::iterator first, it;
      if (!WholeMappings(q.addr, q.bytes, &first, &it)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->MemUnmap(q.addr, q.bytes);
      if (r != CUDA_SUCCESS) break;
      auto res = ReservationOf(q.addr, q.bytes);
      for (auto m = first; m != it;) {
        allocs_.erase(m->first);
        const uint64_t pid = m->second.physical;
        --physicals_[pid].mappings;
        if (res != reservations_.end()) --res->second.mappings;
        m = mappings_.erase(m);
        MaybeFreePhysical(pid);
      }
      break;
    }
    case Op::kMemSetAccess: {
      const auto q = DecodeReq<Op::kMemSetAccess>(payload);
      if (q.device >= p_.placements.size()) {
        r = CUDA_ERROR_INVALID_DEVICE;
        break;
      }
      if (q.flags > CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      std::map<uint64_t, Mapping>::iterator first, it;
      if (!WholeMappings(q.addr, q.bytes, &first, &it)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->MemSetAccess(q.addr, q.bytes, q.device, q.flags);
      if (r != CUDA_SUCCESS) break;
      const bool on = q.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE;
      for (auto m = first; m != it; ++m) {
        m->second.accessible = on;
        if (on) {
          Alloc a{m->second.bytes, physicals_[m->second.physical].dev, false};
          a.vmm = true;
          allocs_[m->first] = a;
        } else {
          allocs_.erase(m->first);
        }
      }
      break;
    }
    case Op::kIpcGetMemHandle: {
      const auto q = DecodeReq<Op::kIpcGetMemHandle>(payload);
      // The start of one of this session's own allocations (cuMemAlloc'ed: not imported, not VMM).
      auto it = allocs_.find(q.dptr);
      if (it == allocs_.end() || !it->second.counted) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      if (ipc_exports_.count(q.dptr) == 0 && ipc_exports_.size() >= kMaxIpcExports) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      IpcHandle handle{};
      r = b_->IpcExportMemory(q.dptr, it->second.bytes, &handle);
      if (r != CUDA_SUCCESS) break;
      ipc_exports_.insert(q.dptr);
      put(handle);
      break;
    }
    case Op::kIpcOpenMemHandle: {
      const auto q = DecodeReq<Op::kIpcOpenMemHandle>(payload);
      if (cur_ctx_ == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        break;
      }
      SweepIpc(true);
      // A session paying for imports whose exporters are gone past its quota opens no more.
      if (ipc_imports_.size() >= kMaxIpcImports ||
          used_[cur_dev_] + overhead_[cur_dev_] > p_.placements[cur_dev_].quota_bytes) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      IpcHandle handle{};
      std::memcpy(&handle, q.handle, sizeof handle);
      uint64_t dptr = 0, bytes = 0;
      r = b_->IpcImportMemory(handle, &dptr, &bytes);
      if (r != CUDA_SUCCESS) {
        p_.log->warn("sess={} op=IpcOpenMemHandle refused: {}", p_.session_id, LogSafe(b_->ErrorDetail()));
        break;
      }
      allocs_[dptr] = {std::max<uint64_t>(bytes, 1), cur_dev_, false};  // charged to the exporter
      ipc_imports_.insert(dptr);
      put(IpcOpenRep{dptr, bytes});
      break;
    }
    case Op::kIpcCloseMemHandle: {
      const auto q = DecodeReq<Op::kIpcCloseMemHandle>(payload);
      if (ipc_imports_.count(q.dptr) == 0) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->IpcCloseMemory(q.dptr);
      if (r == CUDA_SUCCESS) {
        if (auto a = adopted_.find(q.dptr); a != adopted_.end()) {
          Uncharge(allocs_[q.dptr].dev, a->second);
          adopted_.erase(a);
        }
        ipc_imports_.erase(q.dptr);
        allocs_.erase(q.dptr);
      }
      break;
    }
    case Op::kIpcGetEventHandle: {
      const auto q = DecodeReq<Op::kIpcGetEventHandle>(payload);
      Obj* e = Find(q.handle, Kind::kEvent);
      if (e == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      // Each exported event holds a ticket (an fd in this worker): bounded like memory exports.
      if (ipc_event_exports_.count(q.handle) == 0 && ipc_event_exports_.size() >= kMaxIpcExports) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      IpcHandle handle{};
      r = b_->IpcExportEvent(e->backend, &handle);
      if (r == CUDA_SUCCESS) {
        ipc_event_exports_.insert(q.handle);
        put(handle);
      }
      break;
    }
    case Op::kIpcOpenEventHandle: {
      const auto q = DecodeReq<Op::kIpcOpenEventHandle>(payload);
      if (cur_ctx_ == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        break;
      }
      if (HandlesFull()) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      IpcHandle handle{};
      std::memcpy(&handle, q.handle, sizeof handle);
      void* ev = nullptr;
      r = b_->IpcImportEvent(handle, &ev);
      if (r != CUDA_SUCCESS) {
        p_.log->warn("sess={} op=IpcOpenEventHandle refused: {}", p_.session_id, LogSafe(b_->ErrorDetail()));
        break;
      }
      put(HandleRep{AddHandle({Kind::kEvent, ev, cur_dev_, cur_ctx_, {}})});
      break;
    }
    case Op::kHostGetDevicePointer: {
      const auto q = DecodeReq<Op::kHostGetDevicePointer>(payload);
      if (q.bytes == 0 || !WindowRange(q.window_offset, q.bytes) || q.window_offset < layout_.staging_bytes) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      uint64_t dptr = 0;
      r = b_->HostGetDevicePointer(window_ + q.window_offset, q.bytes, q.host_address, &dptr);
      if (q.host_address != 0 && b_->SameAddressMapping() && (r != CUDA_SUCCESS || dptr != q.host_address) &&
          !same_address_warned_) {
        same_address_warned_ = true;  // once per session: the client then translates in copies
        p_.log->warn("sess={} op=HostGetDevicePointer: not mapped at the client's address {:#x}: {}", p_.session_id,
                     q.host_address, LogSafe(b_->ErrorDetail()));
      }
      if (r == CUDA_SUCCESS) {
        // At the client's own address, the range may overlap window mappings of memory the client
        // has since freed (and the backend merged or dropped them): those records go.
        if (dptr == q.host_address) {
          auto it = allocs_.upper_bound(dptr);
          if (it != allocs_.begin()) --it;
          while (it != allocs_.end() && it->first < dptr + q.bytes) {
            if (it->first + it->second.bytes > dptr && it->second.window) {
              it = allocs_.erase(it);
            } else {
              ++it;
            }
          }
        }
        Alloc a{q.bytes, cur_dev_, false};
        a.window = true;
        allocs_[dptr] = a;
        put(U64Rep{dptr});
      }
      break;
    }

    case Op::kModuleLoad: {
      const auto q = DecodeReq<Op::kModuleLoad>(payload);
      if (q.image_bytes == 0 || q.image_bytes > fatbin::kMaxDecompressedBytes) {
        r = CUDA_ERROR_INVALID_IMAGE;
        break;
      }
      const std::vector<uint8_t>* img = images_.Find(q.hash_lo, q.hash_hi, q.image_bytes);
      if (img == nullptr) {
        r = static_cast<CUresult>(kStatusNeedBytes);
        break;
      }
      auto size = fatbin::ImageSize(img->data(), img->size());
      if (!size.ok() || *size > img->size()) {
        r = CUDA_ERROR_INVALID_IMAGE;
        break;
      }
      if (HandlesFull()) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      void* mod = nullptr;
      r = b_->ModuleLoad(std::span<const uint8_t>(img->data(), img->size()), &mod);
      if (r == CUDA_SUCCESS) {
        put(ModuleLoadRep{AddHandle({Kind::kModule, mod, cur_dev_, cur_ctx_, {}}), 0, 0});
        // It parsed: into the host's cache, and out of this worker's memory (the backend has it).
        const std::string hex = ModuleImages::Hex(q.hash_lo, q.hash_hi);
        images_.Cache(hex, *img);
        images_.Drop(hex);
      } else {
        p_.log->info("sess={} op=ModuleLoad image {} refused ({}): {}", p_.session_id,
                     ModuleImages::Hex(q.hash_lo, q.hash_hi), static_cast<int>(r), b_->ErrorDetail());
      }
      break;
    }
    case Op::kBlobPut: {
      const auto q = DecodeReq<Op::kBlobPut>(payload);
      if (q.image_bytes == 0 || q.image_bytes > fatbin::kMaxDecompressedBytes || q.offset > q.image_bytes ||
          q.bytes > q.image_bytes - q.offset || !WindowRange(q.window_offset, q.bytes)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      const std::string hex = ModuleImages::Hex(q.hash_lo, q.hash_hi);
      if (q.offset == 0) {
        upload_hex_ = hex;
        upload_.assign(q.image_bytes, 0);
        upload_received_ = 0;
      }
      if (hex != upload_hex_ || upload_.size() != q.image_bytes || q.offset != upload_received_) {
        r = CUDA_ERROR_INVALID_VALUE;  // chunks must arrive in order, for one image at a time
        break;
      }
      std::memcpy(upload_.data() + q.offset, window_ + q.window_offset, q.bytes);
      upload_received_ += q.bytes;
      if (upload_received_ == upload_.size()) {
        const XXH128_hash_t got = XXH3_128bits(upload_.data(), upload_.size());
        if (got.low64 != q.hash_lo || got.high64 != q.hash_hi) {
          r = CUDA_ERROR_INVALID_IMAGE;  // the bytes do not match the claimed hash
        } else {
          images_.Hold(hex, std::move(upload_));
        }
        upload_.clear();
        upload_hex_.clear();
      }
      break;
    }
    case Op::kModuleUnload: {
      const auto q = DecodeReq<Op::kModuleUnload>(payload);
      Obj* o = Find(q.handle, Kind::kModule);
      if (o == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      r = b_->ModuleUnload(o->backend);
      if (auto mf = module_functions_.find(q.handle); mf != module_functions_.end()) {
        for (uint64_t fid : mf->second) {
          if (auto it = handles_.find(fid); it != handles_.end()) {
            function_ids_.erase(it->second.backend);
            handles_.erase(it);
          }
        }
        module_functions_.erase(mf);
      }
      handles_.erase(q.handle);
      break;
    }
    case Op::kModuleGetFunction:
    case Op::kModuleGetGlobal: {
      const auto q = DecodeReq<Op::kModuleGetFunction>(payload);
      std::string name;
      ORION_WANT(Name(payload, len, q, &name), "bad ModuleGetFunction/Global");
      Obj* o = Find(q.module, Kind::kModule);
      if (o == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      if (static_cast<Op>(h.op) == Op::kModuleGetGlobal) {
        uint64_t dptr = 0, bytes = 0;
        r = b_->ModuleGetGlobal(o->backend, name.c_str(), &dptr, &bytes);
        if (r == CUDA_SUCCESS) {
          if (!DeviceRange(dptr, bytes)) allocs_[dptr] = {std::max<uint64_t>(bytes, 1), o->dev, false};
          put(GlobalRep{dptr, bytes});
        }
        break;
      }
      void* fn = nullptr;
      KernelLayout layout;
      r = b_->ModuleGetFunction(o->backend, name.c_str(), &fn, &layout);
      if (r != CUDA_SUCCESS) break;
      if (layout.params.size() > kMaxKernelParams) {
        r = CUDA_ERROR_NOT_SUPPORTED;
        break;
      }
      // A function asked for again gets its handle again (one lookup: libraries like cuDNN ask for
      // thousands of kernels, and a scan of every handle per call made start-up quadratic).
      uint64_t id = 0;
      if (auto known = function_ids_.find(fn); known != function_ids_.end()) id = known->second;
      if (id == 0 && HandlesFull()) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      if (id == 0) {
        id = AddHandle({Kind::kFunction, fn, o->dev, q.module, layout});
        function_ids_[fn] = id;
        module_functions_[q.module].push_back(id);
      }
      put(FunctionRep{id, static_cast<uint32_t>(layout.params.size()), layout.param_bytes,
                      static_cast<int32_t>(layout.launch_error), layout.launch_refusal});
      for (const ParamInfo& pi : layout.params) put(pi);
      break;
    }
    case Op::kModuleFunctionName: {
      const auto q = DecodeReq<Op::kModuleFunctionName>(payload);
      Obj* o = Find(q.module, Kind::kModule);
      if (o == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      std::vector<std::string> names;
      r = b_->ModuleFunctionNames(o->backend, &names);
      if (r != CUDA_SUCCESS) break;
      ModuleFunctionNameRep rep{static_cast<uint32_t>(std::min<size_t>(names.size(), UINT32_MAX - 1)), 0};
      if (q.index == kModuleFunctionCountOnly) {
        put(rep);
        break;
      }
      if (q.index >= rep.count) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      const std::string& n = names[q.index];
      if (n.empty() || n.size() >= 4 * kNameLen) {
        r = CUDA_ERROR_NOT_SUPPORTED;
        break;
      }  // as ModuleGetFunction
      rep.name_len = static_cast<uint32_t>(n.size() + 1);
      put(rep);
      reply->insert(reply->end(), n.c_str(), n.c_str() + n.size() + 1);
      break;
    }
    case Op::kFuncGetAttribute:
    case Op::kFuncSetAttribute: {
      const auto q = DecodeReq<Op::kFuncGetAttribute>(payload);
      Obj* o = Find(q.function, Kind::kFunction);
      if (o == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      if (static_cast<Op>(h.op) == Op::kFuncSetAttribute) {
        r = b_->FuncSetAttribute(o->backend, q.attribute, q.value);
      } else {
        int v = 0;
        r = b_->FuncGetAttribute(o->backend, q.attribute, &v);
        put(I32Rep{v, 0});
      }
      break;
    }
    case Op::kLaunchKernel:
    case Op::kLaunchKernelEx: {
      const bool ex = static_cast<Op>(h.op) == Op::kLaunchKernelEx;
      LaunchExReq x{};
      x.cluster[0] = x.cluster[1] = x.cluster[2] = 1;
      const uint32_t head = ex ? sizeof(LaunchExReq) : sizeof(LaunchReq);
      std::memcpy(&x, payload, head);  // the checkpoint saw at least `head` bytes (ops.def: kHead)
      const LaunchReq& q = x.base;
      uint64_t want_len = 0;
      ORION_WANT(CheckedAdd(head, q.param_bytes, &want_len) && len == want_len, "bad LaunchKernel");
      Obj* f = Find(q.function, Kind::kFunction);
      void* s = nullptr;
      if (f == nullptr || !Stream(q.stream, &s)) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      if (q.param_bytes != f->layout.param_bytes) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      if ((x.flags & ~kLaunchCooperative) != 0) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      // Local and shared memory a launch holds while it runs, charged to the quota like a GPU's
      // local-memory reservation: it grows to the largest launch and stays until the session ends.
      if (const uint64_t need = b_->LaunchScratchBytes(f->backend, q.block, q.shared_mem_bytes);
          need > scratch_[cur_dev_]) {
        uint64_t c = 0;
        if (!Charge(cur_dev_, need - scratch_[cur_dev_], kAllocGranularity, "LaunchKernel",
                    "cuLaunchKernel (local and shared memory)", &c)) {
          r = CUDA_ERROR_OUT_OF_MEMORY;
          break;
        }
        scratch_[cur_dev_] += c;
      }
      b_->UseComputeGate(cur_dev_ < gates_.size() ? gates_[cur_dev_].get() : nullptr);
      r = b_->LaunchKernel(f->backend, q.grid, q.block, q.shared_mem_bytes, s, payload + head, q.param_bytes, x.cluster,
                           x.flags);
      for (const std::string& note : b_->TakeNotices()) {
        p_.log->warn("sess={} {}", p_.session_id, note);
        if (notices_.size() < kMaxPendingNotices) notices_ += note.substr(0, 1024) + "\n";  // for the client's log
      }
      break;
    }
    case Op::kOccupancyMaxClusters: {
      const auto q = DecodeReq<Op::kOccupancyMaxClusters>(payload);
      Obj* f = Find(q.function, Kind::kFunction);
      if (f == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      int n = 0;
      r = b_->OccupancyMaxClusters(f->backend, q.grid, q.block, q.shared_mem_bytes, q.cluster, &n);
      put(I32Rep{n, 0});
      break;
    }
    case Op::kOccupancyAvailableSmem: {
      const auto q = DecodeReq<Op::kOccupancyAvailableSmem>(payload);
      Obj* f = Find(q.function, Kind::kFunction);
      if (f == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      uint64_t bytes = 0;
      r = q.num_blocks <= 0 || q.block_size <= 0
              ? CUDA_ERROR_INVALID_VALUE
              : b_->OccupancyAvailableSmem(f->backend, q.num_blocks, q.block_size, &bytes);
      put(U64Rep{bytes});
      break;
    }
    case Op::kOccupancyMaxBlocks: {
      const auto q = DecodeReq<Op::kOccupancyMaxBlocks>(payload);
      Obj* f = Find(q.function, Kind::kFunction);
      if (f == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      int blocks = 0;
      r = q.block_size == 0 ? CUDA_ERROR_INVALID_VALUE
                            : b_->OccupancyMaxBlocks(f->backend, q.block_size, q.dynamic_smem, q.flags, &blocks);
      put(I32Rep{blocks, 0});
      break;
    }

    case Op::kStreamCreate: {
      const auto q = DecodeReq<Op::kStreamCreate>(payload);
      if (cur_ctx_ == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        break;
      }
      if (HandlesFull()) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      void* s = nullptr;
      r = b_->StreamCreate(q.flags, q.priority, &s);
      if (r == CUDA_SUCCESS) put(HandleRep{AddHandle({Kind::kStream, s, cur_dev_, cur_ctx_, {}})});
      break;
    }
    case Op::kStreamDestroy:
    case Op::kStreamSynchronize:
    case Op::kStreamQuery: {
      const auto q = DecodeReq<Op::kStreamDestroy>(payload);
      void* s = nullptr;
      if (!Stream(q.handle, &s) || (static_cast<Op>(h.op) == Op::kStreamDestroy && q.handle == 0)) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      switch (static_cast<Op>(h.op)) {
        case Op::kStreamDestroy:
          r = b_->StreamDestroy(s);
          if (r == CUDA_SUCCESS) handles_.erase(q.handle);
          break;
        case Op::kStreamSynchronize: r = b_->StreamSynchronize(s); break;
        default: r = b_->StreamQuery(s); break;
      }
      break;
    }
    case Op::kStreamAttribute: {
      const auto q = DecodeReq<Op::kStreamAttribute>(payload);
      void* s = nullptr;
      if (!Stream(q.stream, &s)) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      StreamAttrRep rep{};
      std::memcpy(rep.value, q.value, sizeof rep.value);
      if (q.set > 1 || !StreamAttrValid(q.attr, q.set != 0, rep.value)) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = b_->StreamAttribute(s, q.attr, q.set != 0, rep.value);
      if (r == CUDA_SUCCESS) put(rep);
      break;
    }
    case Op::kTensorMapEncodeTiled: {
      const auto q = DecodeReq<Op::kTensorMapEncodeTiled>(payload);
      const char* bad = "";
      const bool ok = TensorMapValid(q, &bad);
      TensorMapRep rep{};
      r = EncodeTensorMap(
          "cuTensorMapEncodeTiled", ok, bad, q.global_address,
          [&](uint64_t* out) { return b_->TensorMapEncodeTiled(q, out); }, &rep);
      if (r == CUDA_SUCCESS) put(rep);
      break;
    }
    case Op::kTensorMapEncodeIm2col: {
      const auto q = DecodeReq<Op::kTensorMapEncodeIm2col>(payload);
      const char* bad = "";
      const bool ok = Im2colValid(q, &bad);
      TensorMapRep rep{};
      r = EncodeTensorMap(
          "cuTensorMapEncodeIm2col", ok, bad, q.base.global_address,
          [&](uint64_t* out) { return b_->TensorMapEncodeIm2col(q, out); }, &rep);
      if (r == CUDA_SUCCESS) put(rep);
      break;
    }
    case Op::kTensorMapReplaceAddress: {
      const auto q = DecodeReq<Op::kTensorMapReplaceAddress>(payload);
      // The map's own requirements still hold at the new address only if it is as aligned as the
      // driver asks of any map (16 bytes; the driver checks 32-byte ones itself).
      if (q.global_address % 16 != 0 || !DeviceRange(q.global_address, 1)) {
        p_.log->warn(
            "sess={} cuTensorMapReplaceAddress refused: {:#x} is not 16-byte aligned device memory of "
            "this session",
            p_.session_id, q.global_address);
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      TensorMapRep rep{};
      r = b_->TensorMapReplaceAddress(q.map, q.global_address, rep.opaque);
      if (r == CUDA_SUCCESS) put(rep);
      break;
    }
    case Op::kStreamWaitEvent: {
      const auto q = DecodeReq<Op::kStreamWaitEvent>(payload);
      void* s = nullptr;
      Obj* e = Find(q.event, Kind::kEvent);
      if (e == nullptr || !Stream(q.stream, &s)) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      r = b_->StreamWaitEvent(s, e->backend, q.flags);
      break;
    }
    case Op::kEventCreate: {
      const auto q = DecodeReq<Op::kEventCreate>(payload);
      if (cur_ctx_ == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        break;
      }
      if (HandlesFull()) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      void* e = nullptr;
      r = b_->EventCreate(q.flags, &e);
      if (r == CUDA_SUCCESS) put(HandleRep{AddHandle({Kind::kEvent, e, cur_dev_, cur_ctx_, {}})});
      break;
    }
    case Op::kEventDestroy:
    case Op::kEventSynchronize:
    case Op::kEventQuery: {
      const auto q = DecodeReq<Op::kEventDestroy>(payload);
      Obj* e = Find(q.handle, Kind::kEvent);
      if (e == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      switch (static_cast<Op>(h.op)) {
        case Op::kEventDestroy:
          r = b_->EventDestroy(e->backend);
          if (r == CUDA_SUCCESS) {
            handles_.erase(q.handle);
            ipc_event_exports_.erase(q.handle);
          }
          break;
        case Op::kEventSynchronize: r = b_->EventSynchronize(e->backend); break;
        default: r = b_->EventQuery(e->backend); break;
      }
      break;
    }
    case Op::kEventRecord: {
      const auto q = DecodeReq<Op::kEventRecord>(payload);
      Obj* e = Find(q.event, Kind::kEvent);
      void* s = nullptr;
      if (e == nullptr || !Stream(q.stream, &s)) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      r = b_->EventRecord(e->backend, s);
      break;
    }
    case Op::kEventElapsedTime: {
      const auto q = DecodeReq<Op::kEventElapsedTime>(payload);
      Obj* a = Find(q.start, Kind::kEvent);
      Obj* b = Find(q.end, Kind::kEvent);
      if (a == nullptr || b == nullptr) {
        r = CUDA_ERROR_INVALID_HANDLE;
        break;
      }
      F32Rep rep{0, 0};
      r = b_->EventElapsedTime(a->backend, b->backend, &rep.ms);
      put(rep);
      break;
    }
    default: ORION_WANT(false, "unknown op " + std::to_string(h.op));
  }
  *status = static_cast<int32_t>(r);
  return true;
}

// The guest sees the features Orion serves, whatever the GPU behind it has: virtual memory
// management (the MemAddressReserve.. ops) and stream-ordered memory pools (the guest runtime
// serves them over MemAlloc/MemFree) are there; shareable (IPC, fabric)
// handles are not. Attribute ids: CUdevice_attribute, <cuda.h>.
//
// Host memory: on a network channel there is no memory both ends address, so nothing is mapped
// (CAN_MAP_HOST_MEMORY = 0). On a shared-memory channel to a backend that maps the pinned heap at the
// program's own addresses (`same_address`, Backend::SameAddressMapping), a pinned or registered
// host pointer is its own device pointer (CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 1), and
// managed memory is served from that heap (MANAGED_MEMORY = 1; not CONCURRENT_MANAGED_ACCESS: the
// pre-Pascal rules stay the contract, docs/spec/managed-memory.md).
void ClampServedFeatures(DeviceInfo* info, bool network, bool same_address) {
  auto set = [&](int a, int v) {
    if (a > 0 && a < static_cast<int>(kMaxDeviceAttributes)) info->attributes[a] = v;
  };
  set(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1);
  set(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1);
  set(CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0);
  set(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0);
  const bool mapped_at_host_address = !network && same_address;
  if (network) set(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 0);
  set(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, mapped_at_host_address ? 1 : 0);
  set(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, mapped_at_host_address ? 1 : 0);
  set(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0);
  set(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0);
  set(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, 0);
  set(CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST, 0);
}

CUresult Session::CheckArrayDesc(const ArrayCreateReq& q, const char* op) {
  const uint32_t served = CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP;
  if (FormatBytes(q.format) == 0 || (q.flags & ~served) != 0) {
    p_.log->warn(
        "sess={} op={}: format {:#x} / flags {:#x} not served (texture-gather, sparse, deferred-mapping, "
        "planar and block-compressed arrays are not)",
        p_.session_id, op, q.format, q.flags);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const bool channels_ok = q.channels == 1 || q.channels == 2 || q.channels == 4;
  if ((q.flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0) {
    // Depth counts the layers (x 6 faces for a cubemap); a cubemap's faces are square.
    const bool layered = (q.flags & CUDA_ARRAY3D_LAYERED) != 0, cube = (q.flags & CUDA_ARRAY3D_CUBEMAP) != 0;
    const bool ok =
        q.width != 0 && q.width <= kMaxLayeredW && q.reserved == 0 && q.depth != 0 &&
        (cube ? q.height == q.width && q.depth % 6 == 0 && (layered ? q.depth / 6 <= kMaxCubeLayers : q.depth == 6)
              : q.height <= kMaxLayeredW && q.depth <= kMaxLayers);
    return ok && channels_ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  const uint32_t dims = q.depth != 0 ? 3 : q.height != 0 ? 2 : 1;
  const bool extents_ok = q.width != 0 && q.reserved == 0 &&
                          (dims == 1   ? q.width <= kMaxArray1D
                           : dims == 2 ? q.width <= kMaxArray2DW && q.height <= kMaxArray2DH
                                       : q.width <= kMaxArray3D && q.height <= kMaxArray3D && q.depth <= kMaxArray3D);
  return extents_ok && (q.channels == 1 || q.channels == 2 || q.channels == 4) ? CUDA_SUCCESS
                                                                               : CUDA_ERROR_INVALID_VALUE;
}

bool Session::CopySideOk(uint32_t side, uint64_t at, uint64_t pitch, uint64_t x, uint64_t y, uint64_t z, uint64_t width,
                         uint64_t height, Backend::CopySide* out) {
  out->kind = side;
  if (side == kSideArray) {
    const ArrayRec* a = LiveArray(at);
    uint64_t x_end = 0, y_end = 0;
    // Whole elements, inside one slice of the array.
    if (a == nullptr || pitch != 0 || x % a->texel != 0 || width % a->texel != 0 || !CheckedAdd(x, width, &x_end) ||
        x_end > a->row_bytes || !CheckedAdd(y, height, &y_end) || y_end > a->rows || z >= a->slices) {
      return false;
    }
    out->array = a->backend;
    out->x = x;
    out->y = y;
    out->z = z;
    return true;
  }
  uint64_t span = 0;
  if ((side != kSideDevice && side != kSideWindow) || x != 0 || y != 0 || z != 0 ||
      !Span2D(height, pitch, width, &span)) {
    return false;
  }
  out->pitch = pitch;
  if (side == kSideWindow) {
    if (!WindowRange(at, span)) return false;
    out->host = window_ + at;
    return true;
  }
  out->dptr = at;
  return DeviceRange(at, span);
}

void Session::SweepIpc(bool now) {
  if (lingering_.empty() && ipc_imports_.size() == adopted_.size()) return;
  const auto t = std::chrono::steady_clock::now();
  if (!now && t - ipc_swept_ < std::chrono::milliseconds(50)) return;  // at most 20 sweeps a second
  ipc_swept_ = t;
  for (auto it = lingering_.begin(); it != lingering_.end();) {
    if (IpcTicketImported(it->fd)) {
      ++it;
      continue;
    }
    ::close(it->fd);
    Uncharge(it->dev, it->charged);
    p_.log->info("sess={} an IPC allocation freed earlier is closed by its last importer: {} MB back to the quota",
                 p_.session_id, it->charged >> 20);
    it = lingering_.erase(it);
  }
  for (const uint64_t dptr : ipc_imports_) {
    if (adopted_.count(dptr) != 0) continue;
    const int fd = b_->IpcTicketFd(dptr);
    auto a = allocs_.find(dptr);
    if (fd < 0 || a == allocs_.end() || IpcExporterHolds(fd)) continue;
    adopted_[dptr] = ChargeOver(a->second.dev, a->second.bytes);
    p_.log->warn("sess={} IPC import {:#x} ({} MB) outlived its exporter's session: charged to this session's quota",
                 p_.session_id, dptr, adopted_[dptr] >> 20);
  }
}

bool Session::Charge(uint32_t dev, uint64_t bytes, uint64_t granule, const char* op, const char* call,
                     uint64_t* charged) {
  SweepIpc(!lingering_.empty());  // a free of this session's waiting on its importers counts at once
  const Placement& pl = p_.placements[dev];
  uint64_t c = 0, after = 0;
  bool fits = CheckedAdd(bytes, granule - 1, &c);
  c &= ~(granule - 1);
  fits = fits && CheckedAdd(used_[dev] + overhead_[dev], c, &after) && after <= pl.quota_bytes;
  // On a hold, the vGPU's quota is for all its sessions together: reserve `c` on its meter.
  bool hold_full = false;
  if (fits && p_.hold_used != nullptr && dev < p_.hold_quota.size()) {
    std::atomic<uint64_t>& meter = p_.hold_used[dev];
    uint64_t all = meter.load(std::memory_order_relaxed);
    do {
      hold_full = all > p_.hold_quota[dev] || c > p_.hold_quota[dev] - all;
    } while (!hold_full && !meter.compare_exchange_weak(all, all + c, std::memory_order_relaxed));
    if (hold_full) {
      p_.log->warn(
          "sess={} op={} {}(): memory {} MB exceeds what is left ({} MB) of <vgpu {}, pgpu {}> quota ({} MB), "
          "which the processes sharing it use together",
          p_.session_id, op, call, c / (1 << 20) + (c % (1 << 20) != 0 ? 1 : 0),
          (all < p_.hold_quota[dev] ? p_.hold_quota[dev] - all : 0) >> 20, pl.vgpu, pl.pgpu, p_.hold_quota[dev] >> 20);
      return false;
    }
    metered_[dev] += c;  // on the meter already: PublishUsed adds nothing for it
  }
  if (!fits) {
    // In MiB, rounded up; a request too large to add up is shown as itself.
    const uint64_t want = after != 0 ? after : bytes;
    p_.log->warn("sess={} op={} {}(): memory {} MB exceeds <vgpu {}, pgpu {}> quota ({} MB)", p_.session_id, op, call,
                 want / (1 << 20) + (want % (1 << 20) != 0 ? 1 : 0), pl.vgpu, pl.pgpu, pl.quota_bytes >> 20);
    return false;
  }
  used_[dev] += c;
  PublishUsed(dev);
  *charged = c;
  return true;
}

int Session::Run(const FrameHeader& hello_header, const HelloReq& hello) {
  auto& log = *p_.log;
  (void)hello;
  if (Status s = b_->Init(p_.placements); !s.ok()) {
    log.error("sess={} backend {} failed to start: {}", p_.session_id, b_->name(), s.ToString());
    const std::string msg = "oriond backend failed: " + s.message();
    Reply(hello_header, CUDA_ERROR_NO_DEVICE, msg.data(), static_cast<uint32_t>(msg.size()));
    return kExitBackendFailed;
  }
  b_->RegisterWindow(window_ + layout_.staging_bytes, layout_.window_bytes - layout_.staging_bytes);
  for (size_t d = 0; d < p_.placements.size() && d < p_.compute_gpu.size() && d < p_.compute_slot.size(); ++d) {
    if (p_.compute_gpu[d] == nullptr || p_.compute_slot[d] < 0) {
      gates_.emplace_back();
      continue;
    }
    gates_.push_back(std::make_unique<ComputeGate>(p_.compute_gpu[d], p_.compute_slot[d]));
    const ComputeGate& g = *gates_.back();
    const std::string share = g.ratio() == 0 ? std::string("best effort")
                                             : std::to_string(g.ratio()) + "% (" + ComputePolicyName(g.policy()) + ")";
    if (b_->GatesCompute()) {
      log.info("sess={} compute: vGPU {} on p-GPU {} gets {} of its compute", p_.session_id, d, p_.placements[d].pgpu,
               share);
    } else {
      log.warn("sess={} compute: vGPU {} asked for {} of p-GPU {}; the {} backend does not enforce compute shares yet",
               p_.session_id, d, share, p_.placements[d].pgpu, b_->name());
    }
  }
  std::vector<uint8_t> welcome(sizeof(WelcomeRep) + p_.placements.size() * sizeof(DeviceInfo));
  WelcomeRep w{};
  w.session_id = p_.session_id;
  w.device_count = static_cast<uint32_t>(p_.placements.size());
  w.driver_version = b_->DriverVersion();
  w.backend = std::string(b_->name()) == "cuda" ? 1 : 0;
  w.transport = p_.transport;
  w.channel_bytes = p_.transport == kTransportShm ? 0 : p_.channel_bytes;
  std::snprintf(w.server_name, sizeof w.server_name, "oriond (%s)", b_->name());
  std::snprintf(w.allocation_id, sizeof w.allocation_id, "%s", p_.allocation_id.c_str());
  std::snprintf(w.share, sizeof w.share, "%s", p_.share.c_str());
  std::memcpy(welcome.data(), &w, sizeof w);
  overhead_.assign(p_.placements.size(), 0);
  metered_.assign(p_.placements.size(), 0);
  scratch_.assign(p_.placements.size(), 0);
  for (uint32_t d = 0; d < p_.placements.size(); ++d) {
    DeviceInfo info{};
    b_->DescribeDevice(d, &info);
    info.total_mem = p_.placements[d].quota_bytes;
    ClampServedFeatures(&info, p_.transport != kTransportShm, b_->SameAddressMapping());
    // Each vGPU has its own UUID, as MIG instances do: the physical GPU's with its last two bytes
    // XORed with vGPU index + 1. vGPU n of a GPU keeps one UUID across sessions and restarts, and
    // no two vGPUs of a process look alike to tools that pick a device by UUID
    // (CUDA_VISIBLE_DEVICES=GPU-..., NVML's nvmlDeviceGetHandleByUUID).
    const uint32_t tag = p_.placements[d].vgpu + 1;
    info.uuid[14] = static_cast<uint8_t>(info.uuid[14] ^ (tag >> 8));
    info.uuid[15] = static_cast<uint8_t>(info.uuid[15] ^ tag);
    overhead_[d] = b_->ContextOverhead(d);
    PublishUsed(d);
    std::memcpy(welcome.data() + sizeof w + d * sizeof info, &info, sizeof info);
  }
  if (!Reply(hello_header, CUDA_SUCCESS, welcome.data(), static_cast<uint32_t>(welcome.size()))) {
    return violation_ ? kExitViolation : kExitLeaseExpired;
  }
  ch_->Serving();

  std::vector<uint8_t> scratch, reply;
  // Idle: spin ~0.1 ms (not over TCP: SpinPolls), yield, then sleep until the client rings (a futex, the VM's ivshmem
  // doorbell, or the socket): the first call after a pause costs one kernel wake-up. The sleep's
  // timeout runs the liveness checks (Idle: the client's lease) and bounds a wake-up missed after
  // an asynchronous frame (client.h, B1): 2 ms after the last frame, doubling with each quiet
  // wait up to idle_wait_ms (a quarter of the lease timeout, 20..250 ms). A client that cannot ring
  // (an older guest runtime in a VM) gets naps of up to 2 ms, 5 ms after a quiet second.
  ivshmem::Backoff backoff(ch_->SpinPolls(), 100, 2000);
  const int idle_wait_ms = static_cast<int>(std::clamp<uint64_t>(p_.lease_timeout_ms / 4, 20, 250));
  uint64_t frames = 0;
  uint64_t last_frame_ms = MonotonicMs();
  uint32_t quiet_waits = 0;  // sleeps since the last frame
  auto violation = [&](const std::string& what) {
    log.error("sess={} protocol violation: {}; ending the session", p_.session_id, what);
    ch_->Closing(CUDA_ERROR_ILLEGAL_STATE);
    return kExitViolation;
  };
  // The watchdog: the loop below sees its client go only between frames, and a frame can take as
  // long as a kernel runs (10 min by default on the sim). While a frame has been executing for half
  // a second, a thread checks every 100 ms whether the client is certainly gone (SessionChannel::
  // ClientGone: its lease stale, its connection closed) and then ends the worker at once: the
  // executor stops mid-kernel (the cuda backend's driver reclaims the context with the process),
  // and oriond frees the vGPUs and the compute share when it reaps the worker.
  // Odd while a frame executes; the watchdog times how long one value stays (no clock per frame).
  constexpr uint64_t kKeepaliveMs = 250;  // far below a client's ORION_ALIVE_TIMEOUT_MS (10 s)
  std::atomic<uint64_t> busy_seq{0};
  std::atomic<uint16_t> busy_op{0};
  std::mutex dog_mu;
  std::condition_variable dog_cv;
  bool dog_stop = false;
  std::thread dog([&] {
    uint64_t seen = 0, seen_ms = 0, frame = 0, frame_ms = 0, sent = 0, sent_ms = MonotonicMs();
    std::unique_lock<std::mutex> l(dog_mu);
    while (!dog_cv.wait_for(l, std::chrono::milliseconds(100), [&] { return dog_stop; })) {
      const uint64_t now = MonotonicMs();
      const std::string why = ch_->ClientGone(now, &seen, &seen_ms);
      const uint64_t seq = busy_seq.load(std::memory_order_relaxed);
      if (seq != frame) {
        frame = seq;
        frame_ms = now;
      }
      // Requests executing and nothing sent for kKeepaliveMs (a long kernel, a synchronize behind
      // many launches): the client hears from oriond that often (a 24-byte frame).
      if (const uint64_t n = ch_->MessagesSent(); n != sent) {
        sent = n;
        sent_ms = now;
      }
      if ((seq & 1) != 0 && now - sent_ms >= kKeepaliveMs) {
        ch_->Keepalive();
        sent = ch_->MessagesSent();
        sent_ms = now;
      }
      if (why.empty() || (seq & 1) == 0 || now - frame_ms < 500) continue;
      log.warn("sess={} {} while the worker was busy ({} ms in {}); ending the session now", p_.session_id, why,
               now - frame_ms, OpName(busy_op.load()));
      log.flush();
      _exit(p_.socket_fd < 0 ? kExitLeaseExpired : kExitClientGone);
    }
  });
  struct DogStop {
    std::mutex& mu;
    std::condition_variable& cv;
    bool& stop;
    std::thread& t;
    ~DogStop() {
      {
        std::lock_guard<std::mutex> g(mu);
        stop = true;
      }
      cv.notify_all();
      t.join();
    }
  } dog_stop_at_return{dog_mu, dog_cv, dog_stop, dog};
  for (;;) {
    ivshmem::FrameView f{};
    bool got = false;
    if (Status s = ch_->Pop(&f, &scratch, &got); !s.ok()) {
      if (s.code() == Code::kUnavailable) {
        log.info("sess={} {}", p_.session_id, s.message());
        return kExitClientGone;
      }
      return violation(s.message());
    }
    if (!got) {
      if (backoff.sleeping() || (++frames & 0xFFF) == 0) {
        const uint64_t now = MonotonicMs();
        backoff.set_max_sleep_us(now - last_frame_ms > 1000 ? 5000 : 2000);
        if (Status s = ch_->Idle(now); !s.ok()) {
          log.info("sess={} {}", p_.session_id, s.message());
          // A network session's Idle fails when its client closed the connection: that is the
          // client gone, as when Pop or the watchdog sees it first (oriond logs the same reason).
          return s.code() == Code::kUnavailable && p_.socket_fd < 0 ? kExitLeaseExpired : kExitClientGone;
        }
      }
      // Asleep: on the doorbell or the socket when the channel has one (2 ms while recently busy,
      // 20 ms after a quiet second: the bound on a missed wake-up), else naps.
      if (backoff.sleeping() && ch_->WaitIdle(std::min(idle_wait_ms, 2 << std::min<uint32_t>(quiet_waits, 7)))) {
        ++quiet_waits;
      } else {
        naps_ += backoff.sleeping() ? 1 : 0;
        backoff.Pause();
      }
      continue;
    }
    const bool was_asleep = backoff.sleeping();
    if (was_asleep || (frames++ & 0xFF) == 0) last_frame_ms = MonotonicMs();  // after idle, or now and then
    backoff.Reset();
    // Woken by a client that rang: the kernel ran us on its CPU, where it now waits for this reply.
    // Spinning there after the reply would keep it off that CPU (~0.1 ms): yield at once instead,
    // until frames come back to back again.
    backoff.set_spin(was_asleep ? 0 : ch_->SpinPolls());
    quiet_waits = 0;
    const FrameHeader& h = f.header;
    if (!OpKnown(h.op) || static_cast<Op>(h.op) == Op::kWindowData) {
      return violation("unknown op " + std::to_string(h.op));
    }
    int32_t status = 0;
    std::string why;
    busy_op.store(h.op, std::memory_order_relaxed);
    // Only this thread writes busy_seq: plain stores, no locked instruction per frame.
    busy_seq.store(busy_seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);  // odd: executing
    const bool dispatched = Dispatch(h, f.payload, &reply, &status, &why);
    busy_seq.store(busy_seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (!dispatched) return violation(std::string(OpName(h.op)) + ": " + why);
    if (status != 0 && status != kStatusNeedBytes) {
      log.debug("sess={} op={} -> {}", p_.session_id, OpName(h.op), status);
    }
    // D0: the frame's window bytes reach the client, its staging bytes are free (shm: pairs with S0
    // in the client), before its reply.
    if (Status s = ch_->Done(h, f.payload); !s.ok()) {
      if (s.code() == Code::kDataLoss) return violation(s.message());
      log.info("sess={} {}", p_.session_id, s.message());
      return kExitClientGone;
    }
    if (h.flags & kFlagWantsReply) {
      if (!Reply(h, status, reply.data(), static_cast<uint32_t>(reply.size()))) {
        return violation_ ? kExitViolation : kExitClientGone;
      }
    } else if (status != 0 && deferred_ == 0) {
      deferred_ = status;  // reported with the next reply
    }
    if (static_cast<Op>(h.op) == Op::kGoodbye) return kExitGoodbye;
  }
}

}  // namespace

int RunSession(const SessionParams& params, std::unique_ptr<Backend> backend, const FrameHeader& hello_header,
               const HelloReq& hello) {
  std::unique_ptr<SessionChannel> ch =
      params.socket_fd < 0
          ? MakeShmSessionChannel(params.region, params.channel_bytes, params.channel, params.generation,
                                  params.request_position, params.lease_timeout_ms, params.doorbell_fd)
      : params.transport == kTransportRdma
          ? MakeRdmaSessionChannel(params.socket_fd, params.channel_bytes, params.net_stall_ms, params.session_id,
                                   params.log)
          : MakeTcpSessionChannel(params.socket_fd, params.stream, params.channel_bytes, params.net_stall_ms);
  Session s(params, std::move(backend), std::move(ch));
  const int code = s.Run(hello_header, hello);
  s.LogWaits();
  return code;
}

}  // namespace orion::host
