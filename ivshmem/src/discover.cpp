#include "orion/ivshmem/discover.h"

#include <dirent.h>
#include <fcntl.h>
#include <ini.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "orion/ivshmem/region.h"

namespace orion::ivshmem {
namespace {

struct ClientConf {
  std::string shm_path_base = "/dev/shm/";
  std::string controller_addr;
};

int ConfHandler(void* user, const char* section, const char* name, const char* value) {
  auto* c = static_cast<ClientConf*>(user);
  std::string v = value;
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  if (std::strcmp(section, "client-shm") == 0 && std::strcmp(name, "shm_path_base") == 0) {
    c->shm_path_base = v;
  }
  if (std::strcmp(section, "controller") == 0 && std::strcmp(name, "controller_addr") == 0) {
    c->controller_addr = v;
  }
  return 1;
}

std::string ReadSmall(const std::string& path) {
  std::string out;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f) != nullptr) out = buf;
    std::fclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// A VM's Orion region: an ivshmem-plain PCI device (1af4:1110, QEMU docs/specs/ivshmem-spec.rst)
// whose BAR2 (sysfs resource2) holds the Orion magic. Enables the device if needed (root, or the
// udev rule install-client installs). Returns the resource2 path, or "" with *why set.
std::string FindIvshmem(const std::string& sysfs, std::string* why, bool* device) {
  std::vector<std::string> devices;
  if (DIR* d = opendir(sysfs.c_str()); d != nullptr) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string dev = sysfs + "/" + e->d_name;
      if (ReadSmall(dev + "/vendor") == "0x1af4" && ReadSmall(dev + "/device") == "0x1110") devices.push_back(dev);
    }
    closedir(d);
  }
  std::sort(devices.begin(), devices.end());
  if (devices.empty()) {
    *why = "no ivshmem device (PCI 1af4:1110) in " + sysfs;
    return "";
  }
  *device = true;
  for (const std::string& dev : devices) {
    if (ReadSmall(dev + "/enable") == "0") {
      if (FILE* f = std::fopen((dev + "/enable").c_str(), "w")) {
        std::fputs("1", f);
        std::fclose(f);
      }
      if (ReadSmall(dev + "/enable") == "0") {
        *why = "ivshmem device " + dev +
               " is not enabled and this user cannot enable it (run "
               "'echo 1 > " +
               dev + "/enable' as root, or install the udev rule from install-client)";
        continue;
      }
    }
    // A memory BAR's resource file can be mapped but not read(): map its first page.
    std::string res = dev + "/resource2";
    const int fd = ::open(res.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      *why = "cannot open " + res + ": " + std::strerror(errno) +
             (errno == EACCES ? " (install-client's udev rule gives the 'orion' group access)" : "");
      continue;
    }
    void* page = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    uint64_t magic = 0;
    if (page != MAP_FAILED) {
      std::memcpy(&magic, page, sizeof magic);
      ::munmap(page, 4096);
    }
    if (magic == ivshmem::kRegionMagic) return res;
    *why = res + " holds no Orion region (is oriond serving this VM?)";
  }
  return "";
}

// Region path: $ORION_SHM; else the first orionsock* under [client-shm] shm_path_base of
// /etc/orion/client.conf < $HOME/.orion/client.conf; else a VM's ivshmem device.
std::string FindRegionPath(std::string* why, std::string* source, bool* device) {
  if (const char* e = std::getenv("ORION_SHM"); e != nullptr && *e != '\0') {
    *source = "ORION_SHM";
    return e;
  }
  ClientConf conf;
  ini_parse("/etc/orion/client.conf", ConfHandler, &conf);
  if (const char* home = std::getenv("HOME"); home != nullptr) {
    ini_parse((std::string(home) + "/.orion/client.conf").c_str(), ConfHandler, &conf);
  }
  std::string dir = conf.shm_path_base;
  if (!dir.empty() && dir.back() != '/') dir += '/';
  std::vector<std::string> found;
  if (DIR* d = opendir(dir.c_str()); d != nullptr) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, "orionsock", 9) == 0) found.push_back(dir + e->d_name);
    }
    closedir(d);
  }
  std::sort(found.begin(), found.end());
  if (!found.empty()) {
    *source = "shm_path_base " + dir;
    return found.front();
  }
  const char* sysfs = std::getenv("ORION_SYSFS_PCI");  // tests point this at a fake tree
  std::string bar = FindIvshmem(sysfs != nullptr ? sysfs : "/sys/bus/pci/devices", why, device);
  if (!bar.empty()) {
    *source = "ivshmem " + bar.substr(0, bar.rfind('/'));
    return bar;
  }
  *why = "no " + dir + "orionsock* region and " + *why;
  return "";
}

}  // namespace

Result<RegionLocation> FindClientRegion() {
  std::string why;
  std::string source;
  bool device = false;
  const std::string path = FindRegionPath(&why, &source, &device);
  if (path.empty()) return device ? Status(Code::kFailedPrecondition, why) : NotFound(why);
  RegionLocation where{path, source, ""};
  // An ivshmem device's registers sit beside its memory: BAR0 next to BAR2.
  if (source.rfind("ivshmem", 0) == 0) where.doorbell = path.substr(0, path.rfind('/')) + "/resource0";
  return where;
}

std::string ClientControllerAddr() {
  if (const char* e = std::getenv("ORION_CONTROLLER"); e != nullptr && *e != '\0') return e;
  ClientConf conf;
  ini_parse("/etc/orion/client.conf", ConfHandler, &conf);
  if (const char* home = std::getenv("HOME"); home != nullptr) {
    ini_parse((std::string(home) + "/.orion/client.conf").c_str(), ConfHandler, &conf);
  }
  return conf.controller_addr;
}

std::string ClientControllerKey() {
  const char* k = std::getenv("ORION_CONTROLLER_KEY");
  if (k == nullptr || *k == '\0') k = std::getenv("ORION_KEY");
  return k != nullptr ? k : "";
}

}  // namespace orion::ivshmem
