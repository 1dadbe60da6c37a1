// session_memory.cpp — Device memory: allocation against the quota, copies through the data window, memset: the Session
// handlers of these ops (ops.def).
#include "session_impl.h"

namespace orion::host::detail {

bool Session::Charge(uint32_t dev, uint64_t bytes, uint64_t granule, const char* op, const char* call,
                     uint64_t* charged) {
  SweepIpc(!lingering_.empty());  // a free of this session's waiting on its importers counts at once
  const Placement& pl = p_.placements[dev];
  uint64_t c = 0, after = 0;
  bool fits = CheckedAdd(bytes, granule - 1, &c);
  c &= ~(granule - 1);
  fits = fits && CheckedAdd(used_[dev] + overhead_[dev], c, &after) && after <= pl.quota_bytes;
  // On a hold, the vGPU's quota is for all its sessions together: reserve `c` on its meter.
  bool hold_full = false;
  if (fits && p_.hold_used != nullptr && dev < p_.hold_quota.size()) {
    std::atomic<uint64_t>& meter = p_.hold_used[dev];
    uint64_t all = meter.load(std::memory_order_relaxed);
    do {
      hold_full = all > p_.hold_quota[dev] || c > p_.hold_quota[dev] - all;
    } while (!hold_full && !meter.compare_exchange_weak(all, all + c, std::memory_order_relaxed));
    if (hold_full) {
      p_.log->warn(
          "sess={} op={} {}(): memory {} MB exceeds what is left ({} MB) of <vgpu {}, pgpu {}> quota ({} MB), "
          "which the processes sharing it use together",
          p_.session_id, op, call, c / (1 << 20) + (c % (1 << 20) != 0 ? 1 : 0),
          (all < p_.hold_quota[dev] ? p_.hold_quota[dev] - all : 0) >> 20, pl.vgpu, pl.pgpu, p_.hold_quota[dev] >> 20);
      return false;
    }
    metered_[dev] += c;  // on the meter already: PublishUsed adds nothing for it
  }
  if (!fits) {
    // In MiB, rounded up; a request too large to add up is shown as itself.
    const uint64_t want = after != 0 ? after : bytes;
    p_.log->warn("sess={} op={} {}(): memory {} MB exceeds <vgpu {}, pgpu {}> quota ({} MB)", p_.session_id, op, call,
                 want / (1 << 20) + (want % (1 << 20) != 0 ? 1 : 0), pl.vgpu, pl.pgpu, pl.quota_bytes >> 20);
    return false;
  }
  used_[dev] += c;
  PublishUsed(dev);
  *charged = c;
  return true;
}

CUresult Session::OnMemAlloc(const MemAllocReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  if (cur_ctx_ == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (q.bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  // Each allocation costs at least the driver's allocation granularity (kAllocGranularity):
  // many tiny allocations cannot hold more device memory than the quota.
  uint64_t charged = 0;
  if (!Charge(cur_dev_, q.bytes, kAllocGranularity, "MemAlloc", "cuMemAlloc", &charged))
    return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t dptr = 0;
  r = b_->MemAlloc(q.bytes, &dptr);
  if (r == CUDA_SUCCESS) {
    allocs_[dptr] = {q.bytes, cur_dev_, true, charged};
    c.Put(U64Rep{dptr});
  } else {
    Uncharge(cur_dev_, charged);
  }
  return r;
}

CUresult Session::OnMemFree(const MemFreeReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  auto it = allocs_.find(q.dptr);
  if (it == allocs_.end() || !it->second.counted) return CUDA_ERROR_INVALID_VALUE;
  // An exported allocation: revoke its ticket, and keep the charge while importers map it.
  int ticket = -1;
  if (ipc_exports_.count(q.dptr) != 0) {
    const int fd = b_->IpcTicketFd(q.dptr);
    if (fd >= 0) ticket = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (ticket >= 0) RevokeIpcTicket(ticket);
  }
  r = b_->MemFree(q.dptr);
  if (r == CUDA_SUCCESS) {
    if (ticket >= 0 && IpcTicketImported(ticket)) {
      p_.log->info(
          "sess={} op=MemFree {:#x}: an importer still maps it; its {} MB stay on this session's quota "
          "until the last importer closes it",
          p_.session_id, q.dptr, it->second.charged >> 20);
      lingering_.push_back({ticket, it->second.dev, it->second.charged});
      ticket = -1;
    } else {
      Uncharge(it->second.dev, it->second.charged);
    }
    allocs_.erase(it);
    ipc_exports_.erase(q.dptr);
  }
  if (ticket >= 0) ::close(ticket);
  return r;
}

CUresult Session::OnMemGetInfo(Call& c) {
  CUresult r = CUDA_SUCCESS;
  if (cur_ctx_ == 0) return CUDA_ERROR_INVALID_CONTEXT;
  SweepIpc(true);
  uint64_t free = 0, total = 0;
  r = b_->MemGetInfo(&free, &total);
  const uint64_t quota = p_.placements[cur_dev_].quota_bytes;
  // The vGPU's view: total = quota; free = what is left of it, for this process and the others
  // on its hold (never more than the GPU has).
  MemGetInfoRep rep{std::min(free, QuotaLeft(cur_dev_)), quota};
  if (std::string(b_->name()) == "sim") rep.free = QuotaLeft(cur_dev_);
  c.Put(rep);
  return r;
}

CUresult Session::OnMemcpyHtoD(const MemcpyReq& q, Call& /*c*/) {
  void* s = nullptr;
  if (!WindowRange(q.src, q.bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (!DeviceRange(q.dst, q.bytes) || !Stream(q.stream, &s)) return CUDA_ERROR_INVALID_VALUE;
  return b_->MemcpyHtoD(q.dst, window_ + q.src, q.bytes, s);
}

// MemcpyDtoH and MemcpyDtoHAsync: the window's bytes [q.dst, +bytes) from device memory.
CUresult Session::CopyDtoH(const MemcpyReq& q, bool async) {
  void* s = nullptr;
  if (!WindowRange(q.dst, q.bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (!DeviceRange(q.src, q.bytes) || !Stream(q.stream, &s)) return CUDA_ERROR_INVALID_VALUE;
  return b_->MemcpyDtoH(window_ + q.dst, q.src, q.bytes, s, async);
}

CUresult Session::OnMemcpyDtoH(const MemcpyReq& q, Call& /*c*/) { return CopyDtoH(q, false); }

CUresult Session::OnMemcpyDtoHAsync(const MemcpyReq& q, Call& /*c*/) { return CopyDtoH(q, true); }

CUresult Session::OnMemcpyDtoD(const MemcpyReq& q, Call& /*c*/) {
  void* s = nullptr;
  if (!DeviceRange(q.dst, q.bytes) || !DeviceRange(q.src, q.bytes) || !Stream(q.stream, &s))
    return CUDA_ERROR_INVALID_VALUE;
  return b_->MemcpyDtoD(q.dst, q.src, q.bytes, s);
}

CUresult Session::OnMemcpy2D(const Memcpy2DReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  void* s = nullptr;
  if (q.width_bytes == 0 || q.height == 0) return r;
  uint64_t src_span = 0, dst_span = 0;
  if (q.src_side > kSideWindow || q.dst_side > kSideWindow || !Stream(q.stream, &s) ||
      !Span2D(q.height, q.src_pitch, q.width_bytes, &src_span) ||
      !Span2D(q.height, q.dst_pitch, q.width_bytes, &dst_span)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const bool src_ok = q.src_side == kSideWindow ? WindowRange(q.src, src_span) : DeviceRange(q.src, src_span);
  const bool dst_ok = q.dst_side == kSideWindow ? WindowRange(q.dst, dst_span) : DeviceRange(q.dst, dst_span);
  if (!src_ok || !dst_ok) return CUDA_ERROR_INVALID_VALUE;
  return b_->Memcpy2D(q.dst_side == kSideDevice ? q.dst : 0, q.dst_side == kSideWindow ? window_ + q.dst : nullptr,
                      q.dst_pitch, q.src_side == kSideDevice ? q.src : 0,
                      q.src_side == kSideWindow ? window_ + q.src : nullptr, q.src_pitch, q.width_bytes, q.height, s);
  return r;
}

CUresult Session::OnMemset(const MemsetReq& q, Call& /*c*/) {
  void* s = nullptr;
  uint64_t row_bytes = 0, span = 0;
  if ((q.elem_size != 1 && q.elem_size != 2 && q.elem_size != 4) || !CheckedMul(q.width, q.elem_size, &row_bytes) ||
      !Span2D(q.height, q.height > 1 ? q.pitch : row_bytes, row_bytes, &span) || !Stream(q.stream, &s)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!DeviceRange(q.dst, span)) return CUDA_ERROR_INVALID_VALUE;
  return b_->Memset(q.dst, q.value, q.elem_size, q.width, q.height, q.pitch, s);
}

CUresult Session::OnHostGetDevicePointer(const WindowRangeReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  if (q.bytes == 0 || !WindowRange(q.window_offset, q.bytes) || q.window_offset < layout_.staging_bytes)
    return CUDA_ERROR_INVALID_VALUE;
  uint64_t dptr = 0;
  r = b_->HostGetDevicePointer(window_ + q.window_offset, q.bytes, q.host_address, &dptr);
  if (q.host_address != 0 && b_->SameAddressMapping() && (r != CUDA_SUCCESS || dptr != q.host_address) &&
      !same_address_warned_) {
    same_address_warned_ = true;  // once per session: the client then translates in copies
    p_.log->warn("sess={} op=HostGetDevicePointer: not mapped at the client's address {:#x}: {}", p_.session_id,
                 q.host_address, LogSafe(b_->ErrorDetail()));
  }
  if (r == CUDA_SUCCESS) {
    // At the client's own address, the range may overlap window mappings of memory the client
    // has since freed (and the backend merged or dropped them): those records go.
    if (dptr == q.host_address) {
      auto it = allocs_.upper_bound(dptr);
      if (it != allocs_.begin()) --it;
      while (it != allocs_.end() && it->first < dptr + q.bytes) {
        if (it->first + it->second.bytes > dptr && it->second.window) {
          it = allocs_.erase(it);
        } else {
          ++it;
        }
      }
    }
    Alloc a{q.bytes, cur_dev_, false};
    a.window = true;
    allocs_[dptr] = a;
    c.Put(U64Rep{dptr});
  }
  return r;
}

}  // namespace orion::host::detail
