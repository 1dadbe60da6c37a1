// session_move.cpp — a session moved to another oriond while its program runs (issue #24, step 3;
// docs/design/migration.md, "The move, step by step"). Both halves of a move live here:
//
//   source worker                      target oriond (parent, then a worker it forks)
//   -------------                      ----------------------------------------------
//   oriond passes `migrate HOST:PORT`
//   and the asker's connection on the
//   control socketpair, then SIGUSR2.
//   Between frames (PrepareMove):
//     connect, Hello kHelloMigrateIn   -> admitted like a program's Hello (vGPUs, memory, ratio);
//                                         a worker starts its backend and answers "ready"
//     the manifest (its allocations)   -> allocates and commits them; answers "prepared"
//   The program runs on meanwhile. At
//   the first frame it waits on after
//   "prepared" (nothing follows it: the
//   client holds its lock until the
//   reply; kPrepareMs at most):
//     the snapshot (drains first)      -> Restore into the prepared memory; answers "restored"
//                                         with the resume token
//     the frame's reply: kStatusMoved
//     {HOST:PORT, token}
//                                      <- the client connects, Hello kHelloResume + token: oriond
//                                         hands that connection to the worker (SCM_RIGHTS), which
//                                         sends the Welcome, tells the source "committed" and
//                                         serves; the client sends the frame again
//     exits kExitMoved; the asker hears "ok"
//
// Failure: until the source sends kStatusMoved, nothing has changed at the source: a refusal, an
// unreachable target, a snapshot that cannot be taken or restored leaves the session serving where
// it was, and the asker hears why. kStatusMoved carries a back token (oriond's, with the request):
// a client that cannot reach the target or is refused there resumes at the source with it, and the
// source, which keeps the session until the target's "committed" (kCommitMs), adopts its
// connection and serves on; it closes the migration connection, and the target's copy ends at
// once. The source exits when the target commits, or after kCommitMs with neither; the target
// drops a session whose client does not come within kResumeMs. A session on its program's own
// controller allocation carries the allocation's id in its kHelloMigrateIn: the target confirms it
// with the controller (which admits it only as the target of a move it was asked for) and, once
// the program resumed there, reports the move committed (ControllerLink::ReportMove).
//
// A session on shared memory (a program on this host, not a VM's) moves the same way and continues
// over TCP at the target: its client first makes its data window private memory at the same
// address (its pinned buffers keep their place), then resumes as a TCP client does. Its way back is
// its own channel, which this worker keeps until the target commits: a kHelloResume with the back
// token on the request ring. Not built yet (the later steps): moving an RDMA or TLS session,
// a VM's, a session on a share's or a job's allocation, and a vGPU share moving together (a session
// on one moves alone).
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cerrno>
#include <charconv>
#include <functional>
#include <sstream>

#include "orion/common/fd_passing.h"
#include "orion/common/net.h"
#include "session_impl.h"

namespace orion::host::detail {

std::atomic<bool> g_move_asked{false};

namespace {

constexpr int kConnectMs = 5000;     // the target must accept within this
constexpr int kStepMs = 120000;      // each step of the transfer: ready, restored (the bytes stream meanwhile)
constexpr int kCommitMs = 30000;     // the client must reach the target within this
constexpr int kResumeMs = 30000;     // the target waits this long for the client
constexpr int kIoMs = 30000;         // one read or write of the snapshot stream may stall this long
constexpr int kPrepareMs = 10000;    // the source waits this long for the target's "prepared", then moves anyway
constexpr int kHoldMs = 60000;       // the target holds prepared memory this long for the program's pause
constexpr uint32_t kMaxText = 4096;  // a refusal's text

int g_control_fd = -1;

void OnMoveSignal(int) { g_move_asked.store(true, std::memory_order_relaxed); }

// Waits until `fd` is ready for `events`, at most `ms`; false on timeout or error.
bool WaitFd(int fd, short events, int ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;  // SIGUSR2 and the like
    return r == 1 && (p.revents & (events | POLLHUP | POLLERR)) != 0 && (p.revents & POLLNVAL) == 0;
  }
}

// The ms left until `deadline_ms` (monotonic), at least 0.
int MsLeft(uint64_t deadline_ms) {
  const uint64_t now = MonotonicMs();
  return now >= deadline_ms ? 0 : static_cast<int>(deadline_ms - now);
}

// All of [data, data+bytes) within `ms` in all (a peer that drips a byte at a time is bounded too).
bool SendAll(int fd, const void* data, size_t bytes, int ms = kIoMs) {
  const uint64_t deadline = MonotonicMs() + static_cast<uint64_t>(ms);
  const auto* b = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, b, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      b += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && MsLeft(deadline) > 0 &&
        WaitFd(fd, POLLOUT, MsLeft(deadline)))
      continue;
    return false;
  }
  return true;
}

bool RecvAll(int fd, void* data, size_t bytes, int ms) {
  const uint64_t deadline = MonotonicMs() + static_cast<uint64_t>(ms);
  auto* b = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, b, bytes, MSG_DONTWAIT);
    if (n > 0) {
      b += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && MsLeft(deadline) > 0 && WaitFd(fd, POLLIN, MsLeft(deadline)))
      continue;
    return false;
  }
  return true;
}

// The snapshot stream over the migration connection, each way. A peer that stalls is bounded per
// read or write (kIoMs) and in all: kStepMs plus one second per MiB so far (a link of 1 MiB/s at
// least), so that a hostile or broken one cannot hold a worker, its vGPUs or a paused program.
class StreamBudget {
 public:
  StreamBudget() : start_ms_(MonotonicMs()) {}
  // The ms a step of the stream may still wait, 0 when the budget is spent.
  int Left(uint64_t bytes_so_far) const {
    const uint64_t allowed = kStepMs + (bytes_so_far >> 20) * 1000;
    const uint64_t used = MonotonicMs() - start_ms_;
    return used >= allowed ? 0 : static_cast<int>(std::min<uint64_t>(allowed - used, kIoMs));
  }

 private:
  uint64_t start_ms_;
};

class SocketWriter final : public SnapshotWriter {
 public:
  explicit SocketWriter(int fd) : fd_(fd) {}
  bool Write(const void* data, size_t bytes) override {
    bytes_ += bytes;
    const int ms = budget_.Left(bytes_);
    return ms > 0 && SendAll(fd_, data, bytes, ms);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  int fd_;
  uint64_t bytes_ = 0;
  StreamBudget budget_;
};

class SocketReader final : public SnapshotReader {
 public:
  // `prepared`: tells the source its manifest was prepared (false: it could not be told).
  SocketReader(int fd, std::function<bool()> prepared) : fd_(fd), prepared_(std::move(prepared)) {}
  bool Read(void* data, size_t bytes) override {
    if (holding_) {
      // The rest of the snapshot comes at the program's pause: its first bytes may take up to
      // kHoldMs, and the budget for the stream starts then.
      holding_ = false;
      if (!RecvAll(fd_, data, bytes, kHoldMs)) return false;
      budget_ = StreamBudget();
      bytes_ = bytes;
      return true;
    }
    const int ms = budget_.Left(bytes_);
    bytes_ += bytes;
    return ms > 0 && RecvAll(fd_, data, bytes, ms);
  }
  bool Prepared() override {
    holding_ = true;
    return prepared_();
  }

 private:
  int fd_;
  std::function<bool()> prepared_;
  bool holding_ = false;
  uint64_t bytes_ = 0;
  StreamBudget budget_;
};

// A frame on the migration connection: header and payload.
bool SendFrame(int fd, const FrameHeader& h, const void* payload) {
  return SendAll(fd, &h, sizeof h) && (h.payload_len == 0 || SendAll(fd, payload, h.payload_len));
}

// A reply on the migration connection: false when none came within `ms`, or it is malformed.
bool RecvReply(int fd, uint16_t op, int ms, FrameHeader* h, std::string* payload) {
  if (!RecvAll(fd, h, sizeof *h, ms)) return false;
  if (h->magic != kFrameMagic || h->version != kProtocolVersion || h->op != op || h->payload_len > kMaxText)
    return false;
  payload->assign(h->payload_len, '\0');
  return h->payload_len == 0 || RecvAll(fd, payload->data(), h->payload_len, kIoMs);
}

// One line to whoever asked for the move (orion-smi through oriond's control socket), then closed.
void Answer(int* asker, const std::string& line) {
  if (*asker < 0) return;
  const std::string text = line + "\n";
  (void)SendAll(*asker, text.data(), text.size());
  ::close(*asker);
  *asker = -1;
}

// How a move ends once the program was told to go: the target's "committed" (`committed`), or the
// program back here (`client`, its connection, with its kHelloResume's header), or neither.
struct Outcome {
  bool committed = false;
  int client = -1;
  bool on_ring = false;  // a shared-memory session's program came back on its own channel
  bool violation = false;
  FrameHeader hello{};
};

// A shared-memory session's way back: polls its channel for the program's kHelloResume. 1: it came
// (the header is filled); 0: nothing yet; -1: anything else arrived (a protocol violation).
using RingCheck = std::function<int(FrameHeader*)>;

// Waits up to kCommitMs for the target's confirmation on `target` and, when `control` >= 0, for
// the program's connection on the worker's control socket (oriond routes a kHelloResume with the
// session's back token there). A target that closes or answers no stops being waited on; the program
// may still come back. A `migrate` request meanwhile is answered that the session is moving. A
// shared-memory session's program comes back on its channel instead (`ring`, looked at every 5 ms).
Outcome AwaitOutcome(int target, int control, const RingCheck& ring) {
  Outcome out;
  const uint64_t deadline = MonotonicMs() + kCommitMs;
  for (;;) {
    const uint64_t now = MonotonicMs();
    if (now >= deadline || (target < 0 && control < 0 && !ring)) return out;
    if (ring) {
      const int back = ring(&out.hello);
      if (back != 0) {
        out.on_ring = back > 0;
        out.violation = back < 0;
        return out;
      }
    }
    pollfd p[2] = {{target, POLLIN, 0}, {control, POLLIN, 0}};
    const int wait_ms = static_cast<int>(deadline - now);
    if (::poll(p, 2, ring ? std::min(wait_ms, 5) : wait_ms) < 0 && errno != EINTR) return out;
    if (target >= 0 && p[0].revents != 0) {
      FrameHeader rh{};
      std::string text;
      if (RecvReply(target, static_cast<uint16_t>(Op::kHello), kIoMs, &rh, &text) && rh.status == 0) {
        out.committed = true;
        return out;
      }
      target = -1;  // closed or refused: only the program's return is left
    }
    if (control >= 0 && p[1].revents != 0) {
      char buf[512];
      int fd = -1;
      const ssize_t n = RecvWithFd(control, buf, sizeof buf, &fd, MSG_DONTWAIT);
      if (n == 0) {
        control = -1;  // oriond is gone
        continue;
      }
      if (n < 0) continue;
      FrameHeader h{};
      if (static_cast<size_t>(n) == sizeof h && fd >= 0) {
        std::memcpy(&h, buf, sizeof h);
        if (h.magic == kFrameMagic && h.op == static_cast<uint16_t>(Op::kHello)) {
          out.client = fd;
          out.hello = h;
          return out;
        }
      }
      Answer(&fd, "error the session is moving now");
    }
  }
}

}  // namespace

void WatchMoveRequests(int control_fd) {
  g_control_fd = control_fd;
  if (control_fd < 0) return;
  struct sigaction sa {};
  sa.sa_handler = OnMoveSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking wait returns, and the loop sees the request at once
  sigaction(SIGUSR2, &sa, nullptr);
}

void Session::TakeMoveRequest() {
  g_move_asked.store(false, std::memory_order_relaxed);
  for (;;) {
    char text[512];
    int asker = -1;
    const ssize_t n = RecvWithFd(g_control_fd, text, sizeof text - 1, &asker, MSG_DONTWAIT);
    if (n <= 0) return;
    text[n] = '\0';
    const std::string line(text, static_cast<size_t>(n));
    if (!line.starts_with("migrate ") || line.size() <= 8) {
      Answer(&asker, "error the worker does not know '" + line + "'");
      continue;
    }
    if (!move_to_.empty()) {
      Answer(&asker, "error session " + std::to_string(p_.session_id) + " is already moving to " + move_to_);
      continue;
    }
    // "migrate HOST:PORT [BACK_TOKEN [share]]": oriond adds the token the program comes back with
    // when it cannot reach the target, and "share" when this session is the one session of a
    // vGPU share whose controller allocation goes along with it (Daemon::HandOffMove).
    std::istringstream args(line.substr(8));
    std::string back, word;
    args >> move_to_ >> back >> word;
    move_back_.clear();
    if (back.size() == kShareTokenLen && ValidShareToken(back.c_str(), back.size() + 1)) move_back_ = back;
    move_share_ = word == "share";
    move_asker_ = asker;
    p_.log->info("sess={} move to {} asked for: at the next call the program waits on", p_.session_id, move_to_);
    PrepareMove();
  }
}

// Everything that can refuse a move before the program pauses, at once: the session's kind, the
// target's admission and window layout, what the session holds (CanMove). Then the manifest: the
// target allocates and commits the session's memory while the program still runs here, and says
// "prepared" (MoveReady waits for that before the pause, kPrepareMs at most).
bool Session::PrepareMove() {
  auto& log = *p_.log;
  const std::string to = move_to_;
  const std::string sess = "session " + std::to_string(p_.session_id);
  auto refuse = [&](const std::string& why) {
    log.warn("sess={} not moved to {}: {}", p_.session_id, to, why);
    Answer(&move_asker_, "error " + sess + " not moved: " + why);
    move_to_.clear();
    move_back_.clear();
    return false;
  };
  const bool shm = p_.socket_fd < 0;
  if (shm && p_.vm) return refuse("a VM's session cannot move: its ivshmem channel stays with the VM on this host");
  if (!shm && p_.transport != kTransportTcp) {
    return refuse("only a session over TCP or shared memory can move yet; this one uses RDMA");
  }
  if (p_.stream != nullptr && p_.stream->secure()) return refuse("a session over TLS cannot move yet");
  // A controller's allocation moves with its session when it is the program's own (its client
  // brought it: the target confirms it with the controller as the move's target, and commits the
  // move there once the program resumed). One a vGPU share or a job holds stays with them.
  // A vGPU share's allocation goes along when oriond says this session is the share's only one.
  const bool own_allocation = !p_.allocation_id.empty() &&
                              ((p_.hold_used == nullptr && p_.share.empty()) || (move_share_ && !p_.share.empty()));
  if (!p_.allocation_id.empty() && !own_allocation)
    return refuse(p_.share.empty() ? "a session on a job's controller allocation cannot move yet"
                                   : "its vGPU share's controller allocation serves other sessions too");
  // A session on a vGPU share (ORION_SHARE: every program's first session names one) moves alone:
  // at the target it has its vGPUs and quota to itself; on a standalone oriond the share's other
  // sessions stay here.
  std::string why;
  if (!CanMove(&why)) return refuse(why);
  auto connected = ConnectTcp(to, kConnectMs);
  if (!connected.ok()) return refuse(connected.status().message());
  const int fd = *connected;
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};

  // The session as the target's admission sees it: its vGPUs, memory per vGPU, compute share, and
  // the program's informational fields.
  HelloReq hello{};
  hello.protocol_version = kProtocolVersion;
  hello.transports = kTransportTcp;
  hello.kind = kHelloMigrateIn;
  hello.vgpu_count = static_cast<uint32_t>(p_.placements.size());
  uint64_t quota = 0;
  for (const Placement& pl : p_.placements) quota = std::max(quota, pl.quota_bytes);
  hello.gmem_mib = (quota + (uint64_t{1} << 20) - 1) >> 20;
  for (const auto& g : gates_) {
    if (g == nullptr) continue;
    hello.ratio = static_cast<uint8_t>(g->ratio());
    hello.policy = static_cast<uint8_t>(g->policy());
    break;
  }
  hello.pid = hello_.pid;
  if (own_allocation) std::snprintf(hello.allocation_id, sizeof hello.allocation_id, "%s", p_.allocation_id.c_str());
  std::memcpy(hello.process_name, hello_.process_name, sizeof hello.process_name);
  std::memcpy(hello.hostname, hello_.hostname, sizeof hello.hostname);
  FrameHeader h = MakeFrameHeader(static_cast<uint16_t>(Op::kHello), 1, sizeof hello);
  h.flags = kFlagWantsReply;
  FrameHeader rh{};
  std::string text;
  if (!SendFrame(fd, h, &hello)) return refuse("the target " + to + " closed the connection");
  if (!RecvReply(fd, static_cast<uint16_t>(Op::kHello), kStepMs, &rh, &text)) {
    return refuse("the target " + to + " did not answer (is it an oriond of this version?)");
  }
  if (rh.status != 0) return refuse("the target refused it: " + std::string(text.c_str()));
  // The program's pinned buffers keep their place in its data window: the target's must be laid
  // out alike (its ready answer names its channel size; a shared-memory session's is its region's).
  uint64_t target_channel = 0;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), target_channel);
  if (err != std::errc() || end != text.data() + text.size() || text.empty()) {
    return refuse("the target " + to + " did not say how its data window is laid out");
  }
  if (target_channel != p_.channel_bytes) {
    return refuse("the target's data window is laid out for channels of " + std::to_string(target_channel >> 20) +
                  " MiB and this session's for " + std::to_string(p_.channel_bytes >> 20) +
                  " MiB (shm_buffer_size must match, and a region's channel size)");
  }
  SocketWriter manifest(fd);
  if (!SnapshotManifest(manifest, &why)) return refuse(why);
  move_fd_ = fd;
  closer.fd = -1;
  move_prepared_ = false;
  move_asked_ms_ = MonotonicMs();
  return true;
}

bool Session::MoveReady() {
  if (move_prepared_ || move_fd_ < 0) return true;
  if (!WaitFd(move_fd_, POLLIN, 0)) return MonotonicMs() - move_asked_ms_ >= static_cast<uint64_t>(kPrepareMs);
  FrameHeader rh{};
  std::string text;
  if (RecvReply(move_fd_, static_cast<uint16_t>(Op::kHello), kIoMs, &rh, &text) && rh.status == 0 &&
      text == "prepared") {
    move_prepared_ = true;
    p_.log->info("sess={} the target prepared the move in {} ms", p_.session_id, MonotonicMs() - move_asked_ms_);
    return true;
  }
  const std::string why = rh.status != 0 ? "the target refused it: " + std::string(text.c_str())
                                         : "the target " + move_to_ + " broke the connection while preparing";
  p_.log->warn("sess={} not moved to {}: {}", p_.session_id, move_to_, why);
  Answer(&move_asker_, "error session " + std::to_string(p_.session_id) + " not moved: " + why);
  ::close(move_fd_);
  move_fd_ = -1;
  move_to_.clear();
  move_back_.clear();
  return false;
}

int Session::MoveOut(const FrameHeader& frame, std::atomic<uint64_t>* busy) {
  auto& log = *p_.log;
  const std::string to = move_to_;
  const std::string back = move_back_;
  move_to_.clear();
  move_back_.clear();
  // Connected, admitted and prepared at the request (PrepareMove): what remains is the pause.
  const int fd = move_fd_;
  move_fd_ = -1;
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  const std::string sess = "session " + std::to_string(p_.session_id);
  auto refuse = [&](const std::string& why) {
    log.warn("sess={} not moved to {}: {}", p_.session_id, to, why);
    Answer(&move_asker_, "error " + sess + " not moved: " + why);
    return kMoveRefused;
  };
  const bool shm = p_.socket_fd < 0;
  if (fd < 0) return refuse("the move was not prepared");
  if (!move_prepared_) {
    log.info("sess={} moving before the target said it prepared the move ({} ms since the request)", p_.session_id,
             MonotonicMs() - move_asked_ms_);
  }
  if (static_cast<Op>(frame.op) == Op::kGoodbye) return refuse("the program is ending");
  const uint64_t t0 = MonotonicMs();
  std::string why;
  FrameHeader rh{};
  std::string text;

  // Snapshot drains first: every frame before this one has executed, and its work completed.
  SocketWriter out(fd);
  if (!Snapshot(out, &why)) return refuse(why);
  // A target slower than kPrepareMs to prepare says so first, then confirms the restore.
  bool confirmed = RecvReply(fd, static_cast<uint16_t>(Op::kHello), kStepMs, &rh, &text);
  if (confirmed && !move_prepared_ && rh.status == 0 && text == "prepared")
    confirmed = RecvReply(fd, static_cast<uint16_t>(Op::kHello), kStepMs, &rh, &text);
  if (!confirmed) return refuse("the target " + to + " did not confirm the restore");
  if (rh.status != 0) return refuse("the target could not restore it: " + std::string(text.c_str()));
  if (text.size() != kShareTokenLen || !ValidShareToken(text.c_str(), kShareTokenLen + 1)) {
    return refuse("the target answered a malformed resume token");
  }

  // From here on the target holds the session: the client is told to go there.
  MovedRep moved{};
  std::snprintf(moved.address, sizeof moved.address, "%s", to.c_str());
  std::snprintf(moved.token, sizeof moved.token, "%s", text.c_str());
  std::snprintf(moved.back_token, sizeof moved.back_token, "%s", back.c_str());
  const uint64_t sent_ms = MonotonicMs();
  const bool told = Reply(frame, kStatusMoved, &moved, sizeof moved);
  busy->store(busy->load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);  // the client goes now
  if (!told) {
    log.warn("sess={} the client went away during its move to {}", p_.session_id, to);
    Answer(&move_asker_, "error " + sess + ": the program went away during the move");
    return kExitClientGone;
  }
  // The target confirms the program, or the program comes back (it could not reach the target, or
  // the target refused it): this worker still holds the whole session until then.
  // A shared-memory session's program comes back on its channel, with the back token in a
  // kHelloResume; anything else there ends the session.
  RingCheck ring;
  std::vector<uint8_t> scratch;
  if (shm && !back.empty()) {
    ring = [&](FrameHeader* came) {
      ivshmem::FrameView f{};
      bool got = false;
      if (Status s = ch_->Pop(&f, &scratch, &got); !s.ok()) return -1;
      if (!got) return 0;
      HelloReq back_hello{};
      if (f.header.op != static_cast<uint16_t>(Op::kHello) || f.header.payload_len != sizeof back_hello ||
          (f.header.flags & kFlagWantsReply) == 0)
        return -1;
      std::memcpy(&back_hello, f.payload, sizeof back_hello);
      if (back_hello.kind != kHelloResume || back_hello.share[kShareTokenLen] != '\0' ||
          std::memcmp(back_hello.share, back.data(), kShareTokenLen) != 0)
        return -1;
      if (!ch_->Done(f.header, f.payload).ok()) return -1;
      *came = f.header;
      return 1;
    };
  }
  const Outcome outcome = AwaitOutcome(fd, shm || back.empty() ? -1 : p_.control_fd, ring);
  const uint64_t t1 = MonotonicMs();
  if (outcome.violation) {
    ::close(fd);  // the target's copy ends
    closer.fd = -1;
    log.error("sess={} protocol violation: the program sent something other than its way back during its move",
              p_.session_id);
    Answer(&move_asker_, "error " + sess + ": the program broke its move");
    ch_->Closing(CUDA_ERROR_ILLEGAL_STATE);
    return kExitViolation;
  }
  if (outcome.on_ring || outcome.client >= 0) {
    ::close(fd);  // the target's copy ends: its worker sees the connection close
    closer.fd = -1;
    if (outcome.client >= 0) {  // over TCP: its new connection (else its own channel)
      ch_->Adopt(outcome.client);
      p_.socket_fd = outcome.client;
    }
    int code = 0;
    if (!Welcome(outcome.hello, &code)) return code;
    log.warn("sess={} not moved to {}: the program could not resume there and came back after {} ms", p_.session_id, to,
             t1 - sent_ms);
    Answer(&move_asker_,
           "error " + sess + " not moved: the program could not resume at " + to + " and runs here again");
    return kMoveCameBack;
  }
  if (!outcome.committed) {
    log.error("sess={} moved to {}, but the target did not confirm the client within {} ms", p_.session_id, to,
              kCommitMs);
    Answer(&move_asker_, "error " + sess + " was sent to " + to + ", but the program did not arrive there");
    return kExitMoved;
  }
  // What the device memory became on the wire (snapshot_chunks.h): chunks sent as they are, all
  // zero (nothing but a head), and lz4-compressed.
  const ChunkCounts& c = out.chunks;
  const std::string memory = std::to_string(c.memory) + " bytes of device memory: " + std::to_string(c.raw) + " raw, " +
                             std::to_string(c.zero) + " zero, " + std::to_string(c.lz4) + " lz4 chunks";
  log.info("sess={} moved to {}: {} bytes of state in {} ms ({}); the program resumed there in {} ms", p_.session_id,
           to, out.bytes(), sent_ms - t0, memory, t1 - sent_ms);
  Answer(&move_asker_, "ok " + sess + " moved to " + to + " (" + std::to_string(out.bytes()) + " bytes in " +
                           std::to_string(t1 - t0) + " ms; " + memory + ")");
  return kExitMoved;
}

int Session::MigrateIn(const FrameHeader& hello_header) {
  auto& log = *p_.log;
  const int fd = p_.migrate_fd;
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd}, route{p_.route_fd};
  auto fail = [&](int32_t status, const std::string& why, int code) {
    log.error("sess={} the move in failed: {}", p_.session_id, why);
    const FrameHeader h =
        ReplyHeader(hello_header, status, static_cast<uint32_t>(std::min<size_t>(why.size(), kMaxText)));
    (void)SendFrame(fd, h, why.data());
    return code;
  };
  std::string why;
  if (!StartBackend(&why)) return fail(CUDA_ERROR_NO_DEVICE, why, kExitBackendFailed);
  // Ready, with the channel size its window is laid out for (the source checks it is its own).
  const std::string channel = std::to_string(p_.channel_bytes);
  if (!SendFrame(fd, ReplyHeader(hello_header, 0, static_cast<uint32_t>(channel.size())), channel.data()))
    return kExitClientGone;
  const uint64_t t0 = MonotonicMs();
  SocketReader in(fd, [&] {
    static constexpr char kPrepared[] = "prepared";
    log.info("sess={} prepared the manifest's memory in {} ms", p_.session_id, MonotonicMs() - t0);
    return SendFrame(fd, ReplyHeader(hello_header, 0, sizeof kPrepared - 1), kPrepared);
  });
  if (!Restore(in, &why)) return fail(CUDA_ERROR_INVALID_VALUE, why, kExitViolation);
  const std::string& token = p_.resume_token;
  if (!SendFrame(fd, ReplyHeader(hello_header, 0, static_cast<uint32_t>(token.size())), token.data())) {
    log.warn("sess={} the source went away before the program was sent here", p_.session_id);
    return kExitClientGone;
  }
  log.info("sess={} restored in {} ms; waiting for the program", p_.session_id, MonotonicMs() - t0);

  // The program's connection, from oriond once its kHelloResume carried the token: the Hello's
  // header with the descriptor. Meanwhile the source's connection stays quiet; it closes when the
  // program went back there (it could not reach this oriond), and this copy then ends at once.
  FrameHeader client_hello{};
  int client = -1;
  pollfd wait[2] = {{p_.route_fd, POLLIN, 0}, {fd, POLLIN, 0}};
  const int ready = ::poll(wait, 2, kResumeMs);
  if (ready > 0 && wait[1].revents != 0 && wait[0].revents == 0) {
    log.warn("sess={} the program went back to the source; the moved session ends here", p_.session_id);
    return kExitClientGone;
  }
  if (ready > 0 && wait[0].revents != 0 &&
      RecvWithFd(p_.route_fd, &client_hello, sizeof client_hello, &client, 0) != sizeof client_hello && client >= 0) {
    ::close(client);
    client = -1;
  }
  if (client < 0) {
    log.warn("sess={} the program did not come within {} ms; the moved session ends", p_.session_id, kResumeMs);
    return kExitClientGone;
  }
  const int flags = fcntl(client, F_GETFL);
  fcntl(client, F_SETFL, flags & ~O_NONBLOCK);
  // The socketpair the connection came on is this worker's control socket from now on (oriond
  // uses it so too): the session can move on, or back.
  route.fd = -1;
  p_.control_fd = p_.route_fd;
  p_.route_fd = -1;
  WatchMoveRequests(p_.control_fd);
  ch_->Adopt(client);
  p_.socket_fd = client;
  int code = 0;
  if (!Welcome(client_hello, &code)) return code;
  (void)SendFrame(fd, ReplyHeader(hello_header, 0, 0), nullptr);  // committed: the source may go
  ::close(fd);
  closer.fd = -1;
  log.info("sess={} the program resumed here", p_.session_id);
  return Serve();
}

}  // namespace orion::host::detail
