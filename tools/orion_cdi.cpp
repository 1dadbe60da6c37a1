// orion-cdi: a Container Device Interface spec for this host's Orion regions, so that a container
// engine that reads CDI (podman >= 4.1, Docker >= 25, containerd >= 1.7) gives a container vGPUs
// with `--device orion.dev/vgpu=0`, as nvidia-container-toolkit's /etc/cdi/nvidia.yaml does for GPUs.
//
//   orion-cdi generate [--output FILE] [--shm-dir DIR] [--lib-dir DIR] [--kind VENDOR/CLASS]
//
// One device per region here (<shm-dir>/orionsock<N>: a file whose header is an Orion region's, or
// still all zeros as orion-shm creates it, for oriond to format): `orion.dev/vgpu=<N>` mounts that region at its own
// path and sets ORION_SHM to it; `orion.dev/vgpu=all` mounts every region (the client takes the first, as without
// ORION_SHM). Every device also brings, read-only, this installation's client: libcuda.so.1 and libnvidia-ml.so.1 where
// an image's loader finds them without configuration (its multiarch directory and /usr/lib64; libcuda.so.1 needs
// nothing but libc), orion-smi and orion-check in /usr/bin, and ORION_CONTROLLER when client.conf or the environment
// names one. Format: CDI spec version 0.5.0 (github.com/cncf-tags/container-device-interface, SPEC.md), the newest that
// podman 4.3 (Debian 12) reads. Written as YAML, atomically (a temporary file renamed). Exit status: 0 written; 1 an
// error (no region, no client libraries, an unwritable output), said on stderr.
#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "orion/ivshmem/discover.h"
#include "orion/ivshmem/region.h"

namespace {

constexpr const char* kCdiVersion = "0.5.0";
constexpr const char* kKind = "orion.dev/vgpu";  // --kind: another (two installations side by side; tests)
#if defined(__x86_64__)
constexpr const char* kMultiarch = "/usr/lib/x86_64-linux-gnu";
#elif defined(__aarch64__)
constexpr const char* kMultiarch = "/usr/lib/aarch64-linux-gnu";
#else
#error "orion-cdi: name this architecture's multiarch library directory"
#endif

struct Region {
  uint32_t index;
  std::string path;
};

bool IsFile(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The regions in `dir` (orionsock<N> whose header is an Orion region's or not yet written), by
// index. A file that is neither is named on stderr and left out.
std::vector<Region> FindRegions(const std::string& dir) {
  std::vector<Region> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  static const std::regex kName("orionsock([0-9]{1,6})");
  std::smatch m;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (!std::regex_match(name, m, kName)) continue;
    const std::string path = (dir.ends_with('/') ? dir : dir + "/") + name;
    if (!IsFile(path)) continue;
    auto region = orion::ivshmem::MappedRegion::Open(path);
    if (!region.ok()) {
      std::fprintf(stderr, "orion-cdi: %s left out: %s\n", path.c_str(), region.status().message().c_str());
      continue;
    }
    uint64_t magic = 0;
    std::memcpy(&magic, region->data(), sizeof magic);
    auto header = orion::ivshmem::ValidateHeader(region->data(), region->size());
    if (!header.ok() && magic != 0) {  // 0: created by orion-shm, not served yet (oriond formats it)
      std::fprintf(stderr, "orion-cdi: %s left out: %s\n", path.c_str(), header.status().message().c_str());
      continue;
    }
    out.push_back({static_cast<uint32_t>(std::stoul(m[1].str())), path});
  }
  closedir(d);
  std::sort(out.begin(), out.end(), [](const Region& a, const Region& b) { return a.index < b.index; });
  return out;
}

// <prefix>/lib/orion of the installation this program belongs to (<prefix>/bin/orion-cdi).
std::string OwnLibDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  std::string exe(buf, static_cast<size_t>(n));
  const auto bin = exe.rfind('/');
  if (bin == std::string::npos) return "";
  const std::string bindir = exe.substr(0, bin);
  const auto prefix_end = bindir.rfind('/');
  return prefix_end == std::string::npos ? "" : bindir.substr(0, prefix_end) + "/lib/orion";
}

void Mount(YAML::Emitter& y, const std::string& host, const std::string& container, bool read_only) {
  y << YAML::BeginMap << YAML::Key << "hostPath" << YAML::Value << host << YAML::Key << "containerPath" << YAML::Value
    << container << YAML::Key << "options" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  y << (read_only ? "ro" : "rw") << "nosuid"
    << "nodev"
    << "rbind" << YAML::EndSeq << YAML::EndMap;
}

std::string Spec(const std::vector<Region>& regions, const std::string& lib_dir, const std::string& controller,
                 const std::string& kind) {
  YAML::Emitter y;
  y << YAML::BeginMap;
  y << YAML::Key << "cdiVersion" << YAML::Value << YAML::DoubleQuoted << kCdiVersion;
  y << YAML::Key << "kind" << YAML::Value << kind;
  y << YAML::Key << "devices" << YAML::Value << YAML::BeginSeq;
  for (const Region& r : regions) {
    y << YAML::BeginMap << YAML::Key << "name" << YAML::Value << YAML::DoubleQuoted << std::to_string(r.index);
    y << YAML::Key << "containerEdits" << YAML::Value << YAML::BeginMap;
    y << YAML::Key << "env" << YAML::Value << YAML::BeginSeq << "ORION_SHM=" + r.path << YAML::EndSeq;
    y << YAML::Key << "mounts" << YAML::Value << YAML::BeginSeq;
    Mount(y, r.path, r.path, false);
    y << YAML::EndSeq << YAML::EndMap << YAML::EndMap;
  }
  y << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "all";
  y << YAML::Key << "containerEdits" << YAML::Value << YAML::BeginMap << YAML::Key << "mounts" << YAML::Value
    << YAML::BeginSeq;
  for (const Region& r : regions) Mount(y, r.path, r.path, false);
  y << YAML::EndSeq << YAML::EndMap << YAML::EndMap;
  y << YAML::EndSeq;
  // What every device brings: the client, read-only.
  y << YAML::Key << "containerEdits" << YAML::Value << YAML::BeginMap;
  if (!controller.empty()) {
    y << YAML::Key << "env" << YAML::Value << YAML::BeginSeq << "ORION_CONTROLLER=" + controller << YAML::EndSeq;
  }
  y << YAML::Key << "mounts" << YAML::Value << YAML::BeginSeq;
  for (const char* lib : {"libcuda.so.1", "libnvidia-ml.so.1"}) {
    for (const char* dir : {kMultiarch, "/usr/lib64"})
      Mount(y, lib_dir + "/" + lib, std::string(dir) + "/" + lib, true);
  }
  for (const char* tool : {"orion-smi", "orion-check"}) {
    if (IsFile(lib_dir + "/" + tool)) Mount(y, lib_dir + "/" + tool, std::string("/usr/bin/") + tool, true);
  }
  y << YAML::EndSeq << YAML::EndMap;
  y << YAML::EndMap;
  return std::string("# Orion's vGPUs for container engines (CDI). Written by orion-cdi generate: do not edit.\n") +
         y.c_str() + "\n";
}

int Generate(const std::string& output, const std::string& shm_dir, std::string lib_dir, const std::string& kind) {
  // CDI: vendor (a DNS-like name) "/" class ([A-Za-z0-9][A-Za-z0-9_.-]*).
  static const std::regex kKindRe("[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?\\.[A-Za-z]+/[A-Za-z0-9][A-Za-z0-9_.-]*");
  if (!std::regex_match(kind, kKindRe)) {
    std::fprintf(stderr, "orion-cdi: --kind %s is not VENDOR/CLASS (orion.dev/vgpu)\n", kind.c_str());
    return 1;
  }
  const std::vector<Region> regions = FindRegions(shm_dir);
  if (regions.empty()) {
    std::fprintf(stderr, "orion-cdi: no Orion region in %s (orion-shm creates one; oriond serves it)\n",
                 shm_dir.c_str());
    return 1;
  }
  if (lib_dir.empty()) lib_dir = OwnLibDir();
  for (const char* lib : {"libcuda.so.1", "libnvidia-ml.so.1"}) {
    if (!IsFile(lib_dir + "/" + lib)) {
      std::fprintf(stderr, "orion-cdi: %s/%s is missing (--lib-dir names Orion's lib/orion)\n", lib_dir.c_str(), lib);
      return 1;
    }
  }
  const std::string spec = Spec(regions, lib_dir, orion::ivshmem::ClientControllerAddr(), kind);
  if (output == "-") {
    std::fputs(spec.c_str(), stdout);
    return 0;
  }
  const std::string tmp = output + ".tmp." + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << spec;
    f.close();
    if (!f) {
      std::fprintf(stderr, "orion-cdi: cannot write %s\n", tmp.c_str());
      unlink(tmp.c_str());
      return 1;
    }
  }
  chmod(tmp.c_str(), 0644);
  if (rename(tmp.c_str(), output.c_str()) != 0) {
    std::fprintf(stderr, "orion-cdi: cannot write %s: %s\n", output.c_str(), std::strerror(errno));
    unlink(tmp.c_str());
    return 1;
  }
  std::printf("orion-cdi: %s: %zu region(s) as %s=<N> and %s=all\n", output.c_str(), regions.size(), kind.c_str(),
              kind.c_str());
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app{"orion-cdi: Orion's vGPUs as CDI devices for container engines (orion.dev/vgpu=N)"};
  app.require_subcommand(1);
  std::string output = "/etc/cdi/orion.yaml", shm_dir = "/dev/shm", lib_dir, kind = kKind;
  CLI::App* gen = app.add_subcommand("generate", "write the CDI spec for this host's regions");
  gen->add_option("-o,--output", output, "the spec file ('-': standard output)")->capture_default_str();
  gen->add_option("--shm-dir", shm_dir, "where the regions are (orionsock<N>)")->capture_default_str();
  gen->add_option("--lib-dir", lib_dir, "Orion's client libraries (default: <prefix>/lib/orion of this program)");
  gen->add_option("--kind", kind, "the devices' CDI kind")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return Generate(output, shm_dir, lib_dir, kind);
}

}  // namespace

// Whatever escapes (a failed allocation, a library's exception) ends the program with its reason,
// not with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orion-cdi: %s\n", e.what());
    return 1;
  }
}
