// The embedded store: one SQLite file (WAL), one controller (a lock file beside it).
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>

#include "orion/controller/store.h"

namespace orion::controller {

namespace {

using Json = nlohmann::json;

class SqliteStore final : public Store {
 public:
  explicit SqliteStore(std::string path) : path_(std::move(path)) {}
  ~SqliteStore() override {
    for (auto& [sql, st] : stmts_) sqlite3_finalize(st);
    if (checkpoint_db_ != nullptr) sqlite3_close(checkpoint_db_);
    if (db_ != nullptr) sqlite3_close(db_);
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }

  Status Open() {
    if (sqlite3_open_v2(path_.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                        nullptr) != SQLITE_OK) {
      return Unavailable("cannot open database " + path_ + ": " +
                         (db_ != nullptr ? sqlite3_errmsg(db_) : "out of memory"));
    }
    sqlite3_busy_timeout(db_, 2000);
    ::chmod(path_.c_str(), 0600);  // also a database an older controller made world-readable
    // One controller per database: a second one would hand out the same vGPUs.
    const std::string lock = path_ + ".lock";
    lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      return FailedPrecondition("database " + path_ + " is in use by another orion-controller (" + lock +
                                " is locked)");
    }
    // WAL with synchronous=NORMAL: a commit is an append, no fsync. Checkpoints (which fsync) are
    // not run by commits (they stalled every request queued behind one for tens of ms on this
    // VM's disk) but by Checkpoint() on a second connection, off the request path.
    // The last statement spans two literals, which the missing-comma check takes for a slip.
    // NOLINTBEGIN(bugprone-suspicious-missing-comma)
    for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA wal_autocheckpoint=0",
                            "CREATE TABLE IF NOT EXISTS servers(id TEXT PRIMARY KEY, doc TEXT NOT NULL)",
                            "CREATE TABLE IF NOT EXISTS allocations(id TEXT PRIMARY KEY, doc TEXT NOT NULL)",
                            "CREATE TABLE IF NOT EXISTS vgpus(server TEXT NOT NULL, pgpu INTEGER NOT NULL, "
                            "vgpu INTEGER NOT NULL, allocation TEXT NOT NULL, PRIMARY KEY(server, pgpu, vgpu))",
                            "CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL)"}) {
      // NOLINTEND(bugprone-suspicious-missing-comma)
      if (Status st = Exec(sql); !st.ok()) return Unavailable("database " + path_ + ": " + st.message());
    }
    if (sqlite3_open_v2(path_.c_str(), &checkpoint_db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, nullptr) !=
        SQLITE_OK) {
      return Unavailable("cannot open database " + path_ + " for checkpoints");
    }
    sqlite3_busy_timeout(checkpoint_db_, 5000);
    // A connection learns that the database is in WAL mode at its first read; until then
    // sqlite3_wal_checkpoint_v2 on it returns SQLITE_OK having done nothing (log -1), and the WAL
    // grew without bound (about 33 KB per allocation made and released).
    if (Status st = ExecOn(checkpoint_db_, "SELECT count(*) FROM sqlite_master"); !st.ok()) {
      return Unavailable("database " + path_ + ": " + st.message());
    }
    return Status();
  }

  const char* kind() const override { return "sqlite"; }
  std::string where() const override { return path_; }
  bool shared() const override { return false; }

  Result<StoreState> Load() override {
    std::lock_guard<std::mutex> lock(mu_);
    StoreState out;
    auto each = [&](const char* sql, std::vector<Json>* into) -> Status {
      sqlite3_stmt* st = nullptr;
      if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) return Internal(sqlite3_errmsg(db_));
      while (sqlite3_step(st) == SQLITE_ROW) {
        const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
        Json j = Json::parse(t != nullptr ? t : "", nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
          sqlite3_finalize(st);
          return Internal("database " + path_ + " has a damaged row");
        }
        into->push_back(std::move(j));
      }
      sqlite3_finalize(st);
      return Status();
    };
    if (Status st = each("SELECT doc FROM servers", &out.servers); !st.ok()) return st;
    if (Status st = each("SELECT doc FROM allocations", &out.allocations); !st.ok()) return st;
    return out;
  }

  Result<std::string> OwnerSalt(const std::string& proposed, bool overwrite) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (Status st = Run(overwrite ? "INSERT OR REPLACE INTO meta(name, value) VALUES('owner_salt', ?)"
                                  : "INSERT OR IGNORE INTO meta(name, value) VALUES('owner_salt', ?)",
                        {proposed});
        !st.ok())
      return st;
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, "SELECT value FROM meta WHERE name = 'owner_salt'", -1, &st, nullptr) != SQLITE_OK)
      return Internal(sqlite3_errmsg(db_));
    std::string salt;
    if (sqlite3_step(st) == SQLITE_ROW) {
      const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
      salt = t != nullptr ? t : "";
    }
    sqlite3_finalize(st);
    if (salt.empty()) return Internal("database " + path_ + " holds no owner salt");
    return salt;
  }

  Status Apply(const StoreChange& c) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
    Status st;
    for (const Json& s : c.put_servers) {
      if (st.ok()) st = Run("INSERT OR REPLACE INTO servers(id, doc) VALUES(?, ?)", {s.value("id", ""), s.dump()});
    }
    for (const Json& a : c.erase_allocations) {
      if (st.ok()) st = Run("DELETE FROM vgpus WHERE allocation = ?", {a.value("id", "")});
      if (st.ok()) st = Run("DELETE FROM allocations WHERE id = ?", {a.value("id", "")});
    }
    for (const auto& [a, lease] : c.put_allocations) {
      const std::string id = a.value("id", "");
      if (st.ok()) st = Run("INSERT OR REPLACE INTO allocations(id, doc) VALUES(?, ?)", {id, a.dump()});
      if (st.ok()) st = Run("DELETE FROM vgpus WHERE allocation = ?", {id});
      for (const Json& p : a.value("placements", Json::array())) {
        // The primary key (server, pgpu, vgpu) refuses a double booking even if the memory model erred.
        if (st.ok()) {
          st = Run("INSERT INTO vgpus(server, allocation, pgpu, vgpu) VALUES(?, ?, ?, ?)", {a.value("server", ""), id},
                   {p.value("pgpu", int64_t{0}), p.value("vgpu", int64_t{0})});
        }
      }
    }
    if (st.ok()) st = Exec("COMMIT");
    if (!st.ok()) (void)Exec("ROLLBACK");
    return st;
  }

  Result<int64_t> Grant(uint64_t) override { return int64_t{0}; }
  Result<uint64_t> KeepAlive(int64_t, uint64_t ttl_hint_ms) override { return ttl_hint_ms; }
  void Revoke(int64_t) override {}
  Status Ping() override { return Status(); }

  void Checkpoint() override {
    int log = 0, done = 0;
    sqlite3_wal_checkpoint_v2(checkpoint_db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
  }

 private:
  Status Exec(const std::string& sql) { return ExecOn(db_, sql); }
  static Status ExecOn(sqlite3* db, const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      std::string m = err != nullptr ? err : "error";
      sqlite3_free(err);
      return Internal(m);
    }
    return Status();
  }

  Status Run(const char* sql, const std::vector<std::string>& text, const std::vector<int64_t>& ints = {}) {
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

  std::string path_;
  std::mutex mu_;
  sqlite3* db_ = nullptr;
  sqlite3* checkpoint_db_ = nullptr;
  int lock_fd_ = -1;
  std::map<const char*, sqlite3_stmt*> stmts_;
};

}  // namespace

Result<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path) {
  auto s = std::make_unique<SqliteStore>(path);
  if (Status st = s->Open(); !st.ok()) return st;
  return std::unique_ptr<Store>(std::move(s));
}

Result<std::unique_ptr<Store>> OpenStore(const std::string& database, const EtcdTls& tls) {
  if (database.rfind("etcd://", 0) == 0) return OpenEtcdStore(database.substr(7), tls);
  if (tls.any()) {
    return InvalidArgument("etcd_tls_ca/etcd_tls_cert/etcd_tls_key are set but database '" + database +
                           "' is not etcd://");
  }
  if (database.rfind("sqlite:", 0) == 0) {
    const std::string path = database.substr(7);
    if (path.empty()) return InvalidArgument("database 'sqlite:' names no file");
    return OpenSqliteStore(path);
  }
  if (database.find("://") != std::string::npos) {
    return InvalidArgument("database '" + database + "' is neither sqlite:<file> nor etcd://host:port,...");
  }
  return OpenSqliteStore(database);
}

}  // namespace orion::controller
