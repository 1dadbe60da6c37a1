// config_fuzz — the text parsers of oriond and orion-controller:
//   mode 0: oriond's server.conf (orion::host::ParseServerConfig, an INI file);
//   mode 1: controller.yaml (orion::controller::ParseControllerConfig);
//   mode 2: a POST /v1/allocations body, as the REST layer takes it: decoded by
//           AllocationRequest::FromJson (orion/controller/requests.h), then Service::Allocate; an
//           allocation made is released again so that the pool stays as it was;
//   mode 3: a server's registration body (ServerRegistration::FromJson, Service::RegisterServer),
//           deregistered again;
//   mode 4: the other request bodies' decoders (heartbeat, confirmation, assignment, watch).
// The first input byte picks the mode (mod 5); the rest is the text.
//
// The service runs on a SQLite store in a temporary directory (removed at exit) with one
// registered server of two GPUs. Exceptions a request raises are caught as the REST layer's
// handler wrapper does (an HTTP 500, the controller lives on); anything else is a crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>

#include "orion/controller/config.h"
#include "orion/controller/service.h"
#include "orion/host/config.h"

namespace {

namespace oc = orion::controller;

struct Pool {
  std::filesystem::path dir;
  std::unique_ptr<oc::Service> svc;
  ~Pool() {
    svc.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

oc::Json TwoGpuServer(const std::string& host) {
  return {{"hostname", host},
          {"vgpu_count", 4},
          {"boot_id", "b1"},
          {"gpus",
           {{{"index", 0}, {"uuid", "GPU-a"}, {"name", "V100"}, {"memory_mib", 16384}},
            {{"index", 1}, {"uuid", "GPU-b"}, {"name", "V100"}, {"memory_mib", 16384}}}}};
}

Pool* GetPool() {
  static Pool* pool = [] {
    auto* p = new Pool;
    const char* tmp = std::getenv("TMPDIR");
    p->dir = std::filesystem::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") /
             ("orion-config-fuzz-" + std::to_string(getpid()));
    std::filesystem::remove_all(p->dir);
    std::filesystem::create_directories(p->dir);
    oc::ServiceOptions o;
    o.database = (p->dir / "c.db").string();
    o.server_timeout_ms = 1000ull * 86400 * 365;  // the registered server never goes down
    o.server_release_ms = 1000ull * 86400 * 365;
    auto s = oc::Service::Open(o);
    if (!s.ok()) {
      std::fprintf(stderr, "config_fuzz: cannot open the service: %s\n", s.status().ToString().c_str());
      std::abort();
    }
    p->svc = std::move(*s);
    auto reg = oc::ServerRegistration::FromJson(TwoGpuServer("a"));
    if (!reg.ok() || !p->svc->RegisterServer("10.0.0.1:9960", *reg).ok()) std::abort();
    std::atexit([] { delete GetPool(); });
    return p;
  }();
  return pool;
}

void ReleaseIfMade(oc::Service& svc, const orion::Result<oc::Json>& r) {
  if (!r.ok() || !r->is_object() || !r->contains("id") || !(*r)["id"].is_string()) return;
  (void)svc.Release((*r)["id"].get<std::string>(), "fuzz");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 5;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (mode) {
    case 0: {
      auto c = orion::host::ParseServerConfig(text, "server.conf");
      (void)c;
      break;
    }
    case 1: {
      auto c = oc::ParseControllerConfig(text, "controller.yaml");
      (void)c;
      break;
    }
    default: {
      oc::Json body = oc::Json::parse(text, nullptr, false);
      if (body.is_discarded()) break;
      if (mode == 4) {
        (void)oc::ServerHeartbeat::FromJson(body);
        (void)oc::SessionConfirmation::FromJson(body);
        (void)oc::AssignmentRequest::FromJson(body);
        (void)oc::WatchRequest::FromJson(body);
        break;
      }
      oc::Service& svc = *GetPool()->svc;
      try {
        if (mode == 2) {
          auto req = oc::AllocationRequest::FromJson(body);
          if (!req.ok()) break;
          auto r = svc.Allocate(*req);
          ReleaseIfMade(svc, r);
        } else {
          auto reg = oc::ServerRegistration::FromJson(body);
          if (!reg.ok()) break;
          auto r = svc.RegisterServer("10.0.0.2:9960", *reg);
          if (r.ok()) (void)svc.DeregisterServer("10.0.0.2:9960");
        }
      } catch (const std::exception&) {
        // The REST layer answers 500 and goes on (controller/src/main.cpp, Wrap).
      }
      // The REST layer checkpoints the WAL every few seconds; without it the WAL grows for ever.
      static uint64_t calls = 0;
      if (++calls % 1024 == 0) svc.Checkpoint();
      break;
    }
  }
  return 0;
}
