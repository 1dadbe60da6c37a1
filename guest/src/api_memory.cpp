// Exported driver API: device memory, pinned memory, copies, memsets, pointer attributes.
// Device ranges are checked against the session's mirror first, so bad pointers fail at once with
// CUDA_ERROR_INVALID_VALUE as with NVIDIA's driver; oriond checks again (it trusts nothing).
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "export.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

namespace {

bool DeviceOk(uint64_t p, uint64_t bytes) { return S().mirror.Find(p, bytes, nullptr); }

// Maps pinned host memory at `p` (cuMemHostAlloc/cuMemAllocHost, or a DEVICEMAP registration) into
// the device's address space: what cuMemHostGetDevicePointer returns. Shared-memory transports only.
// oriond is asked to map it at the program's own address for it, so that with unified addressing
// (the sim backend; the cuda backend where the GPU gives registered host memory its host address)
// the host pointer is the device pointer, in kernels too; where it cannot, the device address
// differs and copies and memsets translate (PinnedAsDevice).
CUresult MapHost(void* p, CUdeviceptr* out) {
  void* base = nullptr;  // the window's copy of the range
  uint64_t bytes = 0;
  void* user_base = nullptr;  // the range as the program sees it
  if (void* alias = Client::Get().WindowAlias(p, &base, &bytes); alias != nullptr) {
    // registered with CU_MEMHOSTREGISTER_DEVICEMAP: its pages live in the window, mapped at `p`
    user_base = static_cast<uint8_t*>(p) - (static_cast<uint8_t*>(alias) - static_cast<uint8_t*>(base));
    p = alias;
  } else if (Client::Get().PinnedRange(p, &base, &bytes)) {
    user_base = base;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  WindowRangeReq q{static_cast<uint64_t>(Client::Get().WindowOffset(base, bytes)), bytes,
                   reinterpret_cast<uint64_t>(user_base)};
  U64Rep rep{};
  CUresult r = Client::Get().Call(Op::kHostGetDevicePointer, &q, sizeof q, &rep, sizeof rep);
  if (r != CUDA_SUCCESS) return r;
  S().mirror.Add({rep.value, bytes, RangeKind::kMappedHost, CurrentCtx(), user_base});
  *out = rep.value + static_cast<uint64_t>(static_cast<uint8_t*>(p) - static_cast<uint8_t*>(base));
  return CUDA_SUCCESS;
}

// Unified addressing: a pinned host address given where a device address is expected (XLA
// memsets and reads back its cuMemHostAlloc buffers with cuMemsetD32Async and cuMemcpyDtoHAsync)
// stands for its device mapping, so the work stays in stream order; `*p` becomes that address when
// the `bytes` from it are pinned memory of this process. False otherwise, and on network
// transports (no shared memory). A kernel given the host address cannot use it (README).
bool PinnedAsDevice(CUdeviceptr* p, uint64_t bytes) {
  if (Client::Get().network()) return false;
  void* base = nullptr;
  uint64_t range = 0;
  void* host = reinterpret_cast<void*>(*p);
  if (Client::Get().WindowAlias(host, &base, &range) == nullptr && !Client::Get().PinnedRange(host, &base, &range))
    return false;
  CUdeviceptr d = 0;
  if (MapHost(host, &d) != CUDA_SUCCESS || !DeviceOk(d, bytes)) return false;
  *p = d;
  return true;
}
// Whether `p` is host memory (pinned or managed, mapped for the device, or not mapped yet) rather
// than device memory: a synchronous memset or copy into it must be complete when the call returns.
bool HostVisible(CUdeviceptr p) {
  DeviceRange r{};
  return !S().mirror.Find(p, 1, &r) || r.kind == RangeKind::kMappedHost;
}

// A device range, or pinned host memory standing for one (PinnedAsDevice): true with `*p` a device
// address.
bool DeviceOrPinned(CUdeviceptr* p, uint64_t bytes) { return DeviceOk(*p, bytes) || PinnedAsDevice(p, bytes); }

// A host-to-device (`to_device`) or device-to-host copy of `n` bytes on a capturing stream: a host
// copy node of the capture (true, *r set); false when the stream is not capturing.
bool CaptureLinearCopy(uint64_t stream, bool to_device, void* host, CUdeviceptr dev, size_t n, CUresult* r) {
  if (!CaptureActive()) return false;
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = to_device ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  c.dstMemoryType = to_device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  if (to_device) {
    c.srcHost = host;
    c.dstDevice = dev;
  } else {
    c.dstHost = host;
    c.srcDevice = dev;
  }
  c.WidthInBytes = n;
  c.Height = c.Depth = 1;
  return CaptureHostCopy(stream, c, r);
}

CUresult HtoD(CUdeviceptr dst, const void* src, size_t n, CUstream hs, bool async) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t stream = 0;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (n == 0) return CUDA_SUCCESS;
  if (src == nullptr || !DeviceOrPinned(&dst, n)) return CUDA_ERROR_INVALID_VALUE;
  HostFuncGate(stream);  // the work after a host function waits for it to return
  if (CUresult r; CaptureLinearCopy(stream, true, const_cast<void*>(src), dst, n, &r)) return r;
  // Into pinned or managed memory, a synchronous copy is host to host: complete on return (CUDA
  // driver API, "API synchronization behavior").
  const bool host_to_host = !async && HostVisible(dst);
  CUresult r = Client::Get().CopyHtoD(dst, src, n, stream, !async);
  if (r != CUDA_SUCCESS || !host_to_host) return r;
  HandleReq wait{stream};
  return Client::Get().Call(Op::kStreamSynchronize, &wait, sizeof wait);
}

CUresult DtoH(void* dst, CUdeviceptr src, size_t n, CUstream hs, bool async) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t stream = 0;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (n == 0) return CUDA_SUCCESS;
  if (dst == nullptr || !DeviceOrPinned(&src, n)) return CUDA_ERROR_INVALID_VALUE;
  HostFuncGate(stream);  // the work after a host function waits for it to return
  if (CUresult r; CaptureLinearCopy(stream, false, dst, src, n, &r)) return r;
  return Client::Get().CopyDtoH(dst, src, n, stream, async);
}

CUresult DtoD(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t stream = 0;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (n == 0) return CUDA_SUCCESS;
  if (!DeviceOrPinned(&dst, n) || !DeviceOrPinned(&src, n)) return CUDA_ERROR_INVALID_VALUE;
  MemcpyReq q{dst, src, n, stream};
  if (CUresult r; CaptureFrame(stream, Op::kMemcpyDtoD, &q, sizeof q, offsetof(MemcpyReq, stream), &r)) return r;
  return Client::Get().Send(Op::kMemcpyDtoD, &q, sizeof q);
}

// cuMemcpy / cuMemcpyAsync: unified addressing; the direction comes from where each pointer lives.
CUresult Unified(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs, bool async) {
  const bool d_dev = DeviceOk(dst, n), s_dev = DeviceOk(src, n);
  if (d_dev && s_dev) return DtoD(dst, src, n, hs);
  if (d_dev) return HtoD(dst, reinterpret_cast<const void*>(src), n, hs, async);
  if (s_dev) return DtoH(reinterpret_cast<void*>(dst), src, n, hs, async);
  if (n != 0) std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

CUresult Copy2D(const CUDA_MEMCPY2D* c, CUstream hs, bool async) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t stream = 0;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  CUDA_MEMCPY2D k = *c;
  // Unified pointers: resolve to host or device.
  if (k.srcMemoryType == CU_MEMORYTYPE_UNIFIED) {
    k.srcMemoryType = DeviceOk(k.srcDevice, 1) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    if (k.srcMemoryType == CU_MEMORYTYPE_HOST) k.srcHost = reinterpret_cast<const void*>(k.srcDevice);
  }
  if (k.dstMemoryType == CU_MEMORYTYPE_UNIFIED) {
    k.dstMemoryType = DeviceOk(k.dstDevice, 1) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    if (k.dstMemoryType == CU_MEMORYTYPE_HOST) k.dstHost = reinterpret_cast<void*>(k.dstDevice);
  }
  if (k.WidthInBytes == 0 || k.Height == 0) return CUDA_SUCCESS;
  if (k.srcMemoryType == CU_MEMORYTYPE_ARRAY || k.dstMemoryType == CU_MEMORYTYPE_ARRAY) {
    return ArrayCopyBox(k, 0, 0, stream);
  }
  auto dev_ok = [](CUdeviceptr base, size_t x, size_t y, size_t pitch, size_t w, size_t h) {
    const uint64_t first = base + y * pitch + x;
    return DeviceOk(first, (h - 1) * pitch + w);
  };
  if (k.srcMemoryType == CU_MEMORYTYPE_DEVICE &&
      !dev_ok(k.srcDevice, k.srcXInBytes, k.srcY, k.srcPitch, k.WidthInBytes, k.Height))
    return CUDA_ERROR_INVALID_VALUE;
  if (k.dstMemoryType == CU_MEMORYTYPE_DEVICE &&
      !dev_ok(k.dstDevice, k.dstXInBytes, k.dstY, k.dstPitch, k.WidthInBytes, k.Height))
    return CUDA_ERROR_INVALID_VALUE;
  HostFuncGate(stream);  // the work after a host function waits for it to return
  if (CaptureActive()) {
    CUresult r = CUDA_SUCCESS;
    if (k.srcMemoryType == CU_MEMORYTYPE_DEVICE && k.dstMemoryType == CU_MEMORYTYPE_DEVICE) {
      Memcpy2DReq q{k.srcDevice + k.srcY * k.srcPitch + k.srcXInBytes,
                    k.srcPitch,
                    k.dstDevice + k.dstY * k.dstPitch + k.dstXInBytes,
                    k.dstPitch,
                    k.WidthInBytes,
                    k.Height,
                    stream,
                    kSideDevice,
                    kSideDevice};
      if (CaptureFrame(stream, Op::kMemcpy2D, &q, sizeof q, offsetof(Memcpy2DReq, stream), &r)) return r;
    } else {
      CUDA_MEMCPY3D c3{};
      c3.srcXInBytes = k.srcXInBytes;
      c3.srcY = k.srcY;
      c3.srcMemoryType = k.srcMemoryType;
      c3.srcHost = k.srcHost;
      c3.srcDevice = k.srcDevice;
      c3.srcPitch = k.srcPitch;
      c3.dstXInBytes = k.dstXInBytes;
      c3.dstY = k.dstY;
      c3.dstMemoryType = k.dstMemoryType;
      c3.dstHost = k.dstHost;
      c3.dstDevice = k.dstDevice;
      c3.dstPitch = k.dstPitch;
      c3.WidthInBytes = k.WidthInBytes;
      c3.Height = k.Height;
      c3.Depth = 1;
      if (CaptureHostCopy(stream, c3, &r)) return r;
    }
  }
  return Client::Get().Copy2D(k, stream, async);
}

// cuMemcpy3D: one 2D copy per slice. A device or host side's slice z starts (Z + z) * Height *
// Pitch bytes after its base (CUDA_MEMCPY3D: srcHeight / dstHeight are the rows of a slice); an
// array side keeps its own slices.
CUresult Copy3D(const CUDA_MEMCPY3D* c, CUstream hs, bool async) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (c == nullptr || c->reserved0 != nullptr || c->reserved1 != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (c->srcLOD != 0 || c->dstLOD != 0) return CUDA_ERROR_INVALID_VALUE;  // mipmap levels: no mipmapped arrays
  if (c->WidthInBytes == 0 || c->Height == 0 || c->Depth == 0) return CUDA_SUCCESS;
  uint64_t stream = 0;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  CUDA_MEMCPY3D k = *c;
  if (k.srcMemoryType == CU_MEMORYTYPE_UNIFIED) {
    k.srcMemoryType = DeviceOk(k.srcDevice, 1) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    if (k.srcMemoryType == CU_MEMORYTYPE_HOST) k.srcHost = reinterpret_cast<const void*>(k.srcDevice);
  }
  if (k.dstMemoryType == CU_MEMORYTYPE_UNIFIED) {
    k.dstMemoryType = DeviceOk(k.dstDevice, 1) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    if (k.dstMemoryType == CU_MEMORYTYPE_HOST) k.dstHost = reinterpret_cast<void*>(k.dstDevice);
  }
  const bool src_arr = k.srcMemoryType == CU_MEMORYTYPE_ARRAY, dst_arr = k.dstMemoryType == CU_MEMORYTYPE_ARRAY;
  if (k.Depth > 1 && ((!src_arr && k.srcHeight < k.srcY + k.Height) || (!dst_arr && k.dstHeight < k.dstY + k.Height))) {
    return CUDA_ERROR_INVALID_VALUE;  // slices would overlap
  }
  for (size_t z = 0; z < k.Depth; ++z) {
    CUDA_MEMCPY2D s{};
    s.srcXInBytes = k.srcXInBytes;
    s.srcY = k.srcY;
    s.srcMemoryType = k.srcMemoryType;
    s.srcPitch = k.srcPitch;
    s.srcArray = k.srcArray;
    const size_t src_slice = (k.srcZ + z) * k.srcHeight * k.srcPitch;
    if (k.srcMemoryType == CU_MEMORYTYPE_HOST) s.srcHost = static_cast<const uint8_t*>(k.srcHost) + src_slice;
    if (k.srcMemoryType == CU_MEMORYTYPE_DEVICE) s.srcDevice = k.srcDevice + src_slice;
    s.dstXInBytes = k.dstXInBytes;
    s.dstY = k.dstY;
    s.dstMemoryType = k.dstMemoryType;
    s.dstPitch = k.dstPitch;
    s.dstArray = k.dstArray;
    const size_t dst_slice = (k.dstZ + z) * k.dstHeight * k.dstPitch;
    if (k.dstMemoryType == CU_MEMORYTYPE_HOST) s.dstHost = static_cast<uint8_t*>(k.dstHost) + dst_slice;
    if (k.dstMemoryType == CU_MEMORYTYPE_DEVICE) s.dstDevice = k.dstDevice + dst_slice;
    s.WidthInBytes = k.WidthInBytes;
    s.Height = k.Height;
    const CUresult r = src_arr || dst_arr ? ArrayCopyBox(s, src_arr ? k.srcZ + z : 0, dst_arr ? k.dstZ + z : 0, stream)
                                          : Copy2D(&s, hs, async);
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

// `sync`: cuMemsetD* (not *Async), which is fully synchronous when its target is pinned host memory
// or managed memory (CUDA driver API, "API synchronization behavior").
CUresult Memset(CUdeviceptr dst, uint32_t value, uint32_t elem, size_t width, size_t height, size_t pitch, CUstream hs,
                bool sync = false) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t stream = 0;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (width == 0 || height == 0) return CUDA_SUCCESS;
  if (dst % elem != 0) return CUDA_ERROR_INVALID_VALUE;
  if (height > 1 && pitch < width * elem) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t span = (height - 1) * (height > 1 ? pitch : 0) + width * elem;
  const bool pinned = HostVisible(dst);  // pinned or managed memory
  if (!DeviceOrPinned(&dst, span)) return CUDA_ERROR_INVALID_VALUE;
  MemsetReq q{dst, width, height, height > 1 ? pitch : 0, stream, value, elem};
  if (CUresult r; CaptureFrame(stream, Op::kMemset, &q, sizeof q, offsetof(MemsetReq, stream), &r)) return r;
  if (CUresult r = Client::Get().Send(Op::kMemset, &q, sizeof q); r != CUDA_SUCCESS || !(sync && pinned)) return r;
  HandleReq wait{stream};
  return Client::Get().Call(Op::kStreamSynchronize, &wait, sizeof wait);
}

CUresult AllocHost(void** pp, size_t bytes, unsigned flags) {
  if (pp == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  (void)flags;
  if (void* p = Client::Get().PinnedAlloc(bytes)) {
    // Mapped for the device at once, as with unified addressing every pinned allocation is
    // (cuMemHostAlloc doc): a kernel may be given `p` itself.
    // (A backend that cannot map the window leaves copies working; cuMemHostGetDevicePointer
    // then says why.)
    CUdeviceptr d = 0;
    if (!Client::Get().network()) (void)MapHost(p, &d);
    *pp = p;
    return CUDA_SUCCESS;
  }
  // The window's pinned heap is full: fall back to ordinary memory copied through staging.
  void* p = std::aligned_alloc(4096, (bytes + 4095) & ~size_t{4095});
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  LogDebug("pinned heap full: " + std::to_string(bytes) + " bytes of host memory copied through");
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  s.registered[reinterpret_cast<uintptr_t>(p)] = bytes | kRegisteredOwned;
  *pp = p;
  return CUDA_SUCCESS;
}

// The managed allocation containing [p, p+bytes): its base (0 if none).
uint64_t ManagedBase(uint64_t p, uint64_t bytes) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.managed.upper_bound(p);
  if (it == s.managed.begin()) return 0;
  --it;
  return p >= it->first && bytes <= it->second && p - it->first <= it->second - bytes ? it->first : 0;
}

// cuMemPrefetchAsync/cuMemAdvise/cuStreamAttachMemAsync: [p, p+bytes) must be managed memory of
// this process (CUDA: CUDA_ERROR_INVALID_VALUE otherwise).
CUresult CheckManagedRange(uint64_t p, uint64_t bytes) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  return bytes != 0 && ManagedBase(p, bytes) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// What cuMemAdvise and cuMemPrefetchAsync said about managed memory, per page (4 KiB: advice
// applies to the pages a range touches, as CUDA's does), for cuMemRangeGetAttribute(s). Kept as
// runs of pages with the same state; a page never advised has the default state.
struct PageAdvice {
  bool read_mostly = false;
  CUmemLocation preferred{CU_MEM_LOCATION_TYPE_INVALID, 0};
  uint64_t accessed_by = 0;  // bit d: device d; bit 63: the host
  CUmemLocation prefetched{CU_MEM_LOCATION_TYPE_INVALID, 0};
  bool operator==(const PageAdvice& o) const {
    return read_mostly == o.read_mostly && SameLocation(preferred, o.preferred) && accessed_by == o.accessed_by &&
           SameLocation(prefetched, o.prefetched);
  }
  static bool SameLocation(const CUmemLocation& a, const CUmemLocation& b) {
    return a.type == b.type &&
           (a.type != CU_MEM_LOCATION_TYPE_DEVICE && a.type != CU_MEM_LOCATION_TYPE_HOST_NUMA ? true : a.id == b.id);
  }
};
constexpr uint64_t kAdvicePage = 4096;
struct AdviceRun {
  uint64_t end;
  PageAdvice state;
};
std::mutex g_advice_mu;
std::map<uint64_t, AdviceRun> g_advice;  // start -> run [start, end)

// The host locations in one form (the runtime's CU_DEVICE_CPU is any of them).
CUmemLocation Canonical(CUmemLocation loc) {
  if (loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) loc.type = CU_MEM_LOCATION_TYPE_HOST;
  if (loc.type == CU_MEM_LOCATION_TYPE_HOST) loc.id = 0;
  return loc;
}

// Applies `fn` to the state of every page of [p, p+bytes). Requires g_advice_mu.
template <typename Fn>
void ApplyAdvice(uint64_t p, uint64_t bytes, Fn fn) {
  const uint64_t a = p & ~(kAdvicePage - 1), b = (p + bytes + kAdvicePage - 1) & ~(kAdvicePage - 1);
  auto split = [](uint64_t at) {  // a run boundary at `at`
    auto it = g_advice.upper_bound(at);
    if (it == g_advice.begin()) return;
    --it;
    if (it->first < at && it->second.end > at) {
      g_advice[at] = AdviceRun{it->second.end, it->second.state};
      it->second.end = at;
    }
  };
  split(a);
  split(b);
  for (uint64_t at = a; at < b;) {  // fill the gaps with default runs
    auto it = g_advice.lower_bound(at);
    const uint64_t next = it == g_advice.end() ? b : std::min(it->first, b);
    if (next > at) g_advice[at] = AdviceRun{next, PageAdvice{}};
    at = it != g_advice.end() && it->first == next && next < b ? it->second.end : next;
  }
  for (auto it = g_advice.lower_bound(a); it != g_advice.end() && it->first < b; ++it) fn(it->second.state);
  // Merge equal neighbours around the range, so the map stays as small as the advice given.
  auto it = g_advice.lower_bound(a);
  if (it != g_advice.begin()) --it;
  while (it != g_advice.end() && it->first <= b) {
    auto next = std::next(it);
    if (next != g_advice.end() && next->first == it->second.end && next->second.state == it->second.state) {
      it->second.end = next->second.end;
      g_advice.erase(next);
    } else {
      it = next;
    }
  }
}
// Forgets the advice on a freed managed allocation.
void ForgetAdvice(uint64_t p, uint64_t bytes) {
  std::lock_guard<std::mutex> l(g_advice_mu);
  ApplyAdvice(p, bytes, [](PageAdvice&) {});
  const uint64_t a = p & ~(kAdvicePage - 1), b = (p + bytes + kAdvicePage - 1) & ~(kAdvicePage - 1);
  for (auto it = g_advice.lower_bound(a); it != g_advice.end() && it->first < b;) it = g_advice.erase(it);
}
// The states of the pages of [p, p+bytes), each once per run. Requires g_advice_mu.
std::vector<PageAdvice> AdviceOf(uint64_t p, uint64_t bytes) {
  const uint64_t a = p & ~(kAdvicePage - 1), b = (p + bytes + kAdvicePage - 1) & ~(kAdvicePage - 1);
  std::vector<PageAdvice> out;
  uint64_t at = a;
  auto it = g_advice.upper_bound(a);
  if (it != g_advice.begin() && std::prev(it)->second.end > a) --it;
  for (; it != g_advice.end() && it->first < b; ++it) {
    if (it->first > at) out.push_back(PageAdvice{});  // a gap: never advised
    out.push_back(it->second.state);
    at = it->second.end;
  }
  if (at < b) out.push_back(PageAdvice{});
  return out;
}

// A prefetch of managed memory: validated and ordered in its stream; there is nothing to move, as
// managed memory is the pinned heap, one set of pages the program and the device both address.
// The location is kept as the pages' last prefetch location (cuMemRangeGetAttribute).
CUresult Prefetch(CUdeviceptr p, size_t bytes, CUmemLocation loc, unsigned flags, CUstream hs) {
  if (CUresult r = CheckManagedRange(p, bytes); r != CUDA_SUCCESS) return r;
  uint64_t stream = 0;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  const int devices = static_cast<int>(Client::Get().devices().size());
  const bool ok = loc.type == CU_MEM_LOCATION_TYPE_HOST || loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT ||
                  (loc.type == CU_MEM_LOCATION_TYPE_DEVICE && loc.id >= 0 && loc.id < devices) ||
                  (loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA && loc.id >= 0);
  if (!ok) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> l(g_advice_mu);
  ApplyAdvice(p, bytes, [&](PageAdvice& a) { a.prefetched = Canonical(loc); });
  return CUDA_SUCCESS;
}

CUresult Advise(CUdeviceptr p, size_t bytes, CUmem_advise advice, CUmemLocation loc) {
  if (CUresult r = CheckManagedRange(p, bytes); r != CUDA_SUCCESS) return r;
  if (advice < CU_MEM_ADVISE_SET_READ_MOSTLY || advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY)
    return CUDA_ERROR_INVALID_VALUE;
  // Kept for cuMemRangeGetAttribute; with one set of pages there is nothing else to do.
  std::lock_guard<std::mutex> l(g_advice_mu);
  if (advice == CU_MEM_ADVISE_SET_READ_MOSTLY || advice == CU_MEM_ADVISE_UNSET_READ_MOSTLY) {
    ApplyAdvice(p, bytes, [&](PageAdvice& a) { a.read_mostly = advice == CU_MEM_ADVISE_SET_READ_MOSTLY; });
    return CUDA_SUCCESS;
  }
  if (advice == CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION) {
    ApplyAdvice(p, bytes, [](PageAdvice& a) { a.preferred = CUmemLocation{CU_MEM_LOCATION_TYPE_INVALID, 0}; });
    return CUDA_SUCCESS;
  }
  const int devices = static_cast<int>(Client::Get().devices().size());
  const bool host = loc.type == CU_MEM_LOCATION_TYPE_HOST || loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT ||
                    loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
  const bool ok = host || (loc.type == CU_MEM_LOCATION_TYPE_DEVICE && loc.id >= 0 && loc.id < devices && loc.id < 63);
  if (!ok) return CUDA_ERROR_INVALID_DEVICE;
  const uint64_t bit = host ? uint64_t{1} << 63 : uint64_t{1} << loc.id;
  ApplyAdvice(p, bytes, [&](PageAdvice& a) {
    if (advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION) a.preferred = Canonical(loc);
    if (advice == CU_MEM_ADVISE_SET_ACCESSED_BY) a.accessed_by |= bit;
    if (advice == CU_MEM_ADVISE_UNSET_ACCESSED_BY) a.accessed_by &= ~bit;
  });
  return CUDA_SUCCESS;
}

// cuMemRangeGetAttribute (CUDA driver API reference): what the advice and prefetches say about
// every page of a managed range.
CUresult RangeAttribute(void* data, size_t size, CUmem_range_attribute attr, CUdeviceptr p, size_t bytes) {
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckManagedRange(p, bytes); r != CUDA_SUCCESS) return r;
  std::vector<PageAdvice> pages;
  {
    std::lock_guard<std::mutex> l(g_advice_mu);
    pages = AdviceOf(p, bytes);
  }
  // The one location every page has (type INVALID when they differ or have none).
  auto common = [&](CUmemLocation PageAdvice::*field) {
    CUmemLocation loc = pages[0].*field;
    for (const PageAdvice& a : pages)
      if (!PageAdvice::SameLocation(a.*field, loc)) return CUmemLocation{CU_MEM_LOCATION_TYPE_INVALID, 0};
    return loc;
  };
  auto legacy = [](CUmemLocation loc) {  // a device id, CU_DEVICE_CPU, or CU_DEVICE_INVALID
    return loc.type == CU_MEM_LOCATION_TYPE_DEVICE    ? loc.id
           : loc.type == CU_MEM_LOCATION_TYPE_INVALID ? CU_DEVICE_INVALID
                                                      : CU_DEVICE_CPU;
  };
  auto put_int = [&](int v) {
    if (size != 4) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(data, &v, 4);
    return CUDA_SUCCESS;
  };
  switch (attr) {
    case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY:
      return put_int(std::all_of(pages.begin(), pages.end(), [](const PageAdvice& a) { return a.read_mostly; }));
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION: return put_int(legacy(common(&PageAdvice::preferred)));
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION: return put_int(legacy(common(&PageAdvice::prefetched)));
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE:
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE: {
      if (size != sizeof(CUmemLocationType)) return CUDA_ERROR_INVALID_VALUE;
      const CUmemLocationType t =
          common(attr == CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE ? &PageAdvice::preferred
                                                                        : &PageAdvice::prefetched)
              .type;
      std::memcpy(data, &t, sizeof t);
      return CUDA_SUCCESS;
    }
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID: return put_int(common(&PageAdvice::preferred).id);
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID: return put_int(common(&PageAdvice::prefetched).id);
    case CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY: {
      if (size == 0 || size % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
      uint64_t all = ~uint64_t{0};
      for (const PageAdvice& a : pages) all &= a.accessed_by;
      auto* out = static_cast<int*>(data);
      size_t n = 0;
      for (int d = 0; d < 64 && n < size / 4; ++d)
        if ((all >> d) & 1) out[n++] = d == 63 ? CU_DEVICE_CPU : d;
      for (; n < size / 4; ++n) out[n] = CU_DEVICE_INVALID;
      return CUDA_SUCCESS;
    }
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

// The pre-CUDA-12.2 forms name a device; CU_DEVICE_CPU (-1) is the host.
CUmemLocation LegacyLocation(CUdevice dev) {
  CUmemLocation loc{};
  loc.type = dev == CU_DEVICE_CPU ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev == CU_DEVICE_CPU ? 0 : dev;
  return loc;
}

CUresult FillPointerAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  DeviceRange r{};
  const bool dev = S().mirror.Find(ptr, 1, &r);
  void* pin_base = nullptr;
  uint64_t pin_bytes = 0;
  const bool pinned = !dev && Client::Get().PinnedRange(reinterpret_cast<void*>(ptr), &pin_base, &pin_bytes);
  const bool registered = !dev && !pinned && IsRegisteredHost(reinterpret_cast<void*>(ptr), 1);
  if (!dev && !pinned && !registered) {
    return CUDA_ERROR_INVALID_VALUE;  // not memory of this process's CUDA, whatever the attribute
  }
  GuestCtx* ctx = dev ? r.ctx : CurrentCtx();
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(ctx);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      // Managed memory is device memory to CUDA (cudart tells it apart by IS_MANAGED).
      *static_cast<unsigned*>(data) = dev && (r.kind != RangeKind::kMappedHost || ManagedBase(ptr, 1) != 0)
                                          ? CU_MEMORYTYPE_DEVICE
                                          : CU_MEMORYTYPE_HOST;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      if (!dev) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<CUdeviceptr*>(data) = ptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (pinned || registered) {
        *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
        return CUDA_SUCCESS;
      }
      if (r.kind == RangeKind::kMappedHost) {
        *static_cast<void**>(data) = static_cast<uint8_t*>(r.host) + (ptr - r.base);
        return CUDA_SUCCESS;
      }
      return CUDA_ERROR_INVALID_VALUE;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<int*>(data) = ManagedBase(ptr, 1) != 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = ctx != nullptr ? ctx->device : (dev ? r.device : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) =
          dev ? r.base : reinterpret_cast<CUdeviceptr>(pin_base != nullptr ? pin_base : reinterpret_cast<void*>(ptr));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = dev ? r.bytes : pin_bytes; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<int*>(data) = 1; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = dev ? r.base : ptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *static_cast<int*>(data) = 1; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *static_cast<int*>(data) = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: *static_cast<unsigned long long*>(data) = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: *static_cast<int*>(data) = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
      *static_cast<unsigned*>(data) = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *static_cast<CUmemoryPool*>(data) = nullptr; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

// cuMemAllocManaged on a transport whose device reaches the pinned heap at the program's own
// addresses (MANAGED_MEMORY = 1: shared-memory channels on the sim backend, and on the cuda backend
// where the GPU gives registered host memory its host address): the allocation is pinned memory,
// one set of pages that the program and the device both address by the same pointer. Zero-copy, so coherent with no
// migration; its size is bounded by the channel's pinned heap (docs/spec/managed-memory.md has the design for
// device-resident managed memory).
CUresult AllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned flags) {
  if (dptr == nullptr || bytes == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  const auto& devices = Client::Get().devices();
  const GuestCtx* ctx = CurrentCtx();
  if (Client::Get().network() || ctx->device < 0 || static_cast<size_t>(ctx->device) >= devices.size() ||
      devices[static_cast<size_t>(ctx->device)].attributes[CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY] == 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      LogWarn(
          "cuMemAllocManaged: managed memory needs a shared-memory channel to a server that maps pinned memory "
          "at the program's addresses (sim; cuda where the GPU gives registered host memory its host address); "
          "this device reports CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 0");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  void* p = Client::Get().PinnedAlloc(bytes);
  if (p == nullptr) {
    LogWarn("cuMemAllocManaged: " + std::to_string(bytes) +
            " bytes do not fit in the channel's pinned heap, where managed memory lives");
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUdeviceptr d = 0;
  if (CUresult r = MapHost(p, &d); r != CUDA_SUCCESS || d != reinterpret_cast<CUdeviceptr>(p)) {
    S().mirror.RemoveMappedHost(p);
    (void)Client::Get().PinnedFree(p);
    LogWarn("cuMemAllocManaged: the server could not map the memory at the program's address");
    return r != CUDA_SUCCESS ? r : CUDA_ERROR_NOT_SUPPORTED;
  }
  {
    State& s = S();
    std::lock_guard<std::mutex> l(s.mu);
    s.managed[reinterpret_cast<uintptr_t>(p)] = bytes;
  }
  *dptr = d;
  return CUDA_SUCCESS;
}

// cuMemFree of managed memory: like cuMemFree, it waits for the device's work (which may use it).
CUresult FreeManaged(CUdeviceptr p) {
  {
    State& s = S();
    std::lock_guard<std::mutex> l(s.mu);
    auto it = s.managed.find(static_cast<uintptr_t>(p));
    if (it == s.managed.end()) return CUDA_ERROR_INVALID_VALUE;
    ForgetAdvice(p, it->second);
    s.managed.erase(it);
  }
  CUresult r = Client::Get().Call(Op::kCtxSynchronize, nullptr, 0);
  void* host = reinterpret_cast<void*>(p);
  S().mirror.RemoveMappedHost(host);
  (void)Client::Get().PinnedFree(host);
  return r;
}

}  // namespace

namespace orion::guest {
CUresult Memcpy3D(const CUDA_MEMCPY3D* copy, CUstream hs, bool async) noexcept { return Copy3D(copy, hs, async); }
}  // namespace orion::guest

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  ORION_API(cuMemAlloc_v2);
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  MemAllocReq q{bytesize};
  U64Rep rep{};
  CUresult r = Client::Get().Call(Op::kMemAlloc, &q, sizeof q, &rep, sizeof rep);
  if (r != CUDA_SUCCESS) return r;
  if (rep.value == 0) {  // a successful allocation is never at 0
    LogError("oriond answered MemAlloc with a NULL pointer");
    return CUDA_ERROR_UNKNOWN;
  }
  S().mirror.Add({rep.value, bytesize, RangeKind::kDevice, CurrentCtx(), nullptr});
  *dptr = rep.value;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t width, size_t height,
                                                 unsigned int elementSize) {
  ORION_API(cuMemAllocPitch_v2);
  if (pPitch == nullptr || width == 0 || height == 0 || (elementSize != 4 && elementSize != 8 && elementSize != 16))
    return CUDA_ERROR_INVALID_VALUE;
  const size_t pitch = (width + 511) & ~size_t{511};  // texture pitch alignment of sm_50+ GPUs
  *pPitch = pitch;
  return cuMemAlloc_v2(dptr, pitch * height);
}

ORION_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  ORION_API(cuMemFree_v2);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (dptr == 0) return CUDA_SUCCESS;
  if (ManagedBase(dptr, 1) == dptr) return FreeManaged(dptr);
  if (CUresult r; GraphMemFree(dptr, &r)) return r;  // a graph allocation: free for the graph's next launch
  // The local range goes first, in one step with the check: once oriond frees the address, another
  // thread's cuMemAlloc may get it at once, and its new range must not be the one removed here.
  // (Two threads freeing one pointer: one of them gets CUDA_ERROR_INVALID_VALUE.)
  DeviceRange range{};
  if (!S().mirror.RemoveDevice(dptr, &range)) return CUDA_ERROR_INVALID_VALUE;
  MemFreeReq q{dptr};
  CUresult r = Client::Get().Call(Op::kMemFree, &q, sizeof q);
  if (r != CUDA_SUCCESS)
    S().mirror.Add(range);  // still allocated on the server: still ours
  else
    PoolFreed(dptr);
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  ORION_API(cuMemGetInfo_v2);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  MemGetInfoRep rep{};
  CUresult r = Client::Get().Call(Op::kMemGetInfo, nullptr, 0, &rep, sizeof rep);
  if (r != CUDA_SUCCESS) return r;
  if (free != nullptr) *free = rep.free;
  if (total != nullptr) *total = rep.total;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  ORION_API(cuMemGetAddressRange_v2);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  DeviceRange r{};
  if (!S().mirror.Find(dptr, 1, &r)) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = r.base;
  if (psize != nullptr) *psize = r.bytes;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) {
  ORION_API(cuMemAllocHost_v2);
  return AllocHost(pp, bytesize, 0);
}

ORION_EXPORT CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  ORION_API(cuMemHostAlloc);
  if ((Flags & ~0xFu) != 0) return CUDA_ERROR_INVALID_VALUE;
  return AllocHost(pp, bytesize, Flags);
}

ORION_EXPORT CUresult CUDAAPI cuMemFreeHost(void* p) {
  ORION_API(cuMemFreeHost);
  if (p == nullptr) return CUDA_SUCCESS;
  void* base = nullptr;
  uint64_t bytes = 0;
  if (Client::Get().PinnedRange(p, &base, &bytes)) {
    if (base != p) return CUDA_ERROR_INVALID_VALUE;
    S().mirror.RemoveMappedHost(p);
    return Client::Get().PinnedFree(p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.registered.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.registered.end() || (it->second & kRegisteredOwned) == 0) return CUDA_ERROR_INVALID_VALUE;
  s.registered.erase(it);
  std::free(p);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  ORION_API(cuMemHostGetDevicePointer_v2);
  if (pdptr == nullptr || p == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (Client::Get().network()) {
    LogWarn("cuMemHostGetDevicePointer: mapped host memory needs a shared-memory transport (not a network one)");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  void* base = nullptr;
  uint64_t bytes = 0;
  if (Client::Get().WindowAlias(p, &base, &bytes) == nullptr && !Client::Get().PinnedRange(p, &base, &bytes)) {
    LogWarn(
        "cuMemHostGetDevicePointer: only memory from cuMemHostAlloc/cuMemAllocHost, or registered with "
        "CU_MEMHOSTREGISTER_DEVICEMAP, can be mapped");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return MapHost(p, pdptr);
}

ORION_EXPORT CUresult CUDAAPI cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  ORION_API(cuMemHostGetFlags);
  if (pFlags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  void* base = nullptr;
  uint64_t bytes = 0;
  if (Client::Get().PinnedRange(p, &base, &bytes)) {
    *pFlags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

ORION_EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  ORION_API(cuMemHostRegister_v2);
  if (p == nullptr || bytesize == 0 || (Flags & ~0xFu) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  State& s = S();
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto overlaps = [&] {
    auto it = s.registered.upper_bound(a + bytesize - 1);
    return it != s.registered.begin() && (--it)->first + (it->second & kRegisteredSize) > a;
  };
  if (Flags & CU_MEMHOSTREGISTER_DEVICEMAP) {
    // Mapped: its pages move into the data window, where kernels reach them (Client::MapIntoWindow).
    if (Client::Get().network()) {
      LogWarn("cuMemHostRegister: CU_MEMHOSTREGISTER_DEVICEMAP needs a shared-memory transport (not a network one)");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    {
      std::lock_guard<std::mutex> l(s.mu);
      if (overlaps()) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    if (CUresult r = Client::Get().MapIntoWindow(p, bytesize); r != CUDA_SUCCESS) return r;
    {
      std::lock_guard<std::mutex> l(s.mu);
      s.registered[a] = bytesize | kRegisteredInWindow;
    }
    CUdeviceptr d = 0;  // mapped for the device at once, like a pinned allocation (AllocHost)
    (void)MapHost(p, &d);
    return CUDA_SUCCESS;
  }
  std::lock_guard<std::mutex> l(s.mu);
  if (overlaps()) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  s.registered[a] = bytesize;  // copies from it go through staging (copy-through)
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemHostUnregister(void* p) {
  ORION_API(cuMemHostUnregister);
  State& s = S();
  bool in_window = false;
  {
    std::lock_guard<std::mutex> l(s.mu);
    auto it = s.registered.find(reinterpret_cast<uintptr_t>(p));
    if (it == s.registered.end() || (it->second & kRegisteredOwned) != 0) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    in_window = (it->second & kRegisteredInWindow) != 0;
    s.registered.erase(it);
  }
  if (in_window) {
    S().mirror.RemoveMappedHost(p);
    // Nothing in flight may still use the pages when they leave the window.
    if (CUresult r = NeedCtx(); r == CUDA_SUCCESS) (void)Client::Get().Call(Op::kCtxSynchronize, nullptr, 0);
    (void)Client::Get().UnmapFromWindow(p);
  }
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  ORION_API(cuMemcpyHtoD_v2);
  return HtoD(dst, src, n, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t n) {
  ORION_API(cuMemcpyHtoD_v2_ptds);
  return HtoD(dst, src, n, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  ORION_API(cuMemcpyHtoDAsync_v2);
  return HtoD(dst, src, n, s, true);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  ORION_API(cuMemcpyHtoDAsync_v2_ptsz);
  return HtoD(dst, src, n, s, true);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  ORION_API(cuMemcpyDtoH_v2);
  return DtoH(dst, src, n, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t n) {
  ORION_API(cuMemcpyDtoH_v2_ptds);
  return DtoH(dst, src, n, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  ORION_API(cuMemcpyDtoHAsync_v2);
  return DtoH(dst, src, n, s, true);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  ORION_API(cuMemcpyDtoHAsync_v2_ptsz);
  return DtoH(dst, src, n, s, true);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  ORION_API(cuMemcpyDtoD_v2);
  return DtoD(dst, src, n, nullptr);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  ORION_API(cuMemcpyDtoD_v2_ptds);
  return DtoD(dst, src, n, nullptr);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  ORION_API(cuMemcpyDtoDAsync_v2);
  return DtoD(dst, src, n, s);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  ORION_API(cuMemcpyDtoDAsync_v2_ptsz);
  return DtoD(dst, src, n, s);
}
// Peer copies: device pointers are unique within the session, so a copy between two vGPUs'
// memories is a device-to-device copy in oriond (the contexts only name the devices).
static CUresult Peer(CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx, size_t n, CUstream s) {
  if (dstCtx == nullptr || srcCtx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return DtoD(dst, src, n, s);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx,
                                           size_t n) {
  ORION_API(cuMemcpyPeer);
  if (CUresult r = Peer(dst, dstCtx, src, srcCtx, n, nullptr); r != CUDA_SUCCESS) return r;
  return Client::Get().Call(Op::kCtxSynchronize, nullptr, 0);  // synchronous, like cuMemcpy
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyPeer_ptds(CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx,
                                                size_t n) {
  ORION_API(cuMemcpyPeer_ptds);
  if (CUresult r = Peer(dst, dstCtx, src, srcCtx, n, nullptr); r != CUDA_SUCCESS) return r;
  return Client::Get().Call(Op::kCtxSynchronize, nullptr, 0);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx,
                                                size_t n, CUstream s) {
  ORION_API(cuMemcpyPeerAsync);
  return Peer(dst, dstCtx, src, srcCtx, n, s);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src,
                                                     CUcontext srcCtx, size_t n, CUstream s) {
  ORION_API(cuMemcpyPeerAsync_ptsz);
  return Peer(dst, dstCtx, src, srcCtx, n, s);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  ORION_API(cuMemcpy);
  return Unified(dst, src, n, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  ORION_API(cuMemcpy_ptds);
  return Unified(dst, src, n, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  ORION_API(cuMemcpyAsync);
  return Unified(dst, src, n, s, true);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  ORION_API(cuMemcpyAsync_ptsz);
  return Unified(dst, src, n, s, true);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpy2D_v2(const CUDA_MEMCPY2D* p) {
  ORION_API(cuMemcpy2D_v2);
  return Copy2D(p, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D* p) {
  ORION_API(cuMemcpy2D_v2_ptds);
  return Copy2D(p, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* p) {
  ORION_API(cuMemcpy2DUnaligned_v2);
  return Copy2D(p, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D* p) {
  ORION_API(cuMemcpy2DUnaligned_v2_ptds);
  return Copy2D(p, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* p, CUstream s) {
  ORION_API(cuMemcpy2DAsync_v2);
  return Copy2D(p, s, true);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D* p, CUstream s) {
  ORION_API(cuMemcpy2DAsync_v2_ptsz);
  return Copy2D(p, s, true);
}

ORION_EXPORT CUresult CUDAAPI cuMemcpy3D_v2(const CUDA_MEMCPY3D* p) {
  ORION_API(cuMemcpy3D_v2);
  return Copy3D(p, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D* p) {
  ORION_API(cuMemcpy3D_v2_ptds);
  return Copy3D(p, nullptr, false);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* p, CUstream s) {
  ORION_API(cuMemcpy3DAsync_v2);
  return Copy3D(p, s, true);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D* p, CUstream s) {
  ORION_API(cuMemcpy3DAsync_v2_ptsz);
  return Copy3D(p, s, true);
}

#define ORION_MEMSET(name, elem, vtype)                                  \
  ORION_EXPORT CUresult CUDAAPI name(CUdeviceptr d, vtype v, size_t n) { \
    ORION_API(name);                                                     \
    return Memset(d, v, elem, n, 1, 0, nullptr, true);                   \
  }
#define ORION_MEMSET_ASYNC(name, elem, vtype)                                        \
  ORION_EXPORT CUresult CUDAAPI name(CUdeviceptr d, vtype v, size_t n, CUstream s) { \
    ORION_API(name);                                                                 \
    return Memset(d, v, elem, n, 1, 0, s);                                           \
  }
#define ORION_MEMSET2D(name, elem, vtype)                                                        \
  ORION_EXPORT CUresult CUDAAPI name(CUdeviceptr d, size_t pitch, vtype v, size_t w, size_t h) { \
    ORION_API(name);                                                                             \
    return Memset(d, v, elem, w, h, pitch, nullptr, true);                                       \
  }
#define ORION_MEMSET2D_ASYNC(name, elem, vtype)                                                              \
  ORION_EXPORT CUresult CUDAAPI name(CUdeviceptr d, size_t pitch, vtype v, size_t w, size_t h, CUstream s) { \
    ORION_API(name);                                                                                         \
    return Memset(d, v, elem, w, h, pitch, s);                                                               \
  }
ORION_MEMSET(cuMemsetD8_v2, 1, unsigned char)
ORION_MEMSET(cuMemsetD8_v2_ptds, 1, unsigned char)
ORION_MEMSET(cuMemsetD16_v2, 2, unsigned short)
ORION_MEMSET(cuMemsetD16_v2_ptds, 2, unsigned short)
ORION_MEMSET(cuMemsetD32_v2, 4, unsigned int)
ORION_MEMSET(cuMemsetD32_v2_ptds, 4, unsigned int)
ORION_MEMSET_ASYNC(cuMemsetD8Async, 1, unsigned char)
ORION_MEMSET_ASYNC(cuMemsetD8Async_ptsz, 1, unsigned char)
ORION_MEMSET_ASYNC(cuMemsetD16Async, 2, unsigned short)
ORION_MEMSET_ASYNC(cuMemsetD16Async_ptsz, 2, unsigned short)
ORION_MEMSET_ASYNC(cuMemsetD32Async, 4, unsigned int)
ORION_MEMSET_ASYNC(cuMemsetD32Async_ptsz, 4, unsigned int)
ORION_MEMSET2D(cuMemsetD2D8_v2, 1, unsigned char)
ORION_MEMSET2D(cuMemsetD2D8_v2_ptds, 1, unsigned char)
ORION_MEMSET2D(cuMemsetD2D16_v2, 2, unsigned short)
ORION_MEMSET2D(cuMemsetD2D16_v2_ptds, 2, unsigned short)
ORION_MEMSET2D(cuMemsetD2D32_v2, 4, unsigned int)
ORION_MEMSET2D(cuMemsetD2D32_v2_ptds, 4, unsigned int)
ORION_MEMSET2D_ASYNC(cuMemsetD2D8Async, 1, unsigned char)
ORION_MEMSET2D_ASYNC(cuMemsetD2D8Async_ptsz, 1, unsigned char)
ORION_MEMSET2D_ASYNC(cuMemsetD2D16Async, 2, unsigned short)
ORION_MEMSET2D_ASYNC(cuMemsetD2D16Async_ptsz, 2, unsigned short)
ORION_MEMSET2D_ASYNC(cuMemsetD2D32Async, 4, unsigned int)
ORION_MEMSET2D_ASYNC(cuMemsetD2D32Async_ptsz, 4, unsigned int)

ORION_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  ORION_API(cuPointerGetAttribute);
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!Client::Get().connected()) return CUDA_ERROR_NOT_INITIALIZED;
  return FillPointerAttribute(data, attribute, ptr);
}

ORION_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes,
                                                     void** data, CUdeviceptr ptr) {
  ORION_API(cuPointerGetAttributes);
  if (attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!Client::Get().connected()) return CUDA_ERROR_NOT_INITIALIZED;
  // Unlike cuPointerGetAttribute, unknown pointers are not an error: each attribute gets its
  // "not a CUDA pointer" value (CUDA docs: memory type 0, context NULL).
  for (unsigned i = 0; i < numAttributes; ++i) {
    if (data[i] == nullptr) continue;
    if (FillPointerAttribute(data[i], attributes[i], ptr) == CUDA_SUCCESS) continue;
    switch (attributes[i]) {
      case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data[i]) = nullptr; break;
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data[i]) = 0; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr*>(data[i]) = 0; break;
      case CU_POINTER_ATTRIBUTE_HOST_POINTER: *static_cast<void**>(data[i]) = nullptr; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data[i]) = -2; break;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data[i]) = 0; break;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data[i]) = 0; break;
      case CU_POINTER_ATTRIBUTE_BUFFER_ID: *static_cast<unsigned long long*>(data[i]) = 0; break;
      default: *static_cast<int*>(data[i]) = 0; break;
    }
  }
  return CUDA_SUCCESS;
}

}  // extern "C"

extern "C" {

// cuTensorMapEncodeTiled: encoded by oriond (the real driver on the cuda backend, which is where
// the map is used; Orion's own layout on sim, whose executor refuses TMA), after it checked the
// parameters against the driver's requirements and the global address against the session's
// device memory.
ORION_EXPORT CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                                     cuuint32_t tensorRank, void* globalAddress,
                                                     const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
                                                     const cuuint32_t* boxDim, const cuuint32_t* elementStrides,
                                                     CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                                     CUtensorMapL2promotion l2Promotion,
                                                     CUtensorMapFloatOOBfill oobFill) {
  ORION_API(cuTensorMapEncodeTiled);
  if (tensorMap == nullptr || reinterpret_cast<uintptr_t>(tensorMap) % 64 != 0 || tensorRank == 0 || tensorRank > 5 ||
      globalDim == nullptr || boxDim == nullptr || elementStrides == nullptr ||
      (tensorRank > 1 && globalStrides == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  TensorMapEncodeReq q{};
  q.data_type = static_cast<uint32_t>(tensorDataType);
  q.rank = tensorRank;
  q.global_address = reinterpret_cast<uint64_t>(globalAddress);
  for (cuuint32_t i = 0; i < tensorRank; ++i) {
    q.global_dim[i] = globalDim[i];
    q.box_dim[i] = boxDim[i];
    q.element_strides[i] = elementStrides[i];
    if (i + 1 < tensorRank) q.global_strides[i] = globalStrides[i];
  }
  q.interleave = static_cast<uint32_t>(interleave);
  q.swizzle = static_cast<uint32_t>(swizzle);
  q.l2_promotion = static_cast<uint32_t>(l2Promotion);
  q.oob_fill = static_cast<uint32_t>(oobFill);
  TensorMapRep rep{};
  if (CUresult r = Client::Get().Call(Op::kTensorMapEncodeTiled, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS)
    return r;
  static_assert(sizeof(CUtensorMap) == sizeof rep, "CUtensorMap is 16 words");
  std::memcpy(tensorMap, &rep, sizeof rep);
  return CUDA_SUCCESS;
}

// cuTensorMapEncodeIm2col: like cuTensorMapEncodeTiled, with the pixel box instead of the box.
ORION_EXPORT CUresult CUDAAPI cuTensorMapEncodeIm2col(
    CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank, void* globalAddress,
    const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const int* pixelBoxLowerCorner,
    const int* pixelBoxUpperCorner, cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn,
    const cuuint32_t* elementStrides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  ORION_API(cuTensorMapEncodeIm2col);
  if (tensorMap == nullptr || reinterpret_cast<uintptr_t>(tensorMap) % 64 != 0 || tensorRank < 3 || tensorRank > 5 ||
      globalDim == nullptr || globalStrides == nullptr || elementStrides == nullptr || pixelBoxLowerCorner == nullptr ||
      pixelBoxUpperCorner == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  TensorMapIm2colReq q{};
  q.base.data_type = static_cast<uint32_t>(tensorDataType);
  q.base.rank = tensorRank;
  q.base.global_address = reinterpret_cast<uint64_t>(globalAddress);
  for (cuuint32_t i = 0; i < tensorRank; ++i) {
    q.base.global_dim[i] = globalDim[i];
    q.base.element_strides[i] = elementStrides[i];
    if (i + 1 < tensorRank) q.base.global_strides[i] = globalStrides[i];
  }
  for (cuuint32_t i = 0; i + 2 < tensorRank; ++i) {
    q.lower_corner[i] = pixelBoxLowerCorner[i];
    q.upper_corner[i] = pixelBoxUpperCorner[i];
  }
  q.channels_per_pixel = channelsPerPixel;
  q.pixels_per_column = pixelsPerColumn;
  q.base.interleave = static_cast<uint32_t>(interleave);
  q.base.swizzle = static_cast<uint32_t>(swizzle);
  q.base.l2_promotion = static_cast<uint32_t>(l2Promotion);
  q.base.oob_fill = static_cast<uint32_t>(oobFill);
  TensorMapRep rep{};
  if (CUresult r = Client::Get().Call(Op::kTensorMapEncodeIm2col, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS)
    return r;
  std::memcpy(tensorMap, &rep, sizeof rep);
  return CUDA_SUCCESS;
}

// cuTensorMapReplaceAddress: the map goes to oriond, whose driver (or sim) rewrites its address.
ORION_EXPORT CUresult CUDAAPI cuTensorMapReplaceAddress(CUtensorMap* tensorMap, void* globalAddress) {
  ORION_API(cuTensorMapReplaceAddress);
  if (tensorMap == nullptr || reinterpret_cast<uintptr_t>(tensorMap) % 64 != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  TensorMapReplaceReq q{};
  static_assert(sizeof q.map == sizeof(CUtensorMap), "CUtensorMap is 16 words");
  std::memcpy(q.map, tensorMap, sizeof q.map);
  q.global_address = reinterpret_cast<uint64_t>(globalAddress);
  TensorMapRep rep{};
  if (CUresult r = Client::Get().Call(Op::kTensorMapReplaceAddress, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS)
    return r;
  std::memcpy(tensorMap, &rep, sizeof rep);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  ORION_API(cuMemAllocManaged);
  return AllocManaged(dptr, bytesize, flags);
}
ORION_EXPORT CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr p, size_t count, CUdevice dev, CUstream s) {
  ORION_API(cuMemPrefetchAsync);
  return Prefetch(p, count, LegacyLocation(dev), 0, s);
}
ORION_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t count, CUdevice dev, CUstream s) {
  ORION_API(cuMemPrefetchAsync_ptsz);
  return Prefetch(p, count, LegacyLocation(dev), 0, s);
}
ORION_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr p, size_t count, CUmemLocation loc, unsigned int flags,
                                                    CUstream s) {
  ORION_API(cuMemPrefetchAsync_v2);
  return Prefetch(p, count, loc, flags, s);
}
ORION_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr p, size_t count, CUmemLocation loc,
                                                         unsigned int flags, CUstream s) {
  ORION_API(cuMemPrefetchAsync_v2_ptsz);
  return Prefetch(p, count, loc, flags, s);
}
ORION_EXPORT CUresult CUDAAPI cuMemAdvise(CUdeviceptr p, size_t count, CUmem_advise advice, CUdevice dev) {
  ORION_API(cuMemAdvise);
  return Advise(p, count, advice, LegacyLocation(dev));
}
ORION_EXPORT CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr p, size_t count, CUmem_advise advice, CUmemLocation loc) {
  ORION_API(cuMemAdvise_v2);
  return Advise(p, count, advice, loc);
}
ORION_EXPORT CUresult CUDAAPI cuMemRangeGetAttribute(void* data, size_t size, CUmem_range_attribute attr, CUdeviceptr p,
                                                     size_t count) {
  ORION_API(cuMemRangeGetAttribute);
  return RangeAttribute(data, size, attr, p, count);
}
ORION_EXPORT CUresult CUDAAPI cuMemRangeGetAttributes(void** data, size_t* sizes, CUmem_range_attribute* attrs,
                                                      size_t n, CUdeviceptr p, size_t count) {
  ORION_API(cuMemRangeGetAttributes);
  if (n == 0 || data == nullptr || sizes == nullptr || attrs == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; ++i) {
    if (CUresult r = RangeAttribute(data[i], sizes[i], attrs[i], p, count); r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}
// Attaching managed memory to a stream only narrows which work may touch it while the device
// runs; with the pages shared there is nothing to move, so it is checked and ordered, no more.
ORION_EXPORT CUresult CUDAAPI cuStreamAttachMemAsync(CUstream hs, CUdeviceptr p, size_t length, unsigned int flags) {
  ORION_API(cuStreamAttachMemAsync);
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST && flags != CU_MEM_ATTACH_SINGLE)
    return CUDA_ERROR_INVALID_VALUE;
  const uint64_t base = ManagedBase(p, length == 0 ? 1 : length);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (base == 0 || (length == 0 && base != p)) return CUDA_ERROR_INVALID_VALUE;  // 0: the whole allocation
  uint64_t stream = 0;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}
ORION_EXPORT CUresult CUDAAPI cuStreamAttachMemAsync_ptsz(CUstream hs, CUdeviceptr p, size_t length,
                                                          unsigned int flags) {
  ORION_API(cuStreamAttachMemAsync_ptsz);
  return cuStreamAttachMemAsync(hs, p, length, flags);
}

}  // extern "C"
