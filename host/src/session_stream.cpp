// session_stream.cpp — Streams and events: the Session handlers of these ops (ops.def).
#include "session_impl.h"

namespace orion::host::detail {
namespace {

// The stream attributes StreamAttribute serves, and whether a value to set is one (CUDA driver
// API, CUstreamAttrValue: CUaccessPolicyWindow's hitRatio in [0, 1] and CUaccessProperty values;
// CUsynchronizationPolicy 1..4). The window's address range is a cache hint, never accessed.
bool StreamAttrValid(uint32_t attr, bool set, const uint8_t value[64]) {
  if (attr == CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW) {
    if (!set) return true;
    CUaccessPolicyWindow w{};
    std::memcpy(&w, value, sizeof w);
    const auto prop_ok = [](CUaccessProperty p) {
      return p == CU_ACCESS_PROPERTY_NORMAL || p == CU_ACCESS_PROPERTY_STREAMING || p == CU_ACCESS_PROPERTY_PERSISTING;
    };
    return w.hitRatio >= 0.0f && w.hitRatio <= 1.0f && prop_ok(w.hitProp) && prop_ok(w.missProp);
  }
  if (attr == CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY) {
    if (!set) return true;
    uint32_t policy = 0;
    std::memcpy(&policy, value, sizeof policy);
    return policy >= CU_SYNC_POLICY_AUTO && policy <= CU_SYNC_POLICY_BLOCKING_SYNC;
  }
  return false;
}

}  // namespace

CUresult Session::OnStreamCreate(const StreamCreateReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  if (cur_ctx_ == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (HandlesFull()) return CUDA_ERROR_OUT_OF_MEMORY;
  void* s = nullptr;
  r = b_->StreamCreate(q.flags, q.priority, &s);
  if (r == CUDA_SUCCESS) {
    Obj o{Kind::kStream, s, cur_dev_, cur_ctx_, {}};
    o.flags = q.flags;
    o.priority = q.priority;
    c.Put(HandleRep{AddHandle(std::move(o))});
  }
  return r;
}

CUresult Session::OnStreamDestroy(const HandleReq& q, Call& /*c*/) {
  void* s = nullptr;
  if (q.handle == 0 || !Stream(q.handle, &s)) return CUDA_ERROR_INVALID_HANDLE;  // the null stream stays
  const CUresult r = b_->StreamDestroy(s);
  if (r == CUDA_SUCCESS) {
    handles_.Erase(q.handle);
    stream_attrs_.erase({q.handle, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW});
    stream_attrs_.erase({q.handle, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY});
  }
  return r;
}

CUresult Session::OnStreamSynchronize(const HandleReq& q, Call& /*c*/) {
  void* s = nullptr;
  if (!Stream(q.handle, &s)) return CUDA_ERROR_INVALID_HANDLE;
  return b_->StreamSynchronize(s);
}

CUresult Session::OnStreamQuery(const HandleReq& q, Call& /*c*/) {
  void* s = nullptr;
  if (!Stream(q.handle, &s)) return CUDA_ERROR_INVALID_HANDLE;
  return b_->StreamQuery(s);
}

CUresult Session::OnStreamWaitEvent(const StreamWaitEventReq& q, Call& /*c*/) {
  void* s = nullptr;
  Obj* e = Find(q.event, Kind::kEvent);
  if (e == nullptr || !Stream(q.stream, &s)) return CUDA_ERROR_INVALID_HANDLE;
  return b_->StreamWaitEvent(s, e->backend, q.flags);
}

CUresult Session::OnStreamAttribute(const StreamAttrReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  void* s = nullptr;
  if (!Stream(q.stream, &s)) return CUDA_ERROR_INVALID_HANDLE;
  StreamAttrRep rep{};
  std::memcpy(rep.value, q.value, sizeof rep.value);
  if (q.set > 1 || !StreamAttrValid(q.attr, q.set != 0, rep.value)) return CUDA_ERROR_INVALID_VALUE;
  r = b_->StreamAttribute(s, q.attr, q.set != 0, rep.value);
  if (r == CUDA_SUCCESS) c.Put(rep);
  if (r == CUDA_SUCCESS && q.set != 0) stream_attrs_[{q.stream, q.attr}].assign(q.value, q.value + sizeof q.value);
  return r;
}

CUresult Session::OnEventCreate(const EventCreateReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  if (cur_ctx_ == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (HandlesFull()) return CUDA_ERROR_OUT_OF_MEMORY;
  void* e = nullptr;
  r = b_->EventCreate(q.flags, &e);
  if (r == CUDA_SUCCESS) {
    Obj o{Kind::kEvent, e, cur_dev_, cur_ctx_, {}};
    o.flags = q.flags;
    c.Put(HandleRep{AddHandle(std::move(o))});
  }
  return r;
}

CUresult Session::OnEventDestroy(const HandleReq& q, Call& /*c*/) {
  Obj* e = Find(q.handle, Kind::kEvent);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const CUresult r = b_->EventDestroy(e->backend);
  if (r == CUDA_SUCCESS) {
    handles_.Erase(q.handle);
    ipc_event_exports_.erase(q.handle);
    moved_events_.erase(q.handle);
  }
  return r;
}

CUresult Session::OnEventSynchronize(const HandleReq& q, Call& /*c*/) {
  Obj* e = Find(q.handle, Kind::kEvent);
  return e == nullptr ? CUDA_ERROR_INVALID_HANDLE : b_->EventSynchronize(e->backend);
}

CUresult Session::OnEventQuery(const HandleReq& q, Call& /*c*/) {
  Obj* e = Find(q.handle, Kind::kEvent);
  return e == nullptr ? CUDA_ERROR_INVALID_HANDLE : b_->EventQuery(e->backend);
}

CUresult Session::OnEventRecord(const EventRecordReq& q, Call& /*c*/) {
  Obj* e = Find(q.event, Kind::kEvent);
  void* s = nullptr;
  if (e == nullptr || !Stream(q.stream, &s)) return CUDA_ERROR_INVALID_HANDLE;
  const CUresult r = b_->EventRecord(e->backend, s);
  if (r == CUDA_SUCCESS && !moved_events_.empty()) moved_events_.erase(q.event);  // recorded here now
  return r;
}

CUresult Session::OnEventElapsedTime(const EventElapsedReq& q, Call& c) {
  CUresult r = CUDA_SUCCESS;
  Obj* a = Find(q.start, Kind::kEvent);
  Obj* b = Find(q.end, Kind::kEvent);
  if (a == nullptr || b == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  F32Rep rep{0, 0};
  if (!moved_events_.empty() && (moved_events_.count(q.start) != 0 || moved_events_.count(q.end) != 0)) {
    r = MovedElapsedTime(q.start, q.end, &rep.ms);
  } else {
    r = b_->EventElapsedTime(a->backend, b->backend, &rep.ms);
  }
  c.Put(rep);
  return r;
}

}  // namespace orion::host::detail
