// The REST layer of orion-controller: see rest.h.
#include "rest.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

#include <openssl/sha.h>

#include "orion/common/text.h"
#include "orion/controller/client.h"

namespace orion::controller {

namespace oc = orion::controller;

namespace {

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
    std::string out =
        "# HELP orion_controller_request_seconds REST request latency\n"
        "# TYPE orion_controller_request_seconds histogram\n";
    for (const auto& [route, h] : by_route_) {
      const std::string l = "route=\"" + route + "\"";
      for (size_t i = 0; i < kBounds.size(); ++i) {
        char b[32];
        std::snprintf(b, sizeof b, "%g", kBounds[i]);
        out += "orion_controller_request_seconds_bucket{" + l + ",le=\"" + b + "\"} " + std::to_string(h.buckets[i]) +
               "\n";
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
    case Code::kResourceExhausted:
    case Code::kAlreadyExists:
    case Code::kFailedPrecondition: return 409;
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

class Api final : public RestApi {
 public:
  Api(oc::ControllerConfig cfg, std::unique_ptr<oc::Service> svc, std::shared_ptr<spdlog::logger> log)
      : cfg_(std::move(cfg)), svc_(std::move(svc)), log_(std::move(log)) {}

  void Install(httplib::Server& s) override {
    s.set_pre_routing_handler(
        [this](const httplib::Request& req, httplib::Response& res) { return PreRouting(req, res); });
    Routes(s);
  }
  void Routes(httplib::Server& s);
  // Before a body is read (the front runs it on the head; httplib again before its routes): an
  // unknown key is answered 401 at once (its body is never read).
  httplib::Server::HandlerResponse PreRouting(const httplib::Request& req, httplib::Response& res) override {
    if (!cfg_.keys.empty() && req.path != "/v1/health") {
      std::string why;
      if (KeyRole(req, &why) == 0) {
        SendError(res, 401, why);
        res.set_header("Connection", "close");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // An oversize body is refused here unread. (A chunked body is cut off by the front as it
    // arrives: cpp-httplib 0.11.4's set_payload_max_length does not bound one.)
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
  oc::Service& service() override { return *svc_; }

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
    caller_.owner = svc_->OwnerOf(key);  // a salted hash: never the key itself
    caller_.legacy_owner = oc::Service::LegacyOwnerOf(key);
    caller_.kind = have == static_cast<int>(oc::Role::kAdmin)    ? oc::Caller::Kind::kAdmin
                   : have == static_cast<int>(oc::Role::kServer) ? oc::Caller::Kind::kServer
                                                                 : oc::Caller::Kind::kClient;
    if (caller_.kind == oc::Caller::Kind::kServer) caller_.server = req.get_param_value("server");
    bound_server_.clear();
    if (auto b = cfg_.key_servers.find(key); b != cfg_.key_servers.end() && caller_.kind == oc::Caller::Kind::kServer) {
      // A key bound to one server: it names that server, or none (then it is that server).
      bound_server_ = b->second;
      static const std::string kServers = "/v1/servers/";
      std::string in_path;  // /v1/servers/{id}/...
      if (req.path.compare(0, kServers.size(), kServers) == 0)
        in_path = req.path.substr(kServers.size(), req.path.find('/', kServers.size()) - kServers.size());
      if (!BoundServerMay(in_path, res) || !BoundServerMay(caller_.server, res)) return false;
      caller_.server = bound_server_;
    }
    return true;
  }
  // A request of a key bound to one server may name only that server ("" names none); else 403.
  bool BoundServerMay(const std::string& named, httplib::Response& res) const {
    if (bound_server_.empty() || named.empty() || named == bound_server_) return true;
    SendError(res, 403, "this server key belongs to server " + bound_server_ + ": it may not act as '" + named + "'");
    return false;
  }
  // The request's body as the type T (orion/controller/requests.h): parsed, then T::FromJson.
  template <typename T>
  static Result<T> Body(const httplib::Request& req) {
    oc::Json j = oc::Json::object();
    if (!req.body.empty()) {
      j = oc::Json::parse(req.body, nullptr, false);
      if (j.is_discarded()) return orion::InvalidArgument("the body is not JSON");
    }
    return T::FromJson(j);
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
  static thread_local oc::Caller caller_;         // the request's key, for ownership (Service)
  static thread_local std::string bound_server_;  // a server key bound to one server: that server
};

thread_local int Api::role_of_request_ = 0;
thread_local oc::Caller Api::caller_;
thread_local std::string Api::bound_server_;

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
  s.Put(R"(/v1/servers/([^/]+))",
        Wrap("register", kServer, [this](const httplib::Request& req, httplib::Response& res) {
          auto body = Body<oc::ServerRegistration>(req);
          if (!body.ok()) return Reply(res, body.status());
          auto r = svc_->RegisterServer(req.matches[1], *body);
          if (r.ok()) {
            log_->info("server {} registered: {} vGPUs, {} free{}", std::string(req.matches[1]),
                       (*r)["vgpus_total"].get<int>(), (*r)["vgpus_free"].get<int>(),
                       (*r)["released"].empty() ? "" : "; released its stale allocations " + (*r)["released"].dump());
          }
          Reply(res, r);
        }));
  s.Post(R"(/v1/servers/([^/]+)/heartbeat)",
         Wrap("heartbeat", kServer, [this](const httplib::Request& req, httplib::Response& res) {
           auto body = Body<oc::ServerHeartbeat>(req);
           if (!body.ok()) return Reply(res, body.status());
           auto r = svc_->Heartbeat(req.matches[1], *body);
           if (r.ok() && (*r)["back"].get<bool>()) log_->info("server {} is back", std::string(req.matches[1]));
           Reply(res, r);
         }));
  // oriond's watch: answered as soon as one of the allocations it serves is gone (a release, an
  // expiry; on etcd, by any controller or by etcd itself), so it ends that session at once instead
  // of at its next heartbeat. Bounded: a few thousand ids, at most 30 s, Service::kMaxWatchers.
  s.Post(R"(/v1/servers/([^/]+)/watch)",
         Wrap("watch", kServer, [this](const httplib::Request& req, httplib::Response& res) {
           auto body = Body<oc::WatchRequest>(req);
           if (!body.ok()) return Reply(res, body.status());
           Reply(res, svc_->WatchRevoked(req.matches[1], *body));
         }));
  s.Delete(R"(/v1/servers/([^/]+))",
           Wrap("deregister", kServer, [this](const httplib::Request& req, httplib::Response& res) {
             auto r = svc_->DeregisterServer(req.matches[1]);
             if (r.ok()) log_->info("server {} deregistered", std::string(req.matches[1]));
             Reply(res, r);
           }));
  s.Post("/v1/allocations",
         Wrap("allocate", kClient | kServer, [this](const httplib::Request& req, httplib::Response& res) {
           auto body = Body<oc::AllocationRequest>(req);
           if (!body.ok()) return Reply(res, body.status());
           const std::string& server = body->server;
           if (!server.empty()) {
             if (role_of_request_ == kClient) return SendError(res, 403, "a client key may not choose the server");
             if (!BoundServerMay(server, res)) return;
           }
           if (caller_.kind == oc::Caller::Kind::kServer) caller_.server = server.empty() ? bound_server_ : server;
           auto r = svc_->Allocate(*body, caller_);
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
  s.Get("/v1/allocations",
        Wrap("allocations", kClient | kServer, [this](const httplib::Request& req, httplib::Response& res) {
          SendJson(res, 200, svc_->ListAllocations(req.get_param_value("host"), req.get_param_value("kind"), caller_));
        }));
  s.Get(R"(/v1/allocations/([^/]+))",
        Wrap("allocation", kClient | kServer, [this](const httplib::Request& req, httplib::Response& res) {
          if (!IdOk(req, res)) return;
          Reply(res, svc_->GetAllocation(req.matches[1], caller_));
        }));
  s.Post(R"(/v1/allocations/([^/]+)/confirm)",
         Wrap("confirm", kServer, [this](const httplib::Request& req, httplib::Response& res) {
           if (!IdOk(req, res)) return;
           auto body = Body<oc::SessionConfirmation>(req);
           if (!body.ok()) return Reply(res, body.status());
           Reply(res, svc_->Confirm(req.matches[1], *body));
         }));
  // Live migration (issue #24): an admin moves an allocation's session to another server; its
  // servers report how the move ended.
  s.Post(R"(/v1/allocations/([^/]+)/migrate)",
         Wrap("migrate", kAdmin, [this](const httplib::Request& req, httplib::Response& res) {
           if (!IdOk(req, res)) return;
           auto body = Body<oc::MigrateRequest>(req);
           if (!body.ok()) return Reply(res, body.status());
           log_->info("allocation {}: a move to {} is asked for", std::string(req.matches[1]), body->to);
           auto r = svc_->Migrate(req.matches[1], *body);
           if (!r.ok())
             log_->warn("allocation {}: no move to {}: {}", std::string(req.matches[1]), body->to,
                        r.status().message());
           // 202 while the move is under way; 200 once it committed (wait_s).
           Reply(res, r, r.ok() && r->contains("move") ? 202 : 200);
         }));
  // Drain a server (admin): it takes no new sessions, and every allocation a session serves there
  // moves where the pool has room. DELETE ends the drain. ?wait_s=N waits for the moves (<= 120).
  s.Post(R"(/v1/servers/([^/]+)/drain)",
         Wrap("drain", kAdmin, [this](const httplib::Request& req, httplib::Response& res) {
           uint64_t wait_s = 0;
           const std::string w = req.get_param_value("wait_s");
           if (!w.empty()) {
             if (w.size() > 3 || w.find_first_not_of("0123456789") != std::string::npos || std::stoull(w) > 120)
               return SendError(res, 400, "wait_s must be 0..120");
             wait_s = std::stoull(w);
           }
           log_->info("server {}: drain asked for", std::string(req.matches[1]));
           auto r = svc_->Drain(req.matches[1], true, wait_s * 1000);
           if (r.ok()) {
             log_->info("server {} drains: {} move(s), {} allocation(s) stay", std::string(req.matches[1]),
                        (*r)["moves"].size(), (*r)["staying"].size());
           }
           Reply(res, r);
         }));
  s.Delete(R"(/v1/servers/([^/]+)/drain)",
           Wrap("undrain", kAdmin, [this](const httplib::Request& req, httplib::Response& res) {
             auto r = svc_->Drain(req.matches[1], false, 0);
             if (r.ok()) log_->info("server {} takes sessions again", std::string(req.matches[1]));
             Reply(res, r);
           }));
  s.Post(R"(/v1/allocations/([^/]+)/move)",
         Wrap("move", kServer, [this](const httplib::Request& req, httplib::Response& res) {
           if (!IdOk(req, res)) return;
           auto body = Body<oc::MoveReport>(req);
           if (!body.ok()) return Reply(res, body.status());
           if (!BoundServerMay(body->server, res)) return;
           auto r = svc_->MoveOutcome(req.matches[1], *body);
           if (r.ok()) {
             log_->info("allocation {}: {}", std::string(req.matches[1]),
                        body->committed
                            ? "moved to " + body->server + " (session " + std::to_string(body->session) + ")"
                            : "its move was given up: " + (*r)["last_move"].value("error", std::string()));
           }
           Reply(res, r);
         }));
  s.Put(R"(/v1/allocations/([^/]+)/lease)",
        Wrap("renew", kClient | kServer, [this](const httplib::Request& req, httplib::Response& res) {
          if (!IdOk(req, res)) return;
          Reply(res, svc_->Renew(req.matches[1], caller_));
        }));
  s.Delete(R"(/v1/allocations/([^/]+))",
           Wrap("release", kClient | kServer, [this](const httplib::Request& req, httplib::Response& res) {
             if (!IdOk(req, res)) return;
             std::string why = req.get_param_value("reason");
             if (why.size() > 64) why.resize(64);
             auto r =
                 svc_->Release(req.matches[1], why.empty() ? "released" : why, caller_, req.get_param_value("server"));
             if (r.ok()) {
               log_->info("allocation {} {} ({})", std::string(req.matches[1]),
                          r->contains("state") ? "is released when its session ends" : "released",
                          why.empty() ? "by request" : why);
             }
             Reply(res, r);
           }));
  s.Get("/v1/assignments", Wrap("assignments", kServer, [this](const httplib::Request&, httplib::Response& res) {
          SendJson(res, 200, svc_->ListAllocations("", "vm"));
        }));
  s.Put(R"(/v1/assignments/([^/]+))",
        Wrap("assign", kServer, [this](const httplib::Request& req, httplib::Response& res) {
          auto body = Body<oc::AssignmentRequest>(req);
          if (!body.ok()) return Reply(res, body.status());
          if (!BoundServerMay(body->server, res)) return;
          auto r = svc_->Assign(req.matches[1], *body);
          if (r.ok())
            log_->info("VM {} holds assignment {}", std::string(req.matches[1]), (*r)["id"].get<std::string>());
          Reply(res, r);
        }));
  s.Delete(R"(/v1/assignments/([^/]+))",
           Wrap("unassign", kServer, [this](const httplib::Request& req, httplib::Response& res) {
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

}  // namespace

std::unique_ptr<RestApi> MakeRestApi(ControllerConfig cfg, std::unique_ptr<Service> svc,
                                     std::shared_ptr<spdlog::logger> log) {
  return std::make_unique<Api>(std::move(cfg), std::move(svc), std::move(log));
}

}  // namespace orion::controller
