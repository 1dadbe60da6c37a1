// oriond: network clients: the TCP listener, bounded pending connections, and the Hello
// handshake (key, transport choice: RDMA or TCP) that admits them.
#include "orion/host/daemon.h"

#include "daemon_internal.h"

#include <dirent.h>
#include <signal.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "orion/common/clock.h"
#include "orion/common/fd_passing.h"
#include "orion/host/session.h"
#include "orion/host/vm_state.h"
#include "orion/ivshmem/ring.h"
#include "orion/rdma/endpoint.h"

namespace orion::host {

using namespace daemon_detail;  // NOLINT(google-build-using-namespace): the daemon's own helpers

Status Daemon::OpenListener() {
  if (config_.listen_port == 0) return Status::Ok();  // network clients disabled
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
  addrinfo* res = nullptr;
  if (getaddrinfo(config_.bind_addr.c_str(), std::to_string(config_.listen_port).c_str(), &hints, &res) != 0) {
    return InvalidArgument("bind_addr '" + config_.bind_addr + "' is not an IP address");
  }
  UniqueFd fd(socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool ok = fd && bind(fd.get(), res->ai_addr, res->ai_addrlen) == 0 && listen(fd.get(), 64) == 0;
  freeaddrinfo(res);
  if (!ok) {
    const std::string err = std::strerror(errno);
    return Unavailable("cannot listen on " + config_.bind_addr + ":" + std::to_string(config_.listen_port) + ": " +
                       err + " (-b/-p, or -p 0 for no network clients)");
  }
  listen_fd_ = std::move(fd);
  if (!config_.tls_cert.empty()) {
    auto ctx = tls::Context::Server(config_.tls_cert, config_.tls_key);
    if (!ctx.ok()) return InvalidArgument("[server] " + ctx.status().message());
    tls_ = *ctx;
    log_->info("TCP clients on {}:{} speak TLS (certificate {}): they connect to tls://{}:{} (or with ORION_TLS=1)",
               config_.bind_addr, config_.listen_port, config_.tls_cert, config_.bind_addr, config_.listen_port);
  }
  if (config_.enable_rdma) {
    if (auto devices = rdma::ListDevices(); devices.ok()) {
      log_->info("RDMA enabled: device(s) {}; clients that offer RDMA on an address of one of them run in RDMA mode",
                 *devices);
    } else {
      log_->warn("enable_rdma is on, but {}: network clients get TCP", devices.status().message());
    }
  }
  if (config_.client_key.empty()) {
    log_->warn(
        "TCP clients on {}:{} are not authenticated: anyone who reaches the port gets vGPUs "
        "(set client_key in [orion] of server.conf; clients pass ORION_KEY)",
        config_.bind_addr, config_.listen_port);
  }
  return Status::Ok();
}

void Daemon::AcceptClients(uint64_t now_ms) {
  if (!listen_fd_) return;
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    const int c = accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) break;
    char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
    getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, port, sizeof port,
                NI_NUMERICHOST | NI_NUMERICSERV);
    // Connections that have not said Hello yet are capped (kMaxPending in all, kMaxPendingPerSource
    // per address), so silent ones cannot use up oriond's descriptors. A new connection is never
    // turned away for it: the oldest silent one (of its source when that source is at its limit)
    // makes room, so a flood of silent connections cannot lock out clients that say Hello at once.
    constexpr size_t kMaxPending = 64, kMaxPendingPerSource = 16;
    size_t same = 0, oldest_same = pending_.size();
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (pending_[i].source != host) continue;
      if (same++ == 0) oldest_same = i;
    }
    const size_t evict = same >= kMaxPendingPerSource     ? oldest_same
                         : pending_.size() >= kMaxPending ? 0
                                                          : pending_.size();
    if (evict < pending_.size()) {
      if (++evicted_ % 64 == 1) {
        log_->warn("client {}: closed before its Hello to make room for new connections ({} so far; {} pending)",
                   pending_[evict].peer, evicted_, pending_.size());
      }
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(evict));
    }
    const int one = 1, idle = 10, intvl = 2, cnt = 3;  // a dead client is noticed in ~16 s
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(c, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(c, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(c, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(c, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    pending_.push_back({UniqueFd(c), nullptr, false, std::string(host) + ":" + port, host, {}, now_ms});
    // Its Hello is usually there already: deal with it before more connections can push it out.
    Handshake(pending_.back());
    if (!pending_.back().fd) pending_.pop_back();
  }
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    Handshake(p);
    if (!p.fd) {
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (now_ms - p.since_ms > 5000) {
      log_->warn("client {}: no Hello within 5 s; connection closed", p.peer);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

// Sends one reply frame to a client not yet admitted (a refusal, or the worker's backend failure):
// best effort, not waiting long (a refusal is small, and the socket's buffer is empty).
static void SendHandshakeReply(tls::Stream& stream, const FrameHeader& req, int32_t status, const std::string& msg) {
  const FrameHeader r = ReplyHeader(req, status, static_cast<uint32_t>(msg.size()));
  std::string out(reinterpret_cast<const char*>(&r), sizeof r);
  out += msg;
  for (size_t done = 0; done < out.size();) {
    const ssize_t w = stream.Write(out.data() + done, out.size() - done);
    if (w > 0) {
      done += static_cast<size_t>(w);
      continue;
    }
    if (w != tls::kAgain) break;
    pollfd pfd{stream.fd(), stream.wants(), 0};
    if (poll(&pfd, 1, 100) <= 0) break;
  }
}

// Reads a network client's first bytes: on a TLS port, tells a TLS client (handshaken here) from a
// plain one; then the Hello frame. True with *h and *hello when a whole Hello is in; false while
// more is to come, or with p.fd emptied when the connection is closed or refused.
bool Daemon::ReadHello(Pending& p, FrameHeader* h, HelloReq* hello) {
  if (!p.stream) {
    if (!tls_) {
      p.stream = tls::Stream::Plain(p.fd.get());
    } else {
      // A TLS port: a ClientHello starts a TLS handshake; a plain client's Hello is read in clear,
      // only to be told why it is refused.
      unsigned char first[3];
      const ssize_t n = ::recv(p.fd.get(), first, sizeof first, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        p.fd.reset();
        return false;
      }
      if (n < static_cast<ssize_t>(sizeof first)) return false;  // more to come (within the 5 s)
      if (!tls::LooksLikeTls(first, sizeof first)) {
        p.stream = tls::Stream::Plain(p.fd.get());
      } else if (auto s = tls::TlsStream::Accept(tls_, p.fd.get()); s.ok()) {
        p.stream = std::move(s).value();
      } else {
        log_->error("client {}: {}; connection closed", p.peer, s.status().message());
        p.fd.reset();
        return false;
      }
    }
  }
  if (p.stream->secure() && !p.handshaken) {
    auto* t = static_cast<tls::TlsStream*>(p.stream.get());
    const ssize_t r = t->Handshake();
    if (r == tls::kAgain) return false;
    if (r != 1) {
      log_->warn("client {}: {}; connection closed", p.peer, t->error());
      p.fd.reset();
      return false;
    }
    p.handshaken = true;
    log_->info("client {}: {}", p.peer, t->Describe());
  }
  uint8_t buf[4096];
  for (;;) {
    const ssize_t n = p.stream->Read(buf, sizeof buf);
    if (n > 0) {
      p.in.insert(p.in.end(), buf, buf + n);
      if (p.in.size() > 64 * 1024) break;
      continue;
    }
    if (n != tls::kAgain) {
      p.fd.reset();
      return false;
    }
    break;
  }
  if (p.in.size() < sizeof(FrameHeader)) return false;
  std::memcpy(h, p.in.data(), sizeof *h);
  if (!tls_ && tls::LooksLikeTls(p.in.data(), p.in.size())) {
    log_->error(
        "client {}: speaks TLS, but this oriond serves plain TCP (no tls_cert and tls_key in [server] of "
        "server.conf): connect to {}:{} without tls:// and ORION_TLS; connection closed",
        p.peer, config_.bind_addr, config_.listen_port);
    p.fd.reset();
    return false;
  }
  if (h->magic != kFrameMagic || h->version != kProtocolVersion || h->op != static_cast<uint16_t>(Op::kHello) ||
      h->payload_len != sizeof(HelloReq)) {
    log_->error("client {}: the first frame is not a Hello of protocol {}; connection closed", p.peer,
                kProtocolVersion);
    p.fd.reset();
    return false;
  }
  if (p.in.size() < sizeof *h + sizeof(HelloReq)) return false;
  std::memcpy(hello, p.in.data() + sizeof *h, sizeof *hello);
  SanitizeName(hello->process_name, sizeof hello->process_name);
  return true;
}

// The data plane for a client that offers `hello.transports`: RDMA when it offers it, enable_rdma
// is on, the connection is not TLS and an RDMA device here owns the address the client reached us
// on (the queue pair is made in the worker); else TCP. 0 when the client offers nothing usable.
uint16_t Daemon::ChooseTransport(const Pending& p, const HelloReq& hello) {
  if (hello.transports & kTransportRdma) {
    std::string why;
    if (!config_.enable_rdma) {
      why = "enable_rdma is off";
    } else if (p.stream->secure()) {
      why = "the connection is TLS, and RDMA's data plane is not encrypted";
    } else {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      if (getsockname(p.fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
        why = std::string("getsockname: ") + std::strerror(errno);
      } else if (auto port = rdma::FindPort(reinterpret_cast<sockaddr*>(&ss)); !port.ok()) {
        why = port.status().message();
      } else {
        log_->info("client {}: Client supports RDMA mode, then server runs in RDMA mode. ({})", p.peer,
                   port->Describe());
        return kTransportRdma;
      }
    }
    log_->info("client {}: Client supports RDMA mode, but {}; falls back to TCP mode.", p.peer, why);
  }
  if ((hello.transports & kTransportTcp) == 0) return 0;
  log_->info("client {}: Client supports TCP mode, then server also falls back to TCP mode.", p.peer);
  return kTransportTcp;
}

// Reads a network client's Hello; admits it (forking its worker) or refuses it. Empties p.fd when
// the connection is dealt with.
void Daemon::Handshake(Pending& p) {
  FrameHeader h;
  HelloReq hello;
  if (!ReadHello(p, &h, &hello)) return;
  auto refuse = [&](CUresult code, const std::string& why) {
    log_->warn("client {}: refused '{}' (pid {}): {}", p.peer, hello.process_name, hello.pid, why);
    SendHandshakeReply(*p.stream, h, code, why);
    p.fd.reset();
  };
  if (tls_ && !p.stream->secure()) {
    hello.key[sizeof hello.key - 1] = '\0';
    refuse(CUDA_ERROR_NOT_PERMITTED,
           "this oriond serves TLS only (tls_cert in its server.conf): connect to tls://" + config_.bind_addr + ":" +
               std::to_string(config_.listen_port) + " (or set ORION_TLS=1), with ORION_TLS_CA naming its CA" +
               (hello.key[0] != '\0' ? "; the ORION_KEY this client sent crossed the network in clear" : ""));
    return;
  }
  if (hello.protocol_version != kProtocolVersion) {
    refuse(CUDA_ERROR_NOT_SUPPORTED,
           "protocol version " + std::to_string(hello.protocol_version) + " is not supported");
    return;
  }
  // The shared client key, compared in constant time.
  if (!config_.client_key.empty()) {
    char want[sizeof hello.key] = {};
    std::memcpy(want, config_.client_key.data(), std::min(config_.client_key.size(), sizeof want - 1));
    hello.key[sizeof hello.key - 1] = '\0';
    uint8_t diff = 0;
    for (size_t i = 0; i < sizeof want; ++i) diff |= static_cast<uint8_t>(want[i] ^ hello.key[i]);
    if (diff != 0) {
      refuse(CUDA_ERROR_NOT_PERMITTED, "authentication failed: wrong or missing ORION_KEY");
      return;
    }
  }
  // Bytes after the Hello that came before the Welcome were read here and would never reach the
  // worker: the client must wait for the Welcome (it names the transport) before its next frame.
  if (p.in.size() > sizeof h + sizeof hello) {
    refuse(CUDA_ERROR_INVALID_VALUE, std::to_string(p.in.size() - sizeof h - sizeof hello) +
                                         " bytes arrived after the Hello, before the Welcome; a client sends its "
                                         "next frame only after the Welcome (it names the transport)");
    return;
  }
  if (hello.kind == kHelloResume) {
    Resume(p, h, hello);
    return;
  }
  if (hello.kind != kHelloClient && hello.kind != kHelloMigrateIn) {
    refuse(CUDA_ERROR_NOT_SUPPORTED, "a Hello of kind " + std::to_string(hello.kind) + " is not known here");
    return;
  }
  const bool moving_in = hello.kind == kHelloMigrateIn;
  if (moving_in && (p.stream->secure() || (hello.transports & kTransportTcp) == 0)) {
    refuse(CUDA_ERROR_NOT_SUPPORTED, "a session moves in over plain TCP only");
    return;
  }
  const uint16_t transport = moving_in ? kTransportTcp : ChooseTransport(p, hello);
  if (transport == 0) {
    refuse(CUDA_ERROR_NOT_SUPPORTED, "the client offers no transport this oriond can use (TCP)");
    return;
  }
  if (Status st = CheckRequest(&hello); !st.ok()) {
    refuse(RefusalCode(st.code()), st.message());
    return;
  }
  const uint32_t session = next_session_++;
  auto admitted = Acquire(hello, session, p.peer.substr(0, p.peer.rfind(':')));
  if (!admitted.ok()) {
    refuse(RefusalCode(admitted.status().code()), admitted.status().message());
    return;
  }
  auto* placements = &admitted->placements;
  std::map<uint32_t, int> compute;
  if (Status st = ComputeFor(hello, session, *placements, admitted->hold, &compute, admitted->ratio); !st.ok()) {
    Finish(*placements, admitted->allocation_id, -1, "compute_refused", admitted->hold);
    refuse(RefusalCode(st.code()), st.message());
    return;
  }
  const int slot = TakeStatSlot();
  if (moving_in) {
    log_->info("Creating session {} for '{}' (pid {}), moving in from the oriond at {}", session, hello.process_name,
               hello.pid, p.peer);
  } else {
    log_->info("Creating session {} for '{}' (pid {}) from {} over {}", session, hello.process_name, hello.pid, p.peer,
               transport == kTransportRdma ? "RDMA" : "TCP");
  }
  auto slog = SessionLogger(session);
  // The worker's control socketpair (a move is asked for on it), or, for a session moving in, the
  // one its program's connection is handed over on. [0] stays here, [1] is the worker's.
  int pair[2] = {-1, -1};
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    log_->warn("session {}: no control socketpair ({}): it cannot be moved", session, std::strerror(errno));
    if (moving_in) {
      FreeCompute(&compute);
      Finish(*placements, admitted->allocation_id, -1, "socketpair_failed", admitted->hold);
      refuse(CUDA_ERROR_OUT_OF_MEMORY, std::string("no socketpair: ") + std::strerror(errno));
      return;
    }
  }
  std::string token;
  if (moving_in) {
    token = NewResumeToken();
    if (token.empty()) {
      ::close(pair[0]);
      ::close(pair[1]);
      FreeCompute(&compute);
      Finish(*placements, admitted->allocation_id, -1, "entropy_failed", admitted->hold);
      refuse(CUDA_ERROR_UNKNOWN, "no entropy for a resume token");
      return;
    }
  }
  const int fd = p.fd.release();  // the worker's from now on; closed here after the fork
  const pid_t pid = fork();
  if (pid < 0) {
    FreeCompute(&compute);
    Finish(*placements, admitted->allocation_id, slot, "fork_failed", admitted->hold);
    log_->error("cannot fork a worker: {}", std::strerror(errno));
    ::close(fd);
    if (pair[0] >= 0) ::close(pair[0]), ::close(pair[1]);
    return;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    listen_fd_.reset();  // the worker's copies
    control_fd_.reset();
    InWorker(-1);
    if (pair[0] >= 0) ::close(pair[0]);
    if (!p.stream->secure()) {  // TLS streams poll a non-blocking socket
      const int flags = fcntl(fd, F_GETFL);
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    }
    auto backend = MakeBackend(session);
    if (!backend.ok()) {
      slog->error("sess={} cannot load the CUDA driver: {}", session, backend.status().message());
      SendHandshakeReply(*p.stream, h, CUDA_ERROR_NO_DEVICE, "oriond: " + backend.status().message());
      _exit(kExitBackendFailed);
    }
    SessionParams sp = BaseParams(session, *placements, slog);
    sp.socket_fd = moving_in ? -1 : fd;
    sp.migrate_fd = moving_in ? fd : -1;
    sp.control_fd = moving_in ? -1 : pair[1];
    sp.route_fd = moving_in ? pair[1] : -1;
    sp.resume_token = token;
    sp.allocation_id = admitted->allocation_id;
    sp.used_out = StatSlot(slot);
    sp.share = admitted->share;
    FillCompute(*placements, admitted->hold.empty() ? compute : holds_.at(admitted->hold).compute, &sp);
    sp.hold_used = HoldMeter(admitted->hold);
    sp.hold_quota = HoldQuota(admitted->hold);
    sp.transport = transport;
    sp.stream = p.stream;
    sp.channel_bytes = config_.shm_buffer_size_mib << 20;
    const int code = RunSession(sp, std::move(*backend), h, hello);
    slog->flush();
    _exit(code);
  }
  ::close(fd);
  if (pair[1] >= 0) ::close(pair[1]);
  if (link_ && !admitted->allocation_id.empty()) {
    // A hold's allocation is shared by its sessions: no one session's memory figures stand for it.
    link_->Track(admitted->allocation_id, !admitted->hold.empty() ? nullptr : StatSlot(slot),
                 static_cast<uint32_t>(placements->size()));
  }
  std::string client_host(hello.hostname, strnlen(hello.hostname, sizeof hello.hostname));
  net_sessions_.push_back({pid,
                           session,
                           std::move(*placements),
                           admitted->allocation_id,
                           slot,
                           {hello.pid, hello.process_name, client_host.empty() ? p.source : client_host,
                            transport == kTransportRdma ? "rdma" : "tcp"},
                           admitted->hold,
                           std::move(compute),
                           -1,
                           -1,
                           {},
                           0,
                           {},
                           0});
  NetSession& added = net_sessions_.back();
  if (moving_in) {
    added.route = pair[0];
    added.token = token;
    added.token_deadline_ms = MonotonicMs() + 120000;  // the restore, then the program's arrival
  } else {
    added.control = pair[0];
  }
  ++serving_;
}

void Daemon::Resume(Pending& p, const FrameHeader& h, const HelloReq& hello) {
  auto refuse = [&](CUresult code, const std::string& why) {
    log_->warn("client {}: resume refused for '{}' (pid {}): {}", p.peer, hello.process_name, hello.pid, why);
    SendHandshakeReply(*p.stream, h, code, why);
    p.fd.reset();
  };
  if (p.stream->secure()) {
    refuse(CUDA_ERROR_NOT_SUPPORTED, "a moved session resumes over plain TCP only");
    return;
  }
  const size_t n = strnlen(hello.share, sizeof hello.share);
  if (n != kShareTokenLen || !ValidShareToken(hello.share, sizeof hello.share)) {
    refuse(CUDA_ERROR_INVALID_VALUE, "a resume Hello needs its token (32 hex digits)");
    return;
  }
  const uint64_t now = MonotonicMs();
  auto matches = [&](const std::string& token) {
    if (token.size() != kShareTokenLen) return false;
    uint8_t diff = 0;  // constant time: the token is the only credential
    for (size_t i = 0; i < kShareTokenLen; ++i) diff |= static_cast<uint8_t>(token[i] ^ hello.share[i]);
    return diff == 0;
  };
  for (NetSession& ns : net_sessions_) {
    // The way back: a session this oriond is moving away, whose program could not follow it. Its
    // worker waits for the program on its control socket until the target confirms it.
    if (ns.control >= 0 && matches(ns.back_token)) {
      ns.back_token.clear();  // once
      if (now > ns.back_deadline_ms) break;
      if (!SendWithFd(ns.control, &h, sizeof h, p.fd.get())) {
        refuse(CUDA_ERROR_DEVICE_UNAVAILABLE, "the session's worker is gone");
        return;
      }
      log_->info("client {}: '{}' (pid {}) comes back to session {}: its move did not reach the target", p.peer,
                 hello.process_name, hello.pid, ns.session);
      p.fd.reset();  // the worker has its own copy
      return;
    }
    if (ns.route < 0 || !matches(ns.token)) continue;
    if (now > ns.token_deadline_ms) break;
    const bool sent = SendWithFd(ns.route, &h, sizeof h, p.fd.get());
    ns.token.clear();  // once
    // From now on the socketpair is the worker's control socket: the session can move on.
    ns.control = ns.route;
    ns.route = -1;
    if (!sent) {
      refuse(CUDA_ERROR_DEVICE_UNAVAILABLE, "the moved session's worker is gone");
      return;
    }
    const std::string host(hello.hostname, strnlen(hello.hostname, sizeof hello.hostname));
    ns.client = {hello.pid, std::string(hello.process_name, strnlen(hello.process_name, sizeof hello.process_name)),
                 host.empty() ? p.source : host, "tcp"};
    log_->info("client {}: '{}' (pid {}) resumes session {} here", p.peer, hello.process_name, hello.pid, ns.session);
    // Its program's own controller allocation is served here from now on.
    if (link_ && !ns.allocation_id.empty() && ns.hold.empty())
      link_->ReportMove(ns.allocation_id, true, ns.session, "");
    p.fd.reset();  // the worker has its own copy
    return;
  }
  refuse(CUDA_ERROR_NOT_FOUND, "no moved session waits for this resume token here (used, or expired)");
}

}  // namespace orion::host
