// session_ipc.cpp — CUDA IPC between sessions (cuIpc*): memory and event handles through tickets: the Session handlers
// of these ops (ops.def).
#include "session_impl.h"

namespace orion::host::detail {

void Session::SweepIpc(bool now) {
  if (lingering_.empty() && ipc_imports_.size() == adopted_.size()) return;
  const auto t = std::chrono::steady_clock::now();
  if (!now && t - ipc_swept_ < std::chrono::milliseconds(50)) return;  // at most 20 sweeps a second
  ipc_swept_ = t;
  for (auto it = lingering_.begin(); it != lingering_.end();) {
    if (IpcTicketImported(it->fd)) {
      ++it;
      continue;
    }
    ::close(it->fd);
    Uncharge(it->dev, it->charged);
    p_.log->info("sess={} an IPC allocation freed earlier is closed by its last importer: {} MB back to the quota",
                 p_.session_id, it->charged >> 20);
    it = lingering_.erase(it);
  }
  for (const uint64_t dptr : ipc_imports_) {
    if (adopted_.count(dptr) != 0) continue;
    const int fd = b_->IpcTicketFd(dptr);
    auto a = allocs_.find(dptr);
    if (fd < 0 || a == allocs_.end() || IpcExporterHolds(fd)) continue;
    adopted_[dptr] = ChargeOver(a->second.dev, a->second.bytes);
    p_.log->warn("sess={} IPC import {:#x} ({} MB) outlived its exporter's session: charged to this session's quota",
                 p_.session_id, dptr, adopted_[dptr] >> 20);
  }
}

CUresult Session::OnIpcGetMemHandle(const MemFreeReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  // The start of one of this session's own allocations (cuMemAlloc'ed: not imported, not VMM).
  auto it = allocs_.find(q.dptr);
  if (it == allocs_.end() || !it->second.counted) return CUDA_ERROR_INVALID_VALUE;
  if (ipc_exports_.count(q.dptr) == 0 && ipc_exports_.size() >= kMaxIpcExports) return CUDA_ERROR_OUT_OF_MEMORY;
  IpcHandle handle{};
  r = b_->IpcExportMemory(q.dptr, it->second.bytes, &handle);
  if (r != CUDA_SUCCESS) return r;
  ipc_exports_.insert(q.dptr);
  c.Put(handle);
  return r;
}

CUresult Session::OnIpcOpenMemHandle(const IpcOpenReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  if (cur_ctx_ == 0) return CUDA_ERROR_INVALID_CONTEXT;
  SweepIpc(true);
  // A session paying for imports whose exporters are gone past its quota opens no more.
  if (ipc_imports_.size() >= kMaxIpcImports ||
      used_[cur_dev_] + overhead_[cur_dev_] > p_.placements[cur_dev_].quota_bytes) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  IpcHandle handle{};
  std::memcpy(&handle, q.handle, sizeof handle);
  uint64_t dptr = 0, bytes = 0;
  r = b_->IpcImportMemory(handle, &dptr, &bytes);
  if (r != CUDA_SUCCESS) {
    p_.log->warn("sess={} op=IpcOpenMemHandle refused: {}", p_.session_id, LogSafe(b_->ErrorDetail()));
    return r;
  }
  allocs_[dptr] = {std::max<uint64_t>(bytes, 1), cur_dev_, false};  // charged to the exporter
  ipc_imports_.insert(dptr);
  c.Put(IpcOpenRep{dptr, bytes});
  return r;
}

CUresult Session::OnIpcCloseMemHandle(const MemFreeReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  if (ipc_imports_.count(q.dptr) == 0) return CUDA_ERROR_INVALID_VALUE;
  r = b_->IpcCloseMemory(q.dptr);
  if (r == CUDA_SUCCESS) {
    if (auto a = adopted_.find(q.dptr); a != adopted_.end()) {
      Uncharge(allocs_[q.dptr].dev, a->second);
      adopted_.erase(a);
    }
    ipc_imports_.erase(q.dptr);
    allocs_.erase(q.dptr);
  }
  return r;
}

CUresult Session::OnIpcGetEventHandle(const HandleReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  Obj* e = Find(q.handle, Kind::kEvent);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // Each exported event holds a ticket (an fd in this worker): bounded like memory exports.
  if (ipc_event_exports_.count(q.handle) == 0 && ipc_event_exports_.size() >= kMaxIpcExports)
    return CUDA_ERROR_OUT_OF_MEMORY;
  IpcHandle handle{};
  r = b_->IpcExportEvent(e->backend, &handle);
  if (r == CUDA_SUCCESS) {
    ipc_event_exports_.insert(q.handle);
    c.Put(handle);
  }
  return r;
}

CUresult Session::OnIpcOpenEventHandle(const IpcOpenReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  if (cur_ctx_ == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (HandlesFull()) return CUDA_ERROR_OUT_OF_MEMORY;
  IpcHandle handle{};
  std::memcpy(&handle, q.handle, sizeof handle);
  void* ev = nullptr;
  r = b_->IpcImportEvent(handle, &ev);
  if (r != CUDA_SUCCESS) {
    p_.log->warn("sess={} op=IpcOpenEventHandle refused: {}", p_.session_id, LogSafe(b_->ErrorDetail()));
    return r;
  }
  c.Put(HandleRep{AddHandle({Kind::kEvent, ev, cur_dev_, cur_ctx_, {}})});
  return r;
}

}  // namespace orion::host::detail
