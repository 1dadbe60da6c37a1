#include "orion/controller/service.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <set>

#include "orion/controller/client.h"

namespace orion::controller {

namespace {

constexpr uint32_t kMaxVgpusPerRequest = 16;    // a process sees at most 16 devices (kMaxDevices)
constexpr uint64_t kMaxGmemMib = uint64_t{1} << 24;  // 16 TiB: anything larger is garbage

std::string NewId() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  uint64_t a, b;
  {
    std::lock_guard<std::mutex> lock(mu);
    a = rng();
    b = rng();
  }
  a = (a & 0xffffffffffff0fffull) | 0x4000ull;           // version 4
  b = (b & 0x3fffffffffffffffull) | 0x8000000000000000ull;  // variant 10
  char s[40];
  std::snprintf(s, sizeof s, "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                static_cast<unsigned>((a >> 16) & 0xffff), static_cast<unsigned>(a & 0xffff),
                static_cast<unsigned>(b >> 48), static_cast<unsigned long long>(b & 0xffffffffffffull));
  return s;
}

// Reads an unsigned integer field; absent = `def`. kInvalidArgument names the field.
Status UInt(const Json& body, const char* key, uint64_t max, uint64_t def, uint64_t* out) {
  if (!body.contains(key) || body[key].is_null()) {
    *out = def;
    return Status();
  }
  const Json& v = body[key];
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    return InvalidArgument(std::string(key) + " must be a whole number, not " + v.dump());
  }
  const uint64_t n = v.get<uint64_t>();
  if (n > max) return InvalidArgument(std::string(key) + " = " + std::to_string(n) + " is larger than " + std::to_string(max));
  *out = n;
  return Status();
}

Status Str(const Json& body, const char* key, size_t max, std::string* out) {
  if (!body.contains(key) || body[key].is_null()) return Status();
  if (!body[key].is_string()) return InvalidArgument(std::string(key) + " must be a string");
  std::string s = body[key].get<std::string>();
  if (s.size() > max) return InvalidArgument(std::string(key) + " is longer than " + std::to_string(max));
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) return InvalidArgument(std::string(key) + " has control characters");
  }
  *out = std::move(s);
  return Status();
}

bool ValidVmName(const std::string& vm) {
  if (vm.empty() || vm.size() > 64) return false;
  return std::all_of(vm.begin(), vm.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

}  // namespace

uint64_t WallMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

Result<std::unique_ptr<Service>> Service::Open(ServiceOptions opts) {
  std::unique_ptr<Service> s(new Service(std::move(opts)));
  if (sqlite3_open_v2(s->opts_.database.c_str(), &s->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    return Unavailable("cannot open database " + s->opts_.database + ": " +
                       (s->db_ != nullptr ? sqlite3_errmsg(s->db_) : "out of memory"));
  }
  sqlite3_busy_timeout(s->db_, 2000);
  ::chmod(s->opts_.database.c_str(), 0600);  // also a database an older controller made world-readable
  // One controller per database: a second one would hand out the same vGPUs.
  const std::string lock = s->opts_.database + ".lock";
  s->lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (s->lock_fd_ < 0 || ::flock(s->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return FailedPrecondition("database " + s->opts_.database + " is in use by another orion-controller (" + lock +
                              " is locked)");
  }
  // WAL with synchronous=NORMAL: a commit is an append, no fsync. Checkpoints (which fsync) are
  // not run by commits (they stalled every request queued behind one for tens of ms on this
  // VM's disk) but by Checkpoint() on a second connection, off the request path.
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA wal_autocheckpoint=0",
                          "CREATE TABLE IF NOT EXISTS servers(id TEXT PRIMARY KEY, doc TEXT NOT NULL)",
                          "CREATE TABLE IF NOT EXISTS allocations(id TEXT PRIMARY KEY, doc TEXT NOT NULL)",
                          "CREATE TABLE IF NOT EXISTS vgpus(server TEXT NOT NULL, pgpu INTEGER NOT NULL, "
                          "vgpu INTEGER NOT NULL, allocation TEXT NOT NULL, PRIMARY KEY(server, pgpu, vgpu))"}) {
    if (Status st = s->Exec(sql); !st.ok()) return Unavailable("database " + s->opts_.database + ": " + st.message());
  }
  if (sqlite3_open_v2(s->opts_.database.c_str(), &s->checkpoint_db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    return Unavailable("cannot open database " + s->opts_.database + " for checkpoints");
  }
  sqlite3_busy_timeout(s->checkpoint_db_, 5000);
  if (Status st = s->Load(); !st.ok()) return st;
  return s;
}

void Service::Checkpoint() {
  int log = 0, done = 0;
  sqlite3_wal_checkpoint_v2(checkpoint_db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
}

Service::~Service() {
  for (auto& [sql, st] : stmts_) sqlite3_finalize(st);
  if (checkpoint_db_ != nullptr) sqlite3_close(checkpoint_db_);
  if (db_ != nullptr) sqlite3_close(db_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Status Service::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err != nullptr ? err : "error";
    sqlite3_free(err);
    return Internal(m);
  }
  return Status();
}

Status Service::Begin() { return Exec("BEGIN IMMEDIATE"); }
Status Service::Commit() { return Exec("COMMIT"); }
void Service::Rollback() { (void)Exec("ROLLBACK"); }

Status Service::Run(const char* sql, const std::vector<std::string>& text, const std::vector<int64_t>& ints) {
  // Prepared once, reused (statements are keyed by their literal's address).
  sqlite3_stmt*& st = stmts_[sql];
  if (st == nullptr && sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr) != SQLITE_OK) {
    st = nullptr;
    return Internal(sqlite3_errmsg(db_));
  }
  int i = 1;
  for (const auto& t : text) sqlite3_bind_text(st, i++, t.c_str(), static_cast<int>(t.size()), SQLITE_TRANSIENT);
  for (int64_t v : ints) sqlite3_bind_int64(st, i++, v);
  const int rc = sqlite3_step(st);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (rc != SQLITE_DONE) return Internal(std::string("database: ") + sqlite3_errmsg(db_));
  return Status();
}

Status Service::Put(const Server& s) {
  Json j = ToJson(s);
  return Run("INSERT OR REPLACE INTO servers(id, doc) VALUES(?, ?)", {s.id, j.dump()});
}

Status Service::Put(const Allocation& a, const Json* doc) {
  if (Status st = Run("INSERT OR REPLACE INTO allocations(id, doc) VALUES(?, ?)", {a.id, (doc != nullptr ? *doc : ToJson(a)).dump()});
      !st.ok()) {
    return st;
  }
  if (Status st = Run("DELETE FROM vgpus WHERE allocation = ?", {a.id}); !st.ok()) return st;
  for (const Slot& s : a.slots) {
    // The primary key (server, pgpu, vgpu) refuses a double booking even if the memory model erred.
    if (Status st = Run("INSERT INTO vgpus(server, allocation, pgpu, vgpu) VALUES(?, ?, ?, ?)", {a.server, a.id},
                        {s.pgpu, s.vgpu});
        !st.ok()) {
      return st;
    }
  }
  return Status();
}

Status Service::Erase(const Allocation& a) {
  if (Status st = Run("DELETE FROM vgpus WHERE allocation = ?", {a.id}); !st.ok()) return st;
  return Run("DELETE FROM allocations WHERE id = ?", {a.id});
}

Json Service::ToJson(const Server& s) {
  Json gpus = Json::array();
  for (const Gpu& g : s.gpus) {
    gpus.push_back({{"index", g.index}, {"uuid", g.uuid}, {"name", g.name}, {"memory_mib", g.memory_mib}});
  }
  return {{"id", s.id}, {"addr", s.id}, {"hostname", s.hostname}, {"boot_id", s.boot_id}, {"vgpu_count", s.vgpu_count},
          {"gpus", gpus}, {"up", s.up}, {"last_seen_ms", s.last_seen_ms}, {"registered_ms", s.registered_ms}};
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
    pl.push_back({{"server", a.server}, {"pgpu", s.pgpu}, {"vgpu", s.vgpu}, {"gmem_mib", s.gmem_mib},
                  {"used_mib", s.used_mib}, {"gpu_name", name}, {"gpu_uuid", uuid},
                  {"text", a.server + "/" + std::to_string(s.pgpu) + "/" + std::to_string(s.vgpu)}});
  }
  Json j = {{"id", a.id}, {"kind", a.kind}, {"server", a.server}, {"state", a.state}, {"vgpus", a.vgpus},
            {"gmem_mib", a.gmem_mib}, {"ratio", a.ratio}, {"session", a.session}, {"created_ms", a.created_ms},
            {"lease_expires_ms", a.lease_expires_ms}, {"lease_ttl_ms", opts_.lease_ttl_ms},
            {"client", {{"host", a.client_host}, {"pid", a.client_pid}, {"process", a.client_process}}},
            {"placements", pl}};
  if (!a.vm.empty()) j["vm"] = a.vm;
  if (!a.owner.empty()) j["owner"] = a.owner;
  return j;
}

Status Service::Load() {
  const uint64_t now = WallMs();
  auto each = [&](const char* sql, auto fn) -> Status {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) return Internal(sqlite3_errmsg(db_));
    while (sqlite3_step(st) == SQLITE_ROW) {
      const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
      Json j = Json::parse(t != nullptr ? t : "", nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        sqlite3_finalize(st);
        return Internal(std::string("database ") + opts_.database + " has a damaged row");
      }
      fn(j);
    }
    sqlite3_finalize(st);
    return Status();
  };
  Status st = each("SELECT doc FROM servers", [&](const Json& j) {
    Server s;
    s.id = j.value("id", "");
    s.hostname = j.value("hostname", "");
    s.boot_id = j.value("boot_id", "");
    s.vgpu_count = j.value("vgpu_count", 1u);
    s.up = j.value("up", true);
    s.registered_ms = j.value("registered_ms", uint64_t{0});
    // Grace after a controller restart: servers have server_timeout_ms to be heard from again.
    s.last_seen_ms = now;
    for (const Json& g : j.value("gpus", Json::array())) {
      s.gpus.push_back({g.value("index", 0u), g.value("uuid", ""), g.value("name", ""), g.value("memory_mib", uint64_t{0})});
    }
    servers_[s.id] = std::move(s);
  });
  if (!st.ok()) return st;
  st = each("SELECT doc FROM allocations", [&](const Json& j) {
    Allocation a;
    a.id = j.value("id", "");
    a.kind = j.value("kind", "process");
    a.vm = j.value("vm", "");
    a.server = j.value("server", "");
    a.vgpus = j.value("vgpus", 0u);
    a.gmem_mib = j.value("gmem_mib", uint64_t{0});
    a.ratio = j.value("ratio", 0u);
    a.state = j.value("state", "pending");
    a.session = j.value("session", 0u);
    a.created_ms = j.value("created_ms", uint64_t{0});
    const Json c = j.value("client", Json::object());
    a.client_host = c.value("host", "");
    a.client_pid = c.value("pid", 0u);
    a.client_process = c.value("process", "");
    a.owner = j.value("owner", "");
    // Grace: whoever renews this lease gets a full period to reach the restarted controller.
    a.lease_expires_ms = a.kind == "vm" ? 0 : std::max(j.value("lease_expires_ms", uint64_t{0}), now + opts_.lease_ttl_ms);
    for (const Json& p : j.value("placements", Json::array())) {
      a.slots.push_back({p.value("pgpu", 0u), p.value("vgpu", 0u), p.value("gmem_mib", uint64_t{0}), p.value("used_mib", uint64_t{0})});
    }
    allocs_[a.id] = std::move(a);
  });
  pools_ = Pools();
  return st;
}

std::map<std::string, host::VgpuPool> Service::Pools(const std::string& only) const {
  std::map<std::string, host::VgpuPool> pools;
  std::map<std::string, std::vector<std::vector<host::Placement>>> taken;
  for (const auto& [id, a] : allocs_) {
    if (!only.empty() && a.server != only) continue;
    auto& v = taken[a.server].emplace_back();
    for (const Slot& sl : a.slots) v.push_back({sl.pgpu, sl.vgpu, sl.gmem_mib << 20});
  }
  for (const auto& [id, s] : servers_) {
    if (!only.empty() && id != only) continue;
    std::vector<host::PhysicalGpu> gpus;
    for (const Gpu& g : s.gpus) gpus.push_back({g.index, g.name, g.memory_mib << 20, g.uuid});
    host::VgpuPool pool(std::move(gpus), s.vgpu_count);
    if (auto t = taken.find(id); t != taken.end()) {
      for (const auto& p : t->second) (void)pool.Reserve(p);  // as in PoolOf
    }
    pools.emplace(id, std::move(pool));
  }
  return pools;
}

const host::VgpuPool& Service::PoolOf(const Server& s) const {
  static const host::VgpuPool kEmpty({}, 1);
  auto it = pools_.find(s.id);
  return it != pools_.end() ? it->second : kEmpty;
}

Result<Json> Service::RegisterServer(const std::string& id, const Json& body) {
  if (!ParseEndpoint(id, 9960).ok() || id.find(':') == std::string::npos) {
    return InvalidArgument("server id '" + id + "' is not the server's ip:port");
  }
  if (!body.is_object()) return InvalidArgument("the body must be a JSON object");
  Server s;
  s.id = id;
  uint64_t vc = 0;
  if (Status st = UInt(body, "vgpu_count", 100, 0, &vc); !st.ok()) return st;
  if (vc == 0) return InvalidArgument("vgpu_count must be 1..100");
  s.vgpu_count = static_cast<uint32_t>(vc);
  if (Status st = Str(body, "hostname", 255, &s.hostname); !st.ok()) return st;
  if (Status st = Str(body, "boot_id", 64, &s.boot_id); !st.ok()) return st;
  if (!body.contains("gpus") || !body["gpus"].is_array() || body["gpus"].size() > 64) {
    return InvalidArgument("gpus must be an array of at most 64 GPUs");
  }
  std::set<uint32_t> seen;
  for (const Json& g : body["gpus"]) {
    if (!g.is_object()) return InvalidArgument("each GPU must be an object");
    Gpu gpu;
    uint64_t idx = 0, mem = 0;
    if (Status st = UInt(g, "index", 1023, 0, &idx); !st.ok()) return st;
    if (Status st = UInt(g, "memory_mib", kMaxGmemMib, 0, &mem); !st.ok()) return st;
    if (Status st = Str(g, "uuid", 80, &gpu.uuid); !st.ok()) return st;
    if (Status st = Str(g, "name", 128, &gpu.name); !st.ok()) return st;
    if (mem == 0) return InvalidArgument("GPU memory_mib must be > 0");
    if (!seen.insert(static_cast<uint32_t>(idx)).second) return InvalidArgument("GPU index " + std::to_string(idx) + " is listed twice");
    gpu.index = static_cast<uint32_t>(idx);
    gpu.memory_mib = mem;
    s.gpus.push_back(std::move(gpu));
  }
  std::set<std::string> active;
  if (body.contains("allocations")) {
    if (!body["allocations"].is_array()) return InvalidArgument("allocations must be an array of ids");
    for (const Json& a : body["allocations"]) {
      if (a.is_string()) active.insert(a.get<std::string>());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t now = WallMs();
  s.up = true;
  s.last_seen_ms = now;
  auto old = servers_.find(id);
  s.registered_ms = old != servers_.end() ? old->second.registered_ms : now;
  if (Status st = Begin(); !st.ok()) return st;
  // A (re)starting oriond holds only the sessions it lists: its other clients' allocations are gone.
  Json released = Json::array();
  std::vector<std::string> drop;
  for (const auto& [aid, a] : allocs_) {
    if (a.server == id && a.kind == "process" && a.state == "active" && !active.count(aid)) drop.push_back(aid);
  }
  for (const auto& aid : drop) {
    if (Status st = Erase(allocs_[aid]); !st.ok()) {
      Rollback();
      return st;
    }
    released.push_back(aid);
  }
  if (Status st = Put(s); !st.ok()) {
    Rollback();
    return st;
  }
  if (Status st = Commit(); !st.ok()) {
    Rollback();
    return st;
  }
  for (const auto& aid : drop) allocs_.erase(aid);
  servers_[id] = s;
  pools_.erase(id);
  pools_.emplace(id, std::move(Pools(id).at(id)));
  const host::VgpuPool& pool = PoolOf(s);
  Json assignments = Json::array();
  for (const auto& [aid, a] : allocs_) {
    if (a.server == id && a.kind == "vm") assignments.push_back(ToJson(a));
  }
  return Json{{"server", id}, {"vgpus_total", pool.total_vgpus()}, {"vgpus_free", pool.free_vgpus()},
              {"released", released}, {"assignments", assignments},
              {"lease_ttl_ms", opts_.lease_ttl_ms}, {"server_timeout_ms", opts_.server_timeout_ms}};
}

Result<Json> Service::Heartbeat(const std::string& id, const Json& body) {
  if (!body.is_object()) return InvalidArgument("the body must be a JSON object");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = servers_.find(id);
  if (it == servers_.end()) return NotFound("server " + id + " is not registered");
  Server& s = it->second;
  std::string boot;
  if (Status st = Str(body, "boot_id", 64, &boot); !st.ok()) return st;
  if (!boot.empty() && boot != s.boot_id) return NotFound("server " + id + " restarted; it must register again");
  const uint64_t now = WallMs();
  const bool was_down = !s.up;
  s.last_seen_ms = now;
  s.up = true;
  Json revoked = Json::array();
  if (body.contains("allocations") && body["allocations"].is_array()) {
    for (const Json& e : body["allocations"]) {
      if (!e.is_object() || !e.contains("id") || !e["id"].is_string()) continue;
      const std::string aid = e["id"].get<std::string>();
      auto a = allocs_.find(aid);
      if (a == allocs_.end() || a->second.server != id) {
        revoked.push_back(aid);
        continue;
      }
      if (a->second.kind == "process") a->second.lease_expires_ms = now + opts_.lease_ttl_ms;
      if (e.contains("used_mib") && e["used_mib"].is_array()) {
        for (size_t i = 0; i < e["used_mib"].size() && i < a->second.slots.size(); ++i) {
          if (e["used_mib"][i].is_number_integer() && e["used_mib"][i].get<int64_t>() >= 0) a->second.slots[i].used_mib = e["used_mib"][i].get<uint64_t>();
        }
      }
    }
  }
  if (was_down) {
    if (Status st = Put(s); !st.ok()) return st;
  }
  return Json{{"server", id}, {"revoked", revoked}, {"back", was_down}};
}

Result<Json> Service::DeregisterServer(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = servers_.find(id);
  if (it == servers_.end()) return NotFound("server " + id + " is not registered");
  if (Status st = Begin(); !st.ok()) return st;
  Json released = Json::array();
  std::vector<std::string> drop;
  for (const auto& [aid, a] : allocs_) {
    if (a.server == id && a.kind == "process") drop.push_back(aid);
  }
  it->second.up = false;
  Status st = Put(it->second);
  for (const auto& aid : drop) {
    if (st.ok()) st = Erase(allocs_[aid]);
    released.push_back(aid);
  }
  if (st.ok()) st = Commit();
  if (!st.ok()) {
    Rollback();
    return st;
  }
  for (const auto& aid : drop) {
    UnreserveLocked(allocs_[aid]);
    allocs_.erase(aid);
  }
  return Json{{"server", id}, {"released", released}};
}

Json Service::Servers() const {
  std::lock_guard<std::mutex> lock(mu_);
  Json out = Json::array();
  for (const auto& [id, s] : servers_) {
    Json j = ToJson(s);
    const host::VgpuPool& pool = PoolOf(s);
    j["vgpus_total"] = pool.total_vgpus();
    j["vgpus_free"] = pool.free_vgpus();
    Json used = Json::array();
    for (size_t i = 0; i < s.gpus.size(); ++i) used.push_back(pool.used_bytes(i) >> 20);
    j["gpu_allocated_mib"] = used;
    out.push_back(std::move(j));
  }
  return out;
}

Result<Service::Allocation> Service::Place(const Json& body, const std::string& server, const std::string& kind) {
  if (!body.is_object()) return InvalidArgument("the body must be a JSON object");
  uint64_t vgpus = 0, gmem = 0, ratio = 0, pid = 0;
  if (Status st = UInt(body, "vgpus", kMaxVgpusPerRequest, 0, &vgpus); !st.ok()) {
    return InvalidArgument("ORION_VGPU: " + st.message());
  }
  if (vgpus == 0) return InvalidArgument("ORION_VGPU must be 1.." + std::to_string(kMaxVgpusPerRequest));
  if (Status st = UInt(body, "gmem_mib", kMaxGmemMib, 0, &gmem); !st.ok()) return InvalidArgument("ORION_GMEM: " + st.message());
  if (Status st = UInt(body, "ratio", 100, 0, &ratio); !st.ok()) return InvalidArgument("ORION_RATIO: " + st.message());
  Allocation a;
  if (body.contains("client")) {
    const Json& c = body["client"];
    if (!c.is_object()) return InvalidArgument("client must be an object");
    if (Status st = Str(c, "host", 255, &a.client_host); !st.ok()) return st;
    if (Status st = Str(c, "process", 64, &a.client_process); !st.ok()) return st;
    if (Status st = UInt(c, "pid", 0xffffffffu, 0, &pid); !st.ok()) return st;
  }
  std::vector<const Server*> cands;
  for (const auto& [id, s] : servers_) {
    if (s.up && (server.empty() || id == server)) cands.push_back(&s);
  }
  if (cands.empty()) {
    return Unavailable(server.empty() ? "no Orion server is up" : "server " + server + " is not registered or not up");
  }
  uint64_t largest_gpu = 0, largest_server_mem = 0;
  uint32_t largest_server_vgpus = 0;
  std::vector<host::VgpuPool*> pools;
  pools.reserve(cands.size());
  for (const Server* s : cands) {
    pools.push_back(&pools_.at(s->id));
    const host::VgpuPool& p = *pools.back();
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
                           " MiB is more than any server's GPU memory (" + std::to_string(largest_server_mem) + " MiB)");
  }
  std::vector<size_t> idx(cands.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  auto fill = [&](size_t i) {
    const uint64_t total = pools[i]->total_bytes();
    return total == 0 ? 1.0 : static_cast<double>(pools[i]->used_bytes()) / static_cast<double>(total);
  };
  // pack: the fullest server that still fits (Orion's rule); spread: the emptiest.
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
    return opts_.policy == host::PlacementPolicy::kPack ? fill(x) > fill(y) : fill(x) < fill(y);
  });
  std::string why;
  for (size_t i : idx) {
    // Admit takes the slots in the cached pool only when it succeeds; the caller gives them back
    // (UnreserveLocked) if the allocation is not stored.
    auto got = pools[i]->Admit(static_cast<uint32_t>(vgpus), gmem, opts_.policy);
    if (!got.ok()) {
      why += (why.empty() ? "" : "; ") + cands[i]->id + ": " + std::to_string(pools[i]->free_vgpus()) + " of " +
             std::to_string(pools[i]->total_vgpus()) + " vGPUs free, " +
             std::to_string((pools[i]->total_bytes() - pools[i]->used_bytes()) >> 20) + " MiB unallocated";
      continue;
    }
    a.id = NewId();
    a.kind = kind;
    a.server = cands[i]->id;
    a.vgpus = static_cast<uint32_t>(vgpus);
    a.gmem_mib = (*got)[0].quota_bytes >> 20;
    a.ratio = static_cast<uint32_t>(ratio != 0 ? ratio : 100 / std::max<uint32_t>(1, cands[i]->vgpu_count));
    a.client_pid = static_cast<uint32_t>(pid);
    a.created_ms = WallMs();
    a.lease_expires_ms = kind == "vm" ? 0 : a.created_ms + opts_.lease_ttl_ms;
    for (const auto& p : *got) a.slots.push_back({p.pgpu, p.vgpu, p.quota_bytes >> 20, 0});
    return a;
  }
  return ResourceExhausted("no server has " + std::to_string(vgpus) + " free vGPU(s) of " +
                           (gmem == 0 ? std::string("the default size") : std::to_string(gmem) + " MiB") + " now (" + why + ")");
}

Result<Json> Service::Allocate(const Json& body, const std::string& server, const Caller& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  if (caller.kind == Caller::Kind::kClient) {
    uint32_t held = 0;
    for (const auto& [id, x] : allocs_) held += x.kind == "process" && x.owner == caller.owner;
    if (held >= opts_.max_allocations_per_key) {
      ++refusals_;
      return Status(Code::kOutOfRange, "this key holds " + std::to_string(held) + " live allocations, its limit (max_allocations_per_key " +
                                           std::to_string(opts_.max_allocations_per_key) + "); release one first");
    }
  }
  auto a = Place(body, server, "process");
  if (!a.ok()) {
    ++refusals_;
    return a.status();
  }
  a->owner = caller.owner;
  if (!server.empty()) {
    a->state = "active";  // oriond asked for its own client: it is serving it now
    uint64_t session = 0;
    (void)UInt(body, "session", 0xffffffffu, 0, &session);
    a->session = static_cast<uint32_t>(session);
  }
  Json doc = ToJson(*a);
  Status st = Begin();
  if (st.ok()) st = Put(*a, &doc);
  if (st.ok()) st = Commit();
  if (!st.ok()) {
    Rollback();
    UnreserveLocked(*a);
    return st;
  }
  ++allocations_made_;
  allocs_[a->id] = std::move(*a);
  return doc;
}

Result<Json> Service::Confirm(const std::string& id, const Json& body) {
  std::string server;
  if (Status st = Str(body, "server", 300, &server); !st.ok()) return st;
  uint64_t session = 0;
  if (Status st = UInt(body, "session", 0xffffffffu, 0, &session); !st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocs_.find(id);
  if (it == allocs_.end()) return NotFound("allocation " + id + " does not exist (released or expired)");
  Allocation& a = it->second;
  if (a.kind != "process") return InvalidArgument("allocation " + id + " is a VM assignment");
  if (a.server != server) return InvalidArgument("allocation " + id + " is placed on " + a.server + ", not " + server);
  if (a.state == "active" && a.session != 0 && a.session != session) {
    return InvalidArgument("allocation " + id + " is already used by session " + std::to_string(a.session));
  }
  Allocation next = a;
  next.state = "active";
  next.session = static_cast<uint32_t>(session);
  next.lease_expires_ms = WallMs() + opts_.lease_ttl_ms;
  if (Status st = Put(next); !st.ok()) return st;
  a = next;
  return ToJson(a);
}

Result<Json> Service::Renew(const std::string& id, const Caller& caller) {
  std::lock_guard<std::mutex> lock(mu_);
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
                                  std::to_string(opts_.pending_ttl_ms / 1000) + " s (pending_confirm_s); it is released");
      }
      until = std::min(until, deadline);
    }
    a.lease_expires_ms = until;
  }
  return Json{{"id", id}, {"lease_expires_ms", a.lease_expires_ms}};
}

Status Service::MayTouch(const Allocation& a, const Caller& c, const char* what) {
  switch (c.kind) {
    case Caller::Kind::kOpen:
    case Caller::Kind::kAdmin:
      return Status();
    case Caller::Kind::kClient:
      if (!a.owner.empty() && a.owner == c.owner) return Status();
      return Status(Code::kPermissionDenied, "allocation " + a.id + " belongs to another key: a client key may " + what +
                              " only the allocations it made");
    case Caller::Kind::kServer:
      if (!c.server.empty() && c.server == a.server) return Status();
      return Status(Code::kPermissionDenied, "allocation " + a.id + " is served by " + a.server + ", not by " +
                              (c.server.empty() ? std::string("an unnamed server (add ?server=ip:port)") : c.server) +
                              ": a server key may " + what + " only the allocations its server serves");
  }
  return Status(Code::kPermissionDenied, "unknown caller");
}

Status Service::ReleaseLocked(const std::string& id) {
  auto it = allocs_.find(id);
  if (it == allocs_.end()) return NotFound("allocation " + id + " does not exist (released or expired)");
  if (Status st = Erase(it->second); !st.ok()) return st;
  UnreserveLocked(it->second);
  allocs_.erase(it);
  return Status();
}

void Service::UnreserveLocked(const Allocation& a) {
  auto p = pools_.find(a.server);
  if (p == pools_.end()) return;
  std::vector<host::Placement> v;
  for (const Slot& sl : a.slots) v.push_back({sl.pgpu, sl.vgpu, sl.gmem_mib << 20});
  p->second.Release(v);
}

Result<Json> Service::Release(const std::string& id, const std::string& why, const Caller& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocs_.find(id);
  if (it == allocs_.end()) return NotFound("allocation " + id + " does not exist (released or expired)");
  if (Status st = MayTouch(it->second, caller, "release"); !st.ok()) return st;
  if (it->second.kind != "process") return InvalidArgument("allocation " + id + " is VM " + it->second.vm + "'s assignment");
  Json j = {{"id", id}, {"server", it->second.server}, {"released", why}};
  if (Status st = ReleaseLocked(id); !st.ok()) return st;
  return j;
}

Result<Json> Service::GetAllocation(const std::string& id, const Caller& caller) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocs_.find(id);
  if (it == allocs_.end()) return NotFound("allocation " + id + " does not exist (released or expired)");
  // Servers read any allocation (they are trusted with the pool's state); clients only their own.
  if (caller.kind == Caller::Kind::kClient) {
    if (Status st = MayTouch(it->second, caller, "read"); !st.ok()) return st;
  }
  return ToJson(it->second);
}

Json Service::ListAllocations(const std::string& host, const std::string& kind, const Caller& caller) const {
  std::lock_guard<std::mutex> lock(mu_);
  Json out = Json::array();
  for (const auto& [id, a] : allocs_) {
    if (caller.kind == Caller::Kind::kClient && a.owner != caller.owner) continue;
    if (!host.empty() && a.client_host != host) continue;
    if (!kind.empty() && a.kind != kind) continue;
    out.push_back(ToJson(a));
  }
  return out;
}

Result<Json> Service::Assign(const std::string& vm, const Json& body) {
  if (!ValidVmName(vm)) return InvalidArgument("VM name '" + vm + "' must be 1..64 of [A-Za-z0-9._-]");
  std::string server;
  if (Status st = Str(body, "server", 300, &server); !st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, a] : allocs_) {
    if (a.kind != "vm" || a.vm != vm) continue;
    uint64_t vgpus = 0, gmem = 0;
    (void)UInt(body, "vgpus", kMaxVgpusPerRequest, 0, &vgpus);
    (void)UInt(body, "gmem_mib", kMaxGmemMib, 0, &gmem);
    if ((server.empty() || a.server == server) && a.vgpus == vgpus && (gmem == 0 || gmem == a.gmem_mib)) {
      return ToJson(a);  // idempotent: the same VM asking again gets its vGPUs
    }
    return ResourceExhausted("VM " + vm + " already holds " + std::to_string(a.vgpus) + " x " +
                             std::to_string(a.gmem_mib) + " MiB on " + a.server);
  }
  auto a = Place(body, server, "vm");
  if (!a.ok()) {
    ++refusals_;
    return a.status();
  }
  a->vm = vm;
  a->state = "active";
  a->client_host = vm;
  Status st = Begin();
  if (st.ok()) st = Put(*a);
  if (st.ok()) st = Commit();
  if (!st.ok()) {
    Rollback();
    UnreserveLocked(*a);
    return st;
  }
  ++allocations_made_;
  allocs_[a->id] = *a;
  return ToJson(*a);
}

Result<Json> Service::Unassign(const std::string& vm) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, a] : allocs_) {
    if (a.kind == "vm" && a.vm == vm) {
      Json j = ToJson(a);
      if (Status st = ReleaseLocked(std::string(id)); !st.ok()) return st;
      return j;
    }
  }
  return NotFound("VM " + vm + " has no assignment");
}

Json Service::Summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t total = 0, free = 0, up = 0;
  for (const auto& [id, s] : servers_) {
    if (!s.up) continue;
    ++up;
    const host::VgpuPool& p = PoolOf(s);
    total += p.total_vgpus();
    free += p.free_vgpus();
  }
  size_t vms = 0;
  for (const auto& [id, a] : allocs_) vms += a.kind == "vm";
  return Json{{"servers", servers_.size()}, {"servers_up", up}, {"vgpus_total", total}, {"vgpus_free", free},
              {"vgpus_used", total - free}, {"allocations", allocs_.size() - vms}, {"assignments", vms},
              {"policy", opts_.policy == host::PlacementPolicy::kPack ? "pack" : "spread"},
              {"lease_ttl_ms", opts_.lease_ttl_ms}};
}

std::string Service::Metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
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
    const host::VgpuPool& p = PoolOf(s);
    if (s.up) {
      ++up;
      total += p.total_vgpus();
      free += p.free_vgpus();
    }
    for (size_t i = 0; i < s.gpus.size(); ++i) {
      const std::string lbl = "{server=\"" + id + "\",gpu=\"" + std::to_string(s.gpus[i].index) + "\",name=\"" + s.gpus[i].name + "\"}";
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
  family("orion_vgpus_used", "gauge", "vGPUs held by allocations and assignments on servers that are up", {num(total - free)});
  family("orion_servers", "gauge", "registered servers by state",
         {"{state=\"up\"}" + num(up), "{state=\"down\"}" + num(servers_.size() - up)});
  family("orion_allocations", "gauge", "live allocations by kind",
         {"{kind=\"process\"}" + num(allocs_.size() - vms), "{kind=\"vm\"}" + num(vms)});
  family("orion_allocations_created_total", "counter", "allocations and assignments made since start", {num(allocations_made_)});
  family("orion_allocation_refusals_total", "counter", "requests refused since start", {num(refusals_)});
  family("orion_allocations_expired_total", "counter", "allocations released because nobody renewed their lease", {num(expired_)});
  family("orion_gpu_memory_total_mib", "gauge", "physical GPU memory", gpu_total);
  family("orion_gpu_memory_allocated_mib", "gauge", "vGPU quota placed on the GPU", gpu_alloc);
  family("orion_gpu_memory_used_mib", "gauge", "memory the GPU's sessions use (oriond's heartbeats)", gpu_used);
  return out;
}

std::vector<std::string> Service::Sweep(uint64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> did;
  std::vector<std::string> drop;
  if (opts_.clock_gap_ms != 0 && last_sweep_ms_ != 0 && now_ms > last_sweep_ms_ + opts_.clock_gap_ms) {
    // The controller itself was away (paused, suspended, clock stepped): nobody could renew or
    // heartbeat meanwhile. Give every lease and live server a fresh period from now.
    for (auto& [id, s] : servers_) {
      if (s.up) s.last_seen_ms = std::max(s.last_seen_ms, now_ms);
    }
    for (auto& [aid, a] : allocs_) {
      if (a.kind == "process" && a.lease_expires_ms != 0) a.lease_expires_ms = std::max(a.lease_expires_ms, now_ms + opts_.lease_ttl_ms);
    }
    did.push_back("the controller's clock moved " + std::to_string(now_ms - last_sweep_ms_) +
                  " ms since its last sweep (paused, suspended or stepped): leases and servers get a grace period of " +
                  std::to_string(opts_.lease_ttl_ms) + " ms");
  }
  last_sweep_ms_ = std::max(last_sweep_ms_, now_ms);
  for (auto& [id, s] : servers_) {
    if (s.up && now_ms > s.last_seen_ms + opts_.server_timeout_ms) {
      s.up = false;
      (void)Put(s);
      did.push_back("server " + id + " stopped heartbeating; its vGPUs are withheld");
    }
    if (!s.up && now_ms > s.last_seen_ms + opts_.server_release_ms) {
      for (const auto& [aid, a] : allocs_) {
        if (a.server == id && a.kind == "process") {
          drop.push_back(aid);
          did.push_back("allocation " + aid + " released: server " + id + " is gone");
        }
      }
    }
  }
  for (const auto& [aid, a] : allocs_) {
    if (a.kind == "process" && a.state == "pending" && now_ms > a.created_ms + opts_.pending_ttl_ms &&
        std::find(drop.begin(), drop.end(), aid) == drop.end()) {
      drop.push_back(aid);
      ++expired_;
      did.push_back("allocation " + aid + " expired: no server confirmed it within " + std::to_string(opts_.pending_ttl_ms) + " ms");
      continue;
    }
    if (a.kind == "process" && a.lease_expires_ms != 0 && now_ms > a.lease_expires_ms &&
        std::find(drop.begin(), drop.end(), aid) == drop.end()) {
      drop.push_back(aid);
      ++expired_;
      did.push_back("allocation " + aid + " (" + a.client_host + " pid " + std::to_string(a.client_pid) + " " +
                    a.client_process + ") expired: nobody renewed its lease");
    }
  }
  for (const auto& aid : drop) (void)ReleaseLocked(aid);
  return did;
}

}  // namespace orion::controller
