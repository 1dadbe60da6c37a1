#include "session_impl.h"

namespace orion::host {
namespace detail {

bool Session::Reply(const FrameHeader& req, int32_t status, const void* payload, uint32_t len) {
  FrameHeader h = ReplyHeader(req, status, len);
  h.deferred = deferred_;
  deferred_ = 0;
  // Device printf text the backend produced (sim: at launches; cuda: at synchronizing calls).
  if (std::string out = b_->TakeOutput(); !out.empty() && output_.size() < kMaxPendingOutput)
    output_.append(out, 0, std::min<size_t>(out.size(), kMaxPendingOutput - output_.size()));
  if (!output_.empty() || !notices_.empty()) h.flags |= kFlagOutputPending;
  Status s = ch_->Reply(h, payload, len);
  if (s.ok()) return true;
  if (s.code() == Code::kDataLoss) {
    p_.log->error("sess={} protocol violation: {}", p_.session_id, s.message());
    ch_->Closing(CUDA_ERROR_ILLEGAL_STATE);
    violation_ = true;
  } else {
    p_.log->info("sess={} cannot answer the client: {}", p_.session_id, s.message());
  }
  return false;
}

bool Session::Dispatch(const FrameHeader& h, const uint8_t* payload, std::vector<uint8_t>* reply, int32_t* status,
                       std::string* why) {
  reply->clear();
  // The checkpoint: nothing below runs for a payload whose length is not the one ops.def gives its
  // op; each handler then gets its request decoded once, typed by ops.def.
  if (static_cast<Op>(h.op) != Op::kBatch && static_cast<Op>(h.op) != Op::kHello &&
      static_cast<Op>(h.op) != Op::kRdmaConnect && !CheckRequestShape(h.op, h.payload_len, why))
    return false;
  Call c{h, payload, h.payload_len, reply, why};
  CUresult r = CUDA_SUCCESS;
  // The dispatch table: one case per row of ops.def.
#define ORION_HANDLER_CALL_kEmpty(Name) On##Name(c)
#define ORION_HANDLER_CALL_kOwn(Name) On##Name(c)
#define ORION_HANDLER_CALL_kFixed(Name) On##Name(DecodeReq<Op::k##Name>(payload), c)
#define ORION_HANDLER_CALL_kHead(Name) On##Name(DecodeReq<Op::k##Name>(payload), c)
  switch (static_cast<Op>(h.op)) {
#define ORION_OP(Name, number, reply_kind, Req, shape) \
  case Op::k##Name:                                    \
    r = ORION_HANDLER_CALL_##shape(Name);              \
    break;
#include "orion/common/ops.def"
    default: *why = "unknown op " + std::to_string(h.op); return false;
  }
#undef ORION_HANDLER_CALL_kEmpty
#undef ORION_HANDLER_CALL_kOwn
#undef ORION_HANDLER_CALL_kFixed
#undef ORION_HANDLER_CALL_kHead
  if (c.violation) return false;
  *status = static_cast<int32_t>(r);
  return true;
}

// Ops that never reach Dispatch as requests: the first frame (Hello), the RDMA setup beside the
// frame stream, and oriond's own messages to the client.
CUresult Session::OnHello(Call& c) { return c.Violation("second Hello"); }
CUresult Session::OnRdmaConnect(Call& c) { return c.Violation("RdmaConnect inside the frame stream"); }
CUresult Session::OnWindowData(Call& c) { return c.Violation("unknown op " + std::to_string(c.h.op)); }
CUresult Session::OnKeepalive(Call& c) { return c.Violation("unknown op " + std::to_string(c.h.op)); }

// Goodbye ends the session after its reply (Run); Nop is a round trip; Sync returns the deferred
// status, which every reply carries.
CUresult Session::OnGoodbye(Call& /*c*/) { return CUDA_SUCCESS; }
CUresult Session::OnNop(Call& /*c*/) { return CUDA_SUCCESS; }
CUresult Session::OnNopAsync(Call& /*c*/) { return CUDA_SUCCESS; }
CUresult Session::OnSync(Call& /*c*/) { return CUDA_SUCCESS; }

CUresult Session::OnTakeOutput(Call& c) {
  // A record takes at most half its ring (RingProducer::Reserve): on a small channel (4 MiB: a
  // 64 KiB reply ring) a full kMaxPayload reply would never fit, and the session would wait for
  // room until the client's lease ran out. The client asks again while kFlagOutputPending is set.
  const uint64_t ring_max = layout_.reply_ring_bytes / 2 - ivshmem::kStampBytes - sizeof(FrameHeader);
  const size_t room = std::min<uint64_t>(kMaxPayload, ring_max) - sizeof(OutputRep);
  const size_t n = std::min<size_t>(output_.size(), room);
  const size_t m = std::min<size_t>(notices_.size(), room - n);
  c.Put(OutputRep{static_cast<uint32_t>(n), static_cast<uint32_t>(m)});
  c.reply->insert(c.reply->end(), output_.begin(), output_.begin() + static_cast<std::ptrdiff_t>(n));
  c.reply->insert(c.reply->end(), notices_.begin(), notices_.begin() + static_cast<std::ptrdiff_t>(m));
  output_.erase(0, n);
  notices_.erase(0, m);
  return CUDA_SUCCESS;
}

CUresult Session::OnBatch(Call& c) {
  CUresult r = CUDA_SUCCESS;
  size_t off = 0;
  while (off < c.len) {
    BatchEntry e;
    ORION_WANT(c.len - off >= sizeof e, "truncated Batch entry");
    std::memcpy(&e, c.payload + off, sizeof e);  // read once: the guest may change the bytes
    off += sizeof e;
    ORION_WANT(e.reserved == 0 && OpBatchable(e.op) && e.len <= c.len - off, "bad Batch entry");
    if (!CheckRequestShape(e.op, e.len, c.why))  // the checkpoint, for each entry as for a frame
      return c.Violation(std::string("entry ") + OpName(e.op) + ": " + *c.why);
    if (static_cast<Op>(e.op) == Op::kMemcpy2D) {
      // Window bytes do not travel with a batch (network transports): device to device only.
      const auto m = DecodeReq<Op::kMemcpy2D>(c.payload + off);
      ORION_WANT(m.src_side == kSideDevice && m.dst_side == kSideDevice, "Batch Memcpy2D with a window side");
    }
    FrameHeader sub = c.h;
    sub.op = e.op;
    sub.payload_len = e.len;
    sub.flags = 0;
    int32_t st = 0;
    std::vector<uint8_t> ignored;
    if (!Dispatch(sub, c.payload + off, &ignored, &st, c.why))
      return c.Violation(std::string("entry ") + OpName(e.op) + ": " + *c.why);
    if (st != 0 && r == CUDA_SUCCESS) r = static_cast<CUresult>(st);  // the first error, deferred
    off += std::min<size_t>((e.len + 7u) & ~size_t{7}, c.len - off);
  }
  return r;
}

// The guest sees the features Orion serves, whatever the GPU behind it has: virtual memory
// management (the MemAddressReserve.. ops) and stream-ordered memory pools (the guest runtime
// serves them over MemAlloc/MemFree) are there; shareable (IPC, fabric)
// handles are not. Attribute ids: CUdevice_attribute, <cuda.h>.
//
// Host memory: on a network channel there is no memory both ends address, so nothing is mapped
// (CAN_MAP_HOST_MEMORY = 0). On a shared-memory channel to a backend that maps the pinned heap at the
// program's own addresses (`same_address`, Backend::SameAddressMapping), a pinned or registered
// host pointer is its own device pointer (CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 1), and
// managed memory is served from that heap (MANAGED_MEMORY = 1; not CONCURRENT_MANAGED_ACCESS: the
// pre-Pascal rules stay the contract, docs/spec/managed-memory.md).
void ClampServedFeatures(DeviceInfo* info, bool network, bool same_address) {
  auto set = [&](int a, int v) {
    if (a > 0 && a < static_cast<int>(kMaxDeviceAttributes)) info->attributes[a] = v;
  };
  set(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1);
  set(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1);
  set(CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0);
  set(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0);
  set(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0);
  const bool mapped_at_host_address = !network && same_address;
  if (network) set(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 0);
  set(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, mapped_at_host_address ? 1 : 0);
  set(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, mapped_at_host_address ? 1 : 0);
  set(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0);
  set(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0);
  set(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, 0);
  set(CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST, 0);
}

int Session::Run(const FrameHeader& hello_header, const HelloReq& hello) {
  hello_ = hello;
  int code = 0;
  if (!Start(hello_header, &code)) return code;
  return Serve();
}

bool Session::Start(const FrameHeader& hello_header, int* exit_code) {
  std::string why;
  if (!StartBackend(&why)) {
    Reply(hello_header, CUDA_ERROR_NO_DEVICE, why.data(), static_cast<uint32_t>(why.size()));
    *exit_code = kExitBackendFailed;
    return false;
  }
  return Welcome(hello_header, exit_code);
}

bool Session::StartBackend(std::string* why) {
  auto& log = *p_.log;
  if (Status s = b_->Init(p_.placements); !s.ok()) {
    log.error("sess={} backend {} failed to start: {}", p_.session_id, b_->name(), s.ToString());
    *why = "oriond backend failed: " + s.message();
    return false;
  }
  b_->RegisterWindow(window_ + layout_.staging_bytes, layout_.window_bytes - layout_.staging_bytes);
  for (size_t d = 0; d < p_.placements.size() && d < p_.compute_gpu.size() && d < p_.compute_slot.size(); ++d) {
    if (p_.compute_gpu[d] == nullptr || p_.compute_slot[d] < 0) {
      gates_.emplace_back();
      continue;
    }
    gates_.push_back(std::make_unique<ComputeGate>(p_.compute_gpu[d], p_.compute_slot[d]));
    const ComputeGate& g = *gates_.back();
    const std::string share = g.ratio() == 0 ? std::string("best effort")
                                             : std::to_string(g.ratio()) + "% (" + ComputePolicyName(g.policy()) + ")";
    if (b_->GatesCompute()) {
      log.info("sess={} compute: vGPU {} on p-GPU {} gets {} of its compute", p_.session_id, d, p_.placements[d].pgpu,
               share);
    } else {
      log.warn("sess={} compute: vGPU {} asked for {} of p-GPU {}; the {} backend does not enforce compute shares yet",
               p_.session_id, d, share, p_.placements[d].pgpu, b_->name());
    }
  }
  std::vector<uint8_t>& welcome = welcome_;
  welcome.assign(sizeof(WelcomeRep) + p_.placements.size() * sizeof(DeviceInfo), 0);
  WelcomeRep w{};
  w.session_id = p_.session_id;
  w.device_count = static_cast<uint32_t>(p_.placements.size());
  w.driver_version = b_->DriverVersion();
  w.backend = std::string(b_->name()) == "cuda" ? 1 : 0;
  w.transport = p_.transport;
  // Shared memory: synchronous calls through the sync slot, for a client that can (ivshmem/ring.h).
  if ((hello_.transports & kTransportSyncSlot) != 0 && ch_->ServeSyncSlot()) w.features = kWelcomeSyncSlot;
  w.channel_bytes = p_.transport == kTransportShm ? 0 : p_.channel_bytes;
  std::snprintf(w.server_name, sizeof w.server_name, "oriond (%s)", b_->name());
  std::snprintf(w.allocation_id, sizeof w.allocation_id, "%s", p_.allocation_id.c_str());
  std::snprintf(w.share, sizeof w.share, "%s", p_.share.c_str());
  std::memcpy(welcome.data(), &w, sizeof w);
  overhead_.assign(p_.placements.size(), 0);
  metered_.assign(p_.placements.size(), 0);
  scratch_.assign(p_.placements.size(), 0);
  for (uint32_t d = 0; d < p_.placements.size(); ++d) {
    DeviceInfo info{};
    b_->DescribeDevice(d, &info);
    info.total_mem = p_.placements[d].quota_bytes;
    ClampServedFeatures(&info, p_.transport != kTransportShm, b_->SameAddressMapping());
    limits_.push_back(LaunchLimits::Of(info));
    // Each vGPU has its own UUID, as MIG instances do: the physical GPU's with its last two bytes
    // XORed with vGPU index + 1. vGPU n of a GPU keeps one UUID across sessions and restarts, and
    // no two vGPUs of a process look alike to tools that pick a device by UUID
    // (CUDA_VISIBLE_DEVICES=GPU-..., NVML's nvmlDeviceGetHandleByUUID).
    const uint32_t tag = p_.placements[d].vgpu + 1;
    info.uuid[14] = static_cast<uint8_t>(info.uuid[14] ^ (tag >> 8));
    info.uuid[15] = static_cast<uint8_t>(info.uuid[15] ^ tag);
    overhead_[d] = b_->ContextOverhead(d);
    PublishUsed(d);
    std::memcpy(welcome.data() + sizeof w + d * sizeof info, &info, sizeof info);
  }
  return true;
}

bool Session::Welcome(const FrameHeader& hello_header, int* exit_code) {
  if (!Reply(hello_header, CUDA_SUCCESS, welcome_.data(), static_cast<uint32_t>(welcome_.size()))) {
    *exit_code = violation_ ? kExitViolation : kExitLeaseExpired;
    return false;
  }
  ch_->Serving();
  return true;
}

int Session::Serve() {
  auto& log = *p_.log;

  std::vector<uint8_t> scratch, reply;
  // Idle: spin ~0.1 ms (not over TCP: SpinPolls), yield, then sleep until the client rings (a futex, the VM's ivshmem
  // doorbell, or the socket): the first call after a pause costs one kernel wake-up. The sleep's
  // timeout runs the liveness checks (Idle: the client's lease) and bounds a wake-up missed after
  // an asynchronous frame (client.h, B1): 2 ms after the last frame, doubling with each quiet
  // wait up to idle_wait_ms (a quarter of the lease timeout, 20..250 ms). A client that cannot ring
  // (an older guest runtime in a VM) gets naps of up to 2 ms, 5 ms after a quiet second.
  ivshmem::Backoff backoff(ch_->SpinPolls(), 100, 2000);
  const int idle_wait_ms = static_cast<int>(std::clamp<uint64_t>(p_.lease_timeout_ms / 4, 20, 250));
  uint64_t frames = 0;
  uint64_t last_frame_ms = MonotonicMs();
  uint32_t quiet_waits = 0;  // sleeps since the last frame
  bool caught_up = false;    // the last poll found no frame (ShmSessionChannel::Slip)
  auto violation = [&](const std::string& what) {
    log.error("sess={} protocol violation: {}; ending the session", p_.session_id, what);
    ch_->Closing(CUDA_ERROR_ILLEGAL_STATE);
    return kExitViolation;
  };
  // The watchdog: the loop below sees its client go only between frames, and a frame can take as
  // long as a kernel runs (10 min by default on the sim). While a frame has been executing for half
  // a second, a thread checks every 100 ms whether the client is certainly gone (SessionChannel::
  // ClientGone: its lease stale, its connection closed) and then ends the worker at once: the
  // executor stops mid-kernel (the cuda backend's driver reclaims the context with the process),
  // and oriond frees the vGPUs and the compute share when it reaps the worker.
  // Odd while a frame executes; the watchdog times how long one value stays (no clock per frame).
  constexpr uint64_t kKeepaliveMs = 250;  // far below a client's ORION_ALIVE_TIMEOUT_MS (10 s)
  std::atomic<uint64_t> busy_seq{0};
  std::atomic<uint16_t> busy_op{0};
  std::mutex dog_mu;
  std::condition_variable dog_cv;
  bool dog_stop = false;
  std::thread dog([&] {
    uint64_t seen = 0, seen_ms = 0, frame = 0, frame_ms = 0, sent = 0, sent_ms = MonotonicMs();
    std::unique_lock<std::mutex> l(dog_mu);
    while (!dog_cv.wait_for(l, std::chrono::milliseconds(100), [&] { return dog_stop; })) {
      const uint64_t now = MonotonicMs();
      const std::string why = ch_->ClientGone(now, &seen, &seen_ms);
      const uint64_t seq = busy_seq.load(std::memory_order_relaxed);
      if (seq != frame) {
        frame = seq;
        frame_ms = now;
      }
      // Requests executing and nothing sent for kKeepaliveMs (a long kernel, a synchronize behind
      // many launches): the client hears from oriond that often (a 24-byte frame).
      if (const uint64_t n = ch_->MessagesSent(); n != sent) {
        sent = n;
        sent_ms = now;
      }
      if ((seq & 1) != 0 && now - sent_ms >= kKeepaliveMs) {
        ch_->Keepalive();
        sent = ch_->MessagesSent();
        sent_ms = now;
      }
      if (why.empty() || (seq & 1) == 0 || now - frame_ms < 500) continue;
      log.warn("sess={} {} while the worker was busy ({} ms in {}); ending the session now", p_.session_id, why,
               now - frame_ms, OpName(busy_op.load()));
      log.flush();
      _exit(p_.socket_fd < 0 ? kExitLeaseExpired : kExitClientGone);
    }
  });
  struct DogStop {
    std::mutex& mu;
    std::condition_variable& cv;
    bool& stop;
    std::thread& t;
    ~DogStop() {
      {
        std::lock_guard<std::mutex> g(mu);
        stop = true;
      }
      cv.notify_all();
      t.join();
    }
  } dog_stop_at_return{dog_mu, dog_cv, dog_stop, dog};
  for (;;) {
    if (MoveAsked()) TakeMoveRequest();
    ivshmem::FrameView f{};
    bool got = false;
    if (Status s = ch_->Pop(&f, &scratch, &got); !s.ok()) {
      if (s.code() == Code::kUnavailable) {
        log.info("sess={} {}", p_.session_id, s.message());
        return kExitClientGone;
      }
      return violation(s.message());
    }
    if (!got) {
      caught_up = true;
      if (backoff.sleeping() || (++frames & 0xFFF) == 0) {
        const uint64_t now = MonotonicMs();
        backoff.set_max_sleep_us(now - last_frame_ms > 1000 ? 5000 : 2000);
        if (Status s = ch_->Idle(now); !s.ok()) {
          log.info("sess={} {}", p_.session_id, s.message());
          // A network session's Idle fails when its client closed the connection: that is the
          // client gone, as when Pop or the watchdog sees it first (oriond logs the same reason).
          return s.code() == Code::kUnavailable && p_.socket_fd < 0 ? kExitLeaseExpired : kExitClientGone;
        }
      }
      // Asleep: on the doorbell or the socket when the channel has one (2 ms while recently busy,
      // 20 ms after a quiet second: the bound on a missed wake-up), else naps.
      if (backoff.sleeping() && ch_->WaitIdle(std::min(idle_wait_ms, 2 << std::min<uint32_t>(quiet_waits, 7)))) {
        ++quiet_waits;
      } else {
        naps_ += backoff.sleeping() ? 1 : 0;
        backoff.Pause();
      }
      continue;
    }
    const bool was_asleep = backoff.sleeping();
    if (was_asleep || (frames++ & 0xFF) == 0) last_frame_ms = MonotonicMs();  // after idle, or now and then
    backoff.Reset();
    // Woken by a client that rang: the kernel ran us on its CPU, where it now waits for this reply.
    // Spinning there after the reply would keep it off that CPU (~0.1 ms): yield at once instead,
    // until frames come back to back again.
    backoff.set_spin(was_asleep ? 0 : ch_->SpinPolls());
    quiet_waits = 0;
    const FrameHeader& h = f.header;
    if (!OpKnown(h.op) || static_cast<Op>(h.op) == Op::kWindowData) {
      return violation("unknown op " + std::to_string(h.op));
    }
    int32_t status = 0;
    std::string why;
    busy_op.store(h.op, std::memory_order_relaxed);
    // Only this thread writes busy_seq: plain stores, no locked instruction per frame.
    busy_seq.store(busy_seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);  // odd: executing
    // A move asked for happens at a frame the client waits on: everything before it has executed,
    // and nothing comes after it until its reply (the client's lock spans the call). Meanwhile the
    // watchdog keeps the client told that oriond lives (the state may take seconds to travel).
    // (Before the target prepared it, the move waits for a later such frame; a program that ends
    // meanwhile has its move refused, and the asker told so.)
    if (!move_to_.empty() && (h.flags & kFlagWantsReply) != 0 &&
        (static_cast<Op>(h.op) == Op::kGoodbye || MoveReady())) {
      const int moved = MoveOut(h, &busy_seq);
      if (moved >= 0) return moved;
      if (moved == kMoveCameBack) continue;  // answered kStatusMoved: the client sends it again
    }
    const bool dispatched = Dispatch(h, f.payload, &reply, &status, &why);
    busy_seq.store(busy_seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (!dispatched) return violation(std::string(OpName(h.op)) + ": " + why);
    if (status != 0 && status != kStatusNeedBytes) {
      log.debug("sess={} op={} -> {}", p_.session_id, OpName(h.op), status);
    }
    // D0: the frame's window bytes reach the client, its staging bytes are free (shm: pairs with S0
    // in the client), before its reply.
    if (Status s = ch_->Done(h, f.payload); !s.ok()) {
      if (s.code() == Code::kDataLoss) return violation(s.message());
      log.info("sess={} {}", p_.session_id, s.message());
      return kExitClientGone;
    }
    if (h.flags & kFlagWantsReply) {
      if (!Reply(h, status, reply.data(), static_cast<uint32_t>(reply.size()))) {
        return violation_ ? kExitViolation : kExitClientGone;
      }
    } else {
      if (status != 0 && deferred_ == 0) deferred_ = status;  // reported with the next reply
      if (caught_up) ch_->Slip();
    }
    caught_up = false;
    if (static_cast<Op>(h.op) == Op::kGoodbye) return kExitGoodbye;
  }
}

}  // namespace detail

int RunSession(const SessionParams& params, std::unique_ptr<Backend> backend, const FrameHeader& hello_header,
               const HelloReq& hello) {
  if (params.migrate_fd >= 0) {  // a moved session: its client's connection comes later (Adopt)
    detail::Session s(params, std::move(backend),
                      MakeTcpSessionChannel(-1, nullptr, params.channel_bytes, params.net_stall_ms));
    const int code = s.MigrateIn(hello_header);
    s.LogWaits();
    return code;
  }
  detail::WatchMoveRequests(params.control_fd);
  std::unique_ptr<SessionChannel> ch =
      params.socket_fd < 0
          ? MakeShmSessionChannel(params.region, params.channel_bytes, params.channel, params.generation,
                                  params.request_position, params.lease_timeout_ms, params.doorbell_fd)
      : params.transport == kTransportRdma
          ? MakeRdmaSessionChannel(params.socket_fd, params.channel_bytes, params.net_stall_ms, params.session_id,
                                   params.log)
          : MakeTcpSessionChannel(params.socket_fd, params.stream, params.channel_bytes, params.net_stall_ms);
  detail::Session s(params, std::move(backend), std::move(ch));
  const int code = s.Run(hello_header, hello);
  s.LogWaits();
  return code;
}

}  // namespace orion::host
