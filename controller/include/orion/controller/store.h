// orion/controller/store.h — where the pool's state lives: one SQLite file (one controller) or an
// etcd cluster (any number of controllers). The Service decides (placement, ownership, limits);
// a Store keeps documents and applies one change at a time, atomically.
//
// Keys are store-neutral paths:
//   servers/<id>                    the server's document (Service::ToJson(Server))
//   allocations/<id>                an allocation or VM assignment (Service::ToJson(Allocation))
//   vgpus/<server>/<pgpu>/<vgpu>    the slot's holder (the allocation id), with the allocation
//   gpus/<server>/<pgpu>            a counter every placement on the GPU bumps
//   requests/<request_id>           the allocation a client's idempotency key made, with the allocation
//   vms/<name>                      the VM's assignment (its allocation id): one per VM name
//   alive/<server>, present/<server>  liveness (etcd leases, below)
// A Change carries guards, (path, version) pairs: etcd applies the change only if every guarded
// key's mod_revision still equals the version the controller saw (0: the key is absent), so two
// controllers placing at once can never both take a slot (each slot it takes must be absent) or
// overfill a GPU (each GPU's counter must be unchanged since the read the decision used). SQLite
// has one writer (the database's lock file) and ignores guards.
//
// Leases (etcd only; SQLite returns lease 0 and the Service keeps time itself): an allocation's
// document and slots are attached to its etcd lease, so when nobody renews it etcd deletes them —
// no controller's clock is involved. A server has two leases: "alive" (server_timeout: its vGPUs
// are withheld when it lapses) and "present" (server_release: its clients' allocations are released).
//
//   auto store = OpenStore("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379");
//   auto state = (*store)->Load();
//   StoreChange c; c.put_allocations.push_back({doc, lease}); c.guards = {{"vgpus/s/0/1", 0}};
//   Status st = (*store)->Apply(c);   // kAlreadyExists: another controller got there first; reload, retry
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "orion/common/status.h"

namespace orion::controller {

struct StoreState {
  std::vector<nlohmann::json> servers;      // server documents
  std::vector<nlohmann::json> allocations;  // allocation documents ("lease": etcd lease id, as a number)
  std::map<std::string, int64_t> versions;  // path -> mod_revision (etcd; empty for SQLite)
  std::set<std::string> alive, present;     // etcd: servers whose alive / present lease holds
};

struct StoreChange {
  std::vector<nlohmann::json> put_servers;
  std::vector<std::pair<nlohmann::json, int64_t>> put_allocations;  // (document, lease; 0 = none)
  std::vector<nlohmann::json> erase_allocations;                    // documents: id, server, placements, lease
  // Server liveness keys (etcd): (server id, lease) for the alive and present keys.
  std::vector<std::pair<std::string, int64_t>> put_alive, put_present;
  std::vector<std::pair<std::string, int64_t>> guards;  // (path, expected version; 0 = absent)
  // etcd: paths written (empty value) only to move their version: gpus/<server>/<pgpu>, bumped by
  // every placement on that GPU, so a placement guarded on it fails if another one got there first.
  std::vector<std::string> touch;
  // etcd: keys deleted as they are (a committed move's vGPU keys at its source; SQLite keeps no
  // such keys).
  std::vector<std::string> erase_paths;
  // etcd: idempotency keys, requests/<request_id> = allocation id, each on `lease` (the controller's
  // request-memory lease, not the allocation's: the key outlives the allocation, so a repeat of the
  // request that arrives after the allocation was released is recognized and places nothing).
  struct RequestKey {
    std::string request_id, allocation_id;
    int64_t lease = 0;
  };
  std::vector<RequestKey> put_requests;
  // etcd: vms/<name> = the assignment's id (written with a guard that it is absent, so two
  // controllers assigning the same VM at once place it once), deleted with the assignment.
  std::vector<std::pair<std::string, std::string>> put_vms;  // (name, allocation id)
  std::vector<std::string> erase_vms;
};

class Store {
 public:
  virtual ~Store() = default;
  virtual const char* kind() const = 0;  // "sqlite" | "etcd"
  // Where it is, for logs and /v1/health ("/var/lib/orion/controller.db", "etcd://h1:2379,...").
  virtual std::string where() const = 0;
  // Other controllers write to it too: the Service reloads before each decision.
  virtual bool shared() const = 0;

  // The whole state. kUnavailable: the store cannot be reached (etcd: no member answered, or no quorum).
  virtual Result<StoreState> Load() = 0;
  // Applies `c` atomically. kAlreadyExists: a guard failed (nothing applied). kNotFound: a lease named in
  // it has expired (nothing applied). kUnavailable: unreachable (the change may or may not be applied).
  virtual Status Apply(const StoreChange& c) = 0;

  // Leases, in whole seconds (rounded up). SQLite: Grant returns 0, KeepAlive returns `ttl_hint_ms`.
  virtual Result<int64_t> Grant(uint64_t ttl_ms) = 0;
  // The lease's remaining time after renewal; kNotFound when it has expired.
  virtual Result<uint64_t> KeepAlive(int64_t lease, uint64_t ttl_hint_ms) = 0;
  virtual void Revoke(int64_t lease) = 0;  // best effort

  // The salt of the owner hashes (Service: a client key's identity, PBKDF2 of the key with it): the
  // one the store holds, else `proposed`, stored atomically (the first controller on a store picks
  // it; every one after reads it). `overwrite` replaces the stored one (migrate, into an empty
  // store). SQLite: a row of table meta; etcd: <prefix>meta/owner_salt.
  virtual Result<std::string> OwnerSalt(const std::string& proposed, bool overwrite) = 0;

  // Can it be reached now (etcd: a linearizable read, which needs a quorum)?
  virtual Status Ping() = 0;
  // etcd: follows the deletions of allocations/ keys (by any controller's release, or by etcd when
  // an allocation's lease lapsed) with a watch (POST /v3/watch, a stream), calling `on_delete` for
  // each batch, for about a second or until `stop`; the next call resumes after the last revision
  // seen. false when nothing can be watched (SQLite: this controller makes every change itself; or
  // no member answered).
  virtual bool WatchDeletions(const std::function<void()>& on_delete, const std::atomic<bool>& stop) {
    (void)on_delete;
    (void)stop;
    return false;
  }
  virtual void Checkpoint() {}
};

// TLS to etcd (controller.yaml etcd_tls_ca / etcd_tls_cert / etcd_tls_key; PEM files). With `ca` set
// every member is spoken to over HTTPS and its certificate must chain to `ca` and name the member's
// host or IP address (etcd's --cert-file/--trusted-ca-file). `cert` and `key` (both or neither) are
// this controller's client certificate, for an etcd that runs with --client-cert-auth.
struct EtcdTls {
  std::string ca, cert, key;
  bool on() const { return !ca.empty(); }
  bool any() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

// "sqlite:/path", a plain path (SQLite), or "etcd://h1:port,h2:port,...". kInvalidArgument on a
// malformed address (or `tls` given for a store that is not etcd, or a TLS file that cannot be
// read), kUnavailable / kFailedPrecondition when the store cannot be opened (for etcd over TLS:
// the handshake's reason, e.g. "certificate verify failed").
Result<std::unique_ptr<Store>> OpenStore(const std::string& database, const EtcdTls& tls = {});
Result<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path);
Result<std::unique_ptr<Store>> OpenEtcdStore(const std::string& endpoints,
                                             const EtcdTls& tls = {});  // "h1:2379,h2:2379"

}  // namespace orion::controller
