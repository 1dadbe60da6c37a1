// orion-controller: the vGPU pool's REST service (controller/openapi.yaml; the routes: rest.cpp).
//
//   orion-controller start --config-file /etc/orion/controller.yaml [--listen ip:port] [--database F]
//   orion-controller migrate --from sqlite:<file> --to etcd://h:p,... [--config-file F] [--force]
#include <CLI/CLI.hpp>
#include <httplib.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <cstring>
#include <thread>

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "orion/controller/client.h"
#include "orion/controller/config.h"
#include "orion/controller/service.h"
#include "front.h"
#include "rest.h"

namespace oc = orion::controller;
using orion::Code;

namespace {

std::atomic<oc::FrontServer*> g_server{nullptr};

// The sweeper's period, and the gap after which it treats the controller as having been away.
constexpr int kSweepPeriodMs = 200;
constexpr uint64_t kClockGapMs = 10 * kSweepPeriodMs;

void OnSignal(int) {
  if (oc::FrontServer* s = g_server.load()) s->Stop();  // an eventfd write: async-signal-safe
}

// Connections the front keeps open at once: 4096, or fewer if the descriptor limit (raised to its
// hard limit first) leaves less room beside the store's own descriptors.
size_t MaxConnections() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 256;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &r);
    (void)getrlimit(RLIMIT_NOFILE, &r);
  }
  constexpr rlim_t kReserved = 256;  // SQLite, etcd connections, logs
  if (r.rlim_cur <= 2 * kReserved) return 256;
  return static_cast<size_t>(std::min<rlim_t>(4096, r.rlim_cur - kReserved));
}

// orion-controller migrate: copies servers, allocations and assignments; prints what it did.
int Migrate(const std::string& config_file, const std::string& from, const std::string& to, bool force) {
  oc::ServiceOptions opts;
  if (auto cfg = oc::LoadControllerConfig(config_file); cfg.ok()) {
    opts = cfg->service;
  } else if (cfg.status().code() != Code::kNotFound) {
    std::fprintf(stderr, "orion-controller: %s\n", cfg.status().message().c_str());
    return 2;
  }
  auto src = oc::OpenStore(from, from.rfind("etcd://", 0) == 0 ? opts.etcd_tls : oc::EtcdTls{});
  if (!src.ok()) {
    std::fprintf(stderr, "orion-controller migrate: --from %s: %s\n", from.c_str(), src.status().message().c_str());
    return 1;
  }
  auto dst = oc::OpenStore(to, to.rfind("etcd://", 0) == 0 ? opts.etcd_tls : oc::EtcdTls{});
  if (!dst.ok()) {
    std::fprintf(stderr, "orion-controller migrate: --to %s: %s\n", to.c_str(), dst.status().message().c_str());
    return 1;
  }
  auto r = oc::MigrateState(**src, **dst, opts, force);
  if (!r.ok()) {
    std::fprintf(stderr, "orion-controller migrate: %s\n", r.status().message().c_str());
    return 1;
  }
  std::printf("%s\n", r->c_str());
  return 0;
}

}  // namespace

static int Main(int argc, char** argv) {
  // A peer that closes a TLS connection while we write to it (etcd refusing our client certificate,
  // a client gone mid-reply) makes OpenSSL's write(2) raise SIGPIPE, which would end the controller.
  // Every write checks its result instead.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"orion-controller: the Orion vGPU pool (REST on :9123)"};
  app.require_subcommand(1);
  auto* start = app.add_subcommand("start", "serve the REST API");
  std::string config_file = "/etc/orion/controller.yaml", listen, database;
  start->add_option("--config-file", config_file, "controller.yaml");
  start->add_option("--listen", listen, "ip:port (overrides listen)");
  start->add_option("--database", database, "sqlite:<file>, a file, or etcd://h:p,h:p,... (overrides database)");
  auto* migrate = app.add_subcommand("migrate", "copy a pool's state into another store (SQLite into etcd)");
  std::string from, to;
  bool force = false;
  migrate->add_option("--from", from, "sqlite:<file> (no controller may be running on it)")->required();
  migrate->add_option("--to", to, "etcd://h1:2379,h2:2379,...")->required();
  migrate->add_option("--config-file", config_file, "controller.yaml (lease and server times for the copied state)");
  migrate->add_flag("--force", force, "copy even if the destination already holds a pool");
  CLI11_PARSE(app, argc, argv);
  if (migrate->parsed()) return Migrate(config_file, from, to, force);

  auto cfg = oc::LoadControllerConfig(config_file);
  if (!cfg.ok()) {
    if (cfg.status().code() != Code::kNotFound) {
      std::fprintf(stderr, "orion-controller: %s\n", cfg.status().message().c_str());
      return 2;
    }
    std::fprintf(stderr, "orion-controller: %s; using defaults\n", cfg.status().message().c_str());
    cfg = oc::ControllerConfig{};
  }
  if (!listen.empty()) cfg->listen = listen;
  if (!database.empty()) cfg->service.database = database;
  auto ep = oc::ParseEndpoint(cfg->listen);
  if (ep.ok() && cfg->listen.find("://") != std::string::npos)
    ep =
        orion::InvalidArgument("'" + cfg->listen + "' is not ip:port (HTTPS: tls_cert and tls_key in the config file)");
  if (!ep.ok()) {
    std::fprintf(stderr, "orion-controller: listen: %s\n", ep.status().message().c_str());
    return 2;
  }
  // The database (keys' effects, every allocation, host and process names) and the log are the
  // controller's own: 0600 (SQLite's -wal and -shm files too).
  umask(077);
  std::vector<spdlog::sink_ptr> sinks{std::make_shared<spdlog::sinks::stderr_color_sink_mt>()};
  if (!cfg->log_file.empty()) {
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(cfg->log_file));
      ::chmod(cfg->log_file.c_str(), 0600);
    } catch (const spdlog::spdlog_ex& e) {
      std::fprintf(stderr, "orion-controller: log_file: %s\n", e.what());
      return 2;
    }
  }
  auto log = std::make_shared<spdlog::logger>("controller", sinks.begin(), sinks.end());
  log->flush_on(spdlog::level::info);
  cfg->service.clock_gap_ms = kClockGapMs;
  auto svc = oc::Service::Open(cfg->service);
  if (!svc.ok()) {
    log->error("{}", svc.status().message());
    return 1;
  }
  if (cfg->keys.empty()) {
    log->warn(
        "authentication is off: anyone who reaches {} can allocate and release vGPUs "
        "(set authentication in the config file)",
        cfg->listen);
  }
  auto api = oc::MakeRestApi(*cfg, std::move(*svc), log);
  // The front reads every connection on one thread, bounded (front.h): an idle or slow connection
  // never holds a route's thread, and a body is kept only after its head passed PreRouting.
  oc::FrontLimits limits;
  limits.max_body_bytes = oc::kMaxBodyBytes;
  limits.max_connections = MaxConnections();
  oc::FrontServer server(limits, [&api](const httplib::Request& head, httplib::Response& res) {
    return api->PreRouting(head, res) == httplib::Server::HandlerResponse::Handled;
  });
  server.set_payload_max_length(oc::kMaxBodyBytes);
  if (!cfg->tls_cert.empty()) {
    if (const std::string why = server.UseTls(cfg->tls_cert, cfg->tls_key, cfg->tls_client_ca); !why.empty()) {
      log->error("cannot serve HTTPS: {}", why);
      return 2;
    }
  }
  api->Install(server);
  // cpp-httplib listens with a backlog of 5: a burst of clients (each request is a fresh
  // connection) overflows it and waits a whole SYN retransmit (1 s). Keep the socket and listen
  // again with a real backlog (Linux allows re-listening to resize the queue).
  // Not httplib::default_socket_options: it sets SO_REUSEPORT, so a second controller (another
  // database) would bind the same address and the kernel would split requests between the two
  // pools. SO_REUSEADDR only lets a restart bind over TIME_WAIT connections; a live listener still
  // makes bind fail with "Address already in use".
  int listen_fd = -1;
  server.set_socket_options([&listen_fd](socket_t sock) {
    const int one = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    listen_fd = sock;
  });
  if (!server.bind_to_port(ep->host, ep->port)) {
    log->error("cannot listen on {}: {}", cfg->listen, std::strerror(errno));
    return 1;
  }
  if (listen_fd >= 0 && ::listen(listen_fd, 1024) != 0)
    log->warn("cannot enlarge the listen backlog: {}", std::strerror(errno));
  g_server = &server;
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::atomic<bool> stop{false};
  std::thread sweeper([&] {
    for (uint64_t tick = 1; !stop.load(); ++tick) {
      // A shared store (etcd) keeps leases itself; a sweep there is a full read, once a second.
      if (!api->service().store().shared() || tick % 5 == 0) {
        for (const auto& what : api->service().Sweep(oc::WallMs())) log->info("{}", what);
      }
      if (tick % 10 == 0) api->service().Checkpoint();
      std::this_thread::sleep_for(std::chrono::milliseconds(kSweepPeriodMs));
    }
  });
  const oc::Json sum = api->service().Summary();
  log->info("Orion Controller listens on {}{} (store {} {}, placement {}, {} servers, {} allocations, {} assignments)",
            cfg->tls_cert.empty() ? "http://" : "https://", cfg->listen, api->service().store().kind(),
            api->service().store().where(), sum["policy"].get<std::string>(), sum["servers"].get<size_t>(),
            sum["allocations"].get<size_t>(), sum["assignments"].get<size_t>());
  const bool served = server.Serve(listen_fd);
  if (!served) log->error("the connection front cannot start: {}", std::strerror(errno));
  stop = true;
  sweeper.join();
  log->info("Orion Controller stops");
  return served ? 0 : 1;
}

// Whatever escapes (a failed allocation, a library's exception) ends the program with its reason,
// not with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orion-controller: %s\n", e.what());
    return 1;
  }
}
