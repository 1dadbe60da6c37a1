// e2e.h — shared helpers for the GPU end-to-end programs (tests/gpu/*.cu, run by scripts/gpu-e2e.sh).
//
// Output contract, one line each on stdout (line-buffered, so a killed run still shows its lines):
//   DEVICE <name> cc <major>.<minor> mem <MiB> driver <version> runtime <version>
//   TIME <name> <milliseconds>      a timed section: std::chrono around the work, final sync included,
//                                   measured after one untimed warm-up of the same work
//   BW <name> <GB/s>                (memcpy_bw) bandwidth, 1 GB = 1e9 bytes
//   LIBCUDA <path>                  the libcuda.so.1 this process loaded (from /proc/self/maps)
//   INFO <text>                     anything else worth keeping
//   RESULT <program> ok             exactly once, last; the exit status is then 0
//   RESULT <program> FAIL <detail>  on a wrong result or a CUDA error; the exit status is then 1
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace e2e {

inline const char*& program() {
  static const char* p = "?";
  return p;
}

// The path of the libcuda mapped into this process (Orion's or the real driver's), or "none".
inline std::string loaded_libcuda() {
  std::string found = "none";
  if (FILE* f = fopen("/proc/self/maps", "r")) {
    char line[4096];
    while (fgets(line, sizeof line, f) != nullptr) {
      const char* path = strchr(line, '/');
      if (path != nullptr && strstr(path, "/libcuda.so") != nullptr) {
        found = path;
        while (!found.empty() && (found.back() == '\n' || found.back() == ' ')) found.pop_back();
        break;
      }
    }
    fclose(f);
  }
  return found;
}

inline void print_libcuda_once() {
  static bool done = false;
  if (!done) printf("LIBCUDA %s\n", loaded_libcuda().c_str());
  done = true;
}

[[noreturn]] inline void fail(const char* f, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] inline void fail(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  print_libcuda_once();
  printf("RESULT %s FAIL %s\n", program(), buf);
  fflush(stdout);
  exit(1);
}

inline int pass() {
  printf("RESULT %s ok\n", program());
  fflush(stdout);
  return 0;
}

#define E2E_CK(call)                                                                                \
  do {                                                                                              \
    cudaError_t e2e_err_ = (call);                                                                  \
    if (e2e_err_ != cudaSuccess)                                                                    \
      ::e2e::fail("%s:%d %s -> %s (%d: %s)", __FILE__, __LINE__, #call, cudaGetErrorName(e2e_err_), \
                  static_cast<int>(e2e_err_), cudaGetErrorString(e2e_err_));                        \
  } while (0)

// Checks a kernel launch (configuration errors) right after <<<>>>.
#define E2E_CK_LAUNCH() E2E_CK(cudaGetLastError())

// Line-buffered stdout, a LIBCUDA and a DEVICE line; returns the device properties.
inline cudaDeviceProp start(const char* name) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  program() = name;
  int drv = 0, rt = 0, n = 0;
  E2E_CK(cudaDriverGetVersion(&drv));
  E2E_CK(cudaRuntimeGetVersion(&rt));
  E2E_CK(cudaGetDeviceCount(&n));
  if (n < 1) fail("no CUDA device");
  cudaDeviceProp p{};
  E2E_CK(cudaGetDeviceProperties(&p, 0));
  E2E_CK(cudaSetDevice(0));
  E2E_CK(cudaFree(nullptr));  // create the context outside every timed section
  print_libcuda_once();
  printf("DEVICE %s cc %d.%d mem %zu driver %d runtime %d devices %d\n", p.name, p.major, p.minor,
         p.totalGlobalMem >> 20, drv, rt, n);
  return p;
}

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline void nothing() {}

// Runs f once untimed (warm-up), then reset() (untimed: poison the outputs, so that the check that
// follows sees what the timed run produced), then f once timed; returns the milliseconds of the timed
// run. f must end with a synchronization.
template <class F, class R = void (*)()>
double measure(F&& f, R&& reset = nothing) {
  f();
  reset();
  const double t0 = now_ms();
  f();
  return now_ms() - t0;
}

// measure(), and a TIME line with the result.
template <class F, class R = void (*)()>
double timed(const char* name, F&& f, R&& reset = nothing) {
  const double ms = measure(f, reset);
  printf("TIME %s %.3f\n", name, ms);
  return ms;
}

// Deterministic pseudo-random numbers (the same on every run and machine).
struct Lcg {
  uint64_t s;
  explicit Lcg(uint64_t seed) : s(seed * 6364136223846793005ULL + 1442695040888963407ULL) {}
  uint32_t next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(s >> 33);
  }
  float unit() { return static_cast<float>(next() & 0xffffff) / 16777216.0f; }  // [0, 1)
};

}  // namespace e2e
