// Helpers that oriond's source files share (daemon.cpp defines them): not a public interface.
// oriond's Daemon is split by concern over daemon.cpp (start-up, workers, the main loop),
// daemon_admission.cpp, daemon_shm.cpp, daemon_net.cpp and daemon_vms.cpp.
#pragma once

#include <cuda.h>
#include <spdlog/common.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "orion/common/status.h"
#include "orion/ivshmem/region.h"
#include "orion/pool/pool.h"

namespace orion::host::daemon_detail {

// Makes a peer-supplied, fixed-size name printable in place: NUL-terminated within `size`, every
// byte outside 0x20..0x7e replaced by '?'.
void SanitizeName(char* name, size_t size);
spdlog::level::level_enum Level(const std::string& s);  // ORION_LOG_LEVEL's words
std::string TimeStamp();                                // "20261124-171000", local time
// The CUresult a refused client gets for a Status code of admission.
CUresult RefusalCode(Code c);
// "0/1:4096MiB,0/2:4096MiB": placements for log lines and replies.
std::string PlacementText(const std::vector<pool::Placement>& placements);
// The limits a VM's region publishes: vGPU count and the smallest quota among them.
ivshmem::VmLimits LimitsOf(const std::vector<pool::Placement>& placements);
// Who holds the flock on the file at `path` (/proc/locks): `who` is "pid N (comm)", or "another
// process" when that cannot be told (another PID namespace, no /proc, or the lock went meanwhile).
// `oriond`: the holder runs this very executable as this user (another oriond), or it cannot be
// told (then it is taken for one, as before).
struct LockHolder {
  std::string who = "another process";
  bool oriond = true;
};
LockHolder RegionLockHolder(const std::string& path);
// A resume token for a moving session (kShareTokenLen lowercase hex digits from getentropy), or ""
// when the system has no entropy to give.
std::string NewResumeToken();

}  // namespace orion::host::daemon_detail
