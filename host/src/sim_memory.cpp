// host/src/sim_memory.cpp — the sim backend's device memory (host RAM at device addresses), copies, CUDA arrays,
// mipmapped arrays and texture objects, memset, virtual memory management and IPC. SimBackend member functions
// (sim_backend.h).
#include "sim_backend.h"

namespace orion::host::sim {

CUresult SimBackend::MemAlloc(uint64_t bytes, uint64_t* dptr) {
  if (sticky_ != CUDA_SUCCESS) return sticky_;
  const uint64_t span = (bytes + kSimAlign - 1) & ~(kSimAlign - 1);
  // MAP_NORESERVE: pages are committed when touched, as device memory would be by the app.
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  *dptr = TakeAddress(span);
  blocks_[*dptr] = Block{span, static_cast<uint8_t*>(p), true};
  return CUDA_SUCCESS;
}

CUresult SimBackend::MemAllocAt(uint64_t bytes, uint64_t addr) {
  if (sticky_ != CUDA_SUCCESS) return sticky_;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t span = (bytes + kSimAlign - 1) & ~(kSimAlign - 1);
  if (!TakeAddressAt(addr, span)) return CUDA_ERROR_ALREADY_MAPPED;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    GiveAddress(addr, span);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  blocks_[addr] = Block{span, static_cast<uint8_t*>(p), true};
  return CUDA_SUCCESS;
}

CUresult SimBackend::MemFree(uint64_t dptr) {
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
CUresult SimBackend::IpcExportMemory(uint64_t dptr, uint64_t, IpcHandle* out) {
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

CUresult SimBackend::IpcImportMemory(const IpcHandle& h, uint64_t* dptr, uint64_t* bytes) {
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

CUresult SimBackend::IpcCloseMemory(uint64_t dptr) {
  if (ipc_imports_.count(dptr) == 0) return CUDA_ERROR_INVALID_VALUE;
  return MemFree(dptr);
}

int SimBackend::IpcTicketFd(uint64_t dptr) const {
  auto it = blocks_.find(dptr);
  return it != blocks_.end() ? it->second.ipc_fd : -1;
}

// Events: the sim completes work when its stream is flushed, so an interprocess event's record
// flushes its stream first (see EventRecord): a record is complete once oriond has taken it, and
// an imported event has nothing left to wait for.
CUresult SimBackend::IpcExportEvent(void* event, IpcHandle* out) {
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

CUresult SimBackend::IpcImportEvent(const IpcHandle& h, void** event) {
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

CUresult SimBackend::MemGetInfo(uint64_t* free, uint64_t* total) {
  *free = *total = 0;
  for (const Placement& p : placements_) *total = std::max(*total, p.quota_bytes);
  *free = *total;
  return CUDA_SUCCESS;
}

CUresult SimBackend::MemcpyHtoD(uint64_t dst, const void* src, uint64_t bytes, void* stream) {
  if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
  if (sticky_ != CUDA_SUCCESS) return sticky_;
  uint8_t* d = Host(dst, bytes);
  if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(d, src, bytes);
  return CUDA_SUCCESS;
}

CUresult SimBackend::MemcpyDtoH(void* dst, uint64_t src, uint64_t bytes, void* stream, bool) {
  if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
  if (sticky_ != CUDA_SUCCESS) return sticky_;
  uint8_t* s = Host(src, bytes);
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(dst, s, bytes);
  return CUDA_SUCCESS;
}

uint8_t* SimBackend::HostView(uint64_t dptr, uint64_t bytes) {
  if (FlushBlocking(true) != CUDA_SUCCESS || sticky_ != CUDA_SUCCESS) return nullptr;
  return Host(dptr, bytes);
}

CUresult SimBackend::MemcpyDtoD(uint64_t dst, uint64_t src, uint64_t bytes, void* stream) {
  if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
  if (sticky_ != CUDA_SUCCESS) return sticky_;
  uint8_t* d = Host(dst, bytes);
  uint8_t* s = Host(src, bytes);
  if (d == nullptr || s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memmove(d, s, bytes);
  return CUDA_SUCCESS;
}

CUresult SimBackend::Memcpy2D(uint64_t dst, void* dst_host, uint64_t dst_pitch, uint64_t src, const void* src_host,
                              uint64_t src_pitch, uint64_t width, uint64_t height, void* stream) {
  if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
  for (uint64_t r = 0; r < height; ++r) {
    uint8_t* d =
        dst_host != nullptr ? static_cast<uint8_t*>(dst_host) + r * dst_pitch : Host(dst + r * dst_pitch, width);
    const uint8_t* s =
        src_host != nullptr ? static_cast<const uint8_t*>(src_host) + r * src_pitch : Host(src + r * src_pitch, width);
    if (d == nullptr || s == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::memmove(d, s, width);
  }
  return CUDA_SUCCESS;
}

CUresult SimBackend::ArrayCreate(const ArraySpec& spec, void** array) {
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

CUresult SimBackend::ArrayDestroy(void* array) {
  (void)FlushBlocking(true);  // like cuMemFree: nothing in flight may still read it
  return arrays_.erase(array) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult SimBackend::MemcpyArray(const CopySide& dst, const CopySide& src, uint64_t width, uint64_t height,
                                 void* stream) {
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

CUresult SimBackend::MipmappedArrayCreate(const ArraySpec& spec, uint32_t levels, void** mipmap) {
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

CUresult SimBackend::MipmappedArrayGetLevel(void* mipmap, uint32_t level, void** array) {
  auto it = mipmaps_.find(mipmap);
  if (it == mipmaps_.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (level >= it->second->levels.size()) return CUDA_ERROR_INVALID_VALUE;
  *array = it->second->levels[level];
  return CUDA_SUCCESS;
}

CUresult SimBackend::MipmappedArrayDestroy(void* mipmap) {
  (void)FlushBlocking(true);
  auto it = mipmaps_.find(mipmap);
  if (it == mipmaps_.end()) return CUDA_ERROR_INVALID_HANDLE;
  for (void* a : it->second->levels) arrays_.erase(a);
  mipmaps_.erase(it);
  return CUDA_SUCCESS;
}

CUresult SimBackend::TexObjectCreate(const TexSpec& spec, uint64_t* object) {
  if (spec.res_type == CU_RESOURCE_TYPE_ARRAY && arrays_.count(spec.array) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (spec.res_type == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY && mipmaps_.count(spec.mipmap) == 0)
    return CUDA_ERROR_INVALID_HANDLE;
  uint64_t id = *object;
  if (id == 0) {
    id = next_object_++;
  } else if (textures_.count(id) != 0 || surfaces_.count(id) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  } else {
    next_object_ = std::max(next_object_, id + 1);  // values stay unique across both kinds
  }
  (spec.surface ? surfaces_ : textures_)[id] = spec;
  *object = id;
  return CUDA_SUCCESS;
}

CUresult SimBackend::TexObjectDestroy(uint64_t object, bool surface) {
  (void)FlushBlocking(true);  // launches in flight may still read through it
  return (surface ? surfaces_ : textures_).erase(object) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult SimBackend::Memset(uint64_t dst, uint32_t value, uint32_t elem, uint64_t width, uint64_t height,
                            uint64_t pitch, void* stream) {
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

CUresult SimBackend::MemAddressReserve(uint64_t bytes, uint64_t alignment, uint64_t fixed_addr, uint64_t* addr) {
  // The fixed address is a hint (CUDA: "fixed starting address range requested"): taken when that
  // range is free and meets the alignment, else the range comes from the same 2 MiB-granular space
  // as cuMemAlloc's, as the driver answers.
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const bool fixed =
      fixed_addr != 0 && (alignment == 0 || fixed_addr % alignment == 0) && TakeAddressAt(fixed_addr, bytes);
  *addr = fixed ? fixed_addr : TakeAddress(bytes, alignment);
  reservations_[*addr] = SimReservation{bytes, static_cast<uint8_t*>(p)};
  return CUDA_SUCCESS;
}

CUresult SimBackend::MemAddressFree(uint64_t addr, uint64_t bytes) {
  auto it = reservations_.find(addr);
  if (it == reservations_.end() || it->second.bytes != bytes) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(it->second.host, it->second.bytes);
  GiveAddress(addr, bytes);
  reservations_.erase(it);
  return CUDA_SUCCESS;
}

CUresult SimBackend::MemCreate(uint32_t, uint64_t bytes, void** handle) {
  if (sticky_ != CUDA_SUCCESS) return sticky_;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  auto phys = std::make_unique<SimPhysical>(SimPhysical{bytes, static_cast<uint8_t*>(p)});
  *handle = phys.get();
  physical_.emplace(phys.get(), std::move(phys));
  return CUDA_SUCCESS;
}

CUresult SimBackend::MemRelease(void* handle) {
  auto it = physical_.find(static_cast<SimPhysical*>(handle));
  if (it == physical_.end()) return CUDA_ERROR_INVALID_HANDLE;
  ::munmap(it->second->home, it->second->bytes);  // mappings keep their pages until unmapped
  physical_.erase(it);
  return CUDA_SUCCESS;
}

CUresult SimBackend::MemMap(uint64_t addr, uint64_t bytes, uint64_t offset, void* handle) {
  auto ph = physical_.find(static_cast<SimPhysical*>(handle));
  uint8_t* at = ReservedHost(addr, bytes);
  if (ph == physical_.end() || at == nullptr || offset > ph->second->bytes || bytes > ph->second->bytes - offset)
    return CUDA_ERROR_INVALID_VALUE;
  void* m = ::mremap(ph->second->home + offset, 0, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, at);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  return CUDA_SUCCESS;
}

CUresult SimBackend::MemUnmap(uint64_t addr, uint64_t bytes) {
  (void)FlushBlocking(true);  // like cuMemFree: nothing in flight may still use the range
  uint8_t* at = ReservedHost(addr, bytes);
  if (at == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (auto it = blocks_.lower_bound(addr); it != blocks_.end() && it->first < addr + bytes;) it = blocks_.erase(it);
  // Back to an inaccessible hole of the reservation; the pages go when no mapping holds them.
  void* m = ::mmap(at, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return m == MAP_FAILED ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS;
}

CUresult SimBackend::MemSetAccess(uint64_t addr, uint64_t bytes, uint32_t, uint32_t flags) {
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

CUresult SimBackend::HostGetDevicePointer(void* host, uint64_t bytes, uint64_t want, uint64_t* dptr) {
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

bool SimBackend::View(const std::unordered_map<uint64_t, TexSpec>& objects, uint64_t handle, ptx::ImageView* out) {
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
uint8_t* SimBackend::Row(const CopySide& c, uint64_t r, uint64_t width) {
  if (c.kind == kSideWindow) return static_cast<uint8_t*>(c.host) + r * c.pitch;
  if (c.kind == kSideDevice) return Host(c.dptr + r * c.pitch, width);
  auto a = arrays_.find(c.array);
  if (a == arrays_.end()) return nullptr;
  SimArray& arr = *a->second;
  const uint64_t off = (c.z * arr.rows + c.y + r) * arr.row_bytes + c.x;
  return off <= arr.data.size() && width <= arr.data.size() - off ? arr.data.data() + off : nullptr;
}

void SimBackend::Release(Block& b) {
  if (b.owned && b.host != nullptr) ::munmap(b.host, b.bytes);
  if (b.ipc_fd >= 0) ::close(b.ipc_fd);
  b.ipc_fd = -1;
  b.host = nullptr;
}

// Host address of [addr, addr+bytes) inside one reservation, or nullptr.
uint8_t* SimBackend::ReservedHost(uint64_t addr, uint64_t bytes) {
  auto it = reservations_.upper_bound(addr);
  if (it == reservations_.begin()) return nullptr;
  --it;
  const uint64_t off = addr - it->first;
  if (off >= it->second.bytes || bytes > it->second.bytes - off) return nullptr;
  return it->second.host + off;
}

// `alignment`: 0, or a power of two (larger alignments leave the skipped granules free).
// Window memory [host, host+bytes) at device address `want`, the client's own address for it
// (unified addressing). Only above the addresses the sim hands out (TakeAddress steps over such
// blocks), and only over other window blocks: one at the same host-to-device offset is merged in
// (the same pages, mapped again), one at another offset is stale (the client maps only pinned
// memory it holds, and its address was freed and reused) and is dropped once nothing in flight
// can use it. False: the range collides with device memory; the caller picks an address.
bool SimBackend::MapAtClientAddress(uint8_t* host, uint64_t bytes, uint64_t want) {
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

uint64_t SimBackend::TakeAddress(uint64_t bytes, uint64_t alignment) {
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

bool SimBackend::TakeAddressAt(uint64_t addr, uint64_t bytes) {
  constexpr uint64_t kGranule = 2ull << 20;
  constexpr uint64_t kSimTop = 1ull << 47;  // the end of x86-64's user half: no device address beyond
  const uint64_t span = Granules(bytes);
  if (bytes == 0 || addr % kGranule != 0 || addr < kSimBase || span > kSimTop - addr) return false;
  // Not over window memory mapped at a client's address (blocks beyond next_addr_).
  auto b = blocks_.lower_bound(addr);
  if (b != blocks_.end() && b->first < addr + span) return false;
  if (b != blocks_.begin() && std::prev(b)->first + std::prev(b)->second.bytes > addr) return false;
  if (addr >= next_addr_) {  // above everything handed out: the gap below it becomes free
    if (addr > next_addr_) GiveAddress(next_addr_, addr - next_addr_);
    next_addr_ = addr + span;
    return true;
  }
  // Inside one free range: what is left on either side stays free.
  auto it = free_addrs_.upper_bound(addr);
  if (it == free_addrs_.begin()) return false;
  --it;
  const uint64_t start = it->first, len = it->second;
  if (addr + span > start + len) return false;
  free_addrs_.erase(it);
  if (addr > start) free_addrs_[start] = addr - start;
  if (start + len > addr + span) free_addrs_[addr + span] = start + len - (addr + span);
  return true;
}

void SimBackend::GiveAddress(uint64_t addr, uint64_t bytes) {
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

}  // namespace orion::host::sim
