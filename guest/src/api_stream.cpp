// Exported driver API: streams and events. Handles are the server's ids, validated locally.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "export.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

namespace {

CUresult CreateStream(CUstream* ph, unsigned flags, int priority) {
  if (ph == nullptr || (flags & ~1u) != 0) return CUDA_ERROR_INVALID_VALUE;
  priority = std::clamp(priority, -5, 0);  // clamped to cuCtxGetStreamPriorityRange, as CUDA does
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  StreamCreateReq q{flags, priority};
  HandleRep rep{};
  CUresult r = Client::Get().Call(Op::kStreamCreate, &q, sizeof q, &rep, sizeof rep);
  if (r != CUDA_SUCCESS) return r;
  S().streams.Add(rep.handle, (uint64_t{flags} << 32) | static_cast<uint32_t>(priority));
  *ph = reinterpret_cast<CUstream>(rep.handle);
  return CUDA_SUCCESS;
}

CUresult StreamOp(Op op, CUstream hs) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t id = 0;
  if (!StreamId(hs, &id)) return CUDA_ERROR_INVALID_HANDLE;
  // Synchronizing with or querying a capturing stream is not permitted (the capture is lost).
  if (op == Op::kStreamQuery && HostFuncPending(id)) return CUDA_ERROR_NOT_READY;
  if (op == Op::kStreamSynchronize || op == Op::kStreamQuery) {
    if (CUresult r; CaptureForbidsSync(id, &r)) return r;
  }
  HandleReq q{id};
  return Client::Get().Call(op, &q, sizeof q);
}

CUresult WaitEvent(CUstream hs, CUevent ev, unsigned flags) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t id = 0;
  if (!StreamId(hs, &id)) return CUDA_ERROR_INVALID_HANDLE;
  const auto e = reinterpret_cast<uint64_t>(ev);
  if (!S().events.Has(e)) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r; CaptureStreamWait(id, e, flags, &r)) return r;
  StreamWaitEventReq q{id, e, flags, 0};
  return Client::Get().Send(Op::kStreamWaitEvent, &q, sizeof q);
}

CUresult Record(CUevent ev, CUstream hs, unsigned flags = 0) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t id = 0;
  if (!StreamId(hs, &id)) return CUDA_ERROR_INVALID_HANDLE;
  const auto e = reinterpret_cast<uint64_t>(ev);
  if (!S().events.Has(e)) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r; CaptureEventRecord(e, id, flags, &r)) return r;
  EventRecordReq q{e, id};
  // An interprocess event orders other processes, which see only what oriond has taken: its record
  // returns once oriond has it (the sim backend completes the stream's work at such a record), so
  // a process told "recorded" right after (cuda-samples simpleIPC) finds the work done or pending
  // behind the event, never not yet issued.
  uint64_t event_flags = 0;
  if (S().events.Get(e, &event_flags) && (event_flags & CU_EVENT_INTERPROCESS) != 0)
    return Client::Get().Call(Op::kEventRecord, &q, sizeof q);
  return Client::Get().Send(Op::kEventRecord, &q, sizeof q);
}

CUresult EventOp(Op op, CUevent ev) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  const auto e = reinterpret_cast<uint64_t>(ev);
  if (!S().events.Has(e)) return CUDA_ERROR_INVALID_HANDLE;
  HandleReq q{e};
  return Client::Get().Call(op, &q, sizeof q);
}

}  // namespace

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream* ph, unsigned int flags) {
  ORION_API(cuStreamCreate);
  return CreateStream(ph, flags, 0);
}

ORION_EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* ph, unsigned int flags, int priority) {
  ORION_API(cuStreamCreateWithPriority);
  return CreateStream(ph, flags, priority);
}

ORION_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hs) {
  ORION_API(cuStreamDestroy_v2);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  const auto id = reinterpret_cast<uint64_t>(hs);
  if (!S().streams.Has(id)) return CUDA_ERROR_INVALID_HANDLE;
  HandleReq q{id};
  CUresult r = Client::Get().Call(Op::kStreamDestroy, &q, sizeof q);
  S().streams.Remove(id);
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream hs) {
  ORION_API(cuStreamSynchronize);
  return StreamOp(Op::kStreamSynchronize, hs);
}
ORION_EXPORT CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hs) {
  ORION_API(cuStreamSynchronize_ptsz);
  return StreamOp(Op::kStreamSynchronize, hs);
}
ORION_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream hs) {
  ORION_API(cuStreamQuery);
  return StreamOp(Op::kStreamQuery, hs);
}
ORION_EXPORT CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hs) {
  ORION_API(cuStreamQuery_ptsz);
  return StreamOp(Op::kStreamQuery, hs);
}
ORION_EXPORT CUresult CUDAAPI cuStreamWaitEvent(CUstream hs, CUevent ev, unsigned int flags) {
  ORION_API(cuStreamWaitEvent);
  return WaitEvent(hs, ev, flags);
}
ORION_EXPORT CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hs, CUevent ev, unsigned int flags) {
  ORION_API(cuStreamWaitEvent_ptsz);
  return WaitEvent(hs, ev, flags);
}

ORION_EXPORT CUresult CUDAAPI cuStreamGetFlags(CUstream hs, unsigned int* flags) {
  ORION_API(cuStreamGetFlags);
  uint64_t id = 0;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!StreamId(hs, &id)) return CUDA_ERROR_INVALID_HANDLE;
  uint64_t v = 0;
  *flags = id != 0 && S().streams.Get(id, &v) ? static_cast<unsigned>(v >> 32) : 0;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuStreamGetPriority(CUstream hs, int* priority) {
  ORION_API(cuStreamGetPriority);
  uint64_t id = 0;
  if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!StreamId(hs, &id)) return CUDA_ERROR_INVALID_HANDLE;
  uint64_t v = 0;
  *priority = id != 0 && S().streams.Get(id, &v) ? static_cast<int>(static_cast<uint32_t>(v)) : 0;
  return CUDA_SUCCESS;
}

// cuStreamGetAttribute / cuStreamSetAttribute. The priority is the stream's own (cuStreamGetPriority:
// fixed at creation here, so setting it is refused); the access policy window and the
// synchronization policy go to oriond, which sets them on the GPU's stream (the sim keeps them).
// The memory synchronization domain attributes are not served.
static CUresult StreamAttr(CUstream hs, CUstreamAttrID attr, CUstreamAttrValue* value, bool set) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  uint64_t id = 0;
  if (!StreamId(hs, &id)) return CUDA_ERROR_INVALID_HANDLE;
  if (attr == CU_STREAM_ATTRIBUTE_PRIORITY) {
    if (set) return CUDA_ERROR_NOT_SUPPORTED;
    uint64_t v = 0;
    *value = CUstreamAttrValue{};
    value->priority = id != 0 && S().streams.Get(id, &v) ? static_cast<int>(static_cast<uint32_t>(v)) : 0;
    return CUDA_SUCCESS;
  }
  if (attr != CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW && attr != CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY) {
    static std::atomic<bool> told{false};
    if (!told.exchange(true))
      LogWarn("cuStreamGetAttribute/cuStreamSetAttribute of attribute " + std::to_string(static_cast<int>(attr)) +
              " is not supported by Orion; returning CUDA_ERROR_NOT_SUPPORTED");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  static_assert(sizeof(CUstreamAttrValue) == sizeof(StreamAttrReq::value));
  StreamAttrReq q{id, static_cast<uint32_t>(attr), set ? 1u : 0u, {}};
  if (set) std::memcpy(q.value, value, sizeof q.value);
  StreamAttrRep rep{};
  uint32_t rep_len = 0;
  CUresult r = Client::Get().Call(Op::kStreamAttribute, &q, sizeof q, &rep, sizeof rep, &rep_len);
  if (r != CUDA_SUCCESS) return r;
  if (rep_len != sizeof rep) return CUDA_ERROR_UNKNOWN;
  if (!set) std::memcpy(value, rep.value, sizeof rep.value);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuStreamGetAttribute(CUstream hs, CUstreamAttrID attr, CUstreamAttrValue* value) {
  ORION_API(cuStreamGetAttribute);
  return StreamAttr(hs, attr, value, false);
}
ORION_EXPORT CUresult CUDAAPI cuStreamGetAttribute_ptsz(CUstream hs, CUstreamAttrID attr, CUstreamAttrValue* value) {
  ORION_API(cuStreamGetAttribute_ptsz);
  return StreamAttr(hs, attr, value, false);
}
ORION_EXPORT CUresult CUDAAPI cuStreamSetAttribute(CUstream hs, CUstreamAttrID attr, const CUstreamAttrValue* value) {
  ORION_API(cuStreamSetAttribute);
  return StreamAttr(hs, attr, const_cast<CUstreamAttrValue*>(value), true);
}
ORION_EXPORT CUresult CUDAAPI cuStreamSetAttribute_ptsz(CUstream hs, CUstreamAttrID attr,
                                                        const CUstreamAttrValue* value) {
  ORION_API(cuStreamSetAttribute_ptsz);
  return StreamAttr(hs, attr, const_cast<CUstreamAttrValue*>(value), true);
}

// A stream's context and green context. Green contexts (SM partitions of a context) are not
// offered, so no stream belongs to one: the driver's answer for such a stream is a NULL green
// context (cuDNN's RNNs ask). Either output may be left out by the entry point.
static CUresult StreamCtx(CUstream hs, CUcontext* pctx, CUgreenCtx* pgreen) {
  uint64_t id = 0;
  if (!StreamId(hs, &id)) return CUDA_ERROR_INVALID_HANDLE;
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(CurrentCtx());
  if (pgreen != nullptr) *pgreen = nullptr;
  return CUDA_SUCCESS;
}
ORION_EXPORT CUresult CUDAAPI cuStreamGetCtx(CUstream hs, CUcontext* pctx) {
  ORION_API(cuStreamGetCtx);
  return pctx == nullptr ? CUDA_ERROR_INVALID_VALUE : StreamCtx(hs, pctx, nullptr);
}
ORION_EXPORT CUresult CUDAAPI cuStreamGetGreenCtx(CUstream hs, CUgreenCtx* phCtx) {
  ORION_API(cuStreamGetGreenCtx);
  return phCtx == nullptr ? CUDA_ERROR_INVALID_VALUE : StreamCtx(hs, nullptr, phCtx);
}
static CUresult StreamGetCtx2(CUstream hs, CUcontext* pctx, CUgreenCtx* pgreen) {
  return pctx == nullptr || pgreen == nullptr ? CUDA_ERROR_INVALID_VALUE : StreamCtx(hs, pctx, pgreen);
}
ORION_EXPORT CUresult CUDAAPI cuStreamGetCtx_v2(CUstream hs, CUcontext* pctx, CUgreenCtx* pgreen) {
  ORION_API(cuStreamGetCtx_v2);
  return StreamGetCtx2(hs, pctx, pgreen);
}
ORION_EXPORT CUresult CUDAAPI cuStreamGetCtx_v2_ptsz(CUstream hs, CUcontext* pctx, CUgreenCtx* pgreen) {
  ORION_API(cuStreamGetCtx_v2_ptsz);
  return StreamGetCtx2(hs, pctx, pgreen);
}

ORION_EXPORT CUresult CUDAAPI cuStreamGetId(CUstream hs, unsigned long long* streamId) {
  ORION_API(cuStreamGetId);
  uint64_t id = 0;
  if (streamId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!StreamId(hs, &id)) return CUDA_ERROR_INVALID_HANDLE;
  *streamId = id;
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuEventCreate(CUevent* ph, unsigned int flags) {
  ORION_API(cuEventCreate);
  if (ph == nullptr || (flags & ~0xFu) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  EventCreateReq q{flags, 0};
  HandleRep rep{};
  CUresult r = Client::Get().Call(Op::kEventCreate, &q, sizeof q, &rep, sizeof rep);
  if (r != CUDA_SUCCESS) return r;
  S().events.Add(rep.handle, flags);  // the flags: an interprocess event's record is synchronous
  *ph = reinterpret_cast<CUevent>(rep.handle);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuEventDestroy_v2(CUevent ev) {
  ORION_API(cuEventDestroy_v2);
  CUresult r = EventOp(Op::kEventDestroy, ev);
  if (r == CUDA_SUCCESS) S().events.Remove(reinterpret_cast<uint64_t>(ev));
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuEventRecord(CUevent ev, CUstream hs) {
  ORION_API(cuEventRecord);
  return Record(ev, hs);
}
ORION_EXPORT CUresult CUDAAPI cuEventRecord_ptsz(CUevent ev, CUstream hs) {
  ORION_API(cuEventRecord_ptsz);
  return Record(ev, hs);
}
ORION_EXPORT CUresult CUDAAPI cuEventRecordWithFlags(CUevent ev, CUstream hs, unsigned int flags) {
  ORION_API(cuEventRecordWithFlags);
  // CU_EVENT_RECORD_EXTERNAL matters in capture only: an event record node instead of a dependency.
  if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  return Record(ev, hs, flags);
}
ORION_EXPORT CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent ev, CUstream hs, unsigned int flags) {
  ORION_API(cuEventRecordWithFlags_ptsz);
  if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  return Record(ev, hs, flags);
}

ORION_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent ev) {
  ORION_API(cuEventSynchronize);
  return EventOp(Op::kEventSynchronize, ev);
}

ORION_EXPORT CUresult CUDAAPI cuEventQuery(CUevent ev) {
  ORION_API(cuEventQuery);
  return EventOp(Op::kEventQuery, ev);
}

static CUresult Elapsed(float* ms, CUevent a, CUevent b) {
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  const auto ea = reinterpret_cast<uint64_t>(a), eb = reinterpret_cast<uint64_t>(b);
  if (!S().events.Has(ea) || !S().events.Has(eb)) return CUDA_ERROR_INVALID_HANDLE;
  EventElapsedReq q{ea, eb};
  F32Rep rep{};
  CUresult r = Client::Get().Call(Op::kEventElapsedTime, &q, sizeof q, &rep, sizeof rep);
  if (r == CUDA_SUCCESS) *ms = rep.ms;
  return r;
}

ORION_EXPORT CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  ORION_API(cuEventElapsedTime);
  return Elapsed(ms, a, b);
}
ORION_EXPORT CUresult CUDAAPI cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
  ORION_API(cuEventElapsedTime_v2);
  return Elapsed(ms, a, b);
}

}  // extern "C"
