// orion-vm: gives a libvirt domain Orion vGPUs, and is the libvirt qemu hook.
//
//   orion-vm enable DOMAIN --vgpus N --gmem MIB [--processes P] [--shm-mib S] [--doorbell on|off]
//                  [--ratio R [--ratio-policy share|cap]] [-c URI]
//        adds <shmem name='orionsock-DOMAIN'><model type='ivshmem-plain'/><size unit='M'>S</size>
//        </shmem> and the vGPU request (<metadata><orion:vgpu count= gmem= processes=/>) to the
//        persistent definition (virsh define); takes effect at the domain's next start. P CUDA
//        processes may run in the VM at once (one channel each, default 4); S defaults to P times
//        shm_buffer_size (server.conf, 64 MiB) rounded up to a power of two. With the doorbell
//        (--doorbell on, or kvm_doorbell = "true" in server.conf) the device is an
//        ivshmem-doorbell whose server is oriond: <model type='ivshmem-doorbell'/>, <server
//        path='<shm_path_base>orionsock-DOMAIN.sock'/>, <msi vectors='P' ioeventfd='on'/>; a guest
//        process then wakes oriond's worker instead of oriond polling for it. R (1..100) is the VM's
//        compute share, percent of each of its physical GPUs (all its processes are one tenant;
//        share: at least R% when it has work, cap: at most R%); without it the VM is best effort.
//        Enabling again changes only the options given: the others keep the domain's values (it
//        says which), so `--doorbell on` or `--processes P` alone keeps the VM's vGPUs
//   orion-vm disable DOMAIN [-c URI]      removes both
//   orion-vm status DOMAIN [-c URI]       the request, the region, oriond's view
//   orion-vm hook DOMAIN OP SUBOP [EXTRA] (installed as /etc/libvirt/hooks/qemu; domain XML on stdin)
//        prepare: creates the region file (size, owner shm_user_name:shm_group_name, 0660) and
//        attaches the VM to oriond, which reserves its vGPUs (and, for an ivshmem-doorbell, listens
//        on the server socket QEMU connects to); a refusal exits 1 with the reason, and libvirt
//        refuses the start. release: detaches (frees the vGPUs) and removes the file.
//        Idempotent, quick, and never calls back into libvirtd.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libxml/parser.h>
#include <libxml/tree.h>
#include <libxml/xpath.h>
#include <libxml/xpathInternals.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "orion/host/config.h"
#include "orion/host/control.h"

namespace {

constexpr const char* kNs = "http://orion-vgpu.org/xmlns/libvirt/1.0";

struct VgpuRequest {
  uint32_t count = 1;
  uint64_t gmem_mib = 0;
  uint32_t processes = 0;  // 0: not in the XML (an older orion-vm): oriond's shm_buffer_size decides
  uint32_t ratio = 0;      // the VM's compute share, 1..100 (0: best effort)
  std::string ratio_policy = "share";
};

constexpr uint32_t kMaxProcesses = 30;  // channels in a region (ivshmem::kMaxChannels)
constexpr uint64_t kMinChannelMib = 4;  // ivshmem::kMinChannelBytes
uint64_t Pow2Ceil(uint64_t v) {
  uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}
struct Shmem {
  std::string name;
  uint64_t bytes = 0;
  bool doorbell = false;  // ivshmem-doorbell: oriond is its server
  std::string socket;     // <server path=…/>
  uint32_t vectors = 1;   // <msi vectors=…/> (QEMU's default: 1)
  bool sized = false;     // a <size> element (an ivshmem-doorbell has none: the metadata's shm_mib)
};

bool SafeName(const std::string& s) {
  if (s.empty() || s.size() > 200) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
  }
  return s[0] != '.';
}

std::string Run(const std::vector<std::string>& argv, int* rc) {
  std::string cmd;
  for (const auto& a : argv) {
    cmd += "'";
    for (char c : a) cmd += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += "' ";
  }
  cmd += "2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  if (p == nullptr) {
    *rc = -1;
    return "cannot run " + argv[0];
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *rc = pclose(p);
  return out;
}

// The domain's XML (`inactive`: the persistent definition, as the next start will use it), or
// false with virsh's message printed.
bool DumpXml(const std::string& uri, const std::string& domain, bool inactive, std::string* xml) {
  int rc = 0;
  *xml = inactive ? Run({"virsh", "-c", uri, "dumpxml", "--inactive", domain}, &rc)
                  : Run({"virsh", "-c", uri, "dumpxml", domain}, &rc);
  if (rc == 0) return true;
  std::cerr << "orion-vm: " << *xml;
  return false;
}

uint64_t SizeBytes(const std::string& value, const std::string& unit) {
  const uint64_t v = std::strtoull(value.c_str(), nullptr, 10);
  if (unit == "b" || unit == "bytes") return v;
  if (unit == "k" || unit == "KiB") return v << 10;
  if (unit == "G" || unit == "GiB") return v << 30;
  return v << 20;  // libvirt's default unit for <shmem><size> is M (MiB)
}

// The Orion shmem device and vGPU request of a domain XML.
bool ParseDomain(const std::string& xml, std::optional<Shmem>* shm, VgpuRequest* req, std::string* err) {
  xmlDocPtr doc = xmlReadMemory(xml.data(), static_cast<int>(xml.size()), "domain.xml", nullptr, XML_PARSE_NONET);
  if (doc == nullptr) {
    *err = "cannot parse the domain XML";
    return false;
  }
  xmlXPathContextPtr ctx = xmlXPathNewContext(doc);
  xmlXPathRegisterNs(ctx, BAD_CAST "orion", BAD_CAST kNs);
  xmlXPathObjectPtr r = xmlXPathEvalExpression(
      BAD_CAST "/domain/devices/shmem[model/@type='ivshmem-plain' or model/@type='ivshmem-doorbell']", ctx);
  if (r != nullptr && r->nodesetval != nullptr) {
    for (int i = 0; i < r->nodesetval->nodeNr; ++i) {
      xmlNodePtr n = r->nodesetval->nodeTab[i];
      xmlChar* name = xmlGetProp(n, BAD_CAST "name");
      const std::string nm = name != nullptr ? reinterpret_cast<char*>(name) : "";
      xmlFree(name);
      if (nm.rfind("orionsock", 0) != 0) continue;
      Shmem s;
      s.name = nm;
      s.bytes = 4ull << 20;
      for (xmlNodePtr c = n->children; c != nullptr; c = c->next) {
        if (c->type != XML_ELEMENT_NODE) continue;
        auto prop = [&](const char* attr) {
          xmlChar* v = xmlGetProp(c, BAD_CAST attr);
          std::string out = v != nullptr ? reinterpret_cast<char*>(v) : "";
          xmlFree(v);
          return out;
        };
        if (xmlStrcmp(c->name, BAD_CAST "model") == 0) s.doorbell = prop("type") == "ivshmem-doorbell";
        if (xmlStrcmp(c->name, BAD_CAST "server") == 0) s.socket = prop("path");
        if (xmlStrcmp(c->name, BAD_CAST "msi") == 0 && !prop("vectors").empty()) {
          s.vectors =
              static_cast<uint32_t>(std::min<unsigned long>(std::strtoul(prop("vectors").c_str(), nullptr, 10), 1024));
        }
        if (xmlStrcmp(c->name, BAD_CAST "size") == 0) {
          s.sized = true;
          xmlChar* unit = xmlGetProp(c, BAD_CAST "unit");
          xmlChar* text = xmlNodeGetContent(c);
          s.bytes = SizeBytes(text != nullptr ? reinterpret_cast<char*>(text) : "0",
                              unit != nullptr ? reinterpret_cast<char*>(unit) : "M");
          xmlFree(unit);
          xmlFree(text);
        }
      }
      *shm = s;
      break;
    }
  }
  xmlXPathFreeObject(r);
  r = xmlXPathEvalExpression(BAD_CAST "/domain/metadata/orion:vgpu", ctx);
  if (r != nullptr && r->nodesetval != nullptr && r->nodesetval->nodeNr > 0) {
    xmlNodePtr n = r->nodesetval->nodeTab[0];
    xmlChar* count = xmlGetProp(n, BAD_CAST "count");
    xmlChar* gmem = xmlGetProp(n, BAD_CAST "gmem");
    xmlChar* procs = xmlGetProp(n, BAD_CAST "processes");
    xmlChar* mib = xmlGetProp(n, BAD_CAST "shm_mib");
    xmlChar* ratio = xmlGetProp(n, BAD_CAST "ratio");
    xmlChar* policy = xmlGetProp(n, BAD_CAST "ratio_policy");
    if (ratio != nullptr) {
      req->ratio = static_cast<uint32_t>(
          std::min<unsigned long>(std::strtoul(reinterpret_cast<char*>(ratio), nullptr, 10), 100));
    }
    if (policy != nullptr && xmlStrcmp(policy, BAD_CAST "cap") == 0) req->ratio_policy = "cap";
    xmlFree(ratio);
    xmlFree(policy);
    if (mib != nullptr && *shm && !(*shm)->sized) {
      (*shm)->bytes = std::strtoull(reinterpret_cast<char*>(mib), nullptr, 10) << 20;
    }
    xmlFree(mib);
    if (count != nullptr) req->count = static_cast<uint32_t>(std::strtoul(reinterpret_cast<char*>(count), nullptr, 10));
    if (gmem != nullptr) req->gmem_mib = std::strtoull(reinterpret_cast<char*>(gmem), nullptr, 10);
    if (procs != nullptr) {
      req->processes = static_cast<uint32_t>(
          std::min<unsigned long>(std::strtoul(reinterpret_cast<char*>(procs), nullptr, 10), kMaxProcesses));
    }
    xmlFree(count);
    xmlFree(gmem);
    xmlFree(procs);
  }
  xmlXPathFreeObject(r);
  xmlXPathFreeContext(ctx);
  xmlFreeDoc(doc);
  return true;
}

// One control line to oriond; its reply, or "error <why>".
std::string Oriond(const std::string& socket_path, const std::string& line) {
  auto r = orion::host::ControlRequest(socket_path, line);
  return r.ok() ? *r : "error " + r.status().message();
}

// Writes `doc` to a temporary file and `virsh define`s it. Frees `doc`.
bool DefineXml(const std::string& uri, xmlDocPtr doc) {
  char tmpl[] = "/tmp/orion-vm-XXXXXX.xml";
  const int fd = mkstemps(tmpl, 4);
  xmlChar* out = nullptr;
  int len = 0;
  xmlDocDumpFormatMemory(doc, &out, &len, 1);
  const bool wrote = fd >= 0 && write(fd, out, static_cast<size_t>(len)) == len;
  xmlFree(out);
  xmlFreeDoc(doc);
  if (fd >= 0) close(fd);
  if (!wrote) {
    std::cerr << "orion-vm: cannot write a temporary file\n";
    unlink(tmpl);
    return false;
  }
  int rc = 0;
  const std::string defined = Run({"virsh", "-c", uri, "define", tmpl}, &rc);
  unlink(tmpl);
  if (rc != 0) std::cerr << "orion-vm: virsh define failed: " << defined;
  return rc == 0;
}

int Hook(const orion::host::ServerConfig& conf, const std::string& domain, const std::string& op) {
  if (op != "prepare" && op != "release") return 0;  // nothing to do at other points
  std::stringstream ss;
  ss << std::cin.rdbuf();
  std::optional<Shmem> shm;
  VgpuRequest req;
  std::string err;
  if (!ParseDomain(ss.str(), &shm, &req, &err)) {
    std::cerr << "orion: " << err << "\n";
    return op == "prepare" ? 1 : 0;
  }
  if (!shm) return 0;  // not an Orion domain
  if (!SafeName(shm->name) || !SafeName(domain)) {
    std::cerr << "orion: refusing unsafe names (domain '" << domain << "', shmem '" << shm->name << "')\n";
    return op == "prepare" ? 1 : 0;
  }
  std::string base = conf.shm_path_base;
  if (!base.empty() && base.back() != '/') base += '/';
  const std::string path = base + shm->name;
  // The doorbell's server socket sits beside the region, named after it (oriond creates it there,
  // owned like the region; the hook never lets a domain XML point oriond elsewhere).
  const std::string socket = path + ".sock";
  if (op == "release") {
    Oriond(conf.control_socket, "detach " + domain);  // oriond removes the doorbell socket too
    unlink(path.c_str());
    return 0;
  }
  if (shm->doorbell && shm->socket != socket) {
    std::cerr << "orion: the ivshmem-doorbell of " << domain << " must have <server path='" << socket
              << "'/> (orion-vm enable writes it)\n";
    return 1;
  }
  if (shm->bytes == 0 || (shm->bytes & (shm->bytes - 1)) != 0) {
    std::cerr << "orion: the ivshmem size of " << domain << " must be a power of two\n";
    return 1;
  }
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0660);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 ||
      (static_cast<uint64_t>(st.st_size) != shm->bytes && ftruncate(fd, static_cast<off_t>(shm->bytes)) != 0)) {
    std::cerr << "orion: cannot create " << path << ": " << std::strerror(errno) << "\n";
    if (fd >= 0) close(fd);
    return 1;
  }
  // QEMU runs as shm_user_name: a root-owned file makes the start fail (recipes.md).
  passwd* pw = getpwnam(conf.shm_user_name.c_str());
  group* gr = getgrnam(conf.shm_group_name.c_str());
  if (pw == nullptr || gr == nullptr) {
    std::cerr << "orion: user '" << conf.shm_user_name << "' or group '" << conf.shm_group_name
              << "' does not exist (shm_user_name / shm_group_name in server.conf)\n";
    close(fd);
    return 1;
  }
  if (fchown(fd, pw->pw_uid, gr->gr_gid) != 0 || fchmod(fd, 0660) != 0) {
    std::cerr << "orion: cannot give " << path << " to " << conf.shm_user_name << ": " << std::strerror(errno) << "\n";
    close(fd);
    return 1;
  }
  close(fd);
  const std::string reply = Oriond(
      conf.control_socket,
      "attach " + domain + " " + path + " " + std::to_string(req.count) + " " + std::to_string(req.gmem_mib) + " " +
          std::to_string(req.processes) + (shm->doorbell ? " " + socket + " " + std::to_string(shm->vectors) : "") +
          (req.ratio != 0 ? " ratio=" + std::to_string(req.ratio) + " ratio_policy=" + req.ratio_policy : ""));
  if (reply.rfind("ok", 0) != 0) {
    std::cerr << "orion: cannot start " << domain << ": " << reply.substr(reply.find(' ') + 1) << "\n";
    return 1;
  }
  return 0;
}

// What `orion-vm enable` was given. An option not given keeps the domain's current value when it
// has Orion vGPUs already, else takes its default: enabling the doorbell on a VM of 2 vGPUs leaves
// it 2 vGPUs.
struct EnableOptions {
  std::optional<uint32_t> vgpus, processes, ratio;
  std::optional<uint64_t> gmem, shm_mib;
  std::optional<bool> doorbell;
  std::optional<std::string> ratio_policy;
};

int Enable(const orion::host::ServerConfig& conf, const std::string& uri, const std::string& domain,
           const EnableOptions& given) {
  if (!SafeName(domain)) {
    std::cerr << "orion-vm: domain name '" << domain << "' has characters Orion cannot use in a file name\n";
    return 1;
  }
  std::string xml;
  if (!DumpXml(uri, domain, true, &xml)) return 1;
  std::optional<Shmem> now_shm;
  VgpuRequest now;
  std::string parse_err;
  const bool had = ParseDomain(xml, &now_shm, &now, &parse_err) && now_shm.has_value();
  std::string kept;  // the options that keep the domain's values, as they would be written
  auto keep = [&](auto given_value, auto current, auto fallback, const std::string& flag) {
    if (given_value) return *given_value;
    if (!had) return fallback;
    std::ostringstream o;
    o << " " << flag << " " << current;
    kept += o.str();
    return current;
  };
  const uint32_t vgpus = keep(given.vgpus, now.count, uint32_t{1}, "--vgpus");
  const uint64_t gmem = keep(given.gmem, now.gmem_mib, uint64_t{0}, "--gmem");
  const uint32_t processes = keep(given.processes, now.processes != 0 ? now.processes : 4u, 4u, "--processes");
  const bool doorbell = given.doorbell ? *given.doorbell : had ? now_shm->doorbell : conf.kvm_doorbell;
  if (!given.doorbell && had) kept += doorbell ? " --doorbell on" : " --doorbell off";
  const uint32_t ratio = given.ratio ? *given.ratio : had ? now.ratio : 0;
  if (!given.ratio && had && now.ratio != 0) kept += " --ratio " + std::to_string(now.ratio);
  const std::string ratio_policy = given.ratio_policy ? *given.ratio_policy : had ? now.ratio_policy : "share";
  if (!given.ratio_policy && had && ratio != 0) kept += " --ratio-policy " + ratio_policy;
  // One channel per CUDA process, each about shm_buffer_size (its staging and pinned memory). The
  // region keeps its size unless the processes change.
  uint64_t shm_mib = Pow2Ceil(uint64_t{processes} * conf.shm_buffer_size_mib);
  if (given.shm_mib) {
    shm_mib = *given.shm_mib;
  } else if (had && !given.processes && now_shm->bytes != 0) {
    shm_mib = now_shm->bytes >> 20;
    kept += " --shm-mib " + std::to_string(shm_mib);
  }
  if (shm_mib == 0 || (shm_mib & (shm_mib - 1)) != 0) {
    std::cerr << "orion-vm: --shm-mib must be a power of two (an ivshmem BAR)\n";
    return 1;
  }
  if (((shm_mib << 20) - 4096) / processes < (kMinChannelMib << 20)) {
    std::cerr << "orion-vm: a region of " << shm_mib << " MiB is too small for " << processes
              << " processes (each needs at least " << kMinChannelMib << " MiB)\n";
    return 1;
  }
  xmlDocPtr doc = xmlReadMemory(xml.data(), static_cast<int>(xml.size()), "domain.xml", nullptr, XML_PARSE_NONET);
  if (doc == nullptr) {
    std::cerr << "orion-vm: cannot parse the domain XML\n";
    return 1;
  }
  xmlNodePtr root = xmlDocGetRootElement(doc);
  xmlNodePtr devices = nullptr, metadata = nullptr;
  for (xmlNodePtr c = root->children; c != nullptr; c = c->next) {
    if (c->type != XML_ELEMENT_NODE) continue;
    if (xmlStrcmp(c->name, BAD_CAST "devices") == 0) devices = c;
    if (xmlStrcmp(c->name, BAD_CAST "metadata") == 0) metadata = c;
  }
  if (devices == nullptr) devices = xmlNewChild(root, nullptr, BAD_CAST "devices", nullptr);
  // Drop an earlier Orion device and request (enable is idempotent).
  for (xmlNodePtr c = devices->children; c != nullptr;) {
    xmlNodePtr next = c->next;
    xmlChar* name = c->type == XML_ELEMENT_NODE ? xmlGetProp(c, BAD_CAST "name") : nullptr;
    if (name != nullptr && xmlStrcmp(c->name, BAD_CAST "shmem") == 0 &&
        xmlStrncmp(name, BAD_CAST "orionsock", 9) == 0) {
      xmlUnlinkNode(c);
      xmlFreeNode(c);
    }
    xmlFree(name);
    c = next;
  }
  const std::string shm_name = "orionsock-" + domain;
  xmlNodePtr shm = xmlNewChild(devices, nullptr, BAD_CAST "shmem", nullptr);
  xmlNewProp(shm, BAD_CAST "name", BAD_CAST shm_name.c_str());
  xmlNewProp(xmlNewChild(shm, nullptr, BAD_CAST "model", nullptr), BAD_CAST "type",
             BAD_CAST(doorbell ? "ivshmem-doorbell" : "ivshmem-plain"));
  // libvirt refuses <size> on an ivshmem-doorbell (QEMU sizes BAR2 from the memory oriond sends):
  // the hook then reads the size from the Orion metadata (shm_mib).
  if (!doorbell) {
    xmlNewProp(xmlNewChild(shm, nullptr, BAD_CAST "size", BAD_CAST std::to_string(shm_mib).c_str()), BAD_CAST "unit",
               BAD_CAST "M");
  }
  if (doorbell) {
    // QEMU takes the memory from oriond over this socket (the hook checks the path), and rings
    // oriond's eventfds: one vector per channel, written to by the guest in BAR0.
    std::string base = conf.shm_path_base;
    if (!base.empty() && base.back() != '/') base += '/';
    const std::string sock = base + shm_name + ".sock";
    xmlNewProp(xmlNewChild(shm, nullptr, BAD_CAST "server", nullptr), BAD_CAST "path", BAD_CAST sock.c_str());
    xmlNodePtr msi = xmlNewChild(shm, nullptr, BAD_CAST "msi", nullptr);
    xmlNewProp(msi, BAD_CAST "vectors", BAD_CAST std::to_string(processes).c_str());
    xmlNewProp(msi, BAD_CAST "ioeventfd", BAD_CAST "on");
  }
  if (metadata == nullptr) metadata = xmlNewChild(root, nullptr, BAD_CAST "metadata", nullptr);
  for (xmlNodePtr c = metadata->children; c != nullptr;) {
    xmlNodePtr next = c->next;
    if (c->type == XML_ELEMENT_NODE && c->ns != nullptr && xmlStrcmp(c->ns->href, BAD_CAST kNs) == 0) {
      xmlUnlinkNode(c);
      xmlFreeNode(c);
    }
    c = next;
  }
  xmlNodePtr v = xmlNewChild(metadata, nullptr, BAD_CAST "vgpu", nullptr);
  xmlSetNs(v, xmlNewNs(v, BAD_CAST kNs, BAD_CAST "orion"));
  xmlNewProp(v, BAD_CAST "count", BAD_CAST std::to_string(vgpus).c_str());
  xmlNewProp(v, BAD_CAST "gmem", BAD_CAST std::to_string(gmem).c_str());
  xmlNewProp(v, BAD_CAST "processes", BAD_CAST std::to_string(processes).c_str());
  xmlNewProp(v, BAD_CAST "shm_mib", BAD_CAST std::to_string(shm_mib).c_str());
  if (ratio != 0) {
    xmlNewProp(v, BAD_CAST "ratio", BAD_CAST std::to_string(ratio).c_str());
    xmlNewProp(v, BAD_CAST "ratio_policy", BAD_CAST ratio_policy.c_str());
  }
  if (!DefineXml(uri, doc)) return 1;
  std::cout << "Domain " << domain << ": " << vgpus << " vGPU(s) of " << (gmem != 0 ? std::to_string(gmem) : "default")
            << " MiB, " << processes << " CUDA processes at once, through " << shm_name << " (" << shm_mib << " MiB, "
            << (doorbell ? "ivshmem-doorbell served by oriond" : "ivshmem-plain") << "), "
            << (ratio != 0 ? std::to_string(ratio) + "% of each GPU's compute (" + ratio_policy + ")"
                           : std::string("best-effort compute"))
            << "; takes effect at the next start\n";
  if (!kept.empty()) std::cout << "Options not given keep the domain's current values:" << kept << "\n";
  return 0;
}

int Disable(const std::string& uri, const std::string& domain) {
  std::string xml;
  if (!DumpXml(uri, domain, true, &xml)) return 1;
  xmlDocPtr doc = xmlReadMemory(xml.data(), static_cast<int>(xml.size()), "domain.xml", nullptr, XML_PARSE_NONET);
  if (doc == nullptr) return 1;
  xmlXPathContextPtr ctx = xmlXPathNewContext(doc);
  xmlXPathRegisterNs(ctx, BAD_CAST "orion", BAD_CAST kNs);
  for (const char* q : {"/domain/devices/shmem[starts-with(@name,'orionsock')]", "/domain/metadata/orion:vgpu"}) {
    xmlXPathObjectPtr r = xmlXPathEvalExpression(BAD_CAST q, ctx);
    for (int i = 0; r != nullptr && r->nodesetval != nullptr && i < r->nodesetval->nodeNr; ++i) {
      xmlUnlinkNode(r->nodesetval->nodeTab[i]);
      xmlFreeNode(r->nodesetval->nodeTab[i]);
    }
    xmlXPathFreeObject(r);
  }
  xmlXPathFreeContext(ctx);
  if (!DefineXml(uri, doc)) return 1;
  std::cout << "Domain " << domain << ": Orion vGPUs removed; takes effect at the next start\n";
  return 0;
}

int Status(const orion::host::ServerConfig& conf, const std::string& uri, const std::string& domain) {
  std::string xml;
  if (!DumpXml(uri, domain, false, &xml)) return 1;
  std::optional<Shmem> shm;
  VgpuRequest req;
  std::string err;
  ParseDomain(xml, &shm, &req, &err);
  if (!shm) {
    std::cout << "Domain " << domain << ": no Orion vGPUs (orion-vm enable " << domain << " ...)\n";
    return 0;
  }
  std::cout << "Domain " << domain << ": " << req.count << " vGPU(s), gmem " << req.gmem_mib << " MiB, "
            << (req.processes != 0 ? std::to_string(req.processes) : std::string("server-chosen"))
            << " processes at once, "
            << (req.ratio != 0 ? std::to_string(req.ratio) + "% of each GPU's compute (" + req.ratio_policy + ")"
                               : std::string("best-effort compute"))
            << ", region " << conf.shm_path_base << shm->name << " (" << (shm->bytes >> 20) << " MiB, "
            << (shm->doorbell ? "ivshmem-doorbell, server " + shm->socket : std::string("ivshmem-plain")) << ")\n";
  std::cout << "oriond: " << Oriond(conf.control_socket, "status") << "\n";
  return 0;
}

}  // namespace

static int Main(int argc, char** argv) {
  CLI::App app{"orion-vm: Orion vGPUs for libvirt domains"};
  std::string config_path = "/etc/orion/server.conf", uri = "qemu:///system";
  app.add_option("--config", config_path, "oriond's server.conf (paths, shm owner, control socket)");
  app.add_option("-c,--connect", uri, "libvirt URI");
  std::string domain, op, subop, extra;
  uint32_t vgpus = 1;
  uint64_t gmem = 0, shm_mib = 0;
  uint32_t processes = 4;  // the defaults of a domain that has no Orion vGPUs yet
  auto* en = app.add_subcommand("enable", "give DOMAIN vGPUs");
  en->add_option("domain", domain)->required();
  auto* vgpus_opt = en->add_option("--vgpus", vgpus, "number of vGPUs (default 1)")->check(CLI::Range(1, 16));
  auto* gmem_opt = en->add_option("--gmem", gmem, "MiB per vGPU (0, the default: the server's default size)");
  auto* processes_opt =
      en->add_option("--processes", processes, "CUDA processes that may run in the VM at once (one channel each; 4)")
          ->check(CLI::Range(1u, kMaxProcesses));
  std::string doorbell_opt;
  en->add_option("--doorbell", doorbell_opt,
                 "on: an ivshmem-doorbell device whose server is oriond (guest processes wake oriond); off: "
                 "ivshmem-plain (oriond polls); default: kvm_doorbell in server.conf")
      ->check(CLI::IsMember({"on", "off"}));
  uint32_t ratio = 0;
  std::string ratio_policy = "share";
  auto* ratio_opt =
      en->add_option("--ratio", ratio, "the VM's compute share: percent of each of its GPUs (default: best effort)")
          ->check(CLI::Range(1u, 100u));
  auto* policy_opt =
      en->add_option("--ratio-policy", ratio_policy, "share: at least the ratio when it has work; cap: at most")
          ->check(CLI::IsMember({"share", "cap"}));
  auto* shm_opt =
      en->add_option("--shm-mib", shm_mib,
                     "size of the ivshmem region, a power of two (default: processes x shm_buffer_size, rounded up)");
  en->footer("Options not given keep the domain's current values (a domain enabled before), else their defaults.");
  auto* dis = app.add_subcommand("disable", "remove DOMAIN's vGPUs");
  dis->add_option("domain", domain)->required();
  auto* st = app.add_subcommand("status", "show DOMAIN's vGPUs");
  st->add_option("domain", domain)->required();
  auto* hook = app.add_subcommand("hook", "the libvirt qemu hook (domain XML on stdin)");
  hook->add_option("domain", domain)->required();
  hook->add_option("op", op)->required();
  hook->add_option("subop", subop);
  hook->add_option("extra", extra);
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  if (const char* e = std::getenv("ORION_SERVER_CONF")) config_path = e;
  auto conf = orion::host::LoadServerConfig(config_path);
  if (!conf.ok() && conf.status().code() != orion::Code::kNotFound) {
    std::cerr << "orion-vm: " << conf.status().message() << "\n";
    return 1;
  }
  const orion::host::ServerConfig c = conf.ok() ? *conf : orion::host::ServerConfig{};
  if (en->parsed()) {
    EnableOptions given;
    if (vgpus_opt->count() != 0) given.vgpus = vgpus;
    if (gmem_opt->count() != 0) given.gmem = gmem;
    if (processes_opt->count() != 0) given.processes = processes;
    if (ratio_opt->count() != 0) given.ratio = ratio;
    if (policy_opt->count() != 0) given.ratio_policy = ratio_policy;
    if (shm_opt->count() != 0) given.shm_mib = shm_mib;
    if (!doorbell_opt.empty()) given.doorbell = doorbell_opt == "on";
    return Enable(c, uri, domain, given);
  }
  if (dis->parsed()) return Disable(uri, domain);
  if (st->parsed()) return Status(c, uri, domain);
  return Hook(c, domain, op);
}

// Whatever escapes (a failed allocation, a library's exception) ends the program with its reason,
// not with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orion-vm: %s\n", e.what());
    return 1;
  }
}
