// host/src/session_impl.h — one client session inside an oriond worker: its tables (handles,
// allocations, VMM ranges, arrays, IPC), its quota, and the handler of each wire op. Private to
// host/ (orion/host/session.h is the interface: RunSession). Not thread-safe: a session is served
// by one thread, its worker's.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "module_images.h"
#include "session_state.h"
#include "snapshot_stream.h"
#include "orion/common/clock.h"
#include "orion/common/text.h"
#include "orion/fatbin/fatbin.h"
#include "orion/host/session.h"
#include "orion/ivshmem/doorbell.h"
#include "orion/ivshmem/ring.h"

namespace orion::host::detail {

using ivshmem::ChannelLayout;

// One request being served: its frame header, its payload (its length already checked against
// ops.def by CheckRequestShape), the reply payload a handler appends to, and, when the request
// breaks the protocol, why (the session then ends; the status a handler returned is not sent).
struct Call {
  const FrameHeader& h;
  const uint8_t* payload;
  uint32_t len;
  std::vector<uint8_t>* reply;
  std::string* why;
  bool violation = false;

  template <typename T>
  void Put(const T& v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    reply->insert(reply->end(), b, b + sizeof v);
  }
  CUresult Violation(std::string msg) {
    *why = std::move(msg);
    violation = true;
    return CUDA_ERROR_INVALID_VALUE;
  }
};

// In a handler: the request breaks the protocol unless `cond` holds.
#define ORION_WANT(cond, msg)             \
  do {                                    \
    if (!(cond)) return c.Violation(msg); \
  } while (0)

// A device's launch limits, from the attribute table its Welcome gave the client (DescribeDevice:
// the GPU's own on the cuda backend, the modelled H100's on the sim), checked once per launch for
// both backends. Limits a function adds (its cluster size, its static shared memory) are the
// backend's to check.
struct LaunchLimits {
  uint32_t grid[3] = {};
  uint32_t block[3] = {};
  uint32_t threads = 0;       // per block
  uint32_t shared_optin = 0;  // dynamic shared memory per block, bytes
  static LaunchLimits Of(const DeviceInfo& info) {
    auto at = [&](int a) { return static_cast<uint32_t>(std::max(info.attributes[a], 0)); };
    return {{at(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X), at(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y),
             at(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)},
            {at(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X), at(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
             at(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)},
            at(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            at(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)};
  }
  // CUDA_SUCCESS, or what NVIDIA's driver answers (as the client checks it, api_exec.cpp):
  // CUDA_ERROR_INVALID_VALUE for an empty grid or block, kCudaErrorInvalidConfiguration for one
  // past the limits, CUDA_ERROR_INVALID_VALUE for more dynamic shared memory than a block may opt
  // in to.
  CUresult Check(const LaunchSpec& l) const {
    for (int d = 0; d < 3; ++d) {
      if (l.grid[d] == 0 || l.block[d] == 0) return CUDA_ERROR_INVALID_VALUE;
    }
    for (int d = 0; d < 3; ++d) {
      if (l.grid[d] > grid[d] || l.block[d] > block[d]) return static_cast<CUresult>(kCudaErrorInvalidConfiguration);
    }
    if (l.threads() > threads) return static_cast<CUresult>(kCudaErrorInvalidConfiguration);
    return l.shared_mem > shared_optin ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  }
};

// Live migration (session_move.cpp): SIGUSR2 from oriond says a move is asked for on the worker's
// control socket (`control_fd`; -1: none, nothing is installed). MoveAsked is a relaxed load.
void WatchMoveRequests(int control_fd);
extern std::atomic<bool> g_move_asked;
inline bool MoveAsked() { return g_move_asked.load(std::memory_order_relaxed); }

// A session: its state (SessionState: what a migration carries), the backend that executes its
// requests, the channel they come over, and one handler per wire op.
class Session : private SessionState {
 public:
  Session(const SessionParams& p, std::unique_ptr<Backend> b, std::unique_ptr<SessionChannel> ch)
      : p_(p), b_(std::move(b)), ch_(std::move(ch)), layout_(ch_->layout()), window_(ch_->window()) {
    used_.assign(p_.placements.size(), 0);
  }

  // Start, then Serve: returns a SessionExit code.
  int Run(const FrameHeader& hello_header, const HelloReq& hello);
  // Starts the backend and the compute gates and answers the Hello with the Welcome (the devices
  // as this session sees them). False, with the worker's exit code, when the session cannot go on.
  bool Start(const FrameHeader& hello_header, int* exit_code);
  // Start's two halves: the backend, the compute gates and the devices as this session sees them
  // (false, with why, when the backend cannot start); then the Welcome that answers the Hello.
  bool StartBackend(std::string* why);
  bool Welcome(const FrameHeader& hello_header, int* exit_code);
  // Live migration between two oriond (issue #24, session_move.cpp). The source: a move asked for
  // on params' control_fd is taken between frames (TakeMoveRequest) and made at the next frame that
  // wants a reply, before it executes (MoveOut): kExitMoved once the target serves the session;
  // kMoveRefused with the session unchanged here (the frame then executes) and the asker told why;
  // kMoveCameBack when the program was told to go but could not resume at the target and came back
  // on its back token (its connection adopted, welcomed: it sends the frame again). The target: MigrateIn starts
  // the backend, restores what the source sends on migrate_fd, waits for the client's connection
  // on route_fd, welcomes it and serves; its exit code.
  void TakeMoveRequest();
  // `busy`: the watchdog's frame counter (odd while a frame executes: it sends keepalives then);
  // made even once the client is told to go, whose connection then closes.
  static constexpr int kMoveRefused = -1, kMoveCameBack = -2;
  int MoveOut(const FrameHeader& frame, std::atomic<uint64_t>* busy);
  // At the request (TakeMoveRequest): the checks, the connection and the target's admission, then
  // the manifest; false (the asker told why, nothing changed) when the move cannot happen.
  bool PrepareMove();
  // Whether a move asked for may happen now: the target said "prepared", or kPrepareMs passed.
  // False also when the target refused the manifest or went away (the move is then called off).
  bool MoveReady();
  int MigrateIn(const FrameHeader& hello_header);
  // Serves frames until the session ends (Goodbye, the client gone, a violation); its exit code.
  int Serve();
  // Executes one frame. Returns false on a protocol violation (message in *why); else *status is
  // the reply's status and *reply its payload.
  bool Dispatch(const FrameHeader& h, const uint8_t* payload, std::vector<uint8_t>* reply, int32_t* status,
                std::string* why);
  // Live migration (issue #24; docs/design/migration.md; session_snapshot.cpp), between frames.
  // Snapshot: drains the session (every context synchronized) and writes its state to `out`: its
  // contexts with their limits, device allocations with their bytes, VMM reservations, physical
  // allocations and mappings, modules with their images and device variables, functions with the
  // attributes set on them, streams, events, and its launch scratch charge. False, with why, when
  // it holds what cannot move (IPC memory or events, mapped host memory, CUDA arrays and texture
  // objects, an unmapped physical allocation's bytes, a context with a pending error, a module
  // image the cache no longer has) or `out` breaks; the session is unchanged and serves on.
  bool Snapshot(SnapshotWriter& out, std::string* why);
  // Restore: makes this session, started and still empty, the one `in` describes: every object
  // at the same device address and with the same handle, charged to this session's quota. `in` is
  // hostile input, checked as frames are. False, with why, at the first thing wrong; the session
  // is then partly restored and must end (its worker exits, and everything goes with it).
  bool Restore(SnapshotReader& in, std::string* why);
  // The manifest (sent when a move is asked for, before the program pauses): the allocations the
  // target allocates and commits while the program still runs here, a record Restore takes before
  // the snapshot's header. False, with why, when the session cannot move (CanMove) or `out` broke.
  bool SnapshotManifest(SnapshotWriter& out, std::string* why);

  // The session's last log line on how it waited while idle.
  void LogWaits() const {
    const std::string w = ch_->WaitStats();
    p_.log->info("sess={} idle waits: {}{}naps={}", p_.session_id, w, w.empty() ? "" : ", ", naps_);
    if (const std::string slot = ch_->SlotStats(); !slot.empty()) p_.log->info("sess={} {}", p_.session_id, slot);
    for (size_t d = 0; d < gates_.size(); ++d) {
      if (gates_[d] == nullptr) continue;
      p_.log->info("sess={} compute: vGPU {}: its tenant used {:.3f} s of device time and waited {:.3f} s for it",
                   p_.session_id, d, static_cast<double>(gates_[d]->busy_ns()) / 1e9,
                   static_cast<double>(gates_[d]->throttled_ns()) / 1e9);
    }
  }

 private:
  // One handler per op of ops.def (On<Name>), generated from its rows: an op with a fixed-size or
  // headed request (kFixed, kHead) gets it decoded once (DecodeReq), the others only the Call.
  // Each lives in the file of its family: session_context.cpp, session_memory.cpp,
  // session_vmm.cpp, session_ipc.cpp, session_module.cpp, session_array.cpp, session_stream.cpp;
  // session.cpp serves the session's own ops (Nop, Sync, TakeOutput, Batch, ...).
#define ORION_HANDLER_ARGS_kEmpty(Req) Call& c
#define ORION_HANDLER_ARGS_kOwn(Req) Call& c
#define ORION_HANDLER_ARGS_kFixed(Req) const Req &q, Call &c
#define ORION_HANDLER_ARGS_kHead(Req) const Req &q, Call &c
#define ORION_OP(Name, number, reply_kind, Req, shape) CUresult On##Name(ORION_HANDLER_ARGS_##shape(Req));
#include "orion/common/ops.def"
#undef ORION_HANDLER_ARGS_kEmpty
#undef ORION_HANDLER_ARGS_kOwn
#undef ORION_HANDLER_ARGS_kFixed
#undef ORION_HANDLER_ARGS_kHead
  // LaunchKernel and LaunchKernelEx: the wire's launch (LaunchExReq; a plain launch is a 1x1x1
  // cluster) and the offset of the kernel parameters in the payload, made into the one LaunchSpec
  // the backend gets.
  CUresult Launch(const LaunchExReq& x, uint32_t head, Call& c);
  // MemcpyDtoH and MemcpyDtoHAsync (`async`: the backend may return before the copy completes).
  CUresult CopyDtoH(const MemcpyReq& q, bool async);
  // ModuleGetFunction and ModuleGetGlobal: the symbol's name (a protocol violation, named after
  // `op`, when the payload does not carry one) and its module (CUDA_ERROR_INVALID_HANDLE if none).
  CUresult ModuleSymbol(const ModuleSymbolReq& q, Call& c, const char* op, Obj** module, std::string* name);
  bool Reply(const FrameHeader& req, int32_t status, const void* payload, uint32_t len);
  // Charges `bytes` of device `dev` to its quota (rounded up to `granule`); false, with the Orion
  // log line, when it would exceed it.
  bool Charge(uint32_t dev, uint64_t bytes, uint64_t granule, const char* op, const char* call, uint64_t* charged);
  void Uncharge(uint32_t dev, uint64_t charged) {
    used_[dev] -= charged;
    PublishUsed(dev);
  }
  // Frees a physical allocation that is released and no longer mapped.
  void MaybeFreePhysical(uint64_t id) {
    Physical* ph = physicals_.Find(id);
    if (ph == nullptr || !ph->released || ph->mappings != 0) return;
    Uncharge(ph->dev, ph->bytes);
    physicals_.Erase(id);
  }
  bool WindowRange(uint64_t off, uint64_t bytes) const {
    return off <= layout_.window_bytes && bytes <= layout_.window_bytes - off;
  }
  // Destroys mipmapped array `id` (and its levels) once destroyed and unused.
  void MaybeFreeMipmap(uint64_t id) {
    MipmapRec* m = mipmaps_.Find(id);
    if (m == nullptr || !m->destroyed || m->objects != 0) return;
    for (uint64_t level : m->level_ids) arrays_.Erase(level);
    (void)b_->MipmappedArrayDestroy(m->backend);
    Uncharge(m->dev, m->charged);
    mipmaps_.Erase(id);
  }
  // Destroys array `id` in the backend and gives its quota back once nothing refers to it.
  void MaybeFreeArray(uint64_t id) {
    ArrayRec* a = arrays_.Find(id);
    if (a == nullptr || !a->destroyed || a->objects != 0 || a->mipmap != 0) return;
    (void)b_->ArrayDestroy(a->backend);
    Uncharge(a->dev, a->charged);
    arrays_.Erase(id);
  }
  // A CUDA array descriptor Orion serves: CUDA_ERROR_NOT_SUPPORTED (logged) for a format or flags it
  // does not, CUDA_ERROR_INVALID_VALUE for extents or channels no GPU takes.
  CUresult CheckArrayDesc(const ArrayCreateReq& q, const char* op);
  // The creations behind ArrayCreate, MipmappedArrayCreate, MipmappedArrayGetLevel and
  // TexObjectCreate, on the current device, with every check the client's request gets; a restore
  // makes the moved objects again through them. `want`: the handle to give (the restore's, checked
  // free by it), 0 for a new one; *object in: the object value to give (0: the backend's choice).
  CUresult CreateArray(const ArrayCreateReq& q, uint64_t want, uint64_t* id);
  CUresult CreateMipmap(const MipmapCreateReq& q, uint64_t want, uint64_t* id);
  CUresult MipmapLevel(uint64_t mipmap, uint32_t level, uint64_t want, uint64_t* id);
  CUresult CreateTexObject(const TexObjectReq& q, uint64_t* object);
  // A tensor map whose parameters were checked (`ok`; else `bad` says why) and whose global address
  // must be the session's device memory, encoded into `*rep` by `encode` (op: the entry point's name).
  template <typename Encode>
  CUresult EncodeTensorMap(const char* op, bool ok, const char* bad, uint64_t address, Encode encode,
                           TensorMapRep* rep) {
    if (!ok || !DeviceRange(address, 1)) {
      p_.log->warn("sess={} {} refused: {}", p_.session_id, op,
                   *bad != '\0' ? bad : "the global address is not this session's device memory");
      return CUDA_ERROR_INVALID_VALUE;
    }
    return encode(rep->opaque);
  }
  // cuEventElapsedTime when either event was recorded before this session moved here.
  CUresult MovedElapsedTime(uint64_t start, uint64_t end, float* ms);
  // Snapshot and Restore, record by record (session_snapshot.cpp).
  bool CanMove(std::string* why);
  bool SnapshotBody(SnapshotWriter& out, const std::map<uint64_t, void*>& marks, std::string* why);
  bool SnapshotMemory(SnapshotWriter& out, std::string* why);
  bool SnapshotModules(SnapshotWriter& out, std::string* why);
  bool RestoreRecord(uint32_t kind, std::span<const uint8_t> body, uint64_t contents, SnapshotReader& in,
                     std::string* why);
  bool RestoreAlloc(std::span<const uint8_t> body, uint64_t contents, SnapshotReader& in, std::string* why);
  bool RestoreVmm(uint32_t kind, std::span<const uint8_t> body, uint64_t contents, SnapshotReader& in,
                  std::string* why);
  bool RestoreModule(uint32_t kind, std::span<const uint8_t> body, uint64_t contents, SnapshotReader& in,
                     std::string* why);
  bool RestoreQueue(uint32_t kind, std::span<const uint8_t> body, std::string* why);
  bool SnapshotArrays(SnapshotWriter& out, std::string* why);
  // At the target: allocates and commits what a manifest lists (hostile input: within the quota of
  // each device, no overlaps); the restore then takes each allocation that is still there.
  bool PrepareManifest(std::span<const uint8_t> body, std::string* why);
  // Frees prepared memory overlapping [addr, addr+bytes) (all of it: 0, UINT64_MAX).
  void ReleasePrepared(uint64_t addr, uint64_t bytes);
  bool RestoreArrays(uint32_t kind, std::span<const uint8_t> body, uint64_t contents, SnapshotReader& in,
                     std::string* why);
  bool UseContextOf(uint64_t ctx, std::string* why);
  // Makes a context of device `dev` current (its primary one where it has one) for what a record
  // restores there.
  bool UseDevice(uint32_t dev, std::string* why);
  // Restore's bookkeeping: the snapshot's header was read, and the module variables placed (their
  // ranges: the only ones an uncounted allocation record may name).
  bool restore_header_ = false;
  uint64_t restore_next_handle_ = 0;
  uint64_t restore_cur_ctx_ = 0;
  uint32_t restore_cur_dev_ = 0;
  std::map<uint64_t, uint64_t> restore_globals_;
  std::vector<std::pair<uint64_t, bool>> restore_destroyed_;    // arrays (mipmapped: true) the program destroyed
  bool restore_prepared_ = false;                               // a manifest was read
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> prepared_;  // manifest memory: addr -> (bytes, device)

  // Checks one side of a MemcpyArray and fills the backend's view of it.
  bool CopySideOk(uint32_t side, uint64_t at, uint64_t pitch, uint64_t x, uint64_t y, uint64_t z, uint64_t width,
                  uint64_t height, Backend::CopySide* out);

  SessionParams p_;
  HelloReq hello_{};              // the client's Hello (informational fields travel with a move)
  std::vector<uint8_t> welcome_;  // the Welcome's payload (StartBackend)
  std::string move_to_;           // a move asked for: host:port of the target ("" none)
  std::string move_back_;         // its way back: the token the program resumes here with ("" none)
  bool move_share_ = false;       // its vGPU share's controller allocation goes with it (oriond said so)
  int move_asker_ = -1;           // the asker's connection (orion-smi via oriond), answered once
  int move_fd_ = -1;              // the connection to the target, from the request (PrepareMove) to the move
  bool move_prepared_ = false;    // the target said "prepared"
  uint64_t move_asked_ms_ = 0;
  std::unique_ptr<Backend> b_;
  std::unique_ptr<SessionChannel> ch_;
  uint64_t naps_ = 0;  // idle naps (a client that cannot ring)
  ChannelLayout layout_{};
  uint8_t* window_ = nullptr;
  bool same_address_warned_ = false;  // HostGetDevicePointer could not honour the client's address
  std::chrono::steady_clock::time_point ipc_swept_{};
  void SweepIpc(bool now = false);
  uint64_t ChargeOver(uint32_t dev, uint64_t bytes) {  // a charge that may exceed the quota
    const uint64_t c = (bytes + kAllocGranularity - 1) & ~(kAllocGranularity - 1);
    used_[dev] += c;
    PublishUsed(dev);
    return c;
  }
  std::vector<LaunchLimits> limits_;                 // per device (Start)
  std::vector<std::unique_ptr<ComputeGate>> gates_;  // per device: its compute share (null: none)
  std::vector<uint64_t> metered_;                    // what this session has on its hold's meter per device
  // Tells oriond (and through it the controller) what this session holds on device `d`, and moves
  // the hold's meter by what changed (a charge already put its bytes there: see Charge).
  void PublishUsed(uint32_t d) {
    if (d >= kMaxDevices || d >= used_.size() || d >= overhead_.size()) return;
    const uint64_t now = used_[d] + overhead_[d];
    if (p_.hold_used != nullptr && d < metered_.size()) {
      p_.hold_used[d].fetch_add(now - metered_[d], std::memory_order_relaxed);  // modulo 2^64: a decrease too
      metered_[d] = now;
    }
    if (p_.used_out != nullptr) p_.used_out[d].store(now, std::memory_order_relaxed);
  }
  // What is left of device `d`'s quota for this session: its own, and its hold's for all sessions.
  uint64_t QuotaLeft(uint32_t d) const {
    const uint64_t quota = p_.placements[d].quota_bytes, taken = used_[d] + overhead_[d];
    uint64_t left = quota > taken ? quota - taken : 0;
    if (p_.hold_used != nullptr && d < p_.hold_quota.size()) {
      const uint64_t all = p_.hold_used[d].load(std::memory_order_relaxed);
      left = std::min(left, p_.hold_quota[d] > all ? p_.hold_quota[d] - all : 0);
    }
    return left;
  }
  int32_t deferred_ = 0;
  bool violation_ = false;
  // Module images by content hash: complete ones (memory and the host's disk cache), and the one
  // being uploaded.
  ModuleImages images_{p_.cache_dir, p_.cache_max_bytes};
  std::string upload_hex_;
  std::vector<uint8_t> upload_;
  std::string output_;   // device printf text not yet taken by the client (at most kMaxPendingOutput)
  std::string notices_;  // backend notices for the client's log, one per line (at most kMaxPendingNotices)
  uint64_t upload_received_ = 0;
};

// Attributes the guest sees, whatever the GPU behind it has (session.cpp).
void ClampServedFeatures(DeviceInfo* info, bool network, bool same_address);

}  // namespace orion::host::detail
