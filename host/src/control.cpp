#include "orion/host/control.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace orion::host {

Result<std::string> ControlRequest(const std::string& socket_path, const std::string& line, int timeout_ms) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) return InvalidArgument("control socket path too long");
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof addr.sun_path - 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int e = errno;
    if (fd >= 0) close(fd);
    if (e == EACCES || e == EPERM) {
      return Status(Code::kPermissionDenied, "cannot connect to " + socket_path + ": " + std::strerror(e) +
                                                 " (oriond's control socket is root-only)");
    }
    // ENOENT or ECONNREFUSED: no oriond listens there (it is not running, or its control_socket is
    // another path, or this is a VM guest or a container that does not see it).
    return Unavailable("no oriond answers on " + socket_path + ": " + std::strerror(e));
  }
  const std::string msg = line + "\n";
  std::string reply;
  if (write(fd, msg.data(), msg.size()) == static_cast<ssize_t>(msg.size())) {
    char buf[1024];
    pollfd pfd{fd, POLLIN, 0};
    while (reply.find('\n') == std::string::npos && poll(&pfd, 1, timeout_ms) > 0) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      reply.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  const auto nl = reply.find('\n');
  if (nl == std::string::npos) return DataLoss("oriond did not answer on " + socket_path);
  reply.resize(nl);
  return reply;
}

}  // namespace orion::host
