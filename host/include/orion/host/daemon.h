// orion/host/daemon.h — oriond: serves shared-memory regions, admits clients into vGPUs, forks one
// worker process per session and reaps it, and keeps each region's heartbeat.
//
//   Daemon d(config);
//   if (Status s = d.Start(); !s.ok()) { ... }
//   return d.Run();            // until Stop() (SIGTERM/SIGINT in main)
#pragma once

#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include <atomic>
#include <map>
#include <sys/types.h>
#include <memory>
#include <string>
#include <vector>

#include "orion/host/backend.h"
#include "orion/host/compute_share.h"
#include "orion/host/config.h"
#include "orion/host/controller_link.h"
#include "orion/host/doorbell_keeper.h"
#include "orion/host/metrics_server.h"
#include "orion/pool/pool.h"
#include "orion/host/session.h"
#include "orion/ivshmem/doorbell.h"
#include "orion/ivshmem/region.h"
#include "orion/tls/stream.h"

namespace orion::host {

class Daemon {
 public:
  explicit Daemon(ServerConfig config);
  ~Daemon();
  // Opens logs, picks the backend, finds the GPUs, formats and maps the regions.
  // Refuses (kAlreadyExists / kUnavailable, also logged) when another oriond owns one of its
  // regions (flock), its control socket (it answers) or its TCP port (address in use).
  Status Start();
  // Serves until Stop(); returns the process exit code.
  int Run();
  void Stop() { stop_.store(true); }
  BackendKind backend() const { return backend_; }

 private:
  // Who a session serves, from its Hello (informational: the client says so) and its transport.
  struct ClientInfo {
    uint32_t pid = 0;
    std::string process, host;
    std::string transport;  // "shm", "vm <name>", "tcp", "rdma"
  };
  struct Channel {
    enum State { kIdle, kServing, kWaitFree } state = kIdle;
    pid_t pid = 0;
    uint32_t session = 0;
    std::vector<Placement> placements;
    uint64_t lease = 0;
    uint64_t lease_changed_ms = 0;
    uint64_t claimed_ms = 0;
    uint32_t generation = 1;          // our record; FormatRegion starts every channel at 1
    std::string allocation_id;        // the controller's (controller mode)
    std::string hold;                 // its hold (holds_), "" when none
    std::map<uint32_t, int> compute;  // its own compute-share slots per physical GPU (not a hold's)
    int stat_slot = -1;
    ClientInfo client;
  };
  struct Region {
    std::unique_ptr<ivshmem::MappedRegion> map;
    uint64_t channel_bytes = 0;
    uint32_t channel_count = 0;
    std::vector<Channel> channels;
    // A VM's region (attached by the libvirt hook): its sessions are admitted only into the VM's
    // own reserved vGPUs, never the shared pool.
    std::string vm;
    std::vector<Placement> reserved;
    int meter = -1;            // a VM's: its sessions' memory per vGPU (meters_), while any session runs
    uint32_t vgpus_asked = 0;  // the attach request, kept in the state file
    uint64_t gmem_asked_mib = 0;
    uint32_t processes = 0;  // channels asked for (0: shm_buffer_size decides)
    // A VM's compute share: its ratio (0: best effort) and policy, and its scheduler slot per
    // physical GPU, taken at attach and held until detach; all its processes are this one tenant.
    uint32_t ratio = 0;
    uint32_t ratio_policy = 0;
    std::map<uint32_t, int> compute;
    // The VM's ivshmem-doorbell (attached with a doorbell socket): oriond is its ivshmem server,
    // and the worker of channel i sleeps on vector i's eventfd. QEMU cannot reconnect to an
    // ivshmem server, so its eventfds are left with the doorbell keeper (keeper_) and a restarted
    // oriond adopts them; without the keeper's copy the VM's sessions nap until it restarts.
    std::unique_ptr<ivshmem::DoorbellServer> bell;
    uint64_t epoch = 0;       // the server_epoch FormatRegion wrote (a copy: the header is hostile)
    bool severed = false;     // a tenant broke the region: no longer served (RegionIntact)
    bool has_limits = false;  // formatted with VM limits (a VM's region): `limits`
    ivshmem::VmLimits limits{};
    bool repair_refused_logged = false;  // RepairSevered said once why it cannot serve it again
  };

  Status StartServing();
  void Scan(Region& r, uint32_t index, uint64_t now_ms);
  void Admit(Region& r, uint32_t index);
  void Reap();
  void SetDead(Region& r, uint32_t index, int32_t reason);
  bool LeaseStale(Region& r, uint32_t index, uint64_t now_ms);
  void Reset(Region& r, uint32_t index);
  // Whether the region is still what oriond formatted: same file size, no fault past its end, the
  // header as written. If not, it is severed: its sessions end and it is no longer served.
  bool RegionIntact(Region& r);
  Status OpenControlSocket();
  void ServeControl();
  std::string Control(const std::string& line);
  // The control socket's `sessions`: every live session as one JSON array, each entry shaped like
  // the controller's allocations (client pid/process/host, placements with pgpu, vgpu, gmem_mib,
  // used_mib, gpu_name) so orion-smi prints both the same way; plus session, transport, server.
  std::string SessionsJson() const;
  // The Prometheus text of [orion] metrics_addr (MetricsServer): per session and vGPU, its
  // tenant's compute (ratio, device and throttled seconds, utilization) and memory; per GPU, the
  // ratios promised on it.
  std::string MetricsText() const;
  std::unique_ptr<MetricsServer> metrics_;
  // `bell_socket` (may be ""): serve the VM's ivshmem-doorbell there, with up to `vectors` vectors.
  // `ratio` 0..100 (0: best effort) and `ratio_policy` (kPolicyShare, kPolicyCap): the VM's compute share.
  std::string Attach(const std::string& vm, const std::string& path, uint32_t vgpus, uint64_t gmem_mib,
                     uint32_t processes, const std::string& bell_socket = "", uint32_t vectors = 0, uint32_t ratio = 0,
                     uint32_t ratio_policy = 0);
  // The doorbell server of a VM region at `path`, owned like the region file (QEMU's user).
  // `kept`: the eventfds to adopt (see DoorbellServer::Create).
  Result<std::unique_ptr<ivshmem::DoorbellServer>> MakeDoorbell(const std::string& path, const std::string& socket,
                                                                uint32_t vectors,
                                                                std::vector<UniqueFd> kept = {}) const;
  // Waits up to `timeout_ms` for a doorbell socket, a network or a control connection, then serves
  // the doorbell sockets that are ready (accepts QEMU, drops a peer that misbehaves).
  void PollOnce(int timeout_ms);
  // In a forked worker: closes the descriptors that belong to the daemon (doorbell sockets, other
  // channels' eventfds), keeping `keep`.
  void InWorker(int keep);
  std::string Detach(const std::string& vm);
  // Formats and maps a region: `processes` > 0 splits it into that many channels, else channels
  // of shm_buffer_size; `vm` publishes a VM's limits in its header.
  Status AddRegion(const std::string& path, Region* out, uint32_t processes = 0, const ivshmem::VmLimits* vm = nullptr);
  // Ends the sessions of regions_[i], gives its vGPUs back (and the controller assignment) and
  // stops serving it.
  void DropRegion(size_t i, const std::string& why);
  // Takes VM region r's compute-share slots (its ratio and policy) on `placements`' GPUs.
  Status TakeVmCompute(Region& r, const std::vector<Placement>& placements);
  // VM attachments: restored from config_.state_file at start (before any other region is served),
  // written after every change. A VM whose region file is gone is dropped, not restored.
  Status RestoreVms(std::vector<std::string>* gone);
  Status SaveVms();
  // VM regions whose file was removed or replaced (the VM stopped, maybe while oriond was down)
  // are dropped, so the VM's next start attaches afresh.
  void DropGoneVms();
  // A severed region whose file still has its size (its header was overwritten, or it was truncated
  // and grown back) is formatted afresh and served again once none of its sessions is left
  // (issue #11 item 11); one of another size stays severed.
  void RepairSevered();
  // Host regions whose lock another process holds (any process that can open the file can take
  // it): not served, named with the holder, and tried again every second (issue #22 item 6); the
  // rest of oriond starts and serves meanwhile.
  std::vector<std::string> held_regions_;
  void RetryHeldRegions();
  std::shared_ptr<spdlog::logger> SessionLogger(uint32_t session);
  Result<std::unique_ptr<Backend>> MakeBackend(uint32_t session) const;
  SessionParams BaseParams(uint32_t session, const std::vector<Placement>& placements,
                           std::shared_ptr<spdlog::logger> log) const;

  // Where a new session's vGPUs come from: the controller (confirming the client's allocation or
  // asking for one here) or, standalone, this daemon's own pool. Also mirrors them in pool_.
  struct Admission {
    std::vector<Placement> placements;
    std::string allocation_id;
    bool job = false;   // a job's allocation: shared by the job's sessions
    std::string hold;   // the key in holds_ of the hold this session is on ("" = its own vGPUs)
    std::string share;  // a process tree's share token (the Welcome hands it to the client)
    int ratio = -1;     // the compute ratio its controller allocation was admitted with (-1: none)
  };
  // vGPUs that several sessions run on at once, reserved in pool_ once, from the first session to
  // the end of the last: a job's allocation ("job/<allocation id>") or a process tree's share
  // ("share/<token>": the first process's vGPUs, joined by the processes it starts, ORION_SHARE).
  // The sessions of a hold share each vGPU's memory quota through its meter.
  struct Hold {
    std::vector<Placement> placements;
    uint32_t sessions = 0;
    std::string allocation_id;        // a share's controller allocation (AllocateHere), released at its end
    int meter = -1;                   // its kMaxDevices counters in meters_ (-1: none free, quota per session)
    std::map<uint32_t, int> compute;  // its compute-share slot per physical GPU (one tenant)
    // A share whose one session moves with its controller allocation (HandOffMove): no session
    // joins it meanwhile, and when that session leaves moved, the allocation is the target's.
    bool moving = false;
  };
  std::map<std::string, Hold> holds_;
  Status CheckRequest(HelloReq* hello) const;
  Result<Admission> Acquire(const HelloReq& hello, uint32_t session, const std::string& peer);
  Result<Admission> AcquireForJob(const HelloReq& hello, uint32_t session, ControllerGrant g);
  // Joins the share named in `hello` (or starts it with this session's vGPUs, `own`).
  Result<Admission> JoinShare(const HelloReq& hello, const std::string& token, Admission own);
  // Takes one more session on hold `key` (it exists): the hold's first `count` vGPUs, each with the
  // hold's quota or the smaller `gmem_mib`.
  Admission OnHold(const std::string& key, uint32_t count, uint64_t gmem_mib);
  // A session ended: its vGPUs go back (and its allocation to the controller), or, on a hold, its
  // memory leaves the hold's meter and the hold ends with its last session. `moved`: it ended
  // moved to another oriond; a moving share's allocation then went with it (not released).
  void Finish(const std::vector<Placement>& placements, const std::string& allocation_id, int stat_slot,
              const std::string& why, const std::string& hold = "", bool moved = false);
  int TakeStatSlot();
  int TakeMeter();  // a free meter, zeroed; -1 when none is
  // Takes what the ended session in `stat_slot` last published off `meter` (its worker has exited).
  void Unmeter(int meter, int stat_slot);
  std::atomic<uint64_t>* Meter(int meter) const {
    return meter < 0 ? nullptr : meters_ + static_cast<size_t>(meter) * kMaxDevices;
  }
  std::atomic<uint64_t>* StatSlot(int slot) const;
  // The hold's meter (kMaxDevices counters) or null; and its quotas for SessionParams.
  std::atomic<uint64_t>* HoldMeter(const std::string& hold) const;
  std::vector<uint64_t> HoldQuota(const std::string& hold) const;
  void EndRevoked();
  // Compute share: the schedulers of the physical GPUs (kComputeGpus, in memory shared with the
  // workers), a new tenant's slots on the GPUs of `placements` (refused, with the reason, when its
  // ratio does not fit one of them: the ratios on a GPU add up to at most 100), and their end.
  ComputeGpu* compute_ = nullptr;
  Status TakeCompute(const HelloReq& hello, uint32_t session, const std::vector<Placement>& placements,
                     std::map<uint32_t, int>* slots);
  void FreeCompute(std::map<uint32_t, int>* slots);
  // The slots a session runs under: its hold's, or its own (taken now into `own`). `granted_ratio`
  // (>= 0): the ratio its controller allocation was admitted with, which replaces the Hello's.
  Status ComputeFor(const HelloReq& hello, uint32_t session, const std::vector<Placement>& placements,
                    const std::string& hold, std::map<uint32_t, int>* own, int granted_ratio = -1);
  void FillCompute(const std::vector<Placement>& placements, const std::map<uint32_t, int>& slots,
                   SessionParams* sp) const;
  // A worker exited: if it held a GPU's device (a kernel running when it died), the GPU is freed.
  void ReleaseDevices(pid_t pid, const std::vector<Placement>& placements);
  // Each tenant's device time, sampled every second (the last 11 samples), for the measured shares
  // `sessions` reports; keyed by gpu * kComputeSlots + slot, restarted when the slot changes tenant.
  struct ComputeSample {
    uint64_t ms, busy_ns;
  };
  struct ComputeHistory {
    uint32_t session = 0;
    std::vector<ComputeSample> samples;
  };
  std::map<uint32_t, ComputeHistory> compute_history_;
  void SampleCompute(uint64_t now_ms);
  // The tenant's compute on `pgpu` for `sessions`: ratio, policy, device and wait seconds, and the
  // share of the device it got over the last 1 s and 10 s (null when not scheduled).
  nlohmann::json ComputeJson(uint32_t pgpu, const std::map<uint32_t, int>& slots) const;

  std::unique_ptr<ControllerLink> link_;
  // Holds the VMs' doorbell eventfds across oriond restarts (state_file + ".doorbells"); null
  // without a state file (nothing is restored then).
  std::unique_ptr<DoorbellKeeper> keeper_;
  // Leaves the doorbell of regions_ entry `r` with the keeper (a warning if it cannot).
  void KeepDoorbell(const Region& r);
  // Bytes in use per session and device, written by workers: kStatSlots x kMaxDevices counters in
  // an anonymous shared mapping made before any fork.
  static constexpr int kStatSlots = 1024;
  std::atomic<uint64_t>* stats_ = nullptr;
  std::vector<bool> stat_used_;
  // Bytes in use per hold and vGPU, by all the hold's sessions: kStatSlots x kMaxDevices counters
  // in the same mapping, after stats_; workers charge them (compare-and-swap against the quota).
  std::atomic<uint64_t>* meters_ = nullptr;
  std::vector<bool> meter_used_;

  ServerConfig config_;
  BackendKind backend_ = BackendKind::kSim;
  std::unique_ptr<pool::VgpuPool> pool_;
  std::vector<std::string> gpu_names_;  // by physical GPU index
  std::vector<Region> regions_;
  std::shared_ptr<spdlog::logger> log_;
  std::atomic<bool> stop_{false};
  uint32_t next_session_ = 1;
  uint32_t serving_ = 0;
  UniqueFd control_fd_;

  // Network clients (TCP): the listener, connections still in their handshake, and sessions.
  struct Pending {
    UniqueFd fd;  // empty once handed to a worker or closed
    // Its bytes: plain, or TLS (server.conf tls_cert) once the first bytes showed a ClientHello.
    // The worker inherits it across fork(); this process's copy is freed without a word on the wire.
    std::shared_ptr<tls::Stream> stream;
    bool handshaken = false;  // TLS: the handshake is over
    std::string peer;
    std::string source;  // the peer's address without the port (per-source limit)
    std::vector<uint8_t> in;
    uint64_t since_ms = 0;
  };
  uint64_t evicted_ = 0;  // pending connections closed to make room (AcceptClients)
  struct NetSession {
    pid_t pid = 0;
    uint32_t session = 0;
    std::vector<Placement> placements;
    std::string allocation_id;
    int stat_slot = -1;
    ClientInfo client;
    std::string hold;
    std::map<uint32_t, int> compute;
    // Live migration (issue #24): `control`, oriond's end of the worker's control socketpair (a
    // move is asked for on it); for a worker restoring a moved session, `route`, where the
    // program's connection goes once a kHelloResume brings `token` (until `token_deadline_ms`).
    int control = -1;
    int route = -1;
    std::string token;
    uint64_t token_deadline_ms = 0;
    // For a session being moved away: the token its program comes back with when it cannot reach
    // the target (MovedRep::back_token), until `back_deadline_ms`; its connection goes to the worker
    // on `control`.
    std::string back_token;
    uint64_t back_deadline_ms = 0;
  };
  // How long a moving session's way back stays open: the transfer's budget and the worker's wait
  // for the target's confirmation (session_move.cpp) fit well within it.
  static constexpr uint64_t kMoveBackMs = 15 * 60 * 1000;
  // `migrate SESSION HOST:PORT` on the control socket: hands the request and the asker's
  // connection `conn` to the session's worker, which answers it; "" then, else the error line.
  // `report`: the controller allocation whose move the controller asked for (ControllerLink::
  // TakeMoves; oriond is the asker then). A session on a controller allocation moves only so. One
  // on a vGPU share's allocation moves only as the share's one session, and takes the allocation
  // along: the share takes no new session until the move ends.
  std::string HandOffMove(const std::string& line, int conn, const std::string& report = "");
  // The Orion Controller's moves under way: the worker answers on `fd`, oriond's end of a
  // socketpair; a refusal or failure is reported back (ControllerLink::ReportMove; the target
  // reports the commit), and a failed move's share takes sessions again.
  struct WatchedMove {
    int fd = -1;
    std::string report;  // the controller allocation moving
    std::string hold;    // the moving share's key in holds_ ("" none)
    std::string to, answer;
  };
  std::vector<WatchedMove> watched_moves_;
  void WatchMoves();
  // Shared-memory sessions' workers (not a VM's): oriond's end of each one's control socketpair,
  // by worker pid, closed when it is reaped. A move is asked for there as for a network session;
  // the program's way back is its own channel (session_move.cpp).
  std::map<pid_t, int> shm_controls_;
  void MoveForController();
  // A kHelloResume: the program of a moved session arrives; its connection goes to the worker
  // that restored the session.
  void Resume(Pending& p, const FrameHeader& h, const HelloReq& hello);
  Status OpenListener();
  void AcceptClients(uint64_t now_ms);
  void Handshake(Pending& p);
  bool ReadHello(Pending& p, FrameHeader* h, HelloReq* hello);
  uint16_t ChooseTransport(const Pending& p, const HelloReq& hello);
  UniqueFd listen_fd_;
  std::shared_ptr<tls::Context> tls_;  // [server] tls_cert/tls_key: the TCP port speaks TLS only
  std::vector<Pending> pending_;
  std::vector<NetSession> net_sessions_;
};

}  // namespace orion::host
