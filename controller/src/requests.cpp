// Decoding the REST requests' bodies: see orion/controller/requests.h.
#include "orion/controller/requests.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <set>

#include "orion/common/text.h"

namespace orion::controller {

namespace {

// Reads an unsigned integer field; absent or null = `def`. kInvalidArgument names the field.
Status UInt(const Json& body, const char* key, uint64_t max, uint64_t def, uint64_t* out) {
  if (!body.contains(key) || body[key].is_null()) {
    *out = def;
    return Status();
  }
  const Json& v = body[key];
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    return InvalidArgument(std::string(key) + " must be a whole number, not " + v.dump());
  }
  const uint64_t n = v.get<uint64_t>();
  if (n > max)
    return InvalidArgument(std::string(key) + " = " + std::to_string(n) + " is larger than " + std::to_string(max));
  *out = n;
  return Status();
}

template <typename T>
Status UInt(const Json& body, const char* key, T max, T* out) {
  uint64_t v = 0;
  if (Status st = UInt(body, key, max, 0, &v); !st.ok()) return st;
  *out = static_cast<T>(v);
  return Status();
}

// Reads a string field of at most `max` bytes with no control characters; absent or null: left as is.
Status Str(const Json& body, const char* key, size_t max, std::string* out) {
  if (!body.contains(key) || body[key].is_null()) return Status();
  if (!body[key].is_string()) return InvalidArgument(std::string(key) + " must be a string");
  std::string s = body[key].get<std::string>();
  if (s.size() > max) return InvalidArgument(std::string(key) + " is longer than " + std::to_string(max));
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) return InvalidArgument(std::string(key) + " has control characters");
  }
  *out = std::move(s);
  return Status();
}

Status Object(const Json& body) {
  return body.is_object() ? Status() : InvalidArgument("the body must be a JSON object");
}

// A job's name: printable, no spaces or quotes, so it can go in a log line and a URL query unescaped.
bool ValidJobName(const std::string& job) {
  if (job.empty() || job.size() > kMaxJobName) return false;
  return std::all_of(job.begin(), job.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("._:@/+-", c) != nullptr;
  });
}

// vgpus, gmem_mib, ratio and server; the messages name the client's variables (ORION_VGPU, ...).
Status Placement(const Json& body, PlacementRequest* p) {
  if (Status st = UInt(body, "vgpus", kMaxVgpusPerRequest, &p->vgpus); !st.ok()) {
    return InvalidArgument("ORION_VGPU: " + st.message());
  }
  if (p->vgpus == 0) return InvalidArgument("ORION_VGPU must be 1.." + std::to_string(kMaxVgpusPerRequest));
  if (Status st = UInt(body, "gmem_mib", kMaxGmemMib, &p->gmem_mib); !st.ok())
    return InvalidArgument("ORION_GMEM: " + st.message());
  if (Status st = UInt(body, "ratio", uint32_t{100}, &p->ratio); !st.ok())
    return InvalidArgument("ORION_RATIO: " + st.message());
  return Str(body, "server", 300, &p->server);
}

}  // namespace

bool ValidVmName(const std::string& vm) {
  if (vm.empty() || vm.size() > 64) return false;
  return std::all_of(vm.begin(), vm.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

Result<ServerRegistration> ServerRegistration::FromJson(const Json& body) {
  if (Status st = Object(body); !st.ok()) return st;
  ServerRegistration r;
  if (Status st = UInt(body, "vgpu_count", kMaxVgpusPerGpu, &r.vgpu_count); !st.ok()) return st;
  if (r.vgpu_count == 0) return InvalidArgument("vgpu_count must be 1.." + std::to_string(kMaxVgpusPerGpu));
  if (Status st = Str(body, "hostname", 255, &r.hostname); !st.ok()) return st;
  if (Status st = Str(body, "boot_id", 64, &r.boot_id); !st.ok()) return st;
  if (!body.contains("gpus") || !body["gpus"].is_array() || body["gpus"].size() > kMaxGpusPerServer) {
    return InvalidArgument("gpus must be an array of at most " + std::to_string(kMaxGpusPerServer) + " GPUs");
  }
  std::set<uint32_t> seen;
  for (const Json& g : body["gpus"]) {
    if (!g.is_object()) return InvalidArgument("each GPU must be an object");
    GpuSpec gpu;
    if (Status st = UInt(g, "index", uint32_t{1023}, &gpu.index); !st.ok()) return st;
    if (Status st = UInt(g, "memory_mib", kMaxGmemMib, &gpu.memory_mib); !st.ok()) return st;
    if (Status st = Str(g, "uuid", 80, &gpu.uuid); !st.ok()) return st;
    if (Status st = Str(g, "name", 128, &gpu.name); !st.ok()) return st;
    if (gpu.memory_mib == 0) return InvalidArgument("GPU memory_mib must be > 0");
    if (!seen.insert(gpu.index).second)
      return InvalidArgument("GPU index " + std::to_string(gpu.index) + " is listed twice");
    r.gpus.push_back(std::move(gpu));
  }
  if (body.contains("allocations")) {
    if (!body["allocations"].is_array()) return InvalidArgument("allocations must be an array of ids");
    for (const Json& a : body["allocations"]) {
      if (a.is_string()) r.allocations.insert(a.get<std::string>());
    }
  }
  return r;
}

Result<ServerHeartbeat> ServerHeartbeat::FromJson(const Json& body) {
  if (Status st = Object(body); !st.ok()) return st;
  ServerHeartbeat h;
  if (Status st = Str(body, "boot_id", 64, &h.boot_id); !st.ok()) return st;
  if (!body.contains("allocations") || !body["allocations"].is_array()) return h;
  for (const Json& e : body["allocations"]) {
    if (!e.is_object() || !e.contains("id") || !e["id"].is_string()) continue;
    Held held{e["id"].get<std::string>(), {}};
    if (e.contains("used_mib") && e["used_mib"].is_array()) {
      for (const Json& u : e["used_mib"]) {
        const bool whole = u.is_number_integer() && u.get<int64_t>() >= 0;
        held.used_mib.push_back(whole ? std::optional<uint64_t>(u.get<uint64_t>()) : std::nullopt);
      }
    }
    h.allocations.push_back(std::move(held));
  }
  return h;
}

Result<AllocationRequest> AllocationRequest::FromJson(const Json& body) {
  if (Status st = Object(body); !st.ok()) return st;
  AllocationRequest r;
  if (Status st = Placement(body, &r); !st.ok()) return st;
  if (body.contains("client")) {
    const Json& c = body["client"];
    if (!c.is_object()) return InvalidArgument("client must be an object");
    if (Status st = Str(c, "host", 255, &r.client_host); !st.ok()) return st;
    if (Status st = Str(c, "process", 64, &r.client_process); !st.ok()) return st;
    if (Status st = UInt(c, "pid", uint32_t{0xffffffffu}, &r.client_pid); !st.ok()) return st;
  }
  if (body.contains("job")) {
    if (Status st = Str(body, "job", kMaxJobName, &r.job); !st.ok()) return st;
    if (!ValidJobName(r.job)) {
      return InvalidArgument("job must be 1.." + std::to_string(kMaxJobName) + " of [A-Za-z0-9._:@/+-]");
    }
  }
  if (body.contains("request_id")) {
    const Json& id = body["request_id"];
    if (!id.is_string() || !IsUuid(id.get_ref<const std::string&>())) {
      return InvalidArgument("request_id must be a UUID (the client's idempotency key)");
    }
    r.request_id = id.get<std::string>();
  }
  if (Status st = UInt(body, "session", uint32_t{0xffffffffu}, &r.session); !st.ok()) return st;
  return r;
}

Result<AssignmentRequest> AssignmentRequest::FromJson(const Json& body) {
  if (Status st = Object(body); !st.ok()) return st;
  AssignmentRequest r;
  if (Status st = Placement(body, &r); !st.ok()) return st;
  return r;
}

Result<SessionConfirmation> SessionConfirmation::FromJson(const Json& body) {
  if (Status st = Object(body); !st.ok()) return st;
  SessionConfirmation c;
  if (Status st = Str(body, "server", 300, &c.server); !st.ok()) return st;
  if (Status st = UInt(body, "session", uint32_t{0xffffffffu}, &c.session); !st.ok()) return st;
  return c;
}

Result<MigrateRequest> MigrateRequest::FromJson(const Json& body) {
  if (Status st = Object(body); !st.ok()) return st;
  MigrateRequest m;
  if (Status st = Str(body, "to", 300, &m.to); !st.ok()) return st;
  if (m.to.empty()) return InvalidArgument("to must name the target server (its id, \"ip:port\")");
  uint64_t wait_s = 0;
  if (Status st = UInt(body, "wait_s", kMaxMigrateWaitMs / 1000, 0, &wait_s); !st.ok()) return st;
  m.wait_ms = wait_s * 1000;
  return m;
}

Result<MoveReport> MoveReport::FromJson(const Json& body) {
  if (Status st = Object(body); !st.ok()) return st;
  MoveReport r;
  if (Status st = Str(body, "server", 300, &r.server); !st.ok()) return st;
  if (r.server.empty()) return InvalidArgument("server must name the reporting server");
  std::string state;
  if (Status st = Str(body, "state", 16, &state); !st.ok()) return st;
  if (state != "committed" && state != "failed") return InvalidArgument("state must be \"committed\" or \"failed\"");
  r.committed = state == "committed";
  if (Status st = UInt(body, "session", uint32_t{0xffffffffu}, &r.session); !st.ok()) return st;
  if (Status st = Str(body, "error", 500, &r.error); !st.ok()) return st;
  return r;
}

Result<WatchRequest> WatchRequest::FromJson(const Json& body) {
  if (Status st = Object(body); !st.ok()) return st;
  WatchRequest w;
  const Json& list = body.contains("allocations") ? body["allocations"] : Json::array();
  if (!list.is_array() || list.size() > kMaxWatchedAllocations) {
    return InvalidArgument("allocations must be a list of at most " + std::to_string(kMaxWatchedAllocations) + " ids");
  }
  for (const Json& id : list) {
    if (!id.is_string() || !IsUuid(id.get_ref<const std::string&>()))
      return InvalidArgument("allocation ids must be UUIDs");
    w.allocations.push_back(id.get<std::string>());
  }
  if (!UInt(body, "timeout_ms", kMaxWatchMs, w.timeout_ms, &w.timeout_ms).ok()) {
    return InvalidArgument("timeout_ms must be 0.." + std::to_string(kMaxWatchMs));
  }
  return w;
}

}  // namespace orion::controller
