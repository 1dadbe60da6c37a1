// frame_fuzz — a hostile client's frames into a real session worker (orion::host::RunSession) on
// the sim backend, in process: the request ring, the session's validation and dispatch, the sim
// backend, the PTX executor behind launches.
//
// Each run formats a one-channel region in memory (ivshmem::FormatRegion, as oriond does), starts
// RunSession on a thread as oriond's worker would after an accepted Hello (sim backend: kernels
// executed, 20 ms kernel timeout, one worker thread; one vGPU with a 64 MiB quota; a null logger;
// no module cache), and plays the client on the fuzzer's thread: it pushes the input's frames on
// the request ring (waking the worker through the futex doorbell as the guest runtime does), reads
// the replies, and ends with Goodbye. The session must end on its own (Goodbye, or a protocol
// violation ending the session) without crashing, hanging or touching memory it does not own.
//
// Input: a sequence of records
//   u16 op | u8 flags | u16 len | len payload bytes (fewer at the end of the input)
// where flags bit 0 sets kFlagWantsReply (the client then waits for the reply); flags 0xFF sends the
// frame with a bad magic and 0xFE with a bad protocol version (both end the session as violations).
// Otherwise bits 1-2 are a count (0..3) of patch bytes the payload starts with; for each byte k, the
// u64 at payload offset 8 * (k & 15) (after the patch bytes) gets added the (k >> 4)-th of the values the
// earlier successful replies carried (their first eight u64 words each, the first 16 values kept, in
// order): so an input can use the handles and device pointers the session handed out (device
// addresses are host addresses in the sim backend, different at each run).
// Two pseudo ops are the client's own work, not frames:
//   0xFF00  window write: u32 window offset, then bytes copied into the data window there (after
//           the session has executed every earlier frame);
//   0xFF01  module upload: the payload is a module image (fatbin, cubin or PTX); the client puts it
//           in the window, sends BlobPut with its XXH3-128 hash, then ModuleLoad (with a reply),
//           as the guest runtime's cuModuleLoadData does.
// At most 512 records are played, 8 kernel launches (LaunchKernel, LaunchKernelEx, Batch entries;
// a frame over the budget is skipped) and none after 2 s.
// Seeds (fuzz/corpus/frame_fuzz, made by fuzz/seeds/frame_seeds.py): a context, allocations, copies,
// memsets, a PTX module, function lookups and launches, streams, events, arrays, VMM, a Batch;
// regress-*: inputs of bugs found and fixed. FRAME_FUZZ_TRACE=1 prints each reply (op, status,
// time); FRAME_FUZZ_WAIT_MS changes the hang limit.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <spdlog/logger.h>
#include <spdlog/sinks/null_sink.h>
#include <sys/mman.h>
#include <time.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "orion/common/frame.h"
#include "orion/host/backend.h"
#include "orion/host/session.h"
#include "orion/ivshmem/region.h"
#include "orion/ivshmem/ring.h"

namespace {

using namespace orion;
namespace iv = orion::ivshmem;

constexpr uint64_t kChannelBytes = iv::kMinChannelBytes;  // 4 MiB: 128 KiB request ring, 64 KiB reply ring
constexpr uint64_t kRegionBytes = iv::kHeaderBytes + kChannelBytes;
constexpr uint16_t kPseudoWindowWrite = 0xFF00;
constexpr uint16_t kPseudoModule = 0xFF01;
constexpr size_t kMaxValues = 16;
constexpr size_t kMaxFrames = 512;
// A launch may overrun the kernel timeout by up to 65536 warp instructions of its slowest block
// (exec.cpp looks at the clock that often), printf-heavy ones by a second under ASan: launches are
// budgeted per input, and no frame is sent after kInputBudgetNs, so that a run stays well under
// libFuzzer's -timeout.
constexpr int kMaxLaunches = 8;
constexpr uint64_t kInputBudgetNs = 2'000'000'000ull;

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// A reply that has not come in this long is a hang (FRAME_FUZZ_WAIT_MS, default 5000; below
// scripts/fuzz's -timeout=10 so that the report says what the client was waiting for).
uint64_t WaitLimitNs() {
  static const uint64_t ns = [] {
    const char* e = std::getenv("FRAME_FUZZ_WAIT_MS");
    return (e != nullptr ? std::strtoull(e, nullptr, 10) : 5000) * 1000000ull;
  }();
  return ns;
}

// FRAME_FUZZ_TRACE=1: each reply's op and status on stderr (to check what a seed reaches).
bool Trace() {
  static const bool on = std::getenv("FRAME_FUZZ_TRACE") != nullptr;
  return on;
}

uint8_t* Region() {
  static uint8_t* region = [] {
    void* p = mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    return static_cast<uint8_t*>(p);
  }();
  return region;
}

std::shared_ptr<spdlog::logger> NullLogger() {
  static auto log = [] {
    auto l = std::make_shared<spdlog::logger>("frame_fuzz", std::make_shared<spdlog::sinks::null_sink_mt>());
    l->set_level(spdlog::level::info);  // oriond's default: the info/warn/error lines are formatted
    return l;
  }();
  return log;
}

class Client {
 public:
  Client(uint8_t* region, std::atomic<bool>* server_done)
      : desc_(&iv::Header(region)->channels[0]),
        layout_(iv::ChannelLayout::Compute(kChannelBytes)),
        server_done_(server_done) {
    uint8_t* chan = iv::ChannelBase(region, kChannelBytes, 0);
    const uint32_t gen = desc_->generation;
    req_ = iv::RingProducer(chan + layout_.request_ring_offset, static_cast<uint32_t>(layout_.request_ring_bytes), gen);
    rep_ = iv::RingConsumer(chan + layout_.reply_ring_offset, static_cast<uint32_t>(layout_.reply_ring_bytes), gen);
    window_ = chan + layout_.window_offset;
    desc_->client_rings.store(iv::kRingsFutex);
    desc_->client_lease.store(1);
  }

  bool gone() const { return gone_; }

  // The Welcome (the reply to the Hello the "daemon" accepted for us).
  void AwaitWelcome() {
    (void)AwaitReply(0);
    values_.clear();  // the Welcome's words are not handles
  }

  void Send(uint16_t op, uint8_t flags, const uint8_t* payload, uint32_t len, int special = 0) {
    if (gone_) return;
    FrameHeader h{};
    h.magic = special == 1 ? kFrameMagic ^ 0x100u : kFrameMagic;
    h.version = special == 2 ? kProtocolVersion + 1 : kProtocolVersion;
    h.op = op;
    h.seq = ++seq_;
    h.payload_len = len;
    h.flags = (flags & 1) ? kFlagWantsReply : 0;
    const uint64_t start = NowNs();
    while (!req_.Push(h, payload)) {
      if (!Wait(start)) return;
    }
    Ring();
    if (h.flags & kFlagWantsReply) AwaitReply(h.seq);
  }

  // Waits until the session executed every frame sent so far (its done-seq), or ended.
  void Drain() {
    const uint64_t start = NowNs();
    while (!gone_ && desc_->server_done_seq.load(std::memory_order_acquire) < seq_) {
      if (!Wait(start)) return;
    }
  }

  void WindowWrite(uint64_t offset, const uint8_t* bytes, size_t n) {
    Drain();
    if (offset >= layout_.window_bytes) offset %= layout_.window_bytes;
    if (n > layout_.window_bytes - offset) n = layout_.window_bytes - offset;
    std::memcpy(window_ + offset, bytes, n);
  }

  void UploadModule(const uint8_t* image, uint32_t n) {
    if (n == 0 || n > layout_.staging_bytes) return;
    Drain();
    std::memcpy(window_, image, n);
    const XXH128_hash_t hash = XXH3_128bits(image, n);
    BlobPutReq put{hash.low64, hash.high64, n, 0, 0, n};
    Send(static_cast<uint16_t>(Op::kBlobPut), 0, reinterpret_cast<const uint8_t*>(&put), sizeof put);
    ModuleLoadReq load{hash.low64, hash.high64, n};
    Send(static_cast<uint16_t>(Op::kModuleLoad), 1, reinterpret_cast<const uint8_t*>(&load), sizeof load);
  }

  uint64_t Value(size_t i) const { return values_.empty() ? 0 : values_[i % values_.size()]; }

  void Goodbye() { Send(static_cast<uint16_t>(Op::kGoodbye), 0, nullptr, 0); }

 private:
  // One step of waiting; false (and the client gone) once the session ended or `start` is too long ago.
  bool Wait(uint64_t start) {
    desc_->client_lease.fetch_add(1, std::memory_order_relaxed);
    if (server_done_->load(std::memory_order_acquire)) {
      gone_ = true;
      return false;
    }
    if (NowNs() - start > WaitLimitNs()) {
      std::fprintf(stderr, "frame_fuzz: the session has not answered in %llu ms: a hang\n",
                   static_cast<unsigned long long>(WaitLimitNs() / 1000000ull));
      std::abort();
    }
    if (++spins_ % 64 == 0) {
      timespec ts{0, 20000};
      nanosleep(&ts, nullptr);
    } else {
      std::this_thread::yield();
    }
    return true;
  }

  void Ring() {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with the worker's B0 (session.cpp)
    if (desc_->server_sleeping.load(std::memory_order_relaxed) != 0) {
      desc_->doorbell.fetch_add(1, std::memory_order_release);
      iv::FutexWake(&desc_->doorbell);
    }
  }

  bool AwaitReply(uint32_t seq) {
    const uint64_t start = NowNs();
    for (;;) {
      iv::FrameView f{};
      bool got = false;
      // A reply ring the session corrupted would be a bug of the session: it writes it alone.
      if (!rep_.Pop(&f, &scratch_, &got).ok()) std::abort();
      if (got) {
        if (f.header.seq != seq) continue;  // not ours (cannot happen: every reply is awaited)
        if (Trace()) {
          std::fprintf(stderr, "frame_fuzz: seq %u op %s -> status %d (deferred %d), %u bytes, %.1f ms\n", seq,
                       OpName(f.header.op) != nullptr ? OpName(f.header.op) : "?", f.header.status, f.header.deferred,
                       f.header.payload_len, static_cast<double>(NowNs() - start) / 1e6);
        }
        if (f.header.status == 0) {
          for (uint32_t o = 0; o + 8 <= f.header.payload_len && o < 64 && values_.size() < kMaxValues; o += 8) {
            uint64_t v;
            std::memcpy(&v, f.payload + o, 8);
            values_.push_back(v);
          }
        }
        return true;
      }
      if (!Wait(start)) return false;
    }
  }

  iv::ChannelDesc* desc_;
  iv::ChannelLayout layout_;
  std::atomic<bool>* server_done_;
  iv::RingProducer req_;
  iv::RingConsumer rep_;
  uint8_t* window_ = nullptr;
  std::vector<uint8_t> scratch_;
  std::vector<uint64_t> values_;
  uint32_t seq_ = 0;
  uint64_t spins_ = 0;
  bool gone_ = false;
};

uint16_t U16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// Kernel launches a frame asks for: LaunchKernel(Ex), or the launch entries of a Batch (frame.h:
// BatchEntry, each entry's payload padded to 8 bytes).
int Launches(uint16_t op, const std::vector<uint8_t>& p) {
  const auto is_launch = [](uint16_t o) {
    return o == static_cast<uint16_t>(Op::kLaunchKernel) || o == static_cast<uint16_t>(Op::kLaunchKernelEx);
  };
  if (is_launch(op)) return 1;
  if (op != static_cast<uint16_t>(Op::kBatch)) return 0;
  int n = 0;
  for (size_t at = 0; at + sizeof(BatchEntry) <= p.size();) {
    BatchEntry e;
    std::memcpy(&e, p.data() + at, sizeof e);
    n += is_launch(e.op) ? 1 : 0;
    at += sizeof e + ((uint64_t{e.len} + 7) & ~uint64_t{7});
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t* region = Region();
  // Fresh bytes everywhere (window too), so a run does not depend on the one before.
  std::memset(region, 0, kRegionBytes);
  if (!iv::FormatRegion(region, kRegionBytes, kChannelBytes).ok()) std::abort();
  iv::ChannelDesc& desc = iv::Header(region)->channels[0];
  desc.state.store(iv::kChannelClaimed);

  host::SessionParams sp;
  sp.session_id = 1;
  sp.region = region;
  sp.channel_bytes = kChannelBytes;
  sp.channel = 0;
  sp.generation = desc.generation;
  sp.request_position = 0;  // the Hello was taken by the daemon; here it never was in the ring
  sp.placements = {pool::Placement{0, 0, uint64_t{64} << 20}};
  sp.lease_timeout_ms = 2000;
  sp.log = NullLogger();
  FrameHeader hello_header{};
  hello_header.magic = kFrameMagic;
  hello_header.version = kProtocolVersion;
  hello_header.op = static_cast<uint16_t>(Op::kHello);
  hello_header.payload_len = sizeof(HelloReq);
  hello_header.flags = kFlagWantsReply;
  HelloReq hello{};
  hello.protocol_version = kProtocolVersion;
  hello.transports = kTransportShm;
  hello.vgpu_count = 1;
  hello.gmem_mib = 64;
  std::snprintf(hello.process_name, sizeof hello.process_name, "frame_fuzz");

  host::SimOptions so;
  so.session_id = 1;
  so.execute = true;
  so.kernel_timeout_ms = 20;
  so.workers = 1;

  std::atomic<bool> server_done{false};
  int exit_code = -1;
  std::thread server([&] {
    exit_code = host::RunSession(sp, host::MakeSimBackend(so), hello_header, hello);
    server_done.store(true, std::memory_order_release);
  });

  Client c(region, &server_done);
  c.AwaitWelcome();
  size_t at = 0, frames = 0;
  int launches = 0;
  std::vector<uint8_t> payload;
  const uint64_t begin = NowNs();
  while (at + 5 <= size && !c.gone() && frames < kMaxFrames && NowNs() - begin < kInputBudgetNs) {
    const uint16_t op = U16(data + at);
    const uint8_t flags = data[at + 2];
    size_t len = U16(data + at + 3);
    at += 5;
    if (len > size - at) len = size - at;
    payload.assign(data + at, data + at + len);
    at += len;
    ++frames;
    if (op == kPseudoWindowWrite) {
      if (payload.size() < 4) continue;
      uint32_t off;
      std::memcpy(&off, payload.data(), 4);
      c.WindowWrite(off, payload.data() + 4, payload.size() - 4);
      continue;
    }
    if (op == kPseudoModule) {
      c.UploadModule(payload.data(), static_cast<uint32_t>(payload.size()));
      continue;
    }
    if (flags == 0xFF || flags == 0xFE) {
      c.Send(op, flags, payload.data(), static_cast<uint32_t>(payload.size()), flags == 0xFF ? 1 : 2);
      continue;
    }
    size_t patches = (flags >> 1) & 3u;
    if (patches > payload.size()) patches = payload.size();
    const std::vector<uint8_t> ks(payload.begin(), payload.begin() + static_cast<ptrdiff_t>(patches));
    payload.erase(payload.begin(), payload.begin() + static_cast<ptrdiff_t>(patches));
    for (uint8_t k : ks) {
      const size_t o = 8u * (k & 15u);
      if (o + 8 > payload.size()) continue;
      uint64_t v;
      std::memcpy(&v, payload.data() + o, 8);
      v += c.Value(k >> 4);
      std::memcpy(payload.data() + o, &v, 8);
    }
    launches += Launches(op, payload);
    if (launches > kMaxLaunches) continue;
    c.Send(op, flags, payload.data(), static_cast<uint32_t>(payload.size()));
  }
  c.Goodbye();
  server.join();
  if (Trace()) std::fprintf(stderr, "frame_fuzz: %zu records, session exit code %d\n", frames, exit_code);
  // How a session may end here: Goodbye, or a violation (a frame the session refused).
  if (exit_code != host::kExitGoodbye && exit_code != host::kExitViolation) {
    std::fprintf(stderr, "frame_fuzz: the session ended with exit code %d\n", exit_code);
    std::abort();
  }
  return 0;
}
