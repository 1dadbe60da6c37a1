// orion/controller/config.h — controller.yaml (documented in README "Controller").
//
//   listen: 0.0.0.0:9123
//   database: /var/lib/orion/controller.db   # or sqlite:<file>, or etcd://h1:2379,h2:2379,h3:2379
//   placement: pack            # pack | spread
//   lease_ttl_s: 15
//   server_timeout_s: 10
//   server_release_s: 60
//   pending_confirm_s: 60      # a never-confirmed allocation expires after this, renewed or not
//   max_allocations_per_key: 64  # live allocations per client key
//   max_vgpus_per_key: 64        # vGPUs across them (0: no limit)
//   max_gmem_mib_per_key: 0      # GPU memory across them, MiB (0: no limit)
//   log_file: /var/log/orion/controller.log   # "" = stderr only
//   tls_cert: /etc/orion/controller.crt   # HTTPS only (both or neither): the certificate chain, PEM
//   tls_key: /etc/orion/controller.key    # its private key, PEM
//   tls_client_ca: /etc/orion/clients-ca.crt  # mutual TLS: clients need a certificate it signed
//   etcd_tls_ca: /etc/orion/etcd-ca.crt       # etcd over HTTPS: its members' certificates chain to this
//   etcd_tls_cert: /etc/orion/etcd-client.crt # with etcd_tls_key: a client certificate (--client-cert-auth)
//   etcd_tls_key: /etc/orion/etcd-client.key
//   authentication:            # empty or absent = open (a warning at start)
//     client: [key1, key2]     # a string or a list
//     server: key3
//     admin: key4
#pragma once

#include <map>
#include <string>

#include "orion/common/status.h"
#include "orion/controller/service.h"

namespace orion::controller {

enum class Role { kClient = 1, kServer = 2, kAdmin = 4 };

struct ControllerConfig {
  std::string listen = "0.0.0.0:9123";
  ServiceOptions service{.database = "/var/lib/orion/controller.db"};
  std::string log_file;
  std::string tls_cert, tls_key;     // both: HTTPS only; neither: plain HTTP
  std::string tls_client_ca;         // mutual TLS (needs tls_cert)
  std::map<std::string, Role> keys;  // empty: authentication is off
  // Server keys bound to one server (authentication.server: {key: K, server: ID}): key -> server id.
  // Such a key registers, heartbeats and serves as that server only.
  std::map<std::string, std::string> key_servers;
};

// Errors name the file and the key: "controller.yaml: placement 'x' is not pack or spread".
Result<ControllerConfig> ParseControllerConfig(const std::string& yaml_text, const std::string& source);
Result<ControllerConfig> LoadControllerConfig(const std::string& path);

}  // namespace orion::controller
