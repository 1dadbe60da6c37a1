// orion-smi: an nvidia-smi look-alike for Orion clients. Lists the vGPUs that processes hold
// (server, physical GPU, vGPU, GPU name, memory used / quota) and the processes using them.
//   - With an Orion Controller (cluster mode): from the controller, this host's processes (--all:
//     every client host). Memory "used" is what oriond reports in its heartbeats (device allocations
//     plus context overhead), so it lags by up to one heartbeat (2 s by default).
//   - Standalone (no controller configured): from the local oriond's control socket (`sessions`;
//     every session it serves, on shared memory, in VMs and over the network, memory used as of
//     now). Where that socket cannot be reached (a container or a VM guest, or no permission), from
//     this client's Orion region: its channels in use, the VM's vGPUs, whether oriond serves it.
//
//   orion-smi [--all] [--json] [--controller ip:port] [--oriond SOCKET]
//   orion-smi migrate SESSION --to HOST:PORT [--oriond SOCKET]
//     moves a session (an id from the listing) of the local oriond, while its program runs, to the
//     oriond listening at HOST:PORT (issue #24; docs/migration.md says what can move). Prints
//     oriond's answer; exit status 0 when the session moved.
// Controller: --controller, else $ORION_CONTROLLER, else client.conf [controller] controller_addr.
// Key: $ORION_CONTROLLER_KEY, else $ORION_KEY. oriond: --oriond, else /run/orion/oriond.sock
// (server.conf's control_socket default). Exit status 1 when nothing could be asked.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <exception>
#include <cstring>
#include <ctime>
#include <string>

#include "orion/controller/client.h"
#include "orion/host/control.h"
#include "orion/ivshmem/discover.h"
#include "orion/ivshmem/region.h"

namespace {

std::string Fit(std::string s, size_t n) {
  if (s.size() > n) s = s.substr(0, n - 1) + "~";
  return s;
}

// The two tables, for allocations shaped as the controller lists them (oriond's `sessions` too).
void PrintTables(const nlohmann::json& list, const std::string& source, const std::string& scope) {
  char stamp[64];
  time_t t = time(nullptr);
  strftime(stamp, sizeof stamp, "%a %b %e %H:%M:%S %Y", localtime(&t));
  const std::string bar = "+" + std::string(85, '-') + "+";
  std::printf("%s\n", stamp);
  std::printf("%s\n", bar.c_str());
  std::printf("| %-40s%42s |\n", "ORION-SMI", Fit(source, 42).c_str());
  std::printf("| %-40s%42s |\n", Fit(scope, 40).c_str(), "");
  std::printf("|%s|\n", std::string(85, '-').c_str());
  std::printf("| %-21s | %4s | %4s | %-24s | %-20s |\n", "Server", "pGPU", "vGPU", "Physical GPU", "Memory-Usage");
  std::printf("|%s|\n", std::string(85, '=').c_str());
  size_t rows = 0;
  for (const auto& a : list) {
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
  for (const auto& a : list) {
    const auto c = a.value("client", nlohmann::json::object());
    for (const auto& p : a.value("placements", nlohmann::json::array())) {
      std::printf("| %-21s %4u %4u %8u  %-20s %-8s %9lluMiB |\n", Fit(p.value("server", ""), 21).c_str(),
                  p.value("pgpu", 0u), p.value("vgpu", 0u), c.value("pid", 0u), Fit(c.value("process", ""), 20).c_str(),
                  Fit(c.value("host", ""), 8).c_str(),
                  static_cast<unsigned long long>(p.value("used_mib", uint64_t{0})));
      ++procs;
    }
  }
  if (procs == 0) std::printf("| %-83s |\n", "No running processes found");
  std::printf("%s\n", bar.c_str());
  // Compute share (README "Compute share"): each process's tenant on each physical GPU.
  std::printf("\n%s\n", bar.c_str());
  std::printf("| %-83s |\n", "Compute:");
  std::printf("| %-21s %4s %4s %8s  %-14s %8s %8s %10s |\n", "Server", "pGPU", "vGPU", "PID", "Ratio", "Last 1s",
              "Last 10s", "Device");
  std::printf("|%s|\n", std::string(85, '=').c_str());
  size_t tenants = 0;
  auto pct = [](const nlohmann::json& v) {
    return v.is_number() ? std::to_string(std::lround(v.get<double>() * 100)) + "%" : std::string("-");
  };
  for (const auto& a : list) {
    const auto c = a.value("client", nlohmann::json::object());
    for (const auto& p : a.value("placements", nlohmann::json::array())) {
      const auto k = p.value("compute", nlohmann::json());
      if (!k.is_object()) continue;
      const unsigned ratio = k.value("ratio", 0u);
      std::string want = ratio == 0 ? std::string("best effort")
                                    : std::to_string(ratio) + "% " + k.value("policy", std::string("share"));
      if (!k.value("enforced", false)) want += " (off)";  // placed but not enforced (an oriond without the scheduler)
      std::printf("| %-21s %4u %4u %8u  %-14s %8s %8s %9.1fs |\n", Fit(p.value("server", ""), 21).c_str(),
                  p.value("pgpu", 0u), p.value("vgpu", 0u), c.value("pid", 0u), want.c_str(),
                  pct(k.value("share_1s", nlohmann::json())).c_str(),
                  pct(k.value("share_10s", nlohmann::json())).c_str(), k.value("device_s", 0.0));
      ++tenants;
    }
  }
  if (tenants == 0) std::printf("| %-83s |\n", "No process is scheduled");
  std::printf("%s\n", bar.c_str());
}

// What a client without access to oriond can see: its region's header (informational: oriond
// enforces its own copy of every limit).
int RegionView(bool json, const std::string& oriond_why) {
  auto nothing = [&](const std::string& region_why) {
    std::fprintf(stderr,
                 "orion-smi: no Orion Controller configured (ORION_CONTROLLER, or controller_addr in [controller] of "
                 "client.conf), %s, and no Orion region: %s\n",
                 oriond_why.c_str(), region_why.c_str());
    return 1;
  };
  auto where = orion::ivshmem::FindClientRegion();
  if (!where.ok()) return nothing(where.status().message());
  auto region = orion::ivshmem::MappedRegion::Open(where->path);
  if (!region.ok()) return nothing(region.status().message());
  auto hdr = orion::ivshmem::ValidateHeader(region->data(), region->size());
  if (!hdr.ok()) {
    std::fprintf(stderr, "orion-smi: %s: %s\n", where->path.c_str(), hdr.status().message().c_str());
    return 1;
  }
  const orion::ivshmem::RegionHeader* h = *hdr;
  const uint64_t beat = h->server_heartbeat.load();
  timespec ts{0, 350000000};  // oriond bumps the heartbeat every 100 ms
  nanosleep(&ts, nullptr);
  const bool served = h->server_heartbeat.load() != beat;
  nlohmann::json channels = nlohmann::json::array();
  uint32_t in_use = 0;
  static const char* kStates[] = {"free", "claimed", "active", "dead", "detached"};
  for (uint32_t i = 0; i < h->channel_count; ++i) {
    const uint32_t st = h->channels[i].state.load();
    if (st == orion::ivshmem::kChannelFree) continue;
    ++in_use;
    channels.push_back({{"channel", i}, {"state", st < 5 ? kStates[st] : "?"}, {"session", h->channels[i].session_id}});
  }
  const bool vm = (h->features & orion::ivshmem::kFeatureVmLimits) != 0;
  if (json) {
    nlohmann::json j = {{"region", where->path},
                        {"found_through", where->source},
                        {"served", served},
                        {"channels", h->channel_count},
                        {"in_use", channels}};
    if (vm) j["vm"] = {{"vgpus", h->vm_vgpus}, {"gmem_mib", h->vm_gmem_bytes >> 20}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  const std::string bar = "+" + std::string(85, '-') + "+";
  std::printf("%s\n", bar.c_str());
  std::printf("| %-83s |\n", "ORION-SMI (standalone: this client's Orion region; oriond itself was not asked)");
  std::printf("| %-83s |\n", Fit("region " + where->path + " (" + where->source + ")", 83).c_str());
  std::printf("|%s|\n", std::string(85, '-').c_str());
  std::printf("| %-83s |\n",
              (std::string("oriond serves it: ") + (served ? "yes" : "no (its heartbeat has stopped)")).c_str());
  if (vm) {
    std::printf("| %-83s |\n", ("vGPUs of this VM: " + std::to_string(h->vm_vgpus) + " x " +
                                std::to_string(h->vm_gmem_bytes >> 20) + " MiB")
                                   .c_str());
  }
  std::printf("| %-83s |\n", ("channels (one per CUDA process): " + std::to_string(h->channel_count) + ", " +
                              std::to_string(in_use) + " in use")
                                 .c_str());
  for (const auto& c : channels) {
    std::printf("| %-83s |\n", ("  channel " + c["channel"].dump() + ": " + c["state"].get<std::string>() +
                                ", session " + c["session"].dump())
                                   .c_str());
  }
  std::printf("%s\n", bar.c_str());
  if (vm) {
    // Inside a VM guest there is no oriond to ask: it runs on the host, which serves this region.
    std::printf(
        "This is a VM: its oriond runs on the host. For every process's vGPUs and memory, run orion-smi on the "
        "host, or use a controller; the VM's vGPUs are set there (orion-vm enable).\n");
  } else if (!oriond_why.empty()) {
    std::printf(
        "oriond's control socket was not asked (%s)%s: for every process's vGPUs and memory, run orion-smi "
        "where it can be read (--oriond), or use a controller.\n",
        oriond_why.c_str(), served ? ", though an oriond serves this region" : "");
  }
  return 0;
}

}  // namespace

static int Main(int argc, char** argv) {
  CLI::App app{"orion-smi: the vGPUs and processes of this Orion client host"};
  bool all = false, json = false;
  std::string addr, oriond = "/run/orion/oriond.sock";
  app.add_flag("--all", all, "every client host, not only this one (with a controller)");
  app.add_flag("--json", json, "print the allocations (or sessions, or region) as JSON");
  app.add_option("--controller", addr, "the Orion Controller (ip:port)");
  app.add_option("--oriond", oriond, "standalone: oriond's control socket (server.conf control_socket)");
  CLI::App* migrate = app.add_subcommand("migrate", "move a session of this oriond to another oriond, live");
  uint32_t session = 0;
  std::string to;
  migrate->add_option("SESSION", session, "the session's id (orion-smi lists them)")->required();
  migrate->add_option("--to", to, "the target oriond's TCP address, HOST:PORT")->required();
  migrate->add_option("--oriond", oriond, "the serving oriond's control socket (server.conf control_socket)");
  CLI11_PARSE(app, argc, argv);
  if (*migrate) {
    // The move finishes at the program's next synchronous call, and its state travels meanwhile.
    auto reply = orion::host::ControlRequest(oriond, "migrate " + std::to_string(session) + " " + to, 600000);
    if (!reply.ok()) {
      std::fprintf(stderr, "orion-smi: oriond at %s: %s\n", oriond.c_str(), reply.status().message().c_str());
      return 1;
    }
    const bool ok = reply->rfind("ok ", 0) == 0;
    std::fprintf(ok ? stdout : stderr, "%s\n", reply->substr(reply->find(' ') + 1).c_str());
    return ok ? 0 : 1;
  }
  if (addr.empty()) addr = orion::ivshmem::ClientControllerAddr();
  if (addr.empty()) {
    // Standalone: the local oriond, else this client's region.
    auto reply = orion::host::ControlRequest(oriond, "sessions", 5000);
    std::string why;
    if (!reply.ok()) {
      why = reply.status().message();
    } else if (reply->rfind("ok ", 0) != 0) {
      why = "oriond at " + oriond + " answered: " + reply->substr(0, 200);
    } else {
      const nlohmann::json list = nlohmann::json::parse(reply->substr(3), nullptr, false);
      if (!list.is_array()) {
        std::fprintf(stderr, "orion-smi: oriond at %s sent a malformed session list\n", oriond.c_str());
        return 1;
      }
      if (json) {
        std::printf("%s\n", list.dump(2).c_str());
        return 0;
      }
      PrintTables(list, "oriond " + oriond, "standalone: every session of this oriond");
      return 0;
    }
    return RegionView(json, why);
  }
  auto ep = orion::controller::ParseEndpoints(addr);
  if (!ep.ok()) {
    std::fprintf(stderr, "orion-smi: %s\n", ep.status().message().c_str());
    return 1;
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  orion::controller::ControllerClient cc(*ep, orion::ivshmem::ClientControllerKey(), 5000);
  auto list =
      cc.Call("GET", all ? "/v1/allocations?kind=process" : std::string("/v1/allocations?kind=process&host=") + host);
  if (!list.ok()) {
    std::fprintf(stderr, "orion-smi: Orion Controller %s: %s\n", cc.endpoint().text().c_str(),
                 list.status().message().c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n", list->dump(2).c_str());
    return 0;
  }
  PrintTables(*list, "Orion Controller " + cc.endpoint().text(),
              all ? "all client hosts" : std::string("client host ") + host);
  return 0;
}

// Whatever escapes (a failed allocation, a library's exception) ends the program with its reason,
// not with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orion-smi: %s\n", e.what());
    return 1;
  }
}
