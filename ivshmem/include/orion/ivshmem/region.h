// orion/ivshmem/region.h — the shared-memory region between guest runtimes and oriond.
//
// One file (/dev/shm/orionsock<N>, or a VM's ivshmem-plain BAR2 backed by that file) holds a
// header, a channel table and the channels. Each channel is one client process's session: a
// request ring, a reply ring and a data window (bulk bytes and pinned host allocations).
// All references are offsets, never pointers. Spec: docs/spec/region.md.
//
//   auto region = MappedRegion::Open("/dev/shm/orionsock0");
//   if (!region.ok()) ...;
//   auto header = ValidateHeader(region->data(), region->size());   // client: checks it first
//
// oriond formats a region (FormatRegion) when it starts serving it; clients only attach.
// Thread-safety: the structs are shared across processes; every atomic access names its partner.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "orion/common/status.h"

namespace orion::ivshmem {

inline constexpr uint64_t kRegionMagic = 0x314D48534E4F524FULL;  // "ORIONSHM1" (LE bytes "ORIONSHM1"[0..7])
inline constexpr uint32_t kLayoutVersion = 1;
inline constexpr uint32_t kCacheLine = 128;     // cursor separation (two 64 B lines: adjacent-line prefetch)
inline constexpr uint32_t kHeaderBytes = 4096;  // header + channel table live in the first page
inline constexpr uint32_t kMaxChannels = 30;
inline constexpr uint64_t kMinChannelBytes = 4ull << 20;

// RegionHeader::features. Layout version 1 regions written by an older oriond have 0 here (the
// bytes were reserved and zeroed), so a new client reads "nothing published"; an old client never
// reads the field. New fields go into `reserved` with a new bit, never a new layout version.
inline constexpr uint32_t kFeatureVmLimits = 1u << 0;  // vm_vgpus / vm_gmem_bytes are set
inline constexpr uint32_t kFeatureDoorbell = 1u << 1;  // doorbell_peer / doorbell_vectors are set:
                                                       // oriond serves this VM's ivshmem-doorbell

// Channel states (ChannelDesc::state).
enum ChannelState : uint32_t {
  kChannelFree = 0,      // nobody; a client may CAS it to kChannelClaimed
  kChannelClaimed = 1,   // a client owns it and has sent (or is sending) Hello
  kChannelActive = 2,    // a server worker serves it
  kChannelDead = 3,      // the server ended the session (error, violation, refusal); the client
                         // stops using it and oriond frees it when the client's lease goes stale
                         // or the client writes kChannelDetached
  kChannelDetached = 4,  // the client is done with it; oriond resets it to kChannelFree
};

// ChannelDesc::client_rings: how a client wakes a sleeping worker.
enum ClientRings : uint32_t {
  kRingsNone = 0,     // it cannot (an older guest runtime in a VM): the worker naps
  kRingsFutex = 1,    // a shared futex on `doorbell` (the client shares oriond's kernel)
  kRingsIvshmem = 2,  // the ivshmem-doorbell register in BAR0: QEMU signals the eventfd of vector
                      // <channel index> of peer RegionHeader::doorbell_peer (oriond)
};

struct ChannelDesc {                      // 128 bytes, in the channel table
  std::atomic<uint32_t> state;            // ChannelState
  uint32_t session_id;                    // written by oriond for diagnostics
  std::atomic<uint64_t> client_lease;     // bumped by the client every kLeasePeriodMs
  std::atomic<uint64_t> server_done_seq;  // oriond: seq of the last executed frame (staging release)
  std::atomic<int32_t> close_reason;      // oriond: a CUresult-space reason when it sets kChannelDead
  uint32_t generation;                    // oriond: bumped at each reset; tags ring stamps (ring.h)
  uint8_t reserved0[32];                  // the doorbell below lives on the second cache line: the
                                          // first is written per frame (server_done_seq) and the
                                          // client reads the doorbell flag per frame
  // Doorbell: the worker sets `server_sleeping` before it sleeps; a client that publishes a frame
  // while it is set bumps `doorbell` and wakes the worker the way `client_rings` says.
  std::atomic<uint32_t> server_sleeping;
  std::atomic<uint32_t> doorbell;
  std::atomic<uint32_t> client_rings;  // client: a ClientRings value (how its wake-ups reach the
                                       // worker); hostile input: a wrong value only slows its
                                       // own session
  uint8_t reserved[52];
};
static_assert(sizeof(ChannelDesc) == 128);

struct RegionHeader {
  uint64_t magic;           // kRegionMagic, written last by FormatRegion
  uint32_t layout_version;  // kLayoutVersion
  uint32_t header_bytes;    // kHeaderBytes
  uint64_t region_bytes;
  uint32_t channel_count;
  uint32_t reserved0;
  uint64_t channel_bytes;                  // each channel's size; channel i starts at
                                           // kHeaderBytes + i * channel_bytes
  std::atomic<uint64_t> server_heartbeat;  // oriond bumps it every 100 ms
  uint64_t server_epoch;                   // random per FormatRegion: a client notices a restart
  uint32_t features;                       // kFeature* bits: which of the fields below are set
  // A VM's region (kFeatureVmLimits): what the VM was given, so a guest process needs no
  // ORION_VGPU / ORION_GMEM. oriond enforces its own copy; these are informative for the guest.
  uint32_t vm_vgpus;       // vGPUs of the VM
  uint64_t vm_gmem_bytes;  // quota of each of them
  // kFeatureDoorbell: the VM's ivshmem-doorbell reaches oriond as peer `doorbell_peer`; channel i
  // rings vector i when i < doorbell_vectors (informative: oriond only listens, it trusts nothing).
  uint32_t doorbell_peer;
  uint32_t doorbell_vectors;
  uint8_t reserved[48];
  ChannelDesc channels[kMaxChannels];  // at offset 128
};
static_assert(offsetof(RegionHeader, features) == 56);
static_assert(offsetof(RegionHeader, vm_vgpus) == 60);
static_assert(offsetof(RegionHeader, vm_gmem_bytes) == 64);
static_assert(offsetof(RegionHeader, doorbell_peer) == 72);
static_assert(offsetof(RegionHeader, doorbell_vectors) == 76);
static_assert(offsetof(RegionHeader, channels) == 128);
static_assert(sizeof(RegionHeader) <= kHeaderBytes);

inline constexpr uint32_t kLeasePeriodMs = 100;

// Where things are inside one channel: computed from the channel size alone, by both sides; never
// read from shared memory.
struct ChannelLayout {
  uint64_t request_ring_offset, request_ring_bytes;  // cursors at the offset, bytes after 2 lines
  uint64_t reply_ring_offset, reply_ring_bytes;
  uint64_t window_offset, window_bytes;  // data window
  uint64_t staging_bytes;                // window[0, staging_bytes): bulk staging
                                         // window[staging_bytes, window_bytes): pinned heap
  static ChannelLayout Compute(uint64_t channel_bytes);
};

// Number of channels a region of `region_bytes` holds at `channel_bytes` each.
uint32_t ChannelCountFor(uint64_t region_bytes, uint64_t channel_bytes);

// An mmap of a region file (or a sysfs BAR2 resource file). RAII: unmaps on destruction.
//
// oriond's mappings (OpenServed) are hardened against the tenants who share the file:
// - One owner: OpenServed takes an exclusive flock(2) on the file and holds it for the mapping's
//   life, so a second oriond cannot format (and serve) a region that one already serves.
// - Truncation: a tenant with the file open read-write can shrink it at any moment; touching a
//   page past the new end of a MAP_SHARED mapping raises SIGBUS, which would kill the daemon with
//   every session. A process-wide SIGBUS handler (installed by the first OpenServed) checks whether
//   the fault lies in a guarded mapping; if so it replaces that whole mapping, in place, by private
//   zero pages (mmap MAP_FIXED|MAP_ANONYMOUS) and flags it (faulted()); the access is retried and
//   reads zeros. The daemon notices the flag (or the smaller size, FileBytes()) at its next check
//   and stops serving the region. The same design as Wayland's wl_shm_buffer_begin_access; no
//   longjmp, so no C++ state is skipped. A fault anywhere else gets the previous disposition
//   (default: the process dies), so real bugs still crash. memfd sealing (F_SEAL_SHRINK) would
//   prevent the truncation itself, but a /dev/shm file shared with a container cannot be sealed.
class MappedRegion {
 public:
  // Opens `path` read-write and maps it. If `create_bytes` > 0 and the file does not exist, it is
  // created with that size (mode 0660). Errors: kNotFound (no file), kPermissionDenied,
  // kInvalidArgument (size 0 or not a multiple of 4096), kInternal (mmap).
  static Result<MappedRegion> Open(const std::string& path, uint64_t create_bytes = 0);
  // Whether the file at path() is still the one mapped (same device and inode): false once it was
  // removed or replaced (a VM's region after the VM stopped). OpenServed mappings only.
  bool StillAtPath() const;
  // oriond's side (see above): opens an existing region, takes its exclusive lock, maps it and
  // guards the mapping against truncation. Errors: as Open, kAlreadyExists when another process
  // (another oriond) holds the lock, kResourceExhausted when 256 mappings are guarded already.
  // The descriptor stays open (O_CLOEXEC) with the lock until destruction.
  static Result<MappedRegion> OpenServed(const std::string& path);
  MappedRegion(MappedRegion&& o) noexcept;
  MappedRegion& operator=(MappedRegion&& o) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion();

  uint8_t* data() const noexcept { return data_; }
  uint64_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

  // OpenServed mappings only. The file's size now (fstat), which a tenant may have changed.
  Result<uint64_t> FileBytes() const;
  // OpenServed mappings only: whether an access faulted past the file's end, so the mapping now
  // holds private zero pages instead of the file. Async-signal-safe read of the guard's flag.
  bool faulted() const noexcept;
  // Replaces the mapping by private zero pages (once the daemon stops serving the file): later
  // accesses through data() are harmless and reach nobody. Idempotent.
  void Sever() noexcept;

 private:
  MappedRegion(uint8_t* d, uint64_t s, std::string p) : data_(d), size_(s), path_(std::move(p)) {}
  void Release() noexcept;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
  int fd_ = -1;          // OpenServed: holds the flock
  int guard_slot_ = -1;  // OpenServed: the SIGBUS guard's slot
};

// What a VM's region publishes about the VM (RegionHeader::vm_*).
struct VmLimits {
  uint32_t vgpus = 0;
  uint64_t gmem_bytes = 0;        // per vGPU
  uint32_t doorbell_vectors = 0;  // > 0: oriond serves the VM's ivshmem-doorbell (kFeatureDoorbell); published
                                  // as min(this, channel count)
};

// Server side: announces the VM doorbell in a formatted region (kFeatureDoorbell): the guest rings
// `peer` (oriond's ivshmem peer id), vector = channel index, for channels below `vectors`.
void PublishDoorbell(uint8_t* base, uint32_t peer, uint32_t vectors);

// Server side: writes a fresh header and channel table for channels of `channel_bytes`; every
// channel becomes kChannelFree with zeroed cursors. `vm`, when given, is published with
// kFeatureVmLimits before the magic. Errors: kInvalidArgument when not even one channel fits.
Status FormatRegion(uint8_t* base, uint64_t region_bytes, uint64_t channel_bytes, const VmLimits* vm = nullptr);

// The channel size that gives a region `processes` channels (each at least kMinChannelBytes,
// 4096-aligned, as large as the region allows). kInvalidArgument when the region is too small.
Result<uint64_t> ChannelBytesFor(uint64_t region_bytes, uint32_t processes);

// Resets one channel (cursors, lease, generation + 1, state -> kChannelFree) and returns the new
// generation. Server side: `generation` is the server's own record of the channel's generation.
uint32_t ResetChannel(uint8_t* base, const RegionHeader& trusted, uint32_t index, uint32_t generation);

// Client side: validates a region's header (magic, version, sizes consistent with `region_bytes`).
Result<const RegionHeader*> ValidateHeader(const uint8_t* base, uint64_t region_bytes);

inline RegionHeader* Header(uint8_t* base) { return reinterpret_cast<RegionHeader*>(base); }
inline uint8_t* ChannelBase(uint8_t* base, uint64_t channel_bytes, uint32_t index) {
  return base + kHeaderBytes + uint64_t{index} * channel_bytes;
}

}  // namespace orion::ivshmem
