// host/src/session_state.h — what one client session holds in oriond: the handles it gave its
// client (contexts, modules, functions, streams, events, physical allocations), its device
// allocations and VMM ranges, its CUDA arrays and texture objects, its IPC exports and imports,
// its current context, and what it is charged per device. Only tables and lookups: no backend call
// (the Session, session_impl.h, owns the backend and the handlers). Live migration (#24) carries
// this state. Not thread-safe: the session's one thread uses it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "orion/common/frame.h"
#include "orion/host/backend.h"

namespace orion::host::detail {

enum class Kind : uint8_t { kCtx, kModule, kFunction, kStream, kEvent, kMemHandle };

struct Obj {
  Kind kind;
  void* backend = nullptr;
  uint32_t dev = 0;     // contexts, physical allocations
  uint64_t owner = 0;   // function: its module; module/stream/event: its context
  KernelLayout layout;  // functions
  uint64_t bytes = 0;   // physical allocations (cuMemCreate): size, charged to the quota
  // What re-creates the object elsewhere (live migration, session_snapshot.cpp): the flags it was
  // created with (contexts, streams, events), a stream's priority, whether a context is its
  // device's primary one, a module's image (XXH3-128 hash and size: the host's module cache holds
  // the bytes), a function's name.
  uint32_t flags = 0;
  int32_t priority = 0;
  bool primary = false;
  uint64_t hash_lo = 0, hash_hi = 0, image_bytes = 0;
  std::string name{};
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
  uint64_t offset = 0;      // where in the physical allocation the mapping starts (cuMemMap's offset)
  uint32_t access_dev = 0;  // the device and CUmemAccess_flags cuMemSetAccess last granted
  uint32_t access_flags = 0;
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
// An array's record with its geometry (extents already checked: the products cannot overflow).
inline ArrayRec ArrayGeometry(uint32_t format, uint32_t channels, uint32_t flags, uint64_t width, uint64_t height,
                              uint64_t depth) {
  ArrayRec a;
  a.format = format;
  a.channels = channels;
  a.flags = flags;
  a.width = width;
  a.height = height;
  a.depth = depth;
  a.texel = ArrayFormatBytes(format) * channels;
  a.row_bytes = width * a.texel;
  a.rows = std::max<uint64_t>(height, 1);
  a.slices = std::max<uint64_t>(depth, 1);
  return a;
}
// Level `level` of a mipmapped array of those extents: each dimension it has halved per level,
// never below 1 (CUDA's cuMipmappedArrayGetLevel).
inline ArrayRec LevelGeometry(uint32_t format, uint32_t channels, uint32_t flags, uint64_t width, uint64_t height,
                              uint64_t depth, uint32_t level) {
  return ArrayGeometry(format, channels, flags, std::max<uint64_t>(width >> level, 1),
                       height != 0 ? std::max<uint64_t>(height >> level, 1) : 0,
                       depth != 0 ? std::max<uint64_t>(depth >> level, 1) : 0);
}
// The bytes of an array's texels.
inline uint64_t ArrayBytes(const ArrayRec& a) { return a.row_bytes * a.rows * a.slices; }
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
  TexObjectReq req{};  // as the client asked for it (checked): what a move makes it again from
};

// One table of a session's objects by key (a handle from SessionState::NewId; for texture and
// surface objects, the object's value and kind). Every lookup is Find: null for a key this session
// does not hold, which its caller answers as the driver does (CUDA_ERROR_INVALID_HANDLE, or
// _INVALID_VALUE where the driver says so). No operator[]: a lookup never creates a record.
template <typename Rec, typename Key = uint64_t, typename Map = std::unordered_map<Key, Rec>>
class Table {
 public:
  using iterator = typename Map::iterator;
  Rec* Find(const Key& k) {
    auto it = map_.find(k);
    return it == map_.end() ? nullptr : &it->second;
  }
  const Rec* Find(const Key& k) const {
    auto it = map_.find(k);
    return it == map_.end() ? nullptr : &it->second;
  }
  // A record the caller holds a reference to already (a texture object's array, a mapping's
  // physical allocation): std::out_of_range, which ends the worker, if the tables disagree.
  Rec& Known(const Key& k) { return map_.at(k); }
  // Adds `r` under `k`; false (nothing changed) when `k` is taken.
  bool Add(const Key& k, Rec r) { return map_.emplace(k, std::move(r)).second; }
  bool Erase(const Key& k) { return map_.erase(k) != 0; }
  iterator Erase(iterator it) { return map_.erase(it); }
  iterator begin() { return map_.begin(); }
  iterator end() { return map_.end(); }
  size_t size() const { return map_.size(); }

 private:
  Map map_;
};

struct SessionState {
  // A new handle for any table of the session: one counter for all of them, so no two objects of
  // a session share an id and a handle of one kind never names an object of another. Never 0.
  uint64_t NewId() {
    const uint64_t id = next_handle_;
    next_handle_ += 0x10;
    return id;
  }
  // The object behind a handle of kind `k`; null for an unknown handle or one of another kind.
  Obj* Find(uint64_t id, Kind k) {
    Obj* o = handles_.Find(id);
    return o != nullptr && o->kind == k ? o : nullptr;
  }
  uint64_t AddHandle(Obj o) {
    const uint64_t id = NewId();
    handles_.Add(id, std::move(o));
    return id;
  }
  // A stream handle's backend stream (0: the null stream); false for a handle that is not one.
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
  // Whether the session holds kMaxSessionHandles objects (a tenant's limit).
  bool HandlesFull() const {
    return handles_.size() + arrays_.size() + texobjs_.size() + mipmaps_.size() >= kMaxSessionHandles;
  }
  // A live (not destroyed) mipmapped array of this session.
  MipmapRec* LiveMipmap(uint64_t id) {
    MipmapRec* m = mipmaps_.Find(id);
    return m != nullptr && !m->destroyed ? m : nullptr;
  }
  // A live (not destroyed) array of this session.
  ArrayRec* LiveArray(uint64_t id) {
    ArrayRec* a = arrays_.Find(id);
    if (a == nullptr || a->destroyed) return nullptr;
    if (a->mipmap != 0 && LiveMipmap(a->mipmap) == nullptr) return nullptr;  // its owner is gone
    return a;
  }

  Table<Obj> handles_;  // contexts, modules, functions, streams, events, physical allocations
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
  Table<ArrayRec> arrays_;  // CUDA arrays, by handle
  Table<TexRec, std::pair<uint64_t, bool>, std::map<std::pair<uint64_t, bool>, TexRec>>
      texobjs_;                                   // (object value, is a surface) -> its record
  Table<MipmapRec> mipmaps_;                      // mipmapped arrays, by handle
  std::map<uint64_t, Reservation> reservations_;  // VMM address ranges, by start
  uint64_t reserved_bytes_ = 0;                   // their sum (at most kMaxReservedBytes)
  std::map<uint64_t, Mapping> mappings_;          // VMM mappings, by start
  Table<Physical> physicals_;                     // by id; handles_ holds the unreleased ones
  uint64_t next_physical_ = 1;
  std::vector<uint64_t> used_;      // bytes allocated per device (quota)
  std::vector<uint64_t> overhead_;  // context bytes per device (quota)
  std::vector<uint64_t> scratch_;   // per device: local and shared memory charged for launches (LaunchScratchBytes)
  uint64_t cur_ctx_ = 0;
  uint32_t cur_dev_ = 0;
  // What the backend holds and a migration must set again (session_snapshot.cpp): limits set per
  // context (cuCtxSetLimit), attributes set per function (cuFuncSetAttribute), attributes set per
  // stream (cuStreamSetAttribute: the 64-byte CUstreamAttrValue).
  std::map<uint64_t, std::map<uint32_t, uint64_t>> ctx_limits_;
  std::map<uint64_t, std::map<int, int>> func_attrs_;
  std::map<std::pair<uint64_t, uint32_t>, std::vector<uint8_t>> stream_attrs_;
  // Events recorded before this session moved here (Restore): each one's time before the snapshot
  // (ms), or the CUresult cuEventElapsedTime gave for it there (never recorded, or no timing).
  // cuEventElapsedTime between two of them is their difference; between one of them and an event
  // recorded here it adds the move's gap (wall clock) and the time since `moved_base_`, an event
  // recorded at the restore.
  struct MovedEvent {
    double ms_before = 0;
    CUresult timing = CUDA_SUCCESS;
  };
  std::unordered_map<uint64_t, MovedEvent> moved_events_;
  void* moved_base_ = nullptr;
  double moved_gap_ms_ = 0;
};

}  // namespace orion::host::detail
