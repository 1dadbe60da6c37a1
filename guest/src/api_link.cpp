// Exported driver API: JIT linking (cuLinkCreate, cuLinkAddData, cuLinkAddFile, cuLinkComplete,
// cuLinkDestroy), as numba-style tools, CuPy's -rdc=true and PTX JIT programs use it.
//
// The link happens here, in the client, at the PTX level (ptx/src/link.cpp): PTX inputs, and the
// PTX of fatbinary inputs, are linked into one PTX module, which cuLinkComplete returns in place
// of NVIDIA's cubin. The program then loads it with cuModuleLoadData like any image: oriond's cuda
// backend has its driver JIT-compile it, the sim backend executes it. Undefined references and
// duplicate definitions fail cuLinkComplete with CUDA_ERROR_NOT_FOUND / CUDA_ERROR_INVALID_PTX
// and the reason in the error log (CU_JIT_ERROR_LOG_BUFFER), as with NVIDIA's linker.
// CU_JIT_INPUT_LIBRARY inputs (libcudadevrt.a) are accepted and not read: a reference only they
// could resolve (the device runtime) is reported undefined. Refused, loudly: SASS-only inputs
// (cubins, objects, fatbinaries without PTX) and LTO IR (CU_JIT_INPUT_NVVM).
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "export.h"
#include "log.h"
#include "orion/fatbin/fatbin.h"
#include "orion/ptx/link.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

namespace {

constexpr uint64_t kMaxInputBytes = uint64_t{1} << 30;  // one input; the images cuModuleLoadData takes are < 2 GiB

// Where the driver writes its logs: the caller's buffers from cuLinkCreate's options, valid until
// cuLinkDestroy (CUDA driver API reference, cuLinkCreate).
struct LogSink {
  char* buffer = nullptr;
  void** size_slot = nullptr;  // the option value holding the buffer size; receives the bytes written
  size_t size = 0;
  void Write(const std::string& text) const {
    if (buffer == nullptr || size == 0) return;
    const size_t n = std::min(text.size(), size - 1);
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
    if (size_slot != nullptr) *size_slot = reinterpret_cast<void*>(static_cast<uintptr_t>(n + 1));
  }
};

struct LinkState {
  std::vector<std::string> ptx;  // the PTX inputs, in order
  std::vector<std::string> names;
  unsigned libraries = 0;  // CU_JIT_INPUT_LIBRARY inputs, accepted and not read
  LogSink info, error;
  float* wall_time = nullptr;  // CU_JIT_WALL_TIME: the option value slot, as a float
  std::string output;          // cuLinkComplete's image (NUL-terminated PTX)
};

std::mutex g_mu;
std::unordered_set<LinkState*> g_states;

bool Live(CUlinkState s) {
  std::lock_guard<std::mutex> l(g_mu);
  return g_states.count(reinterpret_cast<LinkState*>(s)) != 0;
}

void WarnOnce(const std::string& what) {
  static std::mutex mu;
  static std::unordered_set<std::string> seen;
  std::lock_guard<std::mutex> l(mu);
  if (seen.insert(what).second) LogWarn(what + " is not supported by Orion; returning CUDA_ERROR_NOT_SUPPORTED");
}

CUresult Options(LinkState* st, unsigned n, CUjit_option* opts, void** values) {
  if (n != 0 && (opts == nullptr || values == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; ++i) {
    switch (opts[i]) {
      case CU_JIT_INFO_LOG_BUFFER: st->info.buffer = static_cast<char*>(values[i]); break;
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
        st->info.size = static_cast<size_t>(reinterpret_cast<uintptr_t>(values[i]));
        st->info.size_slot = &values[i];
        break;
      case CU_JIT_ERROR_LOG_BUFFER: st->error.buffer = static_cast<char*>(values[i]); break;
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
        st->error.size = static_cast<size_t>(reinterpret_cast<uintptr_t>(values[i]));
        st->error.size_slot = &values[i];
        break;
      case CU_JIT_WALL_TIME: st->wall_time = reinterpret_cast<float*>(&values[i]); break;
      default:
        // Code-generation options (optimization level, max registers, target, cache mode, ...)
        // tune the JIT compilation that happens when the linked PTX is loaded; they are hints.
        break;
    }
  }
  return CUDA_SUCCESS;
}

CUresult AddInput(CUlinkState state, CUjitInputType type, const uint8_t* data, size_t size, const char* name,
                  unsigned n, CUjit_option* opts, void** values) {
  if (!Live(state) || (data == nullptr && size != 0)) return CUDA_ERROR_INVALID_HANDLE;
  auto* st = reinterpret_cast<LinkState*>(state);
  if (size == 0 || size > kMaxInputBytes) return CUDA_ERROR_INVALID_VALUE;
  if (n != 0 && (opts == nullptr || values == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  const std::string label = name != nullptr ? name : "(unnamed)";
  switch (type) {
    case CU_JIT_INPUT_PTX: {
      std::string text(reinterpret_cast<const char*>(data), size);
      if (const size_t nul = text.find('\0'); nul != std::string::npos) text.resize(nul);
      st->ptx.push_back(std::move(text));
      st->names.push_back(label);
      return CUDA_SUCCESS;
    }
    case CU_JIT_INPUT_FATBINARY: {
      auto e = fatbin::ExtractPtx(std::span<const uint8_t>(data, size), 90);
      if (!e.ok()) {
        WarnOnce("linking a fatbinary without PTX (" + e.status().message() + ")");
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      st->ptx.push_back(std::move(e->text));
      st->names.push_back(label);
      return CUDA_SUCCESS;
    }
    case CU_JIT_INPUT_LIBRARY:
      ++st->libraries;
      LogDebug("cuLinkAddData: library " + label + " accepted and not read (Orion links PTX)");
      return CUDA_SUCCESS;
    case CU_JIT_INPUT_CUBIN:
    case CU_JIT_INPUT_OBJECT:
      WarnOnce("linking SASS inputs (cubins and objects; Orion links PTX)");
      return CUDA_ERROR_NOT_SUPPORTED;
    case CU_JIT_INPUT_NVVM: WarnOnce("linking LTO IR (CU_JIT_INPUT_NVVM)"); return CUDA_ERROR_NOT_SUPPORTED;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuLinkCreate_v2(unsigned int numOptions, CUjit_option* options, void** optionValues,
                                              CUlinkState* stateOut) {
  ORION_API(cuLinkCreate_v2);
  if (stateOut == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  auto st = std::make_unique<LinkState>();
  if (CUresult r = Options(st.get(), numOptions, options, optionValues); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> l(g_mu);
  if (g_states.size() >= 4096) return CUDA_ERROR_OUT_OF_MEMORY;  // bounded: 4096 unfinished links
  *stateOut = reinterpret_cast<CUlinkState>(st.get());
  g_states.insert(st.release());
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void* data, size_t size,
                                               const char* name, unsigned int numOptions, CUjit_option* options,
                                               void** optionValues) {
  ORION_API(cuLinkAddData_v2);
  return AddInput(state, type, static_cast<const uint8_t*>(data), size, name, numOptions, options, optionValues);
}

ORION_EXPORT CUresult CUDAAPI cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char* path,
                                               unsigned int numOptions, CUjit_option* options, void** optionValues) {
  ORION_API(cuLinkAddFile_v2);
  if (!Live(state)) return CUDA_ERROR_INVALID_HANDLE;
  if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type == CU_JIT_INPUT_LIBRARY) {  // not read (see above)
    return AddInput(state, type, reinterpret_cast<const uint8_t*>(path), 1, path, numOptions, options, optionValues);
  }
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) return CUDA_ERROR_FILE_NOT_FOUND;
  std::vector<uint8_t> bytes;
  uint8_t buf[65536];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0 && bytes.size() <= kMaxInputBytes) {
    bytes.insert(bytes.end(), buf, buf + got);
  }
  std::fclose(f);
  return AddInput(state, type, bytes.data(), bytes.size(), path, numOptions, options, optionValues);
}

ORION_EXPORT CUresult CUDAAPI cuLinkComplete(CUlinkState state, void** cubinOut, size_t* sizeOut) {
  ORION_API(cuLinkComplete);
  if (!Live(state)) return CUDA_ERROR_INVALID_HANDLE;
  if (cubinOut == nullptr || sizeOut == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* st = reinterpret_cast<LinkState*>(state);
  if (st->wall_time != nullptr) *st->wall_time = 0.0f;
  if (st->ptx.empty()) {
    st->error.Write("error   : no PTX input to link");
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::vector<std::string_view> texts(st->ptx.begin(), st->ptx.end());
  auto linked = ptx::LinkText(texts);
  if (!linked.ok()) {
    const std::string msg = "error   : " + linked.status().message();
    st->error.Write(msg);
    LogWarn("cuLinkComplete: " + msg.substr(10));
    return linked.status().code() == Code::kNotFound ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_PTX;
  }
  st->output = std::move(*linked);
  st->info.Write("info    : linked " + std::to_string(st->ptx.size()) + " PTX module(s) (Orion)");
  st->error.Write("");
  *cubinOut = st->output.data();  // NUL-terminated: loadable with cuModuleLoadData
  *sizeOut = st->output.size() + 1;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuLinkDestroy(CUlinkState state) {
  ORION_API(cuLinkDestroy);
  LinkState* st = reinterpret_cast<LinkState*>(state);
  {
    std::lock_guard<std::mutex> l(g_mu);
    if (g_states.erase(st) == 0) return CUDA_ERROR_INVALID_HANDLE;
  }
  delete st;
  return CUDA_SUCCESS;
}

}  // extern "C"
