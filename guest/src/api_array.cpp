// Exported driver API: CUDA arrays (cuArrayCreate, cuArray3DCreate, cuArrayDestroy, descriptors),
// copies to and from them (cuMemcpyHtoA/AtoH/DtoA/AtoD/AtoA, and the array sides of cuMemcpy2D and
// cuMemcpy3D through ArrayCopyBox), and texture and surface objects (cuTexObjectCreate,
// cuSurfObjectCreate, their descriptors).
//
// An array lives in oriond (host/src/session.cpp: ArrayRec, counted in the vGPU's quota); the
// CUarray an application holds points at this process's GuestArray, which keeps oriond's handle
// and the descriptor (cuArrayGetDescriptor answers here). Texture and surface object values are
// oriond's backend's own, so kernels receive them unchanged. Served: 1D, 2D and 3D arrays of 1, 2
// or 4 channels of 8/16/32-bit integers, half and float, optionally with CUDA_ARRAY3D_SURFACE_LDST;
// textures on arrays, linear and pitched memory. Refused, loudly (CUDA_ERROR_NOT_SUPPORTED):
// texture-gather, sparse, deferred-mapping arrays, layered or cubemap mipmapped arrays, resource views, and
// block-compressed or packed formats. Mipmapped arrays are served (their levels are arrays); on the
// sim backend a mipmapped texture samples level 0 (tex.level / tex.grad are refused there).
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "export.h"
#include "log.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

namespace {

struct GuestArray {
  uint64_t remote = 0;  // oriond's handle
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  uint64_t texel = 0, row_bytes = 0, rows = 0, slices = 0;
  const void* mipmap = nullptr;  // a level of this mipmapped array (destroyed with it)
};

struct GuestMipmap {
  uint64_t remote = 0;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  unsigned levels = 0;
  std::vector<CUarray> level_arrays;  // nullptr until asked for
};

struct GuestObject {
  CUDA_RESOURCE_DESC res{};
  CUDA_TEXTURE_DESC tex{};
};

std::mutex g_mu;
std::unordered_map<const void*, std::unique_ptr<GuestArray>> g_arrays;  // by the CUarray handed out
std::map<uint64_t, GuestObject> g_textures, g_surfaces;
std::unordered_map<const void*, std::unique_ptr<GuestMipmap>> g_mipmaps;  // by the CUmipmappedArray handed out

uint64_t FormatBytes(CUarray_format f) { return ArrayFormatBytes(static_cast<uint32_t>(f)); }

// A copy of the array's record (arrays may be destroyed by another thread meanwhile; oriond checks
// the handle again).
bool FindArray(CUarray a, GuestArray* out) {
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_arrays.find(a);
  if (it == g_arrays.end()) return false;
  *out = *it->second;
  return true;
}

void WarnOnce(const char* what) {
  static std::mutex mu;
  static std::map<std::string, bool> seen;
  std::lock_guard<std::mutex> l(mu);
  if (!seen[what]) {
    seen[what] = true;
    LogWarn(std::string(what) + " is not supported by Orion; returning CUDA_ERROR_NOT_SUPPORTED");
  }
}

CUresult CreateArray(CUarray* out, const CUDA_ARRAY3D_DESCRIPTOR& d) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  const uint64_t fb = FormatBytes(d.Format);
  if (fb == 0) {
    WarnOnce("a CUDA array of a block-compressed, planar or packed format");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if ((d.Flags & ~static_cast<unsigned>(CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) !=
      0) {
    WarnOnce("a texture-gather, sparse or deferred-mapping CUDA array");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  // A 1D layered array has Height 0 and its layers in Depth (oriond checks the rest).
  const bool layered = (d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  if (d.Width == 0 || (d.Height == 0 && d.Depth != 0 && !layered) ||
      (d.NumChannels != 1 && d.NumChannels != 2 && d.NumChannels != 4)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  ArrayCreateReq q{d.Width, d.Height, d.Depth, static_cast<uint32_t>(d.Format), d.NumChannels, d.Flags, 0};
  HandleRep rep{};
  if (CUresult r = Client::Get().Call(Op::kArrayCreate, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS) return r;
  auto a = std::make_unique<GuestArray>();
  a->remote = rep.handle;
  a->desc = d;
  a->texel = fb * d.NumChannels;
  a->row_bytes = d.Width * a->texel;
  a->rows = d.Height != 0 ? d.Height : 1;
  a->slices = d.Depth != 0 ? d.Depth : 1;
  *out = reinterpret_cast<CUarray>(a.get());
  std::lock_guard<std::mutex> l(g_mu);
  g_arrays.emplace(a.get(), std::move(a));
  return CUDA_SUCCESS;
}

// One side of a box copy, checked against what this process knows (oriond checks again).
bool Side(CUmemorytype type, const void* host, CUdeviceptr dev, CUarray array, size_t x, size_t y, size_t z,
          size_t pitch, uint64_t w, uint64_t h, bool is_dst, Client::CopySide* out) {
  *out = Client::CopySide{};
  if (type == CU_MEMORYTYPE_ARRAY) {
    GuestArray a;
    if (!FindArray(array, &a)) return false;
    if (x % a.texel != 0 || w % a.texel != 0 || x > a.row_bytes || w > a.row_bytes - x || y > a.rows ||
        h > a.rows - y || z >= a.slices) {
      return false;
    }
    out->kind = kSideArray;
    out->array = a.remote;
    out->x = x;
    out->y = y;
    out->z = z;
    return true;
  }
  if (h > 1 && pitch < w) return false;
  out->pitch = pitch;
  if (type == CU_MEMORYTYPE_HOST) {
    if (host == nullptr) return false;
    out->kind = kSideWindow;
    const uint8_t* p = static_cast<const uint8_t*>(host) + y * pitch + x;
    if (is_dst)
      out->dst = const_cast<uint8_t*>(p);
    else
      out->src = p;
    return true;
  }
  if (type != CU_MEMORYTYPE_DEVICE) return false;
  out->kind = kSideDevice;
  out->dptr = dev + y * pitch + x;
  return S().mirror.Find(out->dptr, (h - 1) * pitch + w, nullptr);
}

// A copy between a linear byte range of an array (its rows one after another, as cuMemcpyHtoA's
// offsets count) and linear memory: up to three boxes (the rest of the first row, whole rows, the
// start of the last).
CUresult LinearArrayCopy(CUarray array, size_t offset, size_t n, Client::CopySide other, bool to_array, CUstream hs) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t stream = 0;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  GuestArray a;
  if (!FindArray(array, &a)) return CUDA_ERROR_INVALID_VALUE;
  if (n == 0) return CUDA_SUCCESS;
  const uint64_t total = a.row_bytes * a.rows * a.slices;
  if (offset > total || n > total - offset || offset % a.texel != 0 || n % a.texel != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (other.kind == kSideDevice && !S().mirror.Find(other.dptr, n, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r; CaptureRefuse(stream, "a copy to or from a CUDA array", &r)) return r;
  uint64_t done = 0;
  while (done < n) {
    const uint64_t at = offset + done;
    const uint64_t row = at / a.row_bytes, x = at % a.row_bytes;
    Client::CopySide arr{};
    arr.kind = kSideArray;
    arr.array = a.remote;
    arr.x = x;
    arr.y = row % a.rows;
    arr.z = row / a.rows;
    uint64_t w = 0, h = 1;
    if (x != 0 || n - done < a.row_bytes) {
      w = std::min<uint64_t>(a.row_bytes - x, n - done);
    } else {
      w = a.row_bytes;
      h = std::min<uint64_t>((n - done) / a.row_bytes, a.rows - arr.y);  // whole rows within the slice
    }
    Client::CopySide lin = other;
    lin.pitch = w;
    if (lin.kind == kSideDevice)
      lin.dptr += done;
    else if (to_array)
      lin.src += done;
    else
      lin.dst += done;
    const CUresult r =
        to_array ? Client::Get().CopyArray(arr, lin, w, h, stream) : Client::Get().CopyArray(lin, arr, w, h, stream);
    if (r != CUDA_SUCCESS) return r;
    done += w * h;
  }
  return CUDA_SUCCESS;
}

CUresult ArrayToArray(CUarray dst, size_t dst_off, CUarray src, size_t src_off, size_t n) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  GuestArray d, s;
  if (!FindArray(dst, &d) || !FindArray(src, &s)) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t dt = d.row_bytes * d.rows * d.slices, st = s.row_bytes * s.rows * s.slices;
  if (n == 0) return CUDA_SUCCESS;
  if (dst_off > dt || n > dt - dst_off || src_off > st || n > st - src_off || dst_off % d.texel != 0 ||
      src_off % s.texel != 0 || n % d.texel != 0 || n % s.texel != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  uint64_t done = 0;
  while (done < n) {
    auto at = [&](const GuestArray& a, uint64_t off, Client::CopySide* c) {
      const uint64_t row = off / a.row_bytes;
      *c = Client::CopySide{};
      c->kind = kSideArray;
      c->array = a.remote;
      c->x = off % a.row_bytes;
      c->y = row % a.rows;
      c->z = row / a.rows;
      return a.row_bytes - c->x;
    };
    Client::CopySide dc, sc;
    const uint64_t w = std::min<uint64_t>({at(d, dst_off + done, &dc), at(s, src_off + done, &sc), uint64_t{n - done}});
    if (CUresult r = Client::Get().CopyArray(dc, sc, w, 1, 0); r != CUDA_SUCCESS) return r;
    done += w;
  }
  return CUDA_SUCCESS;
}

CUresult ObjectCreate(uint64_t* out, const CUDA_RESOURCE_DESC* res, const CUDA_TEXTURE_DESC* tex,
                      const CUDA_RESOURCE_VIEW_DESC* view, bool surface) {
  if (out == nullptr || res == nullptr || (!surface && tex == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (view != nullptr) {
    WarnOnce("a texture object with a resource view (CUDA_RESOURCE_VIEW_DESC)");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  TexObjectReq q{};
  q.res_type = static_cast<uint32_t>(res->resType);
  q.surface = surface ? 1 : 0;
  switch (res->resType) {
    case CU_RESOURCE_TYPE_ARRAY: {
      GuestArray a;
      if (!FindArray(res->res.array.hArray, &a)) return CUDA_ERROR_INVALID_HANDLE;
      q.res = a.remote;
      break;
    }
    case CU_RESOURCE_TYPE_LINEAR: {
      const uint64_t texel = FormatBytes(res->res.linear.format) * res->res.linear.numChannels;
      if (texel == 0 || res->res.linear.sizeInBytes % texel != 0) return CUDA_ERROR_INVALID_VALUE;
      q.res = res->res.linear.devPtr;
      q.format = static_cast<uint32_t>(res->res.linear.format);
      q.channels = res->res.linear.numChannels;
      q.width = res->res.linear.sizeInBytes / texel;
      break;
    }
    case CU_RESOURCE_TYPE_PITCH2D:
      q.res = res->res.pitch2D.devPtr;
      q.format = static_cast<uint32_t>(res->res.pitch2D.format);
      q.channels = res->res.pitch2D.numChannels;
      q.width = res->res.pitch2D.width;
      q.height = res->res.pitch2D.height;
      q.pitch = res->res.pitch2D.pitchInBytes;
      break;
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: {
      std::lock_guard<std::mutex> l(g_mu);
      auto it = g_mipmaps.find(res->res.mipmap.hMipmappedArray);
      if (it == g_mipmaps.end()) return CUDA_ERROR_INVALID_HANDLE;
      q.res = it->second->remote;
      break;
    }
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  if (res->resType != CU_RESOURCE_TYPE_ARRAY && surface) return CUDA_ERROR_INVALID_VALUE;
  if (tex != nullptr && !surface) {
    for (int i = 0; i < 3; ++i) q.address_mode[i] = static_cast<uint32_t>(tex->addressMode[i]);
    q.filter_mode = static_cast<uint32_t>(tex->filterMode);
    q.flags = tex->flags;
    std::memcpy(q.border_color, tex->borderColor, sizeof q.border_color);
    q.mipmap_filter = static_cast<uint32_t>(tex->mipmapFilterMode);
    q.max_anisotropy = tex->maxAnisotropy;
    std::memcpy(&q.mipmap_bias, &tex->mipmapLevelBias, 4);
    std::memcpy(&q.min_level, &tex->minMipmapLevelClamp, 4);
    std::memcpy(&q.max_level, &tex->maxMipmapLevelClamp, 4);
  }
  U64Rep rep{};
  if (CUresult r = Client::Get().Call(Op::kTexObjectCreate, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS)
    return r;
  GuestObject o;
  o.res = *res;
  if (tex != nullptr && !surface) o.tex = *tex;
  std::lock_guard<std::mutex> l(g_mu);
  (surface ? g_surfaces : g_textures)[rep.value] = o;
  *out = rep.value;
  return CUDA_SUCCESS;
}

CUresult ObjectDestroy(uint64_t object, bool surface) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto& m = surface ? g_surfaces : g_textures;
    if (m.erase(object) == 0) return CUDA_ERROR_INVALID_VALUE;
  }
  ObjectReq q{object, surface ? 1u : 0u, 0};
  return Client::Get().Call(Op::kTexObjectDestroy, &q, sizeof q);
}

bool FindObject(uint64_t object, bool surface, GuestObject* out) {
  std::lock_guard<std::mutex> l(g_mu);
  auto& m = surface ? g_surfaces : g_textures;
  auto it = m.find(object);
  if (it == m.end()) return false;
  *out = it->second;
  return true;
}

}  // namespace

namespace orion::guest {

CUresult ArrayCopyBox(const CUDA_MEMCPY2D& k, size_t src_z, size_t dst_z, uint64_t stream) noexcept {
  Client::CopySide src, dst;
  const uint64_t w = k.WidthInBytes, h = k.Height;
  if (w == 0 || h == 0) return CUDA_SUCCESS;
  if (!Side(k.srcMemoryType, k.srcHost, k.srcDevice, k.srcArray, k.srcXInBytes, k.srcY, src_z, k.srcPitch, w, h, false,
            &src) ||
      !Side(k.dstMemoryType, k.dstHost, k.dstDevice, k.dstArray, k.dstXInBytes, k.dstY, dst_z, k.dstPitch, w, h, true,
            &dst)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r; CaptureRefuse(stream, "a copy to or from a CUDA array", &r)) return r;
  return Client::Get().CopyArray(dst, src, w, h, stream);
}

}  // namespace orion::guest

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* d) {
  ORION_API(cuArrayCreate_v2);
  if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR d3{};
  d3.Width = d->Width;
  d3.Height = d->Height;
  d3.Format = d->Format;
  d3.NumChannels = d->NumChannels;
  return CreateArray(pHandle, d3);
}

ORION_EXPORT CUresult CUDAAPI cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  ORION_API(cuArray3DCreate_v2);
  if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return CreateArray(pHandle, *d);
}

ORION_EXPORT CUresult CUDAAPI cuArrayDestroy(CUarray a) {
  ORION_API(cuArrayDestroy);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  std::unique_ptr<GuestArray> g;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_arrays.find(a);
    if (it == g_arrays.end() || it->second->mipmap != nullptr)
      return CUDA_ERROR_INVALID_HANDLE;  // a level goes with its owner
    g = std::move(it->second);
    g_arrays.erase(it);
  }
  HandleReq q{g->remote};
  return Client::Get().Call(Op::kArrayDestroy, &q, sizeof q);
}

ORION_EXPORT CUresult CUDAAPI cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* out, CUarray a) {
  ORION_API(cuArrayGetDescriptor_v2);
  GuestArray g;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!FindArray(a, &g)) return CUDA_ERROR_INVALID_HANDLE;
  out->Width = g.desc.Width;
  out->Height = g.desc.Height;
  out->Format = g.desc.Format;
  out->NumChannels = g.desc.NumChannels;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* out, CUarray a) {
  ORION_API(cuArray3DGetDescriptor_v2);
  GuestArray g;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!FindArray(a, &g)) return CUDA_ERROR_INVALID_HANDLE;
  *out = g.desc;
  return CUDA_SUCCESS;
}

#define ORION_HTOA(name, stream_expr)                                                                         \
  ORION_EXPORT CUresult CUDAAPI name(CUarray dst, size_t off, const void* src, size_t n ORION_STREAM_PARAM) { \
    ORION_API(name);                                                                                          \
    if (src == nullptr && n != 0) return CUDA_ERROR_INVALID_VALUE;                                            \
    Client::CopySide h{};                                                                                     \
    h.kind = kSideWindow;                                                                                     \
    h.src = static_cast<const uint8_t*>(src);                                                                 \
    return LinearArrayCopy(dst, off, n, h, true, stream_expr);                                                \
  }
#define ORION_ATOH(name, stream_expr)                                                                   \
  ORION_EXPORT CUresult CUDAAPI name(void* dst, CUarray src, size_t off, size_t n ORION_STREAM_PARAM) { \
    ORION_API(name);                                                                                    \
    if (dst == nullptr && n != 0) return CUDA_ERROR_INVALID_VALUE;                                      \
    Client::CopySide h{};                                                                               \
    h.kind = kSideWindow;                                                                               \
    h.dst = static_cast<uint8_t*>(dst);                                                                 \
    return LinearArrayCopy(src, off, n, h, false, stream_expr);                                         \
  }
#define ORION_STREAM_PARAM
ORION_HTOA(cuMemcpyHtoA_v2, nullptr)
ORION_HTOA(cuMemcpyHtoA_v2_ptds, nullptr)
ORION_ATOH(cuMemcpyAtoH_v2, nullptr)
ORION_ATOH(cuMemcpyAtoH_v2_ptds, nullptr)
#undef ORION_STREAM_PARAM
#define ORION_STREAM_PARAM , CUstream s
ORION_HTOA(cuMemcpyHtoAAsync_v2, s)
ORION_HTOA(cuMemcpyHtoAAsync_v2_ptsz, s)
ORION_ATOH(cuMemcpyAtoHAsync_v2, s)
ORION_ATOH(cuMemcpyAtoHAsync_v2_ptsz, s)
#undef ORION_STREAM_PARAM
#undef ORION_HTOA
#undef ORION_ATOH

#define ORION_DTOA(name)                                                                   \
  ORION_EXPORT CUresult CUDAAPI name(CUarray dst, size_t off, CUdeviceptr src, size_t n) { \
    ORION_API(name);                                                                       \
    Client::CopySide d{};                                                                  \
    d.kind = kSideDevice;                                                                  \
    d.dptr = src;                                                                          \
    return LinearArrayCopy(dst, off, n, d, true, nullptr);                                 \
  }
#define ORION_ATOD(name)                                                                   \
  ORION_EXPORT CUresult CUDAAPI name(CUdeviceptr dst, CUarray src, size_t off, size_t n) { \
    ORION_API(name);                                                                       \
    Client::CopySide d{};                                                                  \
    d.kind = kSideDevice;                                                                  \
    d.dptr = dst;                                                                          \
    return LinearArrayCopy(src, off, n, d, false, nullptr);                                \
  }
ORION_DTOA(cuMemcpyDtoA_v2)
ORION_DTOA(cuMemcpyDtoA_v2_ptds)
ORION_ATOD(cuMemcpyAtoD_v2)
ORION_ATOD(cuMemcpyAtoD_v2_ptds)
#undef ORION_DTOA
#undef ORION_ATOD
ORION_EXPORT CUresult CUDAAPI cuMemcpyAtoA_v2(CUarray dst, size_t dst_off, CUarray src, size_t src_off, size_t n) {
  ORION_API(cuMemcpyAtoA_v2);
  return ArrayToArray(dst, dst_off, src, src_off, n);
}
ORION_EXPORT CUresult CUDAAPI cuMemcpyAtoA_v2_ptds(CUarray dst, size_t dst_off, CUarray src, size_t src_off, size_t n) {
  ORION_API(cuMemcpyAtoA_v2_ptds);
  return ArrayToArray(dst, dst_off, src, src_off, n);
}

ORION_EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray* out, const CUDA_ARRAY3D_DESCRIPTOR* d,
                                                     unsigned int numLevels) {
  ORION_API(cuMipmappedArrayCreate);
  if (out == nullptr || d == nullptr || numLevels == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (FormatBytes(d->Format) == 0 || (d->Flags & ~static_cast<unsigned>(CUDA_ARRAY3D_SURFACE_LDST)) != 0) {
    WarnOnce("a mipmapped array of this format or with these flags");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (d->Width == 0 || (d->Height == 0 && d->Depth != 0)) return CUDA_ERROR_INVALID_VALUE;
  MipmapCreateReq q{
      {d->Width, d->Height, d->Depth, static_cast<uint32_t>(d->Format), d->NumChannels, d->Flags, 0}, numLevels, 0};
  HandleRep rep{};
  if (CUresult r = Client::Get().Call(Op::kMipmappedArrayCreate, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS)
    return r;
  auto m = std::make_unique<GuestMipmap>();
  m->remote = rep.handle;
  m->desc = *d;
  m->levels = numLevels;
  m->level_arrays.assign(numLevels, nullptr);
  *out = reinterpret_cast<CUmipmappedArray>(m.get());
  std::lock_guard<std::mutex> l(g_mu);
  g_mipmaps.emplace(m.get(), std::move(m));
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMipmappedArrayGetLevel(CUarray* out, CUmipmappedArray mipmap, unsigned int level) {
  ORION_API(cuMipmappedArrayGetLevel);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t remote = 0;
  CUDA_ARRAY3D_DESCRIPTOR d{};
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_mipmaps.find(mipmap);
    if (it == g_mipmaps.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (level >= it->second->levels) return CUDA_ERROR_INVALID_VALUE;
    if (it->second->level_arrays[level] != nullptr) {
      *out = it->second->level_arrays[level];
      return CUDA_SUCCESS;
    }
    remote = it->second->remote;
    d = it->second->desc;
  }
  MipmapLevelReq q{remote, level, 0};
  HandleRep rep{};
  if (CUresult r = Client::Get().Call(Op::kMipmappedArrayGetLevel, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS)
    return r;
  auto a = std::make_unique<GuestArray>();
  a->remote = rep.handle;
  a->desc = d;
  a->desc.Width = std::max<size_t>(d.Width >> level, 1);
  if (d.Height != 0) a->desc.Height = std::max<size_t>(d.Height >> level, 1);
  if (d.Depth != 0) a->desc.Depth = std::max<size_t>(d.Depth >> level, 1);
  a->texel = FormatBytes(d.Format) * d.NumChannels;
  a->row_bytes = a->desc.Width * a->texel;
  a->rows = a->desc.Height != 0 ? a->desc.Height : 1;
  a->slices = a->desc.Depth != 0 ? a->desc.Depth : 1;
  a->mipmap = mipmap;
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_mipmaps.find(mipmap);
  if (it == g_mipmaps.end()) return CUDA_ERROR_INVALID_HANDLE;  // destroyed meanwhile
  if (it->second->level_arrays[level] == nullptr) {
    it->second->level_arrays[level] = reinterpret_cast<CUarray>(a.get());
    g_arrays.emplace(a.get(), std::move(a));
  }
  *out = it->second->level_arrays[level];
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray mipmap) {
  ORION_API(cuMipmappedArrayDestroy);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t remote = 0;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_mipmaps.find(mipmap);
    if (it == g_mipmaps.end()) return CUDA_ERROR_INVALID_HANDLE;
    remote = it->second->remote;
    for (CUarray a : it->second->level_arrays) {
      if (a != nullptr) g_arrays.erase(a);
    }
    g_mipmaps.erase(it);
  }
  HandleReq q{remote};
  return Client::Get().Call(Op::kMipmappedArrayDestroy, &q, sizeof q);
}

ORION_EXPORT CUresult CUDAAPI cuTexObjectCreate(CUtexObject* out, const CUDA_RESOURCE_DESC* res,
                                                const CUDA_TEXTURE_DESC* tex, const CUDA_RESOURCE_VIEW_DESC* view) {
  ORION_API(cuTexObjectCreate);
  uint64_t v = 0;
  CUresult r = ObjectCreate(&v, res, tex, view, false);
  if (r == CUDA_SUCCESS) *out = v;
  return r;
}
ORION_EXPORT CUresult CUDAAPI cuTexObjectDestroy(CUtexObject o) {
  ORION_API(cuTexObjectDestroy);
  return ObjectDestroy(o, false);
}
ORION_EXPORT CUresult CUDAAPI cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC* out, CUtexObject o) {
  ORION_API(cuTexObjectGetResourceDesc);
  GuestObject g;
  if (out == nullptr || !FindObject(o, false, &g)) return CUDA_ERROR_INVALID_VALUE;
  *out = g.res;
  return CUDA_SUCCESS;
}
ORION_EXPORT CUresult CUDAAPI cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC* out, CUtexObject o) {
  ORION_API(cuTexObjectGetTextureDesc);
  GuestObject g;
  if (out == nullptr || !FindObject(o, false, &g)) return CUDA_ERROR_INVALID_VALUE;
  *out = g.tex;
  return CUDA_SUCCESS;
}
ORION_EXPORT CUresult CUDAAPI cuSurfObjectCreate(CUsurfObject* out, const CUDA_RESOURCE_DESC* res) {
  ORION_API(cuSurfObjectCreate);
  uint64_t v = 0;
  CUresult r = ObjectCreate(&v, res, nullptr, nullptr, true);
  if (r == CUDA_SUCCESS) *out = v;
  return r;
}
ORION_EXPORT CUresult CUDAAPI cuSurfObjectDestroy(CUsurfObject o) {
  ORION_API(cuSurfObjectDestroy);
  return ObjectDestroy(o, true);
}
ORION_EXPORT CUresult CUDAAPI cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC* out, CUsurfObject o) {
  ORION_API(cuSurfObjectGetResourceDesc);
  GuestObject g;
  if (out == nullptr || !FindObject(o, true, &g)) return CUDA_ERROR_INVALID_VALUE;
  *out = g.res;
  return CUDA_SUCCESS;
}

}  // extern "C"
