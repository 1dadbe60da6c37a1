// host/src/sim_module.cpp — the sim backend's devices, modules (parsed from fatbin, cubin or PTX), functions
// and their attributes, context limits. SimBackend member functions
// (sim_backend.h).
#include "sim_backend.h"

namespace orion::host::sim {

Status SimBackend::Init(const std::vector<Placement>& placements) {
  placements_ = placements;
  if (!opt_.launch_log.empty() && log_fd_ < 0) {
    return InvalidArgument("cannot open the sim launch log " + opt_.launch_log);
  }
  return Status::Ok();
}

void SimBackend::DescribeDevice(uint32_t dev, DeviceInfo* out) {
  const Placement& p = placements_.at(dev);
  std::snprintf(out->name, sizeof out->name, "Orion Simulated GPU");
  const uint8_t uuid[16] = {'O', 'R', 'I', 'O', 'N', '-', 'S', 'I',
                            'M', 0,   0,   0,   0,   0,   0,   static_cast<uint8_t>(p.pgpu)};
  std::memcpy(out->uuid, uuid, 16);
  FillSimAttributes(out->attributes, p.pgpu);
  std::snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "0000:%02x:00.0", 0x10 + p.pgpu);
  out->pgpu = p.pgpu;
  out->vgpu = p.vgpu;
}

CUresult SimBackend::RegisterWindow(void* base, uint64_t bytes) {
  window_ = static_cast<uint8_t*>(base);
  window_bytes_ = bytes;
  return CUDA_SUCCESS;
}

CUresult SimBackend::PrimaryCtxRetain(uint32_t dev, void** ctx) {
  *ctx = reinterpret_cast<void*>(uintptr_t{0x1000} + dev);
  return CUDA_SUCCESS;
}

CUresult SimBackend::CtxCreate(uint32_t dev, uint32_t, void** ctx) {
  *ctx = reinterpret_cast<void*>(uintptr_t{0x2000} + (next_ctx_++ << 8) + dev);
  return CUDA_SUCCESS;
}

CUresult SimBackend::CtxSetLimit(uint32_t limit, uint64_t value) {
  if (limit > CU_LIMIT_MAX) return CUDA_ERROR_INVALID_VALUE;
  limits_[limit] = value;
  return CUDA_SUCCESS;
}

CUresult SimBackend::CtxGetLimit(uint32_t limit, uint64_t* value) {
  if (limit > CU_LIMIT_MAX) return CUDA_ERROR_INVALID_VALUE;
  auto it = limits_.find(limit);
  static const uint64_t kDefaults[] = {1024, 1048576, 8388608, 2, 2048, 0, 128};
  *value = it != limits_.end() ? it->second : (limit < 7 ? kDefaults[limit] : 0);
  return CUDA_SUCCESS;
}

CUresult SimBackend::ModuleLoad(std::span<const uint8_t> image, void** module) {
  auto parsed = fatbin::ParseImage(image, 90);
  if (!parsed.ok()) {
    last_error_ = parsed.status().message();
    return CUDA_ERROR_INVALID_IMAGE;
  }
  // The arch of the PTX a GPU would JIT (0: the image is PTX text), from the entry headers alone.
  const auto arch = fatbin::PtxArch(image, 90);
  // PTX text newer than this driver's PTX ISA is refused at load, as the driver's JIT refuses it.
  if (parsed->from_ptx && arch.ok() && *arch == 0) {
    const std::string_view text(reinterpret_cast<const char*>(image.data()), image.size());
    if (CUresult r = CheckPtxVersion(text); r != CUDA_SUCCESS) return r;
  }
  auto m = std::make_unique<SimModule>();
  m->info = std::move(*parsed);
  // Keep the image for the executor only if it has PTX a GPU would run, by the driver's rule: a
  // GPU runs the module's SASS for its own arch when there is one (only sm_90 cubins run on this
  // sm_90 device) and JIT-compiles the PTX otherwise. PTX of another arch can differ from that
  // SASS (libraries tune block sizes per arch). Most library modules are SASS only: no copy.
  if (opt_.execute) {
    if (!arch.ok()) {
      m->ptx_tried = true;
      m->ptx_error = arch.status().message();
    } else if (m->info.sm_arch == 90 && *arch != 0 && *arch != 90) {
      m->ptx_tried = true;
      m->refusal_kind = LaunchRefusal::kPtxOtherArch;
      m->ptx_error = "a GPU would run the module's sm_90 SASS, and its PTX is for compute_" + std::to_string(*arch) +
                     " (SASS only for this device)";
    } else if (*arch > 90) {
      m->ptx_tried = true;
      m->refusal_kind = LaunchRefusal::kPtxOtherArch;
      m->ptx_error = "its only PTX is for compute_" + std::to_string(*arch) +
                     ", newer than this sm_90 device (a GPU finds no image it can run either)";
    } else {
      m->image.assign(image.begin(), image.end());
    }
  }
  *module = m.get();
  modules_.push_back(std::move(m));
  return CUDA_SUCCESS;
}

CUresult SimBackend::ModuleUnload(void* module) {
  (void)FlushBlocking(true);
  auto it = std::find_if(modules_.begin(), modules_.end(), [&](auto& m) { return m.get() == module; });
  if (it == modules_.end()) return CUDA_ERROR_INVALID_HANDLE;
  for (auto& [name, addr] : (*it)->globals) (void)MemFree(addr);
  modules_.erase(it);
  return CUDA_SUCCESS;
}

CUresult SimBackend::ModuleGetFunction(void* module, const char* name, void** function, KernelLayout* layout) {
  auto* m = static_cast<SimModule*>(module);
  const fatbin::Kernel* k = m->info.FindKernel(name);
  if (k == nullptr) return CUDA_ERROR_NOT_FOUND;
  auto f = std::make_unique<SimFunction>(SimFunction{m, k, {}, -1, CUDA_SUCCESS, {}, {}});
  layout->params.clear();
  for (const auto& p : k->params) layout->params.push_back({p.offset, p.size});
  layout->param_bytes = k->param_bytes;
  // Known from the module alone (no image the executor can use): the client refuses the launches
  // itself, synchronously. Refusals found at the first launch (a kernel the executor cannot
  // lower) come back from LaunchKernel.
  if (opt_.execute && !opt_.skip_unexecutable && m->ptx_tried && m->program == nullptr) {
    layout->launch_error = m->ptx_refusal;
    layout->launch_refusal = m->refusal_kind;
  }
  *function = f.get();
  functions_.push_back(std::move(f));
  return CUDA_SUCCESS;
}

CUresult SimBackend::ModuleFunctionNames(void* module, std::vector<std::string>* names) {
  names->clear();
  for (const fatbin::Kernel& k : static_cast<SimModule*>(module)->info.kernels) names->push_back(k.name);
  return CUDA_SUCCESS;
}

CUresult SimBackend::ModuleGlobals(void* module, std::vector<ModuleGlobal>* out) {
  out->clear();
  for (const auto& [name, addr] : static_cast<SimModule*>(module)->globals) {
    auto b = blocks_.find(addr);
    if (b == blocks_.end()) return CUDA_ERROR_ILLEGAL_STATE;
    out->push_back({name, addr, b->second.bytes});
  }
  return CUDA_SUCCESS;
}

// A restore: the variable gets the address it had, and as many bytes as its declaration can take
// (the size MemAlloc rounds it to), never more; before the first launch or lookup places it.
CUresult SimBackend::ModulePlaceGlobal(void* module, const ModuleGlobal& g) {
  auto* m = static_cast<SimModule*>(module);
  const fatbin::Global* decl = m->info.FindGlobal(g.name);
  if (decl == nullptr) return CUDA_ERROR_NOT_FOUND;
  const uint64_t span = (std::max<uint64_t>(decl->size, 1) + kSimAlign - 1) & ~(kSimAlign - 1);
  if (g.bytes != span || m->globals.count(g.name) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = MemAllocAt(g.bytes, g.addr); r != CUDA_SUCCESS) return r;
  m->globals.emplace(g.name, g.addr);
  return CUDA_SUCCESS;
}

CUresult SimBackend::ModuleGetGlobal(void* module, const char* name, uint64_t* dptr, uint64_t* bytes) {
  auto* m = static_cast<SimModule*>(module);
  const fatbin::Global* g = m->info.FindGlobal(name);
  if (g == nullptr) return CUDA_ERROR_NOT_FOUND;
  auto it = m->globals.find(name);
  if (it == m->globals.end()) {
    uint64_t addr = 0;
    if (CUresult r = MemAlloc(std::max<uint64_t>(g->size, 1), &addr); r != CUDA_SUCCESS) return r;
    if (!g->init.empty()) std::memcpy(Host(addr, g->init.size()), g->init.data(), g->init.size());
    it = m->globals.emplace(name, addr).first;
  }
  *dptr = it->second;
  *bytes = g->size;
  return CUDA_SUCCESS;
}

CUresult SimBackend::FuncGetAttribute(void* function, int attribute, int* value) {
  auto* f = static_cast<SimFunction*>(function);
  if (auto it = f->attributes.find(attribute); it != f->attributes.end()) {
    *value = it->second;
    return CUDA_SUCCESS;
  }
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
      *value = f->module->info.sm_arch != 0 ? static_cast<int>(f->module->info.sm_arch) : 90;
      break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = 49152; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 32; break;  // not read from the cubin: a plausible value
    default:
      if (attribute < 0 || attribute >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
      *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult SimBackend::FuncSetAttribute(void* function, int attribute, int value) {
  if (attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES &&
      (value < 0 || static_cast<uint64_t>(value) > kSimMaxSharedPerBlock))
    return CUDA_ERROR_INVALID_VALUE;
  if (attribute < 0 || attribute >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  static_cast<SimFunction*>(function)->attributes[attribute] = value;
  return CUDA_SUCCESS;
}

// CUDA_ERROR_UNSUPPORTED_PTX_VERSION (with last_error_) when `text` declares a PTX ISA newer than
// the driver version this backend reports JIT-compiles.
CUresult SimBackend::CheckPtxVersion(std::string_view text) {
  const int driver = opt_.driver_version;
  const uint32_t v = ptx::PtxIsaVersion(text), max = ptx::MaxPtxIsaVersion(driver);
  if (v <= max) return CUDA_SUCCESS;
  last_error_ = "PTX .version " + std::to_string(v / 100) + "." + std::to_string(v % 100) +
                " is newer than this driver (" + std::to_string(driver / 1000) + "." +
                std::to_string(driver % 1000 / 10) + ") supports (PTX ISA " + std::to_string(max / 100) + "." +
                std::to_string(max % 100) + ")";
  return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
}

// Whether the executor can run `f` (decided once, at its first launch); when not, `f->refusal`
// and `f->why` say what its launches fail with and why.
bool SimBackend::Runnable(SimFunction* f) {
  if (f->runnable >= 0) return f->runnable != 0;
  ptx::Program* prog = ProgramOf(f->module);
  if (prog == nullptr) {
    f->refusal = f->module->ptx_refusal;
    f->why = f->module->ptx_error;
  } else if (Status s = ptx::Prepare(*prog, f->kernel->name); !s.ok()) {
    const bool absent = s.code() == Code::kNotFound;
    f->refusal = absent ? CUDA_ERROR_NO_BINARY_FOR_GPU : CUDA_ERROR_NOT_SUPPORTED;
    f->why = absent ? "the module's PTX does not define it" : s.message();
  } else if (auto res = ptx::Resources(*prog, f->kernel->name); res.ok()) {
    // What the device cannot hold (hostile or not, a GPU's compiler refuses it): refused, not
    // allocated on oriond's host.
    f->resources = *res;
    if (res->shared_static > kSimMaxStaticShared) {
      f->refusal = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
      f->why = "it declares " + std::to_string(res->shared_static) +
               " bytes of static shared memory; an sm_90 block has at most 49152";
    } else if (res->local_per_thread > kSimMaxLocalPerThread) {
      f->refusal = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
      f->why = "it needs " + std::to_string(res->local_per_thread) +
               " bytes of local memory per thread; an sm_90 thread has at most 524288";
    }
  }
  f->runnable = f->refusal == CUDA_SUCCESS ? 1 : 0;
  return f->runnable != 0;
}

// The module's PTX program, parsed at its first launch; nullptr (with ptx_error) if none.
ptx::Program* SimBackend::ProgramOf(SimModule* m) {
  if (m->ptx_tried) return m->program.get();
  m->ptx_tried = true;
  auto ptx = fatbin::ExtractPtx(m->image, 90);
  std::vector<uint8_t>().swap(m->image);
  if (!ptx.ok()) {
    m->ptx_error = ptx.status().message();
    return nullptr;
  }
  if (CUresult r = CheckPtxVersion(ptx->text); r != CUDA_SUCCESS) {
    m->ptx_refusal = r;
    m->refusal_kind = LaunchRefusal::kPtxVersion;
    m->ptx_error = last_error_;
    return nullptr;
  }
  auto prog = ptx::Parse(ptx->text);
  if (!prog.ok()) {
    m->ptx_refusal = CUDA_ERROR_NOT_SUPPORTED;  // PTX a GPU would run, in a form the executor does not take
    m->refusal_kind = LaunchRefusal::kPtxUnsupported;
    m->ptx_error = "its PTX did not parse: " + prog.status().message();
    return nullptr;
  }
  // Module variables live in device memory, shared with cuModuleGetGlobal.
  for (const ptx::ModuleVar& v : ptx::Vars(**prog)) {
    auto it = m->globals.find(v.name);
    if (it == m->globals.end()) {
      uint64_t addr = 0;
      if (MemAlloc(std::max<uint64_t>(v.size, 1), &addr) != CUDA_SUCCESS) {
        m->ptx_error = "no memory for its variable " + v.name;
        return nullptr;
      }
      if (!v.init.empty()) std::memcpy(Host(addr, v.size), v.init.data(), std::min<uint64_t>(v.init.size(), v.size));
      it = m->globals.emplace(v.name, addr).first;
    }
    m->var_addrs.push_back(it->second);
  }
  m->program = std::move(*prog);
  return m->program.get();
}

}  // namespace orion::host::sim
