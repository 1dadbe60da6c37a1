// session_context.cpp — Contexts (cuCtx*, cuDevicePrimaryCtx*) and the NVML view of a vGPU: the Session handlers of
// these ops (ops.def).
#include "session_impl.h"

namespace orion::host::detail {

CUresult Session::OnCtxCreate(const CtxCreateReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  if (q.device >= p_.placements.size()) return CUDA_ERROR_INVALID_DEVICE;
  if (HandlesFull()) return CUDA_ERROR_OUT_OF_MEMORY;
  void* ctx = nullptr;
  r = b_->CtxCreate(q.device, q.flags, &ctx);
  if (r == CUDA_SUCCESS) {
    Obj o{Kind::kCtx, ctx, q.device, 0, {}};
    o.flags = q.flags;
    const uint64_t id = AddHandle(std::move(o));
    c.Put(HandleRep{id});
    cur_ctx_ = id;
    cur_dev_ = q.device;
  }
  return r;
}

CUresult Session::OnCtxDestroy(const HandleReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  Obj* o = Find(q.handle, Kind::kCtx);
  if (o == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  r = b_->CtxDestroy(o->backend);
  if (r == CUDA_SUCCESS) {
    handles_.Erase(q.handle);
    ctx_limits_.erase(q.handle);
    if (cur_ctx_ == q.handle) cur_ctx_ = 0;
  }
  return r;
}

CUresult Session::OnCtxSetCurrent(const HandleReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  Obj* o = Find(q.handle, Kind::kCtx);
  if (o == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  r = b_->SetCurrent(o->backend);
  if (r == CUDA_SUCCESS) {
    cur_ctx_ = q.handle;
    cur_dev_ = o->dev;
  }
  return r;
}

CUresult Session::OnCtxSynchronize(Call& /*c*/) { return b_->CtxSynchronize(); }

CUresult Session::OnPrimaryCtxRetain(const DeviceReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  if (q.device >= p_.placements.size()) return CUDA_ERROR_INVALID_DEVICE;
  void* ctx = nullptr;
  r = b_->PrimaryCtxRetain(q.device, &ctx);
  if (r == CUDA_SUCCESS) {
    uint64_t& id = primary_ids_[ctx];
    if (id == 0 || Find(id, Kind::kCtx) == nullptr) {
      Obj o{Kind::kCtx, ctx, q.device, 0, {}};
      o.primary = true;
      id = AddHandle(std::move(o));
    }
    c.Put(HandleRep{id});
    if (cur_ctx_ == 0) {
      cur_ctx_ = id;
      cur_dev_ = q.device;
      r = b_->SetCurrent(ctx);
    }
  }
  return r;
}

CUresult Session::OnPrimaryCtxRelease(Call& /*c*/) { return CUDA_SUCCESS; }

CUresult Session::OnPrimaryCtxReset(const DeviceReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  if (q.device >= p_.placements.size()) return CUDA_ERROR_INVALID_DEVICE;
  r = b_->PrimaryCtxReset(q.device);
  if (r == CUDA_SUCCESS) {
    // The reset frees the context's allocations, arrays, texture and surface objects.
    // VMM mappings are not a context's: they stay.
    for (auto it = texobjs_.begin(); it != texobjs_.end();) {
      if (it->second.dev != q.device) {
        ++it;
        continue;
      }
      (void)b_->TexObjectDestroy(it->first.first, it->first.second);
      if (it->second.array != 0) --arrays_.Known(it->second.array).objects;
      it = texobjs_.Erase(it);
    }
    for (auto it = mipmaps_.begin(); it != mipmaps_.end();) {
      if (it->second.dev != q.device) {
        ++it;
        continue;
      }
      for (uint64_t level : it->second.level_ids) arrays_.Erase(level);
      (void)b_->MipmappedArrayDestroy(it->second.backend);
      Uncharge(it->second.dev, it->second.charged);
      it = mipmaps_.Erase(it);
    }
    for (auto it = arrays_.begin(); it != arrays_.end();) {
      if (it->second.dev != q.device) {
        ++it;
        continue;
      }
      (void)b_->ArrayDestroy(it->second.backend);
      Uncharge(it->second.dev, it->second.charged);
      it = arrays_.Erase(it);
    }
    for (auto it = allocs_.begin(); it != allocs_.end();) {
      if (it->second.dev == q.device && !it->second.vmm) {
        if (it->second.counted) used_[q.device] -= it->second.charged;
        PublishUsed(q.device);
        (void)b_->MemFree(it->first);
        it = allocs_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return r;
}

CUresult Session::OnCtxSetLimit(const LimitReq& q, Call& /*c*/) {
  if (cur_ctx_ == 0) return CUDA_ERROR_INVALID_CONTEXT;
  const CUresult r = b_->CtxSetLimit(q.limit, q.value);
  if (r == CUDA_SUCCESS) ctx_limits_[cur_ctx_][q.limit] = q.value;  // a migration sets it again
  return r;
}

CUresult Session::OnCtxGetLimit(const LimitReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  uint64_t v = 0;
  r = cur_ctx_ == 0 ? CUDA_ERROR_INVALID_CONTEXT : b_->CtxGetLimit(q.limit, &v);
  c.Put(U64Rep{v});
  return r;
}

CUresult Session::OnDeviceMemoryInfo(const DeviceReq& q, Call& c) {
  // NVML's view of one vGPU (guest libnvidia-ml.so.1): needs no context. Hostile input: the
  // device index is checked against this session's placements, the flags must be 0.
  if (q.device >= p_.placements.size() || q.flags != 0) return CUDA_ERROR_INVALID_VALUE;
  c.Put(DeviceMemoryRep{p_.placements[q.device].quota_bytes, used_[q.device], overhead_[q.device]});
  return CUDA_SUCCESS;
}

CUresult Session::OnDeviceUtilization(const DeviceReq& q, Call& c) {
  // NVML's utilization of one vGPU: its tenant's device time, measured by the compute-share
  // scheduler, which only a backend that gates compute keeps (GatesCompute).
  if (q.device >= p_.placements.size() || q.flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (q.device >= gates_.size() || gates_[q.device] == nullptr || !b_->GatesCompute()) return CUDA_ERROR_NOT_SUPPORTED;
  const ComputeGate& g = *gates_[q.device];
  c.Put(DeviceUtilizationRep{g.utilization_permille(), g.ratio(), g.busy_ns(), g.throttled_ns()});
  return CUDA_SUCCESS;
}

}  // namespace orion::host::detail
