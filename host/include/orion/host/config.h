// orion/host/config.h — oriond's configuration: /etc/orion/server.conf (Orion's INI keys, see
// shared/orion-reference.md) overridden by command-line flags.
//
//   auto conf = LoadServerConfig("/etc/orion/server.conf");   // kNotFound if absent
//   if (!conf.ok()) { std::cerr << conf.status().message(); }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orion/common/status.h"

namespace orion::host {

enum class BackendKind { kAuto, kCuda, kSim };

struct ServerConfig {
  // [server]
  uint16_t listen_port = 9960;
  std::string bind_addr = "127.0.0.1";
  bool enable_shm = true;
  bool enable_rdma = false;
  bool enable_kvm = false;
  bool kvm_doorbell = false;  // orion-vm enable gives VMs an ivshmem-doorbell (else ivshmem-plain)
  uint32_t vgpu_count = 4;    // vGPUs per physical GPU, 1..100
  uint32_t max_clients = 64;  // -n
  // TLS on the TCP data plane: PEM certificate chain and its key (both or neither). With them the
  // port speaks TLS only; clients connect to tls://host:port (or with ORION_TLS=1).
  std::string tls_cert, tls_key;
  uint32_t default_ratio = 0;         // compute share of a client that sets no ORION_RATIO (0: best effort)
  uint32_t default_ratio_policy = 0;  // and its policy: 0 share, 1 cap (ComputePolicy)
  // [server-log]
  bool log_with_time = true;
  bool log_to_screen = false;
  bool log_to_file = true;
  std::string log_level = "INFO";  // ERROR, WARNING, INFO, DEBUG
  std::string file_log_level = "INFO";
  // [server-shm]
  std::string shm_path_base = "/dev/shm/";
  std::string shm_group_name = "kvm";
  std::string shm_user_name = "libvirt-qemu";
  uint64_t shm_buffer_size_mib = 64;  // per channel
  // [controller]
  std::string controller_addr;      // "" = standalone; $ORION_CONTROLLER beats it
  std::string controller_key;       // [controller] controller_key: the controller's server key
  std::string controller_tls_ca;    // [controller] controller_tls_ca: CA file (PEM) for https:// controllers
  std::string controller_tls_cert;  // [controller] controller_tls_cert/_key: client certificate (mutual TLS)
  std::string controller_tls_key;
  uint64_t controller_heartbeat_ms = 2000;  // [controller] heartbeat_ms
  // Not in Orion's file: flags only (or [orion] section).
  BackendKind backend = BackendKind::kAuto;
  std::string log_dir = "/var/log/orion";
  std::string cache_dir = "/var/cache/orion/modules";
  uint64_t cache_max_mib = 2048;       // --cache-max-mib: the module cache's size bound
  std::vector<std::string> shm_paths;  // --shm; empty: every <shm_path_base>/orionsock*
  std::string sim_launch_log;
  bool sim_execute = true;                  // --sim-execute ptx|none
  bool sim_skip_unexecutable = false;       // --sim-unexecutable refuse|skip (see SimOptions)
  int sim_driver_version = 0;               // --sim-driver-version MAJOR.MINOR (0: the build's CUDA_VERSION)
  uint64_t sim_kernel_timeout_ms = 600000;  // --sim-kernel-timeout (ms)
  uint32_t sim_workers = 0;                 // --sim-workers: threads per launch (0: all cores)
  uint32_t sim_gpus = 1;
  uint64_t sim_gpu_mem_mib = 16384;
  uint64_t lease_timeout_ms = 3000;
  // [orion] session_logs_max: session log files kept in <log_dir>/session (the oldest go first).
  uint64_t session_logs_max = 1000;
  std::string cuda_driver = "libcuda.so.1";
  std::string control_socket = "/run/orion/oriond.sock";
  // [orion] compute_share / --compute-share on|off: the per-GPU compute-share scheduler. Off: no
  // ratio is enforced or measured (for a bench's baseline, bench/compute-share).
  bool compute_share = true;
  // [orion] metrics_addr: host:port of the Prometheus endpoint (GET /metrics); "" = none.
  std::string metrics_addr;
  // [orion] state_file / --state-file: the VMs attached to this oriond (vm_state.h), restored at
  // start so a restart changes nothing a running VM sees. "" = not kept (attachments die with oriond).
  std::string state_file = "/var/lib/orion/vms.json";
  uint64_t net_stall_ms = 30000;  // [orion] net_stall_ms: a network client silent mid-frame this long is dropped
  std::string client_key;  // [orion] client_key: network clients must present it (ORION_KEY); "" = open  // root-only
                           // admin socket (libvirt hook, orion-vm)
};

// Parses an INI text (Orion's server.conf syntax: `key = value`, `;` or `#` comments, quoted
// "true"/"false"). Unknown keys are errors naming them; so are bad values, e.g.
// "server.conf: [server] vgpu_count = 'abc' is not a number in 1..100".
Result<ServerConfig> ParseServerConfig(const std::string& text, const std::string& source,
                                       ServerConfig base = ServerConfig{});
// Reads and parses a file. kNotFound when it does not exist.
Result<ServerConfig> LoadServerConfig(const std::string& path, ServerConfig base = ServerConfig{});
// "auto" | "cuda" | "sim".
Result<BackendKind> ParseBackend(const std::string& s);

}  // namespace orion::host
