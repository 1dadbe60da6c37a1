// orion/ivshmem/discover.h — where a client finds its Orion region.
//
// Order: $ORION_SHM; else the first <shm_path_base>/orionsock* (client.conf: /etc/orion/client.conf,
// then $HOME/.orion/client.conf, [client-shm] shm_path_base, default /dev/shm/); else, in a VM, the
// ivshmem-plain PCI device (1af4:1110, QEMU docs/specs/ivshmem-spec.rst) whose BAR2 holds the
// Orion magic, enabled on the way if needed ($ORION_SYSFS_PCI overrides /sys/bus/pci/devices).
//
//   auto where = FindClientRegion();
//   if (!where.ok()) puts(where.status().message().c_str());   // says what was looked for and why not
#pragma once

#include <string>

#include "orion/common/status.h"

namespace orion::ivshmem {

struct RegionLocation {
  std::string path;      // file to map: /dev/shm/orionsockN or .../resource2
  std::string source;    // "ORION_SHM", "shm_path_base" or "ivshmem <pci address>"
  std::string doorbell;  // ivshmem: the device's BAR0 registers (.../resource0); else ""
};

// kNotFound: no region and no ivshmem device. kFailedPrecondition: a VM guest whose ivshmem device
// this process cannot use (not enabled, no access, no Orion region in it); the message says which
// and how to fix it from inside the guest.
Result<RegionLocation> FindClientRegion();

// The controller a client asks for vGPUs when it has no region: $ORION_CONTROLLER, else
// [controller] controller_addr of $HOME/.orion/client.conf, else of /etc/orion/client.conf; "" = none.
std::string ClientControllerAddr();
// The key a client presents to the controller: $ORION_CONTROLLER_KEY, else $ORION_KEY; "" = none.
std::string ClientControllerKey();

}  // namespace orion::ivshmem
