// orion/host/controller_link.h — oriond's side of orion-controller (controller/openapi.yaml):
// registers this server's GPUs, heartbeats every `heartbeat_ms` with the allocations it serves
// (renewing their leases and reporting the memory each session uses), confirms a client's
// allocation before serving it, asks for allocations on behalf of clients that come without one
// (shared memory, or TCP without a controller of their own), holds VM assignments for the libvirt
// hook, releases what ends, and deregisters at shutdown.
//
// The daemon's loop calls Confirm/AllocateHere/Assign synchronously (bounded by `timeout_ms`);
// releases, heartbeats and re-registration run on the link's own thread.
#pragma once

#include <spdlog/logger.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "orion/common/status.h"
#include "orion/controller/client.h"
#include "orion/host/backend.h"

namespace orion::host {

struct ControllerGrant {
  std::string allocation_id;
  std::vector<Placement> placements;  // all on this server, each with `ratio`
  uint32_t ratio = 0;                 // the compute ratio the controller admitted (0: best effort)
  // A job's allocation (the Slurm plugin's, "job" in the controller's reply): every session of the
  // job uses it; a session's end does not release it (its holder does).
  bool job = false;
};

struct ControllerLinkOptions {
  std::string controller_addr;  // ip:port
  std::string key;              // the controller's server key ("" = open controller)
  std::string server_id;        // this oriond's data-plane address, "bind_addr:listen_port"
  std::string hostname;
  uint32_t vgpu_count = 1;
  std::vector<PhysicalGpu> gpus;
  uint64_t heartbeat_ms = 2000;
  int timeout_ms = 3000;
};

class ControllerLink {
 public:
  ControllerLink(ControllerLinkOptions opts, std::shared_ptr<spdlog::logger> log);
  ~ControllerLink();
  // Registers once (so the first clients can be served) and starts the heartbeat thread, which
  // keeps trying when the controller is not reachable yet.
  void Start();
  // Deregisters (best effort) and stops the thread.
  void Stop();

  // A client that brought an allocation id: the controller must hold it for this server.
  Result<ControllerGrant> Confirm(const std::string& allocation_id, uint32_t session);
  // A client without one: ask for `vgpus` x `gmem_mib` here, each with `ratio` % of its GPU's
  // compute guaranteed (0: best effort).
  Result<ControllerGrant> AllocateHere(uint32_t vgpus, uint64_t gmem_mib, uint32_t ratio, const std::string& host,
                                       uint32_t pid, const std::string& process, uint32_t session);
  Result<ControllerGrant> Assign(const std::string& vm, uint32_t vgpus, uint64_t gmem_mib, uint32_t ratio = 0);
  void Unassign(const std::string& vm);  // queued

  // The session serving `allocation_id` is live; `used` points at kMaxDevices counters the
  // worker updates (bytes in use per device), or null.
  void Track(const std::string& allocation_id, const std::atomic<uint64_t>* used, uint32_t devices);
  // A job's last session here ended: stop reporting it, and leave it to its holder (no release).
  void Untrack(const std::string& allocation_id);
  // The session ended: stop reporting it and release the allocation (queued).
  void Release(const std::string& allocation_id, const std::string& why);
  // Allocations the controller no longer holds (revoked by an administrator, or released while
  // this server was unreachable): the daemon ends their sessions.
  std::vector<std::string> TakeRevoked();
  // Moves the controller asks for (POST /v1/allocations/{id}/migrate, issue #24): (allocation id,
  // target server "ip:port") for allocations this server serves. A move is announced again every
  // few seconds until it ends: the daemon ignores one it is making.
  std::vector<std::pair<std::string, std::string>> TakeMoves();
  // How a move ended, for the controller (queued): `committed` (this server is the target and the
  // program resumed here, in `session`), else failed with `error`.
  void ReportMove(const std::string& allocation_id, bool committed, uint32_t session, const std::string& error);
  bool registered() const { return registered_.load(); }

 private:
  Result<ControllerGrant> Grant(const Result<nlohmann::json>& r, const std::string& what);
  void Watch(const std::string& allocation_id, bool on);
  static constexpr uint64_t kWatchSpanMs = 10000;  // one watch request's longest wait
  bool Register();
  void Loop();

  ControllerLinkOptions opts_;
  std::shared_ptr<spdlog::logger> log_;
  controller::ControllerClient client_;
  std::string boot_id_;
  std::atomic<bool> registered_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  struct Tracked {
    const std::atomic<uint64_t>* used = nullptr;
    uint32_t devices = 0;
  };
  std::map<std::string, Tracked> active_;
  // Requests the link's thread makes in order: releases (DELETE) and move reports (POST).
  struct Queued {
    std::string method, path;
    nlohmann::json body;
  };
  std::deque<Queued> queued_;
  std::unordered_map<std::string, uint32_t> tries_;  // path -> failed attempts so far
  std::vector<std::string> revoked_;
  std::vector<std::pair<std::string, std::string>> moves_;  // from heartbeats
  std::thread thread_;

  // The watch (POST /v1/servers/{id}/watch, a long poll): the controller answers as soon as an
  // allocation this server serves is gone, so its session ends at once, not at the next heartbeat.
  // Its thread owns nothing of the link's: it shares this state, and is detached at Stop (its
  // request may take a watch's whole span to return).
  struct WatchState {
    explicit WatchState(const controller::ControllerClient& c) : client(c) {}
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;
    std::set<std::string> ids;                               // served now
    std::vector<std::string> revoked;                        // the controller said they are gone
    std::vector<std::pair<std::string, std::string>> moves;  // the controller asks them moved
    controller::ControllerClient client;
  };
  std::shared_ptr<WatchState> watch_;
  static void WatchLoop(std::shared_ptr<WatchState> w, std::string server_id, std::shared_ptr<spdlog::logger> log);
};

// "ip:port" of the controller for oriond: $ORION_CONTROLLER beats server.conf's controller_addr.
std::string ControllerAddrForServer(const std::string& configured);

}  // namespace orion::host
