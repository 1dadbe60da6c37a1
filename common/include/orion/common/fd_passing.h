// orion/common/fd_passing.h — one message with a file descriptor attached, over a Unix socket
// (SCM_RIGHTS, unix(7)): how oriond hands a connection to a session worker (a move's asker, a moved
// session's program: host/src/session_move.cpp) and a doorbell's eventfds to QEMU.
//
//   if (!SendWithFd(pair[0], "migrate 10.0.0.2:9960", 21, conn)) ...;   // conn stays open here
//   int fd = -1;
//   const ssize_t n = RecvWithFd(pair[1], buf, sizeof buf, &fd, MSG_DONTWAIT);
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>

namespace orion {

// Sends [data, data + len) as one message on `sock` with `fd` attached (none when fd < 0), without
// blocking and without SIGPIPE. True when the whole message went; the sender's `fd` stays open.
bool SendWithFd(int sock, const void* data, size_t len, int fd) noexcept;

// Receives one message into [data, data + cap) from `sock` (`flags`: e.g. MSG_DONTWAIT). *fd gets
// the descriptor it carried (close-on-exec) or -1; a message carrying more than one has the others
// closed. Returns the bytes received: 0 when the peer closed, -1 on an error (errno) or none.
ssize_t RecvWithFd(int sock, void* data, size_t cap, int* fd, int flags) noexcept;

}  // namespace orion
