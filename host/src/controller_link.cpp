#include "orion/host/controller_link.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>

#include "orion/common/frame.h"
#include "orion/common/text.h"

namespace orion::host {

// How many heartbeats a release is tried for before it is given up (logged).
constexpr uint32_t kMaxReleaseTries = 120;
constexpr size_t kMaxPendingMoves = 64;  // moves announced and not yet taken by the daemon

using nlohmann::json;

std::string ControllerAddrForServer(const std::string& configured) {
  if (const char* e = std::getenv("ORION_CONTROLLER"); e != nullptr && *e != '\0') return e;
  return configured;
}

namespace {
// One controller or several ("a:9123,b:9123": one pool on etcd; requests fail over in order).
std::vector<controller::Endpoint> EndpointsOr(const std::string& addr) {
  auto eps = controller::ParseEndpoints(addr);
  return eps.ok() ? *eps : std::vector<controller::Endpoint>{{addr, controller::kDefaultPort}};
}

// The well-formed entries of a watch's or heartbeat's "moves" ({"id", "to"}) for allocations in
// `served`, into `out` (at most kMaxPendingMoves waiting).
template <typename Served>
void TakeMovesFrom(const json& answer, const Served& served, std::vector<std::pair<std::string, std::string>>* out) {
  for (const auto& m : answer.value("moves", json::array())) {
    if (!m.is_object() || !m.value("id", json()).is_string() || !m.value("to", json()).is_string()) continue;
    const std::string id = m["id"].get<std::string>();
    if (served.count(id) != 0 && out->size() < kMaxPendingMoves) out->emplace_back(id, m["to"].get<std::string>());
  }
}
}  // namespace

ControllerLink::ControllerLink(ControllerLinkOptions opts, std::shared_ptr<spdlog::logger> log)
    : opts_(std::move(opts)),
      log_(std::move(log)),
      client_(EndpointsOr(opts_.controller_addr), opts_.key, opts_.timeout_ms) {
  std::mt19937_64 rng{std::random_device{}()};
  boot_id_ = std::to_string(rng());
}

ControllerLink::~ControllerLink() { Stop(); }

bool ControllerLink::Register() {
  json gpus = json::array();
  for (const auto& g : opts_.gpus) {
    gpus.push_back({{"index", g.index}, {"uuid", g.uuid}, {"name", g.name}, {"memory_mib", g.total_mem >> 20}});
  }
  json active = json::array();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, t] : active_) active.push_back(id);
  }
  auto r = client_.Call("PUT", "/v1/servers/" + opts_.server_id,
                        {{"hostname", opts_.hostname},
                         {"vgpu_count", opts_.vgpu_count},
                         {"boot_id", boot_id_},
                         {"gpus", gpus},
                         {"allocations", active}});
  if (!r.ok()) {
    if (registered_.exchange(false) || r.status().code() != Code::kUnavailable) {
      log_->warn("Orion Controller {}: cannot register: {}", client_.endpoint().text(), r.status().message());
    }
    return false;
  }
  if (!registered_.exchange(true)) {
    log_->info("Registered with Orion Controller {} as {}: {} vGPUs, {} free", client_.endpoint().text(),
               opts_.server_id, (*r)["vgpus_total"].get<int>(), (*r)["vgpus_free"].get<int>());
  }
  return true;
}

void ControllerLink::Start() {
  if (!Register()) {
    log_->warn("Orion Controller {} is not reachable yet; clients are refused until it is", client_.endpoint().text());
  }
  thread_ = std::thread([this] { Loop(); });
  watch_ = std::make_shared<WatchState>(
      controller::ControllerClient(EndpointsOr(opts_.controller_addr), opts_.key, kWatchSpanMs + 5000));
  std::thread(WatchLoop, watch_, opts_.server_id, log_).detach();
}

void ControllerLink::WatchLoop(std::shared_ptr<WatchState> w, std::string server_id,
                               std::shared_ptr<spdlog::logger> log) {
  std::unique_lock<std::mutex> lock(w->mu);
  bool said = false;
  while (!w->stop) {
    if (w->ids.empty()) {
      w->cv.wait(lock, [&] { return w->stop || !w->ids.empty(); });
      continue;
    }
    json ids = w->ids;  // a JSON array of the ids
    lock.unlock();
    auto r = w->client.Call("POST", "/v1/servers/" + server_id + "/watch",
                            {{"allocations", ids}, {"timeout_ms", kWatchSpanMs}});
    lock.lock();
    if (w->stop) break;
    if (r.ok()) {
      said = false;
      for (const auto& id : r->value("revoked", json::array())) {
        if (!id.is_string() || w->ids.erase(id.get<std::string>()) == 0) continue;
        w->revoked.push_back(id.get<std::string>());
      }
      TakeMovesFrom(*r, w->ids, &w->moves);
      continue;
    }
    // A controller without the watch (404), too many watches open (429), or none reachable: the
    // heartbeats still carry revocations; try the watch again later.
    if (!said)
      log->info("Orion Controller watch: {}; revocations come with heartbeats meanwhile", r.status().message());
    said = true;
    const bool later = r.status().code() == Code::kNotFound || r.status().code() == Code::kOutOfRange;
    w->cv.wait_for(lock, std::chrono::milliseconds(later ? 10000 : 1000), [&] { return w->stop; });
  }
}

void ControllerLink::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (watch_) {
    std::lock_guard<std::mutex> lock(watch_->mu);
    watch_->stop = true;
    watch_->cv.notify_all();
  }
  // Flush what is queued, then say goodbye.
  for (const Queued& q : queued_) (void)client_.Call(q.method, q.path, q.body);
  if (registered_.load()) {
    auto r = client_.Call("DELETE", "/v1/servers/" + opts_.server_id);
    if (r.ok()) log_->info("Deregistered from Orion Controller {}", client_.endpoint().text());
  }
}

void ControllerLink::Loop() {
  auto next_beat = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_until(lock, next_beat, [&] { return stop_ || !queued_.empty(); });
    if (stop_) break;
    // Releases and move reports, in the order they were made (a move's commit before the release
    // of the session that ended after it).
    while (!queued_.empty()) {
      Queued q = queued_.front();
      queued_.pop_front();
      lock.unlock();
      auto r = client_.Call(q.method, q.path, q.body);
      lock.lock();
      // Every controller away (kUnavailable), or one that failed inside (kInternal: its store
      // faltered mid-request, e.g. an etcd member killed under it): try again with the next beat, a
      // bounded number of times. A release that is dropped leaves the allocation holding its
      // vGPUs for as long as this server is alive. Any other answer (gone already, refused) is final.
      const bool retry = !r.ok() && (r.status().code() == Code::kUnavailable || r.status().code() == Code::kInternal);
      if (retry && ++tries_[q.path] < kMaxReleaseTries) {
        queued_.push_front(std::move(q));
        break;
      }
      if (retry) {
        log_->warn("Orion Controller: giving up on {} {} after {} tries: {}", q.method, q.path, kMaxReleaseTries,
                   r.status().message());
      } else if (!r.ok() && q.method == "POST") {
        log_->warn("Orion Controller: {} {}: {}", q.path, q.body.dump(), r.status().message());
      }
      tries_.erase(q.path);
    }
    if (std::chrono::steady_clock::now() < next_beat) continue;
    next_beat = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.heartbeat_ms);
    json allocs = json::array();
    for (const auto& [id, t] : active_) {
      json used = json::array();
      for (uint32_t d = 0; d < t.devices && t.used != nullptr; ++d)
        used.push_back(t.used[d].load(std::memory_order_relaxed) >> 20);
      allocs.push_back({{"id", id}, {"used_mib", used}});
    }
    lock.unlock();
    if (!registered_.load()) {
      Register();
    } else {
      auto r = client_.Call("POST", "/v1/servers/" + opts_.server_id + "/heartbeat",
                            {{"boot_id", boot_id_}, {"allocations", allocs}});
      if (!r.ok()) {
        if (r.status().code() == Code::kNotFound) {
          log_->warn("Orion Controller {}: {}; registering again", client_.endpoint().text(), r.status().message());
          registered_ = false;
          Register();
        } else {
          log_->warn("Orion Controller {}: heartbeat failed: {}", client_.endpoint().text(), r.status().message());
        }
      } else {
        std::lock_guard<std::mutex> g(mu_);
        for (const auto& id : r->value("revoked", json::array())) {
          if (id.is_string()) revoked_.push_back(id.get<std::string>());
        }
        TakeMovesFrom(*r, active_, &moves_);
      }
    }
    lock.lock();
  }
}

Result<ControllerGrant> ControllerLink::Grant(const Result<json>& r, const std::string& what) {
  if (!r.ok()) return Status(r.status().code(), r.status().message());
  ControllerGrant g;
  try {
    g.allocation_id = (*r).at("id").get<std::string>();
    g.job = (*r).contains("job");
    if ((*r).at("server").get<std::string>() != opts_.server_id) {
      return FailedPrecondition(what + " is placed on " + (*r)["server"].get<std::string>() + ", not on this server");
    }
    // The compute ratio the controller admitted (0: best effort; absent from older controllers).
    const auto ratio = (*r).value("ratio", uint32_t{0});
    if (ratio > 100) return Internal("Orion Controller sent a compute ratio over 100");
    g.ratio = ratio;
    for (const auto& p : (*r).at("placements")) {
      g.placements.push_back(
          {p.at("pgpu").get<uint32_t>(), p.at("vgpu").get<uint32_t>(), p.at("gmem_mib").get<uint64_t>() << 20, ratio});
    }
  } catch (const json::exception& e) {
    return Internal("Orion Controller sent a malformed allocation: " + std::string(e.what()));
  }
  if (g.placements.empty() || g.placements.size() > kMaxDevices) return Internal("Orion Controller sent no placements");
  return g;
}

Result<ControllerGrant> ControllerLink::Confirm(const std::string& allocation_id, uint32_t session) {
  if (allocation_id.size() > 64 || allocation_id.find_first_of("/?#% ") != std::string::npos) {
    return InvalidArgument("allocation id '" + allocation_id + "' is malformed");
  }
  return Grant(client_.Call("POST", "/v1/allocations/" + allocation_id + "/confirm",
                            {{"server", opts_.server_id}, {"session", session}}),
               "allocation " + allocation_id);
}

Result<ControllerGrant> ControllerLink::AllocateHere(uint32_t vgpus, uint64_t gmem_mib, uint32_t ratio,
                                                     const std::string& host, uint32_t pid, const std::string& process,
                                                     uint32_t session) {
  std::string request_id;
  try {
    request_id = RandomUuid();
  } catch (const std::exception& e) {
    return Internal(std::string("no idempotency key for the allocation: ") + e.what());
  }
  nlohmann::json body = {{"vgpus", vgpus},
                         {"gmem_mib", gmem_mib},
                         {"server", opts_.server_id},
                         {"session", session},
                         {"request_id", request_id},  // a repeat to the next controller gets the same allocation
                         {"client", {{"host", host}, {"pid", pid}, {"process", process}}}};
  if (ratio != 0) body["ratio"] = ratio;
  return Grant(client_.Call("POST", "/v1/allocations", body), "the allocation");
}

Result<ControllerGrant> ControllerLink::Assign(const std::string& vm, uint32_t vgpus, uint64_t gmem_mib,
                                               uint32_t ratio) {
  nlohmann::json body = {{"vgpus", vgpus}, {"gmem_mib", gmem_mib}, {"server", opts_.server_id}};
  if (ratio != 0) body["ratio"] = ratio;  // placed by the controller like an allocation's ORION_RATIO
  return Grant(client_.Call("PUT", "/v1/assignments/" + vm, body), "VM " + vm + "'s assignment");
}

void ControllerLink::Unassign(const std::string& vm) {
  std::lock_guard<std::mutex> lock(mu_);
  queued_.push_back({"DELETE", "/v1/assignments/" + vm, nullptr});
  cv_.notify_all();
}

void ControllerLink::Track(const std::string& allocation_id, const std::atomic<uint64_t>* used, uint32_t devices) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_[allocation_id] = {used, devices};
  }
  Watch(allocation_id, true);
}

void ControllerLink::Untrack(const std::string& allocation_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_.erase(allocation_id);
  }
  Watch(allocation_id, false);
}

void ControllerLink::Watch(const std::string& allocation_id, bool on) {
  if (!watch_) return;
  std::lock_guard<std::mutex> lock(watch_->mu);
  if (on) {
    watch_->ids.insert(allocation_id);
    watch_->cv.notify_all();
  } else {
    watch_->ids.erase(allocation_id);
  }
}

void ControllerLink::Release(const std::string& allocation_id, const std::string& why) {
  Watch(allocation_id, false);
  std::lock_guard<std::mutex> lock(mu_);
  active_.erase(allocation_id);
  // ?server=: a server key may release only the allocations its own server serves.
  queued_.push_back(
      {"DELETE", "/v1/allocations/" + allocation_id + "?reason=" + why + "&server=" + opts_.server_id, nullptr});
  cv_.notify_all();
}

std::vector<std::pair<std::string, std::string>> ControllerLink::TakeMoves() {
  std::vector<std::pair<std::string, std::string>> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = std::exchange(moves_, {});
  }
  if (watch_) {
    std::lock_guard<std::mutex> lock(watch_->mu);
    for (auto& m : watch_->moves) out.push_back(std::move(m));
    watch_->moves.clear();
  }
  return out;
}

void ControllerLink::ReportMove(const std::string& allocation_id, bool committed, uint32_t session,
                                const std::string& error) {
  json body = {{"server", opts_.server_id}, {"state", committed ? "committed" : "failed"}};
  if (committed) body["session"] = session;
  if (!committed) {
    // Printable ASCII only: the reason may carry a peer's words, and the body must be valid JSON.
    std::string why = error.substr(0, 500);
    for (char& c : why) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
    }
    body["error"] = why;
  }
  std::lock_guard<std::mutex> lock(mu_);
  queued_.push_back({"POST", "/v1/allocations/" + allocation_id + "/move", std::move(body)});
  cv_.notify_all();
}

std::vector<std::string> ControllerLink::TakeRevoked() {
  std::vector<std::string> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = std::exchange(revoked_, {});
  }
  if (watch_) {
    std::lock_guard<std::mutex> lock(watch_->mu);
    for (auto& id : watch_->revoked) {
      if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(std::move(id));
    }
    watch_->revoked.clear();
  }
  return out;
}

}  // namespace orion::host
