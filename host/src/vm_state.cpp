#include "orion/host/vm_state.h"

#include "orion/host/compute_share.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "orion/common/frame.h"

namespace orion::host {
namespace {

using Json = nlohmann::json;

Status Bad(const std::string& source, const std::string& what) {
  return DataLoss(source + " is corrupt: " + what +
                  " (oriond cannot restore its VM attachments; fix or remove the file; VMs running now then need "
                  "a restart to get their vGPUs back)");
}

// A JSON unsigned integer in [lo, hi], or an error naming `where`.
bool UInt(const Json& o, const char* key, uint64_t lo, uint64_t hi, uint64_t* out) {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_number_unsigned()) return false;
  const uint64_t v = it->get<uint64_t>();
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool Str(const Json& o, const char* key, std::string* out) {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_string()) return false;
  *out = it->get<std::string>();
  return true;
}

Status Errno(Code c, const std::string& what) { return Status(c, what + ": " + std::strerror(errno)); }

}  // namespace

bool ValidVmName(const std::string& vm) {
  if (vm.empty() || vm.size() > 200 || vm[0] == '.') return false;
  for (char ch : vm) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') return false;
  }
  return true;
}

std::string EncodeVmState(const std::vector<VmAttachment>& vms) {
  Json list = Json::array();
  for (const VmAttachment& a : vms) {
    Json placements = Json::array();
    for (const Placement& p : a.placements) {
      placements.push_back({{"pgpu", p.pgpu}, {"vgpu", p.vgpu}, {"quota_bytes", p.quota_bytes}});
    }
    list.push_back({{"vm", a.vm},
                    {"region", a.region},
                    {"vgpus", a.vgpus},
                    {"gmem_mib", a.gmem_mib},
                    {"processes", a.processes},
                    {"placements", placements}});
    if (!a.doorbell_socket.empty()) {
      list.back()["doorbell"] = {{"socket", a.doorbell_socket}, {"vectors", a.doorbell_vectors}};
    }
    if (a.ratio != 0) list.back()["compute"] = {{"ratio", a.ratio}, {"policy", ComputePolicyName(a.ratio_policy)}};
  }
  return Json{{"version", kVmStateVersion}, {"vms", list}}.dump(2) + "\n";
}

Result<std::vector<VmAttachment>> DecodeVmState(const std::string& text, const std::string& source) {
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Bad(source, "not valid JSON");
  if (!doc.is_object()) return Bad(source, "not a JSON object");
  uint64_t version = 0;
  if (!UInt(doc, "version", 1, UINT32_MAX, &version)) return Bad(source, "no \"version\"");
  if (version != kVmStateVersion) {
    return Bad(source, "version " + std::to_string(version) + " is not " + std::to_string(kVmStateVersion) +
                           " (written by another Orion release?)");
  }
  const auto vms = doc.find("vms");
  if (vms == doc.end() || !vms->is_array()) return Bad(source, "no \"vms\" list");
  std::vector<VmAttachment> out;
  std::set<std::string> names, regions;
  for (size_t i = 0; i < vms->size(); ++i) {
    const Json& o = (*vms)[i];
    const std::string at = "vms[" + std::to_string(i) + "]";
    if (!o.is_object()) return Bad(source, at + " is not an object");
    VmAttachment a;
    uint64_t v = 0;
    if (!Str(o, "vm", &a.vm) || !ValidVmName(a.vm)) return Bad(source, at + ".vm is missing or not a VM name");
    if (!Str(o, "region", &a.region) || a.region.empty() || a.region[0] != '/' || a.region.size() > 4096 ||
        a.region.find('\0') != std::string::npos) {
      return Bad(source, at + ".region is missing or not an absolute path");
    }
    if (!UInt(o, "vgpus", 1, kMaxDevices, &v))
      return Bad(source, at + ".vgpus is not 1.." + std::to_string(kMaxDevices));
    a.vgpus = static_cast<uint32_t>(v);
    if (!UInt(o, "gmem_mib", 0, uint64_t{1} << 24, &a.gmem_mib))
      return Bad(source, at + ".gmem_mib is not a number of MiB");
    if (!UInt(o, "processes", 0, kMaxVmProcesses, &v)) {
      return Bad(source, at + ".processes is not 0.." + std::to_string(kMaxVmProcesses));
    }
    a.processes = static_cast<uint32_t>(v);
    const auto pl = o.find("placements");
    if (pl == o.end() || !pl->is_array() || pl->size() != a.vgpus) {
      return Bad(source, at + ".placements is not a list of " + std::to_string(a.vgpus) + " vGPU(s)");
    }
    for (size_t k = 0; k < pl->size(); ++k) {
      const Json& p = (*pl)[k];
      const std::string pat = at + ".placements[" + std::to_string(k) + "]";
      uint64_t pgpu = 0, vgpu = 0, quota = 0;
      if (!p.is_object() || !UInt(p, "pgpu", 0, 4095, &pgpu) || !UInt(p, "vgpu", 0, 4095, &vgpu) ||
          !UInt(p, "quota_bytes", 1, uint64_t{1} << 44, &quota)) {
        return Bad(source, pat + " needs pgpu, vgpu (0..4095) and quota_bytes (1..2^44)");
      }
      a.placements.push_back({static_cast<uint32_t>(pgpu), static_cast<uint32_t>(vgpu), quota});
    }
    if (const auto bell = o.find("doorbell"); bell != o.end()) {
      // Optional: the VM's ivshmem-doorbell socket (oriond is its ivshmem server).
      uint64_t vectors = 0;
      if (!bell->is_object() || !Str(*bell, "socket", &a.doorbell_socket) || a.doorbell_socket.empty() ||
          a.doorbell_socket[0] != '/' || a.doorbell_socket.size() > 107 ||
          a.doorbell_socket.find('\0') != std::string::npos || !UInt(*bell, "vectors", 1, kMaxVmProcesses, &vectors)) {
        return Bad(source, at + ".doorbell needs socket (an absolute path of at most 107 bytes) and vectors (1.." +
                               std::to_string(kMaxVmProcesses) + ")");
      }
      a.doorbell_vectors = static_cast<uint32_t>(vectors);
    }
    if (const auto c = o.find("compute"); c != o.end()) {
      // Optional: the VM's compute share.
      std::string policy;
      if (!c->is_object() || !UInt(*c, "ratio", 1, 100, &v) || !Str(*c, "policy", &policy) ||
          (policy != "share" && policy != "cap")) {
        return Bad(source, at + ".compute needs ratio (1..100) and policy (share or cap)");
      }
      a.ratio = static_cast<uint32_t>(v);
      (void)ParseComputePolicy(policy, &a.ratio_policy);
      for (Placement& p : a.placements) p.ratio = a.ratio;
    }
    if (!names.insert(a.vm).second) return Bad(source, "VM " + a.vm + " is listed twice");
    if (!regions.insert(a.region).second) return Bad(source, "region " + a.region + " is listed twice");
    out.push_back(std::move(a));
  }
  return out;
}

Result<std::vector<VmAttachment>> LoadVmState(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::vector<VmAttachment>{};
    return Errno(errno == EACCES ? Code::kPermissionDenied : Code::kInternal, "cannot read " + path);
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const Status s = Errno(Code::kInternal, "cannot read " + path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxVmStateBytes) {
      ::close(fd);
      return Bad(path, "larger than " + std::to_string(kMaxVmStateBytes >> 20) + " MiB");
    }
  }
  ::close(fd);
  return DecodeVmState(text, path);
}

Status SaveVmState(const std::string& path, const std::vector<VmAttachment>& vms) {
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status(Code::kPermissionDenied, "cannot create " + dir.string() + ": " + ec.message());
    ::chmod(dir.c_str(), 0750);
  }
  const std::string text = EncodeVmState(vms);
  std::string tmp = path + ".tmp-XXXXXX";
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return Errno(errno == EACCES ? Code::kPermissionDenied : Code::kInternal, "cannot write " + path);
  size_t done = 0;
  bool ok = ::fchmod(fd, 0600) == 0;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    errno = ok ? errno : err;
    Status s = Errno(Code::kInternal, "cannot write " + path);
    ::unlink(tmp.c_str());
    return s;
  }
  // The rename itself must survive a crash: fsync the directory.
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

}  // namespace orion::host
