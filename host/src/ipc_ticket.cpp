// CUDA IPC tickets between session workers: orion/host/ipc_ticket.h.
#include "orion/host/ipc_ticket.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

namespace orion::host {
namespace {

constexpr char kMagic[8] = {'O', 'R', 'I', 'O', 'N', 'I', 'P', 'C'};
constexpr char kName[] = "orion-ipc";

struct Header {  // the ticket's first bytes (the rest of its first page is zero)
  char magic[8];
  uint32_t kind;
  uint32_t reserved;
  uint64_t bytes;
  uint64_t data_bytes;
  uint8_t secret[16];
  uint8_t payload[64];
};

bool SameSecret(const uint8_t* a, const uint8_t* b) {
  uint8_t d = 0;
  for (int i = 0; i < 16; ++i) d = static_cast<uint8_t>(d | (a[i] ^ b[i]));
  return d == 0;
}

}  // namespace

Result<int> CreateIpcTicket(uint32_t kind, uint64_t bytes, uint64_t data_bytes, const uint8_t* payload,
                            IpcHandle* handle) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.kind = kind;
  h.bytes = bytes;
  h.data_bytes = data_bytes;
  if (getrandom(h.secret, sizeof h.secret, 0) != static_cast<ssize_t>(sizeof h.secret)) {
    return Status(Code::kInternal, "getrandom failed");
  }
  if (payload != nullptr) std::memcpy(h.payload, payload, sizeof h.payload);
  const int fd = memfd_create(kName, MFD_CLOEXEC);
  if (fd < 0) return Status(Code::kResourceExhausted, std::string("memfd_create: ") + std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(kIpcDataOffset + data_bytes)) != 0 ||
      pwrite(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) {
    const int e = errno;
    close(fd);
    return Status(Code::kResourceExhausted, std::string("ticket: ") + std::strerror(e));
  }
  // The exporter's mark: a write lock on byte 0 owned by this open file description (OFD locks
  // live with it, so they survive fork and dup and go with the last close, a crash included).
  struct flock mark {};
  mark.l_type = F_WRLCK;
  mark.l_whence = SEEK_SET;
  mark.l_len = 1;
  if (fcntl(fd, F_OFD_SETLK, &mark) != 0) {
    const int e = errno;
    close(fd);
    return Status(Code::kResourceExhausted, std::string("ticket lock: ") + std::strerror(e));
  }
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->magic, kMagic, sizeof kMagic);
  handle->kind = kind;
  handle->pid = static_cast<int32_t>(getpid());
  handle->fd = fd;
  handle->bytes = bytes;
  std::memcpy(handle->secret, h.secret, sizeof h.secret);
  return fd;
}

Result<int> OpenIpcTicket(const IpcHandle& handle, uint32_t kind, uint8_t* payload) {
  auto bad = [](const std::string& why) {
    return Status(Code::kInvalidArgument, "not an IPC handle of this oriond: " + why);
  };
  if (std::memcmp(handle.magic, kMagic, sizeof kMagic) != 0 || handle.kind != kind) return bad("magic or kind");
  if (handle.pid <= 0 || handle.fd < 0) return bad("process or descriptor");
  const std::string path = "/proc/" + std::to_string(handle.pid) + "/fd/" + std::to_string(handle.fd);
  char target[64] = {};
  const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
  if (n <= 0 || std::strncmp(target, "/memfd:orion-ipc", 16) != 0) return bad("no such ticket");
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return bad("cannot open the ticket");
  // The importer's share, taken before the secret is read: an exporter that revokes the ticket
  // after this check finds the share held (IpcTicketImported), so no import goes unseen.
  if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
    close(fd);
    return bad("the ticket is being revoked");
  }
  struct stat st {};
  Header h{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < kIpcDataOffset ||
      pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) ||
      std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.kind != kind || h.bytes != handle.bytes ||
      !SameSecret(h.secret, handle.secret) || static_cast<uint64_t>(st.st_size) - kIpcDataOffset != h.data_bytes) {
    close(fd);
    return bad("the ticket does not match the handle");
  }
  if (payload != nullptr) std::memcpy(payload, h.payload, sizeof h.payload);
  return fd;
}

void RevokeIpcTicket(int fd) {
  const uint8_t zero[sizeof(Header::secret)] = {};
  (void)pwrite(fd, zero, sizeof zero, offsetof(Header, secret));
}

bool IpcTicketImported(int fd) {
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) return errno == EWOULDBLOCK;
  (void)flock(fd, LOCK_UN);
  return false;
}

bool IpcExporterHolds(int fd) {
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  probe.l_len = 1;
  if (fcntl(fd, F_OFD_GETLK, &probe) != 0) return true;  // cannot tell: the exporter keeps the charge
  return probe.l_type != F_UNLCK;
}

}  // namespace orion::host
