// session_vmm.cpp — Virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess): the Session
// handlers of these ops (ops.def).
#include "session_impl.h"

namespace orion::host::detail {

CUresult Session::OnMemAddressReserve(const MemReserveReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  const bool pow2 = q.alignment == 0 || (q.alignment & (q.alignment - 1)) == 0;
  uint64_t total = 0;
  if (q.bytes == 0 || q.bytes % kVmmGranularity != 0 || !pow2 || q.alignment > (uint64_t{1} << 40))
    return CUDA_ERROR_INVALID_VALUE;
  if (!CheckedAdd(reserved_bytes_, q.bytes, &total) || total > kMaxReservedBytes || HandlesFull()) {
    p_.log->warn("sess={} op=MemAddressReserve: {} MiB more would exceed the session's {} TiB of address space",
                 p_.session_id, q.bytes >> 20, kMaxReservedBytes >> 40);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  uint64_t addr = 0;
  r = b_->MemAddressReserve(q.bytes, q.alignment, q.fixed_addr, &addr);
  if (r == CUDA_SUCCESS) {
    reservations_[addr] = Reservation{q.bytes};
    reserved_bytes_ = total;
    c.Put(U64Rep{addr});
  }
  return r;
}

CUresult Session::OnMemAddressFree(const MemRangeReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  auto it = reservations_.find(q.addr);
  // The whole reservation, with nothing mapped in it any more.
  if (it == reservations_.end() || it->second.bytes != q.bytes || it->second.mappings != 0)
    return CUDA_ERROR_INVALID_VALUE;
  r = b_->MemAddressFree(q.addr, q.bytes);
  if (r == CUDA_SUCCESS) {
    reserved_bytes_ -= q.bytes;
    reservations_.erase(it);
  }
  return r;
}

CUresult Session::OnMemCreate(const MemCreateReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  if (q.device >= p_.placements.size() || q.bytes == 0 || q.bytes % kVmmGranularity != 0 || q.flags != 0)
    return q.device >= p_.placements.size() ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE;
  if (HandlesFull()) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t charged = 0;
  if (!Charge(q.device, q.bytes, kVmmGranularity, "MemCreate", "cuMemCreate", &charged))
    return CUDA_ERROR_OUT_OF_MEMORY;
  void* backend_handle = nullptr;
  r = b_->MemCreate(q.device, q.bytes, &backend_handle);
  if (r != CUDA_SUCCESS) {
    Uncharge(q.device, charged);
    return r;
  }
  const uint64_t pid = next_physical_++;
  physicals_.Add(pid, Physical{backend_handle, q.bytes, q.device});
  Obj o{Kind::kMemHandle, backend_handle, q.device, pid, {}};
  o.bytes = q.bytes;
  c.Put(HandleRep{AddHandle(std::move(o))});
  return r;
}

CUresult Session::OnMemRelease(const HandleReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  Obj* o = Find(q.handle, Kind::kMemHandle);
  if (o == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t pid = o->owner;
  r = b_->MemRelease(o->backend);
  if (r != CUDA_SUCCESS) return r;
  handles_.Erase(q.handle);
  physicals_.Known(pid).released = true;
  MaybeFreePhysical(pid);
  return r;
}

CUresult Session::OnMemMap(const MemMapReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  Obj* o = Find(q.handle, Kind::kMemHandle);
  if (o == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  auto res = ReservationOf(q.addr, q.bytes);
  const bool aligned = q.bytes != 0 && (q.addr | q.bytes | q.offset) % kVmmGranularity == 0;
  if (!aligned || res == reservations_.end() || q.offset > o->bytes || q.bytes > o->bytes - q.offset)
    return CUDA_ERROR_INVALID_VALUE;
  // Nothing mapped in the range yet.
  auto after = mappings_.lower_bound(q.addr);
  const bool overlaps =
      (after != mappings_.end() && after->first < q.addr + q.bytes) ||
      (after != mappings_.begin() && std::prev(after)->first + std::prev(after)->second.bytes > q.addr);
  if (overlaps) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t pid = o->owner;
  r = b_->MemMap(q.addr, q.bytes, q.offset, o->backend);
  if (r != CUDA_SUCCESS) return r;
  Mapping m{q.bytes, pid};
  m.offset = q.offset;
  mappings_[q.addr] = m;
  ++res->second.mappings;
  ++physicals_.Known(pid).mappings;
  return r;
}

CUresult Session::OnMemUnmap(const MemRangeReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  std::map<uint64_t, Mapping>::iterator first, it;
  if (!WholeMappings(q.addr, q.bytes, &first, &it)) return CUDA_ERROR_INVALID_VALUE;
  r = b_->MemUnmap(q.addr, q.bytes);
  if (r != CUDA_SUCCESS) return r;
  auto res = ReservationOf(q.addr, q.bytes);
  for (auto m = first; m != it;) {
    allocs_.erase(m->first);
    const uint64_t pid = m->second.physical;
    --physicals_.Known(pid).mappings;
    if (res != reservations_.end()) --res->second.mappings;
    m = mappings_.erase(m);
    MaybeFreePhysical(pid);
  }
  return r;
}

CUresult Session::OnMemSetAccess(const MemSetAccessReq& q, Call& /*c*/) {
  CUresult r = CUDA_SUCCESS;
  if (q.device >= p_.placements.size()) return CUDA_ERROR_INVALID_DEVICE;
  if (q.flags > CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_VALUE;
  std::map<uint64_t, Mapping>::iterator first, it;
  if (!WholeMappings(q.addr, q.bytes, &first, &it)) return CUDA_ERROR_INVALID_VALUE;
  r = b_->MemSetAccess(q.addr, q.bytes, q.device, q.flags);
  if (r != CUDA_SUCCESS) return r;
  const bool on = q.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE;
  for (auto m = first; m != it; ++m) {
    m->second.accessible = on;
    m->second.access_dev = q.device;
    m->second.access_flags = q.flags;
    if (on) {
      Alloc a{m->second.bytes, physicals_.Known(m->second.physical).dev, false};
      a.vmm = true;
      allocs_[m->first] = a;
    } else {
      allocs_.erase(m->first);
    }
  }
  return r;
}

}  // namespace orion::host::detail
