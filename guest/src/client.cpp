#include "client.h"

#include <dirent.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "orion/common/text.h"
#include "orion/controller/client.h"
#include "orion/ivshmem/discover.h"
#include "version.h"

namespace orion::guest {
namespace {

using ivshmem::Backoff;
using ivshmem::ChannelLayout;
using ivshmem::kChannelClaimed;
using ivshmem::kChannelFree;

constexpr uint64_t kChunk = 1ull << 20;  // bulk copy chunk
constexpr uint64_t kPinnedAlign = 256;
constexpr auto kHeartbeatTimeout = std::chrono::seconds(5);
// The longest a wait for a reply blocks on a network socket at once (FrameChannel::AwaitInput)
// before it checks the deadline and the server's liveness again.
constexpr uint32_t kAwaitInputUs = 50000;
// HandshakeLocked: oriond chose RDMA but this end could not set it up; connect again over TCP.
constexpr auto kRetryOverTcp = static_cast<CUresult>(1002);  // private, never returned to applications

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t EnvU64(const char* name, uint64_t dflt, bool* bad) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return dflt;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(e, &end, 10);
  if (errno != 0 || end == e || *end != '\0') {
    *bad = true;
    LogError(std::string(name) + "='" + e + "' is not a number");
    return dflt;
  }
  return v;
}

// This process's name (/proc/self/comm), for oriond's logs and the controller's records.
std::string ProcessName() {
  char comm[64] = {};
  if (FILE* f = std::fopen("/proc/self/comm", "r")) {
    if (std::fgets(comm, sizeof comm, f) != nullptr) comm[std::strcspn(comm, "\n")] = '\0';
    std::fclose(f);
  }
  return comm;
}

thread_local uint64_t t_ctx_handle = 0;

// Whether `v` is a CUresult this driver knows (cuda.h's list).
bool KnownResult(int32_t v) noexcept {
  switch (v) {
#define ORION_CUDA_ERROR(num, name, text) case num:
#include "cuda_errors.inc"
#undef ORION_CUDA_ERROR
    return true;
    default: return false;
  }
}

// Ops whose reply legitimately waits for device work (a kernel of any length): no reply deadline.
bool MayWaitForDevice(Op op) noexcept {
  switch (op) {
    case Op::kSync:
    case Op::kCtxDestroy:
    case Op::kCtxSynchronize:
    case Op::kPrimaryCtxRelease:
    case Op::kPrimaryCtxReset:
    case Op::kMemFree:
    case Op::kMemcpyHtoD:
    case Op::kMemcpyDtoH:
    case Op::kMemcpy2D:
    case Op::kModuleLoad:
    case Op::kModuleUnload:
    case Op::kStreamDestroy:
    case Op::kStreamSynchronize:
    case Op::kEventSynchronize: return true;
    default: return false;
  }
}

}  // namespace

uint64_t& ThreadContextHandle() noexcept { return t_ctx_handle; }

// Whether oriond beats the region's heartbeat (every 100 ms): watched for up to 350 ms.
static bool HeartbeatMoves(const ivshmem::RegionHeader* h) noexcept {
  const uint64_t first = h->server_heartbeat.load(std::memory_order_relaxed);
  for (int i = 0; i < 35; ++i) {
    timespec ts{0, 10000000};
    nanosleep(&ts, nullptr);
    if (h->server_heartbeat.load(std::memory_order_relaxed) != first) return true;
  }
  return false;
}

Client& Client::Get() {
  // Leaked on purpose: cudart's exit handlers may call into the driver after static destructors.
  static Client* c = new Client();
  return *c;
}

CUresult RequestedVgpuCount(uint32_t* n) noexcept {
  bool bad = false;
  const uint64_t vgpus = EnvU64("ORION_VGPU", 1, &bad);
  if (bad || vgpus == 0 || vgpus > kMaxDevices) return CUDA_ERROR_INVALID_VALUE;
  *n = static_cast<uint32_t>(vgpus);
  return CUDA_SUCCESS;
}

// CUDA_VISIBLE_DEVICES as NVIDIA's driver reads it (CUDA C++ Programming Guide, "CUDA Environment
// Variables"): comma-separated device indices (or UUIDs), enumerated in that order; the list ends at
// the first entry that is not a valid index of the `count` devices. Returns k when the visible
// devices are exactly 0..k-1 in order (k may be 0: no device), -1 for any other list (UUIDs,
// another order, a gap), which Orion does not apply.
static int64_t VisiblePrefix(const char* list, uint64_t count) {
  std::vector<uint64_t> visible;
  std::string_view rest(list);
  while (true) {
    const size_t comma = rest.find(',');
    std::string_view tok = rest.substr(0, comma);
    while (!tok.empty() && tok.front() == ' ') tok.remove_prefix(1);
    while (!tok.empty() && tok.back() == ' ') tok.remove_suffix(1);
    if (tok.starts_with("GPU-") || tok.starts_with("MIG-")) return -1;
    uint64_t index = 0;
    bool digits = !tok.empty() && tok.size() <= 6;
    for (char c : tok) {
      digits = digits && c >= '0' && c <= '9';
      if (digits) index = index * 10 + static_cast<uint64_t>(c - '0');
    }
    if (!digits || index >= count || std::find(visible.begin(), visible.end(), index) != visible.end()) break;
    visible.push_back(index);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  for (size_t i = 0; i < visible.size(); ++i)
    if (visible[i] != i) return -1;
  return static_cast<int64_t>(visible.size());
}

CUresult Client::Connect() noexcept {
  if (connected_.load(std::memory_order_acquire)) return CUDA_SUCCESS;
  std::lock_guard<std::mutex> lock(mu_);
  if (tried_) return connect_result_;
  tried_ = true;
  try {
    connect_result_ = ConnectLocked();
  } catch (const std::exception& e) {  // an allocation that failed, a library's exception: no abort
    LogError(std::string("cannot connect to oriond: ") + e.what());
    connect_result_ = CUDA_ERROR_OPERATING_SYSTEM;
  }
  if (connect_result_ == CUDA_SUCCESS) connected_.store(true, std::memory_order_release);
  return connect_result_;
}

CUresult Client::ConnectLocked() {
  bool bad = false;
  // Unset in a VM: the VM's own vGPU count (published in its region) instead of 1.
  const char* vgpu_env = std::getenv("ORION_VGPU");
  const bool vgpus_set = vgpu_env != nullptr && *vgpu_env != '\0';
  uint64_t vgpus = EnvU64("ORION_VGPU", 1, &bad);
  const uint64_t gmem = EnvU64("ORION_GMEM", 0, &bad);
  if (bad || vgpus == 0 || vgpus > kMaxDevices) {
    LogError("ORION_VGPU must be 1.." + std::to_string(kMaxDevices) + " and ORION_GMEM a number of MiB");
    return CUDA_ERROR_INVALID_VALUE;
  }
  // A process whose CUDA_VISIBLE_DEVICES hides every device ("", "-1") sees none, as with NVIDIA's
  // driver: cuInit fails with CUDA_ERROR_NO_DEVICE and no vGPU is taken (a CPU-only PyTorch script
  // need not hold one). A list of the first k devices asks for k vGPUs; other lists are not applied.
  if (const char* visible_env = std::getenv("CUDA_VISIBLE_DEVICES"); visible_env != nullptr) {
    const std::string shown = LogSafe(std::string(visible_env).substr(0, 128));
    const int64_t k = VisiblePrefix(visible_env, vgpus_set ? vgpus : kMaxDevices);
    if (k == 0) {
      LogInfo("CUDA_VISIBLE_DEVICES=" + shown + " hides every device: no vGPU is taken");
      return CUDA_ERROR_NO_DEVICE;
    }
    if (k > 0 && vgpus_set && static_cast<uint64_t>(k) < vgpus) {
      LogInfo("CUDA_VISIBLE_DEVICES=" + shown + ": asking for " + std::to_string(k) +
              " of ORION_VGPU=" + std::to_string(vgpus) + " vGPUs");
      vgpus = static_cast<uint64_t>(k);
    } else if (k < 0) {
      LogWarn("CUDA_VISIBLE_DEVICES=" + shown +
              " is not applied by Orion (only an empty list or the first N devices are): the process sees its "
              "vGPUs; choose them with ORION_VGPU");
    }
  }
  handshake_ms_ = EnvU64("ORION_HANDSHAKE_TIMEOUT_MS", handshake_ms_, &bad);
  reply_ms_ = EnvU64("ORION_REPLY_TIMEOUT_MS", reply_ms_, &bad);
  sync_ms_ = EnvU64("ORION_SYNC_TIMEOUT_MS", sync_ms_, &bad);
  alive_ms_ = EnvU64("ORION_ALIVE_TIMEOUT_MS", alive_ms_, &bad);
  stall_ms_ = EnvU64("ORION_STALL_TIMEOUT_MS", stall_ms_, &bad);
  if (bad) return CUDA_ERROR_INVALID_VALUE;
  // Transport: a configured region (ORION_SHM), else a configured server (ORION_SERVER, network),
  // else a region found on this machine or VM.
  const char* shm = std::getenv("ORION_SHM");
  const char* server = std::getenv("ORION_SERVER");
  // TLS: tls://host:port, or ORION_TLS=1 for every oriond (also one the controller places us on);
  // verified against ORION_TLS_CA (else the system's CAs). RDMA is not offered then: its data
  // plane is not encrypted.
  const char* tls_env = std::getenv("ORION_TLS");
  const bool tls_all = tls_env != nullptr && std::strcmp(tls_env, "1") == 0;
  if (tls_env != nullptr && *tls_env != '\0' && !tls_all && std::strcmp(tls_env, "0") != 0) {
    LogError("ORION_TLS='" + LogSafe(tls_env) + "' must be 1 (TLS to oriond) or 0");
    return CUDA_ERROR_INVALID_VALUE;
  }
  if ((shm == nullptr || *shm == '\0') && server != nullptr && *server != '\0') {
    if (Status st = ConnectNetworkLocked(server, true, tls_all); !st.ok()) {
      LogError("cannot use oriond: " + st.message());
      return CUDA_ERROR_NO_DEVICE;
    }
    return HandshakeNetworkLocked(server, tls_all, vgpus, gmem);
  }
  auto where = ivshmem::FindClientRegion();
  const bool shm_set = shm != nullptr && *shm != '\0';
  const bool controller_set = !ivshmem::ClientControllerAddr().empty();
  if (where.ok() && !shm_set && controller_set) {
    // A region found by scanning (not named by ORION_SHM) that is not a formatted Orion region
    // (a stray orionsock file) must not hide the controller the user configured.
    auto probe = ivshmem::MappedRegion::Open(where->path);
    Status usable = probe.ok() ? ivshmem::ValidateHeader(probe->data(), probe->size()).status() : probe.status();
    if (!usable.ok()) {
      LogWarn("ignoring " + LogSafe(where->path) + " (" + LogSafe(usable.message()) +
              "): placing through the controller");
      where = Status(Code::kNotFound, "no usable region");
    }
  }
  if (!where.ok() && !shm_set && controller_set) {
    // No region here: the controller places us on a server, which we reach over the network.
    std::string placed;
    if (CUresult r = AllocateFromControllerLocked(vgpus, gmem, &placed); r != CUDA_SUCCESS) return r;
    if (Status st = ConnectNetworkLocked(placed, true, tls_all); !st.ok()) {
      LogError("cannot reach oriond " + LogSafe(placed) + " of allocation " + controller_alloc_ + ": " +
               LogSafe(st.message()));
      ReleaseControllerAllocation("server_unreachable");
      return CUDA_ERROR_NO_DEVICE;
    }
    return HandshakeNetworkLocked(placed, tls_all, vgpus, gmem);
  }
  if (!where.ok()) {
    LogError("cannot use Orion region: " + where.status().message() +
             " (set ORION_SHM or ORION_SERVER, or create a region with orion-shm and start oriond)");
    return CUDA_ERROR_NO_DEVICE;
  }
  return ConnectRegionLocked(*where, vgpus_set, vgpus, gmem);
}

// The network: the handshake on TCP; RDMA is offered when an RDMA device here owns the address
// this connection leaves from (Soft-RoCE or a RoCE/IB NIC), unless ORION_TRANSPORT=tcp or
// `offer_rdma` is false (rdma_why_ then says why). `addr`: host:port or tls://host:port (TLS also
// for any address when `tls_all`: ORION_TLS=1).
Status Client::ConnectNetworkLocked(std::string addr, bool offer_rdma, bool tls_all) {
  bool tls = tls_all;
  if (addr.rfind("tls://", 0) == 0) {
    addr = addr.substr(6);
    tls = true;
  }
  const char* ca = std::getenv("ORION_TLS_CA");
  auto tcp = TcpFrameChannel::Connect(addr, tls, ca != nullptr ? ca : "");
  if (!tcp.ok()) return tcp.status();
  network_ = true;
  tcp_ = tcp->get();
  tcp_->SetStallLimit(stall_ms_);
  peer_ = "oriond at " + LogSafe(addr);
  const char* force = std::getenv("ORION_TRANSPORT");
  if (!offer_rdma) {
    rdma_port_.reset();
  } else if (tls) {
    rdma_port_.reset();
    rdma_why_ = "TLS, and RDMA's data plane is not encrypted";
  } else if (force != nullptr && std::strcmp(force, "tcp") == 0) {
    rdma_why_ = "ORION_TRANSPORT=tcp";
  } else {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getsockname(tcp_->fd(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      rdma_why_ = std::string("getsockname: ") + std::strerror(errno);
    } else if (auto port = rdma::FindPort(reinterpret_cast<sockaddr*>(&ss)); port.ok()) {
      rdma_port_ = std::make_unique<rdma::Port>(*port);
    } else {
      rdma_why_ = port.status().message();
    }
  }
  desc_ = tcp_->desc();
  header_ = tcp_->header();
  chan_ = std::move(*tcp);
  return Status();
}

// The handshake over the network; if the RDMA setup fails after oriond chose RDMA, connects again
// offering TCP only.
CUresult Client::HandshakeNetworkLocked(const std::string& addr, bool tls_all, uint64_t vgpus, uint64_t gmem) {
  const std::string shown = addr.rfind("tls://", 0) == 0 ? addr.substr(6) : addr;  // host:port
  const CUresult r = HandshakeLocked(vgpus, gmem, shown);
  if (r != kRetryOverTcp) return r;
  LogWarn("Orion transport: " + rdma_why_ + "; connecting again over TCP");
  chan_.reset();
  tcp_ = nullptr;
  if (Status st = ConnectNetworkLocked(addr, false, tls_all); !st.ok()) {
    LogError("cannot use oriond: " + LogSafe(st.message()));
    return CUDA_ERROR_NO_DEVICE;
  }
  return HandshakeLocked(vgpus, gmem, shown);  // offers no RDMA: no second retry
}

// A region on this machine or VM (`where`): claims a free channel, sets up its doorbell and lease,
// then the handshake. A VM's region bounds what may be asked for (vgpus unless `vgpus_set`).
CUresult Client::ConnectRegionLocked(const ivshmem::RegionLocation& where, bool vgpus_set, uint64_t vgpus,
                                     uint64_t gmem) {
  const std::string path = where.path;
  peer_ = "oriond on " + path;
  auto region = ivshmem::MappedRegion::Open(path);
  if (!region.ok()) {
    LogError("cannot use Orion region: " + region.status().message() +
             " (set ORION_SHM, or create it with orion-shm and start oriond)");
    return CUDA_ERROR_NO_DEVICE;
  }
  region_ = std::make_unique<ivshmem::MappedRegion>(std::move(*region));
  auto hdr = ivshmem::ValidateHeader(region_->data(), region_->size());
  if (!hdr.ok()) {
    LogError(path + ": " + hdr.status().message());
    return CUDA_ERROR_NO_DEVICE;
  }
  header_ = ivshmem::Header(region_->data());
  const uint32_t count = (*hdr)->channel_count;
  const uint64_t channel_bytes = (*hdr)->channel_bytes;
  // A VM's region says what the VM was given: a process may ask for less, never more.
  const bool vm_region = ((*hdr)->features & ivshmem::kFeatureVmLimits) != 0;
  if (vm_region) {
    const uint64_t vm_vgpus = std::min<uint64_t>((*hdr)->vm_vgpus, kMaxDevices);
    const uint64_t vm_gmem = (*hdr)->vm_gmem_bytes >> 20;
    const std::string has = "this VM has " + std::to_string(vm_vgpus) + " vGPU(s) of " + std::to_string(vm_gmem) +
                            " MiB (set on the host: orion-vm enable <domain> --vgpus N --gmem MIB)";
    if (!vgpus_set && vm_vgpus > 0) vgpus = vm_vgpus;
    if (vgpus > vm_vgpus) {
      LogError("ORION_VGPU=" + std::to_string(vgpus) + " is more than " + has);
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (gmem > vm_gmem) {
      LogError("ORION_GMEM=" + std::to_string(gmem) + " MiB is more than " + has);
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  bool claimed = false;
  for (uint32_t i = 0; i < count && !claimed; ++i) {
    uint32_t expect = kChannelFree;
    // K0: claim; acquire pairs with R0 in ResetChannel (cursors were zeroed before it was freed).
    if (header_->channels[i].state.compare_exchange_strong(expect, kChannelClaimed, std::memory_order_acq_rel)) {
      channel_index_ = i;
      claimed = true;
    }
  }
  if (!claimed) {
    // Channels nobody frees look taken: tell a stopped oriond from a full region.
    if (!HeartbeatMoves(header_)) {
      LogError("no oriond serves " + path + " (its heartbeat has stopped): start oriond on the host");
      return CUDA_ERROR_NO_DEVICE;
    }
    LogError(
        "all " + std::to_string(count) + " channels of " + path +
        " are in use by other CUDA processes (one per process); " +
        (vm_region || where.source.rfind("ivshmem", 0) == 0
             ? "this VM has " + std::to_string(count) +
                   ": give it more on the host with `orion-vm enable <domain> --processes N` (from the VM's next start)"
             : "a bigger region (orion-shm -s MIB) or a smaller shm_buffer_size gives more"));
    return CUDA_ERROR_NO_DEVICE;
  }
  desc_ = &header_->channels[channel_index_];
  desc_->client_lease.store(1, std::memory_order_relaxed);
  // How our wake-ups reach oriond's sleeping worker: a region file on this kernel by a futex; in a
  // VM by the ivshmem-doorbell register when oriond serves the device's doorbell for this channel
  // (IVPosition 0 means an ivshmem-plain device, whose writes go nowhere); else not at all, and
  // the worker naps. ORION_DOORBELL=0 chooses the naps (to compare).
  uint32_t rings = where.source.rfind("ivshmem", 0) == 0 ? ivshmem::kRingsNone : ivshmem::kRingsFutex;
  if (rings == ivshmem::kRingsNone && !where.doorbell.empty() && ((*hdr)->features & ivshmem::kFeatureDoorbell) != 0 &&
      channel_index_ < (*hdr)->doorbell_vectors) {
    if (auto bar0 = ivshmem::GuestDoorbell::Open(where.doorbell); bar0.ok() && (*bar0)->position() != 0) {
      bar0_ = std::move(*bar0);
      bell_peer_ = (*hdr)->doorbell_peer & 0xffffu;
      bell_vector_ = channel_index_;
      rings = ivshmem::kRingsIvshmem;
    }
  }
  if (const char* e = std::getenv("ORION_DOORBELL"); e != nullptr && std::strcmp(e, "0") == 0) {
    bar0_.reset();
    rings = ivshmem::kRingsNone;
  }
  desc_->client_rings.store(rings, std::memory_order_relaxed);
  layout_ = ChannelLayout::Compute(channel_bytes);
  uint8_t* chan = ivshmem::ChannelBase(region_->data(), channel_bytes, channel_index_);
  const uint32_t generation = desc_->generation;  // published before the channel was freed (R0/K0)
  chan_ = std::make_unique<ShmFrameChannel>(
      chan + layout_.request_ring_offset, static_cast<uint32_t>(layout_.request_ring_bytes),
      chan + layout_.reply_ring_offset, static_cast<uint32_t>(layout_.reply_ring_bytes), generation);
  window_ = chan + layout_.window_offset;
  pinned_free_.clear();
  pinned_free_[layout_.staging_bytes] = layout_.window_bytes - layout_.staging_bytes;
  lease_thread_ = std::thread([this] {
    while (!stop_lease_.load(std::memory_order_relaxed)) {
      timespec ts{0, static_cast<long>(ivshmem::kLeasePeriodMs) * 1000000L};
      nanosleep(&ts, nullptr);
      // L0: liveness only; oriond compares successive values (no data is published by it).
      desc_->client_lease.fetch_add(1, std::memory_order_relaxed);
    }
  });
  lease_thread_.detach();
  const CUresult r = HandshakeLocked(vgpus, gmem, path);
  uint32_t still = kChannelClaimed;
  if (r != CUDA_SUCCESS && desc_->state.load(std::memory_order_acquire) == kChannelClaimed &&
      !HeartbeatMoves(header_)) {
    // No oriond will ever answer or free this channel: hand it back (K1: the next oriond formats
    // the region anyway), so the next process is not told it is in use.
    desc_->state.compare_exchange_strong(still, ivshmem::kChannelFree, std::memory_order_acq_rel);
    LogError("no oriond serves " + path + " (its heartbeat has stopped): start oriond on the host");
  }
  return r;
}

CUresult Client::HandshakeLocked(uint64_t vgpus, uint64_t gmem, const std::string& where) noexcept {
  HelloReq hello{};
  hello.protocol_version = kProtocolVersion;
  hello.transports = !network_ ? kTransportShm : rdma_port_ ? (kTransportTcp | kTransportRdma) : kTransportTcp;
  hello.vgpu_count = static_cast<uint32_t>(vgpus);
  hello.gmem_mib = gmem;
  hello.pid = static_cast<uint32_t>(getpid());
  std::snprintf(hello.process_name, sizeof hello.process_name, "%s", ProcessName().c_str());
  if (const char* key = std::getenv("ORION_KEY"); key != nullptr && network_) {
    std::strncpy(hello.key, key, sizeof hello.key - 1);
  }
  std::snprintf(hello.allocation_id, sizeof hello.allocation_id, "%s", controller_alloc_.c_str());
  if (const char* job = std::getenv("ORION_ALLOCATION");
      job != nullptr && *job != '\0' && network_ && controller_alloc_.empty()) {
    // An allocation made for this process's job (the Slurm plugin): oriond serves it on the job's
    // vGPUs and leaves it to the job (it is not released when this process exits).
    if (!IsUuid(job)) {
      LogError("ORION_ALLOCATION '" + LogSafe(job) + "' is not an allocation id (a UUID)");
      broken_ = CUDA_ERROR_INVALID_VALUE;
      GiveBackLocked();
      return broken_;
    }
    std::snprintf(hello.allocation_id, sizeof hello.allocation_id, "%s", job);
    hello_job_ = true;
  }
  gethostname(hello.hostname, sizeof hello.hostname - 1);
  // Compute share (README "Compute share"): ORION_RATIO percent of each vGPU's physical GPU,
  // ORION_RATIO_POLICY share (a minimum, the default) or cap (a ceiling).
  {
    bool bad = false;
    const uint64_t ratio = EnvU64("ORION_RATIO", 0, &bad);
    const char* policy = std::getenv("ORION_RATIO_POLICY");
    const std::string pol = policy != nullptr ? policy : "";
    if (bad || ratio > 100 || (pol != "" && pol != "share" && pol != "cap") || (pol == "cap" && ratio == 0)) {
      LogError("ORION_RATIO must be a percentage 1..100 and ORION_RATIO_POLICY share or cap (cap needs ORION_RATIO)");
      broken_ = CUDA_ERROR_INVALID_VALUE;
      GiveBackLocked();
      return broken_;
    }
    hello.ratio = static_cast<uint8_t>(ratio);
    hello.policy = pol == "cap" ? 1 : 0;
  }
  // ORION_SHARE: the vGPU share of this process tree. The first process of the tree to use Orion
  // names it (EnsureShareToken: in its C environment, which the processes it starts inherit); the
  // first session with the name takes vGPUs for the share, the others run on the same ones.
  // "off": this process takes vGPUs of its own and hands none on.
  EnsureShareToken();
  const char* share = std::getenv("ORION_SHARE");
  const bool share_off = share != nullptr && std::strcmp(share, "off") == 0;
  if (share != nullptr && *share != '\0' && !share_off) {
    if (!ValidShareToken(share, kShareTokenLen + 1)) {
      LogError("ORION_SHARE '" + LogSafe(std::string(share).substr(0, 64)) +
               "' is not a share token (32 lowercase hex digits, from the process that started this one) nor off");
      broken_ = CUDA_ERROR_INVALID_VALUE;
      GiveBackLocked();
      return broken_;
    }
    std::snprintf(hello.share, sizeof hello.share, "%s", share);
  }
  FrameHeader h = MakeHeader(Op::kHello, sizeof hello, true);
  if (CUresult r = PushLocked(h, &hello, sizeof hello, nullptr, 0); r != CUDA_SUCCESS) return r;
  std::vector<uint8_t> rep(sizeof(WelcomeRep) + kMaxDevices * sizeof(DeviceInfo) + 1024);
  uint32_t rep_len = 0;
  CUresult r = WaitReplyLocked(h.seq, static_cast<Op>(h.op), rep.data(), static_cast<uint32_t>(rep.size()), &rep_len);
  if (r != CUDA_SUCCESS) {
    std::string reason(reinterpret_cast<const char*>(rep.data()), std::min<size_t>(rep_len, rep.size()));
    reason.resize(strnlen(reason.c_str(), reason.size()));
    LogError("Fail to get resource from oriond: " + (reason.empty() ? std::string("no answer") : LogSafe(reason)));
    ReleaseControllerAllocation("refused");
    broken_ = r;
    GiveBackLocked();  // refused: hand the channel back at once
    return r;
  }
  if (rep_len < sizeof(WelcomeRep)) return Broken(CUDA_ERROR_UNKNOWN, "short Welcome");
  std::memcpy(&welcome_, rep.data(), sizeof welcome_);
  if (welcome_.device_count == 0 || welcome_.device_count > kMaxDevices ||
      rep_len < sizeof(WelcomeRep) + welcome_.device_count * sizeof(DeviceInfo)) {
    return Broken(CUDA_ERROR_UNKNOWN, "malformed Welcome");
  }
  std::string transport_text;
  if (network_) {
    // The network channel's window: a private copy, laid out like the server's.
    if (welcome_.channel_bytes < ivshmem::kMinChannelBytes || welcome_.channel_bytes > (uint64_t{4} << 30)) {
      return Broken(CUDA_ERROR_UNKNOWN, "oriond announced an impossible channel size");
    }
    layout_ = ChannelLayout::Compute(welcome_.channel_bytes);
    if (welcome_.transport == kTransportRdma) {
      if (rdma_port_ == nullptr)
        return Broken(CUDA_ERROR_UNKNOWN, "oriond chose RDMA, which this client did not offer");
      // The queue pair is set up on the Hello's connection, which then only signals liveness.
      const FrameHeader ch = MakeHeader(Op::kRdmaConnect, sizeof(RdmaConnectInfo), true);
      auto rc = RdmaFrameChannel::Connect(tcp_->ReleaseFd(), *rdma_port_, where, layout_.window_bytes, ch);
      tcp_ = nullptr;
      if (!rc.ok()) {
        // Our connection is closed (oriond's worker then ends that session); ConnectLocked retries.
        rdma_why_ = "RDMA setup with oriond failed: " + rc.status().message();
        return kRetryOverTcp;
      }
      desc_ = (*rc)->desc();
      header_ = (*rc)->header();
      window_ = (*rc)->window();
      chan_ = std::move(*rc);
      transport_text = "RDMA to " + where + " (" + rdma_port_->Describe() + ")";
    } else {
      if (!tcp_->SetWindow(layout_.window_bytes)) return Broken(CUDA_ERROR_OUT_OF_MEMORY, "no memory for the window");
      window_ = tcp_->window();
      transport_text =
          (tcp_->secure() ? tcp_->Describe() + " over TCP to " : std::string("TCP to ")) + where + " (" +
          (rdma_port_ != nullptr ? std::string("oriond chose TCP; its log says why") : "no RDMA: " + rdma_why_) + ")";
    }
    pinned_free_.clear();
    pinned_free_[layout_.staging_bytes] = layout_.window_bytes - layout_.staging_bytes;
  }
  devices_.resize(welcome_.device_count);
  std::memcpy(devices_.data(), rep.data() + sizeof(WelcomeRep), welcome_.device_count * sizeof(DeviceInfo));
  for (auto& d : devices_) d.name[kNameLen - 1] = '\0';
  LogInfo(std::string("Orion vGPU client ") + kOrionVersion + " (build " + kOrionBuild + ")");
  welcome_.allocation_id[sizeof welcome_.allocation_id - 1] = '\0';
  if (welcome_.allocation_id[0] != '\0' && !IsUuid(welcome_.allocation_id)) {
    return Broken(CUDA_ERROR_DEVICE_UNAVAILABLE,
                  ("oriond's Welcome names a malformed allocation id " + LogSafe(welcome_.allocation_id)).c_str());
  }
  if (welcome_.allocation_id[0] != '\0') {
    // "(job)": the allocation of this process's job (ORION_ALLOCATION), which outlives it.
    allocation_text_ = std::string(hello_job_ ? "(job) " : "(controller) ") + welcome_.allocation_id + " :";
  } else {
    allocation_text_ = "(standalone) session-" + std::to_string(welcome_.session_id) + " :";
  }
  for (const auto& d : devices_) {
    allocation_text_ += " " + where + "/" + std::to_string(d.pgpu) + "/" + std::to_string(d.vgpu);
  }
  if (network_) LogInfo("Orion transport: " + transport_text);
  LogInfo("Using Orion resource " + allocation_text_);
  welcome_.share[sizeof welcome_.share - 1] = '\0';
  if (!ValidShareToken(welcome_.share, sizeof welcome_.share)) {
    return Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, "oriond's Welcome names a malformed vGPU share");
  }
  if (welcome_.share[0] != '\0') {
    LogInfo(std::string("vGPUs shared with the processes this one starts (ORION_SHARE ") +
            std::string(welcome_.share, 8) + "...)");
  }
  return CUDA_SUCCESS;
}

CUresult Client::AllocateFromControllerLocked(uint64_t vgpus, uint64_t gmem, std::string* server) noexcept {
  controller_addr_ = ivshmem::ClientControllerAddr();
  auto eps = controller::ParseEndpoints(controller_addr_);  // one or several controllers
  if (!eps.ok()) {
    LogError("ORION_CONTROLLER / controller_addr: " + eps.status().message());
    return CUDA_ERROR_INVALID_VALUE;
  }
  bool bad = false;
  const uint64_t ratio = EnvU64("ORION_RATIO", 0, &bad);
  if (bad || ratio > 100) {
    LogError("ORION_RATIO must be a percentage 1..100");
    return CUDA_ERROR_INVALID_VALUE;
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  try {
    controller::ControllerClient cc(*eps, ivshmem::ClientControllerKey(), 5000);
    // Host and program names are bytes, not text: JSON needs valid UTF-8 (invalid bytes become U+FFFD).
    nlohmann::json req = {
        {"vgpus", vgpus},
        {"gmem_mib", gmem},
        {"client",
         {{"host", ValidUtf8(host)}, {"pid", static_cast<uint32_t>(getpid())}, {"process", ValidUtf8(ProcessName())}}}};
    if (ratio != 0) req["ratio"] = ratio;
    // The idempotency key: Call sends the same body to the next controller when one does not answer
    // (it may have placed the allocation and died before replying); the pool answers a repeat with the
    // allocation the first request made, so a lost answer leaves no allocation behind.
    req["request_id"] = RandomUuid();
    auto r = cc.Call("POST", "/v1/allocations", req);
    if (!r.ok()) {
      LogError("Fail to get resource from controller " + cc.endpoint().text() + ": " + LogSafe(r.status().message()));
      switch (r.status().code()) {
        case Code::kInvalidArgument: return CUDA_ERROR_INVALID_VALUE;
        case Code::kResourceExhausted: return CUDA_ERROR_OUT_OF_MEMORY;
        case Code::kPermissionDenied: return CUDA_ERROR_NOT_PERMITTED;
        default: return CUDA_ERROR_NO_DEVICE;
      }
    }
    const nlohmann::json& a = *r;
    if (!a.contains("id") || !a["id"].is_string() || !a.contains("server") || !a["server"].is_string() ||
        !a.contains("placements") || !a["placements"].is_array() || a["placements"].empty()) {
      LogError("Fail to get resource from controller " + cc.endpoint().text() + ": malformed reply");
      return CUDA_ERROR_NO_DEVICE;
    }
    const std::string id = a["id"].get<std::string>();
    if (!IsUuid(id)) {
      // It would go into DELETE /v1/allocations/<id> and oriond's Hello: nothing but a UUID may.
      LogError("Fail to get resource from controller " + cc.endpoint().text() + ": malformed allocation id " +
               LogSafe(id));
      return CUDA_ERROR_NO_DEVICE;
    }
    controller_alloc_ = id;
    *server = a["server"].get<std::string>();
    std::string where;
    for (const auto& p : a["placements"]) {
      if (p.contains("text") && p["text"].is_string()) where += " " + p["text"].get<std::string>();
    }
    LogInfo("Orion Controller " + cc.endpoint().text() + " placed allocation " + controller_alloc_ + ":" +
            LogSafe(where));
    return CUDA_SUCCESS;
  } catch (const std::exception& e) {  // nothing may escape: this runs inside cuInit
    LogError("Fail to get resource from controller " + controller_addr_ + ": " + LogSafe(e.what()));
    return CUDA_ERROR_NO_DEVICE;
  }
}

void Client::ReleaseControllerAllocation(const char* why) noexcept {
  if (controller_alloc_.empty()) return;
  const std::string id = std::exchange(controller_alloc_, std::string());
  if (!IsUuid(id)) return;  // never put anything else into a request line
  auto eps = controller::ParseEndpoints(controller_addr_);
  if (!eps.ok()) return;
  controller::ControllerClient cc(*eps, ivshmem::ClientControllerKey(), 2000);
  // oriond releases it too when the session ends: "not found" here is normal.
  (void)cc.Call("DELETE", "/v1/allocations/" + id + "?reason=" + why);
  LogInfo("Client exits with allocation ID " + id);
}

FrameHeader Client::MakeHeader(Op op, uint32_t payload_len, bool wants_reply) noexcept {
  FrameHeader h = MakeFrameHeader(static_cast<uint16_t>(op), next_seq_++, payload_len);
  h.flags = wants_reply ? kFlagWantsReply : 0;
  return h;
}

CUresult Client::Broken(CUresult why, const char* what) noexcept {
  if (broken_ == CUDA_SUCCESS) {
    LogError(std::string("Orion session lost: ") + what);
    broken_ = why;
    GiveBackLocked();
  }
  return broken_;
}

// Stops renewing the lease and, if oriond ended the session, says we are done with the channel so
// it is freed at once rather than after the lease times out.
void Client::GiveBackLocked() noexcept {
  stop_lease_.store(true, std::memory_order_relaxed);
  uint32_t dead = ivshmem::kChannelDead;
  desc_->state.compare_exchange_strong(dead, ivshmem::kChannelDetached, std::memory_order_acq_rel);
}

// Whether oriond still serves this channel (it is dead, or was reset by a restarted oriond, when not).
static bool Served(const ivshmem::ChannelDesc* d) {
  const uint32_t s = d->state.load(std::memory_order_acquire);
  return s == ivshmem::kChannelActive || s == ivshmem::kChannelClaimed;
}

bool Client::ServerGoneLocked(uint64_t* last_beat, uint64_t* last_change) noexcept {
  if (broken_ != CUDA_SUCCESS) return true;
  if (!Served(desc_)) {
    Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, "oriond closed the session");
    return true;
  }
  const uint64_t beat = header_->server_heartbeat.load(std::memory_order_relaxed);
  const uint64_t now = NowNs();
  if (beat != *last_beat || *last_change == 0) {
    *last_beat = beat;
    *last_change = now;
    return false;
  }
  if (now - *last_change > static_cast<uint64_t>(std::chrono::nanoseconds(kHeartbeatTimeout).count())) {
    Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, "oriond stopped (no heartbeat)");
    return true;
  }
  return false;
}

CUresult Client::PushLocked(const FrameHeader& h, const void* req, uint32_t req_len, const void* tail,
                            uint32_t tail_len) noexcept {
  Backoff backoff;
  uint8_t* p;
  uint64_t beat = 0, changed = 0;
  while ((p = chan_->Reserve(h.payload_len)) == nullptr) {
    if (backoff.sleeping() && ServerGoneLocked(&beat, &changed)) return broken_;
    if (backoff.sleeping()) RingDoorbell(true);  // the ring is full: the worker must be awake
    backoff.Pause();
  }
  std::memcpy(p, &h, sizeof h);
  if (req_len != 0) std::memcpy(p + sizeof h, req, req_len);
  if (tail_len != 0) std::memcpy(p + sizeof h + req_len, tail, tail_len);
  if (!chan_->Commit()) {
    return Broken(CUDA_ERROR_DEVICE_UNAVAILABLE,
                  tcp_ != nullptr && !tcp_->why().empty() ? tcp_->why().c_str() : "the connection to oriond broke");
  }
  if ((h.flags & kFlagWantsReply) == 0 && h.op != static_cast<uint16_t>(Op::kCtxSetCurrent)) async_unanswered_ = true;
  RingDoorbell((h.flags & kFlagWantsReply) != 0);
  return CUDA_SUCCESS;
}

uint64_t Client::ReplyDeadlineMs(Op op) const noexcept {
  if (op == Op::kHello || op == Op::kRdmaConnect) return handshake_ms_;
  if (MayWaitForDevice(op) || async_unanswered_) return sync_ms_;
  return reply_ms_;
}

bool Client::TimedOutLocked(uint64_t start_ns, uint64_t ms, Op op, uint32_t seq) noexcept {
  if (ms == 0 || NowNs() - start_ns <= ms * 1000000ull) return false;
  const char* knob = op == Op::kHello || op == Op::kRdmaConnect ? "ORION_HANDSHAKE_TIMEOUT_MS"
                     : op != Op::kTakeOutput && (MayWaitForDevice(op) || async_unanswered_) ? "ORION_SYNC_TIMEOUT_MS"
                                                                                            : "ORION_REPLY_TIMEOUT_MS";
  const std::string what = std::string("no reply to ") + OpName(static_cast<uint16_t>(op)) + " (seq " +
                           std::to_string(seq) + ") from " + peer_ + " in " + std::to_string(ms) + " ms (" + knob + ")";
  Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, what.c_str());
  return true;
}

bool Client::SilentLocked(uint64_t start_ns, Op op, uint32_t seq) noexcept {
  // Over TCP a session's oriond sends a Keepalive every 250 ms while it executes requests and has
  // sent nothing else, so silence means a hung oriond, not a long kernel (the handshake has its
  // own deadline).
  if (tcp_ == nullptr || alive_ms_ == 0 || op == Op::kHello) return false;
  const uint64_t since = std::max(start_ns, tcp_->heard_ns());
  const uint64_t now = NowNs();
  if (now - since <= alive_ms_ * 1000000ull) return false;
  const std::string what = peer_ + " sent nothing (no reply to " + OpName(static_cast<uint16_t>(op)) + " (seq " +
                           std::to_string(seq) + "), no keepalive) for " + std::to_string((now - since) / 1000000) +
                           " ms (ORION_ALIVE_TIMEOUT_MS=" + std::to_string(alive_ms_) + "): it hangs";
  Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, what.c_str());
  return true;
}

bool Client::ReplyValidLocked(const FrameHeader& h, uint32_t seq, Op op) noexcept {
  std::string bad;
  if (h.seq != seq) {
    bad = "reply out of order (seq " + std::to_string(h.seq) + ", waiting for " + std::to_string(seq) + ")";
  } else if (h.magic != kFrameMagic || h.version != kProtocolVersion) {
    bad = "a reply with a wrong magic or protocol version " + std::to_string(h.version);
  } else if (h.op != static_cast<uint16_t>(op)) {
    bad = "a reply for op " + std::to_string(h.op) + " to " + OpName(static_cast<uint16_t>(op));
  } else if ((h.flags & ~kFlagOutputPending) != 0 || h.payload_len > kMaxPayload) {
    bad = "a reply with unknown flags or an impossible length";
  } else if (!KnownResult(h.status) && !(h.status == kStatusNeedBytes && op == Op::kModuleLoad)) {
    bad = "a reply with status " + std::to_string(h.status) + ", which is no CUresult";
  } else if (!KnownResult(h.deferred)) {
    bad = "a reply with deferred status " + std::to_string(h.deferred) + ", which is no CUresult";
  }
  if (bad.empty()) return true;
  Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, (peer_ + " sent " + bad).c_str());
  return false;
}

CUresult Client::WaitReplyLocked(uint32_t seq, Op op, void* rep, uint32_t rep_cap, uint32_t* rep_len) noexcept {
  // Spinning ~1 ms catches a busy worker's reply; one we just woke may need this CPU first (the
  // kernel wakes it on the waker's CPU), so we yield at once. Over the network we cannot see it
  // sleep: a pause of over a millisecond since the last reply says so, and there every poll is a
  // recv system call (200 of them kept a worker woken on our CPU waiting ~0.1 ms).
  const uint64_t start = NowNs();
  if (network_ && start - last_reply_ns_ > 1000000) woke_ = true;
  Backoff backoff(woke_ ? (network_ ? 0 : 200) : 20000, woke_ ? 2000 : 200, 200);
  woke_ = false;
  uint64_t last_beat = 0;
  uint64_t last_change = 0;
  const uint64_t deadline_ms = ReplyDeadlineMs(op);
  for (;;) {
    ivshmem::FrameView f{};
    bool got = false;
    Status s = chan_->Pop(&f, &scratch_, &got);
    if (!s.ok()) return Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, s.message().c_str());
    if (got) {
      if (!ReplyValidLocked(f.header, seq, op)) return broken_;
      if (f.header.status == CUDA_SUCCESS && rep != nullptr && rep_len == nullptr && f.header.payload_len < rep_cap) {
        return Broken(CUDA_ERROR_DEVICE_UNAVAILABLE,
                      (peer_ + " sent a short reply to " + OpName(f.header.op) + " (" +
                       std::to_string(f.header.payload_len) + " of " + std::to_string(rep_cap) + " bytes)")
                          .c_str());
      }
      async_unanswered_ = false;  // oriond executes in order: everything before it has run
      if (network_) last_reply_ns_ = NowNs();
      if (rep_len != nullptr) *rep_len = f.header.payload_len;
      if (rep != nullptr) std::memcpy(rep, f.payload, std::min(rep_cap, f.header.payload_len));
      const auto status = static_cast<CUresult>(f.header.status);
      const auto deferred = static_cast<CUresult>(f.header.deferred);
      if ((f.header.flags & kFlagOutputPending) != 0 && f.header.op != static_cast<uint16_t>(Op::kTakeOutput))
        DrainOutputLocked();
      if (status != CUDA_SUCCESS) return status;
      return deferred;
    }
    if (backoff.sleeping() && ServerGoneLocked(&last_beat, &last_change)) return broken_;
    if (backoff.sleeping() && TimedOutLocked(start, deadline_ms, op, seq)) return broken_;
    if (backoff.sleeping() && SilentLocked(start, op, seq)) return broken_;
    // A network channel blocks on its socket (bounded, so the checks above keep running); shared
    // memory naps.
    if (!backoff.sleeping() || !chan_->AwaitInput(kAwaitInputUs)) backoff.Pause();
  }
}

// Device printf text oriond holds for this process: fetched at the first reply that says so (every
// reply follows the launches before it, so this is at or before the next synchronizing call, as on
// a GPU) and written to the process's stdout.
void Client::DrainOutputLocked() noexcept {
  for (int round = 0; round < 64; ++round) {  // at most kMaxPendingOutput bytes
    FrameHeader h = MakeHeader(Op::kTakeOutput, 0, true);
    if (PushLocked(h, nullptr, 0, nullptr, 0) != CUDA_SUCCESS) return;
    ivshmem::FrameView f{};
    Backoff backoff(20000, 200, 200);
    uint64_t last_beat = 0, last_change = 0;
    const uint64_t start = NowNs();
    for (;;) {
      bool got = false;
      if (Status st = chan_->Pop(&f, &scratch_, &got); !st.ok()) {
        (void)Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, st.message().c_str());
        return;
      }
      if (got) break;
      if (backoff.sleeping() && ServerGoneLocked(&last_beat, &last_change)) return;
      if (backoff.sleeping() && TimedOutLocked(start, reply_ms_, Op::kTakeOutput, h.seq)) return;
      if (!backoff.sleeping() || !chan_->AwaitInput(kAwaitInputUs)) backoff.Pause();
    }
    if (!ReplyValidLocked(f.header, h.seq, Op::kTakeOutput)) return;
    OutputRep rep{};
    const uint32_t len = std::min<uint32_t>(f.header.payload_len, kMaxPayload);
    if (len < sizeof rep) return;
    std::memcpy(&rep, f.payload, sizeof rep);
    if (uint64_t{rep.stdout_bytes} + rep.notice_bytes > len - sizeof rep) {
      (void)Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, "malformed TakeOutput reply");
      return;
    }
    // Through the program's own stdout stream, so device lines keep their place among its lines.
    const uint8_t* text = f.payload + sizeof rep;
    std::fwrite(text, 1, rep.stdout_bytes, stdout);
    std::fflush(stdout);
    // Notices (e.g. a kernel the sim backend could not execute) go to the client's log, once each.
    std::string notes(reinterpret_cast<const char*>(text + rep.stdout_bytes), rep.notice_bytes);
    for (size_t b = 0, e; b < notes.size(); b = e + 1) {
      e = notes.find('\n', b);
      if (e == std::string::npos) e = notes.size();
      if (e > b) LogWarn("oriond: " + LogSafe(std::string_view(notes).substr(b, e - b)));
    }
    if ((f.header.flags & kFlagOutputPending) == 0) return;
  }
}

CUresult Client::SyncContextLocked() noexcept {
  const uint64_t want = t_ctx_handle;
  if (want == 0 || want == current_ctx_sent_) return CUDA_SUCCESS;
  HandleReq q{want};
  FrameHeader h = MakeHeader(Op::kCtxSetCurrent, sizeof q, false);
  if (CUresult r = PushLocked(h, &q, sizeof q, nullptr, 0); r != CUDA_SUCCESS) return r;
  current_ctx_sent_ = want;
  return CUDA_SUCCESS;
}

CUresult Client::Call(Op op, const void* req, uint32_t req_len, void* rep, uint32_t rep_cap, uint32_t* rep_len,
                      const void* tail, uint32_t tail_len) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (header_ == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (CUresult r = SyncContextLocked(); r != CUDA_SUCCESS) return r;
  FrameHeader h = MakeHeader(op, req_len + tail_len, true);
  if (CUresult r = PushLocked(h, req, req_len, tail, tail_len); r != CUDA_SUCCESS) return r;
  const CUresult r = WaitReplyLocked(h.seq, static_cast<Op>(h.op), rep, rep_cap, rep_len);
  if (r != CUDA_SUCCESS && r != static_cast<CUresult>(kStatusNeedBytes)) {
    LogDebug(std::string("op=") + OpName(static_cast<uint16_t>(op)) + " -> " + std::to_string(r));
  }
  return r;
}

CUresult Client::Send(Op op, const void* req, uint32_t req_len, const void* tail, uint32_t tail_len) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (header_ == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (CUresult r = SyncContextLocked(); r != CUDA_SUCCESS) return r;
  FrameHeader h = MakeHeader(op, req_len + tail_len, false);
  return PushLocked(h, req, req_len, tail, tail_len);
}

// ---- Staging -------------------------------------------------------------------------------

void Client::ReclaimLocked() noexcept {
  // S0: acquire pairs with the worker's release store after it executed frame `done`: its reads
  // of the staging bytes of frames <= done are complete.
  const auto done = static_cast<uint32_t>(desc_->server_done_seq.load(std::memory_order_acquire));
  while (!stage_fifo_.empty()) {
    const StageEntry& e = stage_fifo_.front();
    const bool host_done = !e.guest_owned && e.seq != 0 && static_cast<int32_t>(done - e.seq) >= 0;
    if (!e.released && !host_done) break;
    stage_tail_ = e.end;
    stage_fifo_.pop_front();
  }
}

int64_t Client::StageAllocLocked(uint64_t bytes) noexcept {
  const uint64_t cap = layout_.staging_bytes;
  Backoff backoff;
  uint64_t beat = 0, changed = 0;
  for (;;) {
    ReclaimLocked();
    const uint64_t pos = stage_head_ % cap;
    const uint64_t to_end = cap - pos;
    const uint64_t need = bytes <= to_end ? bytes : to_end + bytes;
    if (cap - (stage_head_ - stage_tail_) >= need) {
      if (bytes > to_end) {
        stage_head_ += to_end;
        stage_fifo_.push_back({stage_head_, 0, true, true});
      }
      const uint64_t off = stage_head_ % cap;
      stage_head_ += bytes;
      stage_fifo_.push_back({stage_head_, 0, false, false});
      return static_cast<int64_t>(off);
    }
    if (backoff.sleeping() && ServerGoneLocked(&beat, &changed)) return -1;
    // Everything outstanding may be guest-owned (our own DtoH chunks): the caller must drain.
    bool any_host = false;
    for (const auto& e : stage_fifo_) any_host |= !e.guest_owned && !e.released;
    if (!any_host) return -2;
    if (backoff.sleeping()) RingDoorbell(true);  // staging is full of frames the worker must run
    backoff.Pause();
  }
}

void Client::StageTagLocked(uint32_t seq, bool guest_owned) noexcept {
  stage_fifo_.back().seq = seq;
  stage_fifo_.back().guest_owned = guest_owned;
}

CUresult Client::CopyHtoD(uint64_t dst, const void* src, uint64_t bytes, uint64_t stream, bool sync) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (CUresult r = SyncContextLocked(); r != CUDA_SUCCESS) return r;
  if (int64_t off = WindowOffset(src, bytes); off >= 0) {
    // Pinned source: zero-copy. A synchronous copy waits, since the caller may reuse the buffer.
    MemcpyReq q{dst, static_cast<uint64_t>(off), bytes, stream};
    FrameHeader h = MakeHeader(Op::kMemcpyHtoD, sizeof q, sync);
    if (CUresult r = PushLocked(h, &q, sizeof q, nullptr, 0); r != CUDA_SUCCESS) return r;
    return sync ? WaitReplyLocked(h.seq, static_cast<Op>(h.op), nullptr, 0, nullptr) : CUDA_SUCCESS;
  }
  const auto* s = static_cast<const uint8_t*>(src);
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(kChunk, bytes - done);
    const int64_t off = StageAllocLocked(n);
    if (off < 0) return broken_ != CUDA_SUCCESS ? broken_ : CUDA_ERROR_UNKNOWN;
    std::memcpy(window_ + off, s + done, n);
    MemcpyReq q{dst + done, static_cast<uint64_t>(off), n, stream};
    FrameHeader h = MakeHeader(Op::kMemcpyHtoD, sizeof q, false);
    StageTagLocked(h.seq, false);
    if (CUresult r = PushLocked(h, &q, sizeof q, nullptr, 0); r != CUDA_SUCCESS) return r;
    done += n;
  }
  // Pageable source: like the CUDA driver, return once the bytes are staged.
  return CUDA_SUCCESS;
}

CUresult Client::CopyDtoH(void* dst, uint64_t src, uint64_t bytes, uint64_t stream, bool async) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (CUresult r = SyncContextLocked(); r != CUDA_SUCCESS) return r;
  if (int64_t off = WindowOffset(dst, bytes); off >= 0) {
    MemcpyReq q{static_cast<uint64_t>(off), src, bytes, stream};
    if (async) {
      FrameHeader h = MakeHeader(Op::kMemcpyDtoHAsync, sizeof q, false);
      return PushLocked(h, &q, sizeof q, nullptr, 0);
    }
    FrameHeader h = MakeHeader(Op::kMemcpyDtoH, sizeof q, true);
    if (CUresult r = PushLocked(h, &q, sizeof q, nullptr, 0); r != CUDA_SUCCESS) return r;
    return WaitReplyLocked(h.seq, static_cast<Op>(h.op), nullptr, 0, nullptr);
  }
  // Pageable destination: pipelined chunks through staging; the call returns when all arrived.
  struct Pending {
    uint32_t seq;
    uint64_t off, len, at;
  };
  std::deque<Pending> pending;
  auto* d = static_cast<uint8_t*>(dst);
  CUresult result = CUDA_SUCCESS;
  uint64_t sent = 0;
  while (sent < bytes || !pending.empty()) {
    if (sent < bytes && result == CUDA_SUCCESS) {
      const uint64_t n = std::min(kChunk, bytes - sent);
      const int64_t off = pending.size() < 24 ? StageAllocLocked(n) : -2;
      if (off == -1) return broken_;
      if (off >= 0) {
        MemcpyReq q{static_cast<uint64_t>(off), src + sent, n, stream};
        FrameHeader h = MakeHeader(Op::kMemcpyDtoH, sizeof q, true);
        StageTagLocked(h.seq, true);
        if (CUresult r = PushLocked(h, &q, sizeof q, nullptr, 0); r != CUDA_SUCCESS) return r;
        pending.push_back({h.seq, static_cast<uint64_t>(off), n, sent});
        sent += n;
        continue;
      }
    }
    if (pending.empty()) break;
    const Pending p = pending.front();
    pending.pop_front();
    CUresult r = WaitReplyLocked(p.seq, Op::kMemcpyDtoH, nullptr, 0, nullptr);
    if (r == CUDA_SUCCESS && result == CUDA_SUCCESS) std::memcpy(d + p.at, window_ + p.off, p.len);
    if (r != CUDA_SUCCESS && result == CUDA_SUCCESS) result = r;
    if (broken_ != CUDA_SUCCESS) return broken_;
    for (auto& e : stage_fifo_) {
      if (e.guest_owned && e.seq == p.seq) e.released = true;
    }
    ReclaimLocked();
    if (result != CUDA_SUCCESS) sent = bytes;  // stop issuing; drain what is in flight
  }
  return result;
}

CUresult Client::Copy2D(const CUDA_MEMCPY2D& c, uint64_t stream, bool async) noexcept {
  auto is_host = [](CUmemorytype t) { return t == CU_MEMORYTYPE_HOST; };
  if (c.srcMemoryType == CU_MEMORYTYPE_ARRAY || c.dstMemoryType == CU_MEMORYTYPE_ARRAY) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const uint64_t w = c.WidthInBytes, hgt = c.Height;
  if (w == 0 || hgt == 0) return CUDA_SUCCESS;
  if ((hgt > 1 && (c.srcPitch < w || c.dstPitch < w))) return CUDA_ERROR_INVALID_VALUE;
  const bool src_host = is_host(c.srcMemoryType), dst_host = is_host(c.dstMemoryType);
  const uint64_t src_dev = c.srcDevice + c.srcY * c.srcPitch + c.srcXInBytes;
  const uint64_t dst_dev = c.dstDevice + c.dstY * c.dstPitch + c.dstXInBytes;
  const auto* src_h = static_cast<const uint8_t*>(c.srcHost) + c.srcY * c.srcPitch + c.srcXInBytes;
  auto* dst_h = static_cast<uint8_t*>(c.dstHost) + c.dstY * c.dstPitch + c.dstXInBytes;
  if (src_host && dst_host) {
    for (uint64_t r = 0; r < hgt; ++r) std::memmove(dst_h + r * c.dstPitch, src_h + r * c.srcPitch, w);
    return CUDA_SUCCESS;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (CUresult r = SyncContextLocked(); r != CUDA_SUCCESS) return r;
  if (!src_host && !dst_host) {
    Memcpy2DReq q{src_dev, c.srcPitch, dst_dev, c.dstPitch, w, hgt, stream, kSideDevice, kSideDevice};
    FrameHeader h = MakeHeader(Op::kMemcpy2D, sizeof q, false);
    return PushLocked(h, &q, sizeof q, nullptr, 0);
  }
  const CUresult r = StagedRowsLocked(
      Op::kMemcpy2D, w, hgt, src_host ? src_h : nullptr, c.srcPitch, src_host ? nullptr : dst_h, c.dstPitch,
      [&](uint64_t row, uint64_t rows, uint64_t off, uint8_t* req) {
        const Memcpy2DReq q =
            src_host
                ? Memcpy2DReq{off, w, dst_dev + row * c.dstPitch, c.dstPitch, w, rows, stream, kSideWindow, kSideDevice}
                : Memcpy2DReq{
                      src_dev + row * c.srcPitch, c.srcPitch, off, w, w, rows, stream, kSideDevice, kSideWindow};
        std::memcpy(req, &q, sizeof q);
        return static_cast<uint32_t>(sizeof q);
      });
  (void)async;  // host-side destinations are filled before returning, as for pageable memory
  return r;
}

CUresult Client::CopyArray(const CopySide& dst, const CopySide& src, uint64_t w, uint64_t hgt,
                           uint64_t stream) noexcept {
  if (w == 0 || hgt == 0) return CUDA_SUCCESS;
  // The request for rows [row, row + rows) with the window at `off` for the host side.
  auto request = [&](uint64_t row, uint64_t rows, uint64_t off) {
    ArrayCopyReq q{};
    auto fill = [&](const CopySide& c, uint64_t* at, uint64_t* pitch, uint64_t* x, uint64_t* y, uint64_t* z,
                    uint32_t* side) {
      *side = c.kind;
      if (c.kind == kSideArray) {
        *at = c.array;
        *x = c.x;
        *y = c.y + row;
        *z = c.z;
      } else if (c.kind == kSideWindow) {
        *at = off;
        *pitch = w;
      } else {
        *at = c.dptr + row * c.pitch;
        *pitch = c.pitch;
      }
    };
    fill(src, &q.src, &q.src_pitch, &q.src_x, &q.src_y, &q.src_z, &q.src_side);
    fill(dst, &q.dst, &q.dst_pitch, &q.dst_x, &q.dst_y, &q.dst_z, &q.dst_side);
    q.width_bytes = w;
    q.height = rows;
    q.stream = stream;
    return q;
  };
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (CUresult r = SyncContextLocked(); r != CUDA_SUCCESS) return r;
  const bool src_host = src.kind == kSideWindow, dst_host = dst.kind == kSideWindow;
  if (!src_host && !dst_host) {
    ArrayCopyReq q = request(0, hgt, 0);
    FrameHeader h = MakeHeader(Op::kMemcpyArray, sizeof q, false);
    return PushLocked(h, &q, sizeof q, nullptr, 0);
  }
  return StagedRowsLocked(Op::kMemcpyArray, w, hgt, src_host ? src.src : nullptr, src.pitch,
                          src_host ? nullptr : dst.dst, dst.pitch,
                          [&](uint64_t row, uint64_t rows, uint64_t off, uint8_t* req) {
                            const ArrayCopyReq q = request(row, rows, off);
                            std::memcpy(req, &q, sizeof q);
                            return static_cast<uint32_t>(sizeof q);
                          });
}

template <class Build>
CUresult Client::StagedRowsLocked(Op op, uint64_t w, uint64_t hgt, const uint8_t* src_h, uint64_t src_pitch,
                                  uint8_t* dst_h, uint64_t dst_pitch, Build build) noexcept {
  if (w > layout_.staging_bytes / 4) return CUDA_ERROR_NOT_SUPPORTED;
  const uint64_t rows_per_chunk = std::max<uint64_t>(1, kChunk / w);
  for (uint64_t row = 0; row < hgt; row += rows_per_chunk) {
    const uint64_t rows = std::min(rows_per_chunk, hgt - row);
    const int64_t off = StageAllocLocked(rows * w);
    if (off < 0) return broken_ != CUDA_SUCCESS ? broken_ : CUDA_ERROR_UNKNOWN;
    static_assert(sizeof(Memcpy2DReq) <= kMaxStagedRequest && sizeof(ArrayCopyReq) <= kMaxStagedRequest);
    alignas(8) uint8_t req[kMaxStagedRequest];
    const uint32_t len = build(row, rows, static_cast<uint64_t>(off), req);
    if (src_h != nullptr) {
      for (uint64_t r = 0; r < rows; ++r) std::memcpy(window_ + off + r * w, src_h + (row + r) * src_pitch, w);
      FrameHeader h = MakeHeader(op, len, false);
      StageTagLocked(h.seq, false);
      if (CUresult r = PushLocked(h, req, len, nullptr, 0); r != CUDA_SUCCESS) return r;
    } else {
      FrameHeader h = MakeHeader(op, len, true);
      StageTagLocked(h.seq, true);
      if (CUresult r = PushLocked(h, req, len, nullptr, 0); r != CUDA_SUCCESS) return r;
      CUresult r = WaitReplyLocked(h.seq, op, nullptr, 0, nullptr);
      stage_fifo_.back().released = true;
      if (r != CUDA_SUCCESS) return r;
      for (uint64_t k = 0; k < rows; ++k) std::memcpy(dst_h + (row + k) * dst_pitch, window_ + off + k * w, w);
      ReclaimLocked();
    }
  }
  return CUDA_SUCCESS;
}

CUresult Client::UploadBlob(uint64_t hash_lo, uint64_t hash_hi, const uint8_t* data, uint64_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(kChunk, bytes - done);
    const int64_t off = StageAllocLocked(n);
    if (off < 0) return broken_ != CUDA_SUCCESS ? broken_ : CUDA_ERROR_UNKNOWN;
    std::memcpy(window_ + off, data + done, n);
    BlobPutReq q{hash_lo, hash_hi, bytes, done, static_cast<uint64_t>(off), n};
    FrameHeader h = MakeHeader(Op::kBlobPut, sizeof q, false);
    StageTagLocked(h.seq, false);
    if (CUresult r = PushLocked(h, &q, sizeof q, nullptr, 0); r != CUDA_SUCCESS) return r;
    done += n;
  }
  return CUDA_SUCCESS;
}

// ---- Pinned heap ---------------------------------------------------------------------------

void* Client::PinnedAlloc(uint64_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (window_ == nullptr || bytes == 0) return nullptr;
  const int64_t off = PinnedAllocLocked((bytes + kPinnedAlign - 1) & ~(kPinnedAlign - 1), kPinnedAlign);
  return off < 0 ? nullptr : window_ + off;
}

int64_t Client::PinnedAllocLocked(uint64_t need, uint64_t align) noexcept {
  for (auto it = pinned_free_.begin(); it != pinned_free_.end(); ++it) {  // first fit
    const uint64_t start = it->first, size = it->second;
    const uint64_t at = (start + align - 1) & ~(align - 1);
    if (at - start > size || need > size - (at - start)) continue;
    pinned_free_.erase(it);
    if (at > start) pinned_free_[start] = at - start;
    if (at + need < start + size) pinned_free_[at + need] = start + size - (at + need);
    pinned_used_[at] = need;
    return static_cast<int64_t>(at);
  }
  return -1;
}

bool Client::PinnedFree(void* p) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (window_ == nullptr || static_cast<uint8_t*>(p) < window_) return false;
  return PinnedFreeLocked(static_cast<uint64_t>(static_cast<uint8_t*>(p) - window_));
}

bool Client::PinnedFreeLocked(uint64_t off) noexcept {
  auto it = pinned_used_.find(off);
  if (it == pinned_used_.end()) return false;
  uint64_t start = off, size = it->second;
  pinned_used_.erase(it);
  auto next = pinned_free_.lower_bound(start);
  if (next != pinned_free_.end() && start + size == next->first) {
    size += next->second;
    next = pinned_free_.erase(next);
  }
  if (next != pinned_free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      pinned_free_.erase(prev);
    }
  }
  pinned_free_[start] = size;
  return true;
}

bool Client::PinnedRange(const void* p, void** base, uint64_t* bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (window_ == nullptr) return false;
  const auto* b = static_cast<const uint8_t*>(p);
  if (b < window_ || b >= window_ + layout_.window_bytes) return false;
  const auto off = static_cast<uint64_t>(b - window_);
  auto it = pinned_used_.upper_bound(off);
  if (it == pinned_used_.begin()) return false;
  --it;
  if (off >= it->first + it->second) return false;
  *base = window_ + it->first;
  *bytes = it->second;
  return true;
}

namespace {
// Whether [start, end) is covered by private anonymous mappings only (the heap, the stack, anonymous
// mmaps): the memory MapIntoWindow may move. A shared or file-backed mapping (another region, a
// mapped file) must keep being what it is. From /proc/self/maps (proc(5)).
bool AnonymousPrivate(uint64_t start, uint64_t end) noexcept {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  char line[512];
  uint64_t covered = start;
  bool ok = true;
  while (ok && covered < end && std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long lo = 0, hi = 0, offset = 0, inode = 0;
    char perms[8] = {}, dev[16] = {};
    int path_at = 0;
    if (std::sscanf(line, "%llx-%llx %7s %llx %15s %llu %n", &lo, &hi, perms, &offset, dev, &inode, &path_at) < 6)
      continue;
    if (hi <= covered || lo >= end) continue;
    const char* path = line + path_at;
    const bool special = path[0] == '[' && std::strncmp(path, "[heap]", 6) != 0 &&
                         std::strncmp(path, "[stack", 6) != 0 && std::strncmp(path, "[anon", 5) != 0;
    if (lo > covered || perms[3] != 'p' || inode != 0 || special) ok = false;
    covered = hi;
  }
  std::fclose(f);
  return ok && covered >= end;
}
}  // namespace

CUresult Client::MapIntoWindow(void* p, uint64_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (window_ == nullptr || network_ || region_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uint64_t start = a & ~(page - 1);
  uint64_t end = 0;
  if (__builtin_add_overflow(a, bytes, &end) || end > UINTPTR_MAX - page) return CUDA_ERROR_INVALID_VALUE;
  end = (end + page - 1) & ~(page - 1);
  const uint64_t len = end - start;
  if (!AnonymousPrivate(start, end)) {
    LogWarn(
        "cuMemHostRegister(DEVICEMAP): only private anonymous memory (heap, stack, anonymous mmap) can be "
        "mapped for the device; this range is shared or file-backed");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const auto window_file = static_cast<uint64_t>(window_ - region_->data());
  if (window_file % page != 0) return CUDA_ERROR_NOT_SUPPORTED;
  for (const auto& [ptr, m] : window_mappings_) {
    if (m.page_start < end && start < m.page_start + m.len) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  // A page-aligned block of the pinned heap.
  const int64_t at = PinnedAllocLocked(len, page);
  if (at < 0) {
    LogWarn("cuMemHostRegister(DEVICEMAP): " + std::to_string(len >> 10) +
            " KiB do not fit in the data window's pinned heap");
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const auto off = static_cast<uint64_t>(at);
  auto give_back = [&] { (void)PinnedFreeLocked(off); };
  std::memcpy(window_ + off, reinterpret_cast<void*>(start), len);
  const int fd = ::open(region_->path().c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    give_back();
    LogWarn("cuMemHostRegister(DEVICEMAP): cannot reopen " + region_->path());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  void* m = ::mmap(reinterpret_cast<void*>(start), len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                   static_cast<off_t>(window_file + off));
  ::close(fd);
  if (m == MAP_FAILED) {
    give_back();
    LogWarn("cuMemHostRegister(DEVICEMAP): mapping the window over the registered pages failed");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  window_mappings_[a] = WindowMapping{start, len, off};
  return CUDA_SUCCESS;
}

bool Client::UnmapFromWindow(void* p) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = window_mappings_.find(reinterpret_cast<uintptr_t>(p));
  if (it == window_mappings_.end()) return false;
  const WindowMapping w = it->second;
  window_mappings_.erase(it);
  // Private pages again, with the bytes they hold now (the window copy is the same memory).
  void* tmp = ::mmap(nullptr, w.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp != MAP_FAILED) {
    std::memcpy(tmp, window_ + w.off, w.len);
    // mremap moves the private copy over the shared pages atomically: no moment without memory.
    if (::mremap(tmp, w.len, w.len, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(w.page_start)) ==
        MAP_FAILED) {
      ::munmap(tmp, w.len);
      LogWarn("cuMemHostUnregister: the registered pages stay shared with the window");
      return true;  // the program's memory still holds its bytes; the heap block stays taken
    }
  } else {
    LogWarn("cuMemHostUnregister: the registered pages stay shared with the window");
    return true;
  }
  (void)PinnedFreeLocked(w.off);
  return true;
}

void* Client::WindowAlias(const void* p, void** base, uint64_t* bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [ptr, m] : window_mappings_) {
    if (a >= m.page_start && a < m.page_start + m.len) {
      *base = window_ + m.off;
      *bytes = m.len;
      return window_ + m.off + (a - m.page_start);
    }
  }
  return nullptr;
}

int64_t Client::WindowOffset(const void* p, uint64_t bytes) const noexcept {
  if (window_ == nullptr) return -1;
  const auto* b = static_cast<const uint8_t*>(p);
  const uint8_t* heap = window_ + layout_.staging_bytes;
  const uint8_t* end = window_ + layout_.window_bytes;
  if (b < heap || b >= end || bytes > static_cast<uint64_t>(end - b)) return -1;
  return b - window_;
}

void Client::Shutdown() noexcept {
  if (!connected_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ == CUDA_SUCCESS) {
    FrameHeader h = MakeHeader(Op::kGoodbye, 0, false);
    (void)PushLocked(h, nullptr, 0, nullptr, 0);
    (void)chan_->Flush();
    chan_->Close();
    LogInfo("Releasing Orion resource " + allocation_text_);
    ReleaseControllerAllocation("client_exited");
  }
  broken_ = CUDA_ERROR_DEINITIALIZED;
  stop_lease_.store(true, std::memory_order_relaxed);
}

// At exit: say goodbye to oriond so the vGPU is released at once rather than at lease expiry.
// (Here, not in log.cpp: libnvidia-ml.so.1 shares log.cpp and has no Client.)
__attribute__((destructor)) static void ReleaseAtExit() { Client::Get().Shutdown(); }

}  // namespace orion::guest
