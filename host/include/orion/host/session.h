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
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "orion/common/frame.h"
#include "orion/host/backend.h"
#include "orion/host/compute_share.h"
#include "orion/ivshmem/region.h"
#include "orion/ivshmem/ring.h"
#include "orion/tls/stream.h"

namespace orion::host {

// What a session worker reads requests from and answers on: a shared-memory channel (rings in the
// region) or a network connection (TCP; the data window is then a private copy on each end, kept
// in step by the window ranges each frame reads and writes: docs/spec/frames.md).
class SessionChannel {
 public:
  virtual ~SessionChannel() = default;
  virtual uint8_t* window() = 0;
  virtual const ivshmem::ChannelLayout& layout() const = 0;
  // The next request, validated; on a network channel the window bytes it reads have arrived.
  // kDataLoss: protocol violation; kUnavailable: the client went away.
  virtual Status Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) = 0;
  // After executing `req`: the window bytes it wrote reach the client, its staging bytes are free.
  virtual Status Done(const FrameHeader& req, const uint8_t* payload) = 0;
  virtual Status Reply(const FrameHeader& h, const void* payload, uint32_t len) = 0;
  // Called while idle: kUnavailable when the client is gone (stale lease, closed connection).
  virtual Status Idle(uint64_t now_ms) = 0;
  // The session's watchdog thread asks this while the worker is busy (a kernel that runs on, a
  // long wait): why the client is certainly gone (its lease stale for the lease timeout, its
  // connection closed), or "" while it may live. Thread-safe and read-only; `seen` and `seen_ms`
  // are the caller's memory between calls (the lease value last seen, and since when).
  virtual std::string ClientGone(uint64_t now_ms, uint64_t* seen, uint64_t* seen_ms) const {
    (void)now_ms, (void)seen, (void)seen_ms;
    return "";
  }
  // Once spinning is over: waits up to `timeout_ms` for the next request when the channel can block
  // on it (a socket; a shared-memory client that rings: futex or the VM's ivshmem doorbell) and
  // returns true; false when the caller should nap instead (a client that cannot ring).
  virtual bool WaitIdle(int timeout_ms) {
    (void)timeout_ms;
    return false;
  }
  // How many times the worker polls for the next request before it yields and then waits. Shared
  // memory and RDMA spin (a request is a store into the ring, no wake-up). TCP does not: each
  // request arrives as a socket wake-up anyway, and a worker spinning on recv after its reply holds
  // the CPU its client was just woken on (a first call after idle waited ~0.6 ms for it).
  virtual uint32_t SpinPolls() const { return 2000; }
  // Called after an asynchronous request (no reply awaited) that arrived while the worker was
  // caught up with its client: a ring channel may wait briefly for the client to write further
  // ahead before it polls the next record (shm_channel.cpp says why).
  virtual void Slip() {}
  // Called by the session's watchdog thread while requests execute and the client has heard nothing
  // for 250 ms: a network channel tells its client that oriond is alive though the reply is long
  // in coming (TCP: a Keepalive frame, never inside another message). Shared memory has the
  // region's heartbeat. Thread-safe against the session thread's sends.
  virtual void Keepalive() {}
  // Messages sent to the client so far (a count the watchdog compares; 0 where there is no need).
  virtual uint64_t MessagesSent() const { return 0; }
  // How the session waited, for its last log line ("" when there is nothing to say).
  virtual std::string WaitStats() const { return ""; }
  // Live migration's target (issue #24): the restored session's client arrives on connection `fd`
  // (owned from now on; plain TCP) and the channel serves it from now on. False where the channel
  // cannot change its connection (shared memory, RDMA).
  virtual bool Adopt(int fd) {
    (void)fd;
    return false;
  }
  // Before the Welcome, for a client that can use it: polls the channel's sync slot from now on
  // (ivshmem/ring.h; shared memory only). True: served (the Welcome says kWelcomeSyncSlot).
  virtual bool ServeSyncSlot() { return false; }
  // What went through the sync slot, for the session's log ("" when it was not served).
  virtual std::string SlotStats() const { return ""; }
  virtual void Serving() = 0;                // the session is served (shm: state ACTIVE)
  virtual void Closing(int32_t reason) = 0;  // the session ends on a violation
};

// `doorbell_fd`: the eventfd the VM's ivshmem-doorbell signals for this channel (the worker owns
// it), or -1 (a host region, or a VM without the doorbell).
std::unique_ptr<SessionChannel> MakeShmSessionChannel(uint8_t* region, uint64_t channel_bytes, uint32_t channel,
                                                      uint32_t generation, uint64_t request_position,
                                                      uint64_t lease_timeout_ms, int doorbell_fd = -1);
// SessionChannel::ClientGone of a socket-backed channel (TCP, RDMA's TCP side): the reason when the
// peer closed `fd`, "" otherwise. Reads nothing; thread-safe.
std::string SocketPeerClosed(int fd);

// A TCP connection (the worker owns `fd`) whose channel has `channel_bytes` (its window is local).
// A client that stops in the middle of a frame for `stall_ms` is dropped.
// `stream` carries the connection's bytes (plain or TLS; null: plain over `fd`); `fd` is owned.
std::unique_ptr<SessionChannel> MakeTcpSessionChannel(int fd, std::shared_ptr<tls::Stream> stream,
                                                      uint64_t channel_bytes, uint64_t stall_ms);

// An RDMA session: the TCP connection `fd` (the worker owns it) carries the Welcome and the
// RdmaConnect exchange, then only liveness; frames and window bytes travel over an RC queue pair
// made in this (worker) process. Setup errors surface from the first Pop.
std::unique_ptr<SessionChannel> MakeRdmaSessionChannel(int fd, uint64_t channel_bytes, uint64_t stall_ms,
                                                       uint32_t session, std::shared_ptr<spdlog::logger> log);

struct SessionParams {
  uint32_t session_id = 0;
  int socket_fd = -1;                   // a network session: its connection (else a region channel)
  uint16_t transport = kTransportShm;   // with socket_fd: kTransportTcp or kTransportRdma
  std::shared_ptr<tls::Stream> stream;  // kTransportTcp: the connection's bytes (TLS after its handshake)
  uint8_t* region = nullptr;            // mapped region
  uint64_t channel_bytes = 0;           // trusted (from our own FormatRegion)
  uint32_t channel = 0;
  uint32_t generation = 0;        // the channel's generation (oriond's own record)
  uint64_t request_position = 0;  // where the request stream continues after the Hello
  int doorbell_fd = -1;           // a VM region with the doorbell: this channel's eventfd
  bool vm = false;                // a VM's region: its channel stays with the VM (cannot move)
  std::vector<Placement> placements;
  std::string cache_dir;                         // content-addressed module cache ("" = memory only)
  uint64_t cache_max_bytes = uint64_t{2} << 30;  // the cache's size bound: oldest entries go first
  uint64_t lease_timeout_ms = 3000;
  uint64_t net_stall_ms = 30000;  // network sessions: drop a client silent mid-frame this long
  std::shared_ptr<spdlog::logger> log;
  std::string allocation_id;                  // the controller's allocation ("" standalone)
  std::atomic<uint64_t>* used_out = nullptr;  // kMaxDevices counters in memory shared with oriond
  // A session on a hold (a job's allocation, a process tree's share): the hold's meter, kMaxDevices
  // counters in memory shared with oriond and the hold's other workers, and each vGPU's quota for
  // all of them together; null/empty when the session's quota is its own.
  std::atomic<uint64_t>* hold_used = nullptr;
  std::vector<uint64_t> hold_quota;
  std::string share;  // the share token the Welcome hands the client ("" when none)
  // Compute share, per device (placement) index: its physical GPU's scheduler (memory shared with
  // oriond and the GPU's other workers) and this tenant's slot there; empty when not scheduled.
  std::vector<ComputeGpu*> compute_gpu;
  std::vector<int> compute_slot;
  // Live migration (issue #24, session_move.cpp). `control_fd`: this worker's end of a socketpair
  // with oriond, on which a move is asked for (with SIGUSR2; the asker's connection comes along,
  // SCM_RIGHTS); -1 when none. A worker that restores a moved session (a kHelloMigrateIn) has
  // `migrate_fd`, the connection from the source oriond (owned), `route_fd`, on which oriond hands
  // it the client's connection once a kHelloResume with `resume_token` arrives (owned), and
  // `resume_address`, the host:port the source tells the client to go to.
  int control_fd = -1;
  int migrate_fd = -1;
  int route_fd = -1;
  std::string resume_token;
};

// Exit codes of a session worker.
enum SessionExit : int {
  kExitGoodbye = 0,        // client said Goodbye
  kExitLeaseExpired = 2,   // client stopped renewing its lease (killed, hung)
  kExitViolation = 3,      // protocol violation: hostile or broken client
  kExitBackendFailed = 4,  // the backend could not start
  kExitClientGone = 5,     // the client closed its connection without Goodbye
  kExitMoved = 6,          // the session moved to another oriond, which now serves it (issue #24)
};

// Serves the session until it ends; returns a SessionExit code.
int RunSession(const SessionParams& params, std::unique_ptr<Backend> backend, const FrameHeader& hello_header,
               const HelloReq& hello);

// Writes a reply frame on a channel's reply ring (used by the daemon to refuse a Hello).
// The reply goes at the start of the reply stream (position 0): only for the first reply.
bool PushReply(uint8_t* region, uint64_t channel_bytes, uint32_t channel, uint32_t generation,
               const FrameHeader& request, int32_t status, const void* payload, uint32_t payload_len);

}  // namespace orion::host
