// Exported driver API: modules and libraries, functions and kernels, globals, launches, occupancy.
// Module images cross once per host: the guest sends a content hash (XXH3-128) first and the
// bytes only when oriond's cache lacks them.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstring>

#include "export.h"
#include "orion/fatbin/fatbin.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

namespace {

constexpr uint32_t kFatbinWrapperMagic = 0x466243B1;  // __fatBinC_Wrapper_t (recipes.md)

// Resolves a fatbin wrapper to its data and measures the image.
CUresult ImageSpan(const void* image, const uint8_t** data, uint64_t* bytes) {
  if (image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto* p = static_cast<const uint8_t*>(image);
  uint32_t magic;
  std::memcpy(&magic, p, 4);
  if (magic == kFatbinWrapperMagic) {
    const void* inner;
    std::memcpy(&inner, p + 8, sizeof inner);  // {u32 magic, u32 version, data, filename}
    if (inner == nullptr) return CUDA_ERROR_INVALID_IMAGE;
    p = static_cast<const uint8_t*>(inner);
  }
  auto size = fatbin::ImageSize(p, uint64_t{1} << 31);
  if (!size.ok()) {
    LogWarn("cannot load module image: " + size.status().message());
    return CUDA_ERROR_INVALID_IMAGE;
  }
  *data = p;
  *bytes = *size;
  return CUDA_SUCCESS;
}

CUresult LoadModule(const void* image, GuestModule** out) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
  if (CUresult r = ImageSpan(image, &data, &bytes); r != CUDA_SUCCESS) return r;
  const XXH128_hash_t h = XXH3_128bits(data, bytes);
  ModuleLoadReq q{h.low64, h.high64, bytes};
  ModuleLoadRep rep{};
  Client& c = Client::Get();
  CUresult r = c.Call(Op::kModuleLoad, &q, sizeof q, &rep, sizeof rep);
  if (r == static_cast<CUresult>(kStatusNeedBytes)) {
    if (CUresult u = c.UploadBlob(h.low64, h.high64, data, bytes); u != CUDA_SUCCESS) return u;
    r = c.Call(Op::kModuleLoad, &q, sizeof q, &rep, sizeof rep);
  }
  if (r != CUDA_SUCCESS) return r;
  auto* m = new GuestModule();
  m->handle = rep.module;
  m->ctx = CurrentCtx();
  S().modules.Add(m);
  *out = m;
  return CUDA_SUCCESS;
}

GuestModule* AsModule(const void* h) {
  return S().modules.Has(h) ? static_cast<GuestModule*>(const_cast<void*>(h)) : nullptr;
}
GuestFunction* AsFunction(const void* h) {
  return S().functions.Has(h) ? static_cast<GuestFunction*>(const_cast<void*>(h)) : nullptr;
}

CUresult GetFunction(GuestModule* m, const char* name, GuestFunction** out) {
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (name == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard<std::mutex> l(m->mu);
    if (auto it = m->functions.find(name); it != m->functions.end()) {
      *out = it->second;
      return CUDA_SUCCESS;
    }
  }
  const size_t len = std::strlen(name);
  if (len > 4 * kNameLen) return CUDA_ERROR_INVALID_VALUE;
  ModuleSymbolReq q{m->handle, static_cast<uint32_t>(len + 1), 0};
  std::vector<uint8_t> rep(sizeof(FunctionRep) + kMaxKernelParams * sizeof(ParamInfo));
  uint32_t rep_len = 0;
  CUresult r = Client::Get().Call(Op::kModuleGetFunction, &q, sizeof q, rep.data(), static_cast<uint32_t>(rep.size()),
                                  &rep_len, name, static_cast<uint32_t>(len + 1));
  if (r != CUDA_SUCCESS) return r;
  FunctionRep fr{};
  if (rep_len < sizeof fr) return CUDA_ERROR_UNKNOWN;
  std::memcpy(&fr, rep.data(), sizeof fr);
  if (fr.param_count > kMaxKernelParams || rep_len < sizeof fr + fr.param_count * sizeof(ParamInfo))
    return CUDA_ERROR_UNKNOWN;
  const auto launch_error = static_cast<CUresult>(fr.launch_error);
  if ((launch_error != CUDA_SUCCESS && LaunchErrorName(fr.launch_error) == nullptr) ||
      static_cast<uint32_t>(fr.launch_refusal) > static_cast<uint32_t>(LaunchRefusal::kPtxUnsupported))
    return CUDA_ERROR_UNKNOWN;
  auto* f = new GuestFunction();
  f->handle = fr.function;
  f->module = m;
  f->name = name;
  f->param_bytes = fr.param_bytes;
  f->launch_error = launch_error;
  f->launch_refusal = fr.launch_refusal;
  f->params.resize(fr.param_count);
  std::memcpy(f->params.data(), rep.data() + sizeof fr, fr.param_count * sizeof(ParamInfo));
  for (const ParamInfo& p : f->params) {
    if (uint64_t{p.offset} + p.size > f->param_bytes) return CUDA_ERROR_UNKNOWN;
  }
  std::lock_guard<std::mutex> l(m->mu);
  auto [it, inserted] = m->functions.emplace(name, f);
  if (inserted)
    S().functions.Add(f);
  else
    delete f;
  *out = it->second;
  return CUDA_SUCCESS;
}

CUresult GetGlobal(GuestModule* m, CUdeviceptr* dptr, size_t* bytes, const char* name) {
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const size_t len = std::strlen(name);
  if (len > 4 * kNameLen) return CUDA_ERROR_INVALID_VALUE;
  ModuleSymbolReq q{m->handle, static_cast<uint32_t>(len + 1), 0};
  GlobalRep rep{};
  CUresult r = Client::Get().Call(Op::kModuleGetGlobal, &q, sizeof q, &rep, sizeof rep, nullptr, name,
                                  static_cast<uint32_t>(len + 1));
  if (r != CUDA_SUCCESS) return r;
  if (!S().mirror.Find(rep.dptr, rep.bytes, nullptr)) {
    S().mirror.Add({rep.dptr, rep.bytes, RangeKind::kGlobal, m->ctx, nullptr});
    std::lock_guard<std::mutex> l(m->mu);
    m->globals.push_back(rep.dptr);
  }
  if (dptr != nullptr) *dptr = rep.dptr;
  if (bytes != nullptr) *bytes = rep.bytes;
  return CUDA_SUCCESS;
}

CUresult Unload(GuestModule* m) {
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  HandleReq q{m->handle};
  CUresult r = Client::Get().Call(Op::kModuleUnload, &q, sizeof q);
  S().modules.Remove(m);
  std::lock_guard<std::mutex> l(m->mu);
  for (auto& [name, f] : m->functions) S().functions.Remove(f);
  for (uint64_t g : m->globals) S().mirror.Remove(g, nullptr);
  return r;
}

// What the client's log says at the first refused launch of `f`.
std::string RefusalText(const GuestFunction& f) {
  const char* why = "";
  switch (f.launch_refusal) {
    case LaunchRefusal::kSassOnly:
      why = "its module has no PTX (SASS only), and the sim backend executes PTX only";
      break;
    case LaunchRefusal::kPtxOtherArch:
      why = "a GPU would run its module's SASS, and the module's PTX is for another arch (SASS only for this device)";
      break;
    case LaunchRefusal::kPtxVersion: why = "its PTX ISA version is newer than the driver supports"; break;
    case LaunchRefusal::kPtxUnsupported: why = "its PTX uses what the sim backend's executor does not implement"; break;
    case LaunchRefusal::kNone: why = "oriond cannot execute it"; break;
  }
  return "kernel " + f.name.substr(0, 512) + " cannot run on this vGPU: " + why + "; its launches fail with " +
         LaunchErrorName(f.launch_error) + " and compute nothing";
}

CUresult Launch(CUfunction hf, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                unsigned smem, CUstream hs, void** params, void** extra, const uint32_t* cluster = nullptr,
                bool cooperative = false, Op* record_op = nullptr, std::vector<uint8_t>* record = nullptr) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  GuestFunction* f = AsFunction(hf);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  uint64_t stream = 0;
  if (record == nullptr && !StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0) return CUDA_ERROR_INVALID_VALUE;
  // The configuration is checked here, synchronously, as NVIDIA's driver does, against the
  // device's limits (known locally since the handshake).
  const int32_t* a = Client::Get().devices()[static_cast<size_t>(CurrentCtx()->device)].attributes;
  const uint64_t threads = uint64_t{bx} * by * bz;
  if (threads > static_cast<uint64_t>(a[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK]) ||
      bx > static_cast<unsigned>(a[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X]) ||
      by > static_cast<unsigned>(a[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y]) ||
      bz > static_cast<unsigned>(a[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z]) ||
      gx > static_cast<unsigned>(a[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X]) ||
      gy > static_cast<unsigned>(a[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y]) ||
      gz > static_cast<unsigned>(a[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z])) {
    return static_cast<CUresult>(kCudaErrorInvalidConfiguration);  // frame.h
  }
  if (smem > static_cast<unsigned>(a[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN])) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // A kernel oriond cannot execute (the sim backend and SASS-only code) fails here, synchronously,
  // as a driver's launch of a kernel with no image for the device does: nothing is sent.
  if (f->launch_error != CUDA_SUCCESS) {
    if (!f->refusal_told.exchange(true)) LogWarn(RefusalText(*f));
    if (record == nullptr) CaptureFailed(stream, "a launch of kernel " + f->name.substr(0, 512));
    return f->launch_error;
  }
  if (cooperative) {
    if (a[CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH] == 0) return CUDA_ERROR_NOT_SUPPORTED;
    // Refused at the call, as by the driver, when the grid cannot be resident at once.
    OccupancyReq oq{f->handle, static_cast<uint32_t>(threads), 0, smem};
    I32Rep per_sm{};
    if (CUresult r = Client::Get().Call(Op::kOccupancyMaxBlocks, &oq, sizeof oq, &per_sm, sizeof per_sm);
        r != CUDA_SUCCESS)
      return r;
    const uint64_t resident = static_cast<uint64_t>(std::max(per_sm.value, 0)) *
                              static_cast<uint64_t>(std::max(a[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT], 0));
    if (uint64_t{gx} * gy * gz > resident) return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
  }
  const void* buffer = nullptr;
  size_t buffer_size = 0;
  if (extra != nullptr) {
    // CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE pairs, CU_LAUNCH_PARAM_END.
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
        buffer = extra[i + 1];
      else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
        buffer_size = *static_cast<size_t*>(extra[i + 1]);
      else
        return CUDA_ERROR_INVALID_VALUE;
      if (i > 64) return CUDA_ERROR_INVALID_VALUE;
    }
    if (params != nullptr || buffer == nullptr || buffer_size < f->param_bytes) return CUDA_ERROR_INVALID_VALUE;
  } else if (params == nullptr && !f->params.empty()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  LaunchReq q{};
  q.function = f->handle;
  q.stream = stream;
  q.grid[0] = gx;
  q.grid[1] = gy;
  q.grid[2] = gz;
  q.block[0] = bx;
  q.block[1] = by;
  q.block[2] = bz;
  q.shared_mem_bytes = smem;
  q.param_bytes = f->param_bytes;
  LaunchExReq x{};
  const bool ex = cluster != nullptr || cooperative;
  if (ex) {
    static const uint32_t kNoCluster[3] = {1, 1, 1};
    x.base = q;
    std::memcpy(x.cluster, cluster != nullptr ? cluster : kNoCluster, sizeof x.cluster);
    x.flags = cooperative ? kLaunchCooperative : 0;
  }
  auto fill = [&](uint8_t* out) {
    if (buffer != nullptr) {
      std::memcpy(out, buffer, f->param_bytes);
      return;
    }
    std::memset(out, 0, f->param_bytes);
    for (size_t i = 0; i < f->params.size(); ++i) {
      std::memcpy(out + f->params[i].offset, params[i], f->params[i].size);
    }
  };
  // A graph node (explicit construction), or a launch into a stream being captured: the frame is
  // kept, to be sent at each graph launch (graph.cpp).
  if (record != nullptr || CaptureActive()) {
    const Op op = ex ? Op::kLaunchKernelEx : Op::kLaunchKernel;
    const uint32_t head = ex ? sizeof x : sizeof q;
    std::vector<uint8_t> frame(head + f->param_bytes);
    if (ex)
      std::memcpy(frame.data(), &x, sizeof x);
    else
      std::memcpy(frame.data(), &q, sizeof q);
    fill(frame.data() + head);
    if (record != nullptr) {
      *record_op = op;
      *record = std::move(frame);
      return CUDA_SUCCESS;
    }
    CUresult r = CUDA_SUCCESS;
    if (CaptureFrame(stream, op, frame.data(), static_cast<uint32_t>(frame.size()), offsetof(LaunchReq, stream), &r))
      return r;
  }
  return Client::Get().SendLaunch(q, ex ? &x : nullptr, fill);
}

}  // namespace

namespace orion::guest {

CUresult KernelNodeFrame(const CUDA_KERNEL_NODE_PARAMS* p, Op* op, std::vector<uint8_t>* frame) noexcept {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUfunction f = p->func != nullptr ? p->func : reinterpret_cast<CUfunction>(p->kern);
  return Launch(f, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ, p->sharedMemBytes,
                nullptr, p->kernelParams, p->extra, nullptr, false, op, frame);
}

CUresult ModuleFunctionCount(CUmodule hmod, unsigned* count) noexcept {
  GuestModule* m = AsModule(hmod);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ModuleFunctionNameReq q{m->handle, kModuleFunctionCountOnly, 0};
  ModuleFunctionNameRep rep{};
  uint32_t rep_len = 0;
  CUresult r = Client::Get().Call(Op::kModuleFunctionName, &q, sizeof q, &rep, sizeof rep, &rep_len);
  if (r != CUDA_SUCCESS) return r;
  if (rep_len != sizeof rep) return CUDA_ERROR_UNKNOWN;
  *count = rep.count;
  return CUDA_SUCCESS;
}

CUresult ModuleFunctionAt(CUmodule hmod, unsigned index, CUfunction* out) noexcept {
  GuestModule* m = AsModule(hmod);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (out == nullptr || index == kModuleFunctionCountOnly) return CUDA_ERROR_INVALID_VALUE;
  try {
    ModuleFunctionNameReq q{m->handle, index, 0};
    std::vector<uint8_t> rep(sizeof(ModuleFunctionNameRep) + 4 * kNameLen);
    uint32_t rep_len = 0;
    CUresult r = Client::Get().Call(Op::kModuleFunctionName, &q, sizeof q, rep.data(),
                                    static_cast<uint32_t>(rep.size()), &rep_len);
    if (r != CUDA_SUCCESS) return r;
    ModuleFunctionNameRep h{};
    if (rep_len < sizeof h) return CUDA_ERROR_UNKNOWN;
    std::memcpy(&h, rep.data(), sizeof h);
    if (h.name_len == 0 || rep_len != sizeof h + h.name_len || rep[rep_len - 1] != '\0') return CUDA_ERROR_UNKNOWN;
    GuestFunction* f = nullptr;
    r = GetFunction(m, reinterpret_cast<const char*>(rep.data() + sizeof h), &f);
    if (r == CUDA_SUCCESS) *out = reinterpret_cast<CUfunction>(f);
    return r;
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

}  // namespace orion::guest

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  ORION_API(cuModuleLoadData);
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestModule* m = nullptr;
  CUresult r = LoadModule(image, &m);
  if (r == CUDA_SUCCESS) *module = reinterpret_cast<CUmodule>(m);
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int n,
                                                 CUjit_option* options, void** values) {
  ORION_API(cuModuleLoadDataEx);
  (void)n;
  (void)options;
  (void)values;  // JIT options only tune PTX compilation on the server
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestModule* m = nullptr;
  CUresult r = LoadModule(image, &m);
  if (r == CUDA_SUCCESS) *module = reinterpret_cast<CUmodule>(m);
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  ORION_API(cuModuleLoadFatBinary);
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestModule* m = nullptr;
  CUresult r = LoadModule(fatCubin, &m);
  if (r == CUDA_SUCCESS) *module = reinterpret_cast<CUmodule>(m);
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuModuleLoad(CUmodule* module, const char* fname) {
  ORION_API(cuModuleLoad);
  if (module == nullptr || fname == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FILE* f = std::fopen(fname, "rb");
  if (f == nullptr) return CUDA_ERROR_FILE_NOT_FOUND;
  std::vector<uint8_t> bytes;
  uint8_t buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
  std::fclose(f);
  bytes.push_back(0);  // PTX text must be NUL-terminated
  GuestModule* m = nullptr;
  CUresult r = LoadModule(bytes.data(), &m);
  if (r == CUDA_SUCCESS) *module = reinterpret_cast<CUmodule>(m);
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  ORION_API(cuModuleUnload);
  return Unload(AsModule(hmod));
}

ORION_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  ORION_API(cuModuleGetFunction);
  GuestFunction* f = nullptr;
  CUresult r = GetFunction(AsModule(hmod), name, &f);
  if (r == CUDA_SUCCESS) *hfunc = reinterpret_cast<CUfunction>(f);
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuModuleGetFunctionCount(unsigned int* count, CUmodule mod) {
  ORION_API(cuModuleGetFunctionCount);
  return ModuleFunctionCount(mod, count);
}

ORION_EXPORT CUresult CUDAAPI cuModuleEnumerateFunctions(CUfunction* functions, unsigned int numFunctions,
                                                         CUmodule mod) {
  ORION_API(cuModuleEnumerateFunctions);
  if (functions == nullptr) return CUDA_ERROR_INVALID_VALUE;
  unsigned n = 0;
  if (CUresult r = ModuleFunctionCount(mod, &n); r != CUDA_SUCCESS) return r;
  if (numFunctions > n) return CUDA_ERROR_INVALID_VALUE;  // asks for more than the module has
  for (unsigned i = 0; i < numFunctions; ++i) {
    if (CUresult r = ModuleFunctionAt(mod, i, &functions[i]); r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod, const char* name) {
  ORION_API(cuModuleGetGlobal_v2);
  return GetGlobal(AsModule(hmod), dptr, bytes, name);
}

// Libraries (CUDA 12+, what cudart 13 uses): a CUlibrary is a module loaded in the session, a
// CUkernel is its function (context-independent on the server, so the same handle serves both).
ORION_EXPORT CUresult CUDAAPI cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jitOptions,
                                                void** jitOptionsValues, unsigned int numJitOptions,
                                                CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                                unsigned int numLibraryOptions) {
  ORION_API(cuLibraryLoadData);
  (void)jitOptions;
  (void)jitOptionsValues;
  (void)numJitOptions;
  (void)libraryOptions;
  (void)libraryOptionValues;
  (void)numLibraryOptions;
  if (library == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!Client::Get().connected()) return CUDA_ERROR_NOT_INITIALIZED;
  GuestModule* m = nullptr;
  // A library needs no current context; the server loads it context-independently.
  GuestCtx* saved = CurrentCtx();
  if (saved == nullptr) {
    CUcontext c = nullptr;
    if (CUresult r = cuDevicePrimaryCtxRetain(&c, 0); r != CUDA_SUCCESS) return r;
    cuCtxPushCurrent_v2(c);
  }
  CUresult r = LoadModule(code, &m);
  if (saved == nullptr) {
    CUcontext c = nullptr;
    cuCtxPopCurrent_v2(&c);
    cuDevicePrimaryCtxRelease_v2(0);
  }
  if (r == CUDA_SUCCESS) *library = reinterpret_cast<CUlibrary>(m);
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuLibraryUnload(CUlibrary library) {
  ORION_API(cuLibraryUnload);
  return Unload(AsModule(library));
}

ORION_EXPORT CUresult CUDAAPI cuLibraryGetKernel(CUkernel* pKernel, CUlibrary library, const char* name) {
  ORION_API(cuLibraryGetKernel);
  if (pKernel == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestFunction* f = nullptr;
  CUresult r = GetFunction(AsModule(library), name, &f);
  if (r == CUDA_SUCCESS) *pKernel = reinterpret_cast<CUkernel>(f);
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuLibraryGetModule(CUmodule* pMod, CUlibrary library) {
  ORION_API(cuLibraryGetModule);
  if (pMod == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (AsModule(library) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *pMod = reinterpret_cast<CUmodule>(library);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                                                 const char* name) {
  ORION_API(cuLibraryGetGlobal);
  return GetGlobal(AsModule(library), dptr, bytes, name);
}

ORION_EXPORT CUresult CUDAAPI cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
  ORION_API(cuKernelGetFunction);
  if (pFunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (AsFunction(kernel) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *pFunc = reinterpret_cast<CUfunction>(kernel);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuKernelGetName(const char** name, CUkernel hfunc) {
  ORION_API(cuKernelGetName);
  GuestFunction* f = AsFunction(hfunc);
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = f->name.c_str();
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction hfunc) {
  ORION_API(cuFuncGetName);
  GuestFunction* f = AsFunction(hfunc);
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = f->name.c_str();
  return CUDA_SUCCESS;
}

static CUresult ParamInfoOf(const void* h, size_t index, size_t* off, size_t* size) {
  GuestFunction* f = AsFunction(h);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (index >= f->params.size()) return CUDA_ERROR_INVALID_VALUE;
  if (off != nullptr) *off = f->params[index].offset;
  if (size != nullptr) *size = f->params[index].size;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t* paramOffset,
                                                 size_t* paramSize) {
  ORION_API(cuFuncGetParamInfo);
  return ParamInfoOf(func, paramIndex, paramOffset, paramSize);
}

ORION_EXPORT CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t* paramOffset,
                                                   size_t* paramSize) {
  ORION_API(cuKernelGetParamInfo);
  return ParamInfoOf(kernel, paramIndex, paramOffset, paramSize);
}

static CUresult FuncAttr(const void* h, int* pi, CUfunction_attribute attrib) {
  GuestFunction* f = AsFunction(h);
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  FuncAttributeReq q{f->handle, static_cast<int32_t>(attrib), 0};
  I32Rep rep{};
  CUresult r = Client::Get().Call(Op::kFuncGetAttribute, &q, sizeof q, &rep, sizeof rep);
  if (r == CUDA_SUCCESS) *pi = rep.value;
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction hfunc) {
  ORION_API(cuFuncGetAttribute);
  return FuncAttr(hfunc, pi, attrib);
}

ORION_EXPORT CUresult CUDAAPI cuKernelGetAttribute(int* pi, CUfunction_attribute attrib, CUkernel kernel,
                                                   CUdevice dev) {
  ORION_API(cuKernelGetAttribute);
  (void)dev;
  return FuncAttr(kernel, pi, attrib);
}

static CUresult FuncSetAttr(const void* h, CUfunction_attribute attrib, int value) {
  GuestFunction* f = AsFunction(h);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  FuncAttributeReq q{f->handle, static_cast<int32_t>(attrib), value};
  return Client::Get().Call(Op::kFuncSetAttribute, &q, sizeof q);
}

ORION_EXPORT CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
  ORION_API(cuFuncSetAttribute);
  return FuncSetAttr(hfunc, attrib, value);
}

ORION_EXPORT CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel,
                                                   CUdevice dev) {
  ORION_API(cuKernelSetAttribute);
  (void)dev;
  return FuncSetAttr(kernel, attrib, val);
}

ORION_EXPORT CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  ORION_API(cuFuncSetCacheConfig);
  (void)config;  // a preference (CUDA docs); accepted and not forwarded
  return AsFunction(hfunc) == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice dev) {
  ORION_API(cuKernelSetCacheConfig);
  (void)config;
  (void)dev;
  return AsFunction(kernel) == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuFuncGetModule(CUmodule* hmod, CUfunction hfunc) {
  ORION_API(cuFuncGetModule);
  GuestFunction* f = AsFunction(hfunc);
  if (hmod == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *hmod = reinterpret_cast<CUmodule>(f->module);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction function) {
  ORION_API(cuFuncIsLoaded);
  if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (AsFunction(function) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *state = CU_FUNCTION_LOADING_STATE_LOADED;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuFuncLoad(CUfunction function) {
  ORION_API(cuFuncLoad);
  return AsFunction(function) == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
                                             CUstream s, void** params, void** extra) {
  ORION_API(cuLaunchKernel);
  return Launch(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);
}

ORION_EXPORT CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                  unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
                                                  CUstream s, void** params, void** extra) {
  ORION_API(cuLaunchKernel_ptsz);
  return Launch(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);
}

static bool ClusterOf(const CUlaunchConfig* config, uint32_t cluster[3]) {
  cluster[0] = cluster[1] = cluster[2] = 1;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      cluster[0] = config->attrs[i].value.clusterDim.x;
      cluster[1] = config->attrs[i].value.clusterDim.y;
      cluster[2] = config->attrs[i].value.clusterDim.z;
    }
  }
  return uint64_t{cluster[0]} * cluster[1] * cluster[2] > 1;
}

static CUresult LaunchEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttribute& a = config->attrs[i];
    switch (a.id) {
      case CU_LAUNCH_ATTRIBUTE_IGNORE:
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:  // carried to oriond
      // Hints: ignoring them keeps the launch correct (stricter ordering, default placement).
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP: break;
      case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
        break;  // allows overlap with the previous kernel; running after it is always correct
      case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:  // carried to oriond
        break;
      default:
        LogWarn("cuLaunchKernelEx: launch attribute " + std::to_string(a.id) + " is not supported");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  uint32_t cluster[3];
  const bool clustered = ClusterOf(config, cluster);
  bool cooperative = false;
  for (unsigned i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && config->attrs[i].value.cooperative != 0)
      cooperative = true;
  return Launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                config->blockDimZ, config->sharedMemBytes, config->hStream, params, extra,
                clustered ? cluster : nullptr, cooperative);
}

// All blocks co-resident, so the kernel may synchronize the whole grid (cooperative groups'
// grid.sync()); oriond refuses grids that cannot be resident with
// CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE.
ORION_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                        unsigned int bx, unsigned int by, unsigned int bz,
                                                        unsigned int smem, CUstream s, void** params) {
  ORION_API(cuLaunchCooperativeKernel);
  return Launch(f, gx, gy, gz, bx, by, bz, smem, s, params, nullptr, nullptr, true);
}

ORION_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                                             unsigned int gz, unsigned int bx, unsigned int by,
                                                             unsigned int bz, unsigned int smem, CUstream s,
                                                             void** params) {
  ORION_API(cuLaunchCooperativeKernel_ptsz);
  return Launch(f, gx, gy, gz, bx, by, bz, smem, s, params, nullptr, nullptr, true);
}

ORION_EXPORT CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                                               void** extra) {
  ORION_API(cuLaunchKernelEx);
  return LaunchEx(config, f, params, extra);
}

ORION_EXPORT CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params,
                                                    void** extra) {
  ORION_API(cuLaunchKernelEx_ptsz);
  return LaunchEx(config, f, params, extra);
}

static CUresult Occupancy(int* numBlocks, const void* func, int blockSize, size_t smem, unsigned flags) {
  GuestFunction* f = AsFunction(func);
  if (numBlocks == nullptr || blockSize <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  OccupancyReq q{f->handle, static_cast<uint32_t>(blockSize), flags, smem};
  I32Rep rep{};
  CUresult r = Client::Get().Call(Op::kOccupancyMaxBlocks, &q, sizeof q, &rep, sizeof rep);
  if (r == CUDA_SUCCESS) *numBlocks = rep.value;
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks, CUfunction func,
                                                                          int blockSize, size_t smem) {
  ORION_API(cuOccupancyMaxActiveBlocksPerMultiprocessor);
  return Occupancy(numBlocks, func, blockSize, smem, 0);
}

ORION_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* numBlocks, CUfunction func,
                                                                                   int blockSize, size_t smem,
                                                                                   unsigned int flags) {
  ORION_API(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags);
  return Occupancy(numBlocks, func, blockSize, smem, flags);
}

// Both answered by oriond: the real driver's answer on the cuda backend, a model on sim.
ORION_EXPORT CUresult CUDAAPI cuOccupancyAvailableDynamicSMemPerBlock(size_t* dynamicSmemSize, CUfunction func,
                                                                      int numBlocks, int blockSize) {
  ORION_API(cuOccupancyAvailableDynamicSMemPerBlock);
  if (dynamicSmemSize == nullptr || numBlocks <= 0 || blockSize <= 0) return CUDA_ERROR_INVALID_VALUE;
  GuestFunction* f = AsFunction(func);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  OccupancySmemReq q{f->handle, numBlocks, blockSize};
  U64Rep rep{};
  CUresult r = Client::Get().Call(Op::kOccupancyAvailableSmem, &q, sizeof q, &rep, sizeof rep);
  if (r == CUDA_SUCCESS) *dynamicSmemSize = rep.value;
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveClusters(int* numClusters, CUfunction func,
                                                           const CUlaunchConfig* config) {
  ORION_API(cuOccupancyMaxActiveClusters);
  if (numClusters == nullptr || config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestFunction* f = AsFunction(func);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  OccupancyClustersReq q{};
  q.function = f->handle;
  q.grid[0] = config->gridDimX;
  q.grid[1] = config->gridDimY;
  q.grid[2] = config->gridDimZ;
  q.block[0] = config->blockDimX;
  q.block[1] = config->blockDimY;
  q.block[2] = config->blockDimZ;
  q.shared_mem_bytes = config->sharedMemBytes;
  ClusterOf(config, q.cluster);
  I32Rep rep{};
  CUresult r = Client::Get().Call(Op::kOccupancyMaxClusters, &q, sizeof q, &rep, sizeof rep);
  if (r == CUDA_SUCCESS) *numClusters = rep.value;
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialBlockSize(int* minGridSize, int* blockSize, CUfunction func,
                                                               CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                               size_t dynamicSMemSize, int blockSizeLimit) {
  ORION_API(cuOccupancyMaxPotentialBlockSize);
  if (minGridSize == nullptr || blockSize == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GuestFunction* f = AsFunction(func);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  int max_threads = 0;
  if (CUresult r = FuncAttr(func, &max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK); r != CUDA_SUCCESS) return r;
  if (blockSizeLimit > 0) max_threads = std::min(max_threads, blockSizeLimit);
  const int sms = Client::Get().devices()[0].attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT];
  int best_block = 0, best_threads = -1, best_blocks = 0;
  for (int b = (max_threads / 32) * 32; b >= 32; b -= 32) {
    const size_t smem = blockSizeToDynamicSMemSize != nullptr ? blockSizeToDynamicSMemSize(b) : dynamicSMemSize;
    int blocks = 0;
    if (CUresult r = Occupancy(&blocks, func, b, smem, 0); r != CUDA_SUCCESS) return r;
    if (blocks * b > best_threads) {
      best_threads = blocks * b;
      best_block = b;
      best_blocks = blocks;
    }
  }
  *blockSize = best_block;
  *minGridSize = best_blocks * sms;
  return CUDA_SUCCESS;
}

}  // extern "C"
