// oriond: admission, one path for every transport (shared memory, TCP, RDMA): the request's checks,
// the vGPUs (standalone pool, or the controller's grant; a job's allocation shared by its
// sessions), the end of a session, and revocations.
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
  SanitizeName(hello->hostname, sizeof hello->hostname);
  SanitizeName(hello->allocation_id, sizeof hello->allocation_id);
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

Result<Daemon::Admission> Daemon::Acquire(const HelloReq& hello, uint32_t session, const std::string& peer) {
  Admission a;
  const std::string want(hello.allocation_id, strnlen(hello.allocation_id, sizeof hello.allocation_id));
  if (!link_) {
    if (!want.empty()) {
      return InvalidArgument("the client holds controller allocation " + want +
                             " but this oriond is standalone (no controller_addr)");
    }
    auto p = pool_->Admit(hello.vgpu_count, hello.gmem_mib);
    if (!p.ok()) return p.status();
    a.placements = std::move(*p);
    return a;
  }
  if (!link_->registered()) {
    return Unavailable("oriond is not registered with its Orion Controller (yet); try again");
  }
  const std::string host(hello.hostname, strnlen(hello.hostname, sizeof hello.hostname));
  auto g = want.empty() ? link_->AllocateHere(hello.vgpu_count, hello.gmem_mib, host.empty() ? peer : host, hello.pid,
                                              hello.process_name, session)
                        : link_->Confirm(want, session);
  if (!g.ok()) return Status(g.status().code(), "Orion Controller: " + g.status().message());
  if (g->job) return AcquireForJob(hello, session, std::move(*g));
  if (Status st = pool_->Reserve(g->placements); !st.ok()) {
    link_->Release(g->allocation_id, "refused_by_server");
    return FailedPrecondition("the controller's placement conflicts with this server's sessions: " + st.message());
  }
  a.placements = std::move(g->placements);
  a.allocation_id = std::move(g->allocation_id);
  log_->info("Using Orion resource {} for session {}", a.allocation_id, session);
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
  JobHold& hold = jobs_[g.allocation_id];
  if (hold.sessions == 0) {
    if (Status st = pool_->Reserve(g.placements); !st.ok()) {
      jobs_.erase(g.allocation_id);
      return FailedPrecondition("the controller's placement conflicts with this server's sessions: " + st.message());
    }
    hold.placements = g.placements;
  }
  ++hold.sessions;
  Admission a;
  // The job's first vGPUs, as many as the process asks (a VM's rule); each with the job's quota
  // or the smaller one asked.
  a.placements.assign(hold.placements.begin(),
                      hold.placements.begin() + (hello.vgpu_count == 0 ? 1 : hello.vgpu_count));
  if (hello.gmem_mib != 0) {
    for (auto& p : a.placements) p.quota_bytes = hello.gmem_mib << 20;
  }
  a.allocation_id = std::move(g.allocation_id);
  a.job = true;
  log_->info("Using Orion resource {} (a job's: {} session(s) on it) for session {}", a.allocation_id, hold.sessions,
             session);
  return a;
}

void Daemon::Finish(const std::vector<Placement>& placements, const std::string& allocation_id, int stat_slot,
                    const std::string& why) {
  if (auto job = jobs_.find(allocation_id); job != jobs_.end()) {
    // A job's session: the job keeps its vGPUs at the controller (its holder releases them); this
    // server holds them while any of its sessions runs.
    if (--job->second.sessions == 0) {
      pool_->Release(job->second.placements);
      if (link_) link_->Untrack(allocation_id);
      jobs_.erase(job);
    }
    if (stat_slot >= 0) stat_used_[static_cast<size_t>(stat_slot)] = false;
    return;
  }
  pool_->Release(placements);
  if (link_ && !allocation_id.empty()) link_->Release(allocation_id, why);
  if (stat_slot >= 0) stat_used_[static_cast<size_t>(stat_slot)] = false;
}

// Sessions whose allocation the controller no longer holds are ended.
void Daemon::EndRevoked() {
  if (!link_) return;
  for (const std::string& id : link_->TakeRevoked()) {
    for (const NetSession& n : net_sessions_) {
      if (n.allocation_id == id) {
        log_->warn("Session {}: the Orion Controller no longer holds allocation {}; ending it", n.session, id);
        kill(n.pid, SIGTERM);
      }
    }
    for (Region& r : regions_) {
      for (const Channel& c : r.channels) {
        if (c.state == Channel::kServing && c.allocation_id == id) {
          log_->warn("Session {}: the Orion Controller no longer holds allocation {}; ending it", c.session, id);
          kill(c.pid, SIGTERM);
        }
      }
    }
  }
}

}  // namespace orion::host
