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
// Appended to a VM guest's region errors: what only the host can change.
constexpr const char* kGuestNote = "; this is a VM: its region and vGPUs are set on the host (orion-vm enable)";

using ivshmem::ChannelLayout;
using ivshmem::kChannelClaimed;
using ivshmem::kChannelFree;

// HandshakeLocked: oriond chose RDMA but this end could not set it up; connect again over TCP.
constexpr auto kRetryOverTcp =
    static_cast<CUresult>(1010);  // private, never returned to applications (nor on the wire)

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
    // In a VM guest (an ivshmem device is here) the host's tools are out of reach: the discovery's
    // message already says what the guest can do.
    const bool guest = where.status().code() == Code::kFailedPrecondition;
    LogError(
        "cannot use Orion region: " + where.status().message() +
        (guest ? kGuestNote : " (set ORION_SHM or ORION_SERVER, or create a region with orion-shm and start oriond)"));
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
    // In a VM guest the region is the ivshmem device's BAR2: what the guest can change is who may
    // map the device.
    const bool guest = where.source.rfind("ivshmem", 0) == 0;
    LogError("cannot use Orion region: " + region.status().message() +
             (guest ? std::string(" (run as root, or as a member of group 'orion': install-client's udev rule gives it "
                                  "the device)") +
                          kGuestNote
                    : std::string(" (set ORION_SHM, or create it with orion-shm and start oriond)")));
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
  host_region_ = rings == ivshmem::kRingsFutex;
  channel_bytes_ = channel_bytes;
  layout_ = ChannelLayout::Compute(channel_bytes);
  uint8_t* chan = ivshmem::ChannelBase(region_->data(), channel_bytes, channel_index_);
  const uint32_t generation = desc_->generation;  // published before the channel was freed (R0/K0)
  chan_ = std::make_unique<ShmFrameChannel>(
      chan + layout_.request_ring_offset, static_cast<uint32_t>(layout_.request_ring_bytes),
      chan + layout_.reply_ring_offset, static_cast<uint32_t>(layout_.reply_ring_bytes), generation);
  window_ = chan + layout_.window_offset;
  pinned_free_.clear();
  pinned_free_[layout_.staging_bytes] = layout_.window_bytes - layout_.staging_bytes;
  // The channel's own descriptor (desc_ changes when the session moves to TCP; the region stays
  // mapped for as long as the process lives).
  lease_thread_ = std::thread([this, desc = desc_] {
    while (!stop_lease_.load(std::memory_order_relaxed)) {
      timespec ts{0, static_cast<long>(ivshmem::kLeasePeriodMs) * 1000000L};
      nanosleep(&ts, nullptr);
      // L0: liveness only; oriond compares successive values (no data is published by it).
      if (!stop_lease_.load(std::memory_order_relaxed)) desc->client_lease.fetch_add(1, std::memory_order_relaxed);
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
  // Shared memory: synchronous calls through the sync slot (ivshmem/ring.h) unless ORION_SYNC_SLOT=0
  // (to compare); the worker says in its Welcome whether it serves it.
  const char* slot = std::getenv("ORION_SYNC_SLOT");
  if (!network_ && (slot == nullptr || std::strcmp(slot, "0") != 0)) hello.transports |= kTransportSyncSlot;
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
  if (!network_ && (hello.transports & kTransportSyncSlot) != 0 && (welcome_.features & kWelcomeSyncSlot) != 0) {
    static_cast<ShmFrameChannel*>(chan_.get())->UseSyncSlot();
  }
  if (network_) {
    // The network channel's window: a private copy, laid out like the server's.
    if (welcome_.channel_bytes < ivshmem::kMinChannelBytes || welcome_.channel_bytes > (uint64_t{4} << 30)) {
      return Broken(CUDA_ERROR_UNKNOWN, "oriond announced an impossible channel size");
    }
    layout_ = ChannelLayout::Compute(welcome_.channel_bytes);
    channel_bytes_ = welcome_.channel_bytes;
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

CUresult Client::ResumeLocked(const ivshmem::FrameView& f) noexcept {
  // A region session moves too (to TCP at the target) when its region is a file on this host.
  const bool shm = !network_ && host_region_ && region_ != nullptr && tcp_ == nullptr;
  if ((!shm && (tcp_ == nullptr || tcp_->secure())) || f.header.payload_len != sizeof(MovedRep)) {
    return Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, (peer_ + " sent a move this connection cannot follow").c_str());
  }
  MovedRep moved{};
  std::memcpy(&moved, f.payload, sizeof moved);
  moved.address[sizeof moved.address - 1] = '\0';
  moved.token[sizeof moved.token - 1] = '\0';
  moved.back_token[sizeof moved.back_token - 1] = '\0';
  const size_t back_len = strnlen(moved.back_token, sizeof moved.back_token);
  std::vector<uint8_t> call = std::move(last_call_);
  last_call_.clear();
  if (shm && last_call_at_ != nullptr) call.assign(last_call_at_, last_call_at_ + last_call_len_);
  if (!ValidShareToken(moved.token, sizeof moved.token) || strnlen(moved.token, sizeof moved.token) != kShareTokenLen ||
      (back_len != 0 && (back_len != kShareTokenLen || !ValidShareToken(moved.back_token, sizeof moved.back_token))) ||
      call.size() < sizeof(FrameHeader)) {
    return Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, (peer_ + " sent a malformed move").c_str());
  }
  const std::string source = shm ? std::string() : tcp_->address(), from = peer_, to = moved.address;
  resuming_ = true;
  resume_failure_.clear();
  // The target's answer is bounded well inside the source's wait for it (30 s, session_move.cpp):
  // a target that accepts but never answers leaves time for the way back.
  const uint64_t handshake_ms = handshake_ms_;
  if (back_len != 0 && (handshake_ms_ == 0 || handshake_ms_ > kResumeAnswerMs)) handshake_ms_ = kResumeAnswerMs;
  // A region session keeps its channel for the way back until the target has it.
  std::unique_ptr<FrameChannel> ring;
  ivshmem::ChannelDesc* ring_desc = desc_;
  ivshmem::RegionHeader* ring_header = header_;
  CUresult r = CUDA_ERROR_DEVICE_UNAVAILABLE;
  if (shm && !window_mappings_.empty()) {
    // Those pages are the region's (MapIntoWindow): over TCP the device could no longer see them.
    resume_failure_ = "it holds host memory registered for the device (cuMemHostRegister), which stays with this host";
  } else if (shm && !PrivateWindowLocked()) {
    resume_failure_ = std::string("its data window cannot be made private memory: ") + std::strerror(errno);
  } else {
    if (shm) ring = std::move(chan_);
    r = ResumeAt(to, moved.token);
  }
  handshake_ms_ = handshake_ms;
  if (r == CUDA_SUCCESS) {
    if (shm) {
      // The region's channel is the source's to free: no lease, no wake-ups, no bytes there.
      stop_lease_.store(true, std::memory_order_relaxed);
      network_ = true;
      ring.reset();
    }
    LogInfo("Orion: the session moved from " + from + " to " + peer_ + " (session " +
            std::to_string(welcome_.session_id) + " there)");
  } else if (back_len != 0) {
    // The target cannot be reached or refused the program: the source still holds the session
    // until the target confirms it, and takes the program back.
    const std::string failure = resume_failure_;
    broken_ = CUDA_SUCCESS;
    resume_failure_.clear();
    if (!shm) {
      r = ResumeAt(source, moved.back_token);
    } else {
      // Back on the region's channel (if it was handed over), the window shared with the source's
      // worker again.
      bool shared = true;
      if (ring != nullptr) {
        if (tcp_ != nullptr) tcp_->ReleaseWindow();
        tcp_ = nullptr;
        chan_ = std::move(ring);
        desc_ = ring_desc;
        header_ = ring_header;
        peer_ = from;
        shared = SharedWindowLocked();
        if (!shared) resume_failure_ = std::string("its data window cannot be shared again: ") + std::strerror(errno);
      }
      if (shared) r = ResumeHelloLocked(moved.back_token, welcome_.transport, welcome_.channel_bytes, "");
    }
    if (r == CUDA_SUCCESS) {
      LogWarn("Orion: the session could not follow its move to oriond at " + LogSafe(to) + " (" + failure +
              "); it continues at " + peer_);
    } else {
      resume_failure_ = failure + "; and back at " + from + ": " + resume_failure_;
    }
  }
  resuming_ = false;
  if (chan_ == nullptr && ring != nullptr) chan_ = std::move(ring);  // no way back: a channel to fail on
  if (r != CUDA_SUCCESS) {
    broken_ = CUDA_SUCCESS;
    return Broken(
        CUDA_ERROR_DEVICE_UNAVAILABLE,
        ("the session moved to oriond at " + LogSafe(to) + ", but could not resume: " + resume_failure_).c_str());
  }
  // The request the source did not execute, again (its seq unchanged: the reply answers it).
  FrameHeader again{};
  std::memcpy(&again, call.data(), sizeof again);
  return PushLocked(again, call.data() + sizeof again, static_cast<uint32_t>(call.size() - sizeof again), nullptr, 0);
}

CUresult Client::ResumeAt(const std::string& address, const char* token) noexcept {
  auto tcp = TcpFrameChannel::Connect(address, false, "");
  if (!tcp.ok()) {
    resume_failure_ = "it cannot be reached: " + LogSafe(tcp.status().message());
    return CUDA_ERROR_DEVICE_UNAVAILABLE;
  }
  (*tcp)->SetStallLimit(stall_ms_);
  // The program's pinned buffers and copies in flight keep their bytes: the window moves along
  // (a region's, made private, from a region session).
  if (tcp_ != nullptr) {
    (*tcp)->TakeWindow(*tcp_);
  } else {
    (*tcp)->AdoptWindow(window_, layout_.window_bytes);
  }
  tcp_ = tcp->get();
  desc_ = tcp_->desc();
  header_ = tcp_->header();
  chan_ = std::move(*tcp);  // the previous connection closes
  peer_ = "oriond at " + LogSafe(address);
  return ResumeHelloLocked(token, kTransportTcp, channel_bytes_, address);
}

CUresult Client::ResumeHelloLocked(const char* token, uint16_t transport, uint64_t channel_bytes,
                                   const std::string& address) noexcept {
  HelloReq hello{};
  hello.protocol_version = kProtocolVersion;
  hello.transports = transport;
  hello.kind = kHelloResume;
  std::memcpy(hello.share, token, kShareTokenLen);
  hello.pid = static_cast<uint32_t>(getpid());
  std::snprintf(hello.process_name, sizeof hello.process_name, "%s", ProcessName().c_str());
  if (const char* key = std::getenv("ORION_KEY"); key != nullptr && transport != kTransportShm) {
    std::strncpy(hello.key, key, sizeof hello.key - 1);
  }
  gethostname(hello.hostname, sizeof hello.hostname - 1);
  const FrameHeader h = MakeHeader(Op::kHello, sizeof hello, true);
  if (CUresult r = PushLocked(h, &hello, sizeof hello, nullptr, 0); r != CUDA_SUCCESS) return r;
  std::vector<uint8_t> rep(sizeof(WelcomeRep) + kMaxDevices * sizeof(DeviceInfo) + 1024);
  uint32_t rep_len = 0;
  if (CUresult r = WaitReplyLocked(h.seq, Op::kHello, rep.data(), static_cast<uint32_t>(rep.size()), &rep_len);
      r != CUDA_SUCCESS) {
    if (broken_ == CUDA_SUCCESS) {  // a refusal, with its reason
      std::string reason(reinterpret_cast<const char*>(rep.data()), std::min<size_t>(rep_len, rep.size()));
      reason.resize(strnlen(reason.c_str(), reason.size()));
      resume_failure_ = "it refused the session: " + LogSafe(reason);
    }
    return CUDA_ERROR_DEVICE_UNAVAILABLE;
  }
  WelcomeRep w{};
  if (rep_len >= sizeof w) std::memcpy(&w, rep.data(), sizeof w);
  if (rep_len < sizeof w || w.device_count != welcome_.device_count || w.channel_bytes != channel_bytes ||
      w.transport != transport) {
    resume_failure_ = "its Welcome does not match the session";
    return CUDA_ERROR_DEVICE_UNAVAILABLE;
  }
  if (rep_len < sizeof w + w.device_count * sizeof(DeviceInfo)) {
    resume_failure_ = "its Welcome is short";
    return CUDA_ERROR_DEVICE_UNAVAILABLE;
  }
  if (address.empty()) return CUDA_SUCCESS;  // back where it was: nothing changed
  welcome_.session_id = w.session_id;
  welcome_.transport = w.transport;
  welcome_.channel_bytes = w.channel_bytes;
  // Where each vGPU is now (the devices keep what the program was told about them).
  allocation_text_ = "(standalone) session-" + std::to_string(w.session_id) + " :";
  for (uint32_t d = 0; d < w.device_count; ++d) {
    DeviceInfo info{};
    std::memcpy(&info, rep.data() + sizeof w + d * sizeof info, sizeof info);
    devices_[d].pgpu = info.pgpu;
    devices_[d].vgpu = info.vgpu;
    allocation_text_ += " " + LogSafe(address) + "/" + std::to_string(info.pgpu) + "/" + std::to_string(info.vgpu);
  }
  return CUDA_SUCCESS;
}

}  // namespace orion::guest