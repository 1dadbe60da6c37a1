// oriond: VM attachments (restored from the state file at start, saved on every change) and the
// control socket (attach, detach, sessions) that orion-vm, orion-check and orion-smi use.
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

#include "orion/common/clock.h"
#include "orion/common/fd_passing.h"
#include "orion/host/session.h"
#include "orion/host/vm_state.h"
#include "orion/ivshmem/ring.h"
#include "orion/rdma/endpoint.h"

namespace orion::host {

using namespace daemon_detail;  // NOLINT(google-build-using-namespace): the daemon's own helpers

Status Daemon::RestoreVms(std::vector<std::string>* gone) {
  if (config_.state_file.empty()) return Status::Ok();
  auto vms = LoadVmState(config_.state_file);
  if (!vms.ok()) return vms.status();
  if (vms->empty()) return Status::Ok();
  if (!config_.enable_kvm) {
    log_->warn(
        "{} lists {} attached VM(s), but this oriond does not serve VMs (enable_kvm is off): their regions "
        "are not served",
        config_.state_file, vms->size());
    return Status::Ok();
  }
  bool changed = false;
  for (const VmAttachment& a : *vms) {
    struct stat st {};
    if (::stat(a.region.c_str(), &st) != 0) {
      log_->info("VM {}: its region {} is gone (the VM stopped while oriond was down); its vGPUs are free again", a.vm,
                 a.region);
      gone->push_back(a.vm);
      changed = true;
      continue;
    }
    if (Status s = pool_->Reserve(a.placements); !s.ok()) {
      log_->error("VM {}: cannot restore its vGPUs {} ({}); {} is not served until the VM is started again", a.vm,
                  PlacementText(a.placements), s.message(), a.region);
      changed = true;
      continue;
    }
    Region r;
    ivshmem::VmLimits limits = LimitsOf(a.placements);
    std::string bell_note;
    if (!a.doorbell_socket.empty()) {
      // The running QEMU still signals the eventfds it got at the VM's start: serve the doorbell
      // again only with those (kept by the keeper). New ones would never be rung, and the guest,
      // told there is a doorbell, would wait on it instead of being polled.
      Result<std::vector<UniqueFd>> kept = std::vector<UniqueFd>{};
      if (keeper_) kept = keeper_->Get(a.vm);
      if (!kept.ok() || kept->size() != a.doorbell_vectors) {
        bell_note = "; its doorbell's eventfds were not kept (" +
                    (kept.ok() ? std::to_string(kept->size()) + " of " + std::to_string(a.doorbell_vectors)
                               : kept.status().message()) +
                    "): its processes are polled until the VM starts again";
      } else if (auto bell = MakeDoorbell(a.region, a.doorbell_socket, a.doorbell_vectors, std::move(*kept));
                 !bell.ok()) {
        bell_note = "; its doorbell cannot be served again (" + bell.status().message() +
                    "): its processes are polled until the VM starts again";
      } else {
        r.bell = std::move(*bell);
        limits.doorbell_vectors = a.doorbell_vectors;
        bell_note = ", its ivshmem-doorbell on " + a.doorbell_socket + " with the eventfds QEMU rings (" +
                    std::to_string(a.doorbell_vectors) + " vectors, kept by the doorbell keeper)";
      }
    }
    if (Status s = AddRegion(a.region, &r, a.processes, &limits); !s.ok()) {
      pool_->Release(a.placements);
      if (s.code() == Code::kAlreadyExists) return s;  // another oriond serves it: refuse to start
      log_->error("VM {}: cannot serve its region again: {}", a.vm, s.message());
      changed = true;
      continue;
    }
    r.vm = a.vm;
    r.reserved = a.placements;
    r.vgpus_asked = a.vgpus;
    r.gmem_asked_mib = a.gmem_mib;
    r.ratio = a.ratio;
    r.ratio_policy = a.ratio_policy;
    if (Status s = TakeVmCompute(r, a.placements); !s.ok()) {
      log_->error("VM {}: {}; it is served best effort", a.vm, s.message());
      r.ratio = 0;
      (void)TakeVmCompute(r, a.placements);
      changed = true;
    }
    log_->info("VM {}: restored {} with vGPUs {} (from {}){}", a.vm, a.region, PlacementText(a.placements),
               config_.state_file, bell_note);
    changed |= !a.doorbell_socket.empty() && !r.bell;  // the record no longer names a doorbell
    regions_.push_back(std::move(r));
  }
  // What the keeper holds for VMs not restored (gone while oriond was down) is let go.
  if (keeper_) {
    if (Status s = keeper_->Prune(); !s.ok()) log_->warn("doorbell keeper: {}", s.message());
  }
  if (changed) (void)SaveVms();
  return Status::Ok();
}

Status Daemon::SaveVms() {
  if (config_.state_file.empty()) return Status::Ok();
  std::vector<VmAttachment> vms;
  for (const Region& r : regions_) {
    if (r.vm.empty()) continue;
    vms.push_back({r.vm, r.map->path(), r.vgpus_asked, r.gmem_asked_mib, r.processes, r.reserved,
                   r.bell ? r.bell->socket_path() : std::string(), r.bell ? r.bell->vectors() : 0, r.ratio,
                   r.ratio_policy});
  }
  Status s = SaveVmState(config_.state_file, vms);
  if (!s.ok()) log_->error("cannot record the attached VMs: {}", s.message());
  return s;
}

void Daemon::DropRegion(size_t i, const std::string& why) {
  Region& r = regions_[i];
  for (Channel& c : r.channels) {
    if (c.state != Channel::kServing) continue;
    kill(c.pid, SIGTERM);
    int status = 0;
    for (int k = 0; k < 200 && waitpid(c.pid, &status, WNOHANG) == 0; ++k) usleep(10000);
    if (waitpid(c.pid, &status, WNOHANG) == 0) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &status, 0);
    }
    if (c.stat_slot >= 0) stat_used_[static_cast<size_t>(c.stat_slot)] = false;
    ReleaseDevices(c.pid, c.placements);
    FreeCompute(&c.compute);
    log_->info("Session {} exits (VM {} {}).", c.session, r.vm, why);
    --serving_;
  }
  if (r.meter >= 0) meter_used_[static_cast<size_t>(r.meter)] = false;
  r.meter = -1;
  FreeCompute(&r.compute);
  pool_->Release(r.reserved);
  if (link_) link_->Unassign(r.vm);
  if (r.bell && keeper_) {
    if (Status s = keeper_->Drop(r.vm); !s.ok()) log_->warn("doorbell keeper: {}", s.message());
  }
  log_->info("VM {}: detached {} ({})", r.vm, r.map->path(), why);
  regions_.erase(regions_.begin() + static_cast<std::ptrdiff_t>(i));
}

void Daemon::DropGoneVms() {
  bool changed = false;
  for (size_t i = 0; i < regions_.size();) {
    if (!regions_[i].vm.empty() && !regions_[i].map->StillAtPath()) {
      DropRegion(i, "its region file was removed: the VM stopped");
      changed = true;
    } else {
      ++i;
    }
  }
  if (changed) (void)SaveVms();
}

Status Daemon::OpenControlSocket() {
  if (config_.control_socket.empty()) return Status::Ok();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(config_.control_socket).parent_path(), ec);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (config_.control_socket.size() >= sizeof addr.sun_path) {
    return InvalidArgument("control socket path is too long: " + config_.control_socket);
  }
  std::strncpy(addr.sun_path, config_.control_socket.c_str(), sizeof addr.sun_path - 1);
  // One owner: a socket someone still answers on belongs to a running oriond; only a stale one
  // (nobody listening: ECONNREFUSED) is replaced.
  if (const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); probe >= 0) {
    const bool answered = connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(probe);
    if (answered) {
      return Status(Code::kAlreadyExists, "control socket " + config_.control_socket +
                                              " is in use: another oriond is running (or use --control-socket)");
    }
  }
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return Internal(std::string("control socket: ") + std::strerror(errno));
  ::unlink(config_.control_socket.c_str());
  const mode_t old = umask(0077);  // root-only: it hands out vGPUs to VMs
  const int rc = bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  umask(old);
  if (rc != 0 || listen(fd.get(), 16) != 0) {
    const std::string err = std::strerror(errno);
    return Status(Code::kPermissionDenied,
                  "cannot listen on " + config_.control_socket + ": " + err + " (use --control-socket)");
  }
  control_fd_ = std::move(fd);
  return Status::Ok();
}

// One request per connection: a line in, a line out ("ok ..." or "error ...").
void Daemon::ServeControl() {
  if (!control_fd_) return;
  for (;;) {
    const int c = accept4(control_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    std::string line;
    char buf[512];
    pollfd pfd{c, POLLIN, 0};
    while (line.find('\n') == std::string::npos && line.size() < 4096 && poll(&pfd, 1, 1000) > 0) {
      const ssize_t n = ::read(c, buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    if (auto nl = line.find('\n'); nl != std::string::npos) line.resize(nl);
    // A move is answered by the session's worker, on this connection, once it is made or refused.
    if (line.starts_with("migrate ")) {
      const std::string err = HandOffMove(line, c);
      if (err.empty()) {
        ::close(c);  // the worker has its own copy
        continue;
      }
      line = err;
    }
    std::string reply = line.starts_with("error ") ? line + "\n" : Control(line) + "\n";
    // All of it (a `sessions` listing can be long), each write bounded by the socket's send timeout.
    timeval tv{1, 0};
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    for (size_t off = 0; off < reply.size();) {
      const ssize_t w = ::write(c, reply.data() + off, reply.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    ::close(c);
  }
}

std::string Daemon::Control(const std::string& line) {
  std::istringstream in(line);
  std::string cmd;
  in >> cmd;
  if (cmd == "attach") {
    static const char kUsage[] =
        "error usage: attach VM REGION VGPUS GMEM_MIB [PROCESSES [SOCKET VECTORS]] [ratio=1..100] "
        "[ratio_policy=share|cap]";
    // The named options come last, after the positional words.
    std::vector<std::string> words;
    uint32_t ratio = 0, policy = kPolicyShare;
    for (std::string w; in >> w;) {
      if (w.starts_with("ratio=")) {
        const std::string v = w.substr(6);
        if (v.empty() || v.size() > 3 || v.find_first_not_of("0123456789") != std::string::npos || std::stoul(v) < 1 ||
            std::stoul(v) > 100)
          return "error ratio must be 1..100 (percent of each physical GPU's compute)";
        ratio = static_cast<uint32_t>(std::stoul(v));
      } else if (w.starts_with("ratio_policy=")) {
        if (!ParseComputePolicy(w.substr(13), &policy)) return "error ratio_policy must be share or cap";
      } else {
        words.push_back(w);
      }
    }
    std::istringstream pos([&] {
      std::string all;
      for (const auto& w : words) all += w + " ";
      return all;
    }());
    std::string vm, path;
    uint32_t vgpus = 0, processes = 0;
    uint64_t gmem = 0;
    if (!(pos >> vm >> path >> vgpus >> gmem)) return kUsage;
    if (!(pos >> processes)) processes = 0;  // an older hook: shm_buffer_size decides
    std::string bell;
    uint32_t vectors = 0;
    if (pos >> bell && !(pos >> vectors)) return kUsage;
    return Attach(vm, path, vgpus, gmem, processes, bell, vectors, ratio, policy);
  }
  if (cmd == "detach") {
    std::string vm;
    if (!(in >> vm)) return "error usage: detach VM";
    return Detach(vm);
  }
  if (cmd == "status") {
    std::string out = "ok backend=" + std::string(backend_ == BackendKind::kCuda ? "cuda" : "sim") +
                      " vgpus_total=" + std::to_string(pool_->total_vgpus()) +
                      " vgpus_free=" + std::to_string(pool_->free_vgpus()) + " sessions=" + std::to_string(serving_) +
                      " controller=" +
                      (link_ ? ControllerAddrForServer(config_.controller_addr) +
                                   (link_->registered() ? "(registered)" : "(unreachable)")
                             : std::string("none"));
    for (const Region& r : regions_) {
      if (r.vm.empty()) continue;
      out += " vm=" + r.vm + ":" + std::to_string(r.reserved.size());
    }
    return out;
  }
  if (cmd == "sessions") return "ok " + SessionsJson();
  return "error unknown command '" + cmd + "' (attach, detach, status, sessions, migrate)";
}

std::string Daemon::HandOffMove(const std::string& line, int conn, const std::string& report) {
  std::istringstream in(line);
  std::string cmd, id, to;
  if (!(in >> cmd >> id >> to) || id.empty() || id.size() > 10 ||
      id.find_first_not_of("0123456789") != std::string::npos || to.size() > 60) {
    return "error usage: migrate SESSION HOST:PORT";
  }
  const auto session = static_cast<uint32_t>(std::stoul(id));
  // The request to the session's worker, on its control socket `control` (`pid` gets SIGUSR2),
  // with the token the program comes back with should it not reach the target. A session on a
  // vGPU share whose vGPUs the controller holds for it (oriond asked for them: every program's
  // first session starts a share) takes that allocation along ("share") when it is the share's
  // one session; the share takes no new session meanwhile, and oriond watches the worker's
  // answer (WatchMoves) to open it again should the move fail.
  auto hand = [&](int control, pid_t pid, const std::string& hold, const std::string& allocation,
                  const std::string& back) -> std::string {
    // A controller's allocation moves only through the controller, which reserves its vGPUs at
    // the target: the target's controller admits a moving allocation nowhere else.
    if (report.empty() && link_ && !allocation.empty() && !hold.starts_with("job/")) {
      return "error session " + id + "'s vGPUs are Orion Controller allocation " + allocation +
             ", which the controller moves: POST /v1/allocations/" + allocation +
             "/migrate with the admin key (or a drain of this server)";
    }
    Hold* share = nullptr;
    if (auto h = holds_.find(hold);
        h != holds_.end() && hold.starts_with("share/") && !h->second.allocation_id.empty()) {
      if (h->second.sessions > 1) {
        return "error session " + id + " is one of the " + std::to_string(h->second.sessions) +
               " processes on vGPU share " + hold.substr(6, 8) +
               " (ORION_SHARE: the processes its program started), whose vGPUs the Orion Controller holds as one "
               "allocation; it moves only with the share's last process";
      }
      if (h->second.moving) return "error session " + id + "'s vGPU share is moving already";
      share = &h->second;
    }
    const std::string msg = "migrate " + to + " " + back + (share != nullptr ? " share" : "");
    int asker = conn;
    int pair[2] = {-1, -1};
    if (!report.empty()) {  // (a share's allocation moves only so: see above)
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
        return std::string("error no socketpair: ") + std::strerror(errno);
      }
      asker = pair[1];
    }
    const bool sent = SendWithFd(control, msg.data(), msg.size(), asker);
    const int err = errno;
    if (pair[1] >= 0) ::close(pair[1]);  // the worker has its own copy
    if (!sent) {
      if (pair[0] >= 0) ::close(pair[0]);
      return "error session " + id + "'s worker does not take requests: " + std::strerror(err);
    }
    if (pair[0] >= 0) {
      fcntl(pair[0], F_SETFL, fcntl(pair[0], F_GETFL) | O_NONBLOCK);
      watched_moves_.push_back({pair[0], report, share != nullptr ? hold : std::string(), to, ""});
      if (share != nullptr) share->moving = true;
    }
    kill(pid, SIGUSR2);
    log_->info("Session {}: a move to {} is asked for{}", session, to,
               share != nullptr ? " (with its vGPU share's allocation " + share->allocation_id + ")" : "");
    return "";
  };
  for (const Region& r : regions_) {
    for (uint32_t i = 0; i < r.channel_count; ++i) {
      const Channel& c = r.channels[i];
      if (c.state != Channel::kServing || c.session != session) continue;
      if (!r.vm.empty()) {
        return "error session " + id + " is VM " + r.vm +
               "'s; its ivshmem channel stays with the VM on this host, so it cannot move";
      }
      const auto ctl = shm_controls_.find(c.pid);
      if (ctl == shm_controls_.end()) return "error session " + id + "'s worker has no control socket";
      // The way back, should the program not reach the target: it resumes on its own channel
      // with this token, which the worker checks.
      const std::string back = NewResumeToken();
      if (back.empty()) return "error no entropy for a resume token";
      return hand(ctl->second, c.pid, c.hold, c.allocation_id, back);
    }
  }
  for (NetSession& n : net_sessions_) {
    if (n.session != session) continue;
    if (n.control < 0) return "error session " + id + " cannot be asked to move (it is itself arriving)";
    // The way back, should the program not reach the target: a token it resumes here with.
    const std::string back = NewResumeToken();
    if (back.empty()) return "error no entropy for a resume token";
    std::string err = hand(n.control, n.pid, n.hold, n.allocation_id, back);
    if (!err.empty()) return err;
    n.back_token = back;
    n.back_deadline_ms = MonotonicMs() + kMoveBackMs;
    return "";
  }
  return "error no session " + id + " here ('sessions' lists them)";
}

void Daemon::MoveForController() {
  if (!link_) return;
  for (const auto& move : link_->TakeMoves()) {
    const std::string& id = move.first;  // (a structured binding cannot be captured before C++20 in clang 14)
    const std::string& to = move.second;
    if (std::any_of(watched_moves_.begin(), watched_moves_.end(), [&](const WatchedMove& m) { return m.report == id; }))
      continue;  // under way: the controller announces a move until it ends
    // The session serving the allocation: its own, or a vGPU share's (HandOffMove checks that it
    // is the share's one session). A job's sessions do not move.
    auto serves = [&](const std::string& allocation, const std::string& hold) {
      return allocation == id && (hold.empty() || hold.starts_with("share/"));
    };
    uint32_t session = 0;
    for (const NetSession& x : net_sessions_) {
      if (serves(x.allocation_id, x.hold)) session = x.session;
    }
    for (const Region& r : regions_) {
      for (uint32_t i = 0; i < r.channel_count; ++i) {
        const Channel& c = r.channels[i];
        if (c.state == Channel::kServing && serves(c.allocation_id, c.hold)) session = c.session;
      }
    }
    std::string err = session == 0 ? "no session of this oriond serves it"
                                   : HandOffMove("migrate " + std::to_string(session) + " " + to, -1, id);
    if (err.empty()) {
      log_->info("Session {}: the Orion Controller moves allocation {} to {}", session, id, to);
      continue;
    }
    if (err.starts_with("error ")) err = err.substr(6);
    log_->warn("Allocation {}: not moved to {}: {}", id, to, err);
    link_->ReportMove(id, false, 0, err);
  }
}

// The workers' answers to the controller's moves: "ok ..." once the target committed (it reports
// that to the controller), else why not, which is reported to the controller; a share that did
// not move takes sessions again.
void Daemon::WatchMoves() {
  for (auto it = watched_moves_.begin(); it != watched_moves_.end();) {
    char buf[512];
    const ssize_t r = ::read(it->fd, buf, sizeof buf);
    if (r > 0 && it->answer.size() < 4096) it->answer.append(buf, static_cast<size_t>(r));
    if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EINTR))) {
      ++it;
      continue;
    }
    std::string answer = it->answer.substr(0, it->answer.find('\n'));
    if (answer.empty()) answer = "error the session's worker ended without an answer";
    if (!answer.starts_with("ok ")) {
      const std::string why = answer.starts_with("error ") ? answer.substr(6) : answer;
      log_->warn("Allocation {}: not moved to {}: {}", it->report, it->to, why);
      if (link_) link_->ReportMove(it->report, false, 0, why);
      if (auto h = holds_.find(it->hold); !it->hold.empty() && h != holds_.end()) h->second.moving = false;
    }
    ::close(it->fd);
    it = watched_moves_.erase(it);
  }
}

std::string Daemon::SessionsJson() const {
  nlohmann::json out = nlohmann::json::array();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string server = std::string(host) + " (oriond, " + (backend_ == BackendKind::kCuda ? "cuda" : "sim") + ")";
  auto add = [&](uint32_t session, const std::vector<Placement>& placements, const std::string& allocation_id, int slot,
                 const ClientInfo& c, const std::string& hold, const std::map<uint32_t, int>& own) {
    auto h = holds_.find(hold);
    const std::map<uint32_t, int>& compute = !hold.empty() && h != holds_.end() ? h->second.compute : own;
    nlohmann::json places = nlohmann::json::array();
    const std::atomic<uint64_t>* used = StatSlot(slot);
    for (size_t d = 0; d < placements.size(); ++d) {
      const Placement& p = placements[d];
      places.push_back(
          {{"server", server},
           {"pgpu", p.pgpu},
           {"vgpu", p.vgpu},
           {"gmem_mib", p.quota_bytes >> 20},
           {"used_mib", used != nullptr && d < kMaxDevices ? used[d].load(std::memory_order_relaxed) >> 20 : 0},
           {"gpu_name", p.pgpu < gpu_names_.size() ? gpu_names_[p.pgpu] : std::string()},
           {"compute", ComputeJson(p.pgpu, compute)}});
    }
    // Client-supplied names are bytes: JSON needs UTF-8, so bad bytes become U+FFFD at dump time.
    out.push_back({{"session", session},
                   {"transport", c.transport},
                   {"server", server},
                   {"allocation_id", allocation_id},
                   {"client", {{"pid", c.pid}, {"process", c.process}, {"host", c.host}}},
                   {"placements", std::move(places)}});
  };
  for (const Region& r : regions_) {
    for (const Channel& c : r.channels) {
      if (c.state == Channel::kServing)
        add(c.session, c.placements, c.allocation_id, c.stat_slot, c.client, c.hold,
            r.vm.empty() ? c.compute : r.compute);
    }
  }
  for (const NetSession& n : net_sessions_)
    add(n.session, n.placements, n.allocation_id, n.stat_slot, n.client, n.hold, n.compute);
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string Daemon::MetricsText() const {
  // One family at a time: HELP and TYPE, then its samples (Prometheus text format 0.0.4).
  struct Family {
    const char* name;
    const char* type;
    const char* help;
    std::string samples;
  };
  Family ratio{"orion_session_compute_ratio",
               "gauge",
               "Percent of its physical GPU's compute promised to the session's tenant (0: best effort)",
               {}};
  Family busy{"orion_session_compute_busy_seconds_total",
              "counter",
              "Device time the session's tenant's kernels used on its physical GPU (compute-share scheduler)",
              {}};
  Family throttled{"orion_session_compute_throttled_seconds_total",
                   "counter",
                   "Time the session's tenant's work waited for the device (its share, or a cap)",
                   {}};
  Family util{"orion_session_compute_utilization_ratio",
              "gauge",
              "The tenant's device time over wall time in NVML's last sample period (0..1)",
              {}};
  Family mem{"orion_session_memory_used_bytes", "gauge", "Device memory the session holds on the vGPU", {}};
  Family quota{"orion_session_memory_quota_bytes", "gauge", "The vGPU's memory quota", {}};
  Family gpu_ratio{"orion_gpu_compute_ratio_sum",
                   "gauge",
                   "Sum of the compute ratios promised on the physical GPU (at most 100)",
                   {}};
  const bool measured = compute_ != nullptr;  // both backends gate and measure compute when the scheduler is on
  auto num = [](double v) {
    char b[64];
    std::snprintf(b, sizeof b, " %.9g\n", v);
    return std::string(b);
  };
  auto count = [](uint64_t v) { return " " + std::to_string(v) + "\n"; };  // bytes, ratios: exact
  auto add = [&](uint32_t session, const std::vector<Placement>& placements, int slot, const ClientInfo& c,
                 const std::string& hold, const std::map<uint32_t, int>& own) {
    auto h = holds_.find(hold);
    const std::map<uint32_t, int>& compute = !hold.empty() && h != holds_.end() ? h->second.compute : own;
    const std::atomic<uint64_t>* used = StatSlot(slot);
    for (size_t d = 0; d < placements.size(); ++d) {
      const Placement& p = placements[d];
      std::string lbl = "{session=\"" + std::to_string(session) + "\",pgpu=\"" + std::to_string(p.pgpu) + "\",vgpu=\"" +
                        std::to_string(p.vgpu) + "\",pid=\"" + std::to_string(c.pid) + "\",process=\"" +
                        PromLabel(c.process) + "\",transport=\"" + PromLabel(c.transport) + "\"";
      mem.samples += mem.name + lbl + "}" + count(used != nullptr && d < kMaxDevices ? used[d].load() : 0);
      quota.samples += quota.name + lbl + "}" + count(p.quota_bytes);
      auto it = compute.find(p.pgpu);
      if (compute_ == nullptr || p.pgpu >= kComputeGpus || it == compute.end() || it->second < 0) continue;
      const ComputeSlot& s = compute_[p.pgpu].slots[it->second];
      lbl += ",tenant=\"" + std::to_string(s.session) + "\",policy=\"" + ComputePolicyName(s.policy) + "\"}";
      ratio.samples += ratio.name + lbl + count(s.ratio);
      if (!measured) continue;
      busy.samples += busy.name + lbl + num(static_cast<double>(s.busy_ns.load()) / 1e9);
      throttled.samples += throttled.name + lbl + num(static_cast<double>(s.throttled_ns.load()) / 1e9);
      util.samples += util.name + lbl + num(ComputeUtilization(s) / 1000.0);
    }
  };
  for (const Region& r : regions_) {
    for (const Channel& c : r.channels) {
      if (c.state == Channel::kServing)
        add(c.session, c.placements, c.stat_slot, c.client, c.hold, r.vm.empty() ? c.compute : r.compute);
    }
  }
  for (const NetSession& n : net_sessions_) add(n.session, n.placements, n.stat_slot, n.client, n.hold, n.compute);
  if (compute_ != nullptr) {
    for (size_t g = 0; g < gpu_names_.size() && g < kComputeGpus; ++g) {
      gpu_ratio.samples += std::string(gpu_ratio.name) + "{pgpu=\"" + std::to_string(g) + "\",name=\"" +
                           PromLabel(gpu_names_[g]) + "\"}" + count(ComputeRatioSum(compute_[g]));
    }
  }
  std::string out;
  for (const Family* f : {&ratio, &busy, &throttled, &util, &mem, &quota, &gpu_ratio}) {
    out += std::string("# HELP ") + f->name + " " + f->help + "\n# TYPE " + f->name + " " + f->type + "\n" + f->samples;
  }
  return out;
}

Result<std::unique_ptr<ivshmem::DoorbellServer>> Daemon::MakeDoorbell(const std::string& path,
                                                                      const std::string& socket, uint32_t vectors,
                                                                      std::vector<UniqueFd> kept) const {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return NotFound("region " + path + ": " + std::strerror(errno));
  return ivshmem::DoorbellServer::Create(socket, path, vectors, st.st_uid, st.st_gid, std::move(kept));
}

void Daemon::KeepDoorbell(const Region& r) {
  if (!r.bell) return;
  if (!keeper_) {
    log_->warn("VM {}: no state_file, so its doorbell does not survive an oriond restart", r.vm);
    return;
  }
  if (Status s = keeper_->Put(r.vm, r.bell->host_vector_fds()); !s.ok()) {
    log_->warn("VM {}: its doorbell will not survive an oriond restart: {}", r.vm, s.message());
  }
}

std::string Daemon::Attach(const std::string& vm, const std::string& path, uint32_t vgpus, uint64_t gmem_mib,
                           uint32_t processes, const std::string& bell_socket, uint32_t vectors, uint32_t ratio,
                           uint32_t ratio_policy) {
  if (!config_.enable_kvm) return "error oriond does not serve VMs: set enable_kvm = \"true\" or pass -k";
  if (!ValidVmName(vm)) return "error VM name '" + vm + "' must be 1..200 of [A-Za-z0-9._-]";
  if (path.empty() || path[0] != '/') return "error the region must be an absolute path";
  if (!bell_socket.empty() && (bell_socket[0] != '/' || vectors == 0 || vectors > ivshmem::kMaxDoorbellVectors)) {
    return "error the doorbell socket must be an absolute path and VECTORS 1.." +
           std::to_string(ivshmem::kMaxDoorbellVectors);
  }
  if (vgpus == 0 || vgpus > kMaxDevices) return "error VGPUS must be 1.." + std::to_string(kMaxDevices);
  if (processes > kMaxVmProcesses) return "error PROCESSES must be 0.." + std::to_string(kMaxVmProcesses);
  if (ratio > 100) return "error ratio must be 0..100";
  // What a stopped VM left behind (its file removed or replaced, e.g. while oriond was down) is
  // dropped first: never "already served" for a file that is gone.
  DropGoneVms();
  for (size_t i = 0; i < regions_.size();) {
    const Region& r = regions_[i];
    if (r.vm.empty() && r.map->path() == path && !r.map->StillAtPath()) {
      log_->info("{}: its file was removed or replaced; no longer served as a host region", path);
      regions_.erase(regions_.begin() + static_cast<std::ptrdiff_t>(i));  // no VM, no reserved vGPUs
      continue;
    }
    ++i;
  }
  for (Region& r : regions_) {
    if (r.vm == vm && r.map->path() == path && !bell_socket.empty() &&
        (!r.bell || r.bell->socket_path() != bell_socket)) {
      // Attached before (restored after an oriond restart, or its release never ran) and started
      // again with a doorbell: QEMU will connect to this socket.
      const uint32_t n = std::min(vectors, r.channel_count);
      auto bell = MakeDoorbell(path, bell_socket, n);
      if (!bell.ok()) return "error VM " + vm + ": " + bell.status().message();
      r.bell = std::move(*bell);
      ivshmem::PublishDoorbell(r.map->data(), ivshmem::kHostPeer, n);
      log_->info("VM {}: serves its ivshmem-doorbell on {} ({} vectors)", vm, bell_socket, n);
      KeepDoorbell(r);
      (void)SaveVms();
      return "ok already attached";
    }
    if (r.vm == vm && r.map->path() == path) return "ok already attached";
    if (r.map->path() == path) return "error " + path + " is already served";
    if (r.vm == vm) return "error VM " + vm + " is already attached to " + r.map->path();
  }
  Result<std::vector<Placement>> placements = std::vector<Placement>{};
  if (link_) {
    // Controller mode: the VM's standing assignment (kept by the controller while the VM exists).
    auto g = link_->Assign(vm, vgpus, gmem_mib, ratio);
    if (!g.ok()) {
      placements = g.status();
    } else if (Status st = pool_->Reserve(g->placements); !st.ok()) {
      link_->Unassign(vm);
      placements = st;
    } else {
      placements = std::move(g->placements);
    }
  } else {
    placements = pool_->Admit(vgpus, gmem_mib, pool::PlacementPolicy::kPack, ratio);
  }
  if (!placements.ok()) {
    log_->warn("VM {}: cannot reserve {} vGPU(s) of {} MiB: {}", vm, vgpus, gmem_mib, placements.status().message());
    return "error not enough vGPUs for VM " + vm + ": " + placements.status().message();
  }
  Region r;
  // The VM's compute share: one tenant for all its processes, held from now until it detaches.
  r.ratio = ratio;
  r.ratio_policy = ratio_policy;
  if (Status st = TakeVmCompute(r, *placements); !st.ok()) {
    pool_->Release(*placements);
    if (link_) link_->Unassign(vm);
    log_->warn("VM {}: {}", vm, st.message());
    return "error VM " + vm + ": " + st.message();
  }
  ivshmem::VmLimits limits = LimitsOf(*placements);
  if (!bell_socket.empty()) {
    // One vector per channel, as many as QEMU was given (<msi vectors>): the channel count is known
    // once the region is split, so the server is made for `vectors`; the region publishes as many as
    // it has channels (FormatRegion).
    auto bell = MakeDoorbell(path, bell_socket, vectors);
    if (!bell.ok()) {
      FreeCompute(&r.compute);
      pool_->Release(*placements);
      if (link_) link_->Unassign(vm);
      return "error VM " + vm + ": " + bell.status().message();
    }
    r.bell = std::move(*bell);
    limits.doorbell_vectors = vectors;
  }
  if (Status s = AddRegion(path, &r, processes, &limits); !s.ok()) {
    FreeCompute(&r.compute);
    pool_->Release(*placements);
    if (link_) link_->Unassign(vm);
    return "error " + s.message();
  }
  r.vm = vm;
  r.reserved = std::move(*placements);
  r.vgpus_asked = vgpus;
  r.gmem_asked_mib = gmem_mib;
  const std::string where = PlacementText(r.reserved);
  const uint32_t channels = r.channel_count;
  regions_.push_back(std::move(r));
  // Durable before the VM starts: a restart of oriond restores exactly this.
  if (Status s = SaveVms(); !s.ok()) {
    DropRegion(regions_.size() - 1, "its attachment could not be recorded");
    return "error cannot record the attachment (" + s.message() + "); set state_file in [orion] of server.conf";
  }
  KeepDoorbell(regions_.back());
  log_->info("VM {}: attached {} with vGPUs {} ({} channels: {} CUDA processes at once){}{}", vm, path, where, channels,
             channels, bell_socket.empty() ? std::string() : ", its ivshmem-doorbell on " + bell_socket,
             ratio == 0
                 ? std::string(", best-effort compute")
                 : ", " + std::to_string(ratio) + "% of each GPU's compute (" + ComputePolicyName(ratio_policy) + ")");
  return "ok " + where;
}

Status Daemon::TakeVmCompute(Region& r, const std::vector<Placement>& placements) {
  HelloReq h{};
  h.ratio = static_cast<uint8_t>(r.ratio);
  h.policy = static_cast<uint8_t>(r.ratio == 0 ? kPolicyShare : r.ratio_policy);
  return TakeCompute(h, 0, placements, &r.compute);
}

std::string Daemon::Detach(const std::string& vm) {
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].vm != vm) continue;
    DropRegion(i, "stopped");
    (void)SaveVms();
    return "ok";
  }
  return "ok not attached";
}

}  // namespace orion::host
