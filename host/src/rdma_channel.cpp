// A session over RDMA (RC queue pair). The TCP connection the client said Hello on stays open: it
// carries the Welcome and the RdmaConnect exchange, then only signals liveness (the client closing
// it ends the session; bytes on it are a violation). Frames arrive as SENDs into receive buffers
// (several frames may share one), the window bytes a frame reads arrive before it by RDMA WRITE
// straight into this worker's registered window copy; the bytes a frame writes go back by RDMA
// WRITE before the reply's SEND. docs/spec/frames.md, "RDMA".
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "orion/common/clock.h"
#include "orion/host/session.h"
#include "orion/rdma/endpoint.h"

namespace orion::host {
namespace {

constexpr uint32_t kRecvSlots = 32;

class RdmaSessionChannel final : public SessionChannel {
 public:
  RdmaSessionChannel(int fd, uint64_t channel_bytes, uint64_t stall_ms, uint32_t session,
                     std::shared_ptr<spdlog::logger> log)
      : fd_(fd),
        stall_ms_(stall_ms),
        session_(session),
        log_(std::move(log)),
        layout_(ivshmem::ChannelLayout::Compute(channel_bytes)) {
    void* p = mmap(nullptr, layout_.window_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      init_error_ = "no memory for the session's window";
      return;
    }
    window_ = static_cast<uint8_t*>(p);
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      init_error_ = std::string("getsockname: ") + std::strerror(errno);
      return;
    }
    auto port = rdma::FindPort(reinterpret_cast<sockaddr*>(&ss));
    if (!port.ok()) {
      init_error_ = port.status().message();
      return;
    }
    port_ = port->Describe();
    auto ep = rdma::Endpoint::Create(*port, window_, layout_.window_bytes, nullptr, kRecvSlots);
    if (!ep.ok()) {
      init_error_ = ep.status().message();
      return;
    }
    ep_ = std::move(*ep);
  }
  ~RdmaSessionChannel() override {
    ep_.reset();  // the queue pair and registrations go before the memory they cover
    if (window_ != nullptr) munmap(window_, layout_.window_bytes);
    ::close(fd_);
  }
  uint8_t* window() override { return window_; }
  const ivshmem::ChannelLayout& layout() const override { return layout_; }

  Status Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) override {
    *got = false;
    if (!connected_) {
      if (Status s = Exchange(); !s.ok()) return s;
    }
    if (msg_ == nullptr) {
      if (Status s = ep_->PollSend(); !s.ok()) return s;
      if (Status s = ep_->PollRecv(&msg_, &msg_len_); !s.ok()) return s;
      if (msg_ == nullptr) {
        // The TCP socket must stay silent: bytes on it are a violation (reported here, as Pop's).
        if (socket_readable_ || (++idle_pops_ & 0x3ff) == 0) {
          socket_readable_ = false;
          return SocketCheck();
        }
        return Status::Ok();
      }
      at_ = 0;
    }
    // A message holds one or more whole frames, back to back. Header copied out once.
    const uint32_t left = msg_len_ - at_;
    if (left < sizeof(FrameHeader)) return DataLoss("a message ends inside a frame header");
    FrameHeader h;
    std::memcpy(&h, msg_ + at_, sizeof h);
    if (h.magic != kFrameMagic) return DataLoss("frame has a bad magic");
    if (h.version != kProtocolVersion) return DataLoss("frame protocol version " + std::to_string(h.version));
    if (h.payload_len > kMaxPayload || h.payload_len > left - sizeof h) return DataLoss("frame payload is too large");
    if (scratch->size() < h.payload_len) scratch->resize(std::max<size_t>(h.payload_len, 256));
    if (h.payload_len != 0) std::memcpy(scratch->data(), msg_ + at_ + sizeof h, h.payload_len);  // data() may be null
    at_ += static_cast<uint32_t>(sizeof h) + h.payload_len;
    if (at_ == msg_len_) {
      msg_ = nullptr;
      if (Status s = ep_->RepostLast(); !s.ok()) return s;
    }
    WindowRanges r;
    if (!FrameWindowRanges(h.op, scratch->data(), h.payload_len, &r)) return DataLoss("malformed frame");
    for (uint32_t i = 0; i < r.nreads; ++i) {
      const WindowRange& w = r.reads[i];
      // The bytes were written into our window before this SEND; they must lie inside it.
      if (!InWindow(w, layout_.window_bytes)) {
        return DataLoss("frame reads outside the window");
      }
    }
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
      if (Status s = Room(1); !s.ok()) return s;
      if (Status s = ep_->PostWindowWrite(w.offset, w.bytes); !s.ok()) return s;
    }
    if (r.nreads > 0) {
      // The window bytes this frame read are consumed: the client may reuse that staging.
      if (Status s = Room(1); !s.ok()) return s;
      if (Status s = ep_->PostDoneWrite(req.seq); !s.ok()) return s;
    }
    return Status::Ok();
  }

  Status Reply(const FrameHeader& h, const void* payload, uint32_t len) override {
    if (!connected_) {  // the Welcome (or a refusal) travels on the TCP socket
      if (!SendAll(&h, sizeof h) || (len != 0 && !SendAll(payload, len)))
        return Unavailable("cannot send to the client");
      return Status::Ok();
    }
    if (len > rdma::kSlotBytes - sizeof h) return Internal("reply larger than a send buffer");
    if (Status s = Room(1); !s.ok()) return s;
    uint8_t* b = ep_->SendBuffer();
    std::memcpy(b, &h, sizeof h);
    if (len != 0) std::memcpy(b + sizeof h, payload, len);
    return ep_->PostSend(static_cast<uint32_t>(sizeof h) + len);
  }

  std::string ClientGone(uint64_t, uint64_t*, uint64_t*) const override { return SocketPeerClosed(fd_); }
  Status Idle(uint64_t) override {
    if (connected_) {
      if (Status s = ep_->PollSend(); !s.ok()) return s;
    }
    Status s = SocketCheck();
    if (s.code() == Code::kDataLoss) {
      socket_readable_ = true;  // the next Pop reports it
      return Status::Ok();
    }
    return s;
  }

  bool WaitIdle(int timeout_ms) override {
    if (!connected_ || msg_ != nullptr) return false;
    // Arm, then look once more (a completion between the last poll and the arm raises no event).
    bool any = false;
    if (!ep_->ArmRecv().ok() || !ep_->PeekRecv(&any).ok() || any) return true;
    pollfd p[2] = {{ep_->completion_fd(), POLLIN, 0}, {fd_, POLLIN, 0}};
    if (poll(p, 2, timeout_ms) > 0) {
      if (p[0].revents & POLLIN) ep_->AckRecvEvent();
      if (p[1].revents != 0) socket_readable_ = true;
    }
    return true;
  }
  void Serving() override {}
  void Closing(int32_t) override { ::shutdown(fd_, SHUT_RDWR); }

 private:
  // After the Welcome: the client's RdmaConnect on the TCP socket, our half back, queue pair up.
  Status Exchange() {
    if (ep_ == nullptr) return Unavailable("RDMA setup failed in the worker: " + init_error_);
    FrameHeader h;
    RdmaConnectInfo peer;
    if (!RecvAll(&h, sizeof h)) return Unavailable("client sent no RdmaConnect");
    if (h.magic != kFrameMagic || h.version != kProtocolVersion || h.op != static_cast<uint16_t>(Op::kRdmaConnect) ||
        h.payload_len != sizeof peer) {
      return DataLoss("the frame after an RDMA Welcome is not an RdmaConnect");
    }
    if (!RecvAll(&peer, sizeof peer)) return Unavailable("client sent no RdmaConnect");
    if (Status s = ep_->Connect(peer); !s.ok()) return s.code() == Code::kDataLoss ? s : Unavailable(s.message());
    const RdmaConnectInfo mine = ep_->Local();
    const FrameHeader r = ReplyHeader(h, 0, sizeof mine);
    if (!SendAll(&r, sizeof r) || !SendAll(&mine, sizeof mine)) return Unavailable("cannot send to the client");
    connected_ = true;
    log_->info("sess={} RDMA queue pair {} on {} connected to client queue pair {} ({})", session_, mine.qpn, port_,
               peer.qpn, rdma::GidText(peer.gid));
    return Status::Ok();
  }

  // Room for `wrs` work requests and a free send buffer; waits for completions, but not for a
  // client that stopped taking them (closed socket, or net_stall_ms).
  Status Room(uint32_t wrs) {
    const uint64_t start = MonotonicMs();
    for (uint32_t spins = 0;; ++spins) {
      if (Status s = ep_->PollSend(); !s.ok()) return s;
      if (ep_->CanPost(wrs)) return Status::Ok();
      if ((spins & 0x3ff) == 0x3ff) {
        if (Status s = SocketCheck(); !s.ok()) return s;
        if (MonotonicMs() - start > stall_ms_) return Unavailable("client stopped taking replies");
        usleep(100);
      }
    }
  }

  Status SocketCheck() {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return Status::Ok();
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return Unavailable("client closed the connection");
    if (n > 0) return connected_ ? DataLoss("bytes on the TCP socket of an RDMA session") : Status::Ok();
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
    return Unavailable(std::string("connection error: ") + std::strerror(errno));
  }

  bool RecvAll(void* p, size_t len) {
    auto* b = static_cast<uint8_t*>(p);
    while (len > 0) {
      pollfd pfd{fd_, POLLIN, 0};
      if (poll(&pfd, 1, static_cast<int>(stall_ms_)) <= 0) return false;
      const ssize_t n = ::recv(fd_, b, len, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      b += n;
      len -= static_cast<size_t>(n);
    }
    return true;
  }
  bool SendAll(const void* p, size_t len) {
    const auto* b = static_cast<const uint8_t*>(p);
    while (len > 0) {
      const ssize_t n = ::send(fd_, b, len, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      b += n;
      len -= static_cast<size_t>(n);
    }
    return true;
  }

  int fd_;
  uint64_t stall_ms_;
  uint32_t session_;
  std::shared_ptr<spdlog::logger> log_;
  ivshmem::ChannelLayout layout_;
  uint8_t* window_ = nullptr;
  std::string init_error_;
  std::string port_;
  std::unique_ptr<rdma::Endpoint> ep_;
  bool connected_ = false;
  const uint8_t* msg_ = nullptr;  // the message being taken apart, and where its next frame starts
  uint32_t msg_len_ = 0;
  uint32_t at_ = 0;
  uint32_t idle_pops_ = 0;
  bool socket_readable_ = false;  // the TCP socket has something (EOF or bytes) to look at
};

}  // namespace

std::unique_ptr<SessionChannel> MakeRdmaSessionChannel(int fd, uint64_t channel_bytes, uint64_t stall_ms,
                                                       uint32_t session, std::shared_ptr<spdlog::logger> log) {
  return std::make_unique<RdmaSessionChannel>(fd, channel_bytes, stall_ms, session, std::move(log));
}

}  // namespace orion::host
