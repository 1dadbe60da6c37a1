// orion/host/session.h — one client session, served by one worker process.
//
// The worker pops frames from the channel's request ring, validates each against this session's
// own tables (handles, device allocations, window ranges, quota) and executes it on its Backend.
// Anything impossible (bad cursor, bad frame, unknown op, wrong payload size) is a protocol
// violation: the session ends and only this session.
//
//   SessionParams p{...};
//   int code = RunSession(p, std::move(backend), hello_header, hello);   // in the forked child
#pragma once

#include <spdlog/logger.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "orion/common/frame.h"
#include "orion/host/backend.h"
#include "orion/ivshmem/region.h"

namespace orion::host {

struct SessionParams {
  uint32_t session_id = 0;
  uint8_t* region = nullptr;         // mapped region
  uint64_t channel_bytes = 0;        // trusted (from our own FormatRegion)
  uint32_t channel = 0;
  uint32_t generation = 0;           // the channel's generation (oriond's own record)
  uint64_t request_position = 0;     // where the request stream continues after the Hello
  std::vector<Placement> placements;
  std::string cache_dir;             // content-addressed module cache ("" = memory only)
  uint64_t lease_timeout_ms = 3000;
  std::shared_ptr<spdlog::logger> log;
};

// Exit codes of a session worker.
enum SessionExit : int {
  kExitGoodbye = 0,        // client said Goodbye
  kExitLeaseExpired = 2,   // client stopped renewing its lease (killed, hung)
  kExitViolation = 3,      // protocol violation: hostile or broken client
  kExitBackendFailed = 4,  // the backend could not start
};

// Serves the session until it ends; returns a SessionExit code.
int RunSession(const SessionParams& params, std::unique_ptr<Backend> backend, const FrameHeader& hello_header,
               const HelloReq& hello);

// Writes a reply frame on a channel's reply ring (used by the daemon to refuse a Hello).
// The reply goes at the start of the reply stream (position 0): only for the first reply.
bool PushReply(uint8_t* region, uint64_t channel_bytes, uint32_t channel, uint32_t generation,
               const FrameHeader& request, int32_t status, const void* payload, uint32_t payload_len);

}  // namespace orion::host
