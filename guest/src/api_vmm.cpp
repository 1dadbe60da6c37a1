// Exported driver API: virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess, ...) and stream-ordered memory pools (cuMemPool*, cuMemAllocFromPoolAsync).
//
// VMM runs on oriond (ops MemAddressReserve..MemSetAccess: the session validates every range and
// charges physical memory to the vGPU's quota at cuMemCreate); this file keeps what the driver
// answers locally: the granularity, each handle's properties and retain count, which handle is
// mapped where, and the access granted. Accessible mappings enter the mirror as kVmm ranges, so
// copies may run across adjoining mappings, as PyTorch's expandable segments need.
//
// Memory pools are served here, over cuMemAlloc and the stream-ordered free: a pool hands out
// memory at once and returns it at the free (it keeps nothing cached, which CUDA allows: the
// release threshold and reuse policies are hints). Each pool counts what it holds, so
// CU_MEMPOOL_ATTR_USED_MEM_* / RESERVED_MEM_* report real figures, and a pool's maxSize is a limit.
// Shareable handles (IPC, fabric) are not served: their entry points stay loud stubs.
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "export.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

namespace {

struct VmmHandle {
  CUmemAllocationProp prop{};
  uint64_t bytes = 0;
  unsigned refs = 1;      // cuMemCreate + cuMemRetainAllocationHandle - cuMemRelease; 0: released on oriond
  unsigned mappings = 0;  // its live cuMemMap's: known (for retain) until both are 0
};
struct VmmMapping {
  uint64_t bytes = 0;
  uint64_t handle = 0;
  unsigned long long access = 0;  // bit per device: CUmemAccess_flags (2 bits each)
};
struct Vmm {
  std::mutex mu;
  std::map<uint64_t, VmmHandle> handles;    // by server handle id
  std::map<uint64_t, VmmMapping> mappings;  // by address
};
Vmm& V() {
  static Vmm* v = new Vmm;  // never destroyed: calls may come from atexit handlers
  return *v;
}

size_t DeviceCount() { return Client::Get().devices().size(); }

// A CUmemAllocationProp Orion can serve: pinned device memory of one of the process's vGPUs; the
// POSIX file descriptor handle type may be requested (PyTorch always does), though exporting it
// is not served (cuMemExportToShareableHandle stays NOT_SUPPORTED).
CUresult CheckProp(const CUmemAllocationProp* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (p->type != CU_MEM_ALLOCATION_TYPE_PINNED || p->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (p->location.id < 0 || static_cast<size_t>(p->location.id) >= DeviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  if ((p->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
    LogWarn(
        "cuMemCreate: only CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (not exportable) or no shareable handle "
        "type is served by Orion; requested " +
        std::to_string(p->requestedHandleTypes));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (p->allocFlags.compressionType != 0) return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}

bool Granular(uint64_t v) { return v % kVmmGranularity == 0; }

}  // namespace

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                                            CUmemAllocationGranularity_flags option) {
  ORION_API(cuMemGetAllocationGranularity);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (granularity == nullptr ||
      (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckProp(prop); r != CUDA_SUCCESS) return r;
  *granularity = kVmmGranularity;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                                  unsigned long long flags) {
  ORION_API(cuMemAddressReserve);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (ptr == nullptr || size == 0 || !Granular(size) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  MemReserveReq q{size, alignment, addr};
  U64Rep rep{};
  if (CUresult r = Client::Get().Call(Op::kMemAddressReserve, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS)
    return r;
  *ptr = rep.value;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  ORION_API(cuMemAddressFree);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  MemRangeReq q{ptr, size};
  return Client::Get().Call(Op::kMemAddressFree, &q, sizeof q);
}

ORION_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                          const CUmemAllocationProp* prop, unsigned long long flags) {
  ORION_API(cuMemCreate);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || size == 0 || !Granular(size) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckProp(prop); r != CUDA_SUCCESS) return r;
  MemCreateReq q{size, static_cast<uint32_t>(prop->location.id), 0};
  HandleRep rep{};
  if (CUresult r = Client::Get().Call(Op::kMemCreate, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS) return r;
  std::lock_guard l(V().mu);
  V().handles[rep.handle] = VmmHandle{*prop, size, 1};
  *handle = rep.handle;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  ORION_API(cuMemRelease);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  {
    std::lock_guard l(V().mu);
    auto it = V().handles.find(handle);
    if (it == V().handles.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
    if (--it->second.refs != 0) return CUDA_SUCCESS;  // retained: still held
  }
  HandleReq q{handle};
  const CUresult r = Client::Get().Call(Op::kMemRelease, &q, sizeof q);
  std::lock_guard l(V().mu);
  auto it = V().handles.find(handle);
  if (it == V().handles.end()) return r;
  if (r != CUDA_SUCCESS) {
    ++it->second.refs;  // still held on oriond
    return r;
  }
  // Its properties stay known while a mapping of it remains (cuMemRetainAllocationHandle).
  if (it->second.mappings == 0) V().handles.erase(it);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                       unsigned long long flags) {
  ORION_API(cuMemMap);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  MemMapReq q{ptr, size, offset, handle};
  if (CUresult r = Client::Get().Call(Op::kMemMap, &q, sizeof q); r != CUDA_SUCCESS) return r;
  std::lock_guard l(V().mu);
  V().mappings[ptr] = VmmMapping{size, handle, 0};
  if (auto h = V().handles.find(handle); h != V().handles.end()) ++h->second.mappings;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  ORION_API(cuMemUnmap);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  MemRangeReq q{ptr, size};
  if (CUresult r = Client::Get().Call(Op::kMemUnmap, &q, sizeof q); r != CUDA_SUCCESS) return r;
  std::lock_guard l(V().mu);
  auto& maps = V().mappings;
  for (auto it = maps.lower_bound(ptr); it != maps.end() && it->first < ptr + size;) {
    DeviceRange dropped{};
    (void)S().mirror.Remove(it->first, &dropped);
    auto hit = V().handles.find(it->second.handle);
    it = maps.erase(it);
    if (hit != V().handles.end() && --hit->second.mappings == 0 && hit->second.refs == 0) V().handles.erase(hit);
  }
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  ORION_API(cuMemSetAccess);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (desc == nullptr || count == 0 || count > 64) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].location.id < 0 || static_cast<size_t>(desc[i].location.id) >= DeviceCount())
      return CUDA_ERROR_INVALID_DEVICE;
    MemSetAccessReq q{ptr, size, static_cast<uint32_t>(desc[i].location.id), static_cast<uint32_t>(desc[i].flags)};
    if (CUresult r = Client::Get().Call(Op::kMemSetAccess, &q, sizeof q); r != CUDA_SUCCESS) return r;
    std::lock_guard l(V().mu);
    const unsigned shift = 2 * static_cast<unsigned>(desc[i].location.id);
    for (auto it = V().mappings.lower_bound(ptr); it != V().mappings.end() && it->first < ptr + size; ++it) {
      it->second.access =
          (it->second.access & ~(3ull << shift)) | (static_cast<unsigned long long>(desc[i].flags & 3) << shift);
      // Accessible from some device: a device range for copies and kernel arguments.
      if (it->second.access != 0) {
        S().mirror.Add({it->first, it->second.bytes, RangeKind::kVmm, nullptr, nullptr, desc[i].location.id});
      } else {
        (void)S().mirror.Remove(it->first, nullptr);
      }
    }
  }
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                             CUdeviceptr ptr) {
  ORION_API(cuMemGetAccess);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE || location->id < 0 ||
      static_cast<size_t>(location->id) >= DeviceCount())
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(V().mu);
  auto it = V().mappings.upper_bound(ptr);
  if (it == V().mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (ptr - it->first >= it->second.bytes) return CUDA_ERROR_INVALID_VALUE;
  *flags = (it->second.access >> (2 * static_cast<unsigned>(location->id))) & 3;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  ORION_API(cuMemRetainAllocationHandle);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t p = reinterpret_cast<uint64_t>(addr);
  std::lock_guard l(V().mu);
  auto it = V().mappings.upper_bound(p);
  if (it == V().mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (p - it->first >= it->second.bytes) return CUDA_ERROR_INVALID_VALUE;
  auto h = V().handles.find(it->second.handle);
  if (h == V().handles.end() || h->second.refs == 0) {
    // Released already (the mapping alone keeps the memory): oriond holds no handle to give back.
    LogWarn("cuMemRetainAllocationHandle: the allocation mapped there was released; Orion cannot retain it again");
    return CUDA_ERROR_INVALID_VALUE;
  }
  ++h->second.refs;
  *handle = it->second.handle;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                                     CUmemGenericAllocationHandle handle) {
  ORION_API(cuMemGetAllocationPropertiesFromHandle);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(V().mu);
  auto it = V().handles.find(handle);
  if (it == V().handles.end()) return CUDA_ERROR_INVALID_VALUE;
  *prop = it->second.prop;
  return CUDA_SUCCESS;
}

}  // extern "C"

// ---- Stream-ordered memory pools ----------------------------------------------------------------
namespace {

struct Pool {
  int device = 0;
  bool is_default = false;
  bool destroyed = false;
  size_t max_size = 0;                 // 0: no limit but the quota
  cuuint64_t release_threshold = 0;    // a hint: nothing is cached
  int reuse[3] = {1, 1, 1};            // FOLLOW_EVENT_DEPENDENCIES, ALLOW_OPPORTUNISTIC, ALLOW_INTERNAL_DEPENDENCIES
  cuuint64_t used = 0, used_high = 0;  // bytes of live allocations (reserved = used: nothing cached)
  unsigned long long peer_access = 0;  // bit per device: CUmemAccess_flags (2 bits each)
};
struct Pools {
  std::mutex mu;
  std::vector<std::unique_ptr<Pool>> all;               // defaults first (one per device), then created ones
  std::unordered_set<const Pool*> valid;                // the same, for handle lookups (not destroyed ones)
  std::vector<Pool*> current;                           // per device: cuDeviceSetMemPool
  std::map<uint64_t, std::pair<Pool*, uint64_t>> live;  // pointer -> (pool, bytes)
};
Pools& P() {
  static Pools* p = new Pools;
  return *p;
}
// Requires the lock. Makes the per-device defaults on first use.
void EnsureDefaults() {
  Pools& p = P();
  while (p.current.size() < DeviceCount()) {
    auto pool = std::make_unique<Pool>();
    pool->device = static_cast<int>(p.current.size());
    pool->is_default = true;
    p.current.push_back(pool.get());
    p.valid.insert(pool.get());
    p.all.push_back(std::move(pool));
  }
}
// A pool handle from the application (defaults made first); nullptr if unknown or destroyed.
Pool* FindPool(CUmemoryPool h) {  // requires the lock
  EnsureDefaults();
  auto* p = reinterpret_cast<Pool*>(h);
  return P().valid.count(p) != 0 ? p : nullptr;
}

CUresult AllocFromPool(CUdeviceptr* dptr, size_t bytes, Pool* pool, CUstream hs) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t stream = 0;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r; CaptureMemAlloc(stream, bytes, pool->is_default, dptr, &r)) return r;
  if (pool->device != CurrentCtx()->device) return CUDA_ERROR_INVALID_VALUE;  // the stream's device
  {
    std::lock_guard l(P().mu);
    if (pool->max_size != 0 && pool->used + bytes > pool->max_size) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // Allocating at once is a valid stream order (the memory is usable no later than CUDA promises).
  if (CUresult r = cuMemAlloc_v2(dptr, bytes); r != CUDA_SUCCESS) return r;
  std::lock_guard l(P().mu);
  pool->used += bytes;
  pool->used_high = std::max(pool->used_high, pool->used);
  P().live[*dptr] = {pool, bytes};
  return CUDA_SUCCESS;
}

Pool* CurrentPool() {  // the current context's device's pool
  std::lock_guard l(P().mu);
  EnsureDefaults();
  return P().current[static_cast<size_t>(CurrentCtx()->device)];
}

}  // namespace

void orion::guest::PoolFreed(uint64_t dptr) noexcept {
  std::lock_guard l(P().mu);
  if (auto it = P().live.find(dptr); it != P().live.end()) {
    it->second.first->used -= it->second.second;
    P().live.erase(it);
  }
}

namespace {

// The free travels as a frame on the process's ordered channel, so it runs after everything issued
// before it, on every stream.
CUresult FreeAsync(CUdeviceptr dptr, CUstream hs) {
  uint64_t stream = 0;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r; CaptureMemFree(stream, dptr, &r)) return r;
  if (CUresult r; GraphMemFree(dptr, &r)) return r;  // a graph allocation: free for the graph's next launch
  if (!S().mirror.RemoveDevice(dptr, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  PoolFreed(dptr);
  MemFreeReq q{dptr};
  return Client::Get().Send(Op::kMemFree, &q, sizeof q);  // no reply: an error is deferred
}

CUresult CheckPoolProps(const CUmemPoolProps* p) {
  if (p == nullptr || p->allocType != CU_MEM_ALLOCATION_TYPE_PINNED || p->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (p->location.id < 0 || static_cast<size_t>(p->location.id) >= DeviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  if (p->handleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    LogWarn("cuMemPoolCreate: shareable pool handles (IPC) are not served by Orion");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {}  // extern "C"

// Device `dev`'s default pool, or its current one (cuDeviceSetMemPool).
static CUresult DevicePool(CUmemoryPool* pool, CUdevice dev, bool current) {
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || static_cast<size_t>(dev) >= DeviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard l(P().mu);
  EnsureDefaults();
  const auto d = static_cast<size_t>(dev);
  *pool = reinterpret_cast<CUmemoryPool>(current ? P().current[d] : P().all[d].get());
  return CUDA_SUCCESS;
}

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  ORION_API(cuDeviceGetDefaultMemPool);
  return DevicePool(pool, dev, false);
}

ORION_EXPORT CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  ORION_API(cuDeviceGetMemPool);
  return DevicePool(pool, dev, true);
}

ORION_EXPORT CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  ORION_API(cuDeviceSetMemPool);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (dev < 0 || static_cast<size_t>(dev) >= DeviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard l(P().mu);
  Pool* p = FindPool(pool);
  if (p == nullptr || p->device != dev) return CUDA_ERROR_INVALID_VALUE;
  P().current[static_cast<size_t>(dev)] = p;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  ORION_API(cuMemPoolCreate);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckPoolProps(props); r != CUDA_SUCCESS) return r;
  std::lock_guard l(P().mu);
  EnsureDefaults();
  if (P().all.size() >= 65536) return CUDA_ERROR_OUT_OF_MEMORY;  // bounded, as every client-made table
  auto p = std::make_unique<Pool>();
  p->device = props->location.id;
  p->max_size = props->maxSize;
  *pool = reinterpret_cast<CUmemoryPool>(p.get());
  P().valid.insert(p.get());
  P().all.push_back(std::move(p));
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  ORION_API(cuMemPoolDestroy);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  std::lock_guard l(P().mu);
  Pool* p = FindPool(pool);
  if (p == nullptr || p->is_default) return CUDA_ERROR_INVALID_VALUE;
  // Its live allocations stay valid until freed (CUDA: destruction completes then); a device that
  // used it as its current pool goes back to the default.
  p->destroyed = true;
  P().valid.erase(p);
  for (size_t d = 0; d < P().current.size(); ++d)
    if (P().current[d] == p) P().current[d] = P().all[d].get();
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  ORION_API(cuMemPoolTrimTo);
  (void)minBytesToKeep;
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  std::lock_guard l(P().mu);
  return FindPool(pool) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;  // nothing is cached
}

ORION_EXPORT CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  ORION_API(cuMemPoolSetAttribute);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(P().mu);
  Pool* p = FindPool(pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: p->reuse[0] = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: p->reuse[1] = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: p->reuse[2] = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->release_threshold = *static_cast<cuuint64_t*>(value); break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:  // only a reset to 0 (to the current value) is allowed
      if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      p->used_high = p->used;
      break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  ORION_API(cuMemPoolGetAttribute);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(P().mu);
  Pool* p = FindPool(pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: *static_cast<int*>(value) = p->reuse[0]; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: *static_cast<int*>(value) = p->reuse[1]; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *static_cast<int*>(value) = p->reuse[2]; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *static_cast<cuuint64_t*>(value) = p->release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *static_cast<cuuint64_t*>(value) = p->used; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *static_cast<cuuint64_t*>(value) = p->used_high; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  ORION_API(cuMemPoolSetAccess);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (map == nullptr && count != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(P().mu);
  Pool* p = FindPool(pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || map[i].location.id < 0 ||
        static_cast<size_t>(map[i].location.id) >= DeviceCount())
      return CUDA_ERROR_INVALID_DEVICE;
    // The vGPUs of a session are peers of each other (cuDeviceCanAccessPeer): access is granted.
    const unsigned shift = 2 * static_cast<unsigned>(map[i].location.id);
    p->peer_access = (p->peer_access & ~(3ull << shift)) | (static_cast<unsigned long long>(map[i].flags & 3) << shift);
  }
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool pool, CUmemLocation* location) {
  ORION_API(cuMemPoolGetAccess);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE || location->id < 0 ||
      static_cast<size_t>(location->id) >= DeviceCount())
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard l(P().mu);
  Pool* p = FindPool(pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = location->id == p->device
               ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
               : static_cast<CUmemAccess_flags>((p->peer_access >> (2 * static_cast<unsigned>(location->id))) & 3);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                      CUstream hStream) {
  ORION_API(cuMemAllocFromPoolAsync);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  Pool* p = nullptr;
  {
    std::lock_guard l(P().mu);
    p = FindPool(pool);
  }
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return AllocFromPool(dptr, bytesize, p, hStream);
}
ORION_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                           CUstream hStream) {
  ORION_API(cuMemAllocFromPoolAsync_ptsz);
  return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

ORION_EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  ORION_API(cuMemAllocAsync);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  return AllocFromPool(dptr, bytesize, CurrentPool(), hStream);
}
ORION_EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  ORION_API(cuMemAllocAsync_ptsz);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  return AllocFromPool(dptr, bytesize, CurrentPool(), hStream);
}
ORION_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  ORION_API(cuMemFreeAsync);
  return FreeAsync(dptr, hStream);
}
ORION_EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  ORION_API(cuMemFreeAsync_ptsz);
  return FreeAsync(dptr, hStream);
}

}  // extern "C"

// Graph memory (memory that graph allocation nodes hold; graph.cpp): Orion holds a graph
// allocation from its node's creation until no graph holds it, so used and reserved memory are
// the same bytes and there is nothing to trim.
extern "C" {
ORION_EXPORT CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
  ORION_API(cuDeviceGetGraphMemAttribute);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (device < 0 || static_cast<size_t>(device) >= DeviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t v = 0;
  if (CUresult r = GraphMemAttribute(device, attr, &v, false); r != CUDA_SUCCESS) return r;
  *static_cast<cuuint64_t*>(value) = v;
  return CUDA_SUCCESS;
}
ORION_EXPORT CUresult CUDAAPI cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
  ORION_API(cuDeviceSetGraphMemAttribute);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  if (device < 0 || static_cast<size_t>(device) >= DeviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  // Only the high watermarks may be set, and only to 0 (a reset).
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t v = *static_cast<cuuint64_t*>(value);
  return GraphMemAttribute(device, attr, &v, true);
}
ORION_EXPORT CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device) {
  ORION_API(cuDeviceGraphMemTrim);
  if (CUresult r = EnsureInit(); r != CUDA_SUCCESS) return r;
  return device < 0 || static_cast<size_t>(device) >= DeviceCount() ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}
}  // extern "C"
