// orion-controller: the vGPU pool's REST service (controller/openapi.yaml).
//
//   orion-controller start --config-file /etc/orion/controller.yaml [--listen ip:port] [--database F]
#include <CLI/CLI.hpp>
#include <httplib.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include <openssl/sha.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "orion/common/text.h"
#include "orion/controller/client.h"
#include "orion/controller/config.h"
#include "orion/controller/service.h"

namespace oc = orion::controller;
using orion::Code;
using orion::Result;
using orion::Status;

namespace {

std::atomic<httplib::Server*> g_server{nullptr};

// The largest request body read (Content-Length or chunked): a register with 64 GPUs is ~20 KiB and
// a heartbeat ~100 bytes per session, so this fits thousands of sessions; httplib answers 413 to
// anything larger without reading it. Bodies of unknown keys are not read at all (pre-routing).
constexpr size_t kMaxBodyBytes = 256 * 1024;
// The sweeper's period, and the gap after which it treats the controller as having been away.
constexpr int kSweepPeriodMs = 200;
// POST /v1/servers/{id}/watch: ids per request (36 bytes each: well inside kMaxBodyBytes) and the
// longest wait (oriond's own HTTP timeout is longer).
constexpr size_t kMaxWatchedAllocations = 4096;
constexpr uint64_t kMaxWatchMs = 30000;
constexpr uint64_t kClockGapMs = 10 * kSweepPeriodMs;

// A key's identity as stored with its allocations: never the key itself.
std::string OwnerOf(const std::string& key) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), d);
  static const char* hex = "0123456789abcdef";
  std::string out = "key:";
  for (int i = 0; i < 8; ++i) {
    out += hex[d[i] >> 4];
    out += hex[d[i] & 15];
  }
  return out;
}

void OnSignal(int) {
  if (httplib::Server* s = g_server.load()) s->stop();
}

// Request latency per route, as a Prometheus histogram.
class Latency {
 public:
  static constexpr std::array<double, 10> kBounds{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 2.0};
  void Observe(const std::string& route, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    Hist& h = by_route_[route];
    for (size_t i = 0; i < kBounds.size(); ++i) h.buckets[i] += seconds <= kBounds[i];
    h.count++;
    h.sum += seconds;
  }
  std::string Text() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out = "# HELP orion_controller_request_seconds REST request latency\n"
                      "# TYPE orion_controller_request_seconds histogram\n";
    for (const auto& [route, h] : by_route_) {
      const std::string l = "route=\"" + route + "\"";
      for (size_t i = 0; i < kBounds.size(); ++i) {
        char b[32];
        std::snprintf(b, sizeof b, "%g", kBounds[i]);
        out += "orion_controller_request_seconds_bucket{" + l + ",le=\"" + b + "\"} " + std::to_string(h.buckets[i]) + "\n";
      }
      out += "orion_controller_request_seconds_bucket{" + l + ",le=\"+Inf\"} " + std::to_string(h.count) + "\n";
      out += "orion_controller_request_seconds_sum{" + l + "} " + std::to_string(h.sum) + "\n";
      out += "orion_controller_request_seconds_count{" + l + "} " + std::to_string(h.count) + "\n";
    }
    return out;
  }

 private:
  struct Hist {
    std::array<uint64_t, kBounds.size()> buckets{};
    uint64_t count = 0;
    double sum = 0;
  };
  std::mutex mu_;
  std::map<std::string, Hist> by_route_;
};

int HttpStatus(Code c) {
  switch (c) {
    case Code::kInvalidArgument: return 400;
    case Code::kPermissionDenied: return 403;
    case Code::kNotFound: return 404;
    case Code::kResourceExhausted: case Code::kAlreadyExists: case Code::kFailedPrecondition: return 409;
    case Code::kOutOfRange: return 429;  // a per-key limit (Service)
    case Code::kUnavailable: return 503;
    default: return 500;
  }
}

void SendJson(httplib::Response& res, int status, const oc::Json& j) {
  res.status = status;
  res.set_content(j.dump(), "application/json");
}

void SendError(httplib::Response& res, int status, const std::string& msg) {
  SendJson(res, status, {{"error", status}, {"message", msg}});
}

class Api {
 public:
  Api(oc::ControllerConfig cfg, std::unique_ptr<oc::Service> svc, std::shared_ptr<spdlog::logger> log)
      : cfg_(std::move(cfg)), svc_(std::move(svc)), log_(std::move(log)) {}

  void Routes(httplib::Server& s);
  // Before httplib reads a body: an unknown key is answered 401 at once (its body is never read).
  httplib::Server::HandlerResponse PreRouting(const httplib::Request& req, httplib::Response& res) {
    if (!cfg_.keys.empty() && req.path != "/v1/health") {
      std::string why;
      if (KeyRole(req, &why) == 0) {
        SendError(res, 401, why);
        res.set_header("Connection", "close");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // httplib would read (and discard) an oversize body before its 413: refuse it here unread.
    // (A chunked body is cut off by set_payload_max_length as it arrives.)
    if (req.has_header("Content-Length")) {
      const std::string n = req.get_header_value("Content-Length");
      if (n.empty() || n.size() > 18 || n.find_first_not_of("0123456789") != std::string::npos ||
          std::stoull(n) > kMaxBodyBytes) {
        SendError(res, 413, "the request body is larger than " + std::to_string(kMaxBodyBytes) + " bytes");
        res.set_header("Connection", "close");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  }
  oc::Service& service() { return *svc_; }

 private:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  // Wraps a handler with authentication (roles: a bitmask of oc::Role; 0 = open) and timing.
  httplib::Server::Handler Wrap(const std::string& route, int roles, Handler h) {
    return [this, route, roles, h](const httplib::Request& req, httplib::Response& res) {
      const auto t0 = std::chrono::steady_clock::now();
      if (Authorized(req, res, roles)) {
        try {
          h(req, res);
        } catch (const std::exception& e) {
          SendError(res, 500, std::string("internal error: ") + e.what());
        }
      }
      latency_.Observe(route, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    };
  }
  // The key's role (0: none or unknown, with the reason in *why) and, in *key, the key.
  int KeyRole(const httplib::Request& req, std::string* why, std::string* key_out = nullptr) const {
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.compare(0, prefix.size(), prefix) != 0) {
      *why = "this controller needs a key (Authorization: Bearer <key>)";
      return 0;
    }
    const std::string key = auth.substr(prefix.size());
    int have = 0;
    for (const auto& [k, role] : cfg_.keys) {
      // Constant time in the key's content.
      uint8_t diff = k.size() != key.size();
      for (size_t i = 0; i < k.size(); ++i) diff |= static_cast<uint8_t>(k[i] ^ (i < key.size() ? key[i] : 0));
      if (diff == 0) have = static_cast<int>(role);
    }
    if (have == 0) *why = "unknown key";
    if (key_out != nullptr) *key_out = key;
    return have;
  }
  bool Authorized(const httplib::Request& req, httplib::Response& res, int roles) {
    caller_ = oc::Caller{};
    role_of_request_ = 0;
    if (cfg_.keys.empty()) return true;
    if (roles == 0) return true;
    std::string why, key;
    const int have = KeyRole(req, &why, &key);
    if (have == 0) {
      SendError(res, 401, why);
      return false;
    }
    if (have != static_cast<int>(oc::Role::kAdmin) && (have & roles) == 0) {
      SendError(res, 403, "this key's role may not do that");
      return false;
    }
    role_of_request_ = have;
    caller_.owner = OwnerOf(key);
    caller_.kind = have == static_cast<int>(oc::Role::kAdmin)    ? oc::Caller::Kind::kAdmin
                   : have == static_cast<int>(oc::Role::kServer) ? oc::Caller::Kind::kServer
                                                                 : oc::Caller::Kind::kClient;
    if (caller_.kind == oc::Caller::Kind::kServer) caller_.server = req.get_param_value("server");
    return true;
  }
  static Result<oc::Json> Body(const httplib::Request& req) {
    if (req.body.empty()) return oc::Json::object();
    oc::Json j = oc::Json::parse(req.body, nullptr, false);
    if (j.is_discarded()) return orion::InvalidArgument("the body is not JSON");
    if (!j.is_object()) return orion::InvalidArgument("the body must be a JSON object");
    return j;
  }
  // Allocation ids are the UUIDs NewId makes: anything else in the path (.., control bytes, a
  // smuggled query) is refused before it reaches the service or a log line.
  static bool IdOk(const httplib::Request& req, httplib::Response& res) {
    if (orion::IsUuid(std::string(req.matches[1]))) return true;
    SendError(res, 400, "allocation id must be a UUID");
    return false;
  }
  void Reply(httplib::Response& res, const Result<oc::Json>& r, int ok_status = 200) {
    if (r.ok()) {
      SendJson(res, ok_status, *r);
    } else {
      SendError(res, HttpStatus(r.status().code()), r.status().message());
    }
  }

  // The store's health, asked at most every kHealthCacheMs (the endpoint needs no key: it must not
  // turn each unauthenticated request into a store read).
  oc::Json StoreHealth() {
    std::lock_guard<std::mutex> lock(health_mu_);
    const auto now = std::chrono::steady_clock::now();
    if (health_.is_null() || now - health_at_ > std::chrono::milliseconds(kHealthCacheMs)) {
      const oc::Json h = svc_->StoreHealth();
      health_ = {{"kind", h["kind"]}, {"reachable", h["reachable"]}};
      if (!h["reachable"].get<bool>() && log_) log_->warn("store unreachable: {}", h.value("error", std::string("?")));
      health_at_ = now;
    }
    return health_;
  }
  static constexpr int kHealthCacheMs = 500;

  oc::ControllerConfig cfg_;
  std::unique_ptr<oc::Service> svc_;
  std::shared_ptr<spdlog::logger> log_;
  Latency latency_;
  std::mutex health_mu_;
  oc::Json health_;
  std::chrono::steady_clock::time_point health_at_;
  static thread_local int role_of_request_;
  static thread_local oc::Caller caller_;  // the request's key, for ownership (Service)
};

thread_local int Api::role_of_request_ = 0;
thread_local oc::Caller Api::caller_;

constexpr int kClient = static_cast<int>(oc::Role::kClient);
constexpr int kServer = static_cast<int>(oc::Role::kServer);
constexpr int kAdmin = static_cast<int>(oc::Role::kAdmin);

void Api::Routes(httplib::Server& s) {
  s.Get("/v1/health", Wrap("health", 0, [this](const httplib::Request&, httplib::Response& res) {
          // 503 when the store cannot be reached: placements fail now, another controller may serve.
          const oc::Json store = StoreHealth();
          const bool ok = store["reachable"].get<bool>();
          SendJson(res, ok ? 200 : 503, {{"status", ok ? "ok" : "store unreachable"}, {"store", store}});
        }));
  s.Get("/v1/status", Wrap("status", kClient | kServer, [this](const httplib::Request&, httplib::Response& res) {
          SendJson(res, 200, svc_->Summary());
        }));
  s.Get("/v1/servers", Wrap("servers", kServer, [this](const httplib::Request&, httplib::Response& res) {
          SendJson(res, 200, svc_->Servers());
        }));
  s.Put(R"(/v1/servers/([^/]+))", Wrap("register", kServer, [this](const httplib::Request& req, httplib::Response& res) {
          auto body = Body(req);
          if (!body.ok()) return Reply(res, body.status());
          auto r = svc_->RegisterServer(req.matches[1], *body);
          if (r.ok()) {
            log_->info("server {} registered: {} vGPUs, {} free{}", std::string(req.matches[1]), (*r)["vgpus_total"].get<int>(),
                       (*r)["vgpus_free"].get<int>(),
                       (*r)["released"].empty() ? "" : "; released its stale allocations " + (*r)["released"].dump());
          }
          Reply(res, r);
        }));
  s.Post(R"(/v1/servers/([^/]+)/heartbeat)", Wrap("heartbeat", kServer, [this](const httplib::Request& req, httplib::Response& res) {
           auto body = Body(req);
           if (!body.ok()) return Reply(res, body.status());
           auto r = svc_->Heartbeat(req.matches[1], *body);
           if (r.ok() && (*r)["back"].get<bool>()) log_->info("server {} is back", std::string(req.matches[1]));
           Reply(res, r);
         }));
  // oriond's watch: answered as soon as one of the allocations it serves is gone (a release, an
  // expiry; on etcd, by any controller or by etcd itself), so it ends that session at once instead
  // of at its next heartbeat. Bounded: a few thousand ids, at most 30 s, Service::kMaxWatchers.
  s.Post(R"(/v1/servers/([^/]+)/watch)", Wrap("watch", kServer, [this](const httplib::Request& req, httplib::Response& res) {
           auto body = Body(req);
           if (!body.ok()) return Reply(res, body.status());
           std::vector<std::string> ids;
           const oc::Json& list = (*body).value("allocations", oc::Json::array());
           uint64_t timeout_ms = 20000;
           if (!list.is_array() || list.size() > kMaxWatchedAllocations) {
             return SendError(res, 400, "allocations must be a list of at most " + std::to_string(kMaxWatchedAllocations) + " ids");
           }
           for (const auto& id : list) {
             if (!id.is_string() || !orion::IsUuid(id.get_ref<const std::string&>())) return SendError(res, 400, "allocation ids must be UUIDs");
             ids.push_back(id.get<std::string>());
           }
           if ((*body).contains("timeout_ms")) {
             const oc::Json& t = (*body)["timeout_ms"];
             if (!t.is_number_unsigned() || t.get<uint64_t>() > kMaxWatchMs) {
               return SendError(res, 400, "timeout_ms must be 0.." + std::to_string(kMaxWatchMs));
             }
             timeout_ms = t.get<uint64_t>();
           }
           Reply(res, svc_->WatchRevoked(req.matches[1], ids, timeout_ms));
         }));
  s.Delete(R"(/v1/servers/([^/]+))", Wrap("deregister", kServer, [this](const httplib::Request& req, httplib::Response& res) {
             auto r = svc_->DeregisterServer(req.matches[1]);
             if (r.ok()) log_->info("server {} deregistered", std::string(req.matches[1]));
             Reply(res, r);
           }));
  s.Post("/v1/allocations", Wrap("allocate", kClient | kServer, [this](const httplib::Request& req, httplib::Response& res) {
           auto body = Body(req);
           if (!body.ok()) return Reply(res, body.status());
           std::string server;
           if (body->contains("server")) {
             if (!(*body)["server"].is_string()) return SendError(res, 400, "server must be a string");
             server = (*body)["server"].get<std::string>();
             if (role_of_request_ == kClient) return SendError(res, 403, "a client key may not choose the server");
           }
           if (caller_.kind == oc::Caller::Kind::kServer) caller_.server = server;
           auto r = svc_->Allocate(*body, server, caller_);
           if (r.ok()) {
             std::string where;
             for (const auto& p : (*r)["placements"]) where += " " + p["text"].get<std::string>();
             log_->info("allocation {} for {} pid {} '{}': {} x {} MiB:{}", (*r)["id"].get<std::string>(),
                        (*r)["client"]["host"].get<std::string>(), (*r)["client"]["pid"].get<uint32_t>(),
                        (*r)["client"]["process"].get<std::string>(), (*r)["vgpus"].get<uint32_t>(),
                        (*r)["gmem_mib"].get<uint64_t>(), where);
           } else {
             log_->warn("allocation refused: {}", r.status().message());
           }
           Reply(res, r, 201);
         }));
  s.Get("/v1/allocations", Wrap("allocations", kClient | kServer, [this](const httplib::Request& req, httplib::Response& res) {
          SendJson(res, 200, svc_->ListAllocations(req.get_param_value("host"), req.get_param_value("kind"), caller_));
        }));
  s.Get(R"(/v1/allocations/([^/]+))", Wrap("allocation", kClient | kServer, [this](const httplib::Request& req, httplib::Response& res) {
          if (!IdOk(req, res)) return;
          Reply(res, svc_->GetAllocation(req.matches[1], caller_));
        }));
  s.Post(R"(/v1/allocations/([^/]+)/confirm)", Wrap("confirm", kServer, [this](const httplib::Request& req, httplib::Response& res) {
           if (!IdOk(req, res)) return;
           auto body = Body(req);
           if (!body.ok()) return Reply(res, body.status());
           Reply(res, svc_->Confirm(req.matches[1], *body));
         }));
  s.Put(R"(/v1/allocations/([^/]+)/lease)", Wrap("renew", kClient | kServer, [this](const httplib::Request& req, httplib::Response& res) {
          if (!IdOk(req, res)) return;
          Reply(res, svc_->Renew(req.matches[1], caller_));
        }));
  s.Delete(R"(/v1/allocations/([^/]+))", Wrap("release", kClient | kServer, [this](const httplib::Request& req, httplib::Response& res) {
             if (!IdOk(req, res)) return;
             std::string why = req.get_param_value("reason");
             if (why.size() > 64) why.resize(64);
             auto r = svc_->Release(req.matches[1], why.empty() ? "released" : why, caller_, req.get_param_value("server"));
             if (r.ok()) {
               log_->info("allocation {} {} ({})", std::string(req.matches[1]),
                          r->contains("state") ? "is released when its session ends" : "released", why.empty() ? "by request" : why);
             }
             Reply(res, r);
           }));
  s.Get("/v1/assignments", Wrap("assignments", kServer, [this](const httplib::Request&, httplib::Response& res) {
          SendJson(res, 200, svc_->ListAllocations("", "vm"));
        }));
  s.Put(R"(/v1/assignments/([^/]+))", Wrap("assign", kServer, [this](const httplib::Request& req, httplib::Response& res) {
          auto body = Body(req);
          if (!body.ok()) return Reply(res, body.status());
          auto r = svc_->Assign(req.matches[1], *body);
          if (r.ok()) log_->info("VM {} holds assignment {}", std::string(req.matches[1]), (*r)["id"].get<std::string>());
          Reply(res, r);
        }));
  s.Delete(R"(/v1/assignments/([^/]+))", Wrap("unassign", kServer, [this](const httplib::Request& req, httplib::Response& res) {
             auto r = svc_->Unassign(req.matches[1]);
             if (r.ok()) log_->info("VM {} released its assignment", std::string(req.matches[1]));
             Reply(res, r);
           }));
  s.Get("/metrics", Wrap("metrics", kAdmin, [this](const httplib::Request&, httplib::Response& res) {
          res.set_content(svc_->Metrics() + latency_.Text(), "text/plain; version=0.0.4");
        }));
  s.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.body.empty()) SendError(res, res.status, res.status == 404 ? "no such endpoint" : "request failed");
  });
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
  auto src = oc::OpenStore(from);
  if (!src.ok()) {
    std::fprintf(stderr, "orion-controller migrate: --from %s: %s\n", from.c_str(), src.status().message().c_str());
    return 1;
  }
  auto dst = oc::OpenStore(to);
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

int main(int argc, char** argv) {
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
    log->warn("authentication is off: anyone who reaches {} can allocate and release vGPUs "
              "(set authentication in the config file)", cfg->listen);
  }
  Api api(*cfg, std::move(*svc), log);
  httplib::Server server;
  server.new_task_queue = [] { return new httplib::ThreadPool(32); };
  server.set_keep_alive_max_count(1000);
  server.set_read_timeout(10, 0);
  server.set_payload_max_length(kMaxBodyBytes);
  server.set_pre_routing_handler([&api](const httplib::Request& req, httplib::Response& res) { return api.PreRouting(req, res); });
  api.Routes(server);
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
  if (listen_fd >= 0 && ::listen(listen_fd, 1024) != 0) log->warn("cannot enlarge the listen backlog: {}", std::strerror(errno));
  g_server = &server;
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::atomic<bool> stop{false};
  std::thread sweeper([&] {
    for (uint64_t tick = 1; !stop.load(); ++tick) {
      // A shared store (etcd) keeps leases itself; a sweep there is a full read, once a second.
      if (!api.service().store().shared() || tick % 5 == 0) {
        for (const auto& what : api.service().Sweep(oc::WallMs())) log->info("{}", what);
      }
      if (tick % 10 == 0) api.service().Checkpoint();
      std::this_thread::sleep_for(std::chrono::milliseconds(kSweepPeriodMs));
    }
  });
  const oc::Json sum = api.service().Summary();
  log->info("Orion Controller listens on {} (store {} {}, placement {}, {} servers, {} allocations, {} assignments)",
            cfg->listen, api.service().store().kind(), api.service().store().where(), sum["policy"].get<std::string>(), sum["servers"].get<size_t>(),
            sum["allocations"].get<size_t>(), sum["assignments"].get<size_t>());
  server.listen_after_bind();
  stop = true;
  sweeper.join();
  log->info("Orion Controller stops");
  return 0;
}
