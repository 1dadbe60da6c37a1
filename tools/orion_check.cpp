// orion-check: Orion's diagnostics, with the layout of Orion vGPU's tool (shared/orion-reference.md).
//
//   orion-check runtime client    finds this client's region (ORION_SHM, shm_path_base, or a VM's
//                                 ivshmem device), checks its header and that oriond serves it
//   orion-check runtime server    oriond's configuration, whether it runs, and its vGPUs
//   orion-check install {server,client,controller,all}   what is installed where
// Exit status 0 when everything checked is in order, 1 otherwise.
#include <pwd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <cstring>
#include <string>

#include "orion/controller/client.h"
#include "orion/host/config.h"
#include "orion/host/control.h"
#include "orion/ivshmem/discover.h"
#include "orion/ivshmem/region.h"

namespace {

void Row(const std::string& label, const std::string& value) { std::printf("%-40s%s\n", label.c_str(), value.c_str()); }
const char* YesNo(bool b) { return b ? "[Yes]" : "[No]"; }
bool Exists(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0;
}

std::string Control(const std::string& socket_path, const std::string& line) {
  auto r = orion::host::ControlRequest(socket_path, line, 5000);
  return r.ok() ? *r : "";
}

std::string Field(const std::string& s, const std::string& key) {
  const auto at = s.find(key + "=");
  if (at == std::string::npos) return "";
  const auto end = s.find(' ', at);
  return s.substr(at + key.size() + 1, end == std::string::npos ? std::string::npos : end - at - key.size() - 1);
}

// Orion's controller lines: "Address A is reached." and the pool's vGPU counts (GET /v1/status).
bool ControllerStatus(const std::string& addr, const std::string& key) {
  std::printf("Checking Orion Controller status ...\n");
  auto ep = orion::controller::ParseEndpoints(addr);
  if (!ep.ok()) {
    std::printf("Controller address '%s' is not valid: %s\n", addr.c_str(), ep.status().message().c_str());
    return false;
  }
  orion::controller::ControllerClient cc(*ep, key, 3000);
  auto st = cc.Call("GET", "/v1/status");
  if (!st.ok()) {
    std::printf("Address %s is not reached: %s\n", cc.endpoint().text().c_str(), st.status().message().c_str());
    return false;
  }
  std::printf("Address %s is reached.\n", cc.endpoint().text().c_str());
  const auto num = [&](const char* k) { return (*st).contains(k) ? (*st)[k].dump() : std::string("?"); };
  std::printf("There are %s vGPU under managed by Orion Controller. %s vGPU are free now.\n",
              num("vgpus_total").c_str(), num("vgpus_free").c_str());
  Row("Servers up :", num("servers_up") + " of " + num("servers"));
  return true;
}

int RuntimeClient() {
  std::printf("Checking Orion client environment ...\n");
  const std::string controller = orion::ivshmem::ClientControllerAddr();
  auto where = orion::ivshmem::FindClientRegion();
  if (!where.ok()) {
    Row("Orion region :", "not found");
    if (!controller.empty()) {
      // A network client: the controller places it on a server.
      Row("Orion Controller :", controller);
      return ControllerStatus(controller, orion::ivshmem::ClientControllerKey()) ? 0 : 1;
    }
    std::printf("%s\n", where.status().message().c_str());
    return 1;
  }
  Row("Orion region :", where->path);
  Row("Found through :", where->source);
  auto region = orion::ivshmem::MappedRegion::Open(where->path);
  if (!region.ok()) {
    std::printf("%s\n", region.status().message().c_str());
    return 1;
  }
  auto hdr = orion::ivshmem::ValidateHeader(region->data(), region->size());
  if (!hdr.ok()) {
    Row("Region formatted by oriond", YesNo(false));
    std::printf("%s\n", hdr.status().message().c_str());
    return 1;
  }
  const auto* h = *hdr;
  uint32_t used = 0;
  for (uint32_t i = 0; i < h->channel_count; ++i) used += h->channels[i].state.load() != orion::ivshmem::kChannelFree;
  Row("Region size :", std::to_string(h->region_bytes >> 20) + " MiB");
  Row("Channels :", std::to_string(h->channel_count) + " (" + std::to_string(used) + " in use; one per CUDA process)");
  if ((h->features & orion::ivshmem::kFeatureVmLimits) != 0) {
    // What the host gave this VM: processes need no ORION_VGPU / ORION_GMEM (they may ask for less).
    Row("vGPUs of this VM :", std::to_string(h->vm_vgpus) + " x " + std::to_string(h->vm_gmem_bytes >> 20) + " MiB");
  }
  std::printf("Checking Orion Server status ...\n");
  const uint64_t beat = h->server_heartbeat.load();
  timespec ts{0, 350000000};
  nanosleep(&ts, nullptr);
  const bool alive = h->server_heartbeat.load() != beat;
  Row("Orion Server serves this region", YesNo(alive));
  if (!alive) std::printf("No oriond serves this region (its heartbeat has stopped): start oriond on the host.\n");
  bool ok = alive;
  if (!controller.empty()) ok &= ControllerStatus(controller, orion::ivshmem::ClientControllerKey());
  return ok ? 0 : 1;
}

int RuntimeServer(const orion::host::ServerConfig& c) {
  std::printf("Checking Orion Server status ...\n");
  const std::string status = Control(c.control_socket, "status");
  if (status.rfind("ok", 0) != 0) {
    std::printf("Orion Server is not running (no answer on %s).\n", c.control_socket.c_str());
  } else {
    struct stat st {};
    std::string user = "?";
    if (stat(c.control_socket.c_str(), &st) == 0) {
      if (passwd* pw = getpwuid(st.st_uid)) user = pw->pw_name;
    }
    Row("Orion Server is running with Linux user :", user);
  }
  Row("Enable SHM", YesNo(c.enable_shm));
  Row("Enable RDMA", YesNo(c.enable_rdma));
  Row("Enable Local QEMU-KVM with SHM", YesNo(c.enable_kvm));
  Row("Binding IP Address :", c.bind_addr);
  Row("Listening Port :", std::to_string(c.listen_port));
  bool ok = status.rfind("ok", 0) == 0;
  if (ok) {
    std::printf("There are %s vGPU under managed by Orion Server. %s vGPU are free now.\n",
                Field(status, "vgpus_total").c_str(), Field(status, "vgpus_free").c_str());
  }
  const char* env = std::getenv("ORION_CONTROLLER");
  const std::string controller = env != nullptr && *env != '\0' ? env : c.controller_addr;
  if (controller.empty()) {
    std::printf("Checking Orion Controller status ...\n");
    std::printf("No controller configured: oriond admits clients itself (standalone).\n");
  } else {
    // As oriond does:
    if (!c.controller_tls_ca.empty()) orion::controller::SetTlsCaFile(c.controller_tls_ca);
    if (!c.controller_tls_cert.empty() || !c.controller_tls_key.empty())
      orion::controller::SetTlsClientCert(c.controller_tls_cert, c.controller_tls_key);
    ok &= ControllerStatus(controller, c.controller_key);
    if (ok)
      Row("oriond registered with the controller",
          YesNo(Field(status, "controller").find("(registered)") != std::string::npos));
  }
  return ok ? 0 : 1;
}

int Install(const std::string& what, const std::string& self) {
  const std::string prefix = self.substr(0, self.rfind("/bin/") == std::string::npos ? 0 : self.rfind("/bin/"));
  bool ok = true;
  auto check = [&](const std::string& label, const std::string& path) {
    const bool e = Exists(path);
    ok &= e;
    Row(label, std::string(YesNo(e)) + " " + path);
  };
  if (what == "server" || what == "all") {
    std::printf("Checking Orion Server installation ...\n");
    check("oriond", prefix + "/bin/oriond");
    check("orion-vm", prefix + "/bin/orion-vm");
    check("server.conf", "/etc/orion/server.conf");
    // The orion-server package installs the hook as qemu.d/orion (libvirt >= 6.5 runs every script
    // there); an older install-server wrote /etc/libvirt/hooks/qemu.
    if (Exists("/etc/libvirt")) {
      check("libvirt qemu hook",
            Exists("/etc/libvirt/hooks/qemu.d/orion") ? "/etc/libvirt/hooks/qemu.d/orion" : "/etc/libvirt/hooks/qemu");
    }
  }
  if (what == "client" || what == "all") {
    std::printf("Checking Orion client installation ...\n");
    const std::string lib =
        Exists("/usr/lib/orion/libcuda.so.1") ? "/usr/lib/orion/libcuda.so.1" : prefix + "/lib/orion/libcuda.so.1";
    check("Orion runtime (libcuda.so.1)", lib);
    check("client.conf", "/etc/orion/client.conf");
  }
  if (what == "controller" || what == "all") {
    std::printf("Checking Orion Controller installation ...\n");
    check("orion-controller", prefix + "/bin/orion-controller");
    check("controller.yaml", "/etc/orion/controller.yaml");
  }
  return ok ? 0 : 1;
}

}  // namespace

static int Main(int argc, char** argv) {
  CLI::App app{"orion-check: Orion diagnostics"};
  std::string config_path = "/etc/orion/server.conf";
  app.add_option("--config", config_path, "oriond's server.conf");
  std::string what;
  auto* rt = app.add_subcommand("runtime", "check a running installation");
  rt->add_option("role", what, "server | client")->required()->check(CLI::IsMember({"server", "client"}));
  auto* in = app.add_subcommand("install", "check what is installed");
  in->add_option("role", what, "server | client | controller | all")
      ->required()
      ->check(CLI::IsMember({"server", "client", "controller", "all"}));
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  if (in->parsed()) {
    char self[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    return Install(what, n > 0 ? std::string(self, static_cast<size_t>(n)) : "/usr/local/bin/orion-check");
  }
  if (what == "client") return RuntimeClient();
  auto conf = orion::host::LoadServerConfig(config_path);
  if (!conf.ok() && conf.status().code() != orion::Code::kNotFound) {
    std::fprintf(stderr, "orion-check: %s\n", conf.status().message().c_str());
    return 1;
  }
  return RuntimeServer(conf.ok() ? *conf : orion::host::ServerConfig{});
}

// Whatever escapes (a failed allocation, a library's exception) ends the program with its reason,
// not with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orion-check: %s\n", e.what());
    return 1;
  }
}
