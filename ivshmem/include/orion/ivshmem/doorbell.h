// orion/ivshmem/doorbell.h — the VM doorbell: oriond as the ivshmem server of a VM's
// `ivshmem-doorbell` device (QEMU docs/specs/ivshmem-spec.rst), and the guest's side of it.
//
// QEMU's ivshmem-doorbell device takes its shared memory and its interrupt eventfds from a server
// over a UNIX socket. oriond is that server for each VM region attached with a doorbell: it sends
// the region file and, as peer kHostPeer, one eventfd per vector. A guest process writes
// `kHostPeer << 16 | vector` to the Doorbell register in BAR0 (sysfs `resource0`, mapped from user
// space, no guest driver); QEMU signals that eventfd and the sleeping worker of channel `vector`
// wakes. Host-to-guest stays polling (an interrupt into the guest would need a driver).
//
//   auto srv = DoorbellServer::Create(socket, region_file, vectors, uid, gid);   // oriond, per VM
//   poll srv->listen_fd(), srv->peer_fd(); on readiness: srv->Accept(), srv->PeerReadable()
//   worker of channel i: WaitEventFd(srv->vector_fd(i), timeout_ms)
//   guest: auto bar0 = GuestDoorbell::Open(".../resource0"); bar0->Ring(kHostPeer, channel);
//
// Thread-safety: none; one owner each. Everything QEMU (or whoever connects) does is hostile: the
// protocol is one-way (server to client), so any byte received ends that connection, and a ring
// storm costs only the worker of the rung channel (the caller throttles spurious wake-ups).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "orion/common/status.h"
#include "orion/common/unique_fd.h"

namespace orion::ivshmem {

inline constexpr int64_t kIvshmemProtocolVersion = 0;  // ivshmem-spec.rst, "Client-Server Protocol"
inline constexpr uint32_t kHostPeer = 0;               // oriond's peer id: the guest rings kHostPeer << 16 | vector
inline constexpr uint32_t kGuestPeer = 1;              // the VM's id: its IVPosition reads 1 (0 means "no doorbell")
inline constexpr uint32_t kMaxDoorbellVectors = 30;    // one per channel (kMaxChannels)

using orion::UniqueFd;  // orion/common/unique_fd.h

// oriond's side for one VM region. One peer (the VM's QEMU) at a time; a second connection while
// one is up is closed at once. The eventfds live as long as the server, so a QEMU that reconnects
// (a new VM start on the same attachment) gets the same ones.
class DoorbellServer {
 public:
  // Listens on `socket_path` (a stale socket there is replaced; any other file is refused with
  // kAlreadyExists), owned by uid:gid with mode 0660 (QEMU runs as the region's owner), and makes
  // `vectors` (1..kMaxDoorbellVectors) eventfds for oriond and as many for the guest's own vectors
  // (never signalled: they complete the protocol). `region_path` is opened once more (its own open
  // file description, so the flock oriond holds on its mapping never travels to QEMU): that is the
  // memory QEMU maps as BAR2. `kept` (empty, or `vectors` eventfds): oriond's vectors to adopt
  // instead of new ones, those a running QEMU already signals (kept across an oriond restart).
  // Errors: kInvalidArgument, kAlreadyExists, kPermissionDenied, kInternal.
  static Result<std::unique_ptr<DoorbellServer>> Create(const std::string& socket_path, const std::string& region_path,
                                                        uint32_t vectors, uid_t uid, gid_t gid,
                                                        std::vector<UniqueFd> kept = {});
  ~DoorbellServer();  // closes everything and removes the socket file
  DoorbellServer(const DoorbellServer&) = delete;
  DoorbellServer& operator=(const DoorbellServer&) = delete;

  int listen_fd() const noexcept { return listen_.get(); }
  int peer_fd() const noexcept { return peer_.get(); }  // -1 when no QEMU is connected
  bool connected() const noexcept { return static_cast<bool>(peer_); }
  uint32_t vectors() const noexcept { return static_cast<uint32_t>(host_.size()); }
  // The eventfd (EFD_NONBLOCK) signalled when the guest rings `vector`; -1 when out of range.
  int vector_fd(uint32_t vector) const noexcept { return vector < host_.size() ? host_[vector].get() : -1; }
  // Every vector_fd, in order (still owned here): what oriond leaves with the doorbell keeper.
  std::vector<int> host_vector_fds() const {
    std::vector<int> fds;
    for (const UniqueFd& e : host_) fds.push_back(e.get());
    return fds;
  }
  const std::string& socket_path() const noexcept { return path_; }

  // listen_fd() is readable: accepts one connection. With no peer, it becomes the peer and gets
  // the whole setup (version, its id, the memory, oriond's vectors, its own vectors); otherwise it
  // is closed. Returns a line for the log ("" when there was nothing to accept).
  std::string Accept();
  // peer_fd() is readable: QEMU never sends, so data (garbage) or EOF ends the connection. Returns
  // a line for the log.
  std::string PeerReadable();
  // In a forked worker: closes every descriptor of this server except `keep` (its channel's
  // eventfd), without removing the socket file (the daemon still serves it).
  void CloseInChild(int keep) noexcept;

 private:
  DoorbellServer() = default;
  std::string path_;
  UniqueFd listen_, peer_, shm_;
  std::vector<UniqueFd> host_;   // oriond's vectors (kHostPeer)
  std::vector<UniqueFd> guest_;  // the guest's own vectors (kGuestPeer)
  dev_t socket_dev_ = 0;
  ino_t socket_ino_ = 0;
};

// A worker's wait: true when `fd` (an eventfd) was signalled within `timeout_ms` (its counter is
// then reset), false on timeout. EINTR counts as a timeout.
bool WaitEventFd(int fd, int timeout_ms) noexcept;
// Resets an eventfd's counter without waiting; true if it was signalled.
bool DrainEventFd(int fd) noexcept;

// The guest's side: BAR0 (256 bytes of registers) of an ivshmem-doorbell device, mapped from sysfs.
class GuestDoorbell {
 public:
  // Maps `resource0_path` (O_RDWR | O_SYNC). Errors: kNotFound, kPermissionDenied, kInternal.
  static Result<std::unique_ptr<GuestDoorbell>> Open(const std::string& resource0_path);
  ~GuestDoorbell();
  GuestDoorbell(const GuestDoorbell&) = delete;
  GuestDoorbell& operator=(const GuestDoorbell&) = delete;
  // The IVPosition register: this VM's peer id; 0 when the device has no server (ivshmem-plain).
  uint32_t position() const noexcept;
  // Writes the Doorbell register: QEMU signals `peer`'s eventfd of `vector` (ignored by QEMU when
  // that peer or vector is not connected). One MMIO write (a VM exit under KVM).
  void Ring(uint32_t peer, uint32_t vector) noexcept;

 private:
  GuestDoorbell(volatile uint32_t* regs) : regs_(regs) {}
  volatile uint32_t* regs_;
};

}  // namespace orion::ivshmem
