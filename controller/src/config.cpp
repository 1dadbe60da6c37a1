#include "orion/controller/config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "orion/controller/client.h"

namespace orion::controller {

Result<ControllerConfig> ParseControllerConfig(const std::string& text, const std::string& source) {
  ControllerConfig c;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source + ": " + e.what());
  }
  if (root.IsNull()) return c;
  if (!root.IsMap()) return InvalidArgument(source + ": the top level must be a mapping of keys");
  auto bad = [&](const std::string& key, const std::string& why) {
    return InvalidArgument(source + ": " + key + " " + why);
  };
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      auto seconds = [&](uint64_t* out) -> Status {
        const double s = v.as<double>();
        if (!(s > 0) || s > 86400 * 365) return bad(key, "must be a number of seconds > 0");
        *out = static_cast<uint64_t>(std::llround(s * 1000));
        return Status();
      };
      Status st;
      if (key == "listen") {
        c.listen = v.as<std::string>();
        if (!ParseEndpoint(c.listen).ok() || c.listen.find("://") != std::string::npos)
          return bad(key, "'" + c.listen + "' is not ip:port (HTTPS: tls_cert and tls_key)");
      } else if (key == "database") {
        c.service.database = v.as<std::string>();
        if (c.service.database.empty()) return bad(key, "is empty");
        if (c.service.database.rfind("etcd://", 0) == 0) {
          if (auto m = ParseEndpoints(c.service.database.substr(7), 2379); !m.ok())
            return bad(key, m.status().message());
          if (c.service.database.find("://", 7) != std::string::npos)
            return bad(key, "etcd members are host:port (HTTPS to etcd: etcd_tls_ca)");
        } else if (c.service.database == "sqlite:" || (c.service.database.rfind("sqlite:", 0) != 0 &&
                                                       c.service.database.find("://") != std::string::npos)) {
          return bad(key, "'" + c.service.database + "' is neither sqlite:<file>, a file, nor etcd://host:port,...");
        }
      } else if (key == "placement") {
        const std::string p = v.as<std::string>();
        if (p == "pack")
          c.service.policy = pool::PlacementPolicy::kPack;
        else if (p == "spread")
          c.service.policy = pool::PlacementPolicy::kSpread;
        else
          return bad(key, "'" + p + "' is not pack or spread");
      } else if (key == "lease_ttl_s") {
        st = seconds(&c.service.lease_ttl_ms);
      } else if (key == "server_timeout_s") {
        st = seconds(&c.service.server_timeout_ms);
      } else if (key == "server_release_s") {
        st = seconds(&c.service.server_release_ms);
      } else if (key == "pending_confirm_s") {
        st = seconds(&c.service.pending_ttl_ms);
      } else if (key == "max_allocations_per_key") {
        const int64_t n = v.as<int64_t>();
        if (n < 1 || n > 1000000) return bad(key, "must be 1..1000000");
        c.service.max_allocations_per_key = static_cast<uint32_t>(n);
      } else if (key == "max_vgpus_per_key") {
        const int64_t n = v.as<int64_t>();
        if (n < 0 || n > 1000000) return bad(key, "must be 0 (no limit)..1000000");
        c.service.max_vgpus_per_key = static_cast<uint32_t>(n);
      } else if (key == "max_gmem_mib_per_key") {
        const int64_t n = v.as<int64_t>();
        if (n < 0 || n > (int64_t{1} << 40)) return bad(key, "must be 0 (no limit) or a number of MiB");
        c.service.max_gmem_mib_per_key = static_cast<uint64_t>(n);
      } else if (key == "log_file") {
        c.log_file = v.IsNull() ? "" : v.as<std::string>();
      } else if (key == "tls_cert" || key == "tls_key" || key == "tls_client_ca") {
        const std::string path = v.IsNull() ? "" : v.as<std::string>();
        (key == "tls_cert" ? c.tls_cert : key == "tls_key" ? c.tls_key : c.tls_client_ca) = path;
      } else if (key == "etcd_tls_ca" || key == "etcd_tls_cert" || key == "etcd_tls_key") {
        EtcdTls& t = c.service.etcd_tls;
        (key == "etcd_tls_ca" ? t.ca : key == "etcd_tls_cert" ? t.cert : t.key) = v.IsNull() ? "" : v.as<std::string>();
      } else if (key == "authentication") {
        if (v.IsNull()) continue;
        if (!v.IsMap()) return bad(key, "must map client/server/admin to keys");
        for (const auto& r : v) {
          const std::string rname = r.first.as<std::string>();
          Role role;
          if (rname == "client")
            role = Role::kClient;
          else if (rname == "server")
            role = Role::kServer;
          else if (rname == "admin" || rname == "administrator")
            role = Role::kAdmin;
          else
            return bad("authentication." + rname, "is not client, server or admin");
          std::vector<std::string> ks;
          // A server key may be bound to one server: {key: K, server: "ip:port"}.
          auto one = [&](const YAML::Node& k) -> Status {
            if (!k.IsMap()) {
              ks.push_back(k.as<std::string>());
              return Status();
            }
            if (role != Role::kServer || !k["key"] || !k["server"] || k.size() != 2)
              return bad("authentication." + rname,
                         "an entry that is a mapping must be {key: K, server: ID} (server keys only)");
            const std::string kk = k["key"].as<std::string>(), srv = k["server"].as<std::string>();
            if (srv.empty() || srv.size() > 300) return bad("authentication.server", "a bound key's server is empty");
            ks.push_back(kk);
            if (!kk.empty()) c.key_servers[kk] = srv;
            return Status();
          };
          if (r.second.IsSequence()) {
            for (const auto& k : r.second)
              if (Status s1 = one(k); !s1.ok()) return s1;
          } else if (!r.second.IsNull()) {
            if (Status s1 = one(r.second); !s1.ok()) return s1;
          }
          for (const auto& k : ks) {
            if (k.empty()) continue;
            if (k.size() < 8) return bad("authentication." + rname, "keys must be at least 8 characters");
            if (c.keys.count(k) && c.keys[k] != role) return bad("authentication", "one key is given two roles");
            c.keys[k] = role;
          }
        }
      } else {
        return bad(key, "is not a controller.yaml key");
      }
      if (!st.ok()) return st;
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source + ": " + e.what());
  }
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return InvalidArgument(
        source + ": " + (c.tls_cert.empty() ? "tls_key is set without tls_cert" : "tls_cert is set without tls_key") +
        " (HTTPS needs both)");
  }
  if (!c.tls_client_ca.empty() && c.tls_cert.empty()) {
    return InvalidArgument(source + ": tls_client_ca needs tls_cert and tls_key (mutual TLS is HTTPS)");
  }
  if (const EtcdTls& t = c.service.etcd_tls; t.any()) {
    if (t.cert.empty() != t.key.empty())
      return InvalidArgument(source +
                             ": etcd_tls_cert and etcd_tls_key go together (a client certificate and its key)");
    if (t.ca.empty())
      return InvalidArgument(source + ": etcd_tls_cert needs etcd_tls_ca (the CA etcd's certificate chains to)");
  }
  if (c.service.server_release_ms < c.service.server_timeout_ms) {
    return InvalidArgument(source + ": server_release_s must not be shorter than server_timeout_s");
  }
  return c;
}

Result<ControllerConfig> LoadControllerConfig(const std::string& path) {
  std::ifstream f(path);
  if (!f) return NotFound("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseControllerConfig(ss.str(), path);
}

}  // namespace orion::controller
