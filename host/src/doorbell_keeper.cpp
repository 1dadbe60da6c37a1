// The doorbell keeper (orion/host/doorbell_keeper.h): oriond's client side, and the keeper process itself.
#include "orion/host/doorbell_keeper.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "orion/common/clock.h"
#include "orion/host/vm_state.h"
#include "orion/ivshmem/doorbell.h"

namespace orion::host {
namespace {

constexpr size_t kMaxRequestBytes = 512;
constexpr size_t kMaxFds = ivshmem::kMaxDoorbellVectors;

bool MakeAddress(const std::string& path, sockaddr_un* addr) {
  *addr = {};
  addr->sun_family = AF_UNIX;
  if (path.empty() || path[0] != '/' || path.size() >= sizeof addr->sun_path) return false;
  std::memcpy(addr->sun_path, path.c_str(), path.size() + 1);
  return true;
}

// One message: `text` with `fds` attached by SCM_RIGHTS.
bool SendWithFds(int sock, const std::string& text, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  if (!fds.empty()) {
    if (fds.size() > kMaxFds) return false;
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(sock, &m, MSG_NOSIGNAL) == static_cast<ssize_t>(text.size());
}

// One message into `text`, its fds (close-on-exec) into `fds`. <0: error (errno), 0: EOF. A
// message or fd list that did not fit is an error (what did arrive is closed).
ssize_t ReceiveWithFds(int sock, std::string* text, std::vector<UniqueFd>* fds, int flags) {
  char buf[kMaxRequestBytes + 1];
  iovec iov{buf, sizeof buf};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kMaxFds + 2))] = {};
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(sock, &m, MSG_CMSG_CLOEXEC | flags);
  if (n < 0) return n;
  fds->clear();
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds->emplace_back(fd);
    }
  }
  if (n > 0 && ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || static_cast<size_t>(n) > kMaxRequestBytes)) {
    fds->clear();
    errno = EMSGSIZE;
    return -1;
  }
  text->assign(buf, static_cast<size_t>(n));
  return n;
}

bool IsEventFd(int fd) {
  char link[64];
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(proc.c_str(), link, sizeof link - 1);
  if (n <= 0) return false;
  link[n] = '\0';
  return std::strcmp(link, "anon_inode:[eventfd]") == 0;
}

}  // namespace

DoorbellKeeper::DoorbellKeeper(std::string socket_path) : path_(std::move(socket_path)) {}

bool DoorbellKeeper::usable() const noexcept {
  sockaddr_un a;
  return MakeAddress(path_, &a);
}

void DoorbellKeeper::CloseInChild() noexcept {
  if (conn_) ::close(conn_.release());  // the worker's copy only: oriond's connection stays
}

Status DoorbellKeeper::Connect(bool spawn) {
  if (conn_) return Status::Ok();
  sockaddr_un addr;
  if (!MakeAddress(path_, &addr)) {
    return InvalidArgument("the doorbell keeper's socket '" + path_ + "' must be an absolute path of at most " +
                           std::to_string(sizeof addr.sun_path - 1) + " bytes");
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!s) return Internal(std::string("socket: ") + std::strerror(errno));
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      timeval tv{kKeeperReplyTimeoutMs / 1000, (kKeeperReplyTimeoutMs % 1000) * 1000};
      ::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ::setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      conn_ = std::move(s);
      return Status::Ok();
    }
    const int err = errno;
    if (!spawn || attempt > 0 || (err != ENOENT && err != ECONNREFUSED)) {
      return Status(err == ENOENT || err == ECONNREFUSED ? Code::kNotFound : Code::kUnavailable,
                    "doorbell keeper " + path_ + ": " + std::strerror(err));
    }
    if (Status st = Spawn(); !st.ok()) return st;
  }
  return Status(Code::kUnavailable, "doorbell keeper " + path_ + ": no answer");
}

Status DoorbellKeeper::Spawn() {
  sockaddr_un addr;
  (void)MakeAddress(path_, &addr);
  // Nobody answers at the path: a socket there was left by a keeper that ended.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return Status(Code::kAlreadyExists, path_ + " exists and is not a socket");
    ::unlink(path_.c_str());
  }
  // No close-on-exec: the keeper inherits it (as fd 3).
  UniqueFd listener(::socket(AF_UNIX, SOCK_SEQPACKET, 0));
  if (!listener) return Internal(std::string("socket: ") + std::strerror(errno));
  const mode_t old = ::umask(0177);
  const int rc = ::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0 || ::listen(listener.get(), 8) != 0) {
    return Status(Code::kPermissionDenied, "doorbell keeper " + path_ + ": " + std::strerror(errno));
  }
  // Everything the child needs is made before fork: between fork and exec only async-signal-safe
  // calls (oriond has threads).
  const std::string fd_text = "3";
  char* const argv[] = {const_cast<char*>("oriond"), const_cast<char*>("--doorbell-keeper"),
                        const_cast<char*>(fd_text.c_str()), const_cast<char*>(path_.c_str()), nullptr};
  const int lfd = listener.get();
  const pid_t pid = ::fork();
  if (pid < 0) return Internal(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Twice: the keeper is nobody's child here (it outlives oriond, and oriond's children are its workers).
    if (::fork() != 0) ::_exit(0);
    ::setsid();
    const int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    if (lfd != 3) ::dup2(lfd, 3);
    ::close_range(4, ~0U, 0);
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv("/proc/self/exe", argv);
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return Status::Ok();  // the listener is already listening: connect succeeds from here on
}

Result<std::string> DoorbellKeeper::Call(const std::string& request, const std::vector<int>& fds,
                                         std::vector<UniqueFd>* got, bool spawn) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (Status st = Connect(spawn); !st.ok()) return st;
    std::string reply;
    std::vector<UniqueFd> reply_fds;
    if (SendWithFds(conn_.get(), request, fds) && ReceiveWithFds(conn_.get(), &reply, &reply_fds, 0) > 0) {
      if (got != nullptr) *got = std::move(reply_fds);
      return reply;
    }
    // The keeper ended (it exits when idle and empty, maybe just as we connected): once more.
    conn_.reset();
  }
  return Status(Code::kUnavailable, "doorbell keeper " + path_ + ": no answer to '" + request + "'");
}

Status DoorbellKeeper::Put(const std::string& vm, const std::vector<int>& fds) {
  auto r = Call("put " + vm, fds, nullptr, /*spawn=*/true);
  if (!r.ok()) return r.status();
  if (*r != "ok") return Internal("doorbell keeper: " + *r);
  return Status::Ok();
}

Result<std::vector<UniqueFd>> DoorbellKeeper::Get(const std::string& vm) {
  std::vector<UniqueFd> fds;
  auto r = Call("get " + vm, {}, &fds, /*spawn=*/false);
  if (!r.ok()) {
    if (r.status().code() == Code::kNotFound) return std::vector<UniqueFd>{};  // no keeper: nothing kept
    return r.status();
  }
  if (*r == "none") return std::vector<UniqueFd>{};
  if (*r != "ok " + std::to_string(fds.size())) return Internal("doorbell keeper: " + *r);
  return fds;
}

Status DoorbellKeeper::Drop(const std::string& vm) {
  auto r = Call("drop " + vm, {}, nullptr, /*spawn=*/false);
  if (!r.ok()) return r.status().code() == Code::kNotFound ? Status::Ok() : r.status();
  return *r == "ok" ? Status::Ok() : Internal("doorbell keeper: " + *r);
}

Status DoorbellKeeper::Prune() {
  auto r = Call("prune", {}, nullptr, /*spawn=*/false);
  if (!r.ok()) return r.status().code() == Code::kNotFound ? Status::Ok() : r.status();
  return r->rfind("ok", 0) == 0 ? Status::Ok() : Internal("doorbell keeper: " + *r);
}

// ---- The keeper process ----

int RunDoorbellKeeper(int listen_fd, const std::string& socket_path) {
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGINT, SIG_IGN);
  struct stat mine {};
  if (::fstat(listen_fd, &mine) != 0 || !S_ISSOCK(mine.st_mode)) return 2;
  struct stat at_path {};
  const bool have_path = ::lstat(socket_path.c_str(), &at_path) == 0;
  struct Client {
    UniqueFd fd;
    std::set<std::string> touched;  // VMs this connection put or got (prune keeps them)
  };
  std::vector<Client> clients;
  std::map<std::string, std::vector<UniqueFd>> kept;
  uint64_t alone_since = MonotonicMs();
  bool ever_connected = false;
  for (;;) {
    if (clients.empty()) {
      // Nothing held and nobody here: done (the first oriond connects right after the spawn).
      if (kept.empty() && (ever_connected || MonotonicMs() - alone_since > 10000)) break;
      if (MonotonicMs() - alone_since > uint64_t{kKeeperIdleHours} * 3600 * 1000) break;
    }
    std::vector<pollfd> p;
    p.push_back({listen_fd, POLLIN, 0});
    for (const Client& c : clients) p.push_back({c.fd.get(), POLLIN, 0});
    if (::poll(p.data(), p.size(), 1000) < 0 && errno != EINTR) return 1;
    if ((p[0].revents & POLLIN) != 0) {
      UniqueFd c(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
      ucred cred{};
      socklen_t len = sizeof cred;
      if (c && clients.size() < kMaxKeeperClients && ::getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
          cred.uid == ::geteuid()) {
        timeval tv{kKeeperReplyTimeoutMs / 1000, 0};
        ::setsockopt(c.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        clients.push_back({std::move(c), {}});
        ever_connected = true;
      }
    }
    for (size_t k = clients.size(); k-- > 0;) {
      if (p.size() <= k + 1 || p[k + 1].revents == 0) continue;
      Client& c = clients[k];
      std::string text;
      std::vector<UniqueFd> fds;
      const ssize_t n = ReceiveWithFds(c.fd.get(), &text, &fds, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      std::string reply;
      std::vector<int> out;
      if (n < 0 && errno == EMSGSIZE) {
        reply = "error a request is at most " + std::to_string(kMaxRequestBytes) + " bytes with " +
                std::to_string(kMaxFds) + " fds";
      } else if (n <= 0) {
        clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(k));
        if (clients.empty()) alone_since = MonotonicMs();
        continue;
      } else {
        std::istringstream in(text);
        std::string verb, vm, extra;
        in >> verb >> vm;
        const bool more = static_cast<bool>(in >> extra);
        if (verb == "prune" && vm.empty()) {
          size_t dropped = 0;
          for (auto it = kept.begin(); it != kept.end();) {
            if (c.touched.count(it->first) == 0) {
              it = kept.erase(it);
              ++dropped;
            } else {
              ++it;
            }
          }
          reply = "ok " + std::to_string(dropped);
        } else if ((verb != "put" && verb != "get" && verb != "drop") || more || !ValidVmName(vm)) {
          reply = "error expected 'put VM', 'get VM', 'drop VM' or 'prune' (VM: 1..200 of [A-Za-z0-9._-])";
        } else if (verb != "put" && !fds.empty()) {
          reply = "error only put carries fds";
        } else if (verb == "put") {
          bool events = !fds.empty();
          for (const UniqueFd& f : fds) events = events && IsEventFd(f.get());
          if (!events) {
            reply = "error put carries 1.." + std::to_string(kMaxFds) + " eventfds";
          } else if (kept.count(vm) == 0 && kept.size() >= kMaxKeptVms) {
            reply = "error the keeper holds " + std::to_string(kMaxKeptVms) + " VMs already";
          } else {
            kept[vm] = std::move(fds);
            c.touched.insert(vm);
            reply = "ok";
          }
        } else if (verb == "get") {
          auto it = kept.find(vm);
          if (it == kept.end()) {
            reply = "none";
          } else {
            for (const UniqueFd& f : it->second) out.push_back(f.get());
            c.touched.insert(vm);
            reply = "ok " + std::to_string(out.size());
          }
        } else {
          kept.erase(vm);
          c.touched.erase(vm);
          reply = "ok";
        }
      }
      if (!SendWithFds(c.fd.get(), reply, out)) {
        clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(k));
        if (clients.empty()) alone_since = MonotonicMs();
      }
    }
  }
  // Our socket file only (a later keeper may have replaced it).
  struct stat now {};
  if (have_path && ::lstat(socket_path.c_str(), &now) == 0 && now.st_ino == at_path.st_ino &&
      now.st_dev == at_path.st_dev) {
    ::unlink(socket_path.c_str());
  }
  return 0;
}

}  // namespace orion::host
