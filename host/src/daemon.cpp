#include "orion/host/daemon.h"

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
namespace {

// A client-chosen name, safe to log: printable ASCII only.
void SanitizeName(char* name, size_t size) {
  name[size - 1] = '\0';
  for (size_t i = 0; i < size && name[i] != '\0'; ++i) {
    if (name[i] < 0x20 || name[i] > 0x7e) name[i] = '?';
  }
}

uint64_t NowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000ull + static_cast<uint64_t>(ts.tv_nsec) / 1000000ull;
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

// The CUresult a refused Hello gets for an admission error.
CUresult RefusalCode(Code c) {
  switch (c) {
    case Code::kInvalidArgument:
    case Code::kNotFound: return CUDA_ERROR_INVALID_VALUE;
    case Code::kUnavailable: return CUDA_ERROR_DEVICE_UNAVAILABLE;
    default: return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

}  // namespace

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

Daemon::Daemon(ServerConfig config) : config_(std::move(config)) {}

Daemon::~Daemon() {
  if (link_) link_->Stop();
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
          "their PTX, SASS-only kernels (e.g. cuBLAS's) are validated and logged but NOT run. ***");
      backend_ = BackendKind::kSim;
    }
  }
  if (config_.backend == BackendKind::kSim) backend_ = BackendKind::kSim;
  if (backend_ == BackendKind::kSim) gpus = SimPhysicalGpus(config_.sim_gpus, config_.sim_gpu_mem_mib);
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

  // Per-session memory counters, shared with the workers (forked later).
  void* stats = mmap(nullptr, sizeof(std::atomic<uint64_t>) * kStatSlots * kMaxDevices, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (stats == MAP_FAILED) return Internal(std::string("cannot map session counters: ") + std::strerror(errno));
  stats_ = static_cast<std::atomic<uint64_t>*>(stats);
  stat_used_.assign(kStatSlots, false);

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
    if (Status st = AddRegion(p, &r); !st.ok()) return st;
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

  log_->info("Orion Server listens on {}:{} (backend {})", config_.bind_addr,
             listen_fd_ >= 0 ? std::to_string(config_.listen_port) : std::string("- (no TCP)"),
             backend_ == BackendKind::kCuda ? "cuda" : "sim");
  return Status::Ok();
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

namespace {
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
}  // namespace

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
    const ivshmem::VmLimits limits = LimitsOf(a.placements);
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
    log_->info("VM {}: restored {} with vGPUs {} (from {})", a.vm, a.region, PlacementText(a.placements),
               config_.state_file);
    regions_.push_back(std::move(r));
  }
  if (changed) (void)SaveVms();
  return Status::Ok();
}

Status Daemon::SaveVms() {
  if (config_.state_file.empty()) return Status::Ok();
  std::vector<VmAttachment> vms;
  for (const Region& r : regions_) {
    if (r.vm.empty()) continue;
    vms.push_back({r.vm, r.map->path(), r.vgpus_asked, r.gmem_asked_mib, r.processes, r.reserved});
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
    log_->info("Session {} exits (VM {} {}).", c.session, r.vm, why);
    --serving_;
  }
  pool_->Release(r.reserved);
  if (link_) link_->Unassign(r.vm);
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
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Internal(std::string("control socket: ") + std::strerror(errno));
  ::unlink(config_.control_socket.c_str());
  const mode_t old = umask(0077);  // root-only: it hands out vGPUs to VMs
  const int rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  umask(old);
  if (rc != 0 || listen(fd, 16) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    return Status(Code::kPermissionDenied,
                  "cannot listen on " + config_.control_socket + ": " + err + " (use --control-socket)");
  }
  control_fd_ = fd;
  return Status::Ok();
}

// One request per connection: a line in, a line out ("ok ..." or "error ...").
void Daemon::ServeControl() {
  if (control_fd_ < 0) return;
  for (;;) {
    const int c = accept4(control_fd_, nullptr, nullptr, SOCK_CLOEXEC);
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
    std::string reply = Control(line) + "\n";
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
    std::string vm, path;
    uint32_t vgpus = 0, processes = 0;
    uint64_t gmem = 0;
    if (!(in >> vm >> path >> vgpus >> gmem)) {
      return "error usage: attach VM REGION VGPUS GMEM_MIB [PROCESSES [SOCKET VECTORS]]";
    }
    if (!(in >> processes)) processes = 0;  // an older hook: shm_buffer_size decides
    std::string bell;
    uint32_t vectors = 0;
    if (in >> bell && !(in >> vectors))
      return "error usage: attach VM REGION VGPUS GMEM_MIB PROCESSES [SOCKET VECTORS]";
    return Attach(vm, path, vgpus, gmem, processes, bell, vectors);
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
  return "error unknown command '" + cmd + "' (attach, detach, status, sessions)";
}

std::string Daemon::SessionsJson() const {
  nlohmann::json out = nlohmann::json::array();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string server = std::string(host) + " (oriond, " + (backend_ == BackendKind::kCuda ? "cuda" : "sim") + ")";
  auto add = [&](uint32_t session, const std::vector<Placement>& placements, const std::string& allocation_id, int slot,
                 const ClientInfo& c) {
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
           {"gpu_name", p.pgpu < gpu_names_.size() ? gpu_names_[p.pgpu] : std::string()}});
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
      if (c.state == Channel::kServing) add(c.session, c.placements, c.allocation_id, c.stat_slot, c.client);
    }
  }
  for (const NetSession& n : net_sessions_) add(n.session, n.placements, n.allocation_id, n.stat_slot, n.client);
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<std::unique_ptr<ivshmem::DoorbellServer>> Daemon::MakeDoorbell(const std::string& path,
                                                                      const std::string& socket,
                                                                      uint32_t vectors) const {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return NotFound("region " + path + ": " + std::strerror(errno));
  return ivshmem::DoorbellServer::Create(socket, path, vectors, st.st_uid, st.st_gid);
}

std::string Daemon::Attach(const std::string& vm, const std::string& path, uint32_t vgpus, uint64_t gmem_mib,
                           uint32_t processes, const std::string& bell_socket, uint32_t vectors) {
  if (!config_.enable_kvm) return "error oriond does not serve VMs: set enable_kvm = \"true\" or pass -k";
  if (!ValidVmName(vm)) return "error VM name '" + vm + "' must be 1..200 of [A-Za-z0-9._-]";
  if (path.empty() || path[0] != '/') return "error the region must be an absolute path";
  if (!bell_socket.empty() && (bell_socket[0] != '/' || vectors == 0 || vectors > ivshmem::kMaxDoorbellVectors)) {
    return "error the doorbell socket must be an absolute path and VECTORS 1.." +
           std::to_string(ivshmem::kMaxDoorbellVectors);
  }
  if (vgpus == 0 || vgpus > kMaxDevices) return "error VGPUS must be 1.." + std::to_string(kMaxDevices);
  if (processes > kMaxVmProcesses) return "error PROCESSES must be 0.." + std::to_string(kMaxVmProcesses);
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
      return "ok already attached";
    }
    if (r.vm == vm && r.map->path() == path) return "ok already attached";
    if (r.map->path() == path) return "error " + path + " is already served";
    if (r.vm == vm) return "error VM " + vm + " is already attached to " + r.map->path();
  }
  Result<std::vector<Placement>> placements = std::vector<Placement>{};
  if (link_) {
    // Controller mode: the VM's standing assignment (kept by the controller while the VM exists).
    auto g = link_->Assign(vm, vgpus, gmem_mib);
    if (!g.ok()) {
      placements = g.status();
    } else if (Status st = pool_->Reserve(g->placements); !st.ok()) {
      link_->Unassign(vm);
      placements = st;
    } else {
      placements = std::move(g->placements);
    }
  } else {
    placements = pool_->Admit(vgpus, gmem_mib);
  }
  if (!placements.ok()) {
    log_->warn("VM {}: cannot reserve {} vGPU(s) of {} MiB: {}", vm, vgpus, gmem_mib, placements.status().message());
    return "error not enough vGPUs for VM " + vm + ": " + placements.status().message();
  }
  Region r;
  ivshmem::VmLimits limits = LimitsOf(*placements);
  if (!bell_socket.empty()) {
    // One vector per channel, as many as QEMU was given (<msi vectors>): the channel count is known
    // once the region is split, so the server is made for `vectors` and trimmed below if fewer.
    auto bell = MakeDoorbell(path, bell_socket, vectors);
    if (!bell.ok()) {
      pool_->Release(*placements);
      if (link_) link_->Unassign(vm);
      return "error VM " + vm + ": " + bell.status().message();
    }
    r.bell = std::move(*bell);
    limits.doorbell_vectors = vectors;
  }
  if (Status s = AddRegion(path, &r, processes, &limits); !s.ok()) {
    pool_->Release(*placements);
    if (link_) link_->Unassign(vm);
    return "error " + s.message();
  }
  if (r.bell && r.channel_count < vectors) ivshmem::PublishDoorbell(r.map->data(), ivshmem::kHostPeer, r.channel_count);
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
  log_->info("VM {}: attached {} with vGPUs {} ({} channels: {} CUDA processes at once){}", vm, path, where, channels,
             channels, bell_socket.empty() ? std::string() : ", its ivshmem-doorbell on " + bell_socket);
  return "ok " + where;
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

Status Daemon::OpenListener() {
  if (config_.listen_port == 0) return Status::Ok();  // network clients disabled
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
  addrinfo* res = nullptr;
  if (getaddrinfo(config_.bind_addr.c_str(), std::to_string(config_.listen_port).c_str(), &hints, &res) != 0) {
    return InvalidArgument("bind_addr '" + config_.bind_addr + "' is not an IP address");
  }
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool ok = fd >= 0 && bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 64) == 0;
  freeaddrinfo(res);
  if (!ok) {
    const std::string err = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return Unavailable("cannot listen on " + config_.bind_addr + ":" + std::to_string(config_.listen_port) + ": " +
                       err + " (-b/-p, or -p 0 for no network clients)");
  }
  listen_fd_ = fd;
  if (config_.enable_rdma) {
    if (auto devices = rdma::ListDevices(); devices.ok()) {
      log_->info("RDMA enabled: device(s) {}; clients that offer RDMA on an address of one of them run in RDMA mode",
                 *devices);
    } else {
      log_->warn("enable_rdma is on, but {}: network clients get TCP", devices.status().message());
    }
  }
  if (config_.client_key.empty()) {
    log_->warn(
        "TCP clients on {}:{} are not authenticated: anyone who reaches the port gets vGPUs "
        "(set client_key in [orion] of server.conf; clients pass ORION_KEY)",
        config_.bind_addr, config_.listen_port);
  }
  return Status::Ok();
}

void Daemon::AcceptClients(uint64_t now_ms) {
  if (listen_fd_ < 0) return;
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    const int c = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) break;
    char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
    getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, port, sizeof port,
                NI_NUMERICHOST | NI_NUMERICSERV);
    // Connections that have not said Hello yet are capped (kMaxPending in all, kMaxPendingPerSource
    // per address), so silent ones cannot use up oriond's descriptors. A new connection is never
    // turned away for it: the oldest silent one (of its source when that source is at its limit)
    // makes room, so a flood of silent connections cannot lock out clients that say Hello at once.
    constexpr size_t kMaxPending = 64, kMaxPendingPerSource = 16;
    size_t same = 0, oldest_same = pending_.size();
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (pending_[i].source != host) continue;
      if (same++ == 0) oldest_same = i;
    }
    const size_t evict = same >= kMaxPendingPerSource     ? oldest_same
                         : pending_.size() >= kMaxPending ? 0
                                                          : pending_.size();
    if (evict < pending_.size()) {
      if (++evicted_ % 64 == 1) {
        log_->warn("client {}: closed before its Hello to make room for new connections ({} so far; {} pending)",
                   pending_[evict].peer, evicted_, pending_.size());
      }
      ::close(pending_[evict].fd);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(evict));
    }
    const int one = 1, idle = 10, intvl = 2, cnt = 3;  // a dead client is noticed in ~16 s
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(c, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(c, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(c, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(c, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    pending_.push_back({c, std::string(host) + ":" + port, host, {}, now_ms});
    // Its Hello is usually there already: deal with it before more connections can push it out.
    Handshake(pending_.back());
    if (pending_.back().fd < 0) pending_.pop_back();
  }
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    Handshake(p);
    if (p.fd < 0) {
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (now_ms - p.since_ms > 5000) {
      log_->warn("client {}: no Hello within 5 s; connection closed", p.peer);
      ::close(p.fd);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

// Reads a network client's Hello; admits it (forking its worker) or refuses it. Sets p.fd = -1 when
// the connection is dealt with.
void Daemon::Handshake(Pending& p) {
  uint8_t buf[4096];
  for (;;) {
    const ssize_t n = ::recv(p.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      p.in.insert(p.in.end(), buf, buf + n);
      if (p.in.size() > 64 * 1024) break;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      ::close(p.fd);
      p.fd = -1;
      return;
    }
    break;
  }
  if (p.in.size() < sizeof(FrameHeader)) return;
  FrameHeader h;
  std::memcpy(&h, p.in.data(), sizeof h);
  if (h.magic != kFrameMagic || h.version != kProtocolVersion || h.op != static_cast<uint16_t>(Op::kHello) ||
      h.payload_len != sizeof(HelloReq)) {
    log_->error("client {}: the first frame is not a Hello of protocol {}; connection closed", p.peer,
                kProtocolVersion);
    ::close(p.fd);
    p.fd = -1;
    return;
  }
  if (p.in.size() < sizeof h + sizeof(HelloReq)) return;
  HelloReq hello;
  std::memcpy(&hello, p.in.data() + sizeof h, sizeof hello);
  SanitizeName(hello.process_name, sizeof hello.process_name);
  auto send_reply = [&](int32_t status, const std::string& msg) {
    FrameHeader r{};
    r.magic = kFrameMagic;
    r.version = kProtocolVersion;
    r.op = h.op;
    r.seq = h.seq;
    r.status = status;
    r.payload_len = static_cast<uint32_t>(msg.size());
    std::string out(reinterpret_cast<const char*>(&r), sizeof r);
    out += msg;
    ssize_t w = ::send(p.fd, out.data(), out.size(), MSG_NOSIGNAL);
    (void)w;
  };
  auto refuse = [&](CUresult code, const std::string& why) {
    log_->warn("client {}: refused '{}' (pid {}): {}", p.peer, hello.process_name, hello.pid, why);
    send_reply(code, why);
    ::close(p.fd);
    p.fd = -1;
  };
  if (hello.protocol_version != kProtocolVersion) {
    refuse(CUDA_ERROR_NOT_SUPPORTED,
           "protocol version " + std::to_string(hello.protocol_version) + " is not supported");
    return;
  }
  // The shared client key, compared in constant time.
  if (!config_.client_key.empty()) {
    char want[sizeof hello.key] = {};
    std::memcpy(want, config_.client_key.data(), std::min(config_.client_key.size(), sizeof want - 1));
    hello.key[sizeof hello.key - 1] = '\0';
    uint8_t diff = 0;
    for (size_t i = 0; i < sizeof want; ++i) diff |= static_cast<uint8_t>(want[i] ^ hello.key[i]);
    if (diff != 0) {
      refuse(CUDA_ERROR_NOT_PERMITTED, "authentication failed: wrong or missing ORION_KEY");
      return;
    }
  }
  // Transport: RDMA when the client offers it, enable_rdma is on and an RDMA device here owns the
  // address the client reached us on (the queue pair is made in the worker); else TCP.
  uint16_t transport = kTransportTcp;
  if (hello.transports & kTransportRdma) {
    std::string why;
    if (!config_.enable_rdma) {
      why = "enable_rdma is off";
    } else {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      if (getsockname(p.fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
        why = std::string("getsockname: ") + std::strerror(errno);
      } else if (auto port = rdma::FindPort(reinterpret_cast<sockaddr*>(&ss)); !port.ok()) {
        why = port.status().message();
      } else {
        transport = kTransportRdma;
        log_->info("client {}: Client supports RDMA mode, then server runs in RDMA mode. ({})", p.peer,
                   port->Describe());
      }
    }
    if (transport != kTransportRdma) {
      log_->info("client {}: Client supports RDMA mode, but {}; falls back to TCP mode.", p.peer, why);
    }
  }
  if (transport == kTransportTcp) {
    if ((hello.transports & kTransportTcp) == 0) {
      refuse(CUDA_ERROR_NOT_SUPPORTED, "the client offers no transport this oriond can use (TCP)");
      return;
    }
    log_->info("client {}: Client supports TCP mode, then server also falls back to TCP mode.", p.peer);
  }
  if (Status st = CheckRequest(&hello); !st.ok()) {
    refuse(RefusalCode(st.code()), st.message());
    return;
  }
  const uint32_t session = next_session_++;
  auto admitted = Acquire(hello, session, p.peer.substr(0, p.peer.rfind(':')));
  if (!admitted.ok()) {
    refuse(RefusalCode(admitted.status().code()), admitted.status().message());
    return;
  }
  auto* placements = &admitted->placements;
  const int slot = TakeStatSlot();
  log_->info("Creating session {} for '{}' (pid {}) from {} over {}", session, hello.process_name, hello.pid, p.peer,
             transport == kTransportRdma ? "RDMA" : "TCP");
  auto slog = SessionLogger(session);
  const int fd = p.fd;
  p.fd = -1;
  const pid_t pid = fork();
  if (pid < 0) {
    Finish(*placements, admitted->allocation_id, slot, "fork_failed");
    log_->error("cannot fork a worker: {}", std::strerror(errno));
    ::close(fd);
    return;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (control_fd_ >= 0) ::close(control_fd_);
    InWorker(-1);
    const int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    auto backend = MakeBackend(session);
    if (!backend.ok()) {
      slog->error("sess={} cannot load the CUDA driver: {}", session, backend.status().message());
      send_reply(CUDA_ERROR_NO_DEVICE, "oriond: " + backend.status().message());
      _exit(kExitBackendFailed);
    }
    SessionParams sp = BaseParams(session, *placements, slog);
    sp.socket_fd = fd;
    sp.allocation_id = admitted->allocation_id;
    sp.used_out = StatSlot(slot);
    sp.transport = transport;
    sp.channel_bytes = config_.shm_buffer_size_mib << 20;
    const int code = RunSession(sp, std::move(*backend), h, hello);
    slog->flush();
    _exit(code);
  }
  ::close(fd);
  if (link_ && !admitted->allocation_id.empty()) {
    // A job's allocation is shared by its sessions: no one session's memory figures stand for it.
    link_->Track(admitted->allocation_id, admitted->job ? nullptr : StatSlot(slot),
                 static_cast<uint32_t>(placements->size()));
  }
  std::string client_host(hello.hostname, strnlen(hello.hostname, sizeof hello.hostname));
  net_sessions_.push_back({pid,
                           session,
                           std::move(*placements),
                           admitted->allocation_id,
                           slot,
                           {hello.pid, hello.process_name, client_host.empty() ? p.source : client_host,
                            transport == kTransportRdma ? "rdma" : "tcp"}});
  ++serving_;
}

// In a worker: the backend of this daemon's kind, or why it cannot start.
Result<std::unique_ptr<Backend>> Daemon::MakeBackend(uint32_t session) const {
  if (backend_ == BackendKind::kCuda) return MakeCudaBackend(CudaOptions{config_.cuda_driver});
  SimOptions o;
  o.launch_log = config_.sim_launch_log;
  o.session_id = session;
  o.execute = config_.sim_execute;
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
    const uint32_t vectors = r.bell ? r.limits.doorbell_vectors : 0;
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
    if (r.bell && r.channel_count < vectors)
      ivshmem::PublishDoorbell(r.map->data(), ivshmem::kHostPeer, r.channel_count);
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
  std::string allocation_id;
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
    } else {
      placements = admitted.status();
    }
  }
  if (!placements.ok()) {
    refuse(RefusalCode(placements.status().code()), placements.status().message());
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
  const pid_t pid = fork();
  if (pid < 0) {
    if (r.vm.empty()) {
      Finish(*placements, allocation_id, slot, "fork_failed");
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
    sp.allocation_id = allocation_id;
    sp.used_out = StatSlot(slot);
    const int code = RunSession(sp, std::move(*backend), f.header, hello);
    slog->flush();
    _exit(code);
  }
  Channel& c = r.channels[index];
  c.state = Channel::kServing;
  c.pid = pid;
  c.session = session;
  c.placements = std::move(*placements);
  c.allocation_id = allocation_id;
  c.stat_slot = slot;
  c.client = {hello.pid, hello.process_name,
              std::string(hello.hostname, strnlen(hello.hostname, sizeof hello.hostname)),
              r.vm.empty() ? "shm" : "vm " + r.vm};
  if (link_ && !allocation_id.empty()) {
    link_->Track(allocation_id, jobs_.count(allocation_id) != 0 ? nullptr : StatSlot(slot),
                 static_cast<uint32_t>(c.placements.size()));
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

void Daemon::Reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto it = net_sessions_.begin(); it != net_sessions_.end(); ++it) {
      if (it->pid != pid) continue;
      --serving_;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      Finish(it->placements, it->allocation_id, it->stat_slot,
             code == kExitGoodbye ? "client_exited" : "session_ended");
      log_->info("Session {} exits ({}).", it->session,
                 code == kExitGoodbye      ? "client exited"
                 : code == kExitViolation  ? "protocol violation"
                 : code == kExitClientGone ? "client disconnected"
                                           : "worker ended");
      net_sessions_.erase(it);
      break;
    }
    for (Region& r : regions_) {
      for (uint32_t i = 0; i < r.channel_count; ++i) {
        Channel& c = r.channels[i];
        if (c.state != Channel::kServing || c.pid != pid) continue;
        --serving_;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (r.vm.empty()) {
          Finish(c.placements, c.allocation_id, c.stat_slot, code == kExitGoodbye ? "client_exited" : "session_ended");
        } else if (c.stat_slot >= 0) {
          stat_used_[static_cast<size_t>(c.stat_slot)] = false;  // a VM's vGPUs stay reserved for it
        }
        c.allocation_id.clear();
        c.stat_slot = -1;
        const char* why = r.severed                    ? "its region was truncated or overwritten"
                          : code == kExitGoodbye       ? "client exited"
                          : code == kExitLeaseExpired  ? "client lease expired"
                          : code == kExitViolation     ? "protocol violation"
                          : code == kExitBackendFailed ? "backend failed"
                          : code == kExitClientGone    ? "client disconnected"
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
  if (listen_fd_ >= 0) fds.push_back({listen_fd_, POLLIN, 0});
  if (control_fd_ >= 0) fds.push_back({control_fd_, POLLIN, 0});
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
    const uint64_t now = NowMs();
    if (now - last_vm_check >= 1000) {
      DropGoneVms();
      RepairSevered();
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
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int i = 0; i < 200 && serving_ > 0; ++i) {
    Reap();
    usleep(10000);
  }
  if (control_fd_ >= 0) {
    ::close(control_fd_);
    ::unlink(config_.control_socket.c_str());
  }
  if (link_) link_->Stop();
  return 0;
}

}  // namespace orion::host
