// The guest's RDMA channel (see channel.h and docs/spec/frames.md, "RDMA").
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "channel.h"
#include "orion/common/clock.h"

namespace orion::guest {
namespace {

bool SendAll(int fd, const void* p, size_t len) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (len > 0) {
    const ssize_t n = ::send(fd, b, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    b += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool RecvAll(int fd, void* p, size_t len, int timeout_ms) {
  auto* b = static_cast<uint8_t*>(p);
  while (len > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) <= 0) return false;
    const ssize_t n = ::recv(fd, b, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    b += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

constexpr int kExchangeTimeoutMs = 10000;
constexpr uint64_t kStallMs = 30000;  // oriond not taking our frames for this long: it is gone

}  // namespace

RdmaFrameChannel::RdmaFrameChannel(int fd, std::string address) noexcept : fd_(fd), address_(std::move(address)) {
  desc_.state.store(ivshmem::kChannelActive);
}

RdmaFrameChannel::~RdmaFrameChannel() {
  ep_.reset();  // the queue pair and registrations before the memory they cover
  if (window_ != nullptr) munmap(window_, window_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<RdmaFrameChannel>> RdmaFrameChannel::Connect(int fd, const rdma::Port& port, std::string address,
                                                                    uint64_t window_bytes, const FrameHeader& connect) {
  std::unique_ptr<RdmaFrameChannel> c(new RdmaFrameChannel(fd, std::move(address)));
  void* p = mmap(nullptr, window_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return ResourceExhausted("no memory for the window");
  c->window_ = static_cast<uint8_t*>(p);
  c->window_bytes_ = window_bytes;
  // oriond RDMA-writes server_done_seq (a lock-free 64-bit atomic: the same bytes as a uint64_t).
  static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t) && std::atomic<uint64_t>::is_always_lock_free);
  auto ep = rdma::Endpoint::Create(port, c->window_, window_bytes,
                                   reinterpret_cast<uint64_t*>(&c->desc_.server_done_seq), kRecvSlots);
  if (!ep.ok()) return ep.status();
  c->ep_ = std::move(*ep);
  const RdmaConnectInfo mine = c->ep_->Local();
  if (!SendAll(fd, &connect, sizeof connect) || !SendAll(fd, &mine, sizeof mine)) {
    return Unavailable("the connection to oriond broke during the RDMA exchange");
  }
  FrameHeader h;
  RdmaConnectInfo theirs;
  if (!RecvAll(fd, &h, sizeof h, kExchangeTimeoutMs)) return Unavailable("oriond did not answer RdmaConnect");
  if (h.magic != kFrameMagic || h.op != connect.op || h.seq != connect.seq) {
    return Unavailable("oriond answered RdmaConnect with something else");
  }
  if (h.status != 0 || h.payload_len != sizeof theirs) {
    return Unavailable("oriond refused RdmaConnect (status " + std::to_string(h.status) + ")");
  }
  if (!RecvAll(fd, &theirs, sizeof theirs, kExchangeTimeoutMs)) return Unavailable("oriond did not answer RdmaConnect");
  if (Status s = c->ep_->Connect(theirs); !s.ok()) return s;
  return c;
}

void RdmaFrameChannel::Fail() noexcept {
  desc_.state.store(ivshmem::kChannelDead, std::memory_order_release);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

// oriond's end of the TCP connection: closed (or unexpected bytes) means the session is over.
bool RdmaFrameChannel::SocketAlive() noexcept {
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return true;
  char c;
  const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  Fail();
  return false;
}

bool RdmaFrameChannel::Room(uint32_t wrs) noexcept {
  const uint64_t start = MonotonicMs();
  for (uint32_t spins = 0;; ++spins) {
    if (!ep_->PollSend().ok()) {
      Fail();
      return false;
    }
    if (ep_->CanPost(wrs)) return true;
    if ((spins & 0x3ff) == 0x3ff) {
      if (!SocketAlive()) return false;
      if (MonotonicMs() - start > kStallMs) {
        Fail();
        return false;
      }
      sched_yield();
    }
  }
}

uint8_t* RdmaFrameChannel::Reserve(uint32_t payload_len) noexcept {
  out_.resize(sizeof(FrameHeader) + payload_len);
  return out_.data();
}

bool RdmaFrameChannel::Flush() noexcept {
  if (batch_len_ == 0) return true;
  if (desc_.state.load() != ivshmem::kChannelActive || !Room(1)) return false;
  const uint32_t len = batch_len_;
  batch_len_ = 0;
  if (!ep_->PostSend(len).ok()) {
    Fail();
    return false;
  }
  return true;
}

bool RdmaFrameChannel::Commit() noexcept {
  if (desc_.state.load() != ivshmem::kChannelActive) return false;
  FrameHeader h;
  std::memcpy(&h, out_.data(), sizeof h);
  const auto size = static_cast<uint32_t>(out_.size());
  WindowRanges r;
  const bool ranges_ok = FrameWindowRanges(h.op, out_.data() + sizeof h, h.payload_len, &r);
  if (ranges_ok && r.nreads == 0 && (h.flags & kFlagWantsReply) == 0 && batch_len_ + size <= kBatchBytes) {
    // The current send buffer is ours once it is free; filling it does not post anything.
    if (batch_len_ == 0 && !Room(1)) return false;
    std::memcpy(ep_->SendBuffer() + batch_len_, out_.data(), size);
    batch_len_ += size;
    return true;
  }
  if (!Flush()) return false;
  if (ranges_ok) {
    for (uint32_t i = 0; i < r.nreads; ++i) {
      const WindowRange& w = r.reads[i];
      if (!InWindow(w, window_bytes_)) {
        Fail();
        return false;
      }
      // RC ordering: the WRITE's bytes are placed before oriond sees the SEND that follows.
      if (!Room(1) || !ep_->PostWindowWrite(w.offset, w.bytes).ok()) {
        Fail();
        return false;
      }
    }
  }
  if (!Room(1)) return false;
  std::memcpy(ep_->SendBuffer(), out_.data(), size);
  if (!ep_->PostSend(size).ok()) {
    Fail();
    return false;
  }
  // Staging bytes are released by oriond's done-word write (server_done_seq), not here: they are
  // read straight from this window by the WRITE, and oriond's copy is reused only once executed.
  return true;
}

Status RdmaFrameChannel::Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) noexcept {
  *got = false;
  // Made only when it is the answer: Pop runs on every poll, and the text allocates.
  auto broke = [this] { return Unavailable("the RDMA connection to oriond at " + address_ + " broke"); };
  if (!Flush() || desc_.state.load() != ivshmem::kChannelActive) return broke();
  if (msg_ == nullptr) {
    if (!ep_->PollSend().ok() || !ep_->PollRecv(&msg_, &msg_len_).ok()) {
      Fail();
      return broke();
    }
    // A healthy connection is a live server (the Client watches this heartbeat).
    header_.server_heartbeat.fetch_add(1, std::memory_order_relaxed);
    if (msg_ == nullptr) {
      if ((++idle_polls_ & 0xff) == 0 && !SocketAlive()) return broke();
      return Status::Ok();
    }
    at_ = 0;
  }
  const uint32_t left = msg_len_ - at_;
  FrameHeader h;
  if (left < sizeof h) {
    Fail();
    return Unavailable("oriond sent a malformed message");
  }
  std::memcpy(&h, msg_ + at_, sizeof h);
  if (h.magic != kFrameMagic || h.payload_len > kMaxPayload || h.payload_len > left - sizeof h) {
    Fail();
    return Unavailable("oriond sent a malformed message");
  }
  f->header = h;
  if (scratch->size() < h.payload_len) scratch->resize(std::max<size_t>(h.payload_len, 256));
  if (h.payload_len != 0) std::memcpy(scratch->data(), msg_ + at_ + sizeof h, h.payload_len);  // data() may be null
  f->payload = scratch->data();
  at_ += static_cast<uint32_t>(sizeof h) + h.payload_len;
  if (at_ == msg_len_) {
    msg_ = nullptr;
    if (!ep_->RepostLast().ok()) {
      Fail();
      return broke();
    }
  }
  *got = true;
  return Status::Ok();
}

void RdmaFrameChannel::Close() noexcept {
  // What was posted must be acknowledged before the process (and its queue pair) goes away.
  const uint64_t start = MonotonicMs();
  while (desc_.state.load() == ivshmem::kChannelActive && ep_->Outstanding() > 0 && MonotonicMs() - start < 2000) {
    if (!ep_->PollSend().ok()) break;
    sched_yield();
  }
}

}  // namespace orion::guest
