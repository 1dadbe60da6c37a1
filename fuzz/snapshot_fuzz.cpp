// snapshot_fuzz — a hostile session snapshot into Session::Restore (live migration, issue #24;
// host/src/session_snapshot.cpp): what a target oriond reads from the oriond that moves a session to
// it. Each run starts an empty session on the sim backend (one vGPU, 64 MiB quota, one executor
// thread, a null logger, no module cache) with an in-memory channel, restores the input into it,
// and, when the restore succeeds, synchronizes it and snapshots it again (every restored table
// walked, every restored byte read back); then the session and its backend are destroyed. Nothing
// may crash, leak, hang or touch memory the session does not own.
//
// Input: a snapshot as Session::Snapshot writes it (records of {kind, flags, meta bytes, contents
// bytes}, the contents as raw, zero or lz4 chunks: snapshot_chunks.h). Seeds
// (fuzz/corpus/snapshot_fuzz/seed-*): snapshots of real sessions, written by this program with
// SNAPSHOT_FUZZ_SEEDS=DIR (a context, allocations with bytes in each chunk form, a PTX module with a
// variable, a function, streams, events, VMM reservations and mappings, limits and attributes;
// one begins with a move's manifest).
// SNAPSHOT_FUZZ_TRACE=1 prints whether each input restored, or why not.
#include <spdlog/logger.h>
#include <spdlog/sinks/null_sink.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "session_impl.h"

namespace {

using namespace orion;
using namespace orion::host;
using namespace orion::host::detail;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A channel whose window and replies live in memory; it never receives frames.
class MemoryChannel final : public SessionChannel {
 public:
  MemoryChannel() : layout_(ivshmem::ChannelLayout::Compute(4 * kMiB)), window_(4 * kMiB) {}
  uint8_t* window() override { return window_.data(); }
  const ivshmem::ChannelLayout& layout() const override { return layout_; }
  Status Pop(ivshmem::FrameView* /*f*/, std::vector<uint8_t>* /*scratch*/, bool* got) override {
    *got = false;
    return Status();
  }
  Status Done(const FrameHeader& /*req*/, const uint8_t* /*payload*/) override { return Status(); }
  Status Reply(const FrameHeader& /*h*/, const void* payload, uint32_t len) override {
    last.assign(static_cast<const uint8_t*>(payload), static_cast<const uint8_t*>(payload) + len);
    return Status();
  }
  Status Idle(uint64_t /*now_ms*/) override { return Status(); }
  void Serving() override {}
  void Closing(int32_t /*reason*/) override {}
  std::vector<uint8_t> last;

 private:
  ivshmem::ChannelLayout layout_;
  std::vector<uint8_t> window_;
};

std::shared_ptr<spdlog::logger> NullLogger() {
  static auto log = std::make_shared<spdlog::logger>("snapshot_fuzz", std::make_shared<spdlog::sinks::null_sink_mt>());
  return log;
}

// A session as the target's worker starts one: Start answered (into the memory channel).
struct Target {
  MemoryChannel* channel = nullptr;
  std::unique_ptr<Session> session;
  uint32_t seq = 0;

  explicit Target(const std::string& cache_dir = "") {
    SessionParams p;
    p.session_id = 1;
    p.placements = {Placement{0, 0, 64 * kMiB, 0}};
    p.log = NullLogger();
    p.cache_dir = cache_dir;
    SimOptions sim;
    sim.workers = 1;
    sim.kernel_timeout_ms = 20;
    auto ch = std::make_unique<MemoryChannel>();
    channel = ch.get();
    session = std::make_unique<Session>(p, MakeSimBackend(sim), std::move(ch));
    int code = 0;
    if (!session->Start(MakeFrameHeader(static_cast<uint16_t>(Op::kHello), 0, 0), &code)) std::abort();
  }
  // One request; its status (a violation is a bug here: every request below is well formed).
  CUresult Call(Op op, const void* payload, uint32_t len, std::vector<uint8_t>* reply = nullptr) {
    std::vector<uint8_t> bytes(std::max<uint32_t>(len, 1));
    if (len != 0) std::memcpy(bytes.data(), payload, len);
    std::vector<uint8_t> rep;
    int32_t status = 0;
    std::string why;
    if (!session->Dispatch(MakeFrameHeader(static_cast<uint16_t>(op), ++seq, len), bytes.data(), &rep, &status, &why)) {
      std::fprintf(stderr, "snapshot_fuzz: %s was a violation: %s\n", OpName(static_cast<uint16_t>(op)), why.c_str());
      std::abort();
    }
    if (reply != nullptr) *reply = std::move(rep);
    return static_cast<CUresult>(status);
  }
  CUresult Call(Op op) { return Call(op, static_cast<const void*>(nullptr), 0u, nullptr); }
  template <typename Req>
  CUresult Call(Op op, const Req& q, std::vector<uint8_t>* reply = nullptr) {
    return Call(op, &q, sizeof q, reply);
  }
  template <typename Rep>
  static Rep As(const std::vector<uint8_t>& b) {
    Rep r{};
    std::memcpy(&r, b.data(), std::min(sizeof r, b.size()));
    return r;
  }
};

constexpr char kPtx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .global .align 4 .u32 calls = 7;\n"
    ".visible .entry bump(.param .u64 p)\n{\n"
    "  .reg .u64 %rd<4>;\n  .reg .u32 %r<4>;\n"
    "  ld.param.u64 %rd1, [p];\n  cvta.to.global.u64 %rd1, %rd1;\n"
    "  mov.u32 %r1, %tid.x;\n  mul.wide.u32 %rd2, %r1, 4;\n  add.u64 %rd1, %rd1, %rd2;\n"
    "  ld.global.u32 %r2, [%rd1];\n  add.u32 %r2, %r2, 1;\n  st.global.u32 [%rd1], %r2;\n"
    "  atom.global.add.u32 %r3, [calls], 1;\n  ret;\n}\n";

// SNAPSHOT_FUZZ_SEEDS=DIR: writes snapshots of a few real sessions there, then exits.
void WriteSeeds(const char* dir) {
  for (int variant = 0; variant < 5; ++variant) {
    const std::string cache = std::string(dir) + "/.cache";  // snapshots take module images from it
    std::filesystem::create_directories(cache);
    Target t(cache);
    std::vector<uint8_t> rep;
    (void)t.Call(Op::kPrimaryCtxRetain, DeviceReq{0, 0});
    (void)t.Call(Op::kMemAlloc, MemAllocReq{variant == 0 ? 4096u : 20000u}, &rep);
    const uint64_t a = Target::As<U64Rep>(rep).value;
    std::memset(t.channel->window(), 0x5a + variant, 4096);  // a chunk lz4 compresses
    if (variant == 3) {                                      // one it does not, and one of zeros
      uint32_t x = 2463534242u;
      for (size_t i = 0; i < 4096; ++i) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        t.channel->window()[i] = static_cast<uint8_t>(x);
      }
      (void)t.Call(Op::kMemAlloc, MemAllocReq{8192});
    }
    (void)t.Call(Op::kMemcpyHtoD, MemcpyReq{a, 0, 4096, 0});
    if (variant >= 1) {
      const std::vector<uint8_t> image(kPtx, kPtx + sizeof kPtx);
      const XXH128_hash_t h = XXH3_128bits(image.data(), image.size());
      std::memcpy(t.channel->window(), image.data(), image.size());
      (void)t.Call(Op::kBlobPut, BlobPutReq{h.low64, h.high64, image.size(), 0, 0, image.size()});
      (void)t.Call(Op::kModuleLoad, ModuleLoadReq{h.low64, h.high64, image.size()}, &rep);
      const uint64_t module = Target::As<ModuleLoadRep>(rep).module;
      for (const char* name : {"bump", "calls"}) {
        std::vector<uint8_t> q(sizeof(ModuleSymbolReq) + std::strlen(name) + 1);
        const ModuleSymbolReq head{module, static_cast<uint32_t>(std::strlen(name) + 1), 0};
        std::memcpy(q.data(), &head, sizeof head);
        std::memcpy(q.data() + sizeof head, name, std::strlen(name) + 1);
        (void)t.Call(name[0] == 'b' ? Op::kModuleGetFunction : Op::kModuleGetGlobal, q.data(),
                     static_cast<uint32_t>(q.size()));
      }
      (void)t.Call(Op::kStreamCreate, StreamCreateReq{CU_STREAM_NON_BLOCKING, -1});
      (void)t.Call(Op::kEventCreate, EventCreateReq{0, 0}, &rep);
      (void)t.Call(Op::kEventRecord, EventRecordReq{Target::As<HandleRep>(rep).handle, 0});
      (void)t.Call(Op::kCtxSetLimit, LimitReq{CU_LIMIT_STACK_SIZE, 0, 2048});
    }
    if (variant == 4) {  // CUDA arrays, a mipmapped array with a level asked for, texture and surface objects
      (void)t.Call(Op::kArrayCreate, ArrayCreateReq{16, 4, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SURFACE_LDST, 0},
                   &rep);
      const uint64_t arr = Target::As<HandleRep>(rep).handle;
      ArrayCopyReq up{};
      up.src_pitch = 64;
      up.dst = arr;
      up.width_bytes = 64;
      up.height = 4;
      up.src_side = kSideWindow;
      up.dst_side = kSideArray;
      (void)t.Call(Op::kMemcpyArray, up);
      (void)t.Call(Op::kMipmappedArrayCreate, MipmapCreateReq{{8, 8, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0, 0}, 2, 0},
                   &rep);
      (void)t.Call(Op::kMipmappedArrayGetLevel, MipmapLevelReq{Target::As<HandleRep>(rep).handle, 1, 0});
      TexObjectReq tex{};
      tex.res = arr;
      tex.res_type = CU_RESOURCE_TYPE_ARRAY;
      (void)t.Call(Op::kTexObjectCreate, tex);
      tex.surface = 1;
      (void)t.Call(Op::kTexObjectCreate, tex);
      tex = TexObjectReq{};
      tex.res = a;
      tex.res_type = CU_RESOURCE_TYPE_LINEAR;
      tex.format = CU_AD_FORMAT_FLOAT;
      tex.channels = 1;
      tex.width = 1024;
      (void)t.Call(Op::kTexObjectCreate, tex);
      (void)t.Call(Op::kArrayDestroy, HandleReq{arr});  // lives on for its objects
    }
    if (variant == 2) {
      (void)t.Call(Op::kMemAddressReserve, MemReserveReq{2 * kVmmGranularity, 0, 0}, &rep);
      const uint64_t res = Target::As<U64Rep>(rep).value;
      (void)t.Call(Op::kMemCreate, MemCreateReq{kVmmGranularity, 0, 0}, &rep);
      const uint64_t phys = Target::As<HandleRep>(rep).handle;
      (void)t.Call(Op::kMemMap, MemMapReq{res, kVmmGranularity, 0, phys});
      (void)t.Call(Op::kMemSetAccess, MemSetAccessReq{res, kVmmGranularity, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE});
      (void)t.Call(Op::kMemRelease, HandleReq{phys});
    }
    VectorWriter w;
    std::string why;
    // Variant 3 as a move sends it: the manifest first (when the move is asked for), then the rest.
    if (variant == 3 && !t.session->SnapshotManifest(w, &why)) {
      std::fprintf(stderr, "snapshot_fuzz: seed %d: %s\n", variant, why.c_str());
      std::exit(1);
    }
    if (!t.session->Snapshot(w, &why)) {
      std::fprintf(stderr, "snapshot_fuzz: seed %d: %s\n", variant, why.c_str());
      std::exit(1);
    }
    // At most scripts/fuzz's -max_len (64 KiB; libFuzzer would cut it there anyway): the VMM seed's
    // 2 MiB mapping ends inside its bytes, and its records before them are what it seeds.
    const std::string path = std::string(dir) + "/seed-" + std::to_string(variant);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(w.bytes().data()),
               static_cast<std::streamsize>(std::min<size_t>(w.bytes().size(), 65536)));
    std::printf("%s: %zu bytes\n", path.c_str(), w.bytes().size());
  }
  std::filesystem::remove_all(std::string(dir) + "/.cache");
  std::exit(0);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (const char* dir = std::getenv("SNAPSHOT_FUZZ_SEEDS")) WriteSeeds(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Target t;
  SpanReader in(std::span<const uint8_t>(data, size));
  std::string why;
  const bool restored = t.session->Restore(in, &why);
  static const bool trace = std::getenv("SNAPSHOT_FUZZ_TRACE") != nullptr;
  if (trace) std::fprintf(stderr, "snapshot_fuzz: %s\n", restored ? "restored" : ("refused: " + why).c_str());
  if (!restored) return 0;
  // Use what was restored: synchronize, then snapshot it again, which walks every restored table
  // and reads every restored byte of device memory back.
  (void)t.Call(Op::kCtxSynchronize);
  VectorWriter again;
  (void)t.session->Snapshot(again, &why);
  return 0;
}
