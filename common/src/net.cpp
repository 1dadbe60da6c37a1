// net.cpp — see orion/common/net.h.
#include "orion/common/net.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace orion {

bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  *host = address.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  *port = address.substr(colon + 1);
  return true;
}

Result<int> ConnectTcp(const std::string& address, int timeout_ms, const std::string& peer) {
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) return InvalidArgument("'" + address + "' is not host:port");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return Unavailable("cannot resolve " + address + ": " + gai_strerror(rc));
  }
  int fd = -1;
  std::string err = "no address";
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    // Non-blocking connect within the limit: an unreachable host is an error, not a long hang.
    fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd, POLLOUT, 0};
      int so_error = ETIMEDOUT;
      socklen_t len = sizeof so_error;
      if (poll(&pfd, 1, timeout_ms) == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
      errno = so_error;
      rc = so_error == 0 ? 0 : -1;
    }
    if (rc != 0) {
      err = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return Unavailable("cannot connect to " + peer + address + ": " + err);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace orion
