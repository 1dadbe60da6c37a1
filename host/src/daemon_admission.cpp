// oriond: admission, one path for every transport (shared memory, TCP, RDMA): the request's checks,
// the vGPUs (standalone pool, or the controller's grant; a job's allocation or a process tree's
// share, each a hold shared by its sessions), the end of a session, and revocations.
#include "orion/host/daemon.h"

#include "daemon_internal.h"

#include <dirent.h>
#include <signal.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "orion/common/text.h"
#include "orion/host/session.h"
#include "orion/host/vm_state.h"
#include "orion/ivshmem/ring.h"
#include "orion/rdma/endpoint.h"

namespace orion::host {

using namespace daemon_detail;  // NOLINT(google-build-using-namespace): the daemon's own helpers

// What every transport checks in a Hello before admission; makes its strings safe to log.
Status Daemon::CheckRequest(HelloReq* hello) const {
  if (serving_ >= config_.max_clients) {
    return ResourceExhausted("oriond serves its maximum of " + std::to_string(config_.max_clients) + " clients");
  }
  if (hello->vgpu_count == 0 || hello->vgpu_count > kMaxDevices) {
    return InvalidArgument("ORION_VGPU=" + std::to_string(hello->vgpu_count) + " must be 1.." +
                           std::to_string(kMaxDevices));
  }
  if (hello->ratio > 100 || hello->policy > kPolicyCap || (hello->policy == kPolicyCap && hello->ratio == 0)) {
    return InvalidArgument(
        "ORION_RATIO must be 1..100 (or unset: best effort) and ORION_RATIO_POLICY share or cap "
        "(cap needs a ratio)");
  }
  if (!ValidShareToken(hello->share, sizeof hello->share)) {
    return InvalidArgument("ORION_SHARE must be " + std::to_string(kShareTokenLen) +
                           " lowercase hex digits (the value oriond gave the process that started this one)");
  }
  SanitizeName(hello->hostname, sizeof hello->hostname);
  SanitizeName(hello->allocation_id, sizeof hello->allocation_id);
  if (hello->ratio == 0 && config_.default_ratio != 0) {  // no ORION_RATIO: server.conf's default_ratio
    hello->ratio = static_cast<uint8_t>(config_.default_ratio);
    hello->policy = static_cast<uint8_t>(config_.default_ratio_policy);
  }
  return Status::Ok();
}

int Daemon::TakeStatSlot() {
  for (int i = 0; i < kStatSlots; ++i) {
    if (!stat_used_[static_cast<size_t>(i)]) {
      stat_used_[static_cast<size_t>(i)] = true;
      for (uint32_t d = 0; d < kMaxDevices; ++d) stats_[static_cast<size_t>(i) * kMaxDevices + d].store(0);
      return i;
    }
  }
  return -1;
}

std::atomic<uint64_t>* Daemon::StatSlot(int slot) const {
  return slot < 0 ? nullptr : stats_ + static_cast<size_t>(slot) * kMaxDevices;
}

int Daemon::TakeMeter() {
  for (int i = 0; i < kStatSlots; ++i) {
    if (!meter_used_[static_cast<size_t>(i)]) {
      meter_used_[static_cast<size_t>(i)] = true;
      for (uint32_t d = 0; d < kMaxDevices; ++d) meters_[static_cast<size_t>(i) * kMaxDevices + d].store(0);
      return i;
    }
  }
  return -1;
}

void Daemon::Unmeter(int meter, int stat_slot) {
  std::atomic<uint64_t>* m = Meter(meter);
  std::atomic<uint64_t>* used = StatSlot(stat_slot);
  for (uint32_t d = 0; m != nullptr && used != nullptr && d < kMaxDevices; ++d) {
    const uint64_t mine = used[d].load();
    uint64_t cur = m[d].load();
    while (!m[d].compare_exchange_weak(cur, cur > mine ? cur - mine : 0)) {
    }
  }
}

std::atomic<uint64_t>* Daemon::HoldMeter(const std::string& hold) const {
  auto it = holds_.find(hold);
  return it == holds_.end() ? nullptr : Meter(it->second.meter);
}

std::vector<uint64_t> Daemon::HoldQuota(const std::string& hold) const {
  std::vector<uint64_t> q;
  if (auto it = holds_.find(hold); it != holds_.end()) {
    for (const Placement& p : it->second.placements) q.push_back(p.quota_bytes);
  }
  return q;
}

Result<Daemon::Admission> Daemon::Acquire(const HelloReq& hello, uint32_t session, const std::string& peer) {
  Admission a;
  const std::string want(hello.allocation_id, strnlen(hello.allocation_id, sizeof hello.allocation_id));
  const std::string token(hello.share, strnlen(hello.share, sizeof hello.share));
  if (want.empty() && !token.empty() && holds_.count("share/" + token) != 0) return JoinShare(hello, token, {});
  if (!link_) {
    if (!want.empty()) {
      return InvalidArgument("the client holds controller allocation " + want +
                             " but this oriond is standalone (no controller_addr)");
    }
    // Placed where its compute ratio fits (TakeCompute then takes the share itself).
    auto p = pool_->Admit(hello.vgpu_count, hello.gmem_mib, pool::PlacementPolicy::kPack, hello.ratio);
    if (!p.ok()) return p.status();
    a.placements = std::move(*p);
    return JoinShare(hello, token, std::move(a));
  }
  if (!link_->registered()) {
    return Unavailable("oriond is not registered with its Orion Controller (yet); try again");
  }
  const std::string host(hello.hostname, strnlen(hello.hostname, sizeof hello.hostname));
  auto g = want.empty() ? link_->AllocateHere(hello.vgpu_count, hello.gmem_mib, hello.ratio, host.empty() ? peer : host,
                                              hello.pid, hello.process_name, session)
                        : link_->Confirm(want, session);
  if (!g.ok()) return Status(g.status().code(), "Orion Controller: " + g.status().message());
  if (g->job) return AcquireForJob(hello, session, std::move(*g));
  if (Status st = pool_->Reserve(g->placements); !st.ok()) {
    link_->Release(g->allocation_id, "refused_by_server");
    return FailedPrecondition("the controller's placement conflicts with this server's sessions: " + st.message());
  }
  a.placements = std::move(g->placements);
  a.allocation_id = std::move(g->allocation_id);
  a.ratio = static_cast<int>(g->ratio);
  log_->info("Using Orion resource {} for session {}", a.allocation_id, session);
  // A client-held allocation (confirmed) is that process's own; one asked for here starts a share.
  return want.empty() ? JoinShare(hello, token, std::move(a)) : Result<Admission>(std::move(a));
}

Daemon::Admission Daemon::OnHold(const std::string& key, uint32_t count, uint64_t gmem_mib) {
  Hold& hold = holds_.at(key);
  ++hold.sessions;
  Admission a;
  // The hold's first vGPUs, as many as the process asks (a VM's rule); each with the hold's quota
  // or the smaller one asked.
  a.placements.assign(hold.placements.begin(), hold.placements.begin() + (count == 0 ? 1 : count));
  if (gmem_mib != 0) {
    for (auto& p : a.placements) p.quota_bytes = std::min(p.quota_bytes, gmem_mib << 20);
  }
  a.allocation_id = hold.allocation_id;
  a.hold = key;
  return a;
}

// A process tree's share (ORION_SHARE, a token the tree's first process chose at random). The first
// session that names it is admitted on `own` vGPUs and starts the share with them; later sessions
// with the token (the processes it or its parent started) run on the same vGPUs instead of taking
// their own. An empty `own` means the share exists: join it. No token: `own`, no share.
Result<Daemon::Admission> Daemon::JoinShare(const HelloReq& hello, const std::string& token, Admission own) {
  if (own.placements.empty()) {
    const std::string key = "share/" + token;
    Hold& hold = holds_.at(key);
    if (hold.moving) {
      return Unavailable(
          "the vGPU share of the process that started this one is moving to another oriond with "
          "its one session; try again when it has moved (ORION_SHARE=off takes vGPUs of its own)");
    }
    const std::string has = "the vGPU share of the process that started this one has " +
                            std::to_string(hold.placements.size()) + " vGPU(s) of " +
                            std::to_string(hold.placements[0].quota_bytes >> 20) + " MiB";
    if (hello.vgpu_count > hold.placements.size()) {
      return ResourceExhausted("ORION_VGPU=" + std::to_string(hello.vgpu_count) + " is more than " + has +
                               " (ORION_SHARE=off takes vGPUs of its own)");
    }
    if (hello.gmem_mib != 0 && (hello.gmem_mib << 20) > hold.placements[0].quota_bytes) {
      return InvalidArgument("ORION_GMEM=" + std::to_string(hello.gmem_mib) + " MiB is more than " + has);
    }
    Admission a = OnHold(key, hello.vgpu_count, hello.gmem_mib);
    a.share = token;
    log_->info("Joining vGPU share {} ({} session(s) on it)", token.substr(0, 8), hold.sessions);
    return a;
  }
  if (token.empty()) return own;  // ORION_SHARE=off (or a client of its own): its own vGPUs
  const std::string key = "share/" + token;
  Hold& hold = holds_[key];
  hold.placements = std::move(own.placements);
  hold.allocation_id = std::move(own.allocation_id);
  hold.meter = TakeMeter();
  Admission a = OnHold(key, hello.vgpu_count, hello.gmem_mib);
  a.share = token;
  log_->info("Starting vGPU share {} on vGPUs {}", token.substr(0, 8), PlacementText(hold.placements));
  return a;
}

Result<Daemon::Admission> Daemon::AcquireForJob(const HelloReq& hello, uint32_t session, ControllerGrant g) {
  const std::string has = "job allocation " + g.allocation_id + " has " + std::to_string(g.placements.size()) +
                          " vGPU(s) of " + std::to_string(g.placements[0].quota_bytes >> 20) + " MiB";
  if (hello.vgpu_count > g.placements.size()) {
    return ResourceExhausted("ORION_VGPU=" + std::to_string(hello.vgpu_count) + " is more than " + has);
  }
  if (hello.gmem_mib != 0 && (hello.gmem_mib << 20) > g.placements[0].quota_bytes) {
    return InvalidArgument("ORION_GMEM=" + std::to_string(hello.gmem_mib) + " MiB is more than " + has);
  }
  const std::string key = "job/" + g.allocation_id;
  if (holds_.count(key) == 0) {
    if (Status st = pool_->Reserve(g.placements); !st.ok()) {
      return FailedPrecondition("the controller's placement conflicts with this server's sessions: " + st.message());
    }
    Hold& hold = holds_[key];
    hold.placements = g.placements;
    hold.allocation_id = g.allocation_id;
    hold.meter = TakeMeter();
  }
  Admission a = OnHold(key, hello.vgpu_count, hello.gmem_mib);
  a.job = true;
  a.ratio = static_cast<int>(g.ratio);
  log_->info("Using Orion resource {} (a job's: {} session(s) on it) for session {}", a.allocation_id,
             holds_.at(key).sessions, session);
  return a;
}

void Daemon::Finish(const std::vector<Placement>& placements, const std::string& allocation_id, int stat_slot,
                    const std::string& why, const std::string& hold, bool moved) {
  if (auto h = holds_.find(hold); !hold.empty() && h != holds_.end()) {
    Unmeter(h->second.meter, stat_slot);
    if (stat_slot >= 0) stat_used_[static_cast<size_t>(stat_slot)] = false;
    // The hold's vGPUs go back with its last session. A job keeps them at the controller (its
    // holder releases them); a share's controller allocation is released here, unless it went
    // with that session to another oriond (HandOffMove).
    if (--h->second.sessions != 0) return;
    const bool job = hold.starts_with("job/");
    pool_->Release(h->second.placements);
    if (link_ && !h->second.allocation_id.empty()) {
      if (job || (moved && h->second.moving)) {
        link_->Untrack(h->second.allocation_id);
      } else {
        link_->Release(h->second.allocation_id, why);
      }
    }
    if (h->second.meter >= 0) meter_used_[static_cast<size_t>(h->second.meter)] = false;
    FreeCompute(&h->second.compute);
    holds_.erase(h);
    return;
  }
  pool_->Release(placements);
  if (link_ && !allocation_id.empty()) link_->Release(allocation_id, why);
  if (stat_slot >= 0) stat_used_[static_cast<size_t>(stat_slot)] = false;
}

Status Daemon::TakeCompute(const HelloReq& hello, uint32_t session, const std::vector<Placement>& placements,
                           std::map<uint32_t, int>* slots) {
  if (compute_ == nullptr) return Status::Ok();
  std::map<uint32_t, int> taken;
  for (const Placement& p : placements) {
    if (p.pgpu >= kComputeGpus || taken.count(p.pgpu) != 0) continue;
    const uint32_t sum = ComputeRatioSum(compute_[p.pgpu]);
    if (hello.ratio != 0 && sum + hello.ratio > 100) {
      return ResourceExhausted("ORION_RATIO=" + std::to_string(hello.ratio) + " does not fit p-GPU " +
                               std::to_string(p.pgpu) + ": " + std::to_string(100 - std::min(sum, 100u)) +
                               "% of its compute is left (its tenants' ratios add up to " + std::to_string(sum) + ")");
    }
    taken[p.pgpu] = -1;
  }
  for (auto& [pgpu, slot] : taken) {
    slot = TakeComputeSlot(&compute_[pgpu], hello.ratio, hello.policy, session);
    if (slot < 0) {
      FreeCompute(&taken);
      return ResourceExhausted("p-GPU " + std::to_string(pgpu) + " schedules its maximum of " +
                               std::to_string(kComputeSlots) + " tenants");
    }
  }
  *slots = std::move(taken);
  return Status::Ok();
}

void Daemon::FreeCompute(std::map<uint32_t, int>* slots) {
  for (const auto& [pgpu, slot] : *slots) {
    if (compute_ != nullptr && pgpu < kComputeGpus && slot >= 0) FreeComputeSlot(&compute_[pgpu], slot);
  }
  slots->clear();
}

Status Daemon::ComputeFor(const HelloReq& asked, uint32_t session, const std::vector<Placement>& placements,
                          const std::string& hold, std::map<uint32_t, int>* own, int granted_ratio) {
  HelloReq hello = asked;  // its ratio is ORION_RATIO or server.conf's default_ratio (CheckRequest)
  if (granted_ratio >= 0 && granted_ratio != hello.ratio) {
    // The controller admitted the allocation with its own ratio: that one holds, whatever the
    // Hello says (a process cannot promise itself more than it was placed with).
    hello.ratio = static_cast<uint8_t>(granted_ratio);
    if (hello.ratio == 0) hello.policy = kPolicyShare;
  }
  if (hold.empty()) return TakeCompute(hello, session, placements, own);
  Hold& h = holds_.at(hold);
  if (!h.compute.empty()) return Status::Ok();  // one tenant: the hold's first session set its share
  return TakeCompute(hello, session, h.placements, &h.compute);
}

void Daemon::FillCompute(const std::vector<Placement>& placements, const std::map<uint32_t, int>& slots,
                         SessionParams* sp) const {
  for (const Placement& p : placements) {
    auto it = slots.find(p.pgpu);
    const bool on = compute_ != nullptr && it != slots.end() && it->second >= 0;
    sp->compute_gpu.push_back(on ? &compute_[p.pgpu] : nullptr);
    sp->compute_slot.push_back(on ? it->second : -1);
  }
}

void Daemon::SampleCompute(uint64_t now_ms) {
  if (compute_ == nullptr) return;
  for (uint32_t g = 0; g < kComputeGpus; ++g) {
    for (uint32_t i = 0; i < kComputeSlots; ++i) {
      const ComputeSlot& s = compute_[g].slots[i];
      const uint32_t key = g * kComputeSlots + i;
      if (s.used.load(std::memory_order_acquire) == 0) {
        compute_history_.erase(key);
        continue;
      }
      MarkComputeSample(&compute_[g].slots[i]);
      ComputeHistory& h = compute_history_[key];
      if (h.session != s.session) h = ComputeHistory{s.session, {}};
      h.samples.push_back({now_ms, s.busy_ns.load(std::memory_order_relaxed)});
      if (h.samples.size() > 11) h.samples.erase(h.samples.begin());
    }
  }
}

nlohmann::json Daemon::ComputeJson(uint32_t pgpu, const std::map<uint32_t, int>& slots) const {
  auto it = slots.find(pgpu);
  if (compute_ == nullptr || it == slots.end() || it->second < 0) return nullptr;
  const ComputeSlot& s = compute_[pgpu].slots[it->second];
  nlohmann::json j = {{"ratio", s.ratio},
                      {"policy", ComputePolicyName(s.policy)},
                      {"enforced", true},  // both backends gate compute (GatesCompute); off: no scheduler, null
                      {"device_s", static_cast<double>(s.busy_ns.load()) / 1e9},
                      {"wait_s", static_cast<double>(s.throttled_ns.load()) / 1e9},
                      {"turns", s.turns.load()}};
  auto h = compute_history_.find(pgpu * kComputeSlots + static_cast<uint32_t>(it->second));
  auto share = [&](size_t back) -> nlohmann::json {
    if (h == compute_history_.end() || h->second.samples.size() <= back) return nullptr;
    const auto& v = h->second.samples;
    const ComputeSample& a = v[v.size() - 1 - back];
    const ComputeSample& b = v.back();
    if (b.ms <= a.ms) return nullptr;
    return static_cast<double>(b.busy_ns - a.busy_ns) / (static_cast<double>(b.ms - a.ms) * 1e6);
  };
  j["share_1s"] = share(1);
  j["share_10s"] = share(10);
  return j;
}

void Daemon::ReleaseDevices(pid_t pid, const std::vector<Placement>& placements) {
  for (const Placement& p : placements) {
    if (compute_ != nullptr && p.pgpu < kComputeGpus) ReleaseDeadHolder(&compute_[p.pgpu], pid);
  }
}

// Sessions whose allocation the controller no longer holds are ended.
void Daemon::EndRevoked() {
  if (!link_) return;
  for (const std::string& id : link_->TakeRevoked()) {
    // A session moving away: its allocation is the target's once the move committed, and the
    // worker ends on its own then (or serves on here when the move failed).
    const bool moving =
        std::any_of(watched_moves_.begin(), watched_moves_.end(), [&](const WatchedMove& m) { return m.report == id; });
    for (const NetSession& n : net_sessions_) {
      if (n.allocation_id == id && !moving) {
        log_->warn("Session {}: the Orion Controller no longer holds allocation {}; ending it", n.session, id);
        kill(n.pid, SIGTERM);
      }
    }
    for (Region& r : regions_) {
      for (const Channel& c : r.channels) {
        if (c.state == Channel::kServing && c.allocation_id == id && !moving) {
          log_->warn("Session {}: the Orion Controller no longer holds allocation {}; ending it", c.session, id);
          kill(c.pid, SIGTERM);
        }
      }
    }
  }
}

}  // namespace orion::host
