// orion/host/vm_state.h — oriond's durable record of the VMs attached to it (libvirt hook ->
// control socket `attach`), so a restarted oriond serves each running VM's region exactly as
// before: same vGPUs (placements), same quota, same number of channels.
//
// The file is JSON (nlohmann-json), written whole on every change: a temporary file in the same
// directory, fsync, rename over the old one, fsync of the directory. A reader never sees a half
// file, and a crash leaves either the old or the new record.
//
//   auto vms = LoadVmState("/var/lib/orion/vms.json");   // a missing file is an empty record
//   if (!vms.ok()) ...;                                   // corrupt: the message names file and field
//   vms->push_back({...});
//   if (Status s = SaveVmState(path, *vms); !s.ok()) ...;
//
// Format (version 1):
//   {"version": 1, "vms": [{"vm": "web1", "region": "/dev/shm/orionsock-web1", "vgpus": 2,
//     "gmem_mib": 3000, "processes": 4, "placements": [{"pgpu": 0, "vgpu": 1, "quota_bytes": 3145728000}],
//     "doorbell": {"socket": "/dev/shm/orionsock-web1.sock", "vectors": 4}}]}     (doorbell: optional)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orion/common/status.h"
#include "orion/host/backend.h"

namespace orion::host {

inline constexpr uint32_t kVmStateVersion = 1;
inline constexpr size_t kMaxVmStateBytes = 4u << 20;  // far above any real record; bounds the read
inline constexpr uint32_t kMaxVmProcesses = 30;       // = ivshmem::kMaxChannels

struct VmAttachment {
  std::string vm;                     // the libvirt domain name ([A-Za-z0-9._-], 1..200)
  std::string region;                 // absolute path of its region file
  uint32_t vgpus = 0;                 // what the hook asked for
  uint64_t gmem_mib = 0;              // MiB per vGPU asked for (0: the server's default size)
  uint32_t processes = 0;             // channels asked for (0: the server's shm_buffer_size decides)
  std::vector<Placement> placements;  // what oriond reserved
  // The VM's ivshmem-doorbell, when oriond is its ivshmem server ("" and 0 otherwise): the socket
  // QEMU connected to and the vectors it was given (1..kMaxVmProcesses). A restarted oriond takes
  // the eventfds back from the doorbell keeper (host/src/doorbell_keeper.h).
  std::string doorbell_socket;
  uint32_t doorbell_vectors = 0;
  // The VM's compute share (orion-vm enable --ratio): percent of each of its physical GPUs (0: best
  // effort) and kPolicyShare / kPolicyCap (compute_share.h); "compute" in the file, optional.
  uint32_t ratio = 0;
  uint32_t ratio_policy = 0;
};

// Text <-> record. DecodeVmState checks everything it returns: version, names, paths, counts,
// placements (1..16, quota > 0), no VM or region twice; an error names `source` and what is wrong.
std::string EncodeVmState(const std::vector<VmAttachment>& vms);
Result<std::vector<VmAttachment>> DecodeVmState(const std::string& text, const std::string& source);

// Reads `path`; a missing file is an empty record. kDataLoss for a corrupt file (the message says
// how to recover), kPermissionDenied/kInternal when it cannot be read.
Result<std::vector<VmAttachment>> LoadVmState(const std::string& path);
// Writes `path` atomically (temporary file + fsync + rename + directory fsync), creating its
// directory (0750) when missing. The file is 0600: it names the VMs of this host.
Status SaveVmState(const std::string& path, const std::vector<VmAttachment>& vms);

// A VM name oriond accepts (and writes into file names): 1..200 of [A-Za-z0-9._-], not starting with '.'.
bool ValidVmName(const std::string& vm);

}  // namespace orion::host
