#include "orion/ivshmem/region.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "orion/ivshmem/ring.h"

namespace orion::ivshmem {
namespace {

uint64_t FloorPow2(uint64_t v) { return v == 0 ? 0 : uint64_t{1} << (63 - __builtin_clzll(v)); }

std::string Errno(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// ---- The SIGBUS guard (see MappedRegion in region.h) ----------------------------------------
// Slots are claimed and released by the owning thread; the handler only reads `base`/`bytes` and
// sets `faulted`. A slot is published by storing `bytes` and `faulted` first, then `base`
// (release); it is retired by storing `base` = 0 before the mapping goes away.
struct GuardSlot {
  std::atomic<uintptr_t> base{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint32_t> faulted{0};
};
constexpr int kGuardSlots = 256;
GuardSlot g_guard[kGuardSlots];
std::mutex g_guard_mu;  // claims and releases of slots (never taken by the handler)
struct sigaction g_previous_sigbus {};

// Replaces [base, base+bytes) by private zero pages, in place. mmap is a plain system call here
// (not on POSIX's async-signal-safe list, but it takes no user-space lock).
bool ZeroOver(uintptr_t base, uint64_t bytes) {
  void* p = ::mmap(reinterpret_cast<void*>(base), bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  return p != MAP_FAILED;
}

void OnSigbus(int sig, siginfo_t* info, void* uctx) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (GuardSlot& g : g_guard) {
    // G1: pairs with G0 in GuardClaim.
    const uintptr_t base = g.base.load(std::memory_order_acquire);
    if (base == 0 || addr < base || addr - base >= g.bytes.load(std::memory_order_relaxed)) continue;
    if (ZeroOver(base, g.bytes.load(std::memory_order_relaxed))) {
      g.faulted.store(1, std::memory_order_relaxed);
      return;  // the faulting access is retried on the zero pages
    }
    break;
  }
  // Not a guarded region (a real bug): the previous disposition takes over.
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) != 0 && g_previous_sigbus.sa_sigaction != nullptr) {
    g_previous_sigbus.sa_sigaction(sig, info, uctx);
    return;
  }
  if (g_previous_sigbus.sa_handler != SIG_DFL && g_previous_sigbus.sa_handler != SIG_IGN &&
      g_previous_sigbus.sa_handler != nullptr) {
    g_previous_sigbus.sa_handler(sig);
    return;
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGBUS, &dfl, nullptr);  // returning re-executes the access, which now kills us
}

int GuardClaim(uint8_t* base, uint64_t bytes) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
  std::lock_guard<std::mutex> l(g_guard_mu);
  for (int i = 0; i < kGuardSlots; ++i) {
    GuardSlot& g = g_guard[i];
    if (g.base.load(std::memory_order_relaxed) != 0) continue;
    g.bytes.store(bytes, std::memory_order_relaxed);
    g.faulted.store(0, std::memory_order_relaxed);
    // G0: publishes bytes/faulted with the base; pairs with G1 in OnSigbus.
    g.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    return i;
  }
  return -1;
}

void GuardRelease(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> l(g_guard_mu);
  g_guard[slot].base.store(0, std::memory_order_release);
}

}  // namespace

ChannelLayout ChannelLayout::Compute(uint64_t channel_bytes) {
  ChannelLayout l{};
  // Rings: 1/32 of the channel for requests (at most 4 MiB), 1/4 of that for replies; powers of two.
  const uint64_t req = std::min<uint64_t>(FloorPow2(channel_bytes / 32), 4ull << 20);
  const uint64_t rep = std::max<uint64_t>(req / 4, 64 * 1024);
  l.request_ring_offset = 0;
  l.request_ring_bytes = req;
  l.reply_ring_offset = kRingCursorBytes + req;
  l.reply_ring_bytes = rep;
  l.window_offset = (l.reply_ring_offset + kRingCursorBytes + rep + 4095) & ~uint64_t{4095};
  l.window_bytes = channel_bytes > l.window_offset ? (channel_bytes - l.window_offset) & ~uint64_t{4095} : 0;
  // Staging: half the window, at most 32 MiB; the rest is the pinned-allocation heap.
  l.staging_bytes = std::min<uint64_t>((l.window_bytes / 2) & ~uint64_t{4095}, 32ull << 20);
  return l;
}

uint32_t ChannelCountFor(uint64_t region_bytes, uint64_t channel_bytes) {
  if (channel_bytes < kMinChannelBytes || region_bytes <= kHeaderBytes) return 0;
  const uint64_t n = (region_bytes - kHeaderBytes) / channel_bytes;
  return static_cast<uint32_t>(std::min<uint64_t>(n, kMaxChannels));
}

Result<MappedRegion> MappedRegion::Open(const std::string& path, uint64_t create_bytes) {
  int flags = O_RDWR | O_CLOEXEC;
  if (create_bytes > 0) flags |= O_CREAT;
  const int fd = ::open(path.c_str(), flags, 0660);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound(Errno("cannot open", path));
    if (errno == EACCES || errno == EPERM) return Status(Code::kPermissionDenied, Errno("cannot open", path));
    return Internal(Errno("cannot open", path));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Internal(Errno("cannot stat", path));
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0 && create_bytes > 0) {
    if (::ftruncate(fd, static_cast<off_t>(create_bytes)) != 0) {
      ::close(fd);
      return Internal(Errno("cannot size", path));
    }
    size = create_bytes;
  }
  if (size == 0 && S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + " is empty");
  }
  if (!S_ISREG(st.st_mode)) {
    // A sysfs resourceN file reports its BAR size as st_size too; anything else is refused.
    ::close(fd);
    return InvalidArgument(path + " is not a regular file");
  }
  if (size % 4096 != 0) {
    ::close(fd);
    return InvalidArgument(path + " size " + std::to_string(size) + " is not a multiple of 4096");
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return Internal(Errno("cannot map", path));
  return MappedRegion(static_cast<uint8_t*>(p), size, path);
}

Result<MappedRegion> MappedRegion::OpenServed(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound(Errno("cannot open", path));
    if (errno == EACCES || errno == EPERM) return Status(Code::kPermissionDenied, Errno("cannot open", path));
    return Internal(Errno("cannot open", path));
  }
  // One owner per region. flock, not fcntl locks: QEMU takes OFD byte-range locks on some files
  // it opens, and the two kinds never conflict on Linux.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const bool busy = errno == EWOULDBLOCK;
    const std::string err = std::strerror(errno);
    ::close(fd);
    if (busy) {
      return Status(Code::kAlreadyExists, path + " is already served by another oriond (it holds the region's lock)");
    }
    return Internal("cannot lock " + path + ": " + err);
  }
  // The mapping itself: Open's checks, on a second descriptor (closed by Open) of the same file.
  auto m = Open(path);
  if (!m.ok()) {
    ::close(fd);
    return m.status();
  }
  m->fd_ = fd;
  m->guard_slot_ = GuardClaim(m->data_, m->size_);
  if (m->guard_slot_ < 0) return ResourceExhausted("cannot guard " + path + ": too many regions");
  return m;
}

Result<uint64_t> MappedRegion::FileBytes() const {
  struct stat st {};
  if (fd_ < 0 || ::fstat(fd_, &st) != 0) return Internal(Errno("cannot stat", path_));
  return static_cast<uint64_t>(st.st_size);
}

bool MappedRegion::StillAtPath() const {
  struct stat mine {
  }, now{};
  if (fd_ < 0 || ::fstat(fd_, &mine) != 0) return false;
  if (::stat(path_.c_str(), &now) != 0) return false;
  return mine.st_dev == now.st_dev && mine.st_ino == now.st_ino;
}

bool MappedRegion::faulted() const noexcept {
  return guard_slot_ >= 0 && g_guard[guard_slot_].faulted.load(std::memory_order_relaxed) != 0;
}

void MappedRegion::Sever() noexcept {
  if (data_ == nullptr || guard_slot_ < 0) return;
  if (ZeroOver(reinterpret_cast<uintptr_t>(data_), size_)) {
    g_guard[guard_slot_].faulted.store(1, std::memory_order_relaxed);
  }
}

void MappedRegion::Release() noexcept {
  GuardRelease(guard_slot_);  // before the munmap: the range may be reused by any later mmap
  guard_slot_ = -1;
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

MappedRegion::MappedRegion(MappedRegion&& o) noexcept
    : data_(o.data_), size_(o.size_), path_(std::move(o.path_)), fd_(o.fd_), guard_slot_(o.guard_slot_) {
  o.data_ = nullptr;
  o.size_ = 0;
  o.fd_ = -1;
  o.guard_slot_ = -1;
}

MappedRegion& MappedRegion::operator=(MappedRegion&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = o.data_;
    size_ = o.size_;
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    guard_slot_ = o.guard_slot_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.fd_ = -1;
    o.guard_slot_ = -1;
  }
  return *this;
}

MappedRegion::~MappedRegion() { Release(); }

Result<uint64_t> ChannelBytesFor(uint64_t region_bytes, uint32_t processes) {
  if (processes == 0 || processes > kMaxChannels) {
    return InvalidArgument("processes must be 1.." + std::to_string(kMaxChannels));
  }
  const uint64_t ch = region_bytes > kHeaderBytes ? ((region_bytes - kHeaderBytes) / processes) & ~uint64_t{4095} : 0;
  if (ch < kMinChannelBytes) {
    return InvalidArgument("a region of " + std::to_string(region_bytes >> 20) + " MiB is too small for " +
                           std::to_string(processes) + " processes (each needs at least " +
                           std::to_string(kMinChannelBytes >> 20) + " MiB)");
  }
  return ch;
}

Status FormatRegion(uint8_t* base, uint64_t region_bytes, uint64_t channel_bytes, const VmLimits* vm) {
  const uint32_t n = ChannelCountFor(region_bytes, channel_bytes);
  if (n == 0) {
    return InvalidArgument("region of " + std::to_string(region_bytes >> 20) + " MiB holds no channel of " +
                           std::to_string(channel_bytes >> 20) + " MiB");
  }
  RegionHeader* h = Header(base);
  // Invalidate first so an attaching client never sees a half-written header as valid.
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(0, std::memory_order_release);
  std::memset(reinterpret_cast<uint8_t*>(h) + sizeof(uint64_t), 0, kHeaderBytes - sizeof(uint64_t));
  h->layout_version = kLayoutVersion;
  h->header_bytes = kHeaderBytes;
  h->region_bytes = region_bytes;
  h->channel_count = n;
  h->channel_bytes = channel_bytes;
  // getrandom(2), not std::random_device: libstdc++'s uses arc4random, which would make everything
  // linking this (libcuda.so.1 in old guests too) need glibc 2.36.
  uint64_t epoch = 0;
  if (getrandom(&epoch, sizeof epoch, 0) != static_cast<ssize_t>(sizeof epoch))
    epoch = static_cast<uint64_t>(time(nullptr));
  h->server_epoch = epoch;
  if (vm != nullptr) {
    h->features |= kFeatureVmLimits;
    h->vm_vgpus = vm->vgpus;
    h->vm_gmem_bytes = vm->gmem_bytes;
    if (vm->doorbell_vectors > 0) {
      h->features |= kFeatureDoorbell;
      h->doorbell_peer = 0;  // kHostPeer (doorbell.h)
      // One vector per channel: QEMU may have more (<msi vectors>), no channel rings past the last.
      h->doorbell_vectors = std::min(vm->doorbell_vectors, n);
    }
  }
  for (uint32_t i = 0; i < n; ++i) {
    // Only the ring cursors need zeroing; window bytes are the client's business.
    const ChannelLayout l = ChannelLayout::Compute(channel_bytes);
    uint8_t* c = ChannelBase(base, channel_bytes, i);
    std::memset(c + l.request_ring_offset, 0, kRingCursorBytes + l.request_ring_bytes);
    std::memset(c + l.reply_ring_offset, 0, kRingCursorBytes + l.reply_ring_bytes);
    h->channels[i].generation = 1;
  }
  // F0: publishes the header; pairs with V0 in ValidateHeader.
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kRegionMagic, std::memory_order_release);
  return Status::Ok();
}

void PublishDoorbell(uint8_t* base, uint32_t peer, uint32_t vectors) {
  RegionHeader* h = Header(base);
  h->doorbell_peer = peer;
  h->doorbell_vectors = vectors;
  // Informative for guests, which read it when a process starts (no process of the VM runs yet).
  h->features |= kFeatureDoorbell;
}

uint32_t ResetChannel(uint8_t* base, const RegionHeader& trusted, uint32_t index, uint32_t generation) {
  const ChannelLayout l = ChannelLayout::Compute(trusted.channel_bytes);
  uint8_t* c = ChannelBase(base, trusted.channel_bytes, index);
  // Whole rings: no record of the ended session can ever look published again.
  std::memset(c + l.request_ring_offset, 0, kRingCursorBytes + l.request_ring_bytes);
  std::memset(c + l.reply_ring_offset, 0, kRingCursorBytes + l.reply_ring_bytes);
  ChannelDesc& d = Header(base)->channels[index];
  d.client_lease.store(0, std::memory_order_relaxed);
  d.server_done_seq.store(0, std::memory_order_relaxed);
  d.close_reason.store(0, std::memory_order_relaxed);
  d.session_id = 0;
  d.generation = generation + 1;
  d.server_sleeping.store(0, std::memory_order_relaxed);
  d.doorbell.store(0, std::memory_order_relaxed);
  d.client_rings.store(0, std::memory_order_relaxed);
  // R0: the cleared cursors are visible before the channel can be claimed; pairs with the
  // client's acquire CAS on `state`.
  d.state.store(kChannelFree, std::memory_order_release);
  return generation + 1;
}

Result<const RegionHeader*> ValidateHeader(const uint8_t* base, uint64_t region_bytes) {
  const auto* h = reinterpret_cast<const RegionHeader*>(base);
  // V0: pairs with F0 in FormatRegion.
  const uint64_t magic = reinterpret_cast<const std::atomic<uint64_t>*>(&h->magic)->load(std::memory_order_acquire);
  if (magic != kRegionMagic) {
    return FailedPrecondition("region is not formatted (is oriond serving it?)");
  }
  if (h->layout_version != kLayoutVersion) {
    return FailedPrecondition("region layout version " + std::to_string(h->layout_version) + " is not " +
                              std::to_string(kLayoutVersion));
  }
  if (h->region_bytes != region_bytes || h->channel_count == 0 || h->channel_count > kMaxChannels ||
      h->channel_bytes < kMinChannelBytes ||
      kHeaderBytes + uint64_t{h->channel_count} * h->channel_bytes > region_bytes) {
    return FailedPrecondition("region header is inconsistent with the region's size");
  }
  return h;
}

}  // namespace orion::ivshmem
