// session_module.cpp — Modules, functions, launches, occupancy and tensor maps: the Session handlers of these ops
// (ops.def).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "session_impl.h"

namespace orion::host::detail {
namespace {

// The NUL-terminated name after a ModuleSymbolReq.
bool Name(const uint8_t* payload, uint32_t len, const ModuleSymbolReq& q, std::string* name) {
  if (q.name_len == 0 || q.name_len > 4 * kNameLen || len != sizeof q + q.name_len) return false;
  const char* s = reinterpret_cast<const char*>(payload + sizeof q);
  if (s[q.name_len - 1] != '\0') return false;
  *name = std::string(s, q.name_len - 1);
  return name->find('\0') == std::string::npos;
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

}  // namespace

CUresult Session::OnModuleLoad(const ModuleLoadReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  if (q.image_bytes == 0 || q.image_bytes > fatbin::kMaxDecompressedBytes) return CUDA_ERROR_INVALID_IMAGE;
  const std::vector<uint8_t>* img = images_.Find(q.hash_lo, q.hash_hi, q.image_bytes);
  if (img == nullptr) return static_cast<CUresult>(kStatusNeedBytes);
  auto size = fatbin::ImageSize(img->data(), img->size());
  if (!size.ok() || *size > img->size()) return CUDA_ERROR_INVALID_IMAGE;
  if (HandlesFull()) return CUDA_ERROR_OUT_OF_MEMORY;
  void* mod = nullptr;
  r = b_->ModuleLoad(std::span<const uint8_t>(img->data(), img->size()), &mod);
  if (r == CUDA_SUCCESS) {
    Obj o{Kind::kModule, mod, cur_dev_, cur_ctx_, {}};
    o.hash_lo = q.hash_lo;
    o.hash_hi = q.hash_hi;
    o.image_bytes = q.image_bytes;
    c.Put(ModuleLoadRep{AddHandle(std::move(o)), 0, 0});
    // It parsed: into the host's cache, and out of this worker's memory (the backend has it).
    const std::string hex = ModuleImages::Hex(q.hash_lo, q.hash_hi);
    images_.Cache(hex, *img);
    images_.Drop(hex);
  } else {
    p_.log->info("sess={} op=ModuleLoad image {} refused ({}): {}", p_.session_id,
                 ModuleImages::Hex(q.hash_lo, q.hash_hi), static_cast<int>(r), b_->ErrorDetail());
  }
  return r;
}

CUresult Session::OnBlobPut(const BlobPutReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  if (q.image_bytes == 0 || q.image_bytes > fatbin::kMaxDecompressedBytes || q.offset > q.image_bytes ||
      q.bytes > q.image_bytes - q.offset || !WindowRange(q.window_offset, q.bytes)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::string hex = ModuleImages::Hex(q.hash_lo, q.hash_hi);
  if (q.offset == 0) {
    upload_hex_ = hex;
    upload_.assign(q.image_bytes, 0);
    upload_received_ = 0;
  }
  if (hex != upload_hex_ || upload_.size() != q.image_bytes || q.offset != upload_received_) {
    r = CUDA_ERROR_INVALID_VALUE;  // chunks must arrive in order, for one image at a time
    return r;
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
  return r;
}

CUresult Session::OnModuleUnload(const HandleReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  Obj* o = Find(q.handle, Kind::kModule);
  if (o == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  r = b_->ModuleUnload(o->backend);
  if (auto mf = module_functions_.find(q.handle); mf != module_functions_.end()) {
    for (uint64_t fid : mf->second) {
      if (const Obj* fn = handles_.Find(fid); fn != nullptr) {
        function_ids_.erase(fn->backend);
        func_attrs_.erase(fid);
        handles_.Erase(fid);
      }
    }
    module_functions_.erase(mf);
  }
  handles_.Erase(q.handle);
  return r;
}

CUresult Session::ModuleSymbol(const ModuleSymbolReq& q, Call& c, const char* op, Obj** module, std::string* name) {
  ORION_WANT(Name(c.payload, c.len, q, name), std::string("bad ") + op);
  *module = Find(q.module, Kind::kModule);
  return *module == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

CUresult Session::OnModuleGetGlobal(const ModuleSymbolReq& q, Call& c) {
  Obj* o = nullptr;
  std::string name;
  if (const CUresult r = ModuleSymbol(q, c, "ModuleGetGlobal", &o, &name); r != CUDA_SUCCESS) return r;
  uint64_t dptr = 0, bytes = 0;
  const CUresult r = b_->ModuleGetGlobal(o->backend, name.c_str(), &dptr, &bytes);
  if (r == CUDA_SUCCESS) {
    if (!DeviceRange(dptr, bytes)) allocs_[dptr] = {std::max<uint64_t>(bytes, 1), o->dev, false};
    c.Put(GlobalRep{dptr, bytes});
  }
  return r;
}

CUresult Session::OnModuleGetFunction(const ModuleSymbolReq& q, Call& c) {
  Obj* o = nullptr;
  std::string name;
  if (const CUresult r = ModuleSymbol(q, c, "ModuleGetFunction", &o, &name); r != CUDA_SUCCESS) return r;
  CUresult r = CUDA_SUCCESS;
  void* fn = nullptr;
  KernelLayout layout;
  r = b_->ModuleGetFunction(o->backend, name.c_str(), &fn, &layout);
  if (r != CUDA_SUCCESS) return r;
  if (layout.params.size() > kMaxKernelParams) return CUDA_ERROR_NOT_SUPPORTED;
  // A function asked for again gets its handle again (one lookup: libraries like cuDNN ask for
  // thousands of kernels, and a scan of every handle per call made start-up quadratic).
  uint64_t id = 0;
  if (auto known = function_ids_.find(fn); known != function_ids_.end()) id = known->second;
  if (id == 0 && HandlesFull()) return CUDA_ERROR_OUT_OF_MEMORY;
  if (id == 0) {
    Obj f{Kind::kFunction, fn, o->dev, q.module, layout};
    f.name = name;
    id = AddHandle(std::move(f));
    function_ids_[fn] = id;
    module_functions_[q.module].push_back(id);
  }
  c.Put(FunctionRep{id, static_cast<uint32_t>(layout.params.size()), layout.param_bytes,
                    static_cast<int32_t>(layout.launch_error), layout.launch_refusal});
  for (const ParamInfo& pi : layout.params) c.Put(pi);
  return r;
}

CUresult Session::OnModuleFunctionName(const ModuleFunctionNameReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  Obj* o = Find(q.module, Kind::kModule);
  if (o == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::vector<std::string> names;
  r = b_->ModuleFunctionNames(o->backend, &names);
  if (r != CUDA_SUCCESS) return r;
  ModuleFunctionNameRep rep{static_cast<uint32_t>(std::min<size_t>(names.size(), UINT32_MAX - 1)), 0};
  if (q.index == kModuleFunctionCountOnly) {
    c.Put(rep);
    return r;
  }
  if (q.index >= rep.count) return CUDA_ERROR_INVALID_VALUE;
  const std::string& n = names[q.index];
  if (n.empty() || n.size() >= 4 * kNameLen) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }  // as ModuleGetFunction
  rep.name_len = static_cast<uint32_t>(n.size() + 1);
  c.Put(rep);
  c.reply->insert(c.reply->end(), n.c_str(), n.c_str() + n.size() + 1);
  return r;
}

CUresult Session::OnFuncGetAttribute(const FuncAttributeReq& q, Call& c) {
  Obj* o = Find(q.function, Kind::kFunction);
  if (o == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  int v = 0;
  const CUresult r = b_->FuncGetAttribute(o->backend, q.attribute, &v);
  c.Put(I32Rep{v, 0});
  return r;
}

CUresult Session::OnFuncSetAttribute(const FuncAttributeReq& q, Call& /*c*/) {
  Obj* o = Find(q.function, Kind::kFunction);
  if (o == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const CUresult r = b_->FuncSetAttribute(o->backend, q.attribute, q.value);
  if (r == CUDA_SUCCESS) func_attrs_[q.function][q.attribute] = q.value;  // a migration sets it again
  return r;
}

CUresult Session::OnLaunchKernel(const LaunchReq& q, Call& c) {
  LaunchExReq x{};
  x.base = q;
  x.cluster[0] = x.cluster[1] = x.cluster[2] = 1;
  return Launch(x, sizeof q, c);
}

CUresult Session::OnLaunchKernelEx(const LaunchExReq& q, Call& c) { return Launch(q, sizeof q, c); }

// `head`: the bytes before the kernel parameters (the checkpoint saw at least that many: ops.def kHead).
CUresult Session::Launch(const LaunchExReq& x, uint32_t head, Call& c) {
  const LaunchReq& q = x.base;
  uint64_t want_len = 0;
  ORION_WANT(CheckedAdd(head, q.param_bytes, &want_len) && c.len == want_len, "bad LaunchKernel");
  Obj* f = Find(q.function, Kind::kFunction);
  LaunchSpec l;
  if (f == nullptr || !Stream(q.stream, &l.stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (q.param_bytes != f->layout.param_bytes) return CUDA_ERROR_INVALID_VALUE;
  if ((x.flags & ~kLaunchCooperative) != 0) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(l.grid, q.grid, sizeof l.grid);
  std::memcpy(l.block, q.block, sizeof l.block);
  std::memcpy(l.cluster, x.cluster, sizeof l.cluster);
  l.shared_mem = q.shared_mem_bytes;
  l.flags = x.flags;
  l.params = std::span<const uint8_t>(c.payload + head, q.param_bytes);
  if (cur_dev_ >= limits_.size()) return CUDA_ERROR_INVALID_CONTEXT;
  if (const CUresult r = limits_[cur_dev_].Check(l); r != CUDA_SUCCESS) return r;
  // Local and shared memory a launch holds while it runs, charged to the quota like a GPU's
  // local-memory reservation: it grows to the largest launch and stays until the session ends.
  if (const uint64_t need = b_->LaunchScratchBytes(f->backend, l); need > scratch_[cur_dev_]) {
    uint64_t charged_now = 0;
    if (!Charge(cur_dev_, need - scratch_[cur_dev_], kAllocGranularity, "LaunchKernel",
                "cuLaunchKernel (local and shared memory)", &charged_now)) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    scratch_[cur_dev_] += charged_now;
  }
  b_->UseComputeGate(cur_dev_ < gates_.size() ? gates_[cur_dev_].get() : nullptr);
  const CUresult r = b_->LaunchKernel(f->backend, l);
  for (const std::string& note : b_->TakeNotices()) {
    p_.log->warn("sess={} {}", p_.session_id, note);
    if (notices_.size() < kMaxPendingNotices) notices_ += note.substr(0, 1024) + "\n";  // for the client's log
  }
  return r;
}

CUresult Session::OnOccupancyMaxBlocks(const OccupancyReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  Obj* f = Find(q.function, Kind::kFunction);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  int blocks = 0;
  r = q.block_size == 0 ? CUDA_ERROR_INVALID_VALUE
                        : b_->OccupancyMaxBlocks(f->backend, q.block_size, q.dynamic_smem, q.flags, &blocks);
  c.Put(I32Rep{blocks, 0});
  return r;
}

CUresult Session::OnOccupancyMaxClusters(const OccupancyClustersReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  Obj* f = Find(q.function, Kind::kFunction);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  int n = 0;
  r = b_->OccupancyMaxClusters(f->backend, q.grid, q.block, q.shared_mem_bytes, q.cluster, &n);
  c.Put(I32Rep{n, 0});
  return r;
}

CUresult Session::OnOccupancyAvailableSmem(const OccupancySmemReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  Obj* f = Find(q.function, Kind::kFunction);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  uint64_t bytes = 0;
  r = q.num_blocks <= 0 || q.block_size <= 0
          ? CUDA_ERROR_INVALID_VALUE
          : b_->OccupancyAvailableSmem(f->backend, q.num_blocks, q.block_size, &bytes);
  c.Put(U64Rep{bytes});
  return r;
}

CUresult Session::OnTensorMapEncodeTiled(const TensorMapEncodeReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  const char* bad = "";
  const bool ok = TensorMapValid(q, &bad);
  TensorMapRep rep{};
  r = EncodeTensorMap(
      "cuTensorMapEncodeTiled", ok, bad, q.global_address,
      [&](uint64_t* out) { return b_->TensorMapEncodeTiled(q, out); }, &rep);
  if (r == CUDA_SUCCESS) c.Put(rep);
  return r;
}

CUresult Session::OnTensorMapEncodeIm2col(const TensorMapIm2colReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  const char* bad = "";
  const bool ok = Im2colValid(q, &bad);
  TensorMapRep rep{};
  r = EncodeTensorMap(
      "cuTensorMapEncodeIm2col", ok, bad, q.base.global_address,
      [&](uint64_t* out) { return b_->TensorMapEncodeIm2col(q, out); }, &rep);
  if (r == CUDA_SUCCESS) c.Put(rep);
  return r;
}

CUresult Session::OnTensorMapReplaceAddress(const TensorMapReplaceReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  // The map's own requirements still hold at the new address only if it is as aligned as the
  // driver asks of any map (16 bytes; the driver checks 32-byte ones itself).
  if (q.global_address % 16 != 0 || !DeviceRange(q.global_address, 1)) {
    p_.log->warn(
        "sess={} cuTensorMapReplaceAddress refused: {:#x} is not 16-byte aligned device memory of "
        "this session",
        p_.session_id, q.global_address);
    return CUDA_ERROR_INVALID_VALUE;
  }
  TensorMapRep rep{};
  r = b_->TensorMapReplaceAddress(q.map, q.global_address, rep.opaque);
  if (r == CUDA_SUCCESS) c.Put(rep);
  return r;
}

}  // namespace orion::host::detail
