// orion/controller/requests.h — the bodies of the REST requests that change the pool, as types.
//
// The REST layer (rest.cpp) decodes each body once with its FromJson and hands the Service a
// value it can trust: every number is in range, every string bounded and free of control
// characters, every id a UUID. The shapes are those of controller/openapi.yaml. A FromJson answers
// kInvalidArgument with a message naming the field ("ORION_VGPU: ...", "gpus must be ..."), which
// the REST layer sends as a 400. The Service never reads JSON it was sent.
//
//   auto req = AllocationRequest::FromJson(body);   // {"vgpus": 2, "gmem_mib": 4096, ...}
//   if (!req.ok()) return req.status();             // 400
//   svc->Allocate(*req, caller);
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "orion/common/status.h"

namespace orion::controller {

using Json = nlohmann::json;

constexpr uint32_t kMaxVgpusPerRequest = 16;         // a process sees at most 16 devices (kMaxDevices)
constexpr uint64_t kMaxGmemMib = uint64_t{1} << 24;  // 16 TiB: anything larger is garbage
constexpr uint32_t kMaxGpusPerServer = 64;
constexpr uint32_t kMaxVgpusPerGpu = 100;  // a server's vgpu_count
constexpr size_t kMaxJobName = 128;
constexpr size_t kMaxWatchedAllocations = 4096;  // ids per watch (36 bytes each: well inside a body)
constexpr uint64_t kMaxWatchMs = 30000;          // the longest watch (oriond's HTTP timeout is longer)

// One GPU of a server, as oriond reports it.
struct GpuSpec {
  uint32_t index = 0;       // the driver's ordinal, 0..1023, each once
  std::string uuid, name;   // "GPU-..." (at most 80), "NVIDIA H100 ..." (at most 128)
  uint64_t memory_mib = 0;  // > 0
};

// PUT /v1/servers/{id}: oriond (re)registers.
struct ServerRegistration {
  uint32_t vgpu_count = 1;  // vGPUs per GPU, 1..kMaxVgpusPerGpu
  std::string hostname;     // at most 255
  std::string boot_id;      // at most 64: a new one means oriond restarted
  std::vector<GpuSpec> gpus;
  // The allocations whose sessions it still serves (a restart lists none). Entries that are not
  // strings are ignored.
  std::set<std::string> allocations;
  static Result<ServerRegistration> FromJson(const Json& body);
};

// POST /v1/servers/{id}/heartbeat.
struct ServerHeartbeat {
  struct Held {
    std::string id;
    // Memory in use per vGPU of the allocation, MiB, in slot order; nullopt where the entry was
    // not a whole number >= 0 (that slot keeps its last figure).
    std::vector<std::optional<uint64_t>> used_mib;
  };
  std::string boot_id;  // empty: not checked
  // The allocations it serves. A malformed entry (not an object, no string "id") is skipped: one
  // bad entry must not cost the server its other leases.
  std::vector<Held> allocations;
  static Result<ServerHeartbeat> FromJson(const Json& body);
};

// Where and how much: the part of POST /v1/allocations that PUT /v1/assignments/{vm} shares.
struct PlacementRequest {
  uint32_t vgpus = 0;     // 1..kMaxVgpusPerRequest (ORION_VGPU)
  uint64_t gmem_mib = 0;  // per vGPU; 0: the server's default size (ORION_GMEM)
  uint32_t ratio = 0;     // % of a GPU's compute per vGPU, 0..100; 0: best effort (ORION_RATIO)
  std::string server;     // "ip:port" (at most 300); empty: anywhere
};

// POST /v1/allocations: a process's vGPUs (a client's request, or oriond's for its own client).
struct AllocationRequest : PlacementRequest {
  std::string client_host, client_process;  // at most 255 and 64
  uint32_t client_pid = 0;
  std::string job;         // a job's allocation (Slurm: "slurm/1234.0@node1"): 1..kMaxJobName of [A-Za-z0-9._:@/+-]
  std::string request_id;  // the client's idempotency key (a UUID); empty: none
  uint32_t session = 0;    // oriond's request: the session it serves the allocation to
  static Result<AllocationRequest> FromJson(const Json& body);
};

// PUT /v1/assignments/{vm}: a VM's standing vGPUs.
struct AssignmentRequest : PlacementRequest {
  static Result<AssignmentRequest> FromJson(const Json& body);
};

// POST /v1/allocations/{id}/confirm: oriond serves the allocation to a session.
struct SessionConfirmation {
  std::string server;  // "ip:port" (at most 300)
  uint32_t session = 0;
  static Result<SessionConfirmation> FromJson(const Json& body);
};

// POST /v1/servers/{id}/watch: answer when one of these allocations is gone.
struct WatchRequest {
  std::vector<std::string> allocations;  // UUIDs, at most kMaxWatchedAllocations
  uint64_t timeout_ms = 20000;           // 0..kMaxWatchMs
  static Result<WatchRequest> FromJson(const Json& body);
};

// POST /v1/allocations/{id}/migrate (admin): move the allocation's session to another server while
// its program runs (live migration, issue #24; docs/migration.md).
constexpr uint64_t kMaxMigrateWaitMs = 120000;  // the longest a request waits for its move's end
struct MigrateRequest {
  std::string to;        // the target server's id, "ip:port" (at most 300): its data-plane address
  uint64_t wait_ms = 0;  // 0..kMaxMigrateWaitMs: answer once the move committed or failed, or after this
  static Result<MigrateRequest> FromJson(const Json& body);
};

// POST /v1/allocations/{id}/move (server): how a move ended, as an oriond saw it. The target says
// "committed" once the program resumed there; the source (or the target, for its copy) says
// "failed" with the reason.
struct MoveReport {
  std::string server;      // the reporting server, "ip:port" (at most 300)
  bool committed = false;  // "state": "committed" | "failed"
  uint32_t session = 0;    // committed: the session serving it at the target
  std::string error;       // failed: why (at most 500)
  static Result<MoveReport> FromJson(const Json& body);
};

// A VM (libvirt domain) name as an assignment's key: 1..64 of [A-Za-z0-9._-].
bool ValidVmName(const std::string& vm);

}  // namespace orion::controller
