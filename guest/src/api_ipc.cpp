// Exported driver API: CUDA IPC between processes served by one oriond (cuIpcGetMemHandle,
// cuIpcOpenMemHandle, cuIpcCloseMemHandle, cuIpcGetEventHandle, cuIpcOpenEventHandle). The 64
// handle bytes are oriond's (a ticket naming the exporting session and a secret:
// host/include/orion/host/ipc_ticket.h); processes pass them to each other as they would NVIDIA's.
// Sessions of different oriond hosts cannot share memory: opening such a handle fails with
// CUDA_ERROR_INVALID_VALUE.
#include <cstring>

#include "export.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  ORION_API(cuIpcGetMemHandle);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  DeviceRange range{};
  if (!S().mirror.Find(dptr, 1, &range) || range.kind != RangeKind::kDevice) return CUDA_ERROR_INVALID_VALUE;
  MemFreeReq q{range.base};  // the allocation's start, as the driver exports whole allocations
  IpcHandleRep rep{};
  if (CUresult r = Client::Get().Call(Op::kIpcGetMemHandle, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS)
    return r;
  static_assert(sizeof rep.handle == sizeof pHandle->reserved);
  std::memcpy(pHandle->reserved, rep.handle, sizeof rep.handle);
  return CUDA_SUCCESS;
}

static CUresult OpenMem(CUdeviceptr* pdptr, const CUipcMemHandle& handle, unsigned flags) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (pdptr == nullptr || (flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  IpcOpenReq q{};
  std::memcpy(q.handle, handle.reserved, sizeof q.handle);
  q.flags = flags;
  IpcOpenRep rep{};
  if (CUresult r = Client::Get().Call(Op::kIpcOpenMemHandle, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS)
    return r;
  S().mirror.Add({rep.dptr, rep.bytes, RangeKind::kIpc, CurrentCtx(), nullptr});
  *pdptr = rep.dptr;
  return CUDA_SUCCESS;
}
ORION_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  ORION_API(cuIpcOpenMemHandle);
  return OpenMem(pdptr, handle, Flags);
}
ORION_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  ORION_API(cuIpcOpenMemHandle_v2);
  return OpenMem(pdptr, handle, Flags);
}

ORION_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  ORION_API(cuIpcCloseMemHandle);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  DeviceRange range{};
  if (!S().mirror.Find(dptr, 1, &range) || range.kind != RangeKind::kIpc || range.base != dptr)
    return CUDA_ERROR_INVALID_VALUE;
  MemFreeReq q{dptr};
  if (CUresult r = Client::Get().Call(Op::kIpcCloseMemHandle, &q, sizeof q); r != CUDA_SUCCESS) return r;
  (void)S().mirror.Remove(dptr, nullptr);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle* pHandle, CUevent event) {
  ORION_API(cuIpcGetEventHandle);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  const auto e = reinterpret_cast<uint64_t>(event);
  if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!S().events.Has(e)) return CUDA_ERROR_INVALID_HANDLE;
  HandleReq q{e};
  IpcHandleRep rep{};
  if (CUresult r = Client::Get().Call(Op::kIpcGetEventHandle, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS)
    return r;
  std::memcpy(pHandle->reserved, rep.handle, sizeof rep.handle);
  return CUDA_SUCCESS;
}

ORION_EXPORT CUresult CUDAAPI cuIpcOpenEventHandle(CUevent* phEvent, CUipcEventHandle handle) {
  ORION_API(cuIpcOpenEventHandle);
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
  IpcOpenReq q{};
  std::memcpy(q.handle, handle.reserved, sizeof q.handle);
  HandleRep rep{};
  if (CUresult r = Client::Get().Call(Op::kIpcOpenEventHandle, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS)
    return r;
  S().events.Add(rep.handle);
  *phEvent = reinterpret_cast<CUevent>(rep.handle);
  return CUDA_SUCCESS;
}

}  // extern "C"
