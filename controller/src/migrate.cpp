// orion-controller migrate: a pool's state from one store into another (store.h, service.h).
#include "orion/controller/service.h"

namespace orion::controller {

Result<std::string> MigrateState(Store& from, Store& to, const ServiceOptions& opts, bool force) {
  auto src = from.Load();
  if (!src.ok()) return src.status();
  auto dst = to.Load();
  if (!dst.ok()) return dst.status();
  if (!force && (!dst->servers.empty() || !dst->allocations.empty())) {
    return FailedPrecondition(to.where() + " already holds a pool (" + std::to_string(dst->servers.size()) +
                              " servers, " + std::to_string(dst->allocations.size()) +
                              " allocations); --force copies over it");
  }
  // The owner salt moves with the allocations: their owner hashes stay their keys'.
  // (A source older controllers made has none: it gets a fresh one, as a controller starting on it would.)
  auto fresh = NewOwnerSalt();
  if (!fresh.ok()) return fresh.status();
  auto salt = from.OwnerSalt(*fresh, /*overwrite=*/false);
  if (!salt.ok()) return salt.status();
  if (auto moved = to.OwnerSalt(*salt, /*overwrite=*/true); !moved.ok()) return moved.status();
  size_t servers = 0, procs = 0, vms = 0;
  for (Json s : src->servers) {
    StoreChange c;
    if (to.shared()) {
      auto alive = to.Grant(opts.server_timeout_ms);
      if (!alive.ok()) return alive.status();
      auto present = to.Grant(opts.server_release_ms);
      if (!present.ok()) return present.status();
      s["alive_lease"] = *alive;
      s["present_lease"] = *present;
      c.put_alive.emplace_back(s.value("id", ""), *alive);
      c.put_present.emplace_back(s.value("id", ""), *present);
    } else {
      s.erase("alive_lease");
      s.erase("present_lease");
    }
    c.put_servers.push_back(s);
    if (Status st = to.Apply(c); !st.ok())
      return Status(st.code(), "server " + s.value("id", "") + ": " + st.message());
    ++servers;
  }
  for (Json a : src->allocations) {
    int64_t lease = 0;
    const bool vm = a.value("kind", "process") == "vm";
    if (!vm) {
      auto l = to.Grant(opts.lease_ttl_ms);
      if (!l.ok()) return l.status();
      lease = *l;
    }
    a.erase("lease");
    if (!vm) a["lease_expires_ms"] = WallMs() + opts.lease_ttl_ms;
    StoreChange c;
    c.put_allocations.emplace_back(a, lease);
    if (vm && to.shared()) c.put_vms.emplace_back(a.value("vm", ""), a.value("id", ""));  // the VM name's guard key
    // Its slots must be free in the destination (a --force copy over a live pool).
    for (const Json& p : a.value("placements", Json::array())) {
      c.guards.emplace_back("vgpus/" + a.value("server", "") + "/" + std::to_string(p.value("pgpu", 0u)) + "/" +
                                std::to_string(p.value("vgpu", 0u)),
                            0);
    }
    if (!to.shared()) c.guards.clear();
    if (Status st = to.Apply(c); !st.ok()) {
      to.Revoke(lease);
      return Status(st.code(), "allocation " + a.value("id", "") + ": " + st.message());
    }
    (vm ? vms : procs) += 1;
  }
  return "copied " + std::to_string(servers) + " servers, " + std::to_string(procs) + " allocations and " +
         std::to_string(vms) + " VM assignments from " + from.where() + " to " + to.where();
}

}  // namespace orion::controller
