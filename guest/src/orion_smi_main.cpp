// orion-smi: an nvidia-smi look-alike for Orion clients. Lists, from the Orion Controller, the vGPUs
// that this host's processes hold (server, physical GPU, vGPU, GPU name, memory used / quota) and
// the processes using them. Memory "used" is what oriond reports in its heartbeats (device
// allocations plus context overhead), so it lags by up to one heartbeat (2 s by default).
//
//   orion-smi [--all] [--json] [--controller ip:port]
// Controller: --controller, else $ORION_CONTROLLER, else client.conf [controller] controller_addr.
// Key: $ORION_CONTROLLER_KEY, else $ORION_KEY. Exit status 1 when the controller cannot be asked.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "orion/controller/client.h"
#include "orion/ivshmem/discover.h"

namespace {

std::string Fit(std::string s, size_t n) {
  if (s.size() > n) s = s.substr(0, n - 1) + "~";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"orion-smi: the vGPUs and processes of this Orion client host"};
  bool all = false, json = false;
  std::string addr;
  app.add_flag("--all", all, "every client host, not only this one");
  app.add_flag("--json", json, "print the controller's allocations as JSON");
  app.add_option("--controller", addr, "the Orion Controller (ip:port)");
  CLI11_PARSE(app, argc, argv);
  if (addr.empty()) addr = orion::ivshmem::ClientControllerAddr();
  if (addr.empty()) {
    std::fprintf(stderr, "orion-smi: no Orion Controller configured (ORION_CONTROLLER, or controller_addr in "
                         "[controller] of client.conf)\n");
    return 1;
  }
  auto ep = orion::controller::ParseEndpoints(addr);
  if (!ep.ok()) {
    std::fprintf(stderr, "orion-smi: %s\n", ep.status().message().c_str());
    return 1;
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  orion::controller::ControllerClient cc(*ep, orion::ivshmem::ClientControllerKey(), 5000);
  auto list = cc.Call("GET", all ? "/v1/allocations?kind=process" : std::string("/v1/allocations?kind=process&host=") + host);
  if (!list.ok()) {
    std::fprintf(stderr, "orion-smi: Orion Controller %s: %s\n", cc.endpoint().text().c_str(), list.status().message().c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n", list->dump(2).c_str());
    return 0;
  }
  char stamp[64];
  time_t t = time(nullptr);
  strftime(stamp, sizeof stamp, "%a %b %e %H:%M:%S %Y", localtime(&t));
  const std::string bar = "+" + std::string(85, '-') + "+";
  std::printf("%s\n", stamp);
  std::printf("%s\n", bar.c_str());
  std::printf("| %-40s%42s |\n", "ORION-SMI", ("Orion Controller " + cc.endpoint().text()).c_str());
  std::printf("| %-40s%42s |\n", all ? "all client hosts" : (std::string("client host ") + host).c_str(), "");
  std::printf("|%s|\n", std::string(85, '-').c_str());
  std::printf("| %-21s | %4s | %4s | %-24s | %-20s |\n", "Server", "pGPU", "vGPU", "Physical GPU", "Memory-Usage");
  std::printf("|%s|\n", std::string(85, '=').c_str());
  size_t rows = 0;
  for (const auto& a : *list) {
    for (const auto& p : a.value("placements", nlohmann::json::array())) {
      const std::string mem = std::to_string(p.value("used_mib", uint64_t{0})) + "MiB / " +
                              std::to_string(p.value("gmem_mib", uint64_t{0})) + "MiB";
      std::printf("| %-21s | %4u | %4u | %-24s | %20s |\n", Fit(p.value("server", ""), 21).c_str(), p.value("pgpu", 0u),
                  p.value("vgpu", 0u), Fit(p.value("gpu_name", ""), 24).c_str(), mem.c_str());
      ++rows;
    }
  }
  if (rows == 0) std::printf("| %-83s |\n", "No vGPU is held.");
  std::printf("%s\n\n", bar.c_str());
  std::printf("%s\n", bar.c_str());
  std::printf("| %-83s |\n", "Processes:");
  std::printf("| %-21s %4s %4s %8s  %-20s %-8s %12s |\n", "Server", "pGPU", "vGPU", "PID", "Process name", "Host",
              "GPU Memory");
  std::printf("|%s|\n", std::string(85, '=').c_str());
  size_t procs = 0;
  for (const auto& a : *list) {
    const auto c = a.value("client", nlohmann::json::object());
    for (const auto& p : a.value("placements", nlohmann::json::array())) {
      std::printf("| %-21s %4u %4u %8u  %-20s %-8s %9lluMiB |\n", Fit(p.value("server", ""), 21).c_str(), p.value("pgpu", 0u),
                  p.value("vgpu", 0u), c.value("pid", 0u), Fit(c.value("process", ""), 20).c_str(),
                  Fit(c.value("host", ""), 8).c_str(), static_cast<unsigned long long>(p.value("used_mib", uint64_t{0})));
      ++procs;
    }
  }
  if (procs == 0) std::printf("| %-83s |\n", "No running processes found");
  std::printf("%s\n", bar.c_str());
  return 0;
}
