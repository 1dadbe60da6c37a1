// oriond (orion/host/daemon.h): start-up, session workers (backends, session logs), reaping, and
// the main loop. Admission, regions, network clients and VMs are in daemon_*.cpp.
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
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <new>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "orion/common/clock.h"
#include "orion/host/session.h"
#include "orion/host/vm_state.h"
#include "orion/ivshmem/ring.h"
#include "orion/rdma/endpoint.h"

namespace orion::host {

namespace daemon_detail {

// A client-chosen name, safe to log: printable ASCII only.
void SanitizeName(char* name, size_t size) {
  name[size - 1] = '\0';
  for (size_t i = 0; i < size && name[i] != '\0'; ++i) {
    if (name[i] < 0x20 || name[i] > 0x7e) name[i] = '?';
  }
}

spdlog::level::level_enum Level(const std::string& s) {
  if (s == "ERROR") return spdlog::level::err;
  if (s == "WARNING") return spdlog::level::warn;
  if (s == "DEBUG") return spdlog::level::debug;
  if (s == "TRACE") return spdlog::level::trace;
  return spdlog::level::info;
}

std::string TimeStamp() {
  char b[32];
  time_t t = time(nullptr);
  tm tmv{};
  localtime_r(&t, &tmv);
  strftime(b, sizeof b, "%Y%m%d-%H%M%S", &tmv);
  return b;
}

std::string NewResumeToken() {
  uint8_t raw[kShareTokenLen / 2];
  if (getentropy(raw, sizeof raw) != 0) return "";
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (uint8_t b : raw) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

// The CUresult a refused Hello gets for an admission error.
CUresult RefusalCode(Code c) {
  switch (c) {
    case Code::kInvalidArgument:
    case Code::kNotFound: return CUDA_ERROR_INVALID_VALUE;
    case Code::kUnavailable: return CUDA_ERROR_DEVICE_UNAVAILABLE;
    default: return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

std::string PlacementText(const std::vector<Placement>& placements) {
  std::string where;
  for (const auto& p : placements) {
    where += (where.empty() ? "" : ",") + std::to_string(p.pgpu) + "/" + std::to_string(p.vgpu) + ":" +
             std::to_string(p.quota_bytes >> 20) + "MiB";
  }
  return where;
}

ivshmem::VmLimits LimitsOf(const std::vector<Placement>& placements) {
  ivshmem::VmLimits l;
  l.vgpus = static_cast<uint32_t>(placements.size());
  l.gmem_bytes = placements.empty() ? 0 : placements[0].quota_bytes;
  for (const auto& p : placements) l.gmem_bytes = std::min(l.gmem_bytes, p.quota_bytes);
  return l;
}

LockHolder RegionLockHolder(const std::string& path) {
  LockHolder h;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return h;
  // /proc/locks: "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (proc(5)); the device is
  // major:minor in hex, the inode decimal.
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    std::istringstream in(line);
    std::string id, kind, mode, access, where;
    long pid = 0;
    if (!(in >> id >> kind >> mode >> access >> pid >> where) || kind != "FLOCK") continue;
    unsigned major = 0, minor = 0;
    unsigned long long inode = 0;
    if (std::sscanf(where.c_str(), "%x:%x:%llu", &major, &minor, &inode) != 3) continue;
    if (inode != st.st_ino || major != ::major(st.st_dev) || minor != ::minor(st.st_dev)) continue;
    std::string comm;
    std::ifstream c("/proc/" + std::to_string(pid) + "/comm");
    std::getline(c, comm);
    std::string safe;
    for (const char ch : comm.substr(0, 64)) safe += ch >= 0x20 && ch < 0x7f ? ch : '?';
    h.who = "pid " + std::to_string(pid) + (safe.empty() ? "" : " (" + safe + ")");
    // Another oriond: the same executable, run by the same user (a tenant can name its process
    // anything, but cannot be this user running this binary).
    std::error_code ec1, ec2;
    const auto mine = std::filesystem::read_symlink("/proc/self/exe", ec1);
    const auto theirs = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec2);
    struct stat ps {};
    if (ec1 || ::stat(("/proc/" + std::to_string(pid)).c_str(), &ps) != 0) return h;  // cannot tell
    // A process of another user has an exe link this one may not read (ec2): not this oriond.
    h.oriond = !ec2 && mine == theirs && ps.st_uid == ::geteuid();
    return h;
  }
  return h;
}

}  // namespace daemon_detail

using namespace daemon_detail;  // NOLINT(google-build-using-namespace)

Daemon::Daemon(ServerConfig config) : config_(std::move(config)) {}

Daemon::~Daemon() {
  if (link_) link_->Stop();
}

Status Daemon::Start() {
  Status s = StartServing();
  if (!s.ok() && log_) log_->error("oriond cannot start: {}", s.message());
  return s;
}

Status Daemon::StartServing() {
  // What oriond (and its workers) create is not world-readable: logs name clients, processes and
  // hosts, and the module cache holds the tenants' code. Logs 0640, directories 0750; the cache
  // is private (session.cpp).
  umask(umask(0) | 027);
  // Logs: <log_dir>/server.log, and the screen when asked.
  std::vector<spdlog::sink_ptr> sinks;
  std::error_code ec;
  std::filesystem::create_directories(config_.log_dir + "/session", ec);
  if (config_.log_to_file) {
    try {
      auto f = std::make_shared<spdlog::sinks::basic_file_sink_mt>(config_.log_dir + "/server.log");
      ::chmod((config_.log_dir + "/server.log").c_str(), 0640);  // also one an older oriond made
      f->set_level(Level(config_.file_log_level));
      sinks.push_back(f);
    } catch (const std::exception& e) {
      return Status(Code::kPermissionDenied,
                    "cannot write " + config_.log_dir + "/server.log: " + e.what() + " (use --log-dir)");
    }
  }
  if (config_.log_to_screen || sinks.empty()) {
    auto s = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    s->set_level(Level(config_.log_level));
    sinks.push_back(s);
  }
  log_ = std::make_shared<spdlog::logger>("oriond", sinks.begin(), sinks.end());
  log_->set_level(spdlog::level::trace);
  log_->set_pattern(config_.log_with_time ? "[%Y-%m-%d %H:%M:%S.%e] [%l] %v" : "[%l] %v");
  log_->flush_on(spdlog::level::trace);

  // Backend and GPUs.
  std::vector<PhysicalGpu> gpus;
  CudaOptions cuda_opt{config_.cuda_driver};
  if (config_.backend == BackendKind::kCuda || config_.backend == BackendKind::kAuto) {
    auto probe = ProbeCudaGpus(cuda_opt);
    if (probe.ok()) {
      backend_ = BackendKind::kCuda;
      gpus = std::move(*probe);
    } else if (config_.backend == BackendKind::kCuda) {
      return Unavailable("--backend cuda: no GPU answered: " + probe.status().message());
    } else {
      log_->warn("No GPU answered ({}).", probe.status().message());
      log_->warn(
          "*** Using the SIM backend: device memory lives in host RAM; kernels run on the CPU from "
          "their PTX, and a kernel with no PTX it can run (SASS only, e.g. cuBLAS's) fails its launch. ***");
      backend_ = BackendKind::kSim;
    }
  }
  if (config_.backend == BackendKind::kSim) backend_ = BackendKind::kSim;
  if (backend_ == BackendKind::kSim) {
    gpus = SimPhysicalGpus(config_.sim_gpus, config_.sim_gpu_mem_mib);
    if (!config_.sim_execute)
      log_->warn(
          "*** --sim-execute none: kernels are validated and logged, NEVER executed. Results are NOT "
          "computed: for API-level tests and launch-rate benchmarks only. ***");
    else if (config_.sim_skip_unexecutable)
      log_->warn(
          "*** --sim-unexecutable skip: kernels the sim cannot run (SASS only, ...) are accepted and NOT "
          "executed. Their results are NOT computed: for API-level tests only. ***");
  }
  for (const auto& g : gpus) {
    log_->info("Physical GPU {}: {} ({} MiB, {})", g.index, g.name, g.total_mem >> 20, g.uuid);
  }
  pool_ = std::make_unique<pool::VgpuPool>(gpus, config_.vgpu_count);
  for (const auto& g : gpus) {
    if (gpu_names_.size() <= g.index) gpu_names_.resize(g.index + 1);
    gpu_names_[g.index] = g.name;
  }
  log_->info("Final virtual gpu list <vID:pID:mbSize>: {}", pool_->FinalList());
  for (const auto& g : gpus) {
    for (uint32_t v = 0; v < config_.vgpu_count; ++v) log_->info("Registered v-GPU {} on p-GPU {}.", v, g.index);
  }

  // Per-session memory counters, then the holds' meters, shared with the workers (forked later).
  void* stats = mmap(nullptr, sizeof(std::atomic<uint64_t>) * kStatSlots * kMaxDevices * 2, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (stats == MAP_FAILED) return Internal(std::string("cannot map session counters: ") + std::strerror(errno));
  stats_ = static_cast<std::atomic<uint64_t>*>(stats);
  stat_used_.assign(kStatSlots, false);
  meters_ = stats_ + static_cast<size_t>(kStatSlots) * kMaxDevices;
  meter_used_.assign(kStatSlots, false);
  // The physical GPUs' compute-share schedulers (compute_share.h), shared with the workers.
  if (config_.compute_share) {
    void* compute =
        mmap(nullptr, sizeof(ComputeGpu) * kComputeGpus, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (compute == MAP_FAILED) {
      return Internal(std::string("cannot map the compute schedulers: ") + std::strerror(errno));
    }
    compute_ = static_cast<ComputeGpu*>(compute);
    for (uint32_t g = 0; g < kComputeGpus; ++g) new (&compute_[g]) ComputeGpu();
  } else {
    log_->warn("Compute share is off (--compute-share off): ORION_RATIO is placed but not enforced or measured");
  }

  // Module cache.
  if (!config_.cache_dir.empty()) {
    std::filesystem::create_directories(config_.cache_dir, ec);
    if (!ec) ::chmod(config_.cache_dir.c_str(), 0700);
    if (ec || access(config_.cache_dir.c_str(), W_OK) != 0) {
      log_->warn("module cache {} is not writable; caching modules per session only", config_.cache_dir);
      config_.cache_dir.clear();
    }
  }

  // The VMs attached before a restart come first: their regions keep their VM's vGPUs, quota and
  // channels, and are never taken for ordinary host regions below.
  std::vector<std::string> gone_vms;
  if (!config_.state_file.empty()) {
    keeper_ = std::make_unique<DoorbellKeeper>(config_.state_file + ".doorbells");
    if (!keeper_->usable()) {
      log_->warn("{}.doorbells is too long a path for a UNIX socket: VM doorbells do not survive a restart",
                 config_.state_file);
      keeper_.reset();
    }
  }
  if (Status st = RestoreVms(&gone_vms); !st.ok()) return st;

  // Regions.
  std::vector<std::string> paths = config_.shm_paths;
  if (paths.empty() && config_.enable_shm) {
    std::string dir = config_.shm_path_base;
    if (!dir.empty() && dir.back() != '/') dir += '/';
    if (DIR* d = opendir(dir.c_str()); d != nullptr) {
      while (dirent* e = readdir(d)) {
        if (std::strncmp(e->d_name, "orionsock", 9) != 0) continue;
        // orionsock-<domain> is a VM's region (orion-vm, the libvirt hook): served only when the
        // VM is attached, with the VM's limits; never as a host region open to any ORION_VGPU.
        if (e->d_name[9] == '-') continue;
        paths.push_back(dir + e->d_name);
      }
      closedir(d);
    }
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty() && regions_.empty()) {
    log_->warn("no shared-memory region to serve (create one with orion-shm, or pass --shm)");
  }
  // Everything this oriond owns alone (each region, the control socket, the TCP port) is taken
  // before it registers anywhere: a second oriond fails here, loudly, and changes nothing.
  for (const std::string& p : paths) {
    if (std::any_of(regions_.begin(), regions_.end(), [&](const Region& r) { return r.map->path() == p; })) continue;
    Region r;
    if (Status st = AddRegion(p, &r); !st.ok()) {
      if (st.code() != Code::kAlreadyExists) return st;
      // Its lock is held. By another oriond: refuse to start, as before. By any other process that
      // can open the file (a tenant could keep oriond from starting): serve everything else and try
      // the region again every second.
      const LockHolder holder = RegionLockHolder(p);
      if (holder.oriond) return Status(st.code(), st.message() + ": " + holder.who);
      log_->warn("{} is locked by {}, not by an oriond: not served until it is released (tried again every second)", p,
                 holder.who);
      held_regions_.push_back(p);
      continue;
    }
    regions_.push_back(std::move(r));
  }
  if (Status st = OpenControlSocket(); !st.ok()) return st;
  if (Status st = OpenListener(); !st.ok()) return st;

  // The controller, when one is configured; standalone admission otherwise.
  const std::string controller = ControllerAddrForServer(config_.controller_addr);
  if (!controller.empty()) {
    if (auto ep = controller::ParseEndpoints(controller); !ep.ok()) {
      return InvalidArgument("controller_addr: " + ep.status().message());
    }
    if (!config_.controller_tls_ca.empty()) controller::SetTlsCaFile(config_.controller_tls_ca);
    if (!config_.controller_tls_cert.empty() || !config_.controller_tls_key.empty())
      controller::SetTlsClientCert(config_.controller_tls_cert, config_.controller_tls_key);
    ControllerLinkOptions lo;
    lo.controller_addr = controller;
    lo.key = config_.controller_key;
    lo.server_id = config_.bind_addr + ":" + std::to_string(config_.listen_port);
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    lo.hostname = host;
    lo.vgpu_count = config_.vgpu_count;
    lo.gpus = gpus;
    lo.heartbeat_ms = config_.controller_heartbeat_ms;
    link_ = std::make_unique<ControllerLink>(lo, log_);
    link_->Start();
    for (const std::string& vm : gone_vms) link_->Unassign(vm);
  } else {
    log_->info("No Orion Controller configured: standalone mode (this oriond admits its own clients)");
  }

  if (!config_.metrics_addr.empty()) {
    auto m = MetricsServer::Start(config_.metrics_addr);
    if (!m.ok()) return m.status();
    metrics_ = std::move(*m);
    metrics_->Publish(MetricsText());
    log_->info("Prometheus metrics on http://{}/metrics (port {})", config_.metrics_addr, metrics_->port());
  }
  log_->info("Orion Server listens on {}:{} (backend {})", config_.bind_addr,
             listen_fd_ ? std::to_string(config_.listen_port) : std::string("- (no TCP)"),
             backend_ == BackendKind::kCuda ? "cuda" : "sim");
  return Status::Ok();
}

void Daemon::RetryHeldRegions() {
  for (auto it = held_regions_.begin(); it != held_regions_.end();) {
    Region r;
    const Status st = AddRegion(*it, &r);
    if (st.ok()) {
      log_->info("{}: its lock was released; serving it now", *it);
      regions_.push_back(std::move(r));
    } else if (st.code() == Code::kAlreadyExists) {
      ++it;
      continue;
    } else {
      log_->warn("{}: no longer tried: {}", *it, st.message());
    }
    it = held_regions_.erase(it);
  }
}

Status Daemon::AddRegion(const std::string& p, Region* out, uint32_t processes, const ivshmem::VmLimits* vm) {
  auto m = ivshmem::MappedRegion::OpenServed(p);
  if (!m.ok()) return Status(m.status().code(), "region " + p + ": " + m.status().message());
  Region& r = *out;
  r.map = std::make_unique<ivshmem::MappedRegion>(std::move(*m));
  const uint64_t size = r.map->size();
  uint64_t ch = config_.shm_buffer_size_mib << 20;
  if (processes > 0) {
    auto split = ivshmem::ChannelBytesFor(size, processes);
    if (!split.ok()) return Status(split.status().code(), "region " + p + ": " + split.status().message());
    ch = *split;
  } else if (ivshmem::ChannelCountFor(size, ch) == 0) {
    ch = (size - ivshmem::kHeaderBytes) & ~uint64_t{4095};
  }
  if (Status s = ivshmem::FormatRegion(r.map->data(), size, ch, vm); !s.ok()) {
    return Status(s.code(), "region " + p + ": " + s.message());
  }
  r.processes = processes;
  r.has_limits = vm != nullptr;
  if (vm != nullptr) r.limits = *vm;
  r.channel_bytes = ch;
  r.channel_count = ivshmem::ChannelCountFor(size, ch);
  r.epoch = ivshmem::Header(r.map->data())->server_epoch;
  r.channels.resize(r.channel_count);
  log_->info("Using SHM {} for acceleration ({} channels of {} MiB).", p, r.channel_count, ch >> 20);
  return Status::Ok();
}

// In a worker: the backend of this daemon's kind, or why it cannot start.
Result<std::unique_ptr<Backend>> Daemon::MakeBackend(uint32_t session) const {
  if (backend_ == BackendKind::kCuda) return MakeCudaBackend(CudaOptions{config_.cuda_driver});
  SimOptions o;
  o.launch_log = config_.sim_launch_log;
  o.session_id = session;
  o.execute = config_.sim_execute;
  o.skip_unexecutable = config_.sim_skip_unexecutable;
  if (config_.sim_driver_version != 0) o.driver_version = config_.sim_driver_version;
  o.kernel_timeout_ms = config_.sim_kernel_timeout_ms;
  o.workers = config_.sim_workers;
  return MakeSimBackend(o);
}

// What every session's worker gets, whatever its transport.
SessionParams Daemon::BaseParams(uint32_t session, const std::vector<Placement>& placements,
                                 std::shared_ptr<spdlog::logger> log) const {
  SessionParams sp;
  sp.session_id = session;
  sp.placements = placements;
  sp.cache_dir = config_.cache_dir;
  sp.cache_max_bytes = config_.cache_max_mib << 20;
  sp.lease_timeout_ms = config_.lease_timeout_ms;
  sp.net_stall_ms = config_.net_stall_ms;
  sp.log = std::move(log);
  return sp;
}

namespace {
// Session logs are bounded (issue #11): each at most kSessionLogBytes (past it the file starts over:
// spdlog's rotating sink with no backups), and the directory at most `keep` files ([orion]
// session_logs_max), the oldest removed first (names start with their creation time).
constexpr size_t kSessionLogBytes = size_t{16} << 20;

void PruneSessionLogs(const std::string& dir, uint64_t keep) {
  std::error_code ec;
  std::vector<std::filesystem::path> logs;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".log") logs.push_back(e.path());
  }
  if (logs.size() < keep) return;
  std::sort(logs.begin(), logs.end());
  for (size_t i = 0; i + keep <= logs.size(); ++i) std::filesystem::remove(logs[i], ec);
}
}  // namespace

std::shared_ptr<spdlog::logger> Daemon::SessionLogger(uint32_t session) {
  std::vector<spdlog::sink_ptr> sinks = log_->sinks();
  const std::string dir = config_.log_dir + "/session";
  if (session % 16 == 1) PruneSessionLogs(dir, config_.session_logs_max);  // a scan every 16 sessions
  try {
    sinks.push_back(std::make_shared<spdlog::sinks::rotating_file_sink_mt>(
        dir + "/" + TimeStamp() + "-" + std::to_string(session) + ".log", kSessionLogBytes, 0));
  } catch (...) {
  }
  auto l = std::make_shared<spdlog::logger>("session", sinks.begin(), sinks.end());
  l->set_level(spdlog::level::trace);
  l->set_pattern(config_.log_with_time ? "[%Y-%m-%d %H:%M:%S.%e] [%l] %v" : "[%l] %v");
  l->flush_on(spdlog::level::trace);
  return l;
}

void Daemon::Reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    if (auto ctl = shm_controls_.find(pid); ctl != shm_controls_.end()) {
      ::close(ctl->second);
      shm_controls_.erase(ctl);
    }
    for (auto it = net_sessions_.begin(); it != net_sessions_.end(); ++it) {
      if (it->pid != pid) continue;
      --serving_;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      ReleaseDevices(pid, it->placements);
      FreeCompute(&it->compute);
      // A session that moved away with its program's own allocation: the allocation went with it
      // (the target serves it now), so it is not released here.
      const bool moved_away = code == kExitMoved && it->hold.empty() && !it->allocation_id.empty() && link_;
      if (moved_away) link_->Untrack(it->allocation_id);
      Finish(it->placements, moved_away ? std::string() : it->allocation_id, it->stat_slot,
             code == kExitGoodbye ? "client_exited" : "session_ended", it->hold, code == kExitMoved);
      log_->info("Session {} exits ({}).", it->session,
                 code == kExitGoodbye      ? "client exited"
                 : code == kExitViolation  ? "protocol violation"
                 : code == kExitClientGone ? "client disconnected"
                 : code == kExitMoved      ? "moved to another oriond"
                                           : "worker ended");
      if (it->control >= 0) ::close(it->control);
      if (it->route >= 0) ::close(it->route);
      net_sessions_.erase(it);
      break;
    }
    for (Region& r : regions_) {
      for (uint32_t i = 0; i < r.channel_count; ++i) {
        Channel& c = r.channels[i];
        if (c.state != Channel::kServing || c.pid != pid) continue;
        --serving_;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        ReleaseDevices(pid, c.placements);
        FreeCompute(&c.compute);
        // A session that moved away with its program's own allocation: the target serves it now.
        const bool moved_away = code == kExitMoved && c.hold.empty() && !c.allocation_id.empty() && link_;
        if (moved_away) link_->Untrack(c.allocation_id);
        if (r.vm.empty()) {
          Finish(c.placements, moved_away ? std::string() : c.allocation_id, c.stat_slot,
                 code == kExitGoodbye ? "client_exited" : "session_ended", c.hold, code == kExitMoved);
        } else {
          // A VM's vGPUs stay reserved for it; the session's memory leaves the VM's meter, which
          // goes with the VM's last session.
          Unmeter(r.meter, c.stat_slot);
          if (c.stat_slot >= 0) stat_used_[static_cast<size_t>(c.stat_slot)] = false;
          const bool others = std::any_of(r.channels.begin(), r.channels.end(),
                                          [&](const Channel& o) { return &o != &c && o.state == Channel::kServing; });
          if (!others && r.meter >= 0) {
            meter_used_[static_cast<size_t>(r.meter)] = false;
            r.meter = -1;
          }
        }
        c.allocation_id.clear();
        c.hold.clear();
        c.stat_slot = -1;
        const char* why = r.severed                    ? "its region was truncated or overwritten"
                          : code == kExitGoodbye       ? "client exited"
                          : code == kExitLeaseExpired  ? "client lease expired"
                          : code == kExitViolation     ? "protocol violation"
                          : code == kExitBackendFailed ? "backend failed"
                          : code == kExitClientGone    ? "client disconnected"
                          : code == kExitMoved         ? "moved to another oriond"
                                                       : "worker crashed";
        if (WIFSIGNALED(status) && !r.severed) {
          log_->error("Session {} worker died with signal {}", c.session, WTERMSIG(status));
        }
        log_->info("Session {} exits ({}).", c.session, why);
        if (code == kExitGoodbye) {
          Reset(r, i);
        } else {
          SetDead(r, i, code == kExitViolation ? CUDA_ERROR_ILLEGAL_STATE : CUDA_ERROR_DEVICE_UNAVAILABLE);
        }
      }
    }
  }
}

void Daemon::InWorker(int keep) {
  for (Region& r : regions_) {
    if (r.bell) r.bell->CloseInChild(keep);
  }
  // Other sessions' control and routing sockets are oriond's alone.
  for (NetSession& n : net_sessions_) {
    if (n.control >= 0) ::close(n.control);
    if (n.route >= 0) ::close(n.route);
    n.control = n.route = -1;
  }
  for (const auto& [pid, fd] : shm_controls_) ::close(fd);
  shm_controls_.clear();
  if (keeper_) keeper_->CloseInChild();
}

void Daemon::PollOnce(int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, bool>> bells;  // region index, peer (else listener)
  for (size_t i = 0; i < regions_.size(); ++i) {
    const auto& b = regions_[i].bell;
    if (!b) continue;
    fds.push_back({b->listen_fd(), POLLIN, 0});
    bells.emplace_back(i, false);
    if (b->connected()) {
      fds.push_back({b->peer_fd(), POLLIN, 0});
      bells.emplace_back(i, true);
    }
  }
  // Network and control connections are accepted in the loop; their readiness only ends the wait.
  if (listen_fd_) fds.push_back({listen_fd_.get(), POLLIN, 0});
  if (control_fd_) fds.push_back({control_fd_.get(), POLLIN, 0});
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
  for (size_t k = 0; k < bells.size(); ++k) {
    if (fds[k].revents == 0) continue;
    Region& r = regions_[bells[k].first];
    const std::string what = bells[k].second ? r.bell->PeerReadable() : r.bell->Accept();
    if (what.empty()) continue;
    // A peer that sends anything breaks the one-way protocol: only its connection ends, the VM's
    // sessions go on (they nap if no QEMU rings any more).
    if (what.find("one-way") != std::string::npos || what.find("refused") != std::string::npos) {
      log_->warn("VM {}: {}", r.vm, what);
    } else {
      log_->info("VM {}: {}", r.vm, what);
    }
  }
}

int Daemon::Run() {
  uint64_t last_beat = 0, last_vm_check = 0;
  while (!stop_.load()) {
    const uint64_t now = MonotonicMs();
    if (now - last_vm_check >= 1000) {
      DropGoneVms();
      RepairSevered();
      SampleCompute(now);
      RetryHeldRegions();
      if (metrics_) metrics_->Publish(MetricsText());
      last_vm_check = now;
    }
    if (now - last_beat >= 100) {
      for (Region& r : regions_) {
        if (!RegionIntact(r)) continue;
        // H0: liveness only; clients compare successive values.
        ivshmem::Header(r.map->data())->server_heartbeat.fetch_add(1, std::memory_order_relaxed);
      }
      last_beat = now;
    }
    Reap();
    EndRevoked();
    MoveForController();
    WatchMoves();
    ServeControl();
    AcceptClients(now);
    for (Region& r : regions_) {
      if (r.severed) continue;
      for (uint32_t i = 0; i < r.channel_count; ++i) Scan(r, i, now);
    }
    PollOnce(5);  // 5 ms: a new shared-memory client waits at most this long for its worker
  }
  log_->info("oriond stopping: ending {} session(s)", serving_);
  for (Region& r : regions_) {
    for (uint32_t i = 0; i < r.channel_count; ++i) {
      if (r.channels[i].state == Channel::kServing) kill(r.channels[i].pid, SIGTERM);
    }
  }
  for (const NetSession& n : net_sessions_) kill(n.pid, SIGTERM);
  listen_fd_.reset();
  for (int i = 0; i < 200 && serving_ > 0; ++i) {
    Reap();
    usleep(10000);
  }
  if (control_fd_) {
    control_fd_.reset();
    ::unlink(config_.control_socket.c_str());
  }
  if (link_) link_->Stop();
  metrics_.reset();
  return 0;
}

}  // namespace orion::host
