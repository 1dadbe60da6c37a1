#include "orion/host/config.h"

#include <ini.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "orion/controller/client.h"

namespace orion::host {
namespace {

std::string Unquote(std::string v) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) v = v.substr(1, v.size() - 2);
  return v;
}
// A value that opens a quote it does not close ("abc).
bool Unterminated(const std::string& raw) {
  return !raw.empty() && (raw.front() == '"' || raw.front() == '\'') && (raw.size() < 2 || raw.back() != raw.front());
}
bool Blank(const std::string& v) { return v.find_first_not_of(" \t") == std::string::npos; }

struct ParseState {
  ServerConfig conf;
  std::string source;
  std::string error;
};

bool ParseBool(const std::string& v, bool* out) {
  if (v == "true" || v == "1" || v == "yes" || v == "on") {
    *out = true;
    return true;
  }
  if (v == "false" || v == "0" || v == "no" || v == "off") {
    *out = false;
    return true;
  }
  return false;
}

bool ParseU64(const std::string& v, uint64_t lo, uint64_t hi, uint64_t* out) {
  if (v.empty()) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v[0] == '-' || x < lo || x > hi) return false;
  *out = x;
  return true;
}

bool ParseLevel(const std::string& v) {
  return v == "ERROR" || v == "WARNING" || v == "INFO" || v == "DEBUG" || v == "TRACE";
}

int Handler(void* user, const char* section, const char* name, const char* raw) {
  auto* st = static_cast<ParseState*>(user);
  const std::string sec = section, key = name, v = Unquote(raw);
  ServerConfig& c = st->conf;
  auto bad = [&](const std::string& what) {
    if (!st->error.empty()) return 0;  // keep the first error
    st->error = st->source + ": [" + sec + "] " + key + " = '" + v + "' " + what;
    return 0;
  };
  if (Unterminated(raw)) return bad("has an unterminated quote");
  uint64_t n = 0;
  if (sec == "server") {
    if (key == "listen_port") {
      if (!ParseU64(v, 1, 65533, &n)) return bad("is not a port number (1..65533)");
      c.listen_port = static_cast<uint16_t>(n);
    } else if (key == "bind_addr") {
      if (v.empty()) return bad("is empty");
      c.bind_addr = v;
    } else if (key == "tls_cert" || key == "tls_key") {
      if (v.empty()) return bad("is empty");
      (key == "tls_cert" ? c.tls_cert : c.tls_key) = v;
    } else if (key == "enable_shm") {
      if (!ParseBool(v, &c.enable_shm)) return bad("is not \"true\" or \"false\"");
    } else if (key == "enable_rdma") {
      if (!ParseBool(v, &c.enable_rdma)) return bad("is not \"true\" or \"false\"");
    } else if (key == "enable_kvm") {
      if (!ParseBool(v, &c.enable_kvm)) return bad("is not \"true\" or \"false\"");
    } else if (key == "kvm_doorbell") {
      if (!ParseBool(v, &c.kvm_doorbell)) return bad("is not \"true\" or \"false\"");
    } else if (key == "vgpu_count") {
      if (!ParseU64(v, 1, 100, &n)) return bad("is not a number in 1..100");
      c.vgpu_count = static_cast<uint32_t>(n);
    } else if (key == "max_clients") {
      if (!ParseU64(v, 1, 4096, &n)) return bad("is not a number in 1..4096");
      c.max_clients = static_cast<uint32_t>(n);
    } else if (key == "default_ratio") {
      if (!ParseU64(v, 0, 100, &n)) return bad("is not a percentage in 0..100");
      c.default_ratio = static_cast<uint32_t>(n);
    } else if (key == "default_ratio_policy") {
      if (v != "share" && v != "cap") return bad("is not share or cap");
      c.default_ratio_policy = v == "cap" ? 1 : 0;
    } else {
      return bad("is not a known key");
    }
  } else if (sec == "server-log") {
    bool b = false;
    if (key == "log_with_time" || key == "log_to_screen" || key == "log_to_file") {
      if (!ParseBool(v, &b)) return bad("is not 0 or 1");
      (key == "log_with_time" ? c.log_with_time : key == "log_to_screen" ? c.log_to_screen : c.log_to_file) = b;
    } else if (key == "log_level" || key == "file_log_level") {
      if (!ParseLevel(v)) return bad("is not ERROR, WARNING, INFO or DEBUG");
      (key == "log_level" ? c.log_level : c.file_log_level) = v;
    } else {
      return bad("is not a known key");
    }
  } else if (sec == "server-shm") {
    if (key == "shm_path_base")
      c.shm_path_base = v;
    else if (key == "shm_group_name")
      c.shm_group_name = v;
    else if (key == "shm_user_name")
      c.shm_user_name = v;
    else if (key == "shm_buffer_size") {
      if (!ParseU64(v, 4, 65536, &n)) return bad("is not a size in MiB (4..65536)");
      c.shm_buffer_size_mib = n;
    } else {
      return bad("is not a known key");
    }
  } else if (sec == "controller") {
    if (key == "controller_addr") {
      // One address or a comma-separated list, each host:port (checked as the runtime reads them).
      if (!Blank(v)) {
        if (auto ep = controller::ParseEndpoints(v); !ep.ok())
          return bad("is not a controller address list: " + ep.status().message());
      }
      c.controller_addr = v;
    } else if (key == "controller_key") {
      if (!v.empty() && Blank(v)) return bad("is blank (leave it out, or give a key)");
      c.controller_key = v;
    } else if (key == "controller_tls_ca" || key == "controller_tls_cert" || key == "controller_tls_key") {
      // The CA that verifies an https:// controller ("" = $ORION_TLS_CA, else the system's CAs); the
      // certificate and key oriond shows a controller that wants one (tls_client_ca).
      if (!v.empty() && Blank(v)) return bad("is blank (leave it out, or give a file)");
      (key == "controller_tls_ca"     ? c.controller_tls_ca
       : key == "controller_tls_cert" ? c.controller_tls_cert
                                      : c.controller_tls_key) = v;
    } else if (key == "heartbeat_ms") {
      if (!ParseU64(v, 100, 600000, &n)) return bad("is not a number of ms (100..600000)");
      c.controller_heartbeat_ms = n;
    } else
      return bad("is not a known key");
  } else if (sec == "orion") {
    // Orion (ours) extensions, same names as the flags.
    if (key == "backend") {
      auto k = ParseBackend(v);
      if (!k.ok()) return bad("is not auto, cuda or sim");
      c.backend = *k;
    } else if (key == "log_dir")
      c.log_dir = v;
    else if (key == "control_socket")
      c.control_socket = v;
    else if (key == "metrics_addr")
      c.metrics_addr = v;
    else if (key == "compute_share") {
      if (v != "on" && v != "off") return bad("must be on or off");
      c.compute_share = v == "on";
    } else if (key == "state_file")
      c.state_file = v;
    else if (key == "net_stall_ms") {
      if (!ParseU64(v, 100, 3600000, &n)) return bad("is not a number of ms (100..3600000)");
      c.net_stall_ms = n;
    } else if (key == "client_key") {
      if (v.size() > 31) return bad("is longer than 31 characters");
      if (!v.empty() && Blank(v)) return bad("is blank (leave it out, or give a key)");
      c.client_key = v;
    } else if (key == "cache_dir")
      c.cache_dir = v;
    else if (key == "session_logs_max") {
      if (!ParseU64(v, 1, 1000000, &n)) return bad("is not a number of files (1..1000000)");
      c.session_logs_max = n;
    } else if (key == "lease_timeout_ms") {
      if (!ParseU64(v, 200, 600000, &n)) return bad("is not a number of ms (200..600000)");
      c.lease_timeout_ms = n;
    } else {
      return bad("is not a known key");
    }
  } else {
    return bad("is in an unknown section");
  }
  return 1;
}

}  // namespace

Result<BackendKind> ParseBackend(const std::string& s) {
  if (s == "auto") return BackendKind::kAuto;
  if (s == "cuda") return BackendKind::kCuda;
  if (s == "sim") return BackendKind::kSim;
  return InvalidArgument("backend '" + s + "' is not auto, cuda or sim");
}

Result<ServerConfig> ParseServerConfig(const std::string& text, const std::string& source, ServerConfig base) {
  ParseState st{std::move(base), source, {}};
  // Orion's server.conf indents its keys; inih would read an indented line as the continuation of
  // the previous value, so indentation is removed first (line numbers are kept).
  std::string flat;
  flat.reserve(text.size());
  bool at_line_start = true;
  for (char ch : text) {
    if (at_line_start && (ch == ' ' || ch == '\t')) continue;
    at_line_start = ch == '\n';
    flat += ch;
  }
  const int line = ini_parse_string(flat.c_str(), Handler, &st);
  if (!st.error.empty()) return InvalidArgument(st.error + (line > 0 ? " (line " + std::to_string(line) + ")" : ""));
  if (line != 0) return InvalidArgument(source + ": syntax error on line " + std::to_string(line));
  if (st.conf.tls_cert.empty() != st.conf.tls_key.empty())
    return InvalidArgument(source + ": [server] tls_cert and tls_key come together (both or neither)");
  return st.conf;
}

Result<ServerConfig> LoadServerConfig(const std::string& path, ServerConfig base) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return InvalidArgument(path + " is a directory, not a configuration file");
  std::ifstream f(path);
  if (!f) return NotFound(path + " does not exist or is not readable");
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseServerConfig(ss.str(), path, std::move(base));
}

}  // namespace orion::host
