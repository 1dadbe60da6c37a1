// The cluster store: etcd v3 through its JSON gateway (POST /v3/kv/range, /v3/kv/txn,
// /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke; keys and values base64, 64-bit numbers
// as decimal strings), over cpp-httplib with one keep-alive connection per member: plain HTTP, or
// HTTPS with the member's certificate verified and optionally a client certificate (EtcdTls).
//
// Failover: requests go to the member that answered last; a member that cannot be reached, times
// out, or answers that it has no leader is skipped for the next one. A write whose answer was lost
// may have been applied: every write is a guarded transaction, so a repeat fails its guards
// instead of applying twice, and a placement made twice that way is an orphan whose lease lapses.
//
// Keys: everything under /orion/ (store.h lists the paths).
#include <httplib.h>
#include <openssl/evp.h>

#include <openssl/x509.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>

#include "orion/controller/client.h"
#include "orion/controller/store.h"

namespace orion::controller {

namespace {

using Json = nlohmann::json;

constexpr const char* kPrefix = "/orion/";
constexpr const char* kPrefixEnd = "/orion0";  // '/' + 1: the end of the prefix's range
constexpr int kConnectTimeoutMs = 500;
// Longer than a healthy transaction (a few ms), shorter than etcd's own request timeout (~7 s),
// which is what a member without a quorum answers after.
constexpr int kReadTimeoutMs = 2000;
constexpr size_t kMaxMembers = 16;

std::string B64(const std::string& s) {
  std::string out(4 * ((s.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(static_cast<size_t>(std::max(n, 0)));
  return out;
}

Result<std::string> Unb64(const std::string& s) {
  if (s.size() % 4 != 0) return Internal("etcd sent malformed base64");
  std::string out(3 * (s.size() / 4), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) return Internal("etcd sent malformed base64");
  size_t len = static_cast<size_t>(n);
  // EVP_DecodeBlock counts padding as zero bytes.
  if (!s.empty() && s.back() == '=') --len;
  if (s.size() >= 2 && s[s.size() - 2] == '=') --len;
  out.resize(len);
  return out;
}

// proto3 JSON: int64 fields are strings; absent means 0.
int64_t I64(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return 0;
  const Json& v = j[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    const std::string& t = v.get_ref<const std::string&>();
    char* end = nullptr;
    const long long n = std::strtoll(t.c_str(), &end, 10);
    return end != nullptr && *end == '\0' ? static_cast<int64_t>(n) : 0;
  }
  return 0;
}

// A connection to one member: plain HTTP, or HTTPS verified against tls.ca (chain and host name or
// IP address: httplib's SSLClient checks both), with tls.cert/key as the client certificate.
std::unique_ptr<httplib::ClientImpl> MemberClient(const Endpoint& m, const EtcdTls& tls) {
  std::unique_ptr<httplib::ClientImpl> c;
  if (tls.on()) {
    auto s = tls.cert.empty() ? std::make_unique<httplib::SSLClient>(m.host, m.port)
                              : std::make_unique<httplib::SSLClient>(m.host, m.port, tls.cert, tls.key);
    s->set_ca_cert_path(tls.ca.c_str());
    s->enable_server_certificate_verification(true);
    c = std::move(s);
  } else {
    c = std::make_unique<httplib::ClientImpl>(m.host, m.port);
  }
  c->set_connection_timeout(std::chrono::milliseconds(kConnectTimeoutMs));
  c->set_read_timeout(std::chrono::milliseconds(kReadTimeoutMs));
  c->set_write_timeout(std::chrono::milliseconds(kReadTimeoutMs));
  c->set_keep_alive(true);
  c->set_tcp_nodelay(true);  // headers and body are two writes: Nagle would hold the body for the delayed ACK (40 ms)
  return c;
}

// Why a request to `c` got no answer, in words an operator can act on.
std::string Why(const httplib::ClientImpl& c, httplib::Error e, const EtcdTls& tls) {
  std::string why = httplib::to_string(e);
  if (!tls.on()) {
    return e == httplib::Error::Read || e == httplib::Error::Write
               ? why +
                     " (the member closed the connection unanswered, as an HTTPS member does to plain HTTP: "
                     "etcd_tls_ca)"
               : why;
  }
  const auto& s = static_cast<const httplib::SSLClient&>(c);
  if (e == httplib::Error::SSLServerVerification) {
    const long v = s.get_openssl_verify_result();
    why += v != X509_V_OK ? std::string(" (") + X509_verify_cert_error_string(v) + ", CA " + tls.ca + ")"
                          : " (its certificate does not name this host or address)";
  } else if (e == httplib::Error::SSLConnection) {
    why += " (TLS handshake failed: is the member plain HTTP?)";
  } else if (e == httplib::Error::Read || e == httplib::Error::Write) {
    // TLS 1.3 finishes the client's side of the handshake before the server checks its certificate:
    // a refusal arrives as the connection closing at the request's first write or read.
    why += tls.cert.empty() ? " (no answer: an etcd that wants a client certificate closes the connection; "
                              "etcd_tls_cert/etcd_tls_key)"
                            : " (no answer: etcd closes the connection when it refuses the client certificate "
                              "etcd_tls_cert " +
                                  tls.cert + ")";
  }
  return why;
}

class EtcdStore final : public Store {
 public:
  EtcdStore(std::vector<Endpoint> members, EtcdTls tls) : members_(std::move(members)), tls_(std::move(tls)) {
    for (const auto& m : members_) clients_.push_back(MemberClient(m, tls_));
  }

  const char* kind() const override { return "etcd"; }
  std::string where() const override {
    std::string s = "etcd://";
    for (size_t i = 0; i < members_.size(); ++i) s += (i ? "," : "") + members_[i].text();
    return tls_.on() ? s + " (TLS)" : s;
  }
  bool shared() const override { return true; }

  Result<StoreState> Load() override {
    auto r = Call("/v3/kv/range", {{"key", B64(kPrefix)}, {"range_end", B64(kPrefixEnd)}});
    if (!r.ok()) return r.status();
    StoreState st;
    const size_t plen = std::string(kPrefix).size();
    for (const Json& kv : r->value("kvs", Json::array())) {
      auto key = Unb64(kv.value("key", ""));
      if (!key.ok()) return key.status();
      if (key->compare(0, plen, kPrefix) != 0) continue;
      const std::string path = key->substr(plen);
      st.versions[path] = I64(kv, "mod_revision");
      auto doc_of = [&]() -> Result<Json> {
        auto v = Unb64(kv.value("value", ""));
        if (!v.ok()) return v.status();
        Json j = Json::parse(*v, nullptr, false);
        if (j.is_discarded() || !j.is_object()) return Internal("etcd key " + *key + " holds a damaged document");
        return j;
      };
      if (path.rfind("servers/", 0) == 0) {
        auto j = doc_of();
        if (!j.ok()) return j.status();
        st.servers.push_back(std::move(*j));
      } else if (path.rfind("allocations/", 0) == 0) {
        auto j = doc_of();
        if (!j.ok()) return j.status();
        (*j)["lease"] = I64(kv, "lease");
        st.allocations.push_back(std::move(*j));
      } else if (path.rfind("alive/", 0) == 0) {
        st.alive.insert(path.substr(6));
      } else if (path.rfind("present/", 0) == 0) {
        st.present.insert(path.substr(8));
      }
    }
    return st;
  }

  Status Apply(const StoreChange& c) override {
    Json compare = Json::array(), ops = Json::array();
    for (const auto& [path, version] : c.guards) {
      compare.push_back({{"key", B64(kPrefix + path)},
                         {"target", "MOD"},
                         {"result", "EQUAL"},
                         {"mod_revision", std::to_string(version)}});
    }
    auto put = [&](const std::string& path, const std::string& value, int64_t lease) {
      Json p = {{"key", B64(kPrefix + path)}, {"value", B64(value)}};
      if (lease != 0) p["lease"] = std::to_string(lease);
      ops.push_back({{"request_put", p}});
    };
    auto del = [&](const std::string& path) {
      ops.push_back({{"request_delete_range", {{"key", B64(kPrefix + path)}}}});
    };
    auto slots = [](const Json& a, auto fn) {
      for (const Json& p : a.value("placements", Json::array())) {
        fn("vgpus/" + a.value("server", "") + "/" + std::to_string(p.value("pgpu", 0u)) + "/" +
           std::to_string(p.value("vgpu", 0u)));
      }
    };
    for (const Json& s : c.put_servers) put("servers/" + s.value("id", ""), s.dump(), 0);
    for (const auto& [id, lease] : c.put_alive) put("alive/" + id, "", lease);
    for (const auto& [id, lease] : c.put_present) put("present/" + id, "", lease);
    std::vector<int64_t> revoke;
    for (const Json& a : c.erase_allocations) {
      del("allocations/" + a.value("id", ""));
      slots(a, del);
      // requests/<request_id> stays: it lives on its own lease (see StoreChange::put_requests).
    }
    for (const auto& [a, lease] : c.put_allocations) {
      Json doc = a;
      doc.erase("lease");  // the key's own lease is the truth
      put("allocations/" + a.value("id", ""), doc.dump(), lease);
      const std::string id = a.value("id", "");
      const int64_t l = lease;  // a structured binding: not capturable before C++20 in every compiler
      slots(a, [&](const std::string& path) { put(path, id, l); });
    }
    for (const auto& r : c.put_requests) put("requests/" + r.request_id, r.allocation_id, r.lease);
    for (const auto& [name, id] : c.put_vms) put("vms/" + name, id, 0);
    for (const auto& name : c.erase_vms) del("vms/" + name);
    for (const auto& path : c.touch) put(path, "", 0);
    for (const auto& path : c.erase_paths) del(path);
    if (ops.empty()) return Status();
    auto r = Call("/v3/kv/txn", {{"compare", compare}, {"success", ops}});
    if (!r.ok()) return r.status();
    if (!r->value("succeeded", false)) return Status(Code::kAlreadyExists, "another controller changed the pool first");
    return Status();
  }

  Result<std::string> OwnerSalt(const std::string& proposed, bool overwrite) override {
    const std::string key = B64(std::string(kPrefix) + "meta/owner_salt");
    const Json put = {{"request_put", {{"key", key}, {"value", B64(proposed)}}}};
    Json txn = {{"success", Json::array({put})}};
    if (!overwrite) {  // only if absent: two controllers starting at once agree on the first
      txn["compare"] =
          Json::array({{{"key", key}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}}});
    }
    if (auto r = Call("/v3/kv/txn", txn); !r.ok()) return r.status();
    auto r = Call("/v3/kv/range", {{"key", key}});
    if (!r.ok()) return r.status();
    for (const Json& kv : r->value("kvs", Json::array())) {
      auto v = Unb64(kv.value("value", ""));
      if (v.ok() && !v->empty()) return *v;
    }
    return Internal("etcd holds no owner salt");
  }

  Result<int64_t> Grant(uint64_t ttl_ms) override {
    const int64_t ttl = std::max<int64_t>(1, static_cast<int64_t>((ttl_ms + 999) / 1000));
    auto r = Call("/v3/lease/grant", {{"TTL", std::to_string(ttl)}});
    if (!r.ok()) return r.status();
    const int64_t id = I64(*r, "ID");
    if (id == 0) return Internal("etcd granted no lease: " + r->value("error", std::string("?")));
    return id;
  }

  Result<uint64_t> KeepAlive(int64_t lease, uint64_t) override {
    if (lease == 0) return NotFound("no lease");
    auto r = Call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
    if (!r.ok()) return r.status();
    const int64_t ttl = I64(r->value("result", Json::object()), "TTL");
    if (ttl <= 0) return NotFound("lease " + std::to_string(lease) + " has expired");
    return static_cast<uint64_t>(ttl) * 1000;
  }

  void Revoke(int64_t lease) override {
    if (lease != 0) (void)Call("/v3/lease/revoke", {{"ID", std::to_string(lease)}});
  }

  Status Ping() override {
    // A linearizable read: it needs a leader and a quorum, as every write does.
    auto r = Call("/v3/kv/range", {{"key", B64(std::string(kPrefix) + "ping")}, {"count_only", true}});
    return r.ok() ? Status() : r.status();
  }

  bool WatchDeletions(const std::function<void()>& on_delete, const std::atomic<bool>& stop) override {
    const size_t i = current_.load() % members_.size();
    // Its own connection: the stream holds it for the whole watch.
    auto cp = MemberClient(members_[i], tls_);
    httplib::ClientImpl& c = *cp;
    c.set_read_timeout(std::chrono::milliseconds(kWatchSpanMs));  // an idle stream ends here; the next call resumes
    const std::string from = std::string(kPrefix) + "allocations/", to = std::string(kPrefix) + "allocations0";
    Json create = {{"key", B64(from)}, {"range_end", B64(to)}, {"filters", Json::array({"NOPUT"})}};
    if (watch_revision_ > 0) create["start_revision"] = std::to_string(watch_revision_);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v3/watch";
    req.body = Json{{"create_request", create}}.dump();
    req.set_header("Content-Type", "application/json");
    std::string buf;
    bool heard = false;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      heard = true;
      buf.append(data, n);
      if (buf.size() > kMaxWatchMessage) return false;  // not etcd's gateway: give up this stream
      for (size_t nl; (nl = buf.find('\n')) != std::string::npos;) {
        const Json j = Json::parse(buf.substr(0, nl), nullptr, false);
        buf.erase(0, nl + 1);
        if (j.is_discarded() || !j.is_object()) continue;
        const Json res = j.value("result", Json::object());
        if (I64(res, "compact_revision") > 0 || res.value("canceled", false)) {
          watch_revision_ = 0;  // history compacted away: start from now, after a full re-read
          on_delete();
          return false;
        }
        const int64_t rev = I64(res.value("header", Json::object()), "revision");
        if (rev > 0) watch_revision_ = rev + 1;
        if (!res.value("events", Json::array()).empty()) on_delete();
      }
      return !stop.load();
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    (void)c.send(req, res, err);
    if (!heard) current_.store((i + 1) % members_.size());  // this member did not answer: the next one next time
    return heard;
  }

 private:
  static constexpr int kWatchSpanMs = 1000;
  static constexpr size_t kMaxWatchMessage = 4 << 20;

  // POSTs `body` to the member that answered last, then to each other one. Errors: kUnavailable
  // (no member answered with a leader), kNotFound (a lease named in the request does not exist),
  // kInternal (etcd refused the request).
  Result<Json> Call(const std::string& path, const Json& body) {
    const std::string text = body.dump();
    const size_t start = current_.load();
    std::string why;
    for (size_t k = 0; k < clients_.size(); ++k) {
      const size_t i = (start + k) % clients_.size();
      auto res = clients_[i]->Post(path.c_str(), text, "application/json");
      if (!res) {
        why += (why.empty() ? "" : "; ") + members_[i].text() + ": " + Why(*clients_[i], res.error(), tls_);
        continue;
      }
      Json j = Json::parse(res->body, nullptr, false);
      if (res->status == 200 && !j.is_discarded() && j.is_object()) {
        current_.store(i);
        return j;
      }
      const std::string msg =
          !j.is_discarded() && j.is_object() ? j.value("message", j.value("error", res->body)) : res->body;
      const int64_t code = !j.is_discarded() && j.is_object() ? I64(j, "code") : 0;
      if (code == 5 || msg.find("lease not found") != std::string::npos) return NotFound("etcd: " + msg);
      // gRPC codes 14 (unavailable: no leader), 4 (deadline: no quorum), 1 (canceled), or any 5xx
      // from the gateway: this member cannot serve it now; another may.
      if (code == 14 || code == 4 || code == 1 || res->status >= 500) {
        why += (why.empty() ? "" : "; ") + members_[i].text() + ": " + msg;
        continue;
      }
      return Internal("etcd " + members_[i].text() + " refused " + path + ": " + msg);
    }
    return Unavailable("no etcd member answered (" + why + ")");
  }

  std::vector<Endpoint> members_;
  EtcdTls tls_;
  std::vector<std::unique_ptr<httplib::ClientImpl>> clients_;  // thread-safe: one request at a time each
  std::atomic<size_t> current_{0};
  int64_t watch_revision_ = 0;  // the watcher thread's: the next revision it wants (0: from now)
};

}  // namespace

Result<std::unique_ptr<Store>> OpenEtcdStore(const std::string& endpoints, const EtcdTls& tls) {
  auto members = ParseEndpoints(endpoints, 2379);
  if (!members.ok()) return InvalidArgument("database etcd://" + endpoints + ": " + members.status().message());
  if (endpoints.find("://") != std::string::npos) {
    return InvalidArgument("database etcd://" + endpoints + ": members are host:port (HTTPS to etcd: etcd_tls_ca)");
  }
  if (members->size() > kMaxMembers) return InvalidArgument("database etcd://: more than 16 members");
  if (tls.any()) {
    if (tls.ca.empty()) return InvalidArgument("etcd_tls_cert/etcd_tls_key need etcd_tls_ca");
    if (tls.cert.empty() != tls.key.empty()) return InvalidArgument("etcd_tls_cert and etcd_tls_key go together");
    // httplib would only fail each handshake later; say which file is wrong now.
    for (const auto& [what, path] :
         {std::pair{"etcd_tls_ca", tls.ca}, {"etcd_tls_cert", tls.cert}, {"etcd_tls_key", tls.key}}) {
      if (!path.empty() && ::access(path.c_str(), R_OK) != 0)
        return InvalidArgument(std::string(what) + " " + path + ": " + std::strerror(errno));
    }
    if (!tls.cert.empty() && !httplib::SSLClient((*members)[0].host, (*members)[0].port, tls.cert, tls.key).is_valid())
      return InvalidArgument("etcd_tls_cert " + tls.cert + " / etcd_tls_key " + tls.key +
                             ": not a PEM certificate and its private key");
  }
  auto s = std::make_unique<EtcdStore>(std::move(*members), tls);
  if (Status st = s->Ping(); !st.ok()) return Unavailable("database " + s->where() + ": " + st.message());
  return std::unique_ptr<Store>(std::move(s));
}

}  // namespace orion::controller
