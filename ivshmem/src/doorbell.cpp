#include "orion/ivshmem/doorbell.h"

#include "orion/common/fd_passing.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace orion::ivshmem {
namespace {

std::string Err(const std::string& what) { return what + ": " + std::strerror(errno); }

// One protocol message: an 8-byte little-endian signed number, with `fd` (if >= 0) attached by
// SCM_RIGHTS. The peer's socket is non-blocking and new: its buffer holds the whole setup.
bool SendMsg(int sock, int64_t value, int fd) noexcept {
  uint8_t bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i));
  return SendWithFd(sock, bytes, sizeof bytes, fd);
}

}  // namespace

Result<std::unique_ptr<DoorbellServer>> DoorbellServer::Create(const std::string& socket_path,
                                                               const std::string& region_path, uint32_t vectors,
                                                               uid_t uid, gid_t gid, std::vector<UniqueFd> kept) {
  if (vectors == 0 || vectors > kMaxDoorbellVectors) {
    return InvalidArgument("doorbell vectors must be 1.." + std::to_string(kMaxDoorbellVectors));
  }
  if (!kept.empty() && kept.size() != vectors) {
    return InvalidArgument("kept doorbell eventfds: " + std::to_string(kept.size()) + " for " +
                           std::to_string(vectors) + " vectors");
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path[0] != '/' || socket_path.size() >= sizeof addr.sun_path) {
    return InvalidArgument("doorbell socket '" + socket_path + "' must be an absolute path of at most " +
                           std::to_string(sizeof addr.sun_path - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  std::unique_ptr<DoorbellServer> s(new DoorbellServer());
  s->path_ = socket_path;
  // What is at the path already: a socket nobody answers on (left by a stopped oriond) is
  // replaced; a live one or any other file is not ours to take.
  struct stat st {};
  if (::lstat(socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status(Code::kAlreadyExists, socket_path + " exists and is not a socket");
    }
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe && ::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      return Status(Code::kAlreadyExists, socket_path + " is served by another process");
    }
    ::unlink(socket_path.c_str());
  }
  s->listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s->listen_) return Internal(Err("doorbell socket"));
  const mode_t old = umask(0177);  // nobody else may connect before the owner is set below
  const int rc = ::bind(s->listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  umask(old);
  if (rc != 0) return Status(Code::kPermissionDenied, Err("cannot create the doorbell socket " + socket_path));
  if (::lstat(socket_path.c_str(), &st) == 0) {
    s->socket_dev_ = st.st_dev;
    s->socket_ino_ = st.st_ino;
  }
  if (::chown(socket_path.c_str(), uid, gid) != 0 || ::chmod(socket_path.c_str(), 0660) != 0) {
    const Status e(Code::kPermissionDenied, Err("cannot give the doorbell socket " + socket_path + " to its VM"));
    ::unlink(socket_path.c_str());
    return e;
  }
  if (::listen(s->listen_.get(), 4) != 0) {
    const Status e = Internal(Err("listen on " + socket_path));
    ::unlink(socket_path.c_str());
    return e;
  }
  s->shm_.reset(::open(region_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!s->shm_) {
    const Status e(errno == ENOENT ? Code::kNotFound : Code::kPermissionDenied, Err("cannot open " + region_path));
    ::unlink(socket_path.c_str());
    return e;
  }
  s->host_ = std::move(kept);
  for (UniqueFd& e : s->host_) {
    // Adopted: non-blocking like our own (a worker drains without waiting).
    const int fl = ::fcntl(e.get(), F_GETFL);
    if (fl < 0 || ::fcntl(e.get(), F_SETFL, fl | O_NONBLOCK) != 0) {
      const Status err = Internal(Err("kept eventfd"));
      ::unlink(socket_path.c_str());
      return err;
    }
  }
  for (uint32_t i = s->host_.empty() ? 0 : vectors; i < 2 * vectors; ++i) {
    UniqueFd e(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!e) {
      const Status err = Internal(Err("eventfd"));
      ::unlink(socket_path.c_str());
      return err;
    }
    (i < vectors ? s->host_ : s->guest_).push_back(std::move(e));
  }
  return s;
}

DoorbellServer::~DoorbellServer() {
  // Only our own socket file: a later server may have replaced it.
  struct stat st {};
  if (!path_.empty() && listen_ && ::lstat(path_.c_str(), &st) == 0 && st.st_dev == socket_dev_ &&
      st.st_ino == socket_ino_) {
    ::unlink(path_.c_str());
  }
}

std::string DoorbellServer::Accept() {
  UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (!c) return "";
  ucred cred{};
  socklen_t len = sizeof cred;
  std::string who = "peer";
  if (::getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    who = "pid " + std::to_string(cred.pid) + " (uid " + std::to_string(cred.uid) + ")";
  }
  if (peer_) return "doorbell " + path_ + ": refused a second connection from " + who + " (its VM is connected)";
  // ivshmem-spec.rst: version; the client's id; -1 with the memory; connect notifications for the
  // other peers (oriond: its id once per vector, each with that vector's eventfd); then the
  // client's own id once per vector with the eventfds it would receive interrupts on.
  bool ok = SendMsg(c.get(), kIvshmemProtocolVersion, -1) && SendMsg(c.get(), kGuestPeer, -1) &&
            SendMsg(c.get(), -1, shm_.get());
  for (const UniqueFd& e : host_) ok = ok && SendMsg(c.get(), kHostPeer, e.get());
  for (const UniqueFd& e : guest_) ok = ok && SendMsg(c.get(), kGuestPeer, e.get());
  if (!ok) return "doorbell " + path_ + ": " + Err("cannot send the setup to " + who);
  peer_ = std::move(c);
  return "doorbell " + path_ + ": " + who + " connected (" + std::to_string(host_.size()) + " vectors)";
}

std::string DoorbellServer::PeerReadable() {
  if (!peer_) return "";
  uint8_t buf[256];
  const ssize_t n = ::recv(peer_.get(), buf, sizeof buf, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return "";
  peer_.reset();
  if (n > 0) {
    return "doorbell " + path_ + ": the peer sent " + std::to_string(n) +
           " bytes, but the ivshmem protocol is one-way (server to client): connection closed";
  }
  return "doorbell " + path_ + ": the peer disconnected" + (n < 0 ? " (" + Err("recv") + ")" : std::string());
}

void DoorbellServer::CloseInChild(int keep) noexcept {
  auto drop = [&](UniqueFd& f) {
    if (f.get() != keep) ::close(f.release());
  };
  drop(listen_);
  drop(peer_);
  drop(shm_);
  for (UniqueFd& e : host_) drop(e);
  for (UniqueFd& e : guest_) drop(e);
  path_.clear();  // never unlink from a worker
}

bool DrainEventFd(int fd) noexcept {
  uint64_t count = 0;
  return ::read(fd, &count, sizeof count) == static_cast<ssize_t>(sizeof count);
}

bool WaitEventFd(int fd, int timeout_ms) noexcept {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  return DrainEventFd(fd);
}

Result<std::unique_ptr<GuestDoorbell>> GuestDoorbell::Open(const std::string& resource0_path) {
  const int fd = ::open(resource0_path.c_str(), O_RDWR | O_SYNC | O_CLOEXEC);
  if (fd < 0) {
    return Status(errno == ENOENT ? Code::kNotFound : Code::kPermissionDenied, Err("cannot open " + resource0_path));
  }
  // BAR0 is 256 bytes; a sysfs resource maps whole pages.
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return Internal(Err("cannot map " + resource0_path));
  return std::unique_ptr<GuestDoorbell>(new GuestDoorbell(static_cast<volatile uint32_t*>(p)));
}

GuestDoorbell::~GuestDoorbell() { ::munmap(const_cast<uint32_t*>(regs_), 4096); }

// BAR0 registers (ivshmem-spec.rst): 0 interrupt mask, 4 interrupt status, 8 IVPosition, 12 Doorbell.
uint32_t GuestDoorbell::position() const noexcept { return regs_[2]; }

void GuestDoorbell::Ring(uint32_t peer, uint32_t vector) noexcept { regs_[3] = (peer << 16) | (vector & 0xffffu); }

}  // namespace orion::ivshmem
