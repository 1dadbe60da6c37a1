// oriond: shared-memory regions: channel leases, a damaged header detected and repaired, and the
// admission of a client that claimed a channel.
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

bool Daemon::LeaseStale(Region& r, uint32_t index, uint64_t now_ms) {
  Channel& c = r.channels[index];
  const uint64_t lease = ivshmem::Header(r.map->data())->channels[index].client_lease.load(std::memory_order_relaxed);
  if (lease != c.lease || c.lease_changed_ms == 0) {
    c.lease = lease;
    c.lease_changed_ms = now_ms;
    return false;
  }
  return now_ms - c.lease_changed_ms > config_.lease_timeout_ms;
}

void Daemon::Reset(Region& r, uint32_t index) {
  ivshmem::RegionHeader trusted{};
  trusted.channel_bytes = r.channel_bytes;
  const uint32_t gen = ivshmem::ResetChannel(r.map->data(), trusted, index, r.channels[index].generation);
  r.channels[index] = Channel{};
  r.channels[index].generation = gen;
}

bool Daemon::RegionIntact(Region& r) {
  if (r.severed) return false;
  std::string why;
  const auto bytes = r.map->FileBytes();
  if (r.map->faulted()) {
    why = "was truncated (an access past the end of the file faulted)";
  } else if (!bytes.ok()) {
    why = bytes.status().message();
  } else if (*bytes != r.map->size()) {
    why = "was truncated or resized to " + std::to_string(*bytes) + " bytes (oriond serves " +
          std::to_string(r.map->size()) + ")";
  } else {
    // One copy of the header, checked against what FormatRegion wrote; tenants may write it.
    ivshmem::RegionHeader h;
    std::memcpy(static_cast<void*>(&h), r.map->data(), offsetof(ivshmem::RegionHeader, channels));
    if (r.map->faulted()) {
      why = "was truncated (an access past the end of the file faulted)";
    } else if (h.magic != ivshmem::kRegionMagic || h.layout_version != ivshmem::kLayoutVersion ||
               h.header_bytes != ivshmem::kHeaderBytes || h.region_bytes != r.map->size() ||
               h.channel_count != r.channel_count || h.channel_bytes != r.channel_bytes || h.server_epoch != r.epoch) {
      why = "was overwritten (its header is no longer the one oriond wrote)";
    }
  }
  if (why.empty()) return true;
  r.map->Sever();  // from now on nothing here touches the file
  r.severed = true;
  uint32_t sessions = 0;
  for (Channel& c : r.channels) {
    if (c.state != Channel::kServing) continue;
    kill(c.pid, SIGKILL);  // its view of the channel is gone; Reap frees its vGPUs
    ++sessions;
  }
  log_->error(
      "region {} {}: a violation by a tenant of this region; ending its {} session(s); the region is no "
      "longer served until they are gone (other regions and network clients are not affected; it is then "
      "formatted afresh and served again if its file still has its size)",
      r.map->path(), why, sessions);
  return false;
}

void Daemon::RepairSevered() {
  for (size_t i = 0; i < regions_.size(); ++i) {
    Region& r = regions_[i];
    if (!r.severed) continue;
    bool live = false;
    for (const Channel& c : r.channels) live |= c.state == Channel::kServing;
    if (live) continue;  // Reap has not collected every session yet
    const std::string path = r.map->path();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) != r.map->size()) {
      if (!r.repair_refused_logged) {
        log_->warn("region {} stays unserved: its file is gone or no longer {} bytes", path, r.map->size());
        r.repair_refused_logged = true;
      }
      continue;
    }
    // Release the old mapping (and its lock) first: OpenServed locks the file again.
    const ivshmem::VmLimits limits = r.limits;
    const bool has_limits = r.has_limits;
    r.map.reset();
    Region fresh;
    if (Status s = AddRegion(path, &fresh, r.processes, has_limits ? &limits : nullptr); !s.ok()) {
      log_->error("region {} cannot be served again ({}); it is dropped{}", path, s.message(),
                  r.vm.empty() ? "" : " (VM " + r.vm + ": attach it again)");
      pool_->Release(r.reserved);
      if (link_ && !r.vm.empty()) link_->Unassign(r.vm);
      regions_.erase(regions_.begin() + static_cast<std::ptrdiff_t>(i));
      --i;
      continue;
    }
    r.map = std::move(fresh.map);
    r.channel_bytes = fresh.channel_bytes;
    r.channel_count = fresh.channel_count;
    r.channels = std::move(fresh.channels);
    r.epoch = fresh.epoch;
    r.severed = false;
    r.repair_refused_logged = false;
    log_->warn("region {} formatted afresh after a tenant broke it; served again ({} channels)", path, r.channel_count);
  }
}

void Daemon::SetDead(Region& r, uint32_t index, int32_t reason) {
  auto& d = ivshmem::Header(r.map->data())->channels[index];
  d.close_reason.store(reason, std::memory_order_relaxed);
  // X0: the client stops using the channel; pairs with its acquire loads of `state`.
  d.state.store(ivshmem::kChannelDead, std::memory_order_release);
  Channel& c = r.channels[index];
  c.state = Channel::kWaitFree;
  c.lease_changed_ms = 0;
}

void Daemon::Admit(Region& r, uint32_t index) {
  uint8_t* base = r.map->data();
  const ivshmem::ChannelLayout l = ivshmem::ChannelLayout::Compute(r.channel_bytes);
  uint8_t* chan = ivshmem::ChannelBase(base, r.channel_bytes, index);
  const uint32_t gen = r.channels[index].generation;
  ivshmem::RingConsumer rc(chan + l.request_ring_offset, static_cast<uint32_t>(l.request_ring_bytes), gen);
  std::vector<uint8_t> scratch;
  ivshmem::FrameView f{};
  bool got = false;
  Status s = rc.Pop(&f, &scratch, &got);
  if (!got && s.ok()) return;
  const std::string where = r.map->path() + " channel " + std::to_string(index);
  if (!s.ok() || f.header.op != static_cast<uint16_t>(Op::kHello) || f.header.payload_len != sizeof(HelloReq)) {
    log_->error("{}: a client sent an invalid first frame ({}); channel closed", where,
                s.ok() ? "not a Hello" : s.message());
    SetDead(r, index, CUDA_ERROR_ILLEGAL_STATE);
    return;
  }
  HelloReq hello;
  std::memcpy(&hello, f.payload, sizeof hello);
  SanitizeName(hello.process_name, sizeof hello.process_name);
  auto refuse = [&](CUresult code, const std::string& why) {
    log_->warn("{}: refused client '{}' (pid {}): {}", where, hello.process_name, hello.pid, why);
    PushReply(base, r.channel_bytes, index, gen, f.header, code, why.data(), static_cast<uint32_t>(why.size()));
    SetDead(r, index, code);
  };
  if (hello.protocol_version != kProtocolVersion) {
    refuse(CUDA_ERROR_NOT_SUPPORTED, "protocol version " + std::to_string(hello.protocol_version) +
                                         " is not supported (oriond speaks " + std::to_string(kProtocolVersion) + ")");
    return;
  }
  if (Status st = CheckRequest(&hello); !st.ok()) {
    refuse(RefusalCode(st.code()), st.message());
    return;
  }
  const uint32_t session = next_session_++;
  Result<std::vector<Placement>> placements = std::vector<Placement>{};
  std::string allocation_id, hold, share;
  int granted_ratio = -1;
  if (!r.vm.empty()) {
    // A VM's session runs on the VM's own reserved vGPUs only.
    const ivshmem::VmLimits vm = LimitsOf(r.reserved);
    const std::string has = "VM " + r.vm + " has " + std::to_string(vm.vgpus) + " vGPU(s) of " +
                            std::to_string(vm.gmem_bytes >> 20) + " MiB";
    if (hello.vgpu_count > vm.vgpus) {
      placements = ResourceExhausted("ORION_VGPU=" + std::to_string(hello.vgpu_count) + " is more than " + has);
    } else if (hello.gmem_mib != 0 && hello.gmem_mib > (vm.gmem_bytes >> 20)) {
      placements = InvalidArgument("ORION_GMEM=" + std::to_string(hello.gmem_mib) + " MiB is more than " + has);
    } else {
      // The VM's processes share each vGPU's quota, as processes on a GPU share its memory.
      if (r.meter < 0) r.meter = TakeMeter();
      std::vector<Placement> mine(r.reserved.begin(), r.reserved.begin() + hello.vgpu_count);
      if (hello.gmem_mib != 0) {
        for (auto& p : mine) p.quota_bytes = hello.gmem_mib << 20;
      }
      placements = std::move(mine);
    }
  } else {
    auto admitted = Acquire(hello, session, "local");
    if (admitted.ok()) {
      placements = std::move(admitted->placements);
      allocation_id = std::move(admitted->allocation_id);
      hold = std::move(admitted->hold);
      share = std::move(admitted->share);
      granted_ratio = admitted->ratio;
    } else {
      placements = admitted.status();
    }
  }
  if (!placements.ok()) {
    refuse(RefusalCode(placements.status().code()), placements.status().message());
    return;
  }
  std::map<uint32_t, int> compute;
  if (!r.vm.empty()) {
    // A VM's processes are one tenant with the VM's own share (set at attach by the host, not by
    // the guest: ORION_RATIO inside a VM promises nothing).
    if (hello.ratio != 0 && hello.ratio != r.ratio) {
      log_->info("Session {}: VM {}'s compute share ({}) holds, not the guest's ORION_RATIO={}", session, r.vm,
                 r.ratio == 0 ? std::string("best effort") : std::to_string(r.ratio) + "%", hello.ratio);
    }
  } else if (Status st = ComputeFor(hello, session, *placements, hold, &compute, granted_ratio); !st.ok()) {
    if (r.vm.empty()) Finish(*placements, allocation_id, -1, "compute_refused", hold);
    refuse(RefusalCode(st.code()), st.message());
    return;
  }
  const int slot = TakeStatSlot();
  std::string where_placed;
  for (const auto& p : *placements) {
    where_placed += (where_placed.empty() ? "" : ",") + std::to_string(p.pgpu) + "/" + std::to_string(p.vgpu) + ":" +
                    std::to_string(p.quota_bytes >> 20) + "MiB";
  }
  log_->info("Creating session {} for '{}' (pid {}) on {}: vGPUs {}", session, hello.process_name, hello.pid, where,
             where_placed);
  ivshmem::Header(base)->channels[index].session_id = session;
  auto slog = SessionLogger(session);
  // The worker's control socketpair (a move is asked for on it; not a VM's session, which stays
  // with its VM). [0] stays here, [1] is the worker's.
  int pair[2] = {-1, -1};
  if (r.vm.empty() && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    log_->warn("session {}: no control socketpair ({}): it cannot be moved", session, std::strerror(errno));
    pair[0] = pair[1] = -1;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    if (pair[0] >= 0) ::close(pair[0]), ::close(pair[1]);
    FreeCompute(&compute);
    if (r.vm.empty()) {
      Finish(*placements, allocation_id, slot, "fork_failed", hold);
    } else if (slot >= 0) {
      stat_used_[static_cast<size_t>(slot)] = false;
    }
    refuse(CUDA_ERROR_OPERATING_SYSTEM, std::string("oriond cannot fork a worker: ") + std::strerror(errno));
    return;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    // A VM with the doorbell: this channel's vector wakes the worker (channel i rings vector i).
    const int bell_fd = r.bell ? r.bell->vector_fd(index) : -1;
    InWorker(bell_fd);
    if (pair[0] >= 0) ::close(pair[0]);
    auto backend = MakeBackend(session);
    if (!backend.ok()) {
      slog->error("sess={} cannot load the CUDA driver: {}", session, backend.status().message());
      const std::string msg = "oriond: " + backend.status().message();
      PushReply(base, r.channel_bytes, index, gen, f.header, CUDA_ERROR_NO_DEVICE, msg.data(),
                static_cast<uint32_t>(msg.size()));
      _exit(kExitBackendFailed);
    }
    SessionParams sp = BaseParams(session, *placements, slog);
    sp.region = base;
    sp.channel_bytes = r.channel_bytes;
    sp.channel = index;
    sp.generation = gen;
    sp.request_position = rc.position();
    sp.doorbell_fd = bell_fd;
    sp.vm = !r.vm.empty();
    sp.control_fd = pair[1];
    sp.allocation_id = allocation_id;
    sp.used_out = StatSlot(slot);
    sp.share = share;
    FillCompute(*placements, !r.vm.empty() ? r.compute : hold.empty() ? compute : holds_.at(hold).compute, &sp);
    sp.hold_used = r.vm.empty() ? HoldMeter(hold) : Meter(r.meter);
    if (r.vm.empty()) {
      sp.hold_quota = HoldQuota(hold);
    } else {
      for (const Placement& p : r.reserved) sp.hold_quota.push_back(p.quota_bytes);
    }
    const int code = RunSession(sp, std::move(*backend), f.header, hello);
    slog->flush();
    _exit(code);
  }
  if (pair[1] >= 0) {
    ::close(pair[1]);
    shm_controls_[pid] = pair[0];
  }
  Channel& c = r.channels[index];
  c.state = Channel::kServing;
  c.pid = pid;
  c.session = session;
  c.placements = std::move(*placements);
  c.allocation_id = allocation_id;
  c.hold = hold;
  c.compute = std::move(compute);
  c.stat_slot = slot;
  c.client = {hello.pid, hello.process_name,
              std::string(hello.hostname, strnlen(hello.hostname, sizeof hello.hostname)),
              r.vm.empty() ? "shm" : "vm " + r.vm};
  if (link_ && !allocation_id.empty()) {
    // A hold's allocation is shared by its sessions: no one session's memory figures stand for it.
    link_->Track(allocation_id, !hold.empty() ? nullptr : StatSlot(slot), static_cast<uint32_t>(c.placements.size()));
  }
  ++serving_;
}

void Daemon::Scan(Region& r, uint32_t index, uint64_t now_ms) {
  Channel& c = r.channels[index];
  if (c.state == Channel::kServing) return;
  auto& d = ivshmem::Header(r.map->data())->channels[index];
  const uint32_t state = d.state.load(std::memory_order_acquire);
  switch (state) {
    case ivshmem::kChannelFree: {
      const uint32_t gen = c.generation;
      c = Channel{};
      c.generation = gen;
      return;
    }
    case ivshmem::kChannelClaimed:
      if (c.state == Channel::kWaitFree) break;  // a refused client that has not gone yet
      if (c.claimed_ms == 0) c.claimed_ms = now_ms;
      Admit(r, index);
      if (r.channels[index].state == Channel::kIdle && now_ms - c.claimed_ms > config_.lease_timeout_ms &&
          LeaseStale(r, index, now_ms)) {
        log_->info("{} channel {}: claimed but no Hello, client gone; freeing it", r.map->path(), index);
        Reset(r, index);
      }
      return;
    case ivshmem::kChannelDetached: {
      Reset(r, index);
      return;
    }
    default: break;
  }
  // Active without a worker (left from an earlier oriond), dead, or a garbage state: free it once
  // the client's lease is stale.
  if (c.state != Channel::kWaitFree) {
    c.state = Channel::kWaitFree;
    c.lease_changed_ms = 0;
  }
  if (LeaseStale(r, index, now_ms)) {
    Reset(r, index);
  }
}

}  // namespace orion::host
