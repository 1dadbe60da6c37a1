// session_array.cpp — CUDA arrays, mipmapped arrays, texture and surface objects: the Session handlers of these ops
// (ops.def).
#include "session_impl.h"

namespace orion::host::detail {
namespace {

uint64_t FormatBytes(uint32_t format) { return ArrayFormatBytes(format); }
bool IntegerFormat32(uint32_t format) {
  return format == CU_AD_FORMAT_UNSIGNED_INT32 || format == CU_AD_FORMAT_SIGNED_INT32;
}

// Extents a GPU of compute capability 7.5+ accepts (CUDA C++ Programming Guide, "Features and
// Technical Specifications": maximum 1D / 2D / 3D CUDA array and texture sizes).
constexpr uint64_t kMaxArray1D = uint64_t{1} << 17, kMaxArray2DW = uint64_t{1} << 17, kMaxArray2DH = uint64_t{1} << 16;
constexpr uint64_t kMaxArray3D = uint64_t{1} << 14, kMaxTexLinear = uint64_t{1} << 27;
// Layered and cubemap arrays (same table): 1D layered 32768 x 2048 layers, 2D layered 32768 x
// 32768 x 2048 layers, cubemap 32768 x 32768, cubemap layered 32768 x 32768 x 2046 layers (of 6 faces).
constexpr uint64_t kMaxLayeredW = uint64_t{1} << 15, kMaxLayers = 2048, kMaxCubeLayers = 2046;

}  // namespace

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

CUresult Session::OnArrayCreate(const ArrayCreateReq& q, Call& c) {
  if (cur_ctx_ == 0) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t id = 0;
  const CUresult r = CreateArray(q, 0, &id);
  if (r == CUDA_SUCCESS) c.Put(HandleRep{id});
  return r;
}

CUresult Session::CreateArray(const ArrayCreateReq& q, uint64_t want, uint64_t* id) {
  CUresult r = CUDA_SUCCESS;
  if (r = CheckArrayDesc(q, "ArrayCreate"); r != CUDA_SUCCESS) return r;
  if (HandlesFull()) return CUDA_ERROR_OUT_OF_MEMORY;
  ArrayRec a = ArrayGeometry(q.format, q.channels, q.flags, q.width, q.height, q.depth);
  a.dev = cur_dev_;
  if (!Charge(cur_dev_, ArrayBytes(a), kAllocGranularity, "ArrayCreate", "cuArray3DCreate", &a.charged)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Backend::ArraySpec spec{q.width, q.height, q.depth, q.format, q.channels, q.flags};
  r = b_->ArrayCreate(spec, &a.backend);
  if (r != CUDA_SUCCESS) {
    Uncharge(cur_dev_, a.charged);
    return r;
  }
  *id = want != 0 ? want : NewId();
  arrays_.Add(*id, a);
  return r;
}

CUresult Session::OnArrayDestroy(const HandleReq& q, Call& /*c*/) {
  ArrayRec* a = LiveArray(q.handle);
  if (a == nullptr || a->mipmap != 0) {
    return CUDA_ERROR_INVALID_HANDLE;
  }  // a level goes with its owner
  a->destroyed = true;
  MaybeFreeArray(q.handle);
  return CUDA_SUCCESS;
}

CUresult Session::OnMemcpyArray(const ArrayCopyReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  void* s = nullptr;
  if (q.width_bytes == 0 || q.height == 0) return r;
  Backend::CopySide src, dst;
  if (!Stream(q.stream, &s) ||
      !CopySideOk(q.src_side, q.src, q.src_pitch, q.src_x, q.src_y, q.src_z, q.width_bytes, q.height, &src) ||
      !CopySideOk(q.dst_side, q.dst, q.dst_pitch, q.dst_x, q.dst_y, q.dst_z, q.width_bytes, q.height, &dst)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return b_->MemcpyArray(dst, src, q.width_bytes, q.height, s);
}

CUresult Session::OnTexObjectCreate(const TexObjectReq& q, Call& c) {
  if (cur_ctx_ == 0) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t object = 0;
  const CUresult r = CreateTexObject(q, &object);
  if (r == CUDA_SUCCESS) c.Put(U64Rep{object});
  return r;
}

CUresult Session::CreateTexObject(const TexObjectReq& q, uint64_t* object) {
  CUresult r = CUDA_SUCCESS;
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
    return CUDA_ERROR_NOT_SUPPORTED;
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
      ok = ok && q.width <= kMaxArray2DW && q.height != 0 && q.height <= kMaxArray2DH && q.pitch >= q.width * texel &&
           Span2D(q.height, q.pitch, q.width * texel, &span);
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
  if (!ok) return CUDA_ERROR_INVALID_VALUE;
  if (HandlesFull()) return CUDA_ERROR_OUT_OF_MEMORY;
  r = b_->TexObjectCreate(t, object);
  if (r != CUDA_SUCCESS) return r;
  if (!texobjs_.Add({*object, t.surface}, TexRec{array_id, mipmap_id, cur_dev_, q})) {
    p_.log->error("sess={} op=TexObjectCreate: the backend returned object {:#x} twice", p_.session_id, *object);
    (void)b_->TexObjectDestroy(*object, t.surface);
    return CUDA_ERROR_UNKNOWN;
  }
  if (array_id != 0) ++arrays_.Known(array_id).objects;
  if (mipmap_id != 0) ++mipmaps_.Known(mipmap_id).objects;
  return r;
}

CUresult Session::OnTexObjectDestroy(const ObjectReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  const TexRec* t = q.surface <= 1 ? texobjs_.Find({q.object, q.surface != 0}) : nullptr;
  if (t == nullptr) return CUDA_ERROR_INVALID_VALUE;
  r = b_->TexObjectDestroy(q.object, q.surface != 0);
  if (r != CUDA_SUCCESS) return r;
  const uint64_t array_id = t->array, mipmap_id = t->mipmap;
  texobjs_.Erase({q.object, q.surface != 0});
  if (array_id != 0) {
    --arrays_.Known(array_id).objects;
    MaybeFreeArray(array_id);
  }
  if (mipmap_id != 0) {
    --mipmaps_.Known(mipmap_id).objects;
    MaybeFreeMipmap(mipmap_id);
  }
  return r;
}

CUresult Session::OnMipmappedArrayCreate(const MipmapCreateReq& q, Call& c) {
  if (cur_ctx_ == 0) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t id = 0;
  const CUresult r = CreateMipmap(q, 0, &id);
  if (r == CUDA_SUCCESS) c.Put(HandleRep{id});
  return r;
}

CUresult Session::CreateMipmap(const MipmapCreateReq& q, uint64_t want, uint64_t* id) {
  CUresult r = CUDA_SUCCESS;
  const ArrayCreateReq& a = q.array;
  if ((a.flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0) {
    p_.log->warn("sess={} op=MipmappedArrayCreate: layered and cubemap mipmapped arrays are not served", p_.session_id);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (r = CheckArrayDesc(a, "MipmappedArrayCreate"); r != CUDA_SUCCESS) return r;
  const uint64_t largest = std::max({a.width, a.height, a.depth});
  uint32_t max_levels = 1;
  while ((largest >> max_levels) != 0 && max_levels < 64) ++max_levels;
  if (q.reserved != 0 || q.levels == 0 || q.levels > max_levels) return CUDA_ERROR_INVALID_VALUE;
  if (HandlesFull()) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t bytes = 0;
  for (uint32_t l = 0; l < q.levels; ++l)  // bounded by the extents above: no overflow
    bytes += ArrayBytes(LevelGeometry(a.format, a.channels, a.flags, a.width, a.height, a.depth, l));
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
  if (!Charge(cur_dev_, bytes, kAllocGranularity, "MipmappedArrayCreate", "cuMipmappedArrayCreate", &m.charged))
    return CUDA_ERROR_OUT_OF_MEMORY;
  Backend::ArraySpec spec{a.width, a.height, a.depth, a.format, a.channels, a.flags};
  r = b_->MipmappedArrayCreate(spec, q.levels, &m.backend);
  if (r != CUDA_SUCCESS) {
    Uncharge(cur_dev_, m.charged);
    return r;
  }
  *id = want != 0 ? want : NewId();
  mipmaps_.Add(*id, std::move(m));
  return r;
}

CUresult Session::OnMipmappedArrayGetLevel(const MipmapLevelReq& q, Call& c) {
  uint64_t id = 0;
  const CUresult r = q.reserved != 0 ? CUDA_ERROR_INVALID_HANDLE : MipmapLevel(q.mipmap, q.level, 0, &id);
  if (r == CUDA_SUCCESS) c.Put(HandleRep{id});
  return r;
}

CUresult Session::MipmapLevel(uint64_t mipmap, uint32_t level, uint64_t want, uint64_t* id) {
  CUresult r = CUDA_SUCCESS;
  MipmapRec* m = LiveMipmap(mipmap);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (level >= m->levels) return CUDA_ERROR_INVALID_VALUE;
  if (m->level_ids[level] == 0) {
    ArrayRec a = LevelGeometry(m->format, m->channels, m->flags, m->width, m->height, m->depth, level);
    r = b_->MipmappedArrayGetLevel(m->backend, level, &a.backend);
    if (r != CUDA_SUCCESS) return r;
    a.dev = m->dev;
    a.mipmap = mipmap;
    const uint64_t made = want != 0 ? want : NewId();
    arrays_.Add(made, a);
    m->level_ids[level] = made;
  }
  *id = m->level_ids[level];
  return r;
}

CUresult Session::OnMipmappedArrayDestroy(const HandleReq& q, Call& /*c*/) {
  MipmapRec* m = LiveMipmap(q.handle);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  m->destroyed = true;
  MaybeFreeMipmap(q.handle);
  return CUDA_SUCCESS;
}

}  // namespace orion::host::detail
