// guest/src/client_call.cpp — the call path of Client (client.h): frame headers, pushing a frame
// into the channel, waiting for its reply (deadlines, the server's liveness, replies checked
// against the request), the device output and notices a reply carries, Call and Send.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "client.h"
#include "orion/common/text.h"
#include "state.h"

namespace orion::guest {
namespace {

using ivshmem::Backoff;

constexpr auto kHeartbeatTimeout = std::chrono::seconds(5);
// The longest a wait for a reply blocks on a network socket at once (FrameChannel::AwaitInput)
// before it checks the deadline and the server's liveness again.
constexpr uint32_t kAwaitInputUs = 50000;

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

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

FrameHeader Client::MakeHeader(Op op, uint32_t payload_len, bool wants_reply) noexcept {
  FrameHeader h = MakeFrameHeader(static_cast<uint16_t>(op), next_seq_++, payload_len);
  h.flags = wants_reply ? kFlagWantsReply : 0;
  return h;
}

CUresult Client::Broken(CUresult why, const char* what) noexcept {
  if (broken_ == CUDA_SUCCESS) {
    broken_ = why;
    if (resuming_) {  // one attempt of a resume failed: ResumeLocked may try the way back
      resume_failure_ = what;
      return broken_;
    }
    LogError(std::string("Orion session lost: ") + what);
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
  const bool call = (h.flags & kFlagWantsReply) != 0;
  while ((p = call ? chan_->ReserveCall(h.payload_len) : chan_->Reserve(h.payload_len)) == nullptr) {
    if (backoff.sleeping() && ServerGoneLocked(&beat, &changed)) return broken_;
    if (backoff.sleeping()) RingDoorbell(true);  // the ring is full: the worker must be awake
    backoff.Pause();
  }
  std::memcpy(p, &h, sizeof h);
  if (req_len != 0) std::memcpy(p + sizeof h, req, req_len);
  if (tail_len != 0) std::memcpy(p + sizeof h + req_len, tail, tail_len);
  // Over TCP a session may move (issue #24): a request the source answers kStatusMoved goes again
  // to the target, so the last one awaiting a reply is kept (its window bytes stay in the window).
  // A region session's stays where it is in the request ring (nothing is written there until its
  // reply): only where it is is kept, no copy on the synchronous call's path.
  if ((h.flags & kFlagWantsReply) != 0) {
    if (tcp_ != nullptr) {
      last_call_.assign(p, p + sizeof h + req_len + tail_len);
    } else if (host_region_) {
      last_call_at_ = p;
      last_call_len_ = static_cast<uint32_t>(sizeof h + req_len + tail_len);
    }
  }
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
  } else if (!KnownResult(h.status) && !(h.status == kStatusNeedBytes && op == Op::kModuleLoad) &&
             !(h.status == kStatusMoved && (network_ || host_region_) && op != Op::kHello)) {
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
  // kernel wakes it on the waker's CPU), so we yield at once: on shared memory 200 spins first
  // (26 ns each here) held it off for ~10 us of a ~50 us first call after idle (perf sched; the
  // idle-call p50 went 50-57 to 46-47 us, bench/results/2026-11-29-idle-call-yield.txt). Over the
  // network we cannot see it sleep: a pause of over a millisecond since the last reply says so,
  // and there every poll is a recv system call (200 of them kept a worker woken on our CPU
  // waiting ~0.1 ms).
  const uint64_t start = NowNs();
  if (network_ && start - last_reply_ns_ > 1000000) woke_ = true;
  Backoff backoff(woke_ ? 0 : 20000, woke_ ? 2000 : 200, 200);
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
      if (f.header.status == kStatusMoved) {
        // The session moved to another oriond, which holds it now: this request was not executed;
        // it goes again, there, after the resume (issue #24).
        if (CUresult r = ResumeLocked(f); r != CUDA_SUCCESS) return r;
        backoff = Backoff(20000, 200, 200);
        last_beat = last_change = 0;
        continue;
      }
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
  const uint64_t want = ThreadContextHandle();
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

}  // namespace orion::guest
