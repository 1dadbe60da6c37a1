// orion/host/ipc_ticket.h — CUDA IPC between sessions of one oriond (cuIpcGetMemHandle,
// cuIpcOpenMemHandle, cuIpcGetEventHandle, cuIpcOpenEventHandle).
//
// Each session runs in its own worker process, so what one session exports another must reach
// across processes. The exporter makes a *ticket*: a memfd named "orion-ipc" whose first page is a
// header (magic, kind, size, a 128-bit random secret, a 64-byte backend payload such as the real
// driver's IPC handle) and, for memory the sim backend serves, whose pages after the header hold
// the allocation itself. The 64-byte handle the application carries names the exporter's worker
// pid and the ticket's fd there, with the same secret. The importer opens /proc/<pid>/fd/<fd>
// (non-blocking, no controlling tty), and accepts it only if it is a regular memfd named
// "orion-ipc" whose header matches the handle (kind, size, secret compared in constant time):
// a handle is hostile input, and a forged one gets CUDA_ERROR_INVALID_VALUE, never another
// tenant's memory without its secret. The exporter keeps the ticket open while the allocation (or
// event) lives; an importer's mapping keeps the pages alive after that (CUDA leaves use after the
// exporter's free undefined).
//
// Who pays for memory that outlives its exporter's free (issue #22 item 2a). Pages an importer
// still maps are memory a tenant holds, so they stay on a quota:
// - the exporter's open of a ticket holds a write OFD lock on its byte 0 (IpcExporterHolds);
// - an importer keeps its open of the ticket, with a shared flock(2), as long as the import lives
//   (IpcTicketImported);
// - the exporter's free revokes the ticket (RevokeIpcTicket: no handle opens it again) and keeps
//   its charge, and the ticket, until no importer holds it;
// - an import whose exporter is gone (its worker ended, by exit or kill: the kernel drops the
//   lock) is charged to the importer from then on.
// Both kinds of lock go with the process, so a killed worker never leaves one behind.
#pragma once

#include <cstdint>

#include "orion/common/status.h"

namespace orion::host {

// The bytes of a CUipcMemHandle / CUipcEventHandle (CU_IPC_HANDLE_SIZE = 64).
struct IpcHandle {
  char magic[8];  // "ORIONIPC"
  uint32_t kind;  // kIpcMemory, kIpcEvent
  int32_t pid;    // the exporting worker
  int32_t fd;     // the ticket's fd in that worker
  uint32_t reserved;
  uint64_t bytes;  // memory: the allocation's size
  uint8_t secret[16];
  uint8_t pad[16];
};
static_assert(sizeof(IpcHandle) == 64, "a CUDA IPC handle is 64 bytes");

inline constexpr uint32_t kIpcMemory = 1;
inline constexpr uint32_t kIpcEvent = 2;
inline constexpr uint64_t kIpcDataOffset = 4096;  // where a sim allocation's bytes start in its ticket

// Creates a ticket of `kind` holding `payload` (64 bytes, may be null) and room for `data_bytes`
// after the header; fills `handle`. Returns the ticket's fd (the caller keeps it open).
Result<int> CreateIpcTicket(uint32_t kind, uint64_t bytes, uint64_t data_bytes, const uint8_t* payload,
                            IpcHandle* handle);
// Opens and checks the ticket a handle names; copies its payload (64 bytes) when `payload` is set.
// Returns an fd the caller closes; it holds the importer's shared flock until then.
Result<int> OpenIpcTicket(const IpcHandle& handle, uint32_t kind, uint8_t* payload);
// Zeroes a ticket's secret (the exporter's fd): no handle opens it from now on.
void RevokeIpcTicket(int fd);
// Whether any importer holds the ticket open (called on the exporter's fd).
bool IpcTicketImported(int fd);
// Whether the exporter still holds its ticket (called on an importer's fd). True when it cannot be
// told, so a charge never moves on a doubt.
bool IpcExporterHolds(int fd);

}  // namespace orion::host
