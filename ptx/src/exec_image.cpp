// ptx/src/exec_image.cpp — the executor's texture and surface instructions (tex, suld, sust,
// txq, suq): resolving a texture or surface object to its image, addressing and filtering, texel
// formats. Block member functions (block.h), kept apart from the hot path.
#include "block.h"

namespace orion::ptx::exec {

int Block::FormatBytes(uint32_t f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
  }
}

// Why the executor cannot use view `v` ("" if it can).
std::string Block::ViewProblem(const ImageView& v, bool surface) {
  if (FormatBytes(v.format) == 0) return "format 0x" + Hex(v.format) + " is not supported";
  if (v.channels != 1 && v.channels != 2 && v.channels != 4) return std::to_string(v.channels) + " channels";
  if (v.dims < 1 || v.dims > 3) return std::to_string(v.dims) + " dimensions";
  if (v.width == 0 || v.height == 0 || v.depth == 0) return "no texels";
  if (v.data == nullptr && v.bytes != 0) return "no data";
  if (!surface) {
    for (uint32_t m : v.address_mode)
      if (m > CU_TR_ADDRESS_MODE_BORDER) return "address mode " + std::to_string(m);
    if (v.filter_mode > CU_TR_FILTER_MODE_LINEAR) return "filter mode " + std::to_string(v.filter_mode);
  }
  return "";
}

// Byte offset of (x bytes, row y, slice z) if [offset, offset + size) lies inside the view's memory.
bool Block::ByteOffset(const ImageView& v, uint64_t xb, uint64_t y, uint64_t z, uint64_t size, uint64_t* off) {
  uint64_t a = 0, b = 0, o = 0;
  if (__builtin_mul_overflow(y, v.row_pitch, &a) || __builtin_mul_overflow(z, v.slice_pitch, &b) ||
      __builtin_add_overflow(a, b, &o) || __builtin_add_overflow(o, xb, &o))
    return false;
  if (o > v.bytes || size > v.bytes - o) return false;
  *off = o;
  return true;
}

// The view of texture / surface object `handle`; false with the fault set if there is none.
bool Block::ResolveImage(uint64_t handle, bool surface, const Warp& w, int lane, const Ins& ins, ImageView* out) {
  for (const ImageSlot& s : images_)
    if (s.handle == handle && s.surface == surface) {
      *out = s.view;
      return true;
    }
  const std::string kind = surface ? "surface" : "texture";
  ImageView v;
  if (!(surface ? mem_.FindSurface(handle, &v) : mem_.FindTexture(handle, &v))) {
    SetFault(CUDA_ERROR_ILLEGAL_ADDRESS,
             "unknown " + kind + " object 0x" + Hex(handle) + " used by " + Where(w, lane, ins));
    return false;
  }
  if (const std::string bad = ViewProblem(v, surface); !bad.empty()) {
    SetFault(CUDA_ERROR_ILLEGAL_ADDRESS,
             kind + " object 0x" + Hex(handle) + " cannot be read (" + bad + "), used by " + Where(w, lane, ins));
    return false;
  }
  if (images_.size() >= 8) images_.erase(images_.begin());
  images_.push_back({handle, surface, v});
  *out = v;
  return true;
}

// The object operand: a register, or a .param holding the handle.
bool Block::HandleValue(const Warp& w, const Operand& o, int lane, const Ins& ins, uint64_t* h) {
  if (o.kind != Operand::kMem) {
    *h = Val(w, o, lane);
    return true;
  }
  const uint8_t* p = Mem(Space::kParam, Address(w, o, lane), 8, w, lane, false, ins);
  if (p == nullptr) return false;
  *h = Load(p, 8);
  return true;
}

// Whether fetches of `v` return floats: FLOAT and HALF texels, and 8/16-bit integers unless read
// as integers (cudaReadModeNormalizedFloat; 32-bit integers are always returned as integers).
bool Block::FloatResult(const ImageView& v) {
  return v.format == CU_AD_FORMAT_FLOAT || v.format == CU_AD_FORMAT_HALF ||
         (FormatBytes(v.format) < 4 && !v.read_as_integer);
}

// Channel `c` of the texel at `p` as returned by a fetch: float bits, or a 32-bit integer.
// Programming Guide, "Texture Memory": with cudaReadModeNormalizedFloat "the full range of the
// integer type is mapped to [0.0, 1.0] for unsigned integer type and [-1.0, 1.0] for signed integer
// type; for example, an unsigned 8-bit texture element with the value 0xff reads as 1"; the most
// negative signed value (-128, -32768) reads as -1.0 as well.
uint32_t Block::Channel(const ImageView& v, const uint8_t* p, uint32_t c, bool fl) {
  const uint8_t* e = p + static_cast<uint64_t>(FormatBytes(v.format)) * c;
  switch (v.format) {
    case CU_AD_FORMAT_UNSIGNED_INT8: return fl ? static_cast<uint32_t>(B32(*e / 255.0f)) : *e;
    case CU_AD_FORMAT_SIGNED_INT8: {
      const int32_t x = static_cast<int8_t>(*e);
      return fl ? static_cast<uint32_t>(B32(std::max(static_cast<float>(x) / 127.0f, -1.0f)))
                : static_cast<uint32_t>(x);
    }
    case CU_AD_FORMAT_UNSIGNED_INT16: {
      const auto x = static_cast<uint32_t>(Load(e, 2));
      return fl ? static_cast<uint32_t>(B32(static_cast<float>(x) / 65535.0f)) : x;
    }
    case CU_AD_FORMAT_SIGNED_INT16: {
      const int32_t x = static_cast<int16_t>(Load(e, 2));
      return fl ? static_cast<uint32_t>(B32(std::max(static_cast<float>(x) / 32767.0f, -1.0f)))
                : static_cast<uint32_t>(x);
    }
    case CU_AD_FORMAT_HALF: return static_cast<uint32_t>(B32(H2F(Load(e, 2))));
    default: return static_cast<uint32_t>(Load(e, 4));  // 32-bit integers and FLOAT: the bits as stored
  }
}

// The integer texel coordinate of float `x` (floor), NaN as 0, bounded to +-2^62.
int64_t Block::FloorIndex(float x) {
  constexpr double kLim = 4611686018427387904.0;  // 2^62
  if (std::isnan(x)) return 0;
  const double f = std::floor(static_cast<double>(x));
  return f <= -kLim ? -(int64_t{1} << 62) : f >= kLim ? (int64_t{1} << 62) : static_cast<int64_t>(f);
}

// Texel index `i` of a dimension of `n` texels under address mode `mode`; -1: the border colour.
// Programming Guide, "Texture Fetching": wrap and mirror are only supported with normalized
// coordinates; with unnormalized (and integer) coordinates they act as clamp here.
int64_t Block::AddressIndex(int64_t i, uint64_t n, uint32_t mode, bool normalized) {
  const auto nn = static_cast<int64_t>(std::min<uint64_t>(n, uint64_t{1} << 61));
  if (!normalized && (mode == CU_TR_ADDRESS_MODE_WRAP || mode == CU_TR_ADDRESS_MODE_MIRROR))
    mode = CU_TR_ADDRESS_MODE_CLAMP;
  switch (mode) {
    case CU_TR_ADDRESS_MODE_WRAP: {
      const int64_t r = i % nn;
      return r < 0 ? r + nn : r;
    }
    case CU_TR_ADDRESS_MODE_MIRROR: {
      int64_t r = i % (2 * nn);
      if (r < 0) r += 2 * nn;
      return r < nn ? r : 2 * nn - 1 - r;
    }
    case CU_TR_ADDRESS_MODE_BORDER: return i < 0 || i >= nn ? -1 : i;
    default: return std::clamp<int64_t>(i, 0, nn - 1);
  }
}

uint32_t Block::SatI32(float f) {
  if (std::isnan(f)) return 0;
  if (f >= 2147483647.0f) return 0x7fffffffu;
  if (f <= -2147483648.0f) return 0x80000000u;
  return static_cast<uint32_t>(static_cast<int32_t>(f));
}

// One texel's four channels at indices `idx` (-1 anywhere: the border colour), as a fetch returns
// them. Channels the format lacks read as 0 and a missing alpha as 1 (1.0f for float results):
// the Programming Guide does not say; this is the component substitution of the graphics APIs
// (OpenGL 4.6, 15.2.1 "Texture Access"; Vulkan "Format Conversion"), which NVIDIA hardware follows.
bool Block::FetchTexel(const ImageView& v, const int64_t idx[3], bool fl, uint32_t out[4], const Warp& w, int lane,
                       const Ins& ins, uint64_t handle) {
  if (idx[0] < 0 || idx[1] < 0 || idx[2] < 0) {
    for (int c = 0; c < 4; ++c) out[c] = fl ? static_cast<uint32_t>(B32(v.border_color[c])) : SatI32(v.border_color[c]);
    return true;
  }
  const uint64_t tb = TexelBytes(v);
  uint64_t xb = 0, off = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(idx[0]), tb, &xb) ||
      !ByteOffset(v, xb, static_cast<uint64_t>(idx[1]), static_cast<uint64_t>(idx[2]), tb, &off)) {
    SetFault(CUDA_ERROR_ILLEGAL_ADDRESS, "texel (" + std::to_string(idx[0]) + "," + std::to_string(idx[1]) + "," +
                                             std::to_string(idx[2]) + ") of texture object 0x" + Hex(handle) +
                                             " lies outside its " + std::to_string(v.bytes) + " bytes, read by " +
                                             Where(w, lane, ins));
    return false;
  }
  const uint8_t* p = v.data + off;
  for (uint32_t c = 0; c < 4; ++c)
    out[c] = c < v.channels ? Channel(v, p, c, fl) : c == 3 ? (fl ? static_cast<uint32_t>(B32(1.0f)) : 1u) : 0u;
  return true;
}

bool Block::ImageLane(Warp& w, int l, const Ins& ins) {
  switch (ins.op) {
    case Op::kTex: return TexLane(w, l, ins);
    case Op::kSuld:
    case Op::kSust: return SurfaceLane(w, l, ins);
    default: {  // txq / suq .width / .height / .depth
      uint64_t h = 0;
      ImageView v;
      if (!HandleValue(w, ins.o[1], l, ins, &h) || !ResolveImage(h, ins.op == Op::kSuq, w, l, ins, &v)) return false;
      const uint64_t n = ins.oob == 0 ? v.width : ins.oob == 1 ? v.height : v.depth;
      Set(w, ins.o[0], l, std::min<uint64_t>(n, UINT32_MAX));
      return true;
    }
  }
}

// tex.{1d,2d,3d}.v4.dtype.{f32,s32}: Programming Guide, "Texture Fetching". Float coordinates are
// scaled by the size when normalized; nearest-point sampling reads texel floor(x); linear filtering
// (float results, float coordinates) blends the 2/4/8 texels around x - 0.5 with weights
// alpha = frac(x - 0.5) kept in float (the hardware rounds alpha to 8 fractional bits, so a GPU's
// result may differ by up to 1/256 of the texel difference). Integer coordinates (tex1Dfetch) are
// texel indices, never filtered, addressed as unnormalized ones. Integer results (read as integer,
// 32-bit integer formats) are point-sampled. The destination receives the bits the fetch returns
// (float or integer, decided by the view as on the GPU; .s32 sign-extends them in the register).
bool Block::TexLane(Warp& w, int l, const Ins& ins) {
  uint64_t h = 0;
  ImageView v;
  if (!HandleValue(w, ins.o[1], l, ins, &h) || !ResolveImage(h, false, w, l, ins, &v)) return false;
  const bool fl = FloatResult(v);
  const bool arrayed = ins.layer == kGeomArray || ins.layer == kGeomArrayCube;
  const bool cube = ins.layer == kGeomCube || ins.layer == kGeomArrayCube;
  if ((arrayed && !v.layered) || cube != v.cubemap) {
    SetFault(CUDA_ERROR_ILLEGAL_ADDRESS, std::string(cube      ? "a cube"
                                                     : arrayed ? "a layered"
                                                               : "a plain") +
                                             " fetch from texture object 0x" + Hex(h) + ", whose array is " +
                                             (v.cubemap   ? "a cubemap"
                                              : v.layered ? "layered"
                                                          : "neither") +
                                             ", by " + Where(w, l, ins));
    return false;
  }
  const Operand& co = ins.o[2];
  // Layered arrays and cubemaps keep their layers (and faces) as slices: `slice` is the one read.
  int64_t slice = -1;
  if (arrayed) {  // the layer: an integer, clamped to the array's layers
    const auto layers = static_cast<int64_t>(cube ? v.depth / 6 : v.depth);
    slice = std::clamp<int64_t>(SExt(VecReg(w, co, 0, l), 4), 0, std::max<int64_t>(layers - 1, 0)) * (cube ? 6 : 1);
  }
  const int first = arrayed ? 1 : 0;  // the first spatial coordinate
  // A cube fetch: the major axis of direction (x, y, z) picks the face, and the other two give the
  // point on it (CUDA C++ Programming Guide, "Cubemap Textures"), in texels of the face.
  float face_xy[2] = {0, 0};
  if (cube) {
    const float x = F32(VecReg(w, co, first, l)), y = F32(VecReg(w, co, first + 1, l)),
                z = F32(VecReg(w, co, first + 2, l));
    const float ax = std::fabs(x), ay = std::fabs(y), az = std::fabs(z);
    float sc = 0, tc = 0, m = 0;
    int face = 0;
    if (ax >= ay && ax >= az) {
      face = x >= 0 ? 0 : 1, sc = x >= 0 ? -z : z, tc = -y, m = ax;
    } else if (ay >= az) {
      face = y >= 0 ? 2 : 3, sc = x, tc = y >= 0 ? z : -z, m = ay;
    } else {
      face = z >= 0 ? 4 : 5, sc = z >= 0 ? x : -x, tc = -y, m = az;
    }
    const float size = static_cast<float>(v.width);
    face_xy[0] = m > 0 ? (sc / m + 1.0f) * 0.5f * size : 0.0f;
    face_xy[1] = m > 0 ? (tc / m + 1.0f) * 0.5f * size : 0.0f;
    slice = std::max<int64_t>(slice, 0) + face;
  }
  const bool int_coords = ins.type2 == Ty::kS32;
  const bool normalized = v.normalized_coords && !int_coords && !cube;
  const uint64_t n[3] = {v.width, v.height, v.depth};
  const int dims = cube ? 2 : ins.geom;
  uint32_t mode[3] = {v.address_mode[0], v.address_mode[1], v.address_mode[2]};
  if (cube) mode[0] = mode[1] = CU_TR_ADDRESS_MODE_CLAMP;  // no seamless filtering across faces
  auto coord = [&](int d) { return cube ? static_cast<uint64_t>(B32(face_xy[d])) : VecReg(w, co, first + d, l); };
  uint32_t out[4] = {};
  if (int_coords || !fl || v.filter_mode != CU_TR_FILTER_MODE_LINEAR) {
    int64_t idx[3] = {0, 0, 0};
    for (int d = 0; d < dims; ++d) {
      const uint64_t r = coord(d);
      int64_t i = 0;
      if (int_coords) {
        i = SExt(r, 4);
      } else {
        float x = F32(r);
        if (normalized) x *= static_cast<float>(n[d]);
        i = FloorIndex(x);
      }
      idx[d] = AddressIndex(i, n[d], mode[d], normalized);
    }
    if (slice >= 0) idx[2] = slice;
    if (!FetchTexel(v, idx, fl, out, w, l, ins, h)) return false;
  } else {
    int64_t base[3] = {0, 0, 0};
    float alpha[3] = {0, 0, 0};
    for (int d = 0; d < dims; ++d) {
      float x = F32(coord(d));
      if (normalized) x *= static_cast<float>(n[d]);
      const float xb = x - 0.5f;
      base[d] = FloorIndex(xb);
      const float a = std::isfinite(xb) ? xb - std::floor(xb) : 0.0f;
      alpha[d] = a;
    }
    float acc[4] = {0, 0, 0, 0};
    for (uint32_t corner = 0; corner < (1u << dims); ++corner) {
      int64_t idx[3] = {0, 0, 0};
      float weight = 1.0f;
      for (int d = 0; d < dims; ++d) {
        const bool hi = (corner >> d) & 1;
        idx[d] = AddressIndex(base[d] + (hi ? 1 : 0), n[d], mode[d], normalized);
        weight *= hi ? alpha[d] : 1.0f - alpha[d];
      }
      if (slice >= 0) idx[2] = slice;
      uint32_t t[4];
      if (!FetchTexel(v, idx, true, t, w, l, ins, h)) return false;
      for (int c = 0; c < 4; ++c) acc[c] += weight * F32(t[c]);
    }
    for (int c = 0; c < 4; ++c) out[c] = static_cast<uint32_t>(B32(acc[c]));
  }
  const Operand& d = ins.o[0];
  auto put = [&](uint32_t reg, uint32_t bits) {
    if (reg != kNoReg)
      w.regs[reg * 32 + static_cast<uint32_t>(l)] =
          ins.type == Ty::kS32 ? static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(bits))) : bits;
  };
  if (d.kind == Operand::kVec) {
    for (int i = 0; i < d.n; ++i) put(d.regs[i], out[i]);
  } else if (d.kind == Operand::kReg) {
    put(d.reg, out[0]);
  }
  return true;
}

// suld.b / sust.b: unformatted access of vec x .bN bytes at (x bytes, y rows, z slices) (PTX ISA:
// "the lowest dimension coordinate represents a byte offset into the surface and is not scaled").
// Out of range (x < 0, x + size past the row's width * texel bytes, y or z outside the height or
// depth): .trap fails the launch with CUDA_ERROR_ILLEGAL_ADDRESS; .clamp moves the access to the
// nearest in-range location (x to [0, row - size], rounded down to a multiple of the access size;
// y and z to the edge); .zero loads zeros and drops stores. x need not be a multiple of the size.
bool Block::SurfaceLane(Warp& w, int l, const Ins& ins) {
  const bool store = ins.op == Op::kSust;
  const Operand& co = ins.o[store ? 1 : 2];
  const Operand& data = ins.o[store ? 2 : 0];
  uint64_t h = 0;
  ImageView v;
  if (!HandleValue(w, ins.o[store ? 0 : 1], l, ins, &h) || !ResolveImage(h, true, w, l, ins, &v)) return false;
  const int e = TyBytes(ins.type);
  const int cnt = ins.vec;
  const auto size = static_cast<uint64_t>(e) * static_cast<uint64_t>(cnt);
  // .a1d / .a2d: {layer, x[, y, _]}, the layer a slice of the layered array (checked as z is).
  const bool arrayed = ins.layer == kGeomArray;
  if (arrayed && !v.layered) {
    SetFault(CUDA_ERROR_ILLEGAL_ADDRESS,
             "a layered access to surface object 0x" + Hex(h) + ", whose array is not layered, by " + Where(w, l, ins));
    return false;
  }
  const int first = arrayed ? 1 : 0;
  const int64_t x = SExt(VecReg(w, co, first, l), 4);
  const int64_t y = ins.geom >= 2 ? SExt(VecReg(w, co, first + 1, l), 4) : 0;
  const int64_t z = arrayed ? SExt(VecReg(w, co, 0, l), 4) : ins.geom >= 3 ? SExt(VecReg(w, co, 2, l), 4) : 0;
  uint64_t row = 0;
  if (__builtin_mul_overflow(v.width, TexelBytes(v), &row)) row = UINT64_MAX;
  auto coords = [&] {
    return "(" + std::to_string(x) + " bytes, " + std::to_string(y) + ", " + std::to_string(z) +
           ") of surface object 0x" + Hex(h) + " (" + std::to_string(v.width) + "x" + std::to_string(v.height) + "x" +
           std::to_string(v.depth) + " texels of " + std::to_string(TexelBytes(v)) + " bytes)";
  };
  uint64_t xb = static_cast<uint64_t>(x), yy = static_cast<uint64_t>(y), zz = static_cast<uint64_t>(z);
  const bool inside = x >= 0 && xb <= row && size <= row - xb && y >= 0 && yy < v.height && z >= 0 && zz < v.depth;
  if (!inside) {
    if (ins.oob == kOobZero) {
      if (!store) {
        if (data.kind == Operand::kVec) {
          for (int i = 0; i < data.n; ++i)
            if (data.regs[i] != kNoReg) w.regs[data.regs[i] * 32 + static_cast<uint32_t>(l)] = 0;
        } else {
          Set(w, data, l, 0);
        }
      }
      return true;
    }
    if (ins.oob == kOobTrap || row < size) {
      SetFault(CUDA_ERROR_ILLEGAL_ADDRESS, std::string(store ? "write" : "read") + " of " + std::to_string(size) +
                                               " bytes out of range at " + coords() + " by " + Where(w, l, ins));
      return false;
    }
    const uint64_t last = (row - size) / size * size;
    xb = x < 0 ? 0 : std::min<uint64_t>(xb, last);
    yy = y < 0 ? 0 : std::min<uint64_t>(yy, v.height - 1);
    zz = z < 0 ? 0 : std::min<uint64_t>(zz, v.depth - 1);
  }
  uint64_t off = 0;
  if (!ByteOffset(v, xb, yy, zz, size, &off)) {
    SetFault(CUDA_ERROR_ILLEGAL_ADDRESS, std::string(store ? "write" : "read") + " at " + coords() +
                                             " lies outside its " + std::to_string(v.bytes) + " bytes, by " +
                                             Where(w, l, ins));
    return false;
  }
  uint8_t* p = v.data + off;
  for (int i = 0; i < cnt; ++i) {
    if (store) {
      const uint64_t val = data.kind == Operand::kVec ? VecReg(w, data, i, l) : Val(w, data, l);
      Store(p + e * i, val, e);
    } else {
      const uint64_t val = Load(p + e * i, e);
      if (data.kind == Operand::kVec) {
        if (data.regs[i] != kNoReg) w.regs[data.regs[i] * 32 + static_cast<uint32_t>(l)] = val;
      } else {
        Set(w, data, l, val);
      }
    }
  }
  return true;
}

}  // namespace orion::ptx::exec
