// orion_test.h — shared helpers for the Orion CUDA test programs (tests/cuda/*.cu, *.cpp).
//
// Output contract (parsed by the integration harness), one line each, on stdout:
//   CHECK <name> ok
//   CHECK <name> FAIL <details>
//   CHECK <name> skipped-sim (SASS-only kernel: the sim backend has no PTX to execute)
//   CUDA_ERROR <errorName> <code> <file>:<line> <expression>   (then exit 2)
//   DONE checks=<n> failed=<m>                                   (last line of a normal run)
// Exit status: 0 all checks passed, 1 some check failed, 2 unexpected CUDA error.
// Other lines (DEVICE, LAUNCH, PROP, QUOTA, UNSUPPORTED, READY, ...) are described per program.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ot {

inline int& fail_count() {
  static int n = 0;
  return n;
}
inline int& check_count() {
  static int n = 0;
  return n;
}
inline bool& is_sim() {
  static bool s = false;
  return s;
}

// Line-buffered stdout, so a harness sees every line even if the process is killed.
inline void init_output() { setvbuf(stdout, nullptr, _IOLBF, 0); }

inline std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

inline bool check(const std::string& name, bool ok, const std::string& details = std::string()) {
  ++check_count();
  if (ok) {
    printf("CHECK %s ok\n", name.c_str());
  } else {
    ++fail_count();
    std::string d = details.empty() ? std::string("-") : details;
    for (char& c : d)
      if (c == '\n' || c == '\r') c = ' ';
    printf("CHECK %s FAIL %s\n", name.c_str(), d.c_str());
  }
  return ok;
}

inline void skip_sim(const std::string& name) {
  printf("CHECK %s skipped-sim (SASS-only kernel: the sim backend has no PTX to execute)\n", name.c_str());
}

// A check on values a kernel computed. The sim backend executes kernels from their PTX, so these
// are checked everywhere.
inline bool check_kernel(const std::string& name, bool ok, const std::string& details = std::string()) {
  return check(name, ok, details);
}

// A check on values computed by a library kernel shipped as SASS only (cuBLAS, cuDNN): the sim
// backend cannot execute them (by default their launches fail; under --sim-unexecutable skip they
// are accepted and not run), so the value is checked only on a GPU.
inline bool check_sass_kernel(const std::string& name, bool ok, const std::string& details = std::string()) {
  if (is_sim()) {
    skip_sim(name);
    return true;
  }
  return check(name, ok, details);
}

inline int finish() {
  printf("DONE checks=%d failed=%d\n", check_count(), fail_count());
  fflush(stdout);
  return fail_count() ? 1 : 0;
}

inline std::string hex(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  const uint8_t* b = static_cast<const uint8_t*>(p);
  std::string s;
  s.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    s += digits[b[i] >> 4];
    s += digits[b[i] & 15];
  }
  return s;
}

// First index where two buffers differ, or -1.
inline long long first_diff(const void* a, const void* b, size_t n) {
  if (memcmp(a, b, n) == 0) return -1;
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i)
    if (x[i] != y[i]) return (long long)i;
  return -1;
}

inline std::string diff_details(const void* got, const void* want, size_t n) {
  long long i = first_diff(got, want, n);
  if (i < 0) return std::string();
  return fmt("first mismatch at byte %lld of %zu: got 0x%02x want 0x%02x", i, n, static_cast<const uint8_t*>(got)[i],
             static_cast<const uint8_t*>(want)[i]);
}

// Deterministic pseudo-random bytes (xorshift64*).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed ? seed : 0x9E3779B97F4A7C15ull) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  void fill(void* p, size_t n) {
    uint8_t* b = static_cast<uint8_t*>(p);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t v = next();
      memcpy(b + i, &v, 8);
    }
    if (i < n) {
      uint64_t v = next();
      memcpy(b + i, &v, n - i);
    }
  }
};

// A kernel parameter buffer laid out like the driver receives it: each parameter at the next
// offset aligned to alignof(T) (the C++ ABI rule the CUDA ABI follows for kernel parameters),
// padding bytes zero. The buffer ends at the end of the last parameter (no trailing padding).
struct ParamBuf {
  std::vector<uint8_t> bytes;
  std::vector<size_t> offsets, sizes;
  template <class T>
  void add(const T& v) {
    size_t a = alignof(T);
    size_t off = (bytes.size() + a - 1) / a * a;
    bytes.resize(off, 0);
    bytes.resize(off + sizeof(T));
    memcpy(bytes.data() + off, &v, sizeof(T));
    offsets.push_back(off);
    sizes.push_back(sizeof(T));
  }
  std::string hex() const { return ot::hex(bytes.data(), bytes.size()); }
};

inline bool name_is_sim(const char* name) { return strstr(name, "Orion Simulated") != nullptr; }

}  // namespace ot

#if defined(CUDART_VERSION)
// ---- CUDA runtime helpers ------------------------------------------------------------------

#define CUDA_OK(expr)                                                                                  \
  do {                                                                                                 \
    cudaError_t e_ = (expr);                                                                           \
    if (e_ != cudaSuccess) {                                                                           \
      printf("CUDA_ERROR %s %d %s:%d %s\n", cudaGetErrorName(e_), (int)e_, __FILE__, __LINE__, #expr); \
      fflush(stdout);                                                                                  \
      exit(2);                                                                                         \
    }                                                                                                  \
  } while (0)

namespace ot {

// Checks that a call failed with exactly `want`, then clears the runtime's last error.
inline bool expect_error(const std::string& name, cudaError_t got, cudaError_t want) {
  cudaGetLastError();
  return check(name, got == want,
               fmt("got %s (%d) want %s (%d)", cudaGetErrorName(got), (int)got, cudaGetErrorName(want), (int)want));
}

// Checks that a call failed (any error), then clears the runtime's last error.
inline bool expect_failure(const std::string& name, cudaError_t got) {
  cudaGetLastError();
  return check(name, got != cudaSuccess, fmt("got %s (%d), want an error", cudaGetErrorName(got), (int)got));
}

// Copies `bytes` from device memory `d` back and checks them byte for byte against `want`: proves
// that a buffer a library only read (an input) crossed Orion intact in both directions.
inline bool check_device_bytes(const std::string& name, const void* d, const void* want, size_t bytes) {
  std::vector<uint8_t> got(bytes);
  cudaError_t e = cudaMemcpy(got.data(), d, bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return check(name, false, fmt("cudaMemcpy DtoH: %s", cudaGetErrorName(e)));
  return check(name, memcmp(got.data(), want, bytes) == 0, diff_details(got.data(), want, bytes));
}

// Allocates device memory and copies `bytes` from host `src` into it (exits on a CUDA error).
inline void* upload(const void* src, size_t bytes) {
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, bytes));
  CUDA_OK(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
  return d;
}

// Device 0's properties; sets is_sim() and prints "DEVICE name=<name> sim=<0|1>".
inline cudaDeviceProp detect_device() {
  init_output();
  cudaDeviceProp p;
  memset(&p, 0, sizeof p);
  CUDA_OK(cudaGetDeviceProperties(&p, 0));
  is_sim() = name_is_sim(p.name);
  printf("DEVICE name=%s sim=%d\n", p.name, is_sim() ? 1 : 0);
  return p;
}

}  // namespace ot
#endif
