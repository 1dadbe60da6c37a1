#include "orion/controller/service.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "orion/common/text.h"
#include "orion/controller/client.h"

namespace orion::controller {

namespace {

// A decision that lost its race to another controller (a guarded key moved) is made again from a
// fresh read, at most this many times.
constexpr int kMaxAttempts = 24;
// How long a placement waits for vGPUs that exited clients' allocations are giving back (Allocate).
// Below the clients' own timeout (5 s); a server's request (oriond asking for its client) never
// waits: its loop is what ends the sessions being released.
constexpr int kReleasingWaitMs = 2000;
// How long the pool remembers an idempotency key (request_id) after placing it, whether or not its
// allocation is still there. A repeat of a request can arrive late: a controller stalled while etcd
// elected a leader works through its queue after the client timed out, asked the next controller,
// ran and released. Answering such a repeat with a fresh placement left an allocation nobody would
// use until its lease ended (a CI run found both servers full of them). Clients give up on a
// request after one timeout per controller (5 s each), far less than this.
constexpr uint64_t kRequestMemoryMs = 10 * 60 * 1000;
constexpr size_t kMaxRecentRequests = 1 << 16;  // SQLite: keys remembered at most (the oldest go first)

std::string AllocPath(const std::string& id) { return "allocations/" + id; }
std::string SlotPath(const std::string& server, uint32_t pgpu, uint32_t vgpu) {
  return "vgpus/" + server + "/" + std::to_string(pgpu) + "/" + std::to_string(vgpu);
}
std::string GpuPath(const std::string& server, uint32_t pgpu) { return "gpus/" + server + "/" + std::to_string(pgpu); }
std::string RequestPath(const std::string& request_id) { return "requests/" + request_id; }
std::string VmPath(const std::string& vm) { return "vms/" + vm; }

// A short random pause before retrying a lost race (the winners of the last round finish first).
void Backoff(int attempt) {
  static thread_local std::mt19937 rng{std::random_device{}()};
  const int cap = std::min(20, 1 + attempt * 2);
  std::this_thread::sleep_for(std::chrono::microseconds(200 + (rng() % static_cast<unsigned>(cap)) * 250));
}

std::string NewId() { return RandomUuid(); }

}  // namespace

uint64_t WallMs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

namespace {
std::string Hex(const unsigned char* d, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += hex[d[i] >> 4];
    out += hex[d[i] & 15];
  }
  return out;
}
}  // namespace

Result<std::string> NewOwnerSalt() {
  unsigned char fresh[16];
  if (RAND_bytes(fresh, sizeof fresh) != 1) return Internal("no random bytes for the owner salt");
  return Hex(fresh, sizeof fresh);
}

std::string Service::OwnerOf(const std::string& key) {
  std::lock_guard<std::mutex> lock(owners_mu_);
  if (auto it = owners_.find(key); it != owners_.end()) return it->second;
  unsigned char d[16];
  if (PKCS5_PBKDF2_HMAC(key.data(), static_cast<int>(key.size()),
                        reinterpret_cast<const unsigned char*>(owner_salt_.data()),
                        static_cast<int>(owner_salt_.size()), kOwnerHashIterations, EVP_sha256(), sizeof d, d) != 1) {
    return "";  // no identity: owns nothing, and what it makes is nobody's
  }
  if (owners_.size() >= 4096) owners_.clear();  // the configuration's keys; bounded all the same
  return owners_[key] = "key2:" + Hex(d, sizeof d);
}

std::string Service::LegacyOwnerOf(const std::string& key) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), d);
  return "key:" + Hex(d, 8);
}

Result<std::unique_ptr<Service>> Service::Open(ServiceOptions opts) {
  auto store = OpenStore(opts.database, opts.etcd_tls);
  if (!store.ok()) return store.status();
  return Open(std::move(opts), std::move(*store));
}

Result<std::unique_ptr<Service>> Service::Open(ServiceOptions opts, std::unique_ptr<Store> store) {
  std::unique_ptr<Service> s(new Service(std::move(opts), std::move(store)));
  auto st = s->store_->Load();
  if (!st.ok()) return st.status();
  auto fresh = NewOwnerSalt();
  if (!fresh.ok()) return fresh.status();
  auto salt = s->store_->OwnerSalt(*fresh, /*overwrite=*/false);
  if (!salt.ok()) return salt.status();
  s->owner_salt_ = *salt;
  {
    std::lock_guard<std::mutex> lock(s->mu_);
    if (Status a = s->Absorb(*st, /*initial=*/true); !a.ok()) return a;
  }
  if (s->store_->shared()) {
    Service* self = s.get();
    s->store_watcher_ = std::thread([self] {
      auto wake = [self] {
        std::lock_guard<std::mutex> lock(self->mu_);
        self->NoteDeletionsLocked();
      };
      while (!self->stop_watch_.load()) {
        if (!self->store_->WatchDeletions(wake, self->stop_watch_)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));  // no member answered: again soon
        }
      }
    });
  }
  return s;
}

void Service::Checkpoint() { store_->Checkpoint(); }

Service::~Service() {
  stop_watch_ = true;
  if (store_watcher_.joinable()) store_watcher_.join();
}

Status Service::Apply(const StoreChange& c) {
  Status st = store_->Apply(c);
  if (st.ok() && !c.erase_allocations.empty()) NoteDeletionsLocked();
  if (st.code() == Code::kAlreadyExists) {
    ++conflicts_;
  } else if (st.code() == Code::kUnavailable || st.code() == Code::kInternal) {
    ++store_errors_;
    store_ok_ = false;
    store_error_ = st.message();
  }
  return st;
}

Status Service::Sync() {
  if (!store_->shared()) return Status();
  auto st = store_->Load();
  if (!st.ok()) {
    ++store_errors_;
    store_ok_ = false;
    store_error_ = st.status().message();
    return Unavailable("the pool's store (" + std::string(store_->kind()) +
                       ") cannot be reached: " + st.status().message());
  }
  store_ok_ = true;
  store_error_.clear();
  return Absorb(*st, /*initial=*/false);
}

void Service::SyncForRead() { (void)Sync(); }

namespace {
Code CodeOf(const Status& st) { return st.code(); }
template <typename T>
Code CodeOf(const Result<T>& r) {
  return r.ok() ? Code::kOk : r.status().code();
}
}  // namespace

template <typename Attempt, typename Unreachable>
auto Service::Transact(Attempt&& attempt, Unreachable&& unreachable) -> decltype(attempt(0)) {
  for (int n = 0;; ++n) {
    if (Status st = Sync(); !st.ok()) {
      unreachable();
      return st;
    }
    auto r = attempt(n);
    if (CodeOf(r) != Code::kAlreadyExists || n + 1 >= kMaxAttempts) return r;
    Backoff(n);
  }
}

Json Service::StoreHealth() {
  Status st = store_->Ping();
  Json j = {{"kind", store_->kind()}, {"where", store_->where()}, {"reachable", st.ok()}};
  if (!st.ok()) j["error"] = st.message();
  return j;
}

int64_t Service::Version(const std::string& path) const {
  auto it = versions_.find(path);
  return it == versions_.end() ? 0 : it->second;
}

void Service::EraseInto(const Allocation& a, StoreChange* c) const {
  c->erase_allocations.push_back(StoreDoc(a));
  if (store_->shared()) c->guards.emplace_back(AllocPath(a.id), Version(AllocPath(a.id)));
  if (store_->shared() && a.kind == "vm") c->erase_vms.push_back(a.vm);
}

void Service::PlaceInto(const Allocation& a, StoreChange* c) const {
  c->put_allocations.emplace_back(StoreDoc(a), a.lease);
  if (!store_->shared()) return;
  // One allocation per idempotency key, across controllers: the second of two placements with the
  // same key (a client that asked again elsewhere, a write repeated after its answer was lost) fails
  // here, and its controller answers with the first one.
  if (!a.request_id.empty()) c->guards.emplace_back(RequestPath(a.request_id), 0);
  if (a.kind == "vm") {
    // One assignment per VM name, across controllers.
    c->guards.emplace_back(VmPath(a.vm), 0);
    c->put_vms.emplace_back(a.vm, a.id);
  }
  std::set<uint32_t> gpus;
  for (const Slot& sl : a.slots) {
    c->guards.emplace_back(SlotPath(a.server, sl.pgpu, sl.vgpu), 0);  // the slot is free
    gpus.insert(sl.pgpu);
  }
  for (uint32_t g : gpus) {
    // Nobody placed on the GPU since the read this placement was decided on.
    c->guards.emplace_back(GpuPath(a.server, g), Version(GpuPath(a.server, g)));
    c->touch.push_back(GpuPath(a.server, g));
  }
}

Json Service::ToJson(const Server& s) {
  Json gpus = Json::array();
  for (const Gpu& g : s.gpus) {
    gpus.push_back({{"index", g.index}, {"uuid", g.uuid}, {"name", g.name}, {"memory_mib", g.memory_mib}});
  }
  return {{"id", s.id},
          {"addr", s.id},
          {"hostname", s.hostname},
          {"boot_id", s.boot_id},
          {"vgpu_count", s.vgpu_count},
          {"gpus", gpus},
          {"up", s.up},
          {"last_seen_ms", s.last_seen_ms},
          {"registered_ms", s.registered_ms},
          {"draining", s.draining}};
}

Json Service::ToJson(const Allocation& a) const {
  Json pl = Json::array();
  const auto srv = servers_.find(a.server);
  for (const Slot& s : a.slots) {
    std::string name, uuid;
    if (srv != servers_.end()) {
      for (const Gpu& g : srv->second.gpus) {
        if (g.index == s.pgpu) {
          name = g.name;
          uuid = g.uuid;
        }
      }
    }
    pl.push_back({{"server", a.server},
                  {"pgpu", s.pgpu},
                  {"vgpu", s.vgpu},
                  {"gmem_mib", s.gmem_mib},
                  {"used_mib", s.used_mib},
                  {"gpu_name", name},
                  {"gpu_uuid", uuid},
                  {"text", a.server + "/" + std::to_string(s.pgpu) + "/" + std::to_string(s.vgpu)}});
  }
  Json j = {{"id", a.id},
            {"kind", a.kind},
            {"server", a.server},
            {"state", a.state},
            {"vgpus", a.vgpus},
            {"gmem_mib", a.gmem_mib},
            {"ratio", a.ratio},
            {"session", a.session},
            {"created_ms", a.created_ms},
            {"lease_expires_ms", a.lease_expires_ms},
            {"lease_ttl_ms", opts_.lease_ttl_ms},
            {"client", {{"host", a.client_host}, {"pid", a.client_pid}, {"process", a.client_process}}},
            {"placements", pl}};
  if (!a.vm.empty()) j["vm"] = a.vm;
  if (!a.job.empty()) j["job"] = a.job;
  if (!a.owner.empty()) j["owner"] = a.owner;
  if (!a.request_id.empty()) j["request_id"] = a.request_id;
  if (!a.move_to.empty())
    j["move"] = {{"to", a.move_to}, {"reservation", a.move_reservation}, {"asked_ms", a.move_asked_ms}};
  if (!a.move_of.empty()) j["move_of"] = a.move_of;
  if (!a.last_move_to.empty()) j["last_move"] = {{"to", a.last_move_to}, {"error", a.last_move_error}};
  return j;
}

Json Service::StoreDoc(const Server& s) {
  Json j = ToJson(s);
  if (s.alive_lease != 0) j["alive_lease"] = s.alive_lease;
  if (s.present_lease != 0) j["present_lease"] = s.present_lease;
  return j;
}

Json Service::StoreDoc(const Allocation& a) const {
  Json j = ToJson(a);
  if (a.lease != 0) j["lease"] = a.lease;
  return j;
}

Status Service::Absorb(const StoreState& st, bool initial) {
  const uint64_t now = WallMs();
  const bool shared = store_->shared();
  std::map<std::string, Server> servers;
  std::map<std::string, Allocation> allocs;
  for (const Json& j : st.servers) {
    Server s;
    s.id = j.value("id", "");
    s.hostname = j.value("hostname", "");
    s.boot_id = j.value("boot_id", "");
    s.vgpu_count = j.value("vgpu_count", 1u);
    s.up = j.value("up", true);
    s.registered_ms = j.value("registered_ms", uint64_t{0});
    s.alive_lease = j.value("alive_lease", int64_t{0});
    s.present_lease = j.value("present_lease", int64_t{0});
    s.draining = j.value("draining", false);
    // Grace after a controller restart: servers have server_timeout_ms to be heard from again.
    s.last_seen_ms = now;
    if (shared) {
      // etcd: a server is up while its alive lease holds (renewed by its heartbeats, through any
      // controller); the time it was last seen is not shared.
      s.up = st.alive.count(s.id) != 0;
      if (auto old = servers_.find(s.id); old != servers_.end()) s.last_seen_ms = old->second.last_seen_ms;
    }
    for (const Json& g : j.value("gpus", Json::array())) {
      s.gpus.push_back(
          {g.value("index", 0u), g.value("uuid", ""), g.value("name", ""), g.value("memory_mib", uint64_t{0})});
    }
    servers[s.id] = std::move(s);
  }
  for (const Json& j : st.allocations) {
    Allocation a;
    a.id = j.value("id", "");
    a.kind = j.value("kind", "process");
    a.vm = j.value("vm", "");
    a.job = j.value("job", "");
    a.server = j.value("server", "");
    a.vgpus = j.value("vgpus", 0u);
    a.gmem_mib = j.value("gmem_mib", uint64_t{0});
    a.ratio = j.value("ratio", 0u);
    a.state = j.value("state", "pending");
    a.session = j.value("session", 0u);
    a.created_ms = j.value("created_ms", uint64_t{0});
    a.lease = j.value("lease", int64_t{0});
    const Json c = j.value("client", Json::object());
    a.client_host = c.value("host", "");
    a.client_pid = c.value("pid", 0u);
    a.client_process = c.value("process", "");
    a.owner = j.value("owner", "");
    a.request_id = j.value("request_id", "");
    if (const Json m = j.value("move", Json::object()); m.is_object()) {
      a.move_to = m.value("to", "");
      a.move_reservation = m.value("reservation", "");
      a.move_asked_ms = m.value("asked_ms", uint64_t{0});
    }
    a.move_of = j.value("move_of", "");
    if (const Json m = j.value("last_move", Json::object()); m.is_object()) {
      a.last_move_to = m.value("to", "");
      a.last_move_error = m.value("error", "");
    }
    a.lease_expires_ms = a.kind == "vm" ? 0 : j.value("lease_expires_ms", uint64_t{0});
    // Grace: whoever renews this lease gets a full period to reach the restarted controller.
    if (initial && a.kind != "vm") a.lease_expires_ms = std::max(a.lease_expires_ms, now + opts_.lease_ttl_ms);
    for (const Json& p : j.value("placements", Json::array())) {
      a.slots.push_back({p.value("pgpu", 0u), p.value("vgpu", 0u), p.value("gmem_mib", uint64_t{0}),
                         p.value("used_mib", uint64_t{0})});
    }
    if (auto old = allocs_.find(a.id); old != allocs_.end()) {
      // What this controller learnt from renewals and heartbeats (not written to the store).
      a.lease_expires_ms = std::max(a.lease_expires_ms, old->second.lease_expires_ms);
      if (a.move_to == old->second.move_to) a.move_told_ms = old->second.move_told_ms;
      for (size_t i = 0; i < a.slots.size() && i < old->second.slots.size(); ++i) {
        a.slots[i].used_mib = old->second.slots[i].used_mib;
      }
    }
    allocs[a.id] = std::move(a);
  }
  servers_ = std::move(servers);
  allocs_ = std::move(allocs);
  versions_ = st.versions;
  pools_ = Pools();
  return Status();
}

std::map<std::string, pool::VgpuPool> Service::Pools(const std::string& only) const {
  std::map<std::string, pool::VgpuPool> pools;
  std::map<std::string, std::vector<std::vector<pool::Placement>>> taken;
  for (const auto& [id, a] : allocs_) {
    if (!only.empty() && a.server != only) continue;
    auto& v = taken[a.server].emplace_back();
    for (const Slot& sl : a.slots) v.push_back({sl.pgpu, sl.vgpu, sl.gmem_mib << 20, a.ratio});
  }
  for (const auto& [id, s] : servers_) {
    if (!only.empty() && id != only) continue;
    std::vector<pool::PhysicalGpu> gpus;
    for (const Gpu& g : s.gpus) gpus.push_back({g.index, g.name, g.memory_mib << 20, g.uuid});
    pool::VgpuPool pool(std::move(gpus), s.vgpu_count);
    if (auto t = taken.find(id); t != taken.end()) {
      for (const auto& p : t->second) (void)pool.Reserve(p);  // as in PoolOf
    }
    pools.emplace(id, std::move(pool));
  }
  return pools;
}

const pool::VgpuPool& Service::PoolOf(const Server& s) const {
  static const pool::VgpuPool kEmpty({}, 1);
  auto it = pools_.find(s.id);
  return it != pools_.end() ? it->second : kEmpty;
}

Result<Json> Service::RegisterServer(const std::string& id, const ServerRegistration& reg) {
  if (!ParseEndpoint(id, 9960).ok() || id.find(':') == std::string::npos || id.find("://") != std::string::npos) {
    return InvalidArgument("server id '" + id + "' is not the server's ip:port");
  }
  Server s;
  s.id = id;
  s.vgpu_count = reg.vgpu_count;
  s.hostname = reg.hostname;
  s.boot_id = reg.boot_id;
  for (const GpuSpec& g : reg.gpus) s.gpus.push_back({g.index, g.uuid, g.name, g.memory_mib});
  const std::set<std::string>& active = reg.allocations;
  std::lock_guard<std::mutex> lock(mu_);
  Json released = Json::array();
  Status stored = Transact([&](int) -> Status {
    const uint64_t now = WallMs();
    s.up = true;
    s.last_seen_ms = now;
    auto old = servers_.find(id);
    s.registered_ms = old != servers_.end() ? old->second.registered_ms : now;
    s.draining = old != servers_.end() && old->second.draining;  // until an administrator ends it
    const int64_t old_alive = old != servers_.end() ? old->second.alive_lease : 0;
    const int64_t old_present = old != servers_.end() ? old->second.present_lease : 0;
    StoreChange c;
    if (store_->shared()) {
      auto alive = store_->Grant(opts_.server_timeout_ms);
      if (!alive.ok()) return Unavailable("the pool's store cannot be reached: " + alive.status().message());
      auto present = store_->Grant(opts_.server_release_ms);
      if (!present.ok()) {
        store_->Revoke(*alive);
        return Unavailable("the pool's store cannot be reached: " + present.status().message());
      }
      s.alive_lease = *alive;
      s.present_lease = *present;
      c.put_alive.emplace_back(id, *alive);
      c.put_present.emplace_back(id, *present);
      if (old != servers_.end()) c.guards.emplace_back("servers/" + id, Version("servers/" + id));
    }
    // A (re)starting oriond holds only the sessions it lists: its other clients' allocations are gone.
    std::vector<std::string> drop;
    for (const auto& [aid, x] : allocs_) {
      if (x.server == id && x.kind == "process" && x.state != "pending" && x.job.empty() && x.move_of.empty() &&
          !active.count(aid)) {
        drop.push_back(aid);  // a job's allocation outlives its sessions: its holder still renews it
      }
    }
    const size_t own = drop.size();
    for (size_t i = 0; i < own; ++i) {
      if (const Allocation* b = ReservationOf(allocs_[drop[i]]); b != nullptr) drop.push_back(b->id);  // its move's
    }
    for (const auto& aid : drop) EraseInto(allocs_[aid], &c);
    c.put_servers.push_back(StoreDoc(s));
    if (Status st = Apply(c); !st.ok()) {
      store_->Revoke(s.alive_lease);
      store_->Revoke(s.present_lease);
      return st;
    }
    if (old_alive != 0) store_->Revoke(old_alive);
    if (old_present != 0) store_->Revoke(old_present);
    for (const auto& aid : drop) {
      if (allocs_[aid].move_of.empty()) {
        store_->Revoke(allocs_[aid].lease);
        released.push_back(aid);
      }
      allocs_.erase(aid);
    }
    return Status();
  });
  if (!stored.ok()) return stored;
  servers_[id] = s;
  pools_.erase(id);
  pools_.emplace(id, std::move(Pools(id).at(id)));
  const pool::VgpuPool& pool = PoolOf(s);
  Json assignments = Json::array();
  for (const auto& [aid, a] : allocs_) {
    if (a.server == id && a.kind == "vm") assignments.push_back(ToJson(a));
  }
  return Json{{"server", id},
              {"vgpus_total", pool.total_vgpus()},
              {"vgpus_free", pool.free_vgpus()},
              {"released", released},
              {"assignments", assignments},
              {"lease_ttl_ms", opts_.lease_ttl_ms},
              {"server_timeout_ms", opts_.server_timeout_ms}};
}

Result<Json> Service::Heartbeat(const std::string& id, const ServerHeartbeat& beat) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = Sync(); !st.ok()) return st;
  auto it = servers_.find(id);
  if (it == servers_.end()) return NotFound("server " + id + " is not registered");
  Server& s = it->second;
  if (!beat.boot_id.empty() && beat.boot_id != s.boot_id)
    return NotFound("server " + id + " restarted; it must register again");
  const uint64_t now = WallMs();
  bool was_down = !s.up;
  if (store_->shared()) {
    // The server's liveness is its two etcd leases: renew them; a lapsed one is granted afresh.
    const bool alive_ok = s.alive_lease != 0 && store_->KeepAlive(s.alive_lease, 0).ok();
    const bool present_ok = s.present_lease != 0 && store_->KeepAlive(s.present_lease, 0).ok();
    was_down = was_down || !alive_ok;
    if (!alive_ok || !present_ok) {
      Server next = s;
      StoreChange c;
      auto fresh = [&](uint64_t ttl_ms, int64_t* lease, std::vector<std::pair<std::string, int64_t>>* put) -> Status {
        auto l = store_->Grant(ttl_ms);
        if (!l.ok()) return Unavailable("the pool's store cannot be reached: " + l.status().message());
        *lease = *l;
        put->emplace_back(id, *l);
        return Status();
      };
      if (!alive_ok) {
        if (Status st = fresh(opts_.server_timeout_ms, &next.alive_lease, &c.put_alive); !st.ok()) return st;
      }
      if (!present_ok) {
        if (Status st = fresh(opts_.server_release_ms, &next.present_lease, &c.put_present); !st.ok()) return st;
      }
      next.up = true;
      c.put_servers.push_back(StoreDoc(next));
      // A concurrent write to the server's document (another controller took this heartbeat's
      // predecessor): this one fails cleanly and the next heartbeat tries again.
      c.guards.emplace_back("servers/" + id, Version("servers/" + id));
      if (Status st = Apply(c); !st.ok()) {
        if (!alive_ok) store_->Revoke(next.alive_lease);
        if (!present_ok) store_->Revoke(next.present_lease);
        return st.code() == Code::kAlreadyExists ? Unavailable("server " + id + " was updated concurrently; try again")
                                                 : st;
      }
      s = next;
    }
  }
  s.last_seen_ms = now;
  s.up = true;
  Json revoked = Json::array(), moves = Json::array();
  for (const ServerHeartbeat::Held& held : beat.allocations) {
    auto a = allocs_.find(held.id);
    if (a != allocs_.end() && a->second.move_to == id) continue;  // the target of its move holds a copy
    if (a == allocs_.end() || a->second.server != id) {
      revoked.push_back(held.id);
      continue;
    }
    if (!a->second.move_to.empty()) {
      moves.push_back({{"id", held.id}, {"to", a->second.move_to}});
      a->second.move_told_ms = now;
    }
    if (a->second.kind == "process") {
      auto left = store_->KeepAlive(a->second.lease, opts_.lease_ttl_ms);
      if (!left.ok() && left.status().code() == Code::kNotFound) {
        revoked.push_back(held.id);  // its etcd lease lapsed: etcd has dropped it
        continue;
      }
      a->second.lease_expires_ms = now + (left.ok() ? *left : opts_.lease_ttl_ms);
    }
    for (size_t i = 0; i < held.used_mib.size() && i < a->second.slots.size(); ++i) {
      if (held.used_mib[i]) a->second.slots[i].used_mib = *held.used_mib[i];
    }
  }
  if (was_down && !store_->shared()) {
    StoreChange c;
    c.put_servers.push_back(StoreDoc(s));
    if (Status st = Apply(c); !st.ok()) return st;
  }
  return Json{{"server", id}, {"revoked", revoked}, {"moves", moves}, {"back", was_down}};
}

Result<Json> Service::DeregisterServer(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return Transact([&](int) -> Result<Json> {
    auto it = servers_.find(id);
    if (it == servers_.end()) return NotFound("server " + id + " is not registered");
    Json released = Json::array();
    std::vector<std::string> drop;
    for (const auto& [aid, a] : allocs_) {
      if (a.server == id && a.kind == "process") drop.push_back(aid);
    }
    Server next = it->second;
    next.up = false;
    StoreChange c;
    c.put_servers.push_back(StoreDoc(next));
    if (store_->shared()) c.guards.emplace_back("servers/" + id, Version("servers/" + id));
    for (const auto& aid : drop) {
      EraseInto(allocs_[aid], &c);
      released.push_back(aid);
    }
    if (Status st = Apply(c); !st.ok()) return st;
    store_->Revoke(next.alive_lease);  // etcd: the alive and present keys go with their leases
    store_->Revoke(next.present_lease);
    it->second = next;
    for (const auto& aid : drop) {
      store_->Revoke(allocs_[aid].lease);
      UnreserveLocked(allocs_[aid]);
      allocs_.erase(aid);
    }
    return Json{{"server", id}, {"released", released}};
  });
}

Json Service::Servers() {
  std::lock_guard<std::mutex> lock(mu_);
  SyncForRead();
  Json out = Json::array();
  for (const auto& [id, s] : servers_) {
    Json j = ToJson(s);
    const pool::VgpuPool& pool = PoolOf(s);
    j["vgpus_total"] = pool.total_vgpus();
    j["vgpus_free"] = pool.free_vgpus();
    Json used = Json::array();
    for (size_t i = 0; i < s.gpus.size(); ++i) used.push_back(pool.used_bytes(i) >> 20);
    j["gpu_allocated_mib"] = used;
    out.push_back(std::move(j));
  }
  return out;
}

Result<Service::Allocation> Service::Place(const PlacementRequest& req, const std::string& kind,
                                           const std::string& exclude) {
  const std::string& server = req.server;
  const uint64_t vgpus = req.vgpus, gmem = req.gmem_mib, ratio = req.ratio;
  Allocation a;
  std::vector<const Server*> cands;
  for (const auto& [id, s] : servers_) {
    if (s.up && !s.draining && id != exclude && (server.empty() || id == server)) cands.push_back(&s);
  }
  if (cands.empty()) {
    if (!server.empty() && servers_.count(server) != 0 && servers_.at(server).draining)
      return Unavailable("server " + server + " is draining (POST /v1/servers/{id}/drain): it takes no new sessions");
    return Unavailable(server.empty() ? (exclude.empty() ? "no Orion server is up" : "no other Orion server is up")
                                      : "server " + server + " is not registered or not up");
  }
  uint64_t largest_gpu = 0, largest_server_mem = 0;
  uint32_t largest_server_vgpus = 0;
  std::vector<pool::VgpuPool*> pools;
  pools.reserve(cands.size());
  for (const Server* s : cands) {
    pools.push_back(&pools_.at(s->id));
    const pool::VgpuPool& p = *pools.back();
    uint64_t mem = 0;
    for (const Gpu& g : s->gpus) {
      largest_gpu = std::max(largest_gpu, g.memory_mib);
      mem += g.memory_mib;
    }
    largest_server_mem = std::max(largest_server_mem, mem);
    largest_server_vgpus = std::max(largest_server_vgpus, p.total_vgpus());
  }
  if (gmem > largest_gpu) {
    return InvalidArgument("ORION_GMEM=" + std::to_string(gmem) + " MiB is more than any GPU has (" +
                           std::to_string(largest_gpu) + " MiB)");
  }
  if (vgpus > largest_server_vgpus) {
    return InvalidArgument("ORION_VGPU=" + std::to_string(vgpus) + " is more than any server holds (" +
                           std::to_string(largest_server_vgpus) + " vGPUs)");
  }
  if (gmem != 0 && vgpus * gmem > largest_server_mem) {
    return InvalidArgument(std::to_string(vgpus) + " x " + std::to_string(gmem) +
                           " MiB is more than any server's GPU memory (" + std::to_string(largest_server_mem) +
                           " MiB)");
  }
  std::vector<size_t> idx(cands.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  auto fill = [&](size_t i) {
    const uint64_t total = pools[i]->total_bytes();
    return total == 0 ? 1.0 : static_cast<double>(pools[i]->used_bytes()) / static_cast<double>(total);
  };
  // pack: the fullest server that still fits (Orion's rule); spread: the emptiest.
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
    return opts_.policy == pool::PlacementPolicy::kPack ? fill(x) > fill(y) : fill(x) < fill(y);
  });
  std::string why;
  for (size_t i : idx) {
    // Admit takes the slots in the cached pool only when it succeeds; the caller gives them back
    // (UnreserveLocked) if the allocation is not stored.
    auto got = pools[i]->Admit(static_cast<uint32_t>(vgpus), gmem, opts_.policy, static_cast<uint32_t>(ratio));
    if (!got.ok()) {
      why += (why.empty() ? "" : "; ") + cands[i]->id + ": " + std::to_string(pools[i]->free_vgpus()) + " of " +
             std::to_string(pools[i]->total_vgpus()) + " vGPUs free, " +
             std::to_string((pools[i]->total_bytes() - pools[i]->used_bytes()) >> 20) + " MiB unallocated";
      if (ratio != 0) why += ", at most " + std::to_string(pools[i]->most_compute_left()) + "% of a GPU's compute left";
      continue;
    }
    a.id = NewId();
    a.kind = kind;
    a.server = cands[i]->id;
    a.vgpus = static_cast<uint32_t>(vgpus);
    a.gmem_mib = (*got)[0].quota_bytes >> 20;
    a.ratio = static_cast<uint32_t>(ratio);  // 0: best effort (compute share: not counted, not promised)
    a.created_ms = WallMs();
    a.lease_expires_ms = kind == "vm" ? 0 : a.created_ms + opts_.lease_ttl_ms;
    for (const auto& p : *got) a.slots.push_back({p.pgpu, p.vgpu, p.quota_bytes >> 20, 0});
    return a;
  }
  return ResourceExhausted(
      "no server has " + std::to_string(vgpus) + " free vGPU(s) of " +
      (gmem == 0 ? std::string("the default size") : std::to_string(gmem) + " MiB") +
      (ratio != 0 ? " with ORION_RATIO=" + std::to_string(ratio) + "% of a GPU's compute each" : "") + " now (" + why +
      ")");
}

Result<Json> Service::PlaceAndStore(const AllocationRequest& req, const std::string& kind, const Caller& caller,
                                    const std::string& vm) {
  const std::string& server = req.server;
  const std::string& request_id = req.request_id;  // the client's idempotency key
  int64_t lease = 0;                               // granted once, kept across retries
  auto placed = Transact(
      [&](int attempt) -> Result<Json> {
        if (kind == "vm") {
          // Assigned already (by this controller, or by another one that won the vms/<name> guard).
          auto existing = ExistingAssignmentLocked(vm, req);
          if (existing.ok() || existing.status().code() != Code::kNotFound) {
            store_->Revoke(lease);
            return existing;
          }
        }
        if (!request_id.empty()) {
          // Asked before (through this controller or another): the answer is the allocation it made.
          for (const auto& [id, x] : allocs_) {
            if (x.request_id != request_id) continue;
            if (lease != 0 && lease != x.lease) store_->Revoke(lease);
            if (x.kind != "process" || !caller.Same(x.owner)) {
              ++refusals_;
              return InvalidArgument("request_id " + request_id + " names another client's allocation");
            }
            ++replays_;
            return ToJson(x);
          }
          if (RequestSeenLocked(request_id)) {
            // Placed before, and its allocation released or expired since: a late repeat, whose client
            // is done with it. Nothing is placed again.
            store_->Revoke(lease);
            ++refusals_;
            return NotFound("request_id " + request_id +
                            " was placed already and its allocation has been released or "
                            "has expired; a new request needs a new request_id");
          }
        }
        // A client key's budget: live allocations, vGPUs across them, memory across them.
        const bool limited = kind == "process" && caller.kind == Caller::Kind::kClient;
        uint64_t held_vgpus = 0, held_mib = 0;
        if (limited) {
          uint32_t held = 0;
          for (const auto& [id, x] : allocs_) {
            if (x.kind != "process" || !caller.Same(x.owner)) continue;
            ++held;
            held_vgpus += x.vgpus;
            for (const Slot& sl : x.slots) held_mib += sl.gmem_mib;
          }
          if (held >= opts_.max_allocations_per_key) {
            ++refusals_;
            store_->Revoke(lease);
            return Status(Code::kOutOfRange, "this key holds " + std::to_string(held) +
                                                 " live allocations, its limit (max_allocations_per_key " +
                                                 std::to_string(opts_.max_allocations_per_key) +
                                                 "); release one first");
          }
          const uint64_t vgpus = req.vgpus;
          if (opts_.max_vgpus_per_key != 0 && held_vgpus + vgpus > opts_.max_vgpus_per_key) {
            ++refusals_;
            store_->Revoke(lease);
            return Status(Code::kOutOfRange, "this key holds " + std::to_string(held_vgpus) + " vGPUs; " +
                                                 std::to_string(vgpus) +
                                                 " more would pass its limit (max_vgpus_per_key " +
                                                 std::to_string(opts_.max_vgpus_per_key) + "); release some first");
          }
        }
        auto a = Place(req, kind);
        if (!a.ok()) {
          ++refusals_;
          store_->Revoke(lease);
          return a.status();
        }
        if (limited && opts_.max_gmem_mib_per_key != 0) {
          // After placement: a request for the default size (gmem_mib 0) has its size only now.
          uint64_t mib = 0;
          for (const Slot& sl : a->slots) mib += sl.gmem_mib;
          if (held_mib + mib > opts_.max_gmem_mib_per_key) {
            UnreserveLocked(*a);
            ++refusals_;
            store_->Revoke(lease);
            return Status(Code::kOutOfRange, "this key holds " + std::to_string(held_mib) + " MiB of GPU memory; " +
                                                 std::to_string(mib) +
                                                 " MiB more would pass its limit (max_gmem_mib_per_key " +
                                                 std::to_string(opts_.max_gmem_mib_per_key) + "); release some first");
          }
        }
        if (kind == "vm") {
          a->vm = vm;
          a->state = "active";
          a->client_host = vm;
        } else {
          a->owner = caller.owner;
          a->client_host = req.client_host;
          a->client_process = req.client_process;
          a->client_pid = req.client_pid;
          a->job = req.job;
          if (!a->job.empty()) {
            a->state = "held";  // its holder renews it; sessions come and go (Confirm)
          } else if (!server.empty()) {
            a->state = "active";  // oriond asked for its own client: it is serving it now
            a->session = req.session;
          }
          if (store_->shared() && lease == 0) {
            // The allocation's lease is an etcd lease: if nobody renews it, etcd drops the allocation.
            auto l = store_->Grant(opts_.lease_ttl_ms);
            if (!l.ok()) {
              UnreserveLocked(*a);
              return Unavailable("the pool's store cannot be reached: " + l.status().message());
            }
            lease = *l;
          }
          a->lease = lease;
          a->request_id = request_id;
        }
        StoreChange c;
        PlaceInto(*a, &c);
        if (!a->request_id.empty() && store_->shared()) {
          auto rl = RequestLeaseLocked();
          if (!rl.ok()) {
            UnreserveLocked(*a);
            store_->Revoke(lease);
            return Unavailable("the pool's store cannot be reached: " + rl.status().message());
          }
          c.put_requests.push_back({a->request_id, a->id, *rl});
        }
        Status st = Apply(c);
        if (st.ok()) {
          ++allocations_made_;
          if (!a->request_id.empty() && !store_->shared()) {
            const uint64_t until = WallMs() + kRequestMemoryMs;
            if (recent_requests_.size() >= kMaxRecentRequests) {
              recent_requests_.erase(recent_by_expiry_.begin()->second);
              recent_by_expiry_.erase(recent_by_expiry_.begin());
            }
            recent_requests_[a->request_id] = until;
            recent_by_expiry_.emplace(until, a->request_id);
          }
          Json doc = ToJson(*a);
          allocs_[a->id] = std::move(*a);
          return doc;
        }
        UnreserveLocked(*a);
        if (st.code() == Code::kNotFound && request_lease_ != 0 && attempt + 1 < kMaxAttempts) {
          request_lease_ = 0;  // a lease named in it lapsed (the request-memory one, after a long pause): again
          return Status(Code::kAlreadyExists, st.message());
        }
        // kAlreadyExists: another controller placed on the same GPU first; Transact decides again.
        if (st.code() != Code::kAlreadyExists || attempt + 1 >= kMaxAttempts) store_->Revoke(lease);
        return st;
      },
      [&] { store_->Revoke(lease); });
  if (CodeOf(placed) == Code::kAlreadyExists) {
    return Unavailable("the pool is too busy: placement lost " + std::to_string(kMaxAttempts) +
                       " races in a row; try again");
  }
  return placed;
}

bool Service::RequestSeenLocked(const std::string& request_id) {
  if (store_->shared()) return versions_.count(RequestPath(request_id)) != 0;
  const uint64_t now = WallMs();
  while (!recent_by_expiry_.empty() && recent_by_expiry_.begin()->first <= now) {
    recent_requests_.erase(recent_by_expiry_.begin()->second);
    recent_by_expiry_.erase(recent_by_expiry_.begin());
  }
  return recent_requests_.count(request_id) != 0;
}

Result<int64_t> Service::RequestLeaseLocked() {
  const uint64_t now = WallMs();
  if (request_lease_ == 0 || now >= request_lease_ms_ + kRequestMemoryMs / 2) {
    auto l = store_->Grant(kRequestMemoryMs);
    if (!l.ok()) return l.status();
    request_lease_ = *l;
    request_lease_ms_ = now;
  }
  return request_lease_;
}

Result<Json> Service::Allocate(const AllocationRequest& req, const Caller& caller) {
  // vGPUs held only by allocations whose clients have exited ("releasing": their servers end the
  // sessions and release them within moments) are as good as free: a request that does not fit only
  // because of them waits for them, up to kReleasingWaitMs, instead of being refused. (A CI run once
  // refused 2 of 36 clients in a burst while 4 such releases were in flight.)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReleasingWaitMs);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto r = PlaceAndStore(req, "process", caller, "");
    if (r.ok() || r.status().code() != Code::kResourceExhausted || !req.server.empty() ||
        std::chrono::steady_clock::now() >= deadline)
      return r;
    bool releasing = false;
    for (const auto& [id, a] : allocs_) releasing |= a.state == "releasing";
    if (!releasing) return r;
    --refusals_;  // counted once, when it is final
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    lock.lock();
  }
}

Result<Json> Service::Confirm(const std::string& id, const SessionConfirmation& conf) {
  const std::string& server = conf.server;
  const uint32_t session = conf.session;
  std::lock_guard<std::mutex> lock(mu_);
  return Transact([&](int) -> Result<Json> {
    auto it = allocs_.find(id);
    if (it == allocs_.end()) return NotFound("allocation " + id + " does not exist (released or expired)");
    Allocation& a = it->second;
    if (a.kind != "process") return InvalidArgument("allocation " + id + " is a VM assignment");
    if (a.server != server && !a.move_to.empty() && a.move_to == server) {
      // The target of the allocation's move admits the moving session: on the reservation's vGPUs.
      // Nothing changes until it reports the program resumed there (MoveOutcome).
      const Allocation* b = ReservationOf(a);
      if (b == nullptr) return FailedPrecondition("allocation " + id + "'s move to " + server + " has no reservation");
      Allocation view = a;
      view.server = b->server;
      view.slots = b->slots;
      view.session = session;
      return ToJson(view);
    }
    if (a.server != server)
      return InvalidArgument("allocation " + id + " is placed on " + a.server + ", not " + server);
    if (a.state == "releasing")
      return FailedPrecondition("allocation " + id + " is being released (its client exited)");
    if (!a.job.empty()) {
      // A job's allocation: every session of the job may use it, at once or one after another.
      if (store_->shared()) (void)store_->KeepAlive(a.lease, opts_.lease_ttl_ms);
      a.lease_expires_ms = std::max(a.lease_expires_ms, WallMs() + opts_.lease_ttl_ms);
      return ToJson(a);
    }
    if (a.state == "active" && a.session != 0 && a.session != session) {
      return InvalidArgument("allocation " + id + " is already used by session " + std::to_string(a.session));
    }
    Allocation next = a;
    next.state = "active";
    next.session = session;
    next.lease_expires_ms = WallMs() + opts_.lease_ttl_ms;
    StoreChange c;
    c.put_allocations.emplace_back(StoreDoc(next), next.lease);
    if (store_->shared()) {
      c.guards.emplace_back(AllocPath(id), Version(AllocPath(id)));
      (void)store_->KeepAlive(next.lease, opts_.lease_ttl_ms);  // a fresh period from the confirmation
    }
    Status st = Apply(c);
    if (st.code() == Code::kNotFound) return NotFound("allocation " + id + " expired (its lease lapsed)");
    if (!st.ok()) return st;
    a = next;
    return ToJson(a);
  });
}

Service::Allocation* Service::ReservationOf(const Allocation& a) {
  if (a.move_reservation.empty()) return nullptr;
  auto it = allocs_.find(a.move_reservation);
  return it == allocs_.end() || it->second.move_of != a.id ? nullptr : &it->second;
}

Result<Json> Service::AskMoveLocked(const std::string& id, const std::string& to, const std::string& from) {
  return Transact([&](int) -> Result<Json> {
    auto it = allocs_.find(id);
    if (it == allocs_.end()) return NotFound("allocation " + id + " does not exist (released or expired)");
    Allocation& a = it->second;
    if (a.kind != "process")
      return InvalidArgument("allocation " + id + " is VM " + a.vm + "'s assignment: a VM's vGPUs move with the VM");
    if (!a.move_of.empty())
      return InvalidArgument("allocation " + id + " is the reservation of allocation " + a.move_of + "'s move");
    if (!a.job.empty())
      return FailedPrecondition("allocation " + id + " is job " + a.job + "'s: a job's sessions cannot move yet");
    if (a.state != "active" || a.session == 0)
      return FailedPrecondition("allocation " + id + " is " + a.state +
                                ": only an allocation a session serves can move");
    if (!a.move_to.empty()) return FailedPrecondition("allocation " + id + " is moving to " + a.move_to + " already");
    if (!from.empty() && a.server != from)
      return FailedPrecondition("allocation " + id + " is on " + a.server + " now");
    if (to == a.server) return InvalidArgument("allocation " + id + " is on " + a.server + " already");
    if (!to.empty()) {
      auto t = servers_.find(to);
      if (t == servers_.end() || !t->second.up)
        return FailedPrecondition("server " + to + " is not registered or not up");
    }
    // The same vGPUs at the target: as many, each with the memory it has here, the same compute
    // ratio. No target named (a drain): wherever the placement policy finds room, not here.
    PlacementRequest where;
    where.server = to;
    where.vgpus = a.vgpus;
    where.gmem_mib = a.slots.empty() ? a.gmem_mib : a.slots[0].gmem_mib;
    where.ratio = a.ratio;
    auto b = Place(where, "process", a.server);
    if (!b.ok()) {
      ++refusals_;
      return FailedPrecondition((to.empty() ? std::string("no other server can take allocation ")
                                            : "server " + to + " cannot take allocation ") +
                                id + ": " + b.status().message());
    }
    b->state = "moving";
    b->move_of = id;
    b->owner = a.owner;
    b->client_host = a.client_host;
    b->client_process = a.client_process;
    b->client_pid = a.client_pid;
    b->lease = a.lease;  // etcd: it lapses with the allocation it belongs to
    b->lease_expires_ms = a.lease_expires_ms;
    Allocation next = a;
    next.move_to = b->server;
    next.move_reservation = b->id;
    next.move_asked_ms = WallMs();
    next.move_told_ms = 0;
    next.last_move_to.clear();
    next.last_move_error.clear();
    StoreChange c;
    PlaceInto(*b, &c);
    c.put_allocations.emplace_back(StoreDoc(next), next.lease);
    if (store_->shared()) c.guards.emplace_back(AllocPath(id), Version(AllocPath(id)));
    Status st = Apply(c);
    if (!st.ok()) {
      UnreserveLocked(*b);
      if (st.code() == Code::kNotFound) return NotFound("allocation " + id + " expired (its lease lapsed)");
      return st;
    }
    allocs_[b->id] = std::move(*b);
    a = std::move(next);
    ++moves_asked_;
    NoteDeletionsLocked();  // its server's watch answers with the move
    return ToJson(a);
  });
}

template <typename Done>
void Service::WaitLocked(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline,
                         Done done) {
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (done() || now >= deadline || stop_watch_.load()) return;
    const uint64_t seen = deletions_;
    deleted_.wait_until(lock, std::min(deadline, now + std::chrono::seconds(1)),
                        [&] { return deletions_ != seen || stop_watch_.load(); });
    if (store_->shared()) SyncForRead();  // etcd: another controller may have taken the server's report
  }
}

Json Service::MoveStateLocked(const std::string& id, const std::string& to) const {
  auto it = allocs_.find(id);
  if (it == allocs_.end()) return {{"state", "released"}};
  const Allocation& a = it->second;
  if (a.move_to == to) return {{"state", "moving"}};
  if (a.server == to) return {{"state", "moved"}};
  return {{"state", "failed"}, {"error", a.last_move_to == to ? a.last_move_error : std::string("it was given up")}};
}

Result<Json> Service::Migrate(const std::string& id, const MigrateRequest& req) {
  std::unique_lock<std::mutex> lock(mu_);
  auto asked = AskMoveLocked(id, req.to, "");
  if (!asked.ok() || req.wait_ms == 0) return asked;
  WaitLocked(lock, std::chrono::steady_clock::now() + std::chrono::milliseconds(req.wait_ms), [&] {
    auto it = allocs_.find(id);
    return it == allocs_.end() || it->second.move_to != req.to;
  });
  const Json m = MoveStateLocked(id, req.to);
  if (m["state"] == "released") return NotFound("allocation " + id + " was released during its move");
  if (m["state"] == "failed")
    return FailedPrecondition("the move of allocation " + id + " to " + req.to +
                              " failed: " + m["error"].get<std::string>());
  return ToJson(allocs_.at(id));  // at the target, or (wait_s ran out) still moving
}

Result<Json> Service::Drain(const std::string& server, bool on, uint64_t wait_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  auto marked = Transact([&](int) -> Result<Json> {
    auto it = servers_.find(server);
    if (it == servers_.end()) return NotFound("server " + server + " is not registered");
    if (it->second.draining == on) return Json::object();
    Server next = it->second;
    next.draining = on;
    StoreChange c;
    c.put_servers.push_back(StoreDoc(next));
    if (store_->shared()) c.guards.emplace_back("servers/" + server, Version("servers/" + server));
    if (Status st = Apply(c); !st.ok()) return st;
    it->second = next;
    return Json::object();
  });
  if (!marked.ok()) return marked;
  Json out = {{"server", server}, {"draining", on}, {"moves", Json::array()}, {"staying", Json::array()}};
  if (!on) return out;
  // Every allocation a session serves here moves where the pool has room; the others stay, and
  // the answer says why (a VM's assignment, a job's, a pending one, one moving already).
  std::vector<std::string> ids;
  for (const auto& [id, a] : allocs_) {
    if (a.server == server && a.move_of.empty()) ids.push_back(id);
  }
  std::map<std::string, std::string> moving;  // id -> target
  for (const auto& id : ids) {
    auto r = AskMoveLocked(id, "", server);
    if (r.ok()) {
      moving[id] = (*r)["move"]["to"].get<std::string>();
    } else if (r.status().code() != Code::kNotFound) {  // gone meanwhile: nothing to move
      out["staying"].push_back({{"id", id}, {"why", r.status().message()}});
    }
  }
  WaitLocked(lock, std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms), [&] {
    return std::none_of(moving.begin(), moving.end(),
                        [&](const auto& m) { return MoveStateLocked(m.first, m.second)["state"] == "moving"; });
  });
  for (const auto& [id, to] : moving) {
    Json m = MoveStateLocked(id, to);
    m["id"] = id;
    m["to"] = to;
    out["moves"].push_back(m);
  }
  return out;
}

Result<Json> Service::MoveOutcome(const std::string& id, const MoveReport& report) {
  std::lock_guard<std::mutex> lock(mu_);
  return Transact([&](int) -> Result<Json> {
    auto it = allocs_.find(id);
    if (it == allocs_.end()) return NotFound("allocation " + id + " does not exist (released or expired)");
    Allocation& a = it->second;
    if (a.move_to.empty()) {
      // Over already: a report that crossed another one, or came again.
      if (report.committed && a.server == report.server) return ToJson(a);
      return FailedPrecondition("allocation " + id + " is not moving");
    }
    if (report.server != a.server && report.server != a.move_to) {
      return Status(
          Code::kPermissionDenied,
          "server " + report.server + " is neither the source nor the target of allocation " + id + "'s move");
    }
    if (report.committed) {
      if (report.server != a.move_to) return Status(Code::kPermissionDenied, "only the target of a move commits it");
      if (Status st = CommitMoveLocked(a, report.session); !st.ok()) return st;
    } else {
      const std::string who = report.server == a.server ? "the source" : "the target";
      if (Status st = CancelMoveLocked(a, who + ": " + (report.error.empty() ? "failed" : report.error)); !st.ok())
        return st;
    }
    return ToJson(allocs_.at(id));
  });
}

Status Service::CommitMoveLocked(Allocation& a, uint32_t session) {
  Allocation* b = ReservationOf(a);
  if (b == nullptr) return FailedPrecondition("allocation " + a.id + "'s move has no reservation");
  Allocation next = a;
  next.server = b->server;
  next.slots = b->slots;
  next.session = session;
  next.move_to.clear();
  next.move_reservation.clear();
  next.move_asked_ms = next.move_told_ms = 0;
  StoreChange c;
  c.put_allocations.emplace_back(StoreDoc(next), next.lease);  // etcd: its vGPU keys at the target now name it
  Json reservation = StoreDoc(*b);
  reservation["placements"] = Json::array();  // so its erasure leaves those keys
  c.erase_allocations.push_back(reservation);
  for (const Slot& sl : a.slots) c.erase_paths.push_back(SlotPath(a.server, sl.pgpu, sl.vgpu));
  if (store_->shared()) {
    c.guards.emplace_back(AllocPath(a.id), Version(AllocPath(a.id)));
    c.guards.emplace_back(AllocPath(b->id), Version(AllocPath(b->id)));
  }
  Status st = Apply(c);
  if (st.code() == Code::kNotFound) return NotFound("allocation " + a.id + " expired (its lease lapsed)");
  if (!st.ok()) return st;
  UnreserveLocked(a);  // the source's vGPUs; the target's stay taken, by it now
  const std::string reservation_id = b->id;
  a = std::move(next);
  allocs_.erase(reservation_id);
  ++moves_done_;
  NoteDeletionsLocked();  // the source's watch hears its allocation is gone from it
  return Status();
}

Status Service::CancelMoveLocked(Allocation& a, const std::string& why) {
  Allocation* b = ReservationOf(a);
  Allocation next = a;
  next.last_move_to = a.move_to;
  next.last_move_error = why;
  next.move_to.clear();
  next.move_reservation.clear();
  next.move_asked_ms = next.move_told_ms = 0;
  StoreChange c;
  c.put_allocations.emplace_back(StoreDoc(next), next.lease);
  if (store_->shared()) c.guards.emplace_back(AllocPath(a.id), Version(AllocPath(a.id)));
  if (b != nullptr) EraseInto(*b, &c);
  Status st = Apply(c);
  if (st.code() == Code::kNotFound) return NotFound("allocation " + a.id + " expired (its lease lapsed)");
  if (!st.ok()) return st;
  if (b != nullptr) {
    const std::string reservation_id = b->id;
    UnreserveLocked(*b);
    allocs_.erase(reservation_id);
  }
  a = std::move(next);
  ++moves_failed_;
  NoteDeletionsLocked();
  return Status();
}

Result<Json> Service::Renew(const std::string& id, const Caller& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = Sync(); !st.ok()) return st;
  auto it = allocs_.find(id);
  if (it == allocs_.end()) return NotFound("allocation " + id + " does not exist (released or expired)");
  Allocation& a = it->second;
  if (Status st = MayTouch(a, caller, "renew"); !st.ok()) return st;
  if (a.kind == "process") {
    const uint64_t now = WallMs();
    uint64_t until = now + opts_.lease_ttl_ms;
    if (a.state == "pending") {
      // Renewals do not keep an allocation that no server ever confirmed.
      const uint64_t deadline = a.created_ms + opts_.pending_ttl_ms;
      if (now >= deadline) {
        ++expired_;
        (void)ReleaseLocked(id);
        return FailedPrecondition("allocation " + id + " was never confirmed by a server within " +
                                  std::to_string(opts_.pending_ttl_ms / 1000) +
                                  " s (pending_confirm_s); it is released");
      }
      until = std::min(until, deadline);
    }
    if (store_->shared()) {
      auto left = store_->KeepAlive(a.lease, opts_.lease_ttl_ms);
      if (!left.ok()) {
        if (left.status().code() == Code::kNotFound)
          return NotFound("allocation " + id + " expired (its lease lapsed)");
        return Unavailable("the pool's store cannot be reached: " + left.status().message());
      }
      until = std::min(until, now + *left);
    }
    a.lease_expires_ms = until;
  }
  return Json{{"id", id}, {"lease_expires_ms", a.lease_expires_ms}};
}

Status Service::MayTouch(const Allocation& a, const Caller& c, const char* what) {
  switch (c.kind) {
    case Caller::Kind::kOpen:
    case Caller::Kind::kAdmin: return Status();
    case Caller::Kind::kClient:
      if (c.Owns(a.owner)) return Status();
      return Status(Code::kPermissionDenied, "allocation " + a.id + " belongs to another key: a client key may " +
                                                 what + " only the allocations it made");
    case Caller::Kind::kServer:
      if (!c.server.empty() && c.server == a.server) return Status();
      return Status(Code::kPermissionDenied,
                    "allocation " + a.id + " is served by " + a.server + ", not by " +
                        (c.server.empty() ? std::string("an unnamed server (add ?server=ip:port)") : c.server) +
                        ": a server key may " + what + " only the allocations its server serves");
  }
  return Status(Code::kPermissionDenied, "unknown caller");
}

Status Service::ReleaseLocked(const std::string& id) { return ReleaseManyLocked({id}); }

Status Service::ReleaseManyLocked(const std::vector<std::string>& ids) {
  StoreChange c;
  std::vector<std::string> reservations;  // of moves under way: they go with their allocation
  for (const auto& id : ids) {
    auto it = allocs_.find(id);
    if (it == allocs_.end()) return NotFound("allocation " + id + " does not exist (released or expired)");
    EraseInto(it->second, &c);
    if (const Allocation* b = ReservationOf(it->second);
        b != nullptr && std::find(ids.begin(), ids.end(), b->id) == ids.end()) {
      EraseInto(*b, &c);
      reservations.push_back(b->id);
    }
  }
  if (ids.empty()) return Status();
  // A guard failure: one of them changed or went (expired) since the read; the caller's next read
  // sees it.
  if (Status st = Apply(c); !st.ok()) return st;
  for (const auto& id : reservations) {  // on the lease of the allocation they belong to
    auto it = allocs_.find(id);
    UnreserveLocked(it->second);
    allocs_.erase(it);
  }
  for (const auto& id : ids) {
    auto it = allocs_.find(id);
    if (it->second.move_of.empty()) store_->Revoke(it->second.lease);
    UnreserveLocked(it->second);
    allocs_.erase(it);
  }
  return Status();
}

void Service::UnreserveLocked(const Allocation& a) {
  auto p = pools_.find(a.server);
  if (p == pools_.end()) return;
  std::vector<pool::Placement> v;
  for (const Slot& sl : a.slots) v.push_back({sl.pgpu, sl.vgpu, sl.gmem_mib << 20, a.ratio});
  p->second.Release(v);
}

Result<Json> Service::Release(const std::string& id, const std::string& why, const Caller& caller,
                              const std::string& server) {
  std::lock_guard<std::mutex> lock(mu_);
  return Transact([&](int) -> Result<Json> {
    auto it = allocs_.find(id);
    if (it == allocs_.end()) return NotFound("allocation " + id + " does not exist (released or expired)");
    Allocation& a = it->second;
    if (!server.empty() && a.server != server && !a.move_to.empty() && a.move_to == server) {
      // The target's copy of a moving session ended before its program resumed there: the move is
      // over, and the allocation stays where it is.
      if (caller.kind == Caller::Kind::kServer && caller.server != server)
        return Status(Code::kPermissionDenied, "a server key speaks for its own server only");
      if (Status st =
              CancelMoveLocked(a, "the session ended at " + server + " before its program resumed there (" + why + ")");
          !st.ok())
        return st;
      return Json{{"id", id}, {"server", a.server}, {"state", a.state}, {"move", "given up"}};
    }
    if (!server.empty() && a.server != server && caller.kind == Caller::Kind::kOpen) {
      // A server that no longer serves it (its session moved away) does not release it.
      return Json{{"id", id}, {"server", a.server}, {"state", a.state}};
    }
    if (!a.move_of.empty())
      return InvalidArgument("allocation " + id + " is the reservation of allocation " + a.move_of +
                             "'s move: it ends with the move");
    if (Status st = MayTouch(it->second, caller, "release"); !st.ok()) return st;
    if (it->second.kind != "process")
      return InvalidArgument("allocation " + id + " is VM " + it->second.vm + "'s assignment");
    Json j = {{"id", id}, {"server", it->second.server}, {"released", why}};
    if (!server.empty() && !it->second.job.empty()) {
      j["state"] = it->second.state;  // a session of the job ended: the job still holds its vGPUs
      j.erase("released");
      return j;
    }
    if (server.empty() && why == "client_exited" && (it->second.state == "active" || it->second.state == "releasing")) {
      j["state"] = "releasing";
      if (it->second.state == "releasing") return j;
      Allocation next = it->second;
      next.state = "releasing";
      StoreChange c;
      c.put_allocations.emplace_back(StoreDoc(next), next.lease);
      if (store_->shared()) c.guards.emplace_back(AllocPath(id), Version(AllocPath(id)));
      Status st = Apply(c);
      if (st.code() == Code::kNotFound) return NotFound("allocation " + id + " expired (its lease lapsed)");
      if (!st.ok()) return st;
      it->second = next;
      return j;
    }
    if (Status st = ReleaseLocked(id); !st.ok()) return st;  // kAlreadyExists: changed meanwhile, read again
    return j;
  });
}

Result<Json> Service::WatchRevoked(const std::string& server, const WatchRequest& watch) {
  const std::vector<std::string>& ids = watch.allocations;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(watch.timeout_ms);
  std::unique_lock<std::mutex> lock(mu_);
  if (watchers_ >= kMaxWatchers) {
    return Status(Code::kOutOfRange, std::to_string(kMaxWatchers) + " watches are open already; rely on heartbeats");
  }
  ++watchers_;
  struct Leave {
    int* n;
    ~Leave() { --*n; }
  } leave{&watchers_};
  for (bool first = true;; first = false) {
    const uint64_t seen = deletions_;
    // The store is read when the watch starts, then once per batch of deletions however many
    // watches wake for it: the first to wake reads, the others see what it read.
    if (first || seen != deletions_read_) {
      if (Status st = Sync(); !st.ok()) return st;
      deletions_read_ = seen;
    }
    Json revoked = Json::array(), moves = Json::array();
    const uint64_t now = WallMs();
    for (const auto& id : ids) {
      auto it = allocs_.find(id);
      if (it != allocs_.end() && it->second.move_to == server) continue;  // a moving session's target
      if (it == allocs_.end() || it->second.server != server) {
        revoked.push_back(id);
      } else if (!it->second.move_to.empty() && now >= it->second.move_told_ms + kMoveAnnounceMs) {
        moves.push_back({{"id", id}, {"to", it->second.move_to}});
        it->second.move_told_ms = now;
      }
    }
    if (!revoked.empty() || !moves.empty() || std::chrono::steady_clock::now() >= deadline)
      return Json{{"revoked", revoked}, {"moves", moves}};
    deleted_.wait_until(lock, deadline, [&] { return deletions_ != seen || stop_watch_.load(); });
    if (stop_watch_.load()) return Json{{"revoked", Json::array()}, {"moves", Json::array()}};
  }
}

Result<Json> Service::GetAllocation(const std::string& id, const Caller& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = Sync(); !st.ok()) return st;
  auto it = allocs_.find(id);
  if (it == allocs_.end()) return NotFound("allocation " + id + " does not exist (released or expired)");
  // Servers read any allocation (they are trusted with the pool's state); clients only their own.
  if (caller.kind == Caller::Kind::kClient) {
    if (Status st = MayTouch(it->second, caller, "read"); !st.ok()) return st;
  }
  return ToJson(it->second);
}

Json Service::ListAllocations(const std::string& host, const std::string& kind, const Caller& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  SyncForRead();
  Json out = Json::array();
  for (const auto& [id, a] : allocs_) {
    if (caller.kind == Caller::Kind::kClient && !caller.Same(a.owner)) continue;
    if (!host.empty() && a.client_host != host) continue;
    if (!kind.empty() && a.kind != kind) continue;
    out.push_back(ToJson(a));
  }
  return out;
}

Result<Json> Service::Assign(const std::string& vm, const AssignmentRequest& req) {
  if (!ValidVmName(vm)) return InvalidArgument("VM name '" + vm + "' must be 1..64 of [A-Za-z0-9._-]");
  AllocationRequest placement;
  static_cast<PlacementRequest&>(placement) = req;
  std::lock_guard<std::mutex> lock(mu_);
  // PlaceAndStore answers an existing assignment of `vm` (ExistingAssignmentLocked) after each read.
  return PlaceAndStore(placement, "vm", Caller{}, vm);
}

Result<Json> Service::ExistingAssignmentLocked(const std::string& vm, const PlacementRequest& req) {
  for (const auto& [id, a] : allocs_) {
    if (a.kind != "vm" || a.vm != vm) continue;
    if ((req.server.empty() || a.server == req.server) && a.vgpus == req.vgpus &&
        (req.gmem_mib == 0 || req.gmem_mib == a.gmem_mib) && a.ratio == req.ratio) {
      return ToJson(a);  // idempotent: the same VM asking again gets its vGPUs
    }
    return ResourceExhausted("VM " + vm + " already holds " + std::to_string(a.vgpus) + " x " +
                             std::to_string(a.gmem_mib) + " MiB on " + a.server +
                             (a.ratio != 0 ? " with " + std::to_string(a.ratio) + "% of a GPU's compute" : ""));
  }
  return NotFound("no assignment");
}

Result<Json> Service::Unassign(const std::string& vm) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = Sync(); !st.ok()) return st;
  for (const auto& [id, a] : allocs_) {
    if (a.kind == "vm" && a.vm == vm) {
      Json j = ToJson(a);
      if (Status st = ReleaseLocked(std::string(id)); !st.ok()) return st;
      return j;
    }
  }
  return NotFound("VM " + vm + " has no assignment");
}

Json Service::Summary() {
  std::lock_guard<std::mutex> lock(mu_);
  SyncForRead();
  uint32_t total = 0, free = 0, up = 0;
  for (const auto& [id, s] : servers_) {
    if (!s.up) continue;
    ++up;
    const pool::VgpuPool& p = PoolOf(s);
    total += p.total_vgpus();
    free += p.free_vgpus();
  }
  size_t vms = 0;
  for (const auto& [id, a] : allocs_) vms += a.kind == "vm";
  return Json{{"servers", servers_.size()},
              {"servers_up", up},
              {"vgpus_total", total},
              {"vgpus_free", free},
              {"vgpus_used", total - free},
              {"allocations", allocs_.size() - vms},
              {"assignments", vms},
              {"policy", opts_.policy == pool::PlacementPolicy::kPack ? "pack" : "spread"},
              {"lease_ttl_ms", opts_.lease_ttl_ms},
              {"store", {{"kind", store_->kind()}, {"reachable", store_ok_}}}};
}

std::string Service::Metrics() {
  std::lock_guard<std::mutex> lock(mu_);
  SyncForRead();
  std::string out;
  // One metric family: HELP and TYPE, then its samples ("{labels} value" or " value").
  auto family = [&](const char* name, const char* type, const char* help, const std::vector<std::string>& samples) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (const auto& v : samples) out += name + v + "\n";
  };
  auto num = [](uint64_t v) { return " " + std::to_string(v); };
  uint32_t total = 0, free = 0, up = 0;
  std::vector<std::string> gpu_total, gpu_alloc, gpu_used;
  for (const auto& [id, s] : servers_) {
    const pool::VgpuPool& p = PoolOf(s);
    if (s.up) {
      ++up;
      total += p.total_vgpus();
      free += p.free_vgpus();
    }
    for (size_t i = 0; i < s.gpus.size(); ++i) {
      const std::string lbl =
          "{server=\"" + id + "\",gpu=\"" + std::to_string(s.gpus[i].index) + "\",name=\"" + s.gpus[i].name + "\"}";
      uint64_t used = 0;
      for (const auto& [aid, a] : allocs_) {
        if (a.server != id) continue;
        for (const Slot& sl : a.slots) used += sl.pgpu == s.gpus[i].index ? sl.used_mib : 0;
      }
      gpu_total.push_back(lbl + num(s.gpus[i].memory_mib));
      gpu_alloc.push_back(lbl + num(p.used_bytes(i) >> 20));
      gpu_used.push_back(lbl + num(used));
    }
  }
  size_t vms = 0;
  for (const auto& [id, a] : allocs_) vms += a.kind == "vm";
  family("orion_vgpus_total", "gauge", "vGPUs on servers that are up", {num(total)});
  family("orion_vgpus_free", "gauge", "free vGPUs on servers that are up", {num(free)});
  family("orion_vgpus_used", "gauge", "vGPUs held by allocations and assignments on servers that are up",
         {num(total - free)});
  family("orion_servers", "gauge", "registered servers by state",
         {"{state=\"up\"}" + num(up), "{state=\"down\"}" + num(servers_.size() - up)});
  family("orion_allocations", "gauge", "live allocations by kind",
         {"{kind=\"process\"}" + num(allocs_.size() - vms), "{kind=\"vm\"}" + num(vms)});
  family("orion_allocations_created_total", "counter", "allocations and assignments made since start",
         {num(allocations_made_)});
  family("orion_allocation_refusals_total", "counter", "requests refused since start", {num(refusals_)});
  family("orion_allocation_replays_total", "counter",
         "allocation requests sent again with the same request_id, answered with the allocation already made",
         {num(replays_)});
  family("orion_allocations_expired_total", "counter", "allocations released because nobody renewed their lease",
         {num(expired_)});
  family("orion_allocation_moves_total", "counter",
         "live migrations of allocations' sessions (POST /v1/allocations/{id}/migrate) by how they ended",
         {"{result=\"asked\"}" + num(moves_asked_), "{result=\"committed\"}" + num(moves_done_),
          "{result=\"failed\"}" + num(moves_failed_)});
  family("orion_gpu_memory_total_mib", "gauge", "physical GPU memory", gpu_total);
  family("orion_gpu_memory_allocated_mib", "gauge", "vGPU quota placed on the GPU", gpu_alloc);
  family("orion_gpu_memory_used_mib", "gauge", "memory the GPU's sessions use (oriond's heartbeats)", gpu_used);
  const std::string kind = std::string("{store=\"") + store_->kind() + "\"}";
  family("orion_controller_store_up", "gauge", "this controller reached its store at its last read or write",
         {kind + num(store_ok_ ? 1 : 0)});
  family("orion_controller_store_conflicts_total", "counter",
         "this controller's placements and updates that lost a race to another controller and were retried",
         {kind + num(conflicts_)});
  family("orion_controller_store_errors_total", "counter", "this controller's store reads and writes that failed",
         {kind + num(store_errors_)});
  return out;
}

std::vector<std::string> Service::Sweep(uint64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> did;
  std::vector<std::string> drop;
  if (store_->shared()) {
    // etcd keeps the time: leases lapse there (allocations, servers' alive and present keys). What
    // is left here: allocations of servers gone for server_release, and never-confirmed ones.
    std::set<std::string> was_up;
    for (const auto& [id, s] : servers_) {
      if (s.up) was_up.insert(id);
    }
    const bool was_ok = store_ok_;
    if (Status st = Sync(); !st.ok()) {
      if (was_ok) did.push_back(st.message() + "; placements fail (503) until it is back");
      return did;
    }
    if (!was_ok) did.push_back(std::string("the pool's store (") + store_->kind() + ") is reachable again");
    for (const auto& [id, s] : servers_) {
      if (was_up.count(id) && !s.up) did.push_back("server " + id + " stopped heartbeating; its vGPUs are withheld");
    }
  }
  if (!store_->shared() && opts_.clock_gap_ms != 0 && last_sweep_ms_ != 0 &&
      now_ms > last_sweep_ms_ + opts_.clock_gap_ms) {
    // The controller itself was away (paused, suspended, clock stepped): nobody could renew or
    // heartbeat meanwhile. Give every lease and live server a fresh period from now.
    for (auto& [id, s] : servers_) {
      if (s.up) s.last_seen_ms = std::max(s.last_seen_ms, now_ms);
    }
    for (auto& [aid, a] : allocs_) {
      if (a.kind == "process" && a.lease_expires_ms != 0)
        a.lease_expires_ms = std::max(a.lease_expires_ms, now_ms + opts_.lease_ttl_ms);
    }
    did.push_back("the controller's clock moved " + std::to_string(now_ms - last_sweep_ms_) +
                  " ms since its last sweep (paused, suspended or stepped): leases and servers get a grace period of " +
                  std::to_string(opts_.lease_ttl_ms) + " ms");
  }
  last_sweep_ms_ = std::max(last_sweep_ms_, now_ms);
  std::set<std::string> present;
  if (store_->shared()) {
    for (const auto& [path, v] : versions_) {
      if (path.rfind("present/", 0) == 0) present.insert(path.substr(8));
    }
  }
  for (auto& [id, s] : servers_) {
    if (!store_->shared() && s.up && now_ms > s.last_seen_ms + opts_.server_timeout_ms) {
      s.up = false;
      StoreChange c;
      c.put_servers.push_back(StoreDoc(s));
      (void)Apply(c);
      did.push_back("server " + id + " stopped heartbeating; its vGPUs are withheld");
    }
    const bool gone =
        store_->shared() ? !s.up && present.count(id) == 0 : !s.up && now_ms > s.last_seen_ms + opts_.server_release_ms;
    if (gone) {
      for (const auto& [aid, a] : allocs_) {
        if (a.server == id && a.kind == "process" && a.move_of.empty()) {
          drop.push_back(aid);
          did.push_back("allocation " + aid + " released: server " + id + " is gone");
        }
      }
    }
  }
  std::vector<std::string> stale_moves;
  for (const auto& [aid, a] : allocs_) {
    if (!a.move_to.empty() && now_ms > a.move_asked_ms + opts_.move_timeout_ms &&
        std::find(drop.begin(), drop.end(), aid) == drop.end())
      stale_moves.push_back(aid);
    if (!a.move_of.empty()) continue;  // a move's reservation: it lives and ends with its move
    if (a.kind == "process" && a.state == "pending" && now_ms > a.created_ms + opts_.pending_ttl_ms &&
        std::find(drop.begin(), drop.end(), aid) == drop.end()) {
      drop.push_back(aid);
      ++expired_;
      did.push_back("allocation " + aid + " expired: no server confirmed it within " +
                    std::to_string(opts_.pending_ttl_ms) + " ms");
      continue;
    }
    if (!store_->shared() && a.kind == "process" && a.lease_expires_ms != 0 && now_ms > a.lease_expires_ms &&
        std::find(drop.begin(), drop.end(), aid) == drop.end()) {
      drop.push_back(aid);
      ++expired_;
      did.push_back("allocation " + aid + " (" + a.client_host + " pid " + std::to_string(a.client_pid) + " " +
                    a.client_process + ") expired: nobody renewed its lease");
    }
  }
  for (const auto& aid : stale_moves) {
    Allocation& a = allocs_.at(aid);
    const std::string to = a.move_to;
    if (CancelMoveLocked(a, "it did not complete within " + std::to_string(opts_.move_timeout_ms / 1000) + " s").ok())
      did.push_back("allocation " + aid + ": its move to " + to + " was given up after " +
                    std::to_string(opts_.move_timeout_ms / 1000) + " s");
  }
  if (store_->shared()) {
    // One transaction; if another controller got there first it fails and the next sweep sees why.
    if (!drop.empty() && !ReleaseManyLocked(drop).ok()) did.clear();
  } else {
    for (const auto& aid : drop) (void)ReleaseLocked(aid);
  }
  return did;
}

}  // namespace orion::controller
