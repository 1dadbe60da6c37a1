// orion/host/doorbell_keeper.h — keeps each VM's ivshmem-doorbell eventfds alive while oriond restarts.
//
// QEMU takes its ivshmem-doorbell eventfds from the ivshmem server once, when the VM starts, and
// never connects again (hw/misc/ivshmem.c: the server chardev has no reconnect path; a second
// setup would be read as peer notifications). A guest's rings therefore go to the eventfds of the
// oriond that served the VM's start, for the VM's whole life. To hear them after a restart (or a
// crash), a new oriond needs those same eventfds: the old one left a copy with the keeper.
//
// The keeper is a small process (oriond's own binary, `oriond --doorbell-keeper FD PATH`, started
// by oriond on first need and detached from it: its own session, not oriond's child). It holds
// the eventfds of each VM, keyed by VM name, and serves one SOCK_SEQPACKET socket (0600, the
// peer must have the keeper's uid) with text requests carrying fds by SCM_RIGHTS:
//   put VM   + 1..kMaxDoorbellVectors eventfds   -> "ok"       (replaces what VM had)
//   get VM                                       -> "ok N" + N fds, or "none"
//   drop VM                                      -> "ok"
//   prune                                        -> "ok N": drops every VM this connection did
//                                                   not put or get (the VMs a restore did not find)
// Anything else gets "error <why>" and changes nothing. The keeper exits when it holds nothing
// and no oriond is connected, or after kKeeperIdleHours without any oriond.
//
//   DoorbellKeeper k(state_file + ".doorbells");
//   k.Put("web1", bell->host_vector_fds());           // at attach (spawns the keeper if needed)
//   auto fds = k.Get("web1");                         // at restore: the eventfds QEMU still rings
//   k.Prune(); k.Drop("web1");                        // after restore; at detach
//
// Thread-safety: none (oriond's main loop only).
#pragma once

#include <string>
#include <vector>

#include "orion/common/status.h"
#include "orion/common/unique_fd.h"

namespace orion::host {

inline constexpr size_t kMaxKeptVms = 256;      // VMs one keeper holds
inline constexpr size_t kMaxKeeperClients = 4;  // oriond connections at once (one in practice)
inline constexpr int kKeeperIdleHours = 24;     // exits after this long with no oriond connected
inline constexpr int kKeeperReplyTimeoutMs = 2000;

class DoorbellKeeper {
 public:
  // `socket_path`: the keeper's socket (absolute, < 108 bytes; checked by usable()).
  explicit DoorbellKeeper(std::string socket_path);
  DoorbellKeeper(const DoorbellKeeper&) = delete;
  DoorbellKeeper& operator=(const DoorbellKeeper&) = delete;

  // Whether the path fits a UNIX socket address (else every call fails with kInvalidArgument).
  bool usable() const noexcept;
  const std::string& socket_path() const noexcept { return path_; }
  // Leaves a copy of `fds` (eventfds) with the keeper under `vm`; starts the keeper when none runs.
  Status Put(const std::string& vm, const std::vector<int>& fds);
  // The eventfds kept for `vm` (empty when none were kept, or no keeper runs). Never starts one.
  Result<std::vector<UniqueFd>> Get(const std::string& vm);
  Status Drop(const std::string& vm);
  // Drops every VM this connection did not Put or Get. No keeper running: nothing to do.
  Status Prune();
  // In a forked worker: forgets the connection without telling the keeper.
  void CloseInChild() noexcept;

 private:
  // Connects; with `spawn`, starts a keeper when nobody answers at the path.
  Status Connect(bool spawn);
  Status Spawn();
  Result<std::string> Call(const std::string& request, const std::vector<int>& fds, std::vector<UniqueFd>* got,
                           bool spawn);
  std::string path_;
  UniqueFd conn_;
};

// The keeper process's main: serves `listen_fd` (a bound, listening SOCK_SEQPACKET socket whose
// file is `socket_path`) until it holds nothing and nobody is connected. Returns the exit status.
int RunDoorbellKeeper(int listen_fd, const std::string& socket_path);

}  // namespace orion::host
