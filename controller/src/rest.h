// The REST layer of orion-controller (controller/openapi.yaml) over a Service: keys and roles
// (401/403 before a body is read), request-body limits (413), JSON in and out, per-route latency
// for /metrics, and the routes themselves. main.cpp owns the process (options, logging, the
// listening socket, signals, the sweeper).
//
//   auto api = MakeRestApi(cfg, std::move(service), log);
//   httplib::Server server;
//   api->Install(server);   // pre-routing checks and every route
#pragma once

#include <httplib.h>
#include <spdlog/logger.h>

#include <cstddef>
#include <memory>

#include "orion/controller/config.h"
#include "orion/controller/service.h"

namespace orion::controller {

// The largest request body read (Content-Length or chunked): a register with 64 GPUs is ~20 KiB and
// a heartbeat ~100 bytes per session, so this fits thousands of sessions. The front (front.h)
// answers 413 to anything larger and keeps none of it; bodies of unknown keys are not read at all
// (PreRouting, run by the front on the head).
inline constexpr size_t kMaxBodyBytes = 256 * 1024;

class RestApi {
 public:
  virtual ~RestApi() = default;
  // The pre-routing handler (keys, body size) and every route, on `server` (which must outlive
  // neither this nor its Service).
  virtual void Install(httplib::Server& server) = 0;
  // The checks on a request's head (no body read yet): an unknown or missing key 401 (except
  // /v1/health), a Content-Length over kMaxBodyBytes 413. Handled: answered in `res`.
  virtual httplib::Server::HandlerResponse PreRouting(const httplib::Request& head, httplib::Response& res) = 0;
  virtual Service& service() = 0;
};

std::unique_ptr<RestApi> MakeRestApi(ControllerConfig cfg, std::unique_ptr<Service> svc,
                                     std::shared_ptr<spdlog::logger> log);

}  // namespace orion::controller
