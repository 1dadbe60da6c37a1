// orion_spank.so — Slurm SPANK plugin: a job step asks the Orion pool for vGPUs.
//
//   srun --orion-vgpus=2 --orion-gmem=8000 python3 train.py
//   sbatch --orion-vgpus=1 train.sh            # the batch step holds them; its sruns share them
//
// plugstack.conf (spank(7)), on one line:
//   required /usr/lib/orion/slurm/orion_spank.so controller=10.0.0.5:9123,10.0.0.6:9123
//            key_file=/etc/orion/slurm.key [oriond_key_file=/etc/orion/oriond-client.key] [wait=600]
//            [tls_ca=/etc/orion/ca.crt] [tls_cert=... tls_key=...]  (for controller=https://host:port)
//
// What happens (the callbacks are spank(7)'s):
// - srun, sbatch, salloc (local and allocator context): the options are checked (a bad value stops
//   the command) and copied into the job's control environment (spank_job_env: ORION_VGPUS,
//   ORION_GMEM), where job_submit.lua makes them the job's `orion_vgpu` licenses and Comment, so a
//   job asking more than the pool has waits in the queue.
// - srun, slurm_spank_local_user_init (the step's ids known, its tasks not started): POST
//   /v1/allocations {vgpus, gmem_mib, job: "slurm/<job>.<step>"} with the controller client key
//   (key_file), then ORION_SERVER, ORION_ALLOCATION, ORION_VGPU, ORION_GMEM, ORION_SLURM_JOB into
//   the step's environment (ORION_SHM, ORION_CONTROLLER out). The job's allocation is "held": every
//   process of the step, on any node, one after another or at once, connects to the placed oriond
//   with it, and none releases it. A refusal is printed on srun's terminal and fails srun.
// - A batch script's slurmstepd (remote context, slurm_spank_init_post_opt) does the same for the
//   batch step; an srun inside the script finds ORION_ALLOCATION and ORION_SLURM_JOB of its own job
//   in its environment and uses that allocation.
// - While the controller says "not now" (409: the pool is busy outside Slurm's licenses) the
//   request is made again every 2 s for up to `wait` seconds; one that can never fit fails at once.
// - The holder (srun, or the batch step's slurmstepd) renews the lease from a thread every third of
//   lease_ttl; when its node dies nobody renews it and the controller (or etcd) frees it one lease
//   later. slurm_spank_exit (the step ended, failed or was cancelled): stop renewing, DELETE it.
#include <unistd.h>

extern "C" {  // spank.h declares the plugin's callbacks outside its own extern "C"
#include <slurm/slurm.h>
#include <slurm/spank.h>
}

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "orion/common/text.h"
#include "orion/controller/client.h"

extern "C" {
// SPANK_PLUGIN(orion, 1), spelled out: in C++ a namespace-scope const has internal linkage.
extern const char plugin_name[] = "orion";
extern const char plugin_type[] = "spank";
extern const unsigned int plugin_version = SLURM_VERSION_NUMBER;
}

namespace {

using orion::controller::ControllerClient;

constexpr uint32_t kMaxVgpus = 16;          // a process sees at most 16 devices
constexpr uint64_t kMaxGmemMib = 1u << 20;  // 1 TiB per vGPU
constexpr int kRetryMs = 2000;              // between "not now" answers
constexpr int kDefaultWaitS = 600;

struct Settings {
  std::string controller;                   // controller=: "host:port[,host:port...]"
  std::string key_path, key;                // key_file= and its contents: the controller client key
  std::string oriond_key_path, oriond_key;  // oriond_key_file= and its contents: exported as ORION_KEY
  int wait_s = kDefaultWaitS;               // wait=: how long a step waits for free vGPUs
  std::string tls_cert, tls_key;            // tls_cert=, tls_key=: a client certificate (mutual TLS)
};

// What this process (srun, or one step's slurmstepd) knows.
Settings g_settings;
uint32_t g_vgpus = 0;      // 0: the job did not ask
uint64_t g_gmem = 0;       // MiB per vGPU; 0: the server's default size
std::string g_allocation;  // held by this slurmstepd (released at exit)

// The lease renewer (remote context).
std::mutex g_mu;
std::condition_variable g_cv;
bool g_stop = false;
std::thread g_renewer;

bool ParseUint(const char* s, uint64_t max, uint64_t* out) {
  if (s == nullptr || *s == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || v > max || s[0] == '-') return false;
  *out = v;
  return true;
}

int OptVgpus(int /*val*/, const char* optarg, int /*remote*/) {
  uint64_t v = 0;
  if (!ParseUint(optarg, kMaxVgpus, &v) || v == 0) {
    slurm_error("orion: --orion-vgpus must be 1..%u, not '%s'", kMaxVgpus, optarg != nullptr ? optarg : "");
    return ESPANK_BAD_ARG;
  }
  g_vgpus = static_cast<uint32_t>(v);
  return ESPANK_SUCCESS;
}

int OptGmem(int /*val*/, const char* optarg, int /*remote*/) {
  uint64_t v = 0;
  if (!ParseUint(optarg, kMaxGmemMib, &v)) {
    slurm_error("orion: --orion-gmem must be MiB per vGPU, 0..%llu, not '%s'",
                static_cast<unsigned long long>(kMaxGmemMib), optarg != nullptr ? optarg : "");
    return ESPANK_BAD_ARG;
  }
  g_gmem = v;
  return ESPANK_SUCCESS;
}

char kVgpusName[] = "orion-vgpus";
char kVgpusArg[] = "N";
char kVgpusUsage[] = "N vGPUs from the Orion pool for each node of the job step (1..16)";
char kGmemName[] = "orion-gmem";
char kGmemArg[] = "MIB";
char kGmemUsage[] = "MiB of GPU memory per Orion vGPU (default: the server's vGPU size)";

// Reads a whole small file (a key), without its trailing newline. Empty on error.
std::string ReadSecret(const std::string& path, std::string* why) {
  std::ifstream in(path);
  if (!in) {
    *why = path + ": " + std::strerror(errno);
    return "";
  }
  std::string s;
  std::getline(in, s);
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ')) s.pop_back();
  if (s.empty()) *why = path + " is empty";
  return s;
}

int ParseArgs(int ac, char** av, bool read_keys) {
  for (int i = 0; i < ac; ++i) {
    const std::string a = av[i];
    const size_t eq = a.find('=');
    const std::string k = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    std::string why;
    if (k == "controller") {
      if (!orion::controller::ParseEndpoints(v).ok()) {
        slurm_error("orion: plugstack.conf: controller=%s is not host:port[,host:port...]", v.c_str());
        return -1;
      }
      g_settings.controller = v;
    } else if (k == "tls_ca") {
      // The CA file that verifies an https:// controller (else $ORION_TLS_CA, else the system's).
      orion::controller::SetTlsCaFile(v);
    } else if (k == "tls_cert" || k == "tls_key") {
      (k == "tls_cert" ? g_settings.tls_cert : g_settings.tls_key) = v;
      orion::controller::SetTlsClientCert(g_settings.tls_cert, g_settings.tls_key);
    } else if (k == "key_file") {
      g_settings.key_path = v;
      if (read_keys && (g_settings.key = ReadSecret(v, &why)).empty()) {
        slurm_error("orion: plugstack.conf: key_file: %s", why.c_str());
        return -1;
      }
    } else if (k == "oriond_key_file") {
      g_settings.oriond_key_path = v;
      if (read_keys && (g_settings.oriond_key = ReadSecret(v, &why)).empty()) {
        slurm_error("orion: plugstack.conf: oriond_key_file: %s", why.c_str());
        return -1;
      }
    } else if (k == "wait") {
      uint64_t w = 0;
      if (!ParseUint(v.c_str(), 7 * 24 * 3600, &w)) {
        slurm_error("orion: plugstack.conf: wait=%s is not seconds", v.c_str());
        return -1;
      }
      g_settings.wait_s = static_cast<int>(w);
    } else {
      slurm_error(
          "orion: plugstack.conf: unknown argument '%s' (controller=, key_file=, oriond_key_file=, tls_ca=, tls_cert=, "
          "tls_key=, wait=)",
          a.c_str());
      return -1;
    }
  }
  if (g_settings.controller.empty()) {
    slurm_error("orion: plugstack.conf: controller=host:port is required");
    return -1;
  }
  return 0;
}

std::string StepText(uint32_t step) {
  if (step == SLURM_BATCH_SCRIPT) return "batch";
  if (step == SLURM_INTERACTIVE_STEP) return "interactive";
  return std::to_string(step);
}

ControllerClient Client() {
  return ControllerClient(*orion::controller::ParseEndpoints(g_settings.controller), g_settings.key, 5000);
}

void RenewLoop(std::string id, uint64_t every_ms) {
  ControllerClient cc = Client();
  std::unique_lock<std::mutex> lock(g_mu);
  while (!g_cv.wait_for(lock, std::chrono::milliseconds(every_ms), [] { return g_stop; })) {
    lock.unlock();
    auto r = cc.Call("POST", "/v1/allocations/" + id + "/lease");
    if (!r.ok()) {
      slurm_info("orion: renewing allocation %s: %s", id.c_str(), orion::LogSafe(r.status().message()).c_str());
      if (r.status().code() == orion::Code::kNotFound) return;  // revoked or expired: nothing to keep
    }
    lock.lock();
  }
}

// Allocates for this job step (label "slurm/<job>.<step>") and puts ORION_* into its
// environment (`set` is setenv in srun, spank_setenv in slurmstepd). 0, or -1 with the reason
// logged (on srun's terminal in local context).
template <typename SetEnv, typename UnsetEnv>
int HoldForStep(const std::string& job_text, const std::string& label, const std::string& host, SetEnv set,
                UnsetEnv unset) {
  if (g_settings.key.empty() && !g_settings.key_path.empty()) {
    slurm_error("orion: plugstack.conf key_file could not be read");
    return -1;
  }
  ControllerClient cc = Client();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(g_settings.wait_s);
  orion::Result<nlohmann::json> a = orion::Status();
  for (bool said = false;; said = true) {
    nlohmann::json body = {
        {"vgpus", g_vgpus},
        {"gmem_mib", g_gmem},
        {"job", label},
        {"request_id", orion::RandomUuid()},
        {"client", {{"host", orion::ValidUtf8(host)}, {"pid", getpid()}, {"process", "slurm-" + job_text}}}};
    a = cc.Call("POST", "/v1/allocations", body);
    if (a.ok()) break;
    const orion::Code code = a.status().code();
    const bool later = code == orion::Code::kResourceExhausted || code == orion::Code::kUnavailable;
    if (!later || std::chrono::steady_clock::now() >= deadline) break;
    if (!said) {
      slurm_info("orion: job %s: %u vGPU(s) not free now (%s); waiting up to %d s", job_text.c_str(), g_vgpus,
                 orion::LogSafe(a.status().message()).c_str(), g_settings.wait_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(kRetryMs));
  }
  if (!a.ok()) {
    const std::string size = g_gmem == 0 ? std::string("the default size") : std::to_string(g_gmem) + " MiB";
    slurm_error("orion: job %s: the Orion Controller %s did not place %u vGPU(s) of %s: %s", job_text.c_str(),
                cc.endpoint().text().c_str(), g_vgpus, size.c_str(), orion::LogSafe(a.status().message()).c_str());
    return -1;
  }
  std::string id, server;
  uint64_t gmem = 0, ttl_ms = 15000;
  try {
    id = (*a).at("id").get<std::string>();
    server = (*a).at("server").get<std::string>();
    gmem = (*a).at("gmem_mib").get<uint64_t>();
    ttl_ms = (*a).value("lease_ttl_ms", ttl_ms);
  } catch (const std::exception& e) {
    slurm_error("orion: job %s: malformed allocation from the controller: %s", job_text.c_str(), e.what());
    return -1;
  }
  // The server text goes into the job's environment: the same checks the guest runtime applies.
  if (!orion::IsUuid(id) || !orion::controller::ParseEndpoint(server).ok()) {
    slurm_error("orion: job %s: the controller sent a malformed allocation id or server", job_text.c_str());
    return -1;
  }
  g_allocation = id;
  slurm_info("orion: %s holds allocation %s: %u vGPU(s) of %llu MiB on %s", label.c_str(), id.c_str(), g_vgpus,
             static_cast<unsigned long long>(gmem), server.c_str());
  set("ORION_SERVER", server);
  set("ORION_ALLOCATION", id);
  set("ORION_VGPU", std::to_string(g_vgpus));
  set("ORION_GMEM", std::to_string(gmem));
  set("ORION_SLURM_JOB", job_text);
  if (!g_settings.oriond_key.empty()) set("ORION_KEY", g_settings.oriond_key);
  unset("ORION_SHM");         // a region on this node must not take the job elsewhere
  unset("ORION_CONTROLLER");  // the job's processes do not allocate for themselves
  g_stop = false;
  g_renewer = std::thread(RenewLoop, id, std::max<uint64_t>(ttl_ms / 3, 200));
  return 0;
}

bool JobIds(spank_t sp, uint32_t* job, uint32_t* step) {
  if (spank_get_item(sp, S_JOB_ID, job) != ESPANK_SUCCESS || spank_get_item(sp, S_JOB_STEPID, step) != ESPANK_SUCCESS) {
    slurm_error("orion: cannot read the job and step ids");
    return false;
  }
  return true;
}

std::string Hostname() {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  return host;
}

}  // namespace

extern "C" {

int slurm_spank_init(spank_t sp, int ac, char** av) {
  // Registered, not a spank_options table: sbatch and salloc honour only registered options.
  static struct spank_option options[] = {
      {kVgpusName, kVgpusArg, kVgpusUsage, 1, 0, OptVgpus},
      {kGmemName, kGmemArg, kGmemUsage, 1, 0, OptGmem},
  };
  for (auto& o : options) {
    if (spank_option_register(sp, &o) != ESPANK_SUCCESS) {
      slurm_error("orion: cannot register --%s", o.name);
      return -1;
    }
  }
  // The key files are root's: read them where the plugin runs as root (slurmstepd), not in srun.
  return ParseArgs(ac, av, spank_context() == S_CTX_REMOTE);
}

int slurm_spank_init_post_opt(spank_t sp, int /*ac*/, char** /*av*/) {
  if (g_vgpus == 0) {
    if (g_gmem != 0) {
      slurm_error("orion: --orion-gmem needs --orion-vgpus");
      return -1;
    }
    return 0;
  }
  const spank_context_t ctx = spank_context();
  if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR) {
    // In the job's control environment (spank_job_env): job_submit.lua makes them the job's
    // orion_vgpu licenses, so the job waits in the queue while the pool is taken.
    spank_job_control_setenv(sp, "ORION_VGPUS", std::to_string(g_vgpus).c_str(), 1);
    spank_job_control_setenv(sp, "ORION_GMEM", std::to_string(g_gmem).c_str(), 1);
    return 0;
  }
  if (ctx != S_CTX_REMOTE) return 0;
  uint32_t job = 0, step = 0;
  if (!JobIds(sp, &job, &step)) return -1;
  // Only a batch script's step allocates here: an srun step was given its allocation by srun
  // (local_user_init below), where a refusal reaches the user's terminal.
  if (step != SLURM_BATCH_SCRIPT) return 0;
  const std::string job_text = std::to_string(job);
  return HoldForStep(
      job_text, "slurm/" + job_text + ".batch", Hostname(),
      [&](const char* k, const std::string& v) { spank_setenv(sp, k, v.c_str(), 1); },
      [&](const char* k) { spank_unsetenv(sp, k); });
}

// srun, once the step's ids are known and before its tasks start.
int slurm_spank_local_user_init(spank_t sp, int /*ac*/, char** /*av*/) {
  if (g_vgpus == 0 || spank_context() != S_CTX_LOCAL) return 0;
  uint32_t job = 0, step = 0;
  if (!JobIds(sp, &job, &step)) return -1;
  const std::string job_text = std::to_string(job);
  const char* held = std::getenv("ORION_ALLOCATION");
  const char* held_job = std::getenv("ORION_SLURM_JOB");
  if (held != nullptr && held_job != nullptr && job_text == held_job && orion::IsUuid(held)) {
    return 0;  // srun in a batch script: the batch step holds the job's vGPUs, and its env says so
  }
  // srun runs as the user: the key files must be readable by the users who may ask for vGPUs.
  std::string why;
  if (!g_settings.key_path.empty() && (g_settings.key = ReadSecret(g_settings.key_path, &why)).empty()) {
    slurm_error("orion: plugstack.conf key_file: %s (srun reads it as the user who runs it)", why.c_str());
    return -1;
  }
  if (!g_settings.oriond_key_path.empty() &&
      (g_settings.oriond_key = ReadSecret(g_settings.oriond_key_path, &why)).empty()) {
    slurm_error("orion: plugstack.conf oriond_key_file: %s (srun reads it as the user who runs it)", why.c_str());
    return -1;
  }
  return HoldForStep(
      job_text, "slurm/" + job_text + "." + StepText(step), Hostname(),
      [](const char* k, const std::string& v) { setenv(k, v.c_str(), 1); }, [](const char* k) { unsetenv(k); });
}

int slurm_spank_exit(spank_t /*sp*/, int /*ac*/, char** /*av*/) {
  if (g_allocation.empty()) return 0;  // srun, or a batch script's slurmstepd, that holds one
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_stop = true;
  }
  g_cv.notify_all();
  if (g_renewer.joinable()) g_renewer.join();
  auto r = Client().Call("DELETE", "/v1/allocations/" + g_allocation + "?reason=job_ended");
  if (!r.ok() && r.status().code() != orion::Code::kNotFound) {
    slurm_error("orion: releasing allocation %s: %s (it expires one lease after this)", g_allocation.c_str(),
                orion::LogSafe(r.status().message()).c_str());
  } else {
    slurm_info("orion: released allocation %s", g_allocation.c_str());
  }
  g_allocation.clear();
  return 0;
}

}  // extern "C"
