// guest/src/client.h — the guest runtime's connection to oriond: one channel per process.
//
// The channel is claimed on first use (cuInit, cuDriverGetVersion), sends Hello and receives the
// session's devices. All frames of the process go through one ordered channel; application threads
// enqueue under `mu_`, so oriond executes them in the order they were issued (ARCHITECTURE §3).
//
//   Client& c = Client::Get();
//   if (CUresult r = c.Connect(); r != CUDA_SUCCESS) return r;
//   MemAllocReq q{bytes}; HandleRep rep{};
//   CUresult r = c.Call(Op::kMemAlloc, &q, sizeof q, &rep, sizeof rep);
//
// Thread-safety: every public member is safe to call from any thread.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "orion/common/frame.h"
#include "orion/ivshmem/discover.h"
#include "orion/ivshmem/doorbell.h"
#include "orion/ivshmem/region.h"
#include "orion/ivshmem/ring.h"
#include "channel.h"
#include "log.h"

namespace orion::guest {

class Client {
 public:
  static Client& Get();

  // Claims a channel and handshakes, once. Returns the cached result on later calls.
  CUresult Connect() noexcept;
  bool connected() const noexcept { return connected_.load(std::memory_order_acquire); }

  // Synchronous call: sends `op` with `req` (+ optional `tail` bytes) and waits for its reply,
  // copying up to `rep_cap` payload bytes to `rep` (`*rep_len` gets the full length). Returns the
  // reply's status, or the deferred status of an earlier asynchronous op when there is one.
  CUresult Call(Op op, const void* req, uint32_t req_len, void* rep = nullptr, uint32_t rep_cap = 0,
                uint32_t* rep_len = nullptr, const void* tail = nullptr, uint32_t tail_len = 0) noexcept;
  // Fire-and-forget: enqueues `op`; an error surfaces at a later Call.
  CUresult Send(Op op, const void* req, uint32_t req_len, const void* tail = nullptr, uint32_t tail_len = 0) noexcept;

  // Launch fast path: writes a LaunchKernel frame (LaunchKernelEx when `ex` is given: a cluster
  // launch) in place. `fill` writes param_bytes bytes.
  template <typename Fill>
  CUresult SendLaunch(const LaunchReq& q, const LaunchExReq* ex, Fill&& fill) noexcept;

  // Bulk copies through the data window (chunked, pipelined).
  CUresult CopyHtoD(uint64_t dst, const void* src, uint64_t bytes, uint64_t stream, bool sync) noexcept;
  CUresult CopyDtoH(void* dst, uint64_t src, uint64_t bytes, uint64_t stream, bool async) noexcept;
  CUresult Copy2D(const CUDA_MEMCPY2D& c, uint64_t stream, bool async) noexcept;
  // A 2D box of `width` bytes x `height` rows where a side may be a CUDA array (oriond's handle,
  // origin x bytes, y, z). Host sides go through the data window in row chunks; a host destination
  // is filled before it returns.
  struct CopySide {
    uint32_t kind;       // kSideDevice, kSideArray, or kSideWindow for host memory
    uint64_t dptr;       // device: the box's first byte
    const uint8_t* src;  // host source: the box's first byte
    uint8_t* dst;        // host destination
    uint64_t array;      // oriond's array handle
    uint64_t pitch;      // device / host: bytes between rows
    uint64_t x, y, z;    // array: origin
  };
  CUresult CopyArray(const CopySide& dst, const CopySide& src, uint64_t width, uint64_t height,
                     uint64_t stream) noexcept;
  CUresult UploadBlob(uint64_t hash_lo, uint64_t hash_hi, const uint8_t* data, uint64_t bytes) noexcept;

  // Pinned allocations live in the window's heap. Returns nullptr when the heap is full.
  void* PinnedAlloc(uint64_t bytes) noexcept;
  bool PinnedFree(void* p) noexcept;
  // Window offset of [p, p+bytes) if it lies inside the window, else -1.
  int64_t WindowOffset(const void* p, uint64_t bytes) const noexcept;
  // The pinned allocation containing p: its base and size.
  bool PinnedRange(const void* p, void** base, uint64_t* bytes) noexcept;
  // cuMemHostRegister(CU_MEMHOSTREGISTER_DEVICEMAP) on a shared-memory transport: the pages of
  // [p, p+bytes) are moved into the pinned heap of the data window, in place: their bytes are
  // copied there and the window's pages are mapped (MAP_SHARED|MAP_FIXED, from the region file) at
  // the same virtual addresses, so the program's pointers now reach memory oriond sees too. Whole
  // pages move (bytes of other objects that share the first or last page go along, unchanged).
  // Errors: CUDA_ERROR_NOT_SUPPORTED (a network transport), CUDA_ERROR_OUT_OF_MEMORY (the pinned
  // heap is full), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (a page is already moved).
  CUresult MapIntoWindow(void* p, uint64_t bytes) noexcept;
  // Undoes MapIntoWindow for the registration starting at `p`: the bytes are copied back into
  // private pages at the same addresses. False if `p` starts no such registration.
  bool UnmapFromWindow(void* p) noexcept;
  // The window address of `p` inside a MapIntoWindow registration (nullptr if none), and the
  // registration's window range.
  void* WindowAlias(const void* p, void** base, uint64_t* bytes) noexcept;

  const WelcomeRep& welcome() const noexcept { return welcome_; }
  const std::vector<DeviceInfo>& devices() const noexcept { return devices_; }
  const std::string& allocation_text() const noexcept { return allocation_text_; }
  // Whether the session runs over a network transport (no memory shared with oriond).
  bool network() const noexcept { return network_; }

  void Shutdown() noexcept;  // at exit: Goodbye, stop the lease thread

 private:
  Client() = default;
  CUresult ConnectLocked();  // may throw (std::bad_alloc...): Connect catches
  Status ConnectNetworkLocked(std::string addr, bool offer_rdma, bool tls_all);
  CUresult HandshakeNetworkLocked(const std::string& addr, bool tls_all, uint64_t vgpus, uint64_t gmem);
  CUresult ConnectRegionLocked(const ivshmem::RegionLocation& where, bool vgpus_set, uint64_t vgpus, uint64_t gmem);
  void DrainOutputLocked() noexcept;
  CUresult HandshakeLocked(uint64_t vgpus, uint64_t gmem, const std::string& where) noexcept;
  CUresult PushLocked(const FrameHeader& h, const void* req, uint32_t req_len, const void* tail,
                      uint32_t tail_len) noexcept;
  // Waits for the reply to request `seq` (op `op`) and checks it (docs: README "Security model"): it
  // must answer that request (seq, op, version), carry a known CUresult (kStatusNeedBytes only for
  // ModuleLoad), known flags, and, when it succeeds and the caller takes a fixed-size reply
  // (rep_len == nullptr), at least rep_cap bytes. Anything else, or no reply within the op's
  // deadline (ReplyDeadlineMs), breaks the session with CUDA_ERROR_DEVICE_UNAVAILABLE.
  CUresult WaitReplyLocked(uint32_t seq, Op op, void* rep, uint32_t rep_cap, uint32_t* rep_len) noexcept;
  // A kStatusMoved reply `f` (plain TCP, or a region file on this host; issue #24): connects to the
  // oriond it names, resumes the session there with its token (the window and its bytes carried
  // over; a region's window first becomes private memory at the same address), and sends the
  // request the source did not execute (last_call_) again. When the target cannot be reached,
  // refuses, or does not answer within kResumeAnswerMs, it resumes at the source with the back
  // token instead (over TCP, or on its own channel of the region); only when both fail is the
  // session broken.
  CUresult ResumeLocked(const ivshmem::FrameView& f) noexcept;
  // One attempt of a resume: connects to `address` (the window moves along), says kHelloResume with
  // `token`, checks the Welcome. A failure is recorded in resume_failure_, not fatal: ResumeLocked
  // then tries the way back, or breaks the session.
  CUresult ResumeAt(const std::string& address, const char* token) noexcept;
  // Says kHelloResume with `token` on the channel now in chan_ and checks the Welcome against the
  // session (`transport`, `channel_bytes` as that oriond announces them); failures as ResumeAt.
  CUresult ResumeHelloLocked(const char* token, uint16_t transport, uint64_t channel_bytes,
                             const std::string& address) noexcept;
  // A region session moving to TCP: the window's pages become private memory at the same address,
  // holding the same bytes (mremap over it), so the region's channel can be reused by others while
  // the program's pinned buffers keep their place. SharedWindowLocked undoes it (the way back):
  // the region's pages again, holding what the private ones held. False when that fails.
  bool PrivateWindowLocked() noexcept;
  bool SharedWindowLocked() noexcept;
  // How long the reply to `op` may take (ms, 0: no limit): the handshake deadline for Hello and
  // RdmaConnect; none (ORION_SYNC_TIMEOUT_MS) for ops that wait for device work, and for any op sent
  // after asynchronous frames that oriond may still be executing; the reply deadline otherwise.
  uint64_t ReplyDeadlineMs(Op op) const noexcept;
  // Whether the reply frame `h` answers request `seq` / `op`; else breaks the session (why logged).
  bool ReplyValidLocked(const FrameHeader& h, uint32_t seq, Op op) noexcept;
  // Breaks the session when `start_ns` is more than `ms` ago (ms != 0), naming `op` and `seq`.
  bool TimedOutLocked(uint64_t start_ns, uint64_t ms, Op op, uint32_t seq) noexcept;
  // TCP: breaks the session when oriond has sent nothing (reply, WindowData, Keepalive) for
  // ORION_ALIVE_TIMEOUT_MS since `start_ns`: a hung oriond process whose connection lives.
  bool SilentLocked(uint64_t start_ns, Op op, uint32_t seq) noexcept;
  CUresult Broken(CUresult why, const char* what) noexcept;
  void GiveBackLocked() noexcept;
  // After publishing a frame: wakes oriond's worker if it sleeps (futex, or the VM's
  // ivshmem-doorbell register). B1: after an asynchronous frame a plain load, no fence (a fence
  // there costs ~15% of the launch rate): the worker announces sleep with a full barrier and then
  // looks at the ring once more (B0), so the only miss is a store-load reordering inside that
  // nanosecond window. `sure` (a frame we will wait for, or a wait that has lasted) adds the fence,
  // so every wait ends with a wake-up that cannot be missed; a missed one after an asynchronous
  // frame only delays it until then, or the worker's timeout.
  void RingDoorbell(bool sure = false) noexcept {
    if (sure) std::atomic_thread_fence(std::memory_order_seq_cst);  // B1s: pairs with B0
    if (desc_->server_sleeping.load(std::memory_order_relaxed) != 0) {
      woke_ = true;
      desc_->doorbell.fetch_add(1, std::memory_order_release);
      if (bar0_ != nullptr) {
        bar0_->Ring(bell_peer_, bell_vector_);
      } else {
        ivshmem::FutexWake(&desc_->doorbell);
      }
    }
  }
  CUresult SyncContextLocked() noexcept;
  // In every wait: true (and the client broken) when oriond ended the session or stopped beating.
  bool ServerGoneLocked(uint64_t* last_beat, uint64_t* last_change) noexcept;
  FrameHeader MakeHeader(Op op, uint32_t payload_len, bool wants_reply) noexcept;
  // Staging (window[0, staging_bytes)) FIFO: released when the server has executed the frame
  // (host-released) or when we copied the bytes out (guest-released).
  int64_t StageAllocLocked(uint64_t bytes) noexcept;  // window offset, or -1 on a broken channel
  // The host side of a 2D copy through staging, in row chunks (mu_ held): a host source's rows are
  // copied into the window before each chunk's frame; a host destination's after its reply.
  // `build(row, rows, window_offset, req)` writes the `op` request for rows [row, row + rows) into
  // `req` (kMaxStagedRequest bytes) and returns its length. Exactly one of src_h, dst_h is set.
  static constexpr uint32_t kMaxStagedRequest = 128;
  template <class Build>
  CUresult StagedRowsLocked(Op op, uint64_t w, uint64_t hgt, const uint8_t* src_h, uint64_t src_pitch, uint8_t* dst_h,
                            uint64_t dst_pitch, Build build) noexcept;
  void StageTagLocked(uint32_t seq, bool guest_owned) noexcept;
  void StageReleaseGuestLocked() noexcept;
  void ReclaimLocked() noexcept;

  std::mutex mu_;
  std::atomic<bool> connected_{false};
  bool tried_ = false;
  CUresult connect_result_ = CUDA_ERROR_NOT_INITIALIZED;
  CUresult broken_ = CUDA_SUCCESS;

  std::unique_ptr<ivshmem::MappedRegion> region_;
  ivshmem::ChannelDesc* desc_ = nullptr;
  // In a VM whose oriond serves the ivshmem-doorbell: BAR0, and what to write there.
  std::unique_ptr<ivshmem::GuestDoorbell> bar0_;
  uint32_t bell_peer_ = 0;
  uint32_t bell_vector_ = 0;
  // The last frame woke a sleeping worker: the reply's wait yields early, since the worker may
  // have been woken on this very CPU (the kernel's wake-affine choice) and needs it.
  bool woke_ = false;
  uint64_t last_reply_ns_ = 0;  // network channels: when the last reply came
  ivshmem::RegionHeader* header_ = nullptr;
  uint32_t channel_index_ = 0;
  ivshmem::ChannelLayout layout_{};
  uint8_t* window_ = nullptr;
  std::unique_ptr<FrameChannel> chan_;     // the rings of a region channel, or a TCP connection
  TcpFrameChannel* tcp_ = nullptr;         // chan_, while it is TCP
  bool network_ = false;                   // ORION_SERVER: TCP, or RDMA after the Welcome
  bool host_region_ = false;               // a region file on this host (not a VM's ivshmem): it may move
  uint64_t channel_bytes_ = 0;             // the size the window's layout comes from
  std::unique_ptr<rdma::Port> rdma_port_;  // the RDMA port this client offers (null: TCP only)
  std::string rdma_why_;                   // why it offers no RDMA
  std::vector<uint8_t> scratch_;
  uint32_t next_seq_ = 1;
  // Bounded waits (ms, 0: none): ORION_HANDSHAKE_TIMEOUT_MS, ORION_REPLY_TIMEOUT_MS,
  // ORION_SYNC_TIMEOUT_MS, ORION_STALL_TIMEOUT_MS (TCP: a message stalled half-way).
  uint64_t handshake_ms_ = 30000;
  uint64_t reply_ms_ = 120000;
  uint64_t sync_ms_ = 0;
  uint64_t alive_ms_ = 10000;  // TCP: a wait for a reply ends when oriond sends nothing this long
  uint64_t stall_ms_ = 30000;
  bool async_unanswered_ = false;  // asynchronous frames were sent since the last reply
  std::string peer_;               // oriond's address or region, for log lines
  bool resuming_ = false;          // a resume attempt runs: Broken records, ResumeLocked decides
  // The longest a moved session's target may take to answer its kHelloResume when there is a way
  // back (ms): with the connect's 5 s, well inside the source's 30 s wait for the program.
  static constexpr uint64_t kResumeAnswerMs = 10000;
  std::string resume_failure_;             // what broke the last resume attempt
  std::vector<uint8_t> last_call_;         // TCP: the last request that awaits a reply, header included
  const uint8_t* last_call_at_ = nullptr;  // a region's: where that request lies in the request ring
  uint32_t last_call_len_ = 0;
  uint64_t current_ctx_sent_ = 0;

  struct StageEntry {
    uint64_t end;      // staging cursor after this entry
    uint32_t seq;      // frame that consumes it (host-released)
    bool guest_owned;  // released by us after copy-out
    bool released;
  };
  std::deque<StageEntry> stage_fifo_;
  uint64_t stage_head_ = 0;  // bytes allocated (free-running)
  uint64_t stage_tail_ = 0;  // bytes released (free-running)

  std::map<uint64_t, uint64_t> pinned_free_;     // offset -> size (heap free list)
  std::map<uint64_t, uint64_t> pinned_used_;     // offset -> size
  bool PinnedFreeLocked(uint64_t off) noexcept;  // mu_ held; `off` from the pinned heap
  // `need` bytes of the pinned heap at a multiple of `align` (a power of two), first fit (mu_ held);
  // the window offset, or -1 when none fits.
  int64_t PinnedAllocLocked(uint64_t need, uint64_t align) noexcept;
  struct WindowMapping {
    uint64_t page_start, len, off;
  };
  std::map<uintptr_t, WindowMapping> window_mappings_;  // by the registered pointer

  WelcomeRep welcome_{};
  std::vector<DeviceInfo> devices_;
  std::string allocation_text_;
  // Controller mode (no region; ORION_CONTROLLER / client.conf controller_addr): the allocation this
  // process asked for, released at exit (oriond also releases it when the session ends).
  std::string controller_addr_;
  std::string controller_alloc_;
  bool hello_job_ = false;  // the Hello named the job's allocation (ORION_ALLOCATION)
  CUresult AllocateFromControllerLocked(uint64_t vgpus, uint64_t gmem, std::string* server) noexcept;
  void ReleaseControllerAllocation(const char* why) noexcept;
  std::thread lease_thread_;
  std::atomic<bool> stop_lease_{false};
};

template <typename Fill>
CUresult Client::SendLaunch(const LaunchReq& q, const LaunchExReq* ex, Fill&& fill) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (CUresult r = SyncContextLocked(); r != CUDA_SUCCESS) return r;
  const uint32_t head = ex != nullptr ? sizeof(LaunchExReq) : sizeof(LaunchReq);
  const uint32_t len = head + q.param_bytes;
  FrameHeader h = MakeHeader(ex != nullptr ? Op::kLaunchKernelEx : Op::kLaunchKernel, len, false);
  ivshmem::Backoff backoff;
  uint8_t* p;
  uint64_t beat = 0, changed = 0;
  while ((p = chan_->Reserve(len)) == nullptr) {
    if (header_ == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (backoff.sleeping() && ServerGoneLocked(&beat, &changed)) return broken_;
    if (backoff.sleeping()) RingDoorbell(true);  // the ring is full: the worker must be awake
    backoff.Pause();
  }
  std::memcpy(p, &h, sizeof h);
  if (ex != nullptr)
    std::memcpy(p + sizeof h, ex, sizeof *ex);
  else
    std::memcpy(p + sizeof h, &q, sizeof q);
  fill(p + sizeof h + head);
  async_unanswered_ = true;
  if (!chan_->Commit()) return Broken(CUDA_ERROR_DEVICE_UNAVAILABLE, "the connection to oriond broke");
  RingDoorbell();
  return CUDA_SUCCESS;
}

// The number of vGPUs this process asks for (ORION_VGPU, 1..kMaxDevices, default 1), parsed as the
// Hello does; CUDA_ERROR_INVALID_VALUE when the variable is malformed. Opens nothing.
CUresult RequestedVgpuCount(uint32_t* n) noexcept;

}  // namespace orion::guest
