// orion_bench: Orion's data-plane speed against bare baselines measured in the same run.
//
//   orion_bench baseline-pingpong N        bare two-process cache-line ping-pong (spin), p50/p99 ns
//   orion_bench baseline-memcpy MiB        one memcpy between out-of-cache buffers, GB/s (physical limit)
//   orion_bench baseline-ring MiB          bare two-process SPSC ring, best of 256 KiB/1 MiB/4 MiB chunks, GB/s
//   orion_bench baseline-ring-pingpong N   the channel's own rings (ivshmem/ring.h) between two processes,
//                                          a header-only record each way, spinning: the floor of a
//                                          synchronous call on this ring layout, p50/p99 ns
//   orion_bench null-call N                cuCtxSynchronize round trips through Orion, p50/p99 ns
//   orion_bench idle-call N [IDLE_MS]      the first cuCtxSynchronize after IDLE_MS (2000) idle, p50/p99 ns
//   orion_bench baseline-idle-wake KIND N [IDLE_MS]   KIND: futex, eventfd, tcp (one wake-up), tcp-rtt (a 32 B
//                                                     round trip: request, wake-up, echo, as a synchronous call)
//                                          bare two-process wake-up after IDLE_MS (2000) idle: the
//                                          server blocks (KIND futex, eventfd or tcp), the client
//                                          signals it and spins for the answer, p50/p99 ns
//   orion_bench launches N FATBIN          asynchronous cuLaunchKernel rate from one thread
//   orion_bench memcpy MiB                 cuMemcpyHtoD / cuMemcpyDtoH GB/s (pageable host memory)
//   orion_bench idle SECONDS               connect, then stay idle (the script measures oriond's CPU)
// The Orion modes use the installed libcuda.so.1 (LD_LIBRARY_PATH) and a running oriond.
#include <cuda.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "orion/common/frame.h"
#include "orion/ivshmem/ring.h"

namespace {

uint64_t Ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}
inline void Relax() { __builtin_ia32_pause(); }

void Percentiles(const char* what, std::vector<uint64_t>& v) {
  std::sort(v.begin(), v.end());
  std::printf("%s p50_ns=%llu p99_ns=%llu n=%zu\n", what, static_cast<unsigned long long>(v[v.size() / 2]),
              static_cast<unsigned long long>(v[v.size() * 99 / 100]), v.size());
}

#define CK(x)                                                                \
  do {                                                                       \
    CUresult r_ = (x);                                                       \
    if (r_ != CUDA_SUCCESS) {                                                \
      const char* n_ = nullptr;                                              \
      cuGetErrorName(r_, &n_);                                               \
      std::fprintf(stderr, "%s failed: %s\n", #x, n_ != nullptr ? n_ : "?"); \
      std::exit(2);                                                          \
    }                                                                        \
  } while (0)

void* Shared(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::exit(3);
  return p;
}

// Bare ping-pong: two processes, two cache lines, both spinning (the same waiting Orion uses while
// a reply is expected: spin first).
void BaselinePingPong(int n) {
  struct Lines {
    alignas(128) std::atomic<uint32_t> ping;
    alignas(128) std::atomic<uint32_t> pong;
  };
  auto* l = new (Shared(sizeof(Lines))) Lines();
  if (fork() == 0) {
    for (uint32_t i = 1; i <= static_cast<uint32_t>(n) + 1000; ++i) {
      while (l->ping.load(std::memory_order_acquire) != i) Relax();
      l->pong.store(i, std::memory_order_release);
    }
    _exit(0);
  }
  std::vector<uint64_t> lat;
  for (uint32_t i = 1; i <= static_cast<uint32_t>(n) + 1000; ++i) {
    const uint64_t t = Ns();
    l->ping.store(i, std::memory_order_release);
    while (l->pong.load(std::memory_order_acquire) != i) Relax();
    if (i > 1000) lat.push_back(Ns() - t);
  }
  wait(nullptr);
  Percentiles("baseline-pingpong", lat);
}

// The ring ping-pong: BaselinePingPong's exchange through the channel's own rings (RingProducer /
// RingConsumer, a 1 MiB request ring and a 1 MiB reply ring, each record a FrameHeader with no
// payload, as cuCtxSynchronize's request and reply are), both sides spinning. Between the bare
// ping-pong and the null call: what the ring layout costs by itself (a record is a stamp and a
// header that walk through the ring, where the ping-pong rewrites one word in one line), apart
// from the client's and the worker's software.
void BaselineRingPingPong(int n) {
  constexpr uint32_t kCap = 1u << 20;
  auto* m = static_cast<uint8_t*>(Shared(2 * (orion::ivshmem::kRingCursorBytes + kCap)));
  uint8_t* requests = m;
  uint8_t* replies = m + orion::ivshmem::kRingCursorBytes + kCap;
  const int total = n + 1000;
  if (fork() == 0) {
    orion::ivshmem::RingConsumer in(requests, kCap, 1);
    orion::ivshmem::RingProducer out(replies, kCap, 1);
    std::vector<uint8_t> scratch(256);
    for (int i = 0; i < total; ++i) {
      orion::ivshmem::FrameView f{};
      bool got = false;
      while (in.Pop(&f, &scratch, &got).ok() && !got) Relax();
      if (!got || !out.Push(f.header, nullptr)) _exit(4);
    }
    _exit(0);
  }
  orion::ivshmem::RingProducer out(requests, kCap, 1);
  orion::ivshmem::RingConsumer in(replies, kCap, 1);
  std::vector<uint8_t> scratch(256);
  std::vector<uint64_t> lat;
  for (int i = 0; i < total; ++i) {
    const uint64_t t = Ns();
    if (!out.Push(orion::MakeFrameHeader(1, static_cast<uint32_t>(i), 0), nullptr)) std::exit(4);
    orion::ivshmem::FrameView f{};
    bool got = false;
    while (in.Pop(&f, &scratch, &got).ok() && !got) Relax();
    if (!got || f.header.seq != static_cast<uint32_t>(i)) std::exit(4);
    if (i >= 1000) lat.push_back(Ns() - t);
  }
  int status = 0;
  wait(&status);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::exit(4);
  Percentiles("baseline-ring-pingpong", lat);
}

// The physical limit of one CPU copy: memcpy of `mib` MiB between two buffers larger than the
// caches, in one process. Six repetitions, the first (page faults, warm-up) dropped, as for every
// figure here.
void BaselineMemcpy(uint64_t mib) {
  const uint64_t total = mib << 20;
  std::vector<uint8_t> src(total, 7), dst(total, 1);
  std::vector<double> rates;
  for (int r = 0; r < 6; ++r) {
    const uint64_t t = Ns();
    std::memcpy(dst.data(), src.data(), total);
    const uint64_t ns = Ns() - t;
    if (r > 0) rates.push_back(static_cast<double>(total) / static_cast<double>(ns));
  }
  if (dst[total - 1] != 7) std::exit(3);
  std::sort(rates.begin(), rates.end());
  std::printf("baseline-memcpy median_GBps=%.2f best_GBps=%.2f bytes=%llu\n", rates[rates.size() / 2], rates.back(),
              static_cast<unsigned long long>(total));
}

// Bare two-process ring: the producer copies chunks of a source buffer into a 32 MiB staging ring,
// the consumer copies each into a destination buffer. Run for 256 KiB, 1 MiB and 4 MiB chunks;
// the best chunk size's median is the baseline (the best two-process pipeline, not Orion's own
// staging choices).
void BaselineRingChunk(uint64_t mib, uint64_t chunk, std::vector<double>* out);
void BaselineRing(uint64_t mib) {
  double best = 0, best_of_best = 0;
  uint64_t best_chunk = 0;
  for (uint64_t chunk : {uint64_t{256} << 10, uint64_t{1} << 20, uint64_t{4} << 20}) {
    std::vector<double> rates;
    BaselineRingChunk(mib, chunk, &rates);
    std::sort(rates.begin(), rates.end());
    if (rates[rates.size() / 2] > best) {
      best = rates[rates.size() / 2];
      best_of_best = rates.back();
      best_chunk = chunk;
    }
  }
  std::printf("baseline-ring median_GBps=%.2f best_GBps=%.2f bytes=%llu chunk=%llu\n", best, best_of_best,
              static_cast<unsigned long long>(mib << 20), static_cast<unsigned long long>(best_chunk));
}

void BaselineRingChunk(uint64_t mib, uint64_t chunk, std::vector<double>* out) {
  const uint64_t ring = 32ull << 20, total = mib << 20;
  struct Cursors {
    alignas(128) std::atomic<uint64_t> head;
    alignas(128) std::atomic<uint64_t> tail;
  };
  auto* c = new (Shared(sizeof(Cursors))) Cursors();
  auto* buf = static_cast<uint8_t*>(Shared(ring));
  auto* done = static_cast<std::atomic<uint64_t>*>(Shared(4096));
  std::vector<uint8_t> src(total, 7);
  const int reps = 6;
  if (fork() == 0) {
    std::vector<uint8_t> dst(total);
    uint64_t tail = 0;
    for (int r = 0; r < reps; ++r) {
      for (uint64_t off = 0; off < total; off += chunk) {
        while (c->head.load(std::memory_order_acquire) == tail) Relax();
        std::memcpy(dst.data() + off, buf + (tail % ring), chunk);
        tail += chunk;
        c->tail.store(tail, std::memory_order_release);
      }
    }
    done->store(1);
    _exit(dst[0] == 7 ? 0 : 1);
  }
  std::vector<double> rates;
  uint64_t head = 0;
  for (int r = 0; r < reps; ++r) {
    const uint64_t t = Ns();
    for (uint64_t off = 0; off < total; off += chunk) {
      while (head - c->tail.load(std::memory_order_acquire) + chunk > ring) Relax();
      std::memcpy(buf + (head % ring), src.data() + off, chunk);
      head += chunk;
      c->head.store(head, std::memory_order_release);
    }
    while (c->tail.load(std::memory_order_acquire) != head) Relax();
    if (r > 0) rates.push_back(static_cast<double>(total) / static_cast<double>(Ns() - t));
  }
  wait(nullptr);
  *out = rates;
}

// Bare TCP over loopback, the baselines for the TCP transport: a ping-pong of one 32-byte message
// each way (a frame header's size) and a single-connection stream in 1 MiB writes.
int TcpPair(int* server_side) {
  const int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a);
  listen(l, 1);
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  const int c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) std::exit(3);
  *server_side = accept(l, nullptr, nullptr);
  close(l);
  const int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(*server_side, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return c;
}

// Reads exactly n bytes; `spin` busy-polls with non-blocking reads (Orion's client and worker spin
// before they nap, so the ping-pong baseline waits the same way).
bool ReadFull(int fd, void* p, size_t n, bool spin = false) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = recv(fd, b, n, spin ? MSG_DONTWAIT : 0);
    if (r < 0 && spin && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      Relax();
      continue;
    }
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void BaselineTcpPingPong(int n) {
  int s = -1;
  const int c = TcpPair(&s);
  if (fork() == 0) {
    close(c);
    uint8_t m[32];
    while (ReadFull(s, m, sizeof m, true)) {
      if (write(s, m, sizeof m) != static_cast<ssize_t>(sizeof m)) break;
    }
    _exit(0);
  }
  close(s);
  std::vector<uint64_t> lat;
  uint8_t m[32] = {};
  for (int i = 0; i < n + 1000; ++i) {
    const uint64_t t = Ns();
    if (write(c, m, sizeof m) != static_cast<ssize_t>(sizeof m) || !ReadFull(c, m, sizeof m, true)) std::exit(4);
    if (i >= 1000) lat.push_back(Ns() - t);
  }
  close(c);
  wait(nullptr);
  Percentiles("baseline-tcp-pingpong", lat);
}

// What a first call after idle costs at best: one kernel wake-up of a blocked server. The server
// blocks on a futex, an eventfd or a TCP socket (as oriond's worker does); after `idle_ms` the
// client publishes a word, signals, and spins for the answer (as Orion's client does).
void BaselineIdleWake(const std::string& kind, int n, long idle_ms) {
  struct Lines {
    alignas(128) std::atomic<uint32_t> ping;
    alignas(128) std::atomic<uint32_t> pong;
  };
  auto* l = new (Shared(sizeof(Lines))) Lines();
  const int efd = eventfd(0, 0);
  int s = -1, c = -1;
  const bool rtt = kind == "tcp-rtt";  // a whole synchronous round trip: 32 B echoed back
  if (kind == "tcp" || rtt) c = TcpPair(&s);
  if (fork() == 0) {
    for (uint32_t i = 1; i <= static_cast<uint32_t>(n); ++i) {
      if (rtt) {
        uint8_t b[32];
        if (!ReadFull(s, b, sizeof b, true) || write(s, b, sizeof b) != static_cast<ssize_t>(sizeof b)) _exit(4);
        continue;
      }
      if (kind == "futex") {
        while (l->ping.load(std::memory_order_acquire) != i) {
          syscall(SYS_futex, reinterpret_cast<uint32_t*>(&l->ping), FUTEX_WAIT, i - 1, nullptr, nullptr, 0);
        }
      } else if (kind == "eventfd") {
        uint64_t v;
        pollfd p{efd, POLLIN, 0};
        while (l->ping.load(std::memory_order_acquire) != i) {
          poll(&p, 1, -1);
          if (read(efd, &v, sizeof v) < 0) _exit(4);
        }
      } else {
        uint8_t b;
        if (!ReadFull(s, &b, 1, true)) _exit(4);
      }
      l->pong.store(i, std::memory_order_release);
    }
    _exit(0);
  }
  std::vector<uint64_t> lat;
  for (uint32_t i = 1; i <= static_cast<uint32_t>(n); ++i) {
    timespec ts{idle_ms / 1000, (idle_ms % 1000) * 1000000L};
    nanosleep(&ts, nullptr);
    const uint64_t t = Ns();
    if (rtt) {
      // As the runtime waits for a reply after waking its worker: poll the socket, yielding the CPU.
      uint8_t b[32] = {};
      if (write(c, b, sizeof b) != static_cast<ssize_t>(sizeof b)) std::exit(4);
      size_t got = 0;
      while (got < sizeof b) {
        const ssize_t r = recv(c, b + got, sizeof b - got, MSG_DONTWAIT);
        if (r > 0) {
          got += static_cast<size_t>(r);
        } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          std::exit(4);
        } else {
          sched_yield();
        }
      }
      lat.push_back(Ns() - t);
      continue;
    }
    l->ping.store(i, std::memory_order_release);
    if (kind == "futex") {
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&l->ping), FUTEX_WAKE, 1, nullptr, nullptr, 0);
    } else if (kind == "eventfd") {
      const uint64_t one = 1;
      if (write(efd, &one, sizeof one) != 8) std::exit(4);
    } else {
      const uint8_t b = 1;
      if (write(c, &b, 1) != 1) std::exit(4);
    }
    while (l->pong.load(std::memory_order_acquire) != i) Relax();
    lat.push_back(Ns() - t);
  }
  wait(nullptr);
  Percentiles(("baseline-idle-wake-" + kind).c_str(), lat);
}

void BaselineTcpStream(uint64_t mib) {
  int s = -1;
  const int c = TcpPair(&s);
  const uint64_t total = mib << 20, chunk = 1 << 20;
  const int reps = 6;
  if (fork() == 0) {
    close(c);
    std::vector<uint8_t> dst(total);
    for (int r = 0; r < reps; ++r) {
      if (!ReadFull(s, dst.data(), total)) _exit(1);
      uint8_t ack = 1;
      if (write(s, &ack, 1) != 1) _exit(1);
    }
    _exit(0);
  }
  close(s);
  std::vector<uint8_t> src(total, 7);
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const uint64_t t = Ns();
    for (uint64_t off = 0; off < total; off += chunk) {
      for (uint64_t done = 0; done < chunk;) {  // one 1 MiB write, finished if the kernel takes less
        const ssize_t w = write(c, src.data() + off + done, chunk - done);
        if (w <= 0) std::exit(4);
        done += static_cast<uint64_t>(w);
      }
    }
    uint8_t ack;
    if (!ReadFull(c, &ack, 1)) std::exit(4);
    if (r > 0) rates.push_back(static_cast<double>(total) / static_cast<double>(Ns() - t));  // first: warm-up
  }
  close(c);
  wait(nullptr);
  std::sort(rates.begin(), rates.end());
  std::printf("baseline-tcp-stream median_GBps=%.2f bytes=%llu chunk=%llu\n", rates[rates.size() / 2],
              static_cast<unsigned long long>(total), static_cast<unsigned long long>(chunk));
}

CUcontext Init() {
  CK(cuInit(0));
  CUdevice d;
  CK(cuDeviceGet(&d, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, d));
  CK(cuCtxSetCurrent(ctx));
  return ctx;
}

void NullCall(int n) {
  Init();
  std::vector<uint64_t> lat;
  for (int i = 0; i < n + 1000; ++i) {
    const uint64_t t = Ns();
    CK(cuCtxSynchronize());
    if (i >= 1000) lat.push_back(Ns() - t);
  }
  Percentiles("orion-null-call", lat);
}

// The first synchronous call after the server has gone idle (it sleeps on the doorbell on shared
// memory, on its socket over TCP): what a sporadic client, e.g. an inference server, pays.
void IdleCall(int n, long idle_ms) {
  Init();
  std::vector<uint64_t> lat;
  for (int i = 0; i < n; ++i) {
    timespec ts{idle_ms / 1000, (idle_ms % 1000) * 1000000L};
    nanosleep(&ts, nullptr);
    const uint64_t t = Ns();
    CK(cuCtxSynchronize());
    lat.push_back(Ns() - t);
  }
  Percentiles("orion-idle-call", lat);
}

void Launches(int n, const char* fatbin_path) {
  Init();
  std::ifstream f(fatbin_path, std::ios::binary);
  std::vector<char> img((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (img.empty()) {
    std::fprintf(stderr, "cannot read %s\n", fatbin_path);
    std::exit(2);
  }
  CUmodule m;
  CK(cuModuleLoadData(&m, img.data()));
  CUfunction fn;
  CK(cuModuleGetFunction(&fn, m, "bench_kernel"));
  CUdeviceptr p;
  CK(cuMemAlloc(&p, 4096));
  int v = 3;
  void* args[] = {&p, &v};
  for (int i = 0; i < 10000; ++i) CK(cuLaunchKernel(fn, 1, 1, 1, 64, 1, 1, 0, nullptr, args, nullptr));
  CK(cuCtxSynchronize());
  std::vector<double> rates;
  for (int rep = 0; rep < 5; ++rep) {
    const uint64_t t = Ns();
    for (int i = 0; i < n; ++i) CK(cuLaunchKernel(fn, 1, 1, 1, 64, 1, 1, 0, nullptr, args, nullptr));
    const uint64_t issued = Ns() - t;
    CK(cuCtxSynchronize());
    const uint64_t drained = Ns() - t;
    rates.push_back(static_cast<double>(n) / (static_cast<double>(drained) / 1e9));
    std::printf("launches rep=%d issue_per_s=%.0f drained_per_s=%.0f\n", rep,
                static_cast<double>(n) / (static_cast<double>(issued) / 1e9), rates.back());
  }
  std::sort(rates.begin(), rates.end());
  std::printf("orion-launches median_per_s=%.0f n=%d\n", rates[rates.size() / 2], n);
}

void Memcpy(uint64_t mib) {
  Init();
  const uint64_t bytes = mib << 20;
  std::vector<uint8_t> h(bytes, 5), back(bytes);
  CUdeviceptr d;
  CK(cuMemAlloc(&d, bytes));
  std::vector<double> h2d, d2h;
  for (int rep = 0; rep < 6; ++rep) {
    uint64_t t = Ns();
    CK(cuMemcpyHtoD(d, h.data(), bytes));
    CK(cuCtxSynchronize());
    if (rep > 0) h2d.push_back(static_cast<double>(bytes) / static_cast<double>(Ns() - t));
    t = Ns();
    CK(cuMemcpyDtoH(back.data(), d, bytes));
    if (rep > 0) d2h.push_back(static_cast<double>(bytes) / static_cast<double>(Ns() - t));
  }
  if (std::memcmp(h.data(), back.data(), bytes) != 0) {
    std::fprintf(stderr, "memcpy round trip corrupted\n");
    std::exit(4);
  }
  std::sort(h2d.begin(), h2d.end());
  std::sort(d2h.begin(), d2h.end());
  std::printf("orion-memcpy htod_median_GBps=%.2f dtoh_median_GBps=%.2f bytes=%llu\n", h2d[h2d.size() / 2],
              d2h[d2h.size() / 2], static_cast<unsigned long long>(bytes));
}

void Idle(int seconds) {
  Init();
  std::printf("idle-client ready pid=%d\n", getpid());
  std::fflush(stdout);
  sleep(static_cast<unsigned>(seconds));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: see the header of bench/orion_bench.cpp\n");
    return 2;
  }
  const std::string mode = argv[1];
  const long n = std::atol(argv[2]);
  if (mode == "baseline-pingpong")
    BaselinePingPong(static_cast<int>(n));
  else if (mode == "baseline-ring-pingpong")
    BaselineRingPingPong(static_cast<int>(n));
  else if (mode == "baseline-ring")
    BaselineRing(static_cast<uint64_t>(n));
  else if (mode == "baseline-memcpy")
    BaselineMemcpy(static_cast<uint64_t>(n));
  else if (mode == "baseline-tcp-pingpong")
    BaselineTcpPingPong(static_cast<int>(n));
  else if (mode == "baseline-tcp-stream")
    BaselineTcpStream(static_cast<uint64_t>(n));
  else if (mode == "null-call")
    NullCall(static_cast<int>(n));
  else if (mode == "idle-call")
    IdleCall(static_cast<int>(n), argc > 3 ? std::atol(argv[3]) : 2000);
  else if (mode == "baseline-idle-wake" && argc > 3) {
    BaselineIdleWake(argv[1 + 1], static_cast<int>(std::atol(argv[3])), argc > 4 ? std::atol(argv[4]) : 2000);
  } else if (mode == "launches" && argc > 3)
    Launches(static_cast<int>(n), argv[3]);
  else if (mode == "memcpy")
    Memcpy(static_cast<uint64_t>(n));
  else if (mode == "idle")
    Idle(static_cast<int>(n));
  else
    return 2;
  return 0;
}
