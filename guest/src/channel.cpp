#include "channel.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "orion/common/net.h"
#include "orion/common/text.h"

namespace orion::guest {
namespace {

uint64_t MonoNs() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

constexpr uint64_t kMinBytesPerSecond = 1ull << 20;  // a message in progress must move at least this fast

}  // namespace

Result<std::unique_ptr<TcpFrameChannel>> TcpFrameChannel::Connect(const std::string& address, bool tls,
                                                                  const std::string& tls_ca) {
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) return InvalidArgument("ORION_SERVER='" + address + "' is not host:port");
  auto connected = ConnectTcp(address, 5000, "oriond at ");  // an unreachable host is an error, not a hang
  if (!connected.ok()) return connected.status();
  const int fd = *connected;
  // The socket stays non-blocking: the stream's calls return at once and the channel polls.
  const int one = 1, idle = 10, intvl = 2, cnt = 3;  // a dead server is noticed in ~16 s
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  if (!tls) return std::unique_ptr<TcpFrameChannel>(new TcpFrameChannel(fd, tls::Stream::Plain(fd), address));
  // TLS: the handshake, within the connect limit (5 s).
  auto fail = [&](const std::string& why) {
    ::close(fd);
    return Unavailable("TLS to oriond at " + address + ": " + why);
  };
  static std::mutex ctx_mu;
  static auto* contexts = new std::map<std::string, std::shared_ptr<tls::Context>>;  // by CA file
  std::shared_ptr<tls::Context> ctx;
  {
    std::lock_guard<std::mutex> l(ctx_mu);
    auto& c = (*contexts)[tls_ca];
    if (c == nullptr) {
      auto made = tls::Context::Client(tls_ca);
      if (!made.ok()) return fail(made.status().message());
      c = *made;
    }
    ctx = c;
  }
  auto made = tls::TlsStream::Connect(ctx, fd, host);
  if (!made.ok()) return fail(made.status().message());
  std::unique_ptr<tls::TlsStream> stream = std::move(made).value();
  const uint64_t deadline = MonoNs() + 5000000000ull;
  for (;;) {
    const ssize_t r = stream->Handshake();
    if (r == 1) break;
    if (r == tls::kError) {
      std::string why = stream->error();
      if (why == "TLS handshake: the peer closed the connection") {
        why +=
            " (an oriond that serves plain TCP closes on a TLS client: connect without tls:// and ORION_TLS; "
            "else its server.log says why it refused)";
      }
      stream.reset();
      return fail(why);
    }
    const uint64_t now = MonoNs();
    pollfd pfd{fd, stream->wants(), 0};
    if (now >= deadline || poll(&pfd, 1, static_cast<int>((deadline - now) / 1000000) + 1) == 0) {
      stream.reset();
      return fail("no TLS handshake within 5 s");
    }
  }
  return std::unique_ptr<TcpFrameChannel>(new TcpFrameChannel(fd, std::move(stream), address));
}

TcpFrameChannel::TcpFrameChannel(int fd, std::unique_ptr<tls::Stream> stream, std::string address) noexcept
    : fd_(fd), stream_(std::move(stream)), address_(std::move(address)) {
  desc_.state.store(ivshmem::kChannelActive);
}

int TcpFrameChannel::ReleaseFd() noexcept {
  const int fd = fd_;
  fd_ = -1;
  if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

ssize_t TcpFrameChannel::ReadSome(uint8_t* p, uint64_t len, bool wait) noexcept {
  for (;;) {
    const ssize_t n = stream_->Read(p, len);
    if (n != tls::kAgain || !wait) return n;
    pollfd pfd{fd_, stream_->wants(), 0};
    if (poll(&pfd, 1, -1) < 0 && errno != EINTR) return tls::kError;
  }
}

TcpFrameChannel::~TcpFrameChannel() {
  if (window_ != nullptr) munmap(window_, window_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

bool TcpFrameChannel::SetWindow(uint64_t window_bytes) noexcept {
  void* p = mmap(nullptr, window_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  window_ = static_cast<uint8_t*>(p);
  window_bytes_ = window_bytes;
  return true;
}

void TcpFrameChannel::Fail(std::string why) noexcept {
  if (why_.empty()) why_ = std::move(why);
  desc_.state.store(ivshmem::kChannelDead, std::memory_order_release);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

uint8_t* TcpFrameChannel::Reserve(uint32_t payload_len) noexcept {
  out_.resize(sizeof(FrameHeader) + payload_len);
  return out_.data();
}

bool TcpFrameChannel::Flush() noexcept {
  if (batch_.empty()) return true;
  const bool ok = Send(batch_.data(), batch_.size());
  batch_.clear();
  return ok;
}

bool TcpFrameChannel::Commit() noexcept {
  if (desc_.state.load() != ivshmem::kChannelActive) return false;
  FrameHeader h;
  std::memcpy(&h, out_.data(), sizeof h);
  WindowRanges r;
  const bool ranges_ok = FrameWindowRanges(h.op, out_.data() + sizeof h, h.payload_len, &r);
  // What oriond may send back for this request: WindowData for exactly these ranges.
  for (uint32_t i = 0; ranges_ok && i < r.nwrites; ++i) {
    if (expected_.size() >= kMaxExpected) expected_.pop_front();
    expected_.push_back({h.seq, r.writes[i].offset, r.writes[i].bytes});
  }
  if (ranges_ok && r.nreads == 0 && (h.flags & kFlagWantsReply) == 0 && batch_.size() + out_.size() <= kBatchBytes) {
    batch_.insert(batch_.end(), out_.begin(), out_.end());
    desc_.server_done_seq.store(h.seq, std::memory_order_release);  // no staging bytes to wait for
    return true;
  }
  // The held-back frames and this one leave in one send: sent apart, the first wakes oriond's
  // worker, which on a small machine can take this CPU before the second send (a first call after
  // idle paid ~0.6 ms for that: a lone CtxSetCurrent, then its CtxSynchronize).
  if (!batch_.empty()) {
    batch_.insert(batch_.end(), out_.begin(), out_.end());
    if (!Flush()) return false;
  } else if (!Send(out_.data(), out_.size())) {
    return false;
  }
  if (ranges_ok) {
    for (uint32_t i = 0; i < r.nreads; ++i) {
      const WindowRange& w = r.reads[i];
      if (window_ == nullptr || !InWindow(w, window_bytes_)) {
        Fail("a request read outside the window");
        return false;
      }
      if (!Send(window_ + w.offset, w.bytes)) return false;
    }
  }
  // Sent: the frame's staging bytes are in the socket and may be reused.
  desc_.server_done_seq.store(h.seq, std::memory_order_release);
  return true;
}

bool TcpFrameChannel::Send(const uint8_t* p, uint64_t len) noexcept {
  // Like a message from oriond, a send must finish within the stall limit plus 1 s per MiB.
  const uint64_t start = MonoNs();
  const uint64_t limit_ns = stall_ms_ == 0 ? 0 : stall_ms_ * 1000000ull + len * 1000000000ull / kMinBytesPerSecond;
  // The common case: the socket has room, and one call sends it all. When it has not, wait for room
  // and drain replies meanwhile, so two full buffers never wait on each other.
  while (len > 0) {
    const ssize_t n = stream_->Write(p, len);
    if (n > 0) {
      p += n;
      len -= static_cast<uint64_t>(n);
      continue;
    }
    if (n == tls::kError) {
      Fail("send to oriond at " + address_ + ": " + stream_->error());
      return false;
    }
    if (limit_ns != 0 && MonoNs() - start > limit_ns) {
      Fail("oriond at " + address_ + " stopped reading: " + std::to_string(len) + " bytes unsent after " +
           std::to_string((MonoNs() - start) / 1000000) + " ms (ORION_STALL_TIMEOUT_MS=" + std::to_string(stall_ms_) +
           ")");
      return false;
    }
    // What oriond sends meanwhile is read (TLS may hold some already: no wait then).
    pollfd pfd{fd_, static_cast<short>(stream_->wants() | POLLIN), 0};
    if (stream_->Buffered()) {
      pfd.revents = POLLIN;
    } else if (poll(&pfd, 1, 1000) < 0 && errno != EINTR) {
      Fail(std::string("poll: ") + std::strerror(errno));
      return false;
    }
    if (pfd.revents & POLLIN) {
      if (!Drain(false)) return false;
    }
    if (pfd.revents & (POLLERR | POLLHUP)) {
      Fail("the connection to oriond at " + address_ + " broke");
      return false;
    }
  }
  return true;
}

bool TcpFrameChannel::Drain(bool wait) noexcept {
  uint8_t buf[65536];
  for (;;) {
    // WindowData bytes go straight into the window.
    if (pending_data_ > 0 && !in_.empty()) {
      const uint64_t n = std::min<uint64_t>(pending_data_, in_.size());
      std::memcpy(window_ + pending_offset_, in_.data(), n);
      in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(n));
      pending_offset_ += n;
      pending_data_ -= n;
      if (pending_data_ == 0) msg_start_ns_ = 0;  // complete
    }
    // Parse complete messages.
    while (pending_data_ == 0 && in_.size() >= sizeof(FrameHeader)) {
      FrameHeader h;
      std::memcpy(&h, in_.data(), sizeof h);
      if (h.magic != kFrameMagic || h.version != kProtocolVersion || h.payload_len > kMaxPayload) {
        Fail("oriond at " + address_ + " sent a malformed frame header (magic, version or length)");
        return false;
      }
      if (in_.size() < sizeof h + h.payload_len) break;
      if (h.op == static_cast<uint16_t>(Op::kKeepalive)) {
        // oriond is alive, its reply long in coming (a long kernel): heard_ns_ has moved already.
        if (h.payload_len != 0 || h.seq != 0 || h.status != 0 || h.flags != 0) {
          Fail("oriond at " + address_ + " sent a malformed Keepalive");
          return false;
        }
        in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(sizeof h));
        msg_start_ns_ = 0;
        continue;
      }
      if (h.op == static_cast<uint16_t>(Op::kWindowData)) {
        WindowDataHdr d;
        if (h.payload_len != sizeof d) {
          Fail("oriond at " + address_ + " sent a malformed WindowData");
          return false;
        }
        std::memcpy(&d, in_.data() + sizeof h, sizeof d);
        if (!AcceptWindowData(h, d)) return false;
        pending_offset_ = d.offset;
        pending_data_ = d.bytes;
        pending_total_ = sizeof h + sizeof d + d.bytes;
        in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(sizeof h + sizeof d));
        const uint64_t n = std::min<uint64_t>(pending_data_, in_.size());
        std::memcpy(window_ + pending_offset_, in_.data(), n);
        in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(n));
        pending_offset_ += n;
        pending_data_ -= n;
        if (pending_data_ == 0) msg_start_ns_ = 0;  // complete
        continue;
      }
      if (!AcceptReply(h)) return false;
      msg_start_ns_ = 0;  // complete
      ready_.emplace_back(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(sizeof h + h.payload_len));
      in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(sizeof h + h.payload_len));
    }
    if (!CheckStall()) return false;
    if (!ready_.empty() && !wait) return true;
    // Large WindowData: receive straight into the window.
    if (pending_data_ > 0 && in_.empty()) {
      const ssize_t n = ReadSome(window_ + pending_offset_, pending_data_, wait);
      if (n > 0) {
        heard_ns_ = MonoNs();
        pending_offset_ += static_cast<uint64_t>(n);
        pending_data_ -= static_cast<uint64_t>(n);
        if (pending_data_ == 0) msg_start_ns_ = 0;  // complete
        continue;
      }
      if (n != tls::kAgain) {
        Fail(n == 0 ? "oriond at " + address_ + " closed the connection in the middle of WindowData"
                    : "recv from oriond at " + address_ + ": " + stream_->error());
        return false;
      }
      return true;
    }
    const ssize_t n = ReadSome(buf, sizeof buf, wait);
    if (n > 0) {
      heard_ns_ = MonoNs();
      in_.insert(in_.end(), buf, buf + n);
      wait = false;
      continue;
    }
    if (n != tls::kAgain) {
      Fail(n == 0 ? "oriond at " + address_ + " closed the connection"
                  : "recv from oriond at " + address_ + ": " + stream_->error());
      return false;
    }
    return true;
  }
}

bool TcpFrameChannel::CheckStall() noexcept {
  if (pending_data_ == 0 && in_.empty()) {
    msg_start_ns_ = 0;
    return true;
  }
  const uint64_t now = MonoNs();
  if (msg_start_ns_ == 0) msg_start_ns_ = now;
  if (stall_ms_ == 0) return true;
  uint64_t total = sizeof(FrameHeader), have = in_.size();
  if (pending_data_ > 0) {
    total = pending_total_;
    have = pending_total_ - pending_data_ + in_.size();
  } else if (in_.size() >= sizeof(FrameHeader)) {
    FrameHeader h;
    std::memcpy(&h, in_.data(), sizeof h);
    total += h.payload_len;
  }
  const uint64_t limit_ns = stall_ms_ * 1000000ull + total * 1000000000ull / kMinBytesPerSecond;
  if (now - msg_start_ns_ <= limit_ns) return true;
  Fail("oriond at " + address_ + " stalled in the middle of " + (pending_data_ > 0 ? "WindowData" : "a frame") + ": " +
       std::to_string(have) + " of " + std::to_string(total) + " bytes in " +
       std::to_string((now - msg_start_ns_) / 1000000) + " ms (ORION_STALL_TIMEOUT_MS=" + std::to_string(stall_ms_) +
       ")");
  return false;
}

bool TcpFrameChannel::AcceptWindowData(const FrameHeader& h, const WindowDataHdr& d) noexcept {
  auto it = std::find_if(expected_.begin(), expected_.end(), [&](const Expected& e) {
    return e.seq == h.seq && e.offset == d.offset && d.bytes <= e.bytes;
  });
  if (window_ == nullptr || it == expected_.end() || !InWindow({d.offset, d.bytes}, window_bytes_)) {
    Fail("oriond at " + address_ + " sent WindowData (seq " + std::to_string(h.seq) + ", window offset " +
         std::to_string(d.offset) + ", " + std::to_string(d.bytes) +
         " bytes) that no outstanding request asked for, or that overlaps bytes already received");
    return false;
  }
  it->offset += d.bytes;
  it->bytes -= d.bytes;
  if (it->bytes == 0) expected_.erase(it);
  return true;
}

bool TcpFrameChannel::AcceptReply(const FrameHeader& h) noexcept {
  bool missing = false;
  for (auto it = expected_.begin(); it != expected_.end();) {
    if (it->seq != h.seq) {
      ++it;
      continue;
    }
    missing |= it->bytes != 0;
    it = expected_.erase(it);
  }
  if (missing && h.status == 0) {
    Fail("oriond at " + address_ + " answered seq " + std::to_string(h.seq) +
         " as successful before sending the window bytes it wrote");
    return false;
  }
  return true;
}

bool TcpFrameChannel::AwaitInput(uint32_t max_us) noexcept {
  if (fd_ < 0 || !ready_.empty() || !batch_.empty() || stream_->Buffered()) return true;  // something to do now
  pollfd pfd{fd_, POLLIN, 0};
  const timespec ts{static_cast<time_t>(max_us / 1000000), static_cast<long>(max_us % 1000000) * 1000L};
  (void)ppoll(&pfd, 1, &ts, nullptr);  // EINTR, errors: the next Pop says what happened
  return true;
}

Status ShmFrameChannel::Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) noexcept {
  if (!awaiting_) return replies_.Pop(f, scratch, got);
  *got = false;
  // SS2: acquire the reply's word; pairs with SS3 in the worker: its header, payload and (for
  // kSlotReplyInRing) its ring record are visible.
  const uint64_t word = reply_slot_->word.load(std::memory_order_acquire);
  if (static_cast<uint32_t>(word >> 32) != call_) return Status::Ok();
  awaiting_ = false;
  const auto where = static_cast<uint32_t>(word);
  if (where == ivshmem::kSlotReplyInRing) {
    if (Status s = replies_.Pop(f, scratch, got); !s.ok() || *got) return s;
    return DataLoss("the sync slot says the reply is in the reply ring, and the ring holds none");
  }
  if (where != ivshmem::kSlotReplyHere) return DataLoss("the sync slot's reply word is malformed");
  FrameHeader h;
  std::memcpy(&h, &reply_slot_->header, sizeof h);  // the one read of the header
  if (h.payload_len > ivshmem::kSyncSlotPayload) return DataLoss("a sync slot reply longer than the slot");
  if (scratch->size() < ivshmem::kSyncSlotPayload) scratch->resize(256);
  std::memcpy(scratch->data(), reply_slot_->payload, h.payload_len);
  f->header = h;
  f->payload = scratch->data();
  *got = true;
  return Status::Ok();
}

Status TcpFrameChannel::Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) noexcept {
  *got = false;
  auto broke = [&] { return Unavailable(why_.empty() ? "the connection to oriond at " + address_ + " broke" : why_); };
  if (!Flush()) return broke();
  if (ready_.empty() && (!Drain(false) || !CheckStall())) return broke();
  // A healthy connection is a live server (the Client watches this heartbeat).
  header_.server_heartbeat.fetch_add(1, std::memory_order_relaxed);
  if (ready_.empty()) return Status::Ok();
  std::vector<uint8_t>& m = ready_.front();
  std::memcpy(&f->header, m.data(), sizeof(FrameHeader));
  const uint32_t len = f->header.payload_len;
  if (scratch->size() < len) scratch->resize(std::max<size_t>(len, 256));
  if (len != 0) std::memcpy(scratch->data(), m.data() + sizeof(FrameHeader), len);  // data() may be null
  f->payload = scratch->data();
  ready_.erase(ready_.begin());
  *got = true;
  return Status::Ok();
}

}  // namespace orion::guest
