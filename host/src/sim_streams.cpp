// host/src/sim_streams.cpp — the sim backend's launches (run on the PTX executor, or queued per stream), the
// launch log, streams, events, occupancy and tensor maps. SimBackend member functions
// (sim_backend.h).
#include "sim_backend.h"

namespace orion::host::sim {

// The executor runs up to `workers` blocks at once, each with its threads' local memory and its
// shared memory: what a launch holds on oriond's host while it runs.
uint64_t SimBackend::LaunchScratchBytes(void* function, const LaunchSpec& l) {
  auto* f = static_cast<SimFunction*>(function);
  if (!opt_.execute || f == nullptr || !Runnable(f)) return 0;
  const uint64_t workers = opt_.workers != 0 ? opt_.workers : std::max(1u, std::thread::hardware_concurrency());
  return workers * (f->resources.local_per_thread * l.threads() + f->resources.shared_static + l.shared_mem);
}

// The session checked the grid, block and dynamic shared memory against the attribute table
// (LaunchSpec); what depends on the function is checked here.
CUresult SimBackend::LaunchKernel(void* function, const LaunchSpec& l) {
  auto* f = static_cast<SimFunction*>(function);
  if (l.cluster_size() == 0 || l.cluster_size() > MaxCluster(f)) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  for (int d = 0; d < 3; ++d) {
    if (l.grid[d] % l.cluster[d] != 0) return CUDA_ERROR_INVALID_CLUSTER_SIZE;  // the grid is whole clusters
  }
  if (l.params.size() != f->kernel->param_bytes) return CUDA_ERROR_INVALID_VALUE;
  if (sticky_ != CUDA_SUCCESS) return sticky_;
  if (!opt_.execute && !told_not_executing_) {
    told_not_executing_ = true;
    notices_.push_back(
        "this oriond runs with --sim-execute none: kernels are validated and logged, NEVER executed; "
        "no result a kernel should write is computed");
  }
  if (l.cooperative()) {
    // Every block must be resident at once: the occupancy model's blocks per SM times the SMs.
    int per_sm = 0;
    (void)OccupancyMaxBlocks(function, static_cast<uint32_t>(l.threads()), l.shared_mem, 0, &per_sm);
    if (l.blocks() > static_cast<uint64_t>(per_sm) * kSimSms) return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
  }
  // Launches on a stream other than the legacy default stream are deferred until something
  // orders them (see Flush): stream order is all CUDA promises, so a program that forgot a
  // cuStreamWaitEvent reads stale data here too, every time, instead of by luck on a GPU.
  Pending p;
  p.seq = ++seq_;
  p.f = f;
  p.launch = l;
  p.stream = l.stream;
  p.gate = gate_;
  // A kernel the executor cannot run fails here, synchronously, and nothing is queued for it
  // (unless --sim-unexecutable skip: then it is queued and skipped, and the client is told).
  if (opt_.execute && !opt_.skip_unexecutable && !Runnable(f)) {
    if (warned_.insert(f->kernel->name).second)
      notices_.push_back("kernel " + f->kernel->name + " cannot run on the sim backend: " + f->why +
                         "; its launches fail with " +
                         (LaunchErrorName(f->refusal) != nullptr ? LaunchErrorName(f->refusal)
                                                                 : std::to_string(static_cast<int>(f->refusal))));
    LogLaunch(p, "refused:" + std::to_string(static_cast<int>(f->refusal)));
    last_error_ = "kernel " + f->kernel->name + ": " + f->why;
    return f->refusal;
  }
  if (opt_.execute && f->runnable == 1 && f->resources.shared_static + l.shared_mem > kSimMaxSharedPerBlock) {
    last_error_ = "kernel " + f->kernel->name + ": " + std::to_string(f->resources.shared_static) +
                  " bytes of static and " + std::to_string(l.shared_mem) +
                  " of dynamic shared memory exceed a block's " + std::to_string(kSimMaxSharedPerBlock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (l.stream != nullptr && opt_.execute) {
    p.owned.assign(l.params.begin(), l.params.end());  // the frame's bytes are gone after this call
    p.launch.params = p.owned;                         // (a moved vector keeps its buffer)
    LogLaunch(p, "deferred");
    queues_[l.stream].push_back(std::move(p));
    return CUDA_SUCCESS;
  }
  if (CUresult r = FlushBlocking(); r != CUDA_SUCCESS) return r;
  std::string exec;
  const CUresult result = Execute(p, &exec);
  LogLaunch(p, exec);
  return result;
}

CUresult SimBackend::Execute(const Pending& p, std::string* exec_out) {
  SimFunction* f = p.f;
  if (sticky_ != CUDA_SUCCESS) {
    *exec_out = "error:" + std::to_string(static_cast<int>(sticky_));
    return sticky_;
  }
  std::string exec = "off";
  CUresult result = CUDA_SUCCESS;
  if (opt_.execute) {
    if (!Runnable(f)) {  // --sim-unexecutable skip (otherwise refused at LaunchKernel)
      exec = "skipped";
      if (warned_.insert(f->kernel->name).second)
        notices_.push_back("kernel " + f->kernel->name + " was NOT executed (--sim-unexecutable skip): " + f->why +
                           "; what it should have written is not computed");
    } else {
      ptx::Program* prog = f->module->program.get();
      ptx::LaunchConfig cfg;
      std::memcpy(cfg.grid, p.launch.grid, sizeof cfg.grid);
      std::memcpy(cfg.block, p.launch.block, sizeof cfg.block);
      cfg.dynamic_smem = p.launch.shared_mem;
      cfg.params = p.launch.params.data();
      cfg.param_bytes = static_cast<uint32_t>(p.launch.params.size());
      cfg.var_addrs = f->module->var_addrs.data();
      cfg.timeout_ms = opt_.kernel_timeout_ms;
      cfg.workers = opt_.workers != 0 ? opt_.workers : std::max(1u, std::thread::hardware_concurrency());
      cfg.printf_out = &output_;
      uint64_t workspace = 0;
      if (p.launch.cooperative()) {
        if (CUresult w = MemAlloc(64, &workspace); w != CUDA_SUCCESS) return w;
        std::memset(Host(workspace, 64), 0, 64);
        cfg.cooperative = true;
        cfg.grid_workspace = workspace;
      }
      // The kernel runs when its vGPU's compute share lets it, and holds the device meanwhile.
      if (p.gate != nullptr) p.gate->Enter();
      const ptx::LaunchResult r = ptx::Launch(*prog, f->kernel->name, cfg, *this);
      if (p.gate != nullptr) p.gate->Leave();
      if (workspace != 0) (void)MemFree(workspace);
      executed_lane_instructions_ += r.thread_instructions;
      if (r.code == CUDA_SUCCESS) {
        exec = "ran";
      } else {
        exec = "error:" + std::to_string(static_cast<int>(r.code));
        last_error_ = r.message;
        notices_.push_back("kernel " + f->kernel->name + " failed (" + std::to_string(static_cast<int>(r.code)) +
                           "): " + r.message);
        result = r.code;
        // As on a GPU, a fault in a kernel leaves the context unusable; a kernel the executor
        // cannot run fails alone.
        if (r.code != CUDA_ERROR_NOT_SUPPORTED && r.code != CUDA_ERROR_INVALID_VALUE) sticky_ = r.code;
      }
    }
  }
  *exec_out = exec;
  return result;
}

// The launch log (--sim-launch-log): one JSON object per line (JSON Lines), written with one
// write() so lines from concurrent sessions never interleave (O_APPEND). A launch:
//   {"sess":7,"event":"launch","kernel":"_Z3addPiii","grid":[1,1,1],"block":[32,1,1],"smem":0,
//    "stream":0,"cooperative":false,"cluster":[1,1,1],"params":"<hex>","exec":"ran"}
// where exec is ran, off (--sim-execute none), skipped (--sim-unexecutable skip), deferred (queued
// on a stream: its outcome comes later in a "ran" line), refused:<CUresult> or error:<CUresult>.
// A deferred launch's outcome, when its stream runs it:
//   {"sess":7,"event":"ran","kernel":"_Z3addPiii","stream":94...,"exec":"ran"}
void SimBackend::WriteLogLine(const nlohmann::json& j) {
  const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  ssize_t w = ::write(log_fd_, line.data(), line.size());
  (void)w;
}

void SimBackend::LogLaunch(const Pending& p, const std::string& exec) {
  if (log_fd_ < 0) return;
  const LaunchSpec& l = p.launch;
  static const char* kHex = "0123456789abcdef";
  std::string params;
  params.reserve(2 * l.params.size());
  for (const uint8_t b : l.params) {
    params += kHex[b >> 4];
    params += kHex[b & 15];
  }
  WriteLogLine({{"sess", opt_.session_id},
                {"event", "launch"},
                {"kernel", p.f->kernel->name},
                {"grid", l.grid},
                {"block", l.block},
                {"smem", l.shared_mem},
                {"stream", reinterpret_cast<uintptr_t>(l.stream)},
                {"cooperative", l.cooperative()},
                {"cluster", l.cluster},
                {"params", params},
                {"exec", exec}});
}

// Executes the deferred launches of `stream` in order and returns the sticky error, if any. A
// launch that fails without poisoning the context (an instruction the executor lacks) is kept in
// async_error_ and reported by the next synchronizing call, as CUDA reports asynchronous errors.
CUresult SimBackend::Flush(void* stream) {
  auto it = queues_.find(stream);
  if (it == queues_.end() || it->second.empty()) return sticky_;
  std::deque<Pending> q = std::move(it->second);
  queues_.erase(it);
  for (Pending& p : q) RunItem(p);
  return sticky_;
}

// Runs one queued item: a launch, an event record (the event completes), or a wait (the
// awaited stream runs up to the awaited record first).
void SimBackend::RunItem(Pending& p) {
  switch (p.kind) {
    case Pending::kRecord:
      if (p.event->pending_seq == p.seq) p.event->pending_seq = 0;
      p.event->recorded = true;
      p.event->ns = NowNs();
      return;
    case Pending::kWait: (void)FlushUntil(p.wait_stream, p.wait_seq); return;
    case Pending::kLaunch: {
      std::string exec;
      const CUresult r = Execute(p, &exec);
      LogOutcome(p, exec);
      if (r != CUDA_SUCCESS && async_error_ == CUDA_SUCCESS) async_error_ = r;
      return;
    }
  }
}

// Runs `stream`'s queue up to and including the item numbered `seq`.
CUresult SimBackend::FlushUntil(void* stream, uint64_t seq) {
  for (;;) {
    auto it = queues_.find(stream);
    if (it == queues_.end() || it->second.empty() || it->second.front().seq > seq) break;
    Pending p = std::move(it->second.front());
    it->second.pop_front();
    RunItem(p);
  }
  return sticky_;
}

// Everything the legacy default stream waits for: every queue except non-blocking streams',
// in launch order (`all`: the non-blocking ones too, for device-wide synchronization).
CUresult SimBackend::FlushBlocking(bool all) {
  for (;;) {
    // The queue holding the oldest pending launch goes first: launch order is kept across streams.
    void* next = nullptr;
    uint64_t oldest = UINT64_MAX;
    for (auto& [s, q] : queues_) {
      if (q.empty() || (!all && (stream_flags_[s] & CU_STREAM_NON_BLOCKING) != 0)) continue;
      if (q.front().seq < oldest) oldest = q.front().seq, next = s;
    }
    if (next == nullptr) break;
    std::deque<Pending>& q = queues_[next];
    Pending p = std::move(q.front());
    q.pop_front();
    RunItem(p);
  }
  return sticky_;
}

void SimBackend::LogOutcome(const Pending& p, const std::string& exec) {
  if (log_fd_ < 0) return;
  WriteLogLine({{"sess", opt_.session_id},
                {"event", "ran"},
                {"kernel", p.f->kernel->name},
                {"stream", reinterpret_cast<uintptr_t>(p.stream)},
                {"exec", exec}});
}

CUresult SimBackend::OccupancyMaxBlocks(void*, uint32_t block_size, uint64_t dynamic_smem, uint32_t, int* blocks) {
  // Simulated occupancy from the sm_90 limits: threads, blocks and shared memory per SM.
  const uint32_t warps = (block_size + 31) / 32;
  uint64_t by_threads = 2048 / (uint64_t{warps} * 32);
  uint64_t by_smem = dynamic_smem == 0 ? 32 : kSimSharedPerSm / (dynamic_smem + kSimReservedSharedPerBlock);
  *blocks = static_cast<int>(std::min<uint64_t>({32, by_threads, by_smem}));
  return CUDA_SUCCESS;
}

CUresult SimBackend::OccupancyMaxClusters(void* function, const uint32_t[3], const uint32_t block[3],
                                          uint32_t shared_mem, const uint32_t cluster[3], int* clusters) {
  auto* f = static_cast<SimFunction*>(function);
  const uint64_t csize = uint64_t{cluster[0]} * cluster[1] * cluster[2];
  if (csize == 0 || csize > MaxCluster(f)) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  int per_sm = 0;
  if (CUresult r = OccupancyMaxBlocks(function, block[0] * block[1] * block[2], shared_mem, 0, &per_sm);
      r != CUDA_SUCCESS)
    return r;
  // A cluster's blocks all live in one GPC.
  uint64_t n = 0;
  for (int sms : kSimGpcSms) n += static_cast<uint64_t>(sms) * static_cast<uint64_t>(per_sm) / csize;
  *clusters = static_cast<int>(n);
  return CUDA_SUCCESS;
}

CUresult SimBackend::OccupancyAvailableSmem(void* function, int num_blocks, int block_size, uint64_t* bytes) {
  int static_smem = 0;
  (void)FuncGetAttribute(function, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &static_smem);
  if (block_size > 1024) return CUDA_ERROR_INVALID_VALUE;
  const int64_t avail = std::min<int64_t>(static_cast<int64_t>(kSimSharedPerSm) / num_blocks -
                                              static_cast<int64_t>(kSimReservedSharedPerBlock),
                                          static_cast<int64_t>(kSimMaxSharedPerBlock)) -
                        static_smem;
  *bytes = avail > 0 ? static_cast<uint64_t>(avail) : 0;
  return CUDA_SUCCESS;
}

CUresult SimBackend::StreamCreate(uint32_t flags, int, void** stream) {
  *stream = reinterpret_cast<void*>(next_stream_++);
  stream_flags_[*stream] = flags;
  return CUDA_SUCCESS;
}

CUresult SimBackend::StreamDestroy(void* stream) {
  // Work queued on a destroyed stream still completes (CUDA: cuStreamDestroy does not wait, the
  // work is not lost).
  const CUresult r = Flush(stream);
  stream_flags_.erase(stream);
  stream_attrs_.erase(stream);
  return r;
}

// A tensor map in Orion's own layout (the executor runs no TMA, so nothing reads it but a
// program's own cuTensorMap* calls): a tag word, then the parameters as given.
CUresult SimBackend::TensorMapEncodeTiled(const TensorMapEncodeReq& q, uint64_t out[16]) {
  std::memset(out, 0, 16 * sizeof(uint64_t));
  out[0] = kSimTensorMapTag;
  out[1] = q.global_address;
  out[2] = uint64_t{q.data_type} | uint64_t{q.rank} << 8 | uint64_t{q.interleave} << 16 | uint64_t{q.swizzle} << 24 |
           uint64_t{q.l2_promotion} << 32 | uint64_t{q.oob_fill} << 40;
  for (uint32_t i = 0; i < 5; ++i) out[3 + i] = q.global_dim[i];
  for (uint32_t i = 0; i < 4; ++i) out[8 + i] = q.global_strides[i];
  for (uint32_t i = 0; i < 5; ++i) {
    out[12 + i / 2] |= uint64_t{q.box_dim[i] & 0x1ff} << (32 * (i % 2));
    out[15] |= uint64_t{q.element_strides[i] & 0xf} << (4 * i);
  }
  return CUDA_SUCCESS;
}

// An im2col map in Orion's own layout: a second tag, the tiled fields (no box), the corners and
// the channels and pixels per column.
CUresult SimBackend::TensorMapEncodeIm2col(const TensorMapIm2colReq& q, uint64_t out[16]) {
  (void)TensorMapEncodeTiled(q.base, out);
  out[0] = kSimTensorMapIm2colTag;
  out[12] = out[13] = 0;
  for (uint32_t i = 0; i < 3; ++i) {
    out[12] |= uint64_t{static_cast<uint16_t>(q.lower_corner[i])} << (16 * i);
    out[13] |= uint64_t{static_cast<uint16_t>(q.upper_corner[i])} << (16 * i);
  }
  out[14] = uint64_t{q.channels_per_pixel} | uint64_t{q.pixels_per_column} << 32;
  return CUDA_SUCCESS;
}

// The address is word 1 of either layout; a map the sim did not encode is refused, as the
// driver refuses a map it cannot read.
CUresult SimBackend::TensorMapReplaceAddress(const uint64_t map[16], uint64_t address, uint64_t out[16]) {
  if (map[0] != kSimTensorMapTag && map[0] != kSimTensorMapIm2colTag) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(out, map, 16 * sizeof(uint64_t));
  out[1] = address;
  return CUDA_SUCCESS;
}

// Stream attributes are kept and returned; the sim has no L2 for an access policy window to
// shape, and its streams' work runs in the order Flush gives whatever the sync policy.
CUresult SimBackend::StreamAttribute(void* stream, uint32_t attr, bool set, uint8_t value[64]) {
  auto& attrs = stream_attrs_[stream];
  auto it = attrs.find(attr);
  if (set) {
    if (attr == CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW) {
      CUaccessPolicyWindow w{};
      std::memcpy(&w, value, sizeof w);
      if (w.num_bytes > static_cast<size_t>(kSimMaxAccessPolicyWindow)) return CUDA_ERROR_INVALID_VALUE;
    }
    std::array<uint8_t, 64>& v = attrs[attr];
    std::memcpy(v.data(), value, v.size());
    return CUDA_SUCCESS;
  }
  std::memset(value, 0, 64);
  if (it != attrs.end()) {
    std::memcpy(value, it->second.data(), 64);
  } else if (attr == CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY) {
    const uint32_t automatic = CU_SYNC_POLICY_AUTO;  // the driver's default
    std::memcpy(value, &automatic, sizeof automatic);
  }
  return CUDA_SUCCESS;
}

// Records and waits are stream-ordered like launches: a wait on a stream holds that stream's
// later work until the awaited record is reached (running the other stream up to it). A program
// that drops a wait, or records too early, reads stale data here deterministically.
CUresult SimBackend::StreamWaitEvent(void* stream, void* event, uint32_t) {
  auto* e = static_cast<SimEvent*>(event);
  if (e->pending_seq == 0) return sticky_;  // nothing to wait for: recorded and reached, or never recorded
  if (stream == nullptr || !opt_.execute) return FlushUntil(e->pending_stream, e->pending_seq);
  Pending w;
  w.kind = Pending::kWait;
  w.seq = ++seq_;
  w.event = e;
  w.wait_seq = e->pending_seq;
  w.wait_stream = e->pending_stream;
  w.stream = stream;
  queues_[stream].push_back(std::move(w));
  return sticky_;
}

CUresult SimBackend::EventCreate(uint32_t flags, void** event) {
  auto e = std::make_unique<SimEvent>();
  e->flags = flags;
  *event = e.get();
  events_.emplace(e.get(), std::move(e));
  return CUDA_SUCCESS;
}

CUresult SimBackend::EventDestroy(void* event) {
  auto* e = static_cast<SimEvent*>(event);
  if (events_.count(e) == 0) return CUDA_ERROR_INVALID_HANDLE;
  // Queued records and waits point at it: run everything first (cuEventDestroy of a pending
  // event is legal; its work completes).
  (void)FlushBlocking(true);
  if (e->ipc_fd >= 0) ::close(e->ipc_fd);
  events_.erase(e);
  return CUDA_SUCCESS;
}

CUresult SimBackend::EventRecord(void* event, void* stream) {
  auto* e = static_cast<SimEvent*>(event);
  if (stream == nullptr || !opt_.execute || (e->flags & CU_EVENT_INTERPROCESS) != 0) {
    if (CUresult r = FlushFor(stream); r != CUDA_SUCCESS) return r;
    e->recorded = true;
    e->pending_seq = 0;
    e->ns = NowNs();
    return CUDA_SUCCESS;
  }
  Pending rec;
  rec.kind = Pending::kRecord;
  rec.seq = ++seq_;
  rec.event = e;
  rec.stream = stream;
  e->recorded = false;
  e->pending_seq = rec.seq;
  e->pending_stream = stream;
  queues_[stream].push_back(std::move(rec));
  return sticky_;
}

CUresult SimBackend::EventSynchronize(void* event) {
  auto* e = static_cast<SimEvent*>(event);
  if (e->pending_seq != 0) return Synced(FlushUntil(e->pending_stream, e->pending_seq));
  return sticky_;
}

CUresult SimBackend::EventElapsedTime(void* start, void* end, float* ms) {
  auto* a = static_cast<SimEvent*>(start);
  auto* b = static_cast<SimEvent*>(end);
  if (a->pending_seq != 0 || b->pending_seq != 0) return CUDA_ERROR_NOT_READY;
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
  *ms = static_cast<float>(static_cast<double>(static_cast<int64_t>(b->ns - a->ns)) / 1e6);
  return CUDA_SUCCESS;
}

}  // namespace orion::host::sim
