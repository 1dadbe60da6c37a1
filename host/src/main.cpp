// oriond: the Orion server daemon. Flags override /etc/orion/server.conf (Orion's keys and flags).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "orion/host/config.h"
#include "orion/host/daemon.h"
#include "orion/host/doorbell_keeper.h"

namespace {
orion::host::Daemon* g_daemon = nullptr;
void OnSignal(int) {
  if (g_daemon != nullptr) g_daemon->Stop();
}
}  // namespace

static int Main(int argc, char** argv) {
  // The doorbell keeper (orion/host/doorbell_keeper.h): oriond starts its own binary this way.
  if (argc == 4 && std::string(argv[1]) == "--doorbell-keeper") {
    return orion::host::RunDoorbellKeeper(std::atoi(argv[2]), argv[3]);
  }
  CLI::App app{"oriond: the Orion vGPU server"};
  app.set_version_flag("--version", "oriond " ORION_VERSION_STRING " (build " ORION_BUILD_STRING ")");
  std::string config_path = "/etc/orion/server.conf";
  std::string backend, bind, log_dir, cache_dir, sim_log;
  std::vector<std::string> shm;
  int port = 0, max_clients = 0;
  bool foreground = false, daemonize = false, shm_flag = false, kvm_flag = false, rdma_flag = false;
  uint32_t sim_gpus = 0;
  uint64_t sim_mem = 0, lease_ms = 0;
  auto* config_opt = app.add_option("-c,--config", config_path, "configuration file");
  app.add_option("--backend", backend, "auto | cuda | sim")->check(CLI::IsMember({"auto", "cuda", "sim"}));
  app.add_flag("--foreground", foreground, "log to the screen too");
  app.add_option("--log-dir", log_dir, "log directory (server.log, session/)");
  app.add_option("--shm", shm, "a region to serve (repeatable)");
  app.add_option("-b,--bind", bind, "bind address");
  app.add_option("-p,--port", port, "TCP port for network clients (0: none)")->check(CLI::Range(0, 65533));
  app.add_flag("-m", shm_flag, "enable shared-memory clients");
  app.add_flag("-k", kvm_flag, "enable KVM clients over ivshmem");
  app.add_flag("-r", rdma_flag, "enable RDMA clients");
  app.add_option("-n,--max-clients", max_clients, "most sessions at once")->check(CLI::Range(1, 4096));
  app.add_flag("-d,--daemon", daemonize, "run in the background");
  app.add_option("--cache-dir", cache_dir, "module cache directory");
  uint64_t cache_max_mib = 0;
  app.add_option("--cache-max-mib", cache_max_mib,
                 "module cache size bound in MiB (oldest entries evicted; default 2048)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 24));
  app.add_option("--sim-launch-log", sim_log, "sim: append every kernel launch to this file");
  app.add_option("--sim-gpus", sim_gpus, "sim: number of simulated GPUs")->check(CLI::Range(1, 64));
  app.add_option("--sim-gpu-mem", sim_mem, "sim: MiB per simulated GPU")->check(CLI::Range(64, 1 << 24));
  std::string cuda_driver;
  app.add_option("--cuda-driver", cuda_driver, "cuda: the driver library to dlopen (default libcuda.so.1)");
  std::string sim_execute;
  uint64_t sim_timeout_ms = 0;
  uint32_t sim_workers = 0;
  app.add_option("--sim-execute", sim_execute,
                 "sim: run kernels from their PTX (ptx, default) or only validate and log them (none)")
      ->check(CLI::IsMember({"ptx", "none"}));
  std::string sim_unexecutable;
  app.add_option("--sim-unexecutable", sim_unexecutable,
                 "sim: a kernel the executor cannot run (SASS only, ...) fails its launch (refuse, default) or is "
                 "accepted and NOT run (skip: API-level testing only, results are not computed)")
      ->check(CLI::IsMember({"refuse", "skip"}));
  std::string compute_share;
  app.add_option("--compute-share", compute_share,
                 "the compute-share scheduler that enforces ORION_RATIO (on, default; off: ratios are admitted "
                 "and placed but neither enforced nor measured)")
      ->check(CLI::IsMember({"on", "off"}));
  std::string sim_driver;
  app.add_option("--sim-driver-version", sim_driver,
                 "sim: the CUDA driver version it reports, MAJOR.MINOR (12.0 to 13.9; default: this build's), "
                 "which decides the newest PTX ISA it loads")
      ->check([](const std::string& v) -> std::string {
        unsigned major = 0, minor = 0;
        char tail = 0;
        if (std::sscanf(v.c_str(), "%u.%u%c", &major, &minor, &tail) != 2 || major < 12 || major > 13 || minor > 9)
          return "expected MAJOR.MINOR between 12.0 and 13.9";
        return "";
      });
  app.add_option("--sim-kernel-timeout", sim_timeout_ms,
                 "sim: end a kernel running longer than this many ms (CUDA_ERROR_LAUNCH_TIMEOUT)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{86400000}));
  app.add_option("--sim-workers", sim_workers, "sim: host threads running one launch's blocks (default: all cores)")
      ->check(CLI::Range(1, 1024));
  std::string control;
  app.add_option("--control-socket", control, "admin socket for the libvirt hook and orion-vm ('' = none)");
  std::string state_file;
  app.add_option("--state-file", state_file,
                 "where oriond keeps its VM attachments (default /var/lib/orion/vms.json; '' = not kept)");
  app.add_option("--lease-timeout-ms", lease_ms, "free a client's vGPUs this long after its lease stops")
      ->check(CLI::Range(200, 600000));
  CLI11_PARSE(app, argc, argv);

  auto conf = orion::host::LoadServerConfig(config_path);
  if (!conf.ok()) {
    if (conf.status().code() != orion::Code::kNotFound || config_opt->count() > 0) {
      std::fprintf(stderr, "oriond: %s\n", conf.status().message().c_str());
      return 2;
    }
    conf = orion::host::ServerConfig{};
  }
  orion::host::ServerConfig c = *conf;
  if (!backend.empty()) c.backend = *orion::host::ParseBackend(backend);
  if (foreground) c.log_to_screen = true;
  if (!log_dir.empty()) c.log_dir = log_dir;
  if (!shm.empty()) c.shm_paths = shm;
  if (!bind.empty()) c.bind_addr = bind;
  if (app.count("--port") > 0) c.listen_port = static_cast<uint16_t>(port);
  if (shm_flag) c.enable_shm = true;
  if (kvm_flag) c.enable_kvm = true;
  if (rdma_flag) c.enable_rdma = true;
  if (max_clients != 0) c.max_clients = static_cast<uint32_t>(max_clients);
  if (!cache_dir.empty()) c.cache_dir = cache_dir;
  if (cache_max_mib != 0) c.cache_max_mib = cache_max_mib;
  if (!sim_log.empty()) c.sim_launch_log = sim_log;
  if (sim_gpus != 0) c.sim_gpus = sim_gpus;
  if (sim_mem != 0) c.sim_gpu_mem_mib = sim_mem;
  if (!sim_execute.empty()) c.sim_execute = sim_execute == "ptx";
  if (!sim_unexecutable.empty()) c.sim_skip_unexecutable = sim_unexecutable == "skip";
  if (!compute_share.empty()) c.compute_share = compute_share == "on";
  if (unsigned major = 0, minor = 0;
      !sim_driver.empty() && std::sscanf(sim_driver.c_str(), "%u.%u", &major, &minor) == 2)
    c.sim_driver_version = static_cast<int>(major * 1000 + minor * 10);
  if (!cuda_driver.empty()) c.cuda_driver = cuda_driver;
  if (sim_timeout_ms != 0) c.sim_kernel_timeout_ms = sim_timeout_ms;
  if (sim_workers != 0) c.sim_workers = sim_workers;
  if (lease_ms != 0) c.lease_timeout_ms = lease_ms;
  if (app.count("--control-socket") > 0) c.control_socket = control;
  if (app.count("--state-file") > 0) c.state_file = state_file;

  // -d: the parent stays until the daemon has started or failed, and says which. A failure is printed
  // by the child itself (its stderr is still the terminal until Start() succeeds); "ok" on the pipe
  // means it serves. Otherwise as daemon(0, 0): a new session, cwd /, stdio on /dev/null.
  int ready_fd = -1;
  if (daemonize) {
    int fds[2];
    if (pipe(fds) != 0) {
      std::perror("oriond: pipe");
      return 1;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("oriond: fork");
      return 1;
    }
    if (pid > 0) {
      close(fds[1]);
      char buf[2] = {};
      ssize_t n;
      do {
        n = read(fds[0], buf, sizeof buf);
      } while (n < 0 && errno == EINTR);
      if (n == 2 && buf[0] == 'o' && buf[1] == 'k') {
        if (c.log_to_file) {
          std::printf("oriond: running in the background (pid %d); log: %s/server.log\n", static_cast<int>(pid),
                      c.log_dir.c_str());
        } else {
          std::printf("oriond: running in the background (pid %d)\n", static_cast<int>(pid));
        }
        return 0;
      }
      int st = 0;
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      if (WIFSIGNALED(st))
        std::fprintf(stderr, "oriond: the daemon died (signal %d) before it started\n", WTERMSIG(st));
      return 1;
    }
    close(fds[0]);
    ready_fd = fds[1];
    if (setsid() < 0 || chdir("/") != 0) {
      std::perror("oriond: daemon");
      return 1;
    }
  }
  orion::host::Daemon d(c);
  g_daemon = &d;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (orion::Status s = d.Start(); !s.ok()) {
    std::fprintf(stderr, "oriond: %s\n", s.message().c_str());
    return 1;
  }
  if (ready_fd >= 0) {
    const int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, STDIN_FILENO);
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
      if (null > STDERR_FILENO) close(null);
    }
    if (write(ready_fd, "ok", 2) != 2) {
      // The parent is gone: nobody to tell.
    }
    close(ready_fd);
  }
  return d.Run();
}

// Whatever escapes (a failed allocation, a library's exception) ends the program with its reason,
// not with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "oriond: %s\n", e.what());
    return 1;
  }
}
