// A session over TCP. Frames are the same as on shared memory; the data window is a private copy
// on each end, kept in step by the window ranges each request reads (their bytes follow the frame)
// and writes (oriond sends them back as WindowData before the reply). docs/spec/frames.md, "TCP".
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <mutex>

#include "orion/common/clock.h"
#include "orion/host/session.h"

namespace orion::host {
namespace {

class TcpSessionChannel final : public SessionChannel {
 public:
  TcpSessionChannel(int fd, std::shared_ptr<tls::Stream> stream, uint64_t channel_bytes, uint64_t stall_ms)
      : fd_(fd),
        stream_(stream != nullptr ? std::move(stream) : tls::Stream::Plain(fd)),
        stall_ms_(static_cast<int>(stall_ms)),
        layout_(ivshmem::ChannelLayout::Compute(channel_bytes)) {
    void* p = mmap(nullptr, layout_.window_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    window_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~TcpSessionChannel() override {
    if (window_ != nullptr) munmap(window_, layout_.window_bytes);
    if (fd_ >= 0) ::close(fd_);
  }
  uint8_t* window() override { return window_; }
  const ivshmem::ChannelLayout& layout() const override { return layout_; }

  Status Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) override {
    *got = false;
    if (window_ == nullptr) return Internal("no memory for the session's window");
    if (Status s = Fill(false); !s.ok()) return s;
    const size_t have = in_.size() - at_;
    FrameHeader h{};
    if (have >= sizeof h) {
      std::memcpy(&h, in_.data() + at_, sizeof h);  // the one read of the header
      if (h.magic != kFrameMagic) return DataLoss("frame has a bad magic");
      if (h.version != kProtocolVersion) return DataLoss("frame protocol version " + std::to_string(h.version));
      if (h.payload_len > kMaxPayload) return DataLoss("frame payload is too large");
    }
    if (have < sizeof h || have < sizeof h + h.payload_len) {
      // A frame begun but not finished: the client has this long to send the rest, counted from
      // when this worker could first see it (not while it executed the frames before it: a long
      // kernel is not the client's stall).
      if (have != partial_bytes_) {
        partial_bytes_ = have;
        partial_since_ = MonotonicMs();
      } else if (have != 0 && MonotonicMs() - partial_since_ > static_cast<uint64_t>(stall_ms_)) {
        return DataLoss("client stopped in the middle of a frame for " + std::to_string(stall_ms_) + " ms");
      }
      return Status::Ok();
    }
    if (scratch->size() < h.payload_len) scratch->resize(std::max<size_t>(h.payload_len, 256));
    // An empty scratch has no buffer (data() may be null): memcpy(null, _, 0) is undefined behaviour.
    if (h.payload_len != 0) std::memcpy(scratch->data(), in_.data() + at_ + sizeof h, h.payload_len);
    at_ += sizeof h + h.payload_len;
    WindowRanges r;
    if (!FrameWindowRanges(h.op, scratch->data(), h.payload_len, &r)) return DataLoss("malformed frame");
    for (uint32_t i = 0; i < r.nreads; ++i) {
      const WindowRange& w = r.reads[i];
      if (!InWindow(w, layout_.window_bytes)) {
        return DataLoss("frame reads outside the window");
      }
      // The window bytes follow the frame: what is buffered, then straight into the window.
      uint64_t done = std::min<uint64_t>(w.bytes, in_.size() - at_);
      std::memcpy(window_ + w.offset, in_.data() + at_, done);
      at_ += done;
      while (done < w.bytes) {
        const ssize_t n = RecvWait(window_ + w.offset + done, w.bytes - done);
        // Closed or reset (a client killed with replies unread resets its connection): the client
        // is gone, as Fill says; only a client that stops sending mid-frame breaks the protocol.
        if (n == 0) return Unavailable("client closed the connection in a frame");
        if (n == tls::kError) return Unavailable("connection error in a frame: " + stream_->error());
        if (n < 0) return DataLoss("client stalled in a frame");
        done += static_cast<uint64_t>(n);
      }
    }
    Compact();
    partial_bytes_ = SIZE_MAX;  // the next Pop, after this frame executed, starts the stall clock afresh
    f->header = h;
    f->payload = scratch->data();
    *got = true;
    return Status::Ok();
  }

  Status Done(const FrameHeader& req, const uint8_t* payload) override {
    WindowRanges r;
    if (!FrameWindowRanges(req.op, payload, req.payload_len, &r)) return Status::Ok();
    for (uint32_t i = 0; i < r.nwrites; ++i) {
      const WindowRange& w = r.writes[i];
      if (!InWindow(w, layout_.window_bytes)) continue;  // refused op
      const FrameHeader h = MakeFrameHeader(static_cast<uint16_t>(Op::kWindowData), req.seq, sizeof(WindowDataHdr));
      const WindowDataHdr d{w.offset, w.bytes};
      std::lock_guard<std::mutex> l(send_mu_);  // one whole message: no keepalive inside it
      sent_.fetch_add(1, std::memory_order_relaxed);
      if (!SendAll(&h, sizeof h) || !SendAll(&d, sizeof d) || !SendAll(window_ + w.offset, w.bytes)) {
        return Unavailable("cannot send to the client");
      }
    }
    return Status::Ok();
  }

  Status Reply(const FrameHeader& h, const void* payload, uint32_t len) override {
    // One send for header and payload: the client wakes once, on the whole reply.
    out_.resize(sizeof h + len);
    std::memcpy(out_.data(), &h, sizeof h);
    if (len != 0) std::memcpy(out_.data() + sizeof h, payload, len);
    std::lock_guard<std::mutex> l(send_mu_);
    sent_.fetch_add(1, std::memory_order_relaxed);
    if (!SendAll(out_.data(), out_.size())) return Unavailable("cannot send to the client");
    return Status::Ok();
  }
  uint64_t MessagesSent() const override { return sent_.load(std::memory_order_relaxed); }
  void Keepalive() override {
    const FrameHeader h = MakeFrameHeader(static_cast<uint16_t>(Op::kKeepalive), 0, 0);
    std::lock_guard<std::mutex> l(send_mu_);
    sent_.fetch_add(1, std::memory_order_relaxed);
    (void)SendAll(&h, sizeof h);  // a client that cannot take it is caught by the next reply
  }
  uint32_t SpinPolls() const override { return 0; }

  std::string ClientGone(uint64_t, uint64_t*, uint64_t*) const override { return SocketPeerClosed(fd_); }
  Status Idle(uint64_t) override { return Fill(false); }
  bool WaitIdle(int timeout_ms) override {
    // Pop found no whole frame: whatever is buffered is a partial one, so wait for more bytes
    // (TLS may hold some decrypted already: then there is no wait).
    if (stream_->Buffered()) return true;
    pollfd pfd{fd_, POLLIN, 0};
    poll(&pfd, 1, timeout_ms);
    return true;
  }
  bool Adopt(int fd) override {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
    stream_ = tls::Stream::Plain(fd);
    in_.clear();
    at_ = 0;
    partial_bytes_ = 0;
    return true;
  }
  void Serving() override {}
  void Closing(int32_t) override { ::shutdown(fd_, SHUT_RDWR); }

 private:
  // Reads what is available (or waits when `wait`). kUnavailable when the client closed.
  Status Fill(bool wait) {
    if (at_ > 0 && at_ == in_.size()) {
      in_.clear();
      at_ = 0;
    }
    uint8_t buf[65536];
    for (;;) {
      const ssize_t n = stream_->Read(buf, sizeof buf);
      if (n > 0) {
        in_.insert(in_.end(), buf, buf + n);
        if ((static_cast<size_t>(n) < sizeof buf && !stream_->Buffered()) || in_.size() - at_ > (1u << 20))
          return Status::Ok();
        continue;
      }
      if (n == 0) return Unavailable("client closed the connection");
      if (n == tls::kAgain) {
        if (!wait) return Status::Ok();
        pollfd pfd{fd_, stream_->wants(), 0};
        (void)poll(&pfd, 1, -1);
        continue;
      }
      return Unavailable("connection error: " + stream_->error());
    }
  }
  void Compact() {
    if (at_ > (1u << 20) || at_ == in_.size()) {
      in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(at_));
      at_ = 0;
    }
  }
  // Reads some of [p, p+len), waiting up to the stall limit: > 0 bytes; 0 closed; < 0 stalled or failed.
  // Reads up to `len` bytes, waiting at most stall_ms_ for each: the count; 0 when the client
  // closed; tls::kError when the connection failed (stream_->error() says why); -1 when nothing came
  // within stall_ms_.
  ssize_t RecvWait(uint8_t* p, uint64_t len) {
    for (;;) {
      const ssize_t n = stream_->Read(p, len);
      if (n != tls::kAgain) return n;
      pollfd pfd{fd_, stream_->wants(), 0};
      if (poll(&pfd, 1, stall_ms_) <= 0) return -1;
    }
  }
  std::vector<uint8_t> out_;       // a reply being sent (header and payload)
  std::mutex send_mu_;             // the session thread's messages and the watchdog's keepalives
  std::atomic<uint64_t> sent_{0};  // messages sent (the watchdog sees when the client last heard)
  bool SendAll(const void* p, uint64_t len) {
    const auto* b = static_cast<const uint8_t*>(p);
    while (len > 0) {
      const ssize_t n = stream_->Write(b, len);
      if (n > 0) {
        b += n;
        len -= static_cast<uint64_t>(n);
        continue;
      }
      if (n == tls::kAgain) {
        pollfd pfd{fd_, stream_->wants(), 0};
        if (poll(&pfd, 1, stall_ms_) <= 0) return false;
        continue;
      }
      return false;
    }
    return true;
  }

  int fd_;
  std::shared_ptr<tls::Stream> stream_;  // the connection's bytes: plain, or TLS
  int stall_ms_;
  ivshmem::ChannelLayout layout_;
  size_t partial_bytes_ = 0;  // bytes of an unfinished frame, and since when they stand still
  uint64_t partial_since_ = 0;
  uint8_t* window_ = nullptr;
  std::vector<uint8_t> in_;
  size_t at_ = 0;
};

}  // namespace

std::string SocketPeerClosed(int fd) {
  // The peer closed (a killed client's kernel closes its socket): POLLRDHUP, without reading.
  pollfd pfd{fd, POLLRDHUP, 0};
  if (poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0)
    return "the client closed the connection";
  return "";
}

std::unique_ptr<SessionChannel> MakeTcpSessionChannel(int fd, std::shared_ptr<tls::Stream> stream,
                                                      uint64_t channel_bytes, uint64_t stall_ms) {
  return std::make_unique<TcpSessionChannel>(fd, std::move(stream), channel_bytes, stall_ms);
}

}  // namespace orion::host
