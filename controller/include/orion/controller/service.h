// orion/controller/service.h — the vGPU pool behind orion-controller: servers and their GPUs,
// allocations (a process's vGPUs, leased) and assignments (a VM's vGPUs, standing), placement,
// leases and server liveness. The state lives in a Store (orion/controller/store.h): SQLite for one
// controller (the in-memory copy is the truth; every change is written through in the same
// critical section, so a restart loses nothing), or etcd for several controllers (each decision
// starts from a fresh read, and every change is one etcd transaction guarded on the vGPU keys it
// takes, so any number of controllers can place at once without double booking; a lost race is
// retried from a fresh read).
//
// Requests that change the pool arrive as the types of orion/controller/requests.h, decoded and
// validated by the REST layer; answers are the JSON documents of controller/openapi.yaml. Errors carry
// the Code that the REST layer maps to an HTTP status (kInvalidArgument 400, kPermissionDenied 403,
// kNotFound 404, kResourceExhausted and kFailedPrecondition 409, kOutOfRange 429 (a per-key limit),
// kUnavailable 503: no server is up, or the store cannot be reached).
//
// Ownership: every allocation records who made it (Caller::owner, a hash of the key, never the key)
// and the server that serves it. A client key may read, renew and release only its own; a server
// key only those its server serves (Caller::server); an admin key, or an open controller, all.
//
//   auto svc = Service::Open(opts);           // opens the store (creates a SQLite file if absent)
//   svc->RegisterServer("10.0.0.7:9960", registration);
//   AllocationRequest req;
//   req.vgpus = 2, req.gmem_mib = 4096;
//   auto a = svc->Allocate(req);
//   svc->Sweep(NowMs());                      // leases and heartbeats (the REST layer calls it)
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "orion/common/status.h"
#include "orion/controller/requests.h"
#include "orion/controller/store.h"
#include "orion/pool/pool.h"

namespace orion::controller {

struct ServiceOptions {
  std::string database;  // "sqlite:<file>" or a file (created if absent), or "etcd://h:p,h:p,..."
  EtcdTls etcd_tls{};    // etcd over HTTPS (store.h)
  pool::PlacementPolicy policy = pool::PlacementPolicy::kPack;
  uint64_t lease_ttl_ms = 15000;          // an allocation nobody renews is released after this
  uint64_t server_timeout_ms = 10000;     // a server silent this long is down: its vGPUs are withheld
  uint64_t server_release_ms = 60000;     // ... and after this long its allocations are released
  uint32_t max_allocations_per_key = 64;  // live allocations one client key may hold (429 beyond)
  uint32_t max_vgpus_per_key = 64;        // vGPUs across them (the sum of their vgpus); 0: no limit
  uint64_t max_gmem_mib_per_key = 0;      // GPU memory across them, MiB (vgpus x gmem_mib); 0: no limit
  uint64_t pending_ttl_ms = 60000;        // a never-confirmed allocation expires this long after it was made,
                                          // however often it is renewed
  // A sweep that finds the previous one this much longer ago (the controller was paused, the host
  // suspended, the clock stepped) gives every lease and server a fresh period before expiring
  // anything. 0: off (the REST layer sets it from its sweep period).
  uint64_t clock_gap_ms = 0;
  // A move (POST /v1/allocations/{id}/migrate) that has neither committed nor failed this long
  // after it was asked for is given up: its reservation at the target is released.
  uint64_t move_timeout_ms = 120000;
};

// Who makes a request (the REST layer fills it from the key).
struct Caller {
  enum class Kind { kOpen, kAdmin, kClient, kServer };
  Kind kind = Kind::kOpen;
  // "key2:<32 hex of PBKDF2-HMAC-SHA256(key, the store's owner salt, kOwnerHashIterations)>"
  // (Service::OwnerOf); empty when the controller is open.
  std::string owner;
  std::string server;  // a server key: the server it speaks for ("server" in the body or query)
  // What controllers before the salt recorded for the same key: "key:<16 hex of SHA-256(key)>".
  // Allocations that carry it are still the key's.
  std::string legacy_owner{};
  // `o` (an allocation's owner) is this caller's key: a key owns only what a key made.
  bool Owns(const std::string& o) const { return !o.empty() && (o == owner || o == legacy_owner); }
  // The same, where no key (an open controller) is one identity too (request replays, limits).
  bool Same(const std::string& o) const { return o == owner || (!o.empty() && o == legacy_owner); }
};

uint64_t WallMs();

// A fresh owner salt (Store::OwnerSalt): 16 random bytes (OpenSSL's RAND_bytes), as hex.
Result<std::string> NewOwnerSalt();

// Copies `from`'s state into `to` (orion-controller migrate): servers (on etcd with fresh liveness
// leases: each has server_timeout to heartbeat through a new controller and server_release before
// its clients' allocations go), VM assignments, and process allocations (each with a fresh lease of
// lease_ttl: their clients and servers renew through the new controllers). One change per item
// (etcd bounds a transaction's size). Returns a one-line summary. kFailedPrecondition when `to`
// already holds servers or allocations and !force.
Result<std::string> MigrateState(Store& from, Store& to, const ServiceOptions& opts, bool force);

class Service {
 public:
  static Result<std::unique_ptr<Service>> Open(ServiceOptions opts);
  // On a store opened by the caller (migration, tests).
  static Result<std::unique_ptr<Service>> Open(ServiceOptions opts, std::unique_ptr<Store> store);
  ~Service();

  // A key's identity as allocations record it (Caller::owner): PBKDF2 with the store's salt, so
  // whoever reads the store cannot test guesses of a key at SHA-256 speed. Computed once per key
  // (the keys are the configuration's) and cached; the first request of a key pays ~tens of ms.
  std::string OwnerOf(const std::string& key);
  static std::string LegacyOwnerOf(const std::string& key);  // the unsalted hash of older controllers
  static constexpr int kOwnerHashIterations = 100000;
  // Servers (role: server). `id` is the server's data-plane address "ip:port".
  Result<Json> RegisterServer(const std::string& id, const ServerRegistration& reg);
  Result<Json> Heartbeat(const std::string& id, const ServerHeartbeat& beat);
  Result<Json> DeregisterServer(const std::string& id);
  // Reads (Servers, ListAllocations, Summary, Metrics) answer from the last state read when the
  // store cannot be reached; Summary says so ("store": {"reachable": false}).
  Json Servers();

  // Allocations. `req.server` non-empty: placed on that server only (oriond asking for its own
  // client, which is then active at once).
  // A client caller holding max_allocations_per_key live allocations, or whom this one would take
  // past max_vgpus_per_key vGPUs or max_gmem_mib_per_key MiB (the request's default size counts as
  // placed), is refused (kOutOfRange, naming the limit).
  Result<Json> Allocate(const AllocationRequest& req, const Caller& caller = {});
  Result<Json> Confirm(const std::string& id, const SessionConfirmation& conf);
  Result<Json> Renew(const std::string& id, const Caller& caller = {});
  // `server`: the server that says its session ended ("server" in the query, as oriond sends it).
  // A client's "client_exited" release of an active allocation (a session serves it) keeps its
  // vGPUs, in state "releasing", until that server's own release or the lease's end: the session
  // is still ending on the server, and placing another client there now would be refused by it.
  Result<Json> Release(const std::string& id, const std::string& why, const Caller& caller = {},
                       const std::string& server = "");
  Result<Json> GetAllocation(const std::string& id, const Caller& caller = {});
  // A client caller sees only its own allocations.
  Json ListAllocations(const std::string& host, const std::string& kind, const Caller& caller = {});

  // Standing assignments for VMs, keyed by VM (libvirt domain) name.
  Result<Json> Assign(const std::string& vm, const AssignmentRequest& req);
  Result<Json> Unassign(const std::string& vm);

  Json Summary();
  std::string Metrics();  // Prometheus text (the pool part and this controller's store)
  // {"kind": "sqlite"|"etcd", "where": ..., "reachable": bool, "error": ...} (not under the pool's lock).
  Json StoreHealth();
  // The watch behind POST /v1/servers/{id}/watch: answers {"revoked": [ids]} as soon as one of
  // `ids` (allocations `server` serves) is no longer held for it (released, expired, or never
  // known), or {"revoked": []} after `timeout_ms`. Woken by this controller's own releases and
  // expiries and, on etcd, by its watch on the allocations (any controller's releases, etcd's
  // lease expiries). At most kMaxWatchers wait at once (kOutOfRange beyond: the caller relies on
  // heartbeats).
  static constexpr int kMaxWatchers = 16;
  // Answers as soon as one of `ids` is revoked, or, for the allocations `server` serves, a move was
  // asked for ({"revoked": [...], "moves": [{"id": ..., "to": ...}]}: each move is announced once
  // per kMoveAnnounceMs, so a server that does not act on it is told again, not flooded).
  Result<Json> WatchRevoked(const std::string& server, const WatchRequest& watch);
  static constexpr uint64_t kMoveAnnounceMs = 5000;

  // Live migration (issue #24; docs/migration.md). Migrate (admin) asks for the allocation's
  // session to move to server `req.to` while its program runs: the target's vGPUs are reserved at
  // once (a reservation: an allocation in state "moving", "move_of" the moving one; refused with
  // the placement's reason when the target has no room), the allocation records "move": {"to"},
  // and its server learns of it from its watch or heartbeat and moves the session there. The
  // target's confirmation of the moving session gets the reservation's vGPUs; its report that the
  // program resumed there commits the move (the allocation is then the target's, on the
  // reservation's vGPUs, and the source's vGPUs are free); a failure report from either end, the
  // target's copy ending first, or move_timeout_ms gives it up (the allocation stays where it was,
  // with "last_move": {"to", "error"}). `req.wait_ms` > 0: answers once it committed (the
  // allocation) or failed (kFailedPrecondition with the reason), or with the allocation still
  // moving after wait_ms. kFailedPrecondition also for an allocation that no session serves, a
  // job's, one already moving, or a target that is not up; kInvalidArgument for a VM's assignment
  // or a move to where it is.
  Result<Json> Migrate(const std::string& id, const MigrateRequest& req);
  // POST /v1/servers/{id}/drain (admin): `on` marks the server draining (it takes no new
  // placements, through any controller, until DELETE .../drain; kept across its re-registration)
  // and asks every allocation a session serves there to move wherever the pool has room (Migrate,
  // without a target). Answers {"server", "draining", "moves": [{"id", "to", "state": moving |
  // moved | failed | released, "error"}], "staying": [{"id", "why"}]} (what cannot move: VM
  // assignments, a job's, pending ones, or no room elsewhere), after waiting up to `wait_ms` for the
  // moves to end. `on` false: the server takes placements again.
  Result<Json> Drain(const std::string& server, bool on, uint64_t wait_ms);
  // A server's report of how a move ended (MoveReport). kPermissionDenied for a server that is
  // neither end of the move (or a source that says committed).
  Result<Json> MoveOutcome(const std::string& id, const MoveReport& report);
  const Store& store() const { return *store_; }
  // Releases expired leases and withholds silent servers. Returns what it did, for the log.
  std::vector<std::string> Sweep(uint64_t now_ms);
  // SQLite: copies the WAL into the database file (PASSIVE: never blocks requests). The REST layer
  // calls it every few seconds.
  void Checkpoint();

 private:
  struct Gpu {
    uint32_t index = 0;
    std::string uuid, name;
    uint64_t memory_mib = 0;
  };
  struct Server {
    std::string id, hostname, boot_id;
    uint32_t vgpu_count = 1;
    std::vector<Gpu> gpus;
    bool up = true;
    uint64_t last_seen_ms = 0;
    uint64_t registered_ms = 0;
    int64_t alive_lease = 0, present_lease = 0;  // etcd (store.h)
    bool draining = false;                       // Drain: no new placements here; stored, kept across re-registration
  };
  struct Slot {
    uint32_t pgpu = 0, vgpu = 0;
    uint64_t gmem_mib = 0;
    uint64_t used_mib = 0;  // reported by oriond
  };
  struct Allocation {
    std::string id, kind = "process", vm, server;
    uint32_t vgpus = 0, ratio = 0;
    uint64_t gmem_mib = 0;
    std::string client_host, client_process;
    uint32_t client_pid = 0;
    std::string owner;              // Caller::owner of the request that made it
    std::string state = "pending";  // pending (not yet confirmed by oriond) | active | releasing | held (a job's)
    // A job's allocation (POST "job": e.g. "slurm/1234.0@node1", made by the Slurm plugin): state
    // "held" from the start, any number of sessions (one after another or at once) confirm it, a
    // session's end does not release it, and only its holder's release or its lease's end does.
    std::string job;
    uint32_t session = 0;
    uint64_t created_ms = 0, lease_expires_ms = 0;
    int64_t lease = 0;  // etcd: the lease its keys are attached to
    // The client's idempotency key (POST /v1/allocations "request_id", a UUID): a request sent
    // again with it (the answer was lost, the controller died) gets this allocation, not another.
    std::string request_id;
    std::vector<Slot> slots;
    // A move under way (Migrate): the target server and the reservation there (an allocation of
    // its own, whose move_of is this one); when it was asked for; when a server was last told.
    std::string move_to, move_reservation, move_of;
    uint64_t move_asked_ms = 0;
    uint64_t move_told_ms = 0;                  // not stored: each controller tells its own watchers
    std::string last_move_to, last_move_error;  // the last move that failed, and why
  };

  Service(ServiceOptions opts, std::unique_ptr<Store> store) : opts_(std::move(opts)), store_(std::move(store)) {}
  // Replaces the in-memory state with the store's. `initial`: the first read (SQLite's grace rules).
  Status Absorb(const StoreState& st, bool initial);
  // A shared store: reads it again (before every decision). SQLite: nothing to do.
  Status Sync();
  void SyncForRead();  // Sync, keeping the last state when the store cannot be reached
  Status Apply(const StoreChange& c);
  // One write to the pool, as an optimistic transaction: each try Syncs with the store, then
  // `attempt(n)` (n = 0, 1, ...) decides from the fresh state and applies its change (Apply,
  // guarded by the versions it read). A lost race (kAlreadyExists: a guarded key changed after the
  // Sync) is tried again after a short random pause, up to kMaxAttempts tries; any other result,
  // and the last lost race, is returned as it is. `unreachable` runs when a Sync fails: it gives
  // back what the attempts hold across tries (PlaceAndStore's lease). service.cpp defines it.
  template <typename Attempt, typename Unreachable>
  auto Transact(Attempt&& attempt, Unreachable&& unreachable) -> decltype(attempt(0));
  template <typename Attempt>
  auto Transact(Attempt&& attempt) -> decltype(attempt(0)) {
    return Transact(attempt, [] {});
  }
  static Json ToJson(const Server& s);
  Json ToJson(const Allocation& a) const;
  static Json StoreDoc(const Server& s);
  Json StoreDoc(const Allocation& a) const;
  // Guards for erasing `a` (its document still the one read) into `c`.
  void EraseInto(const Allocation& a, StoreChange* c) const;
  // Guards and GPU counters for a new placement of `a` into `c`.
  void PlaceInto(const Allocation& a, StoreChange* c) const;
  int64_t Version(const std::string& path) const;
  const pool::VgpuPool& PoolOf(const Server& s) const;  // pools_'s entry (empty if none)
  // Every server's pool (or only `only`'s), from one pass over the allocations.
  std::map<std::string, pool::VgpuPool> Pools(const std::string& only = "") const;
  // `exclude`: a server not to place on (a move's source). Draining servers take nothing.
  Result<Allocation> Place(const PlacementRequest& req, const std::string& kind, const std::string& exclude = "");
  // Migrate's first half: reserves `to` (empty: wherever Place finds room, not the allocation's
  // server) and records the move; `from` non-empty: only if the allocation is still there.
  Result<Json> AskMoveLocked(const std::string& id, const std::string& to, const std::string& from);
  // How `id`'s move to `to` stands: {"state": moving | moved | failed (with "error") | released}.
  Json MoveStateLocked(const std::string& id, const std::string& to) const;
  // Waits (mu_ released meanwhile) until done() or `deadline`: woken by this controller's changes,
  // and on etcd reading the store every second (another controller may make them).
  template <typename Done>
  void WaitLocked(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline, Done done);
  // Stores a new allocation or assignment (placed by Place, reserved in pools_). Retries placement
  // from a fresh read when another controller took a guarded key first.
  // `req`: an assignment's carries only its PlacementRequest part.
  Result<Json> PlaceAndStore(const AllocationRequest& req, const std::string& kind, const Caller& caller,
                             const std::string& vm);
  Status ReleaseLocked(const std::string& id);
  Allocation* ReservationOf(const Allocation& a);  // the reservation of a's move, if it has one
  Status CommitMoveLocked(Allocation& a, uint32_t session);
  Status CancelMoveLocked(Allocation& a, const std::string& why);
  Status ReleaseManyLocked(const std::vector<std::string>& ids);
  // kPermissionDenied unless `c` may renew or release `a` (see Ownership above).
  static Status MayTouch(const Allocation& a, const Caller& c, const char* what);
  void UnreserveLocked(const Allocation& a);  // gives its slots back to pools_
  // Whether a placement was already made for `request_id` (its allocation may be gone since):
  // etcd: its requests/ key exists; SQLite: it is in recent_requests_.
  // `vm`'s assignment when it has one (the same request again: it; another shape: kResourceExhausted),
  // else kNotFound.
  Result<Json> ExistingAssignmentLocked(const std::string& vm, const PlacementRequest& req);
  bool RequestSeenLocked(const std::string& request_id);
  // etcd: the lease idempotency keys are put on, granted afresh when the current one is older than
  // half of kRequestMemoryMs (so every key lives between half of it and all of it).
  Result<int64_t> RequestLeaseLocked();

  ServiceOptions opts_;
  std::unique_ptr<Store> store_;
  std::string owner_salt_;  // the store's (Store::OwnerSalt)
  std::mutex owners_mu_;
  std::map<std::string, std::string> owners_;  // key -> OwnerOf(key), for the configuration's keys
  mutable std::mutex mu_;
  // Bumped (under mu_) whenever allocations may have gone: WatchRevoked's waiters look again.
  uint64_t deletions_ = 0;
  uint64_t deletions_read_ = 0;  // deletions_ when a watch last read the store (WatchRevoked)
  std::condition_variable deleted_;
  int watchers_ = 0;
  // etcd: the thread that follows deletions made by others (Store::WatchDeletions).
  std::atomic<bool> stop_watch_{false};
  std::thread store_watcher_;
  void NoteDeletionsLocked() {
    ++deletions_;
    deleted_.notify_all();
  }
  std::map<std::string, Server> servers_;
  std::map<std::string, Allocation> allocs_;
  std::map<std::string, pool::VgpuPool> pools_;  // per server: slots taken by allocs_ (kept in step)
  std::map<std::string, int64_t> versions_;      // etcd: path -> mod_revision at the last read
  uint64_t allocations_made_ = 0, refusals_ = 0, expired_ = 0, replays_ = 0;
  uint64_t moves_asked_ = 0, moves_done_ = 0, moves_failed_ = 0;
  uint64_t conflicts_ = 0, store_errors_ = 0;  // lost races (retried), failed store reads/writes
  bool store_ok_ = true;
  std::string store_error_;
  uint64_t last_sweep_ms_ = 0;
  int64_t request_lease_ = 0;  // etcd: see RequestLeaseLocked
  uint64_t request_lease_ms_ = 0;
  // SQLite (one controller): request_id -> when its memory ends, and the same in order of expiry
  // (bounded by kMaxRecentRequests; the oldest go first).
  std::map<std::string, uint64_t> recent_requests_;
  std::multimap<uint64_t, std::string> recent_by_expiry_;
};

}  // namespace orion::controller
