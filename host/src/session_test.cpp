// Session's dispatch table and handlers, without a daemon, a region or a client: a Session on the
// sim backend (the fake GPU: device memory is host memory) and an in-memory channel, fed frames
// through Dispatch as Run feeds them. What the tests read back (statuses, handles, the quota) is
// what the handlers computed.
#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "session_impl.h"
#include "snapshot_chunks.h"

namespace orion::host::detail {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A channel that keeps its window and the replies in memory; it never receives frames (the tests
// call Dispatch).
class MemoryChannel final : public SessionChannel {
 public:
  explicit MemoryChannel(uint64_t bytes) : layout_(ivshmem::ChannelLayout::Compute(bytes)), window_(bytes) {}
  uint8_t* window() override { return window_.data(); }
  const ivshmem::ChannelLayout& layout() const override { return layout_; }
  Status Pop(ivshmem::FrameView* /*f*/, std::vector<uint8_t>* /*scratch*/, bool* got) override {
    *got = false;
    return Status();
  }
  Status Done(const FrameHeader& /*req*/, const uint8_t* /*payload*/) override { return Status(); }
  Status Reply(const FrameHeader& h, const void* payload, uint32_t len) override {
    replies.push_back(h);
    last_payload.assign(static_cast<const uint8_t*>(payload), static_cast<const uint8_t*>(payload) + len);
    return Status();
  }
  Status Idle(uint64_t /*now_ms*/) override { return Status(); }
  void Serving() override { serving = true; }
  void Closing(int32_t reason) override { closing = reason; }

  std::vector<FrameHeader> replies;
  std::vector<uint8_t> last_payload;
  bool serving = false;
  int32_t closing = 0;

 private:
  ivshmem::ChannelLayout layout_;
  std::vector<uint8_t> window_;
};

// What Dispatch made of one frame.
struct Outcome {
  bool served = false;  // false: a protocol violation (why)
  CUresult status = CUDA_SUCCESS;
  std::vector<uint8_t> reply;
  std::string why;

  template <typename T>
  T As() const {
    T v{};
    EXPECT_GE(reply.size(), sizeof v);
    std::memcpy(&v, reply.data(), std::min(sizeof v, reply.size()));
    return v;
  }
};

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(64 * kMiB); }

  void Open(uint64_t quota) {
    params_.session_id = 7;
    params_.placements = {Placement{0, 0, quota, 0}};
    params_.log = std::make_shared<spdlog::logger>("session_test", std::make_shared<spdlog::sinks::null_sink_mt>());
    auto channel = std::make_unique<MemoryChannel>(4 * kMiB);
    channel_ = channel.get();
    SimOptions sim;
    sim.workers = 1;
    session_ = std::make_unique<Session>(params_, MakeSimBackend(sim), std::move(channel));
    const FrameHeader hello = MakeFrameHeader(static_cast<uint16_t>(Op::kHello), 0, 0);
    int code = -1;
    ASSERT_TRUE(session_->Start(hello, &code)) << code;
    ASSERT_TRUE(channel_->serving);
    ASSERT_EQ(channel_->replies.size(), 1u);  // the Welcome
    EXPECT_EQ(channel_->replies[0].status, CUDA_SUCCESS);
  }

  Outcome Raw(uint16_t op, const void* payload, uint32_t len) {
    const FrameHeader h = MakeFrameHeader(op, ++seq_, len);
    // The payload as a channel hands it over: its own bytes, at least one so data() is valid.
    std::vector<uint8_t> bytes(std::max<uint32_t>(len, 1));
    if (len != 0) std::memcpy(bytes.data(), payload, len);
    Outcome o;
    int32_t status = 0;
    o.served = session_->Dispatch(h, bytes.data(), &o.reply, &status, &o.why);
    o.status = static_cast<CUresult>(status);
    return o;
  }
  template <typename Req>
  Outcome Send(Op op, const Req& q) {
    return Raw(static_cast<uint16_t>(op), &q, sizeof q);
  }
  Outcome Send(Op op) { return Raw(static_cast<uint16_t>(op), nullptr, 0); }

  // A served request's status.
  template <typename... A>
  CUresult Status(Op op, const A&... q) {
    const Outcome o = Send(op, q...);
    EXPECT_TRUE(o.served) << OpName(static_cast<uint16_t>(op)) << ": " << o.why;
    return o.status;
  }

  uint64_t Context() {
    const Outcome o = Send(Op::kPrimaryCtxRetain, DeviceReq{0, 0});
    EXPECT_TRUE(o.served && o.status == CUDA_SUCCESS) << o.why << " " << o.status;
    return o.As<HandleRep>().handle;
  }
  uint64_t Alloc(uint64_t bytes, CUresult want = CUDA_SUCCESS) {
    const Outcome o = Send(Op::kMemAlloc, MemAllocReq{bytes});
    EXPECT_TRUE(o.served) << o.why;
    EXPECT_EQ(o.status, want) << bytes << " bytes";
    return o.status == CUDA_SUCCESS ? o.As<U64Rep>().value : 0;
  }

  // Loads `ptx` (a module image: uploaded through the window as the client does, then ModuleLoad)
  // and returns the handle of its function `name`.
  uint64_t Function(const std::string& ptx, const std::string& name) {
    const std::vector<uint8_t> image(ptx.c_str(), ptx.c_str() + ptx.size() + 1);
    const XXH128_hash_t h = XXH3_128bits(image.data(), image.size());
    std::memcpy(channel_->window(), image.data(), image.size());
    EXPECT_EQ(Status(Op::kBlobPut, BlobPutReq{h.low64, h.high64, image.size(), 0, 0, image.size()}), CUDA_SUCCESS);
    const Outcome m = Send(Op::kModuleLoad, ModuleLoadReq{h.low64, h.high64, image.size()});
    EXPECT_TRUE(m.served && m.status == CUDA_SUCCESS) << m.why << " " << m.status;
    module_ = m.As<ModuleLoadRep>().module;
    std::vector<uint8_t> get(sizeof(ModuleSymbolReq) + name.size() + 1);
    const ModuleSymbolReq q{m.As<ModuleLoadRep>().module, static_cast<uint32_t>(name.size() + 1), 0};
    std::memcpy(get.data(), &q, sizeof q);
    std::memcpy(get.data() + sizeof q, name.c_str(), name.size() + 1);
    const Outcome f = Raw(static_cast<uint16_t>(Op::kModuleGetFunction), get.data(), static_cast<uint32_t>(get.size()));
    EXPECT_TRUE(f.served && f.status == CUDA_SUCCESS) << f.why << " " << f.status;
    return f.As<FunctionRep>().function;
  }

  // Starts another session (the fixture's requests go to it from now on) and returns the one it
  // served until now, which lives on.
  std::unique_ptr<Session> Replace(uint64_t quota) {
    auto old = std::move(session_);
    Open(quota);
    return old;
  }
  // A symbol request (ModuleGetFunction, ModuleGetGlobal) of `name` in `module`.
  Outcome Symbol(Op op, uint64_t module, const std::string& name) {
    std::vector<uint8_t> get(sizeof(ModuleSymbolReq) + name.size() + 1);
    const ModuleSymbolReq q{module, static_cast<uint32_t>(name.size() + 1), 0};
    std::memcpy(get.data(), &q, sizeof q);
    std::memcpy(get.data() + sizeof q, name.c_str(), name.size() + 1);
    return Raw(static_cast<uint16_t>(op), get.data(), static_cast<uint32_t>(get.size()));
  }
  // `bytes` of device memory at `dptr`, read through the window.
  std::vector<uint8_t> Read(uint64_t dptr, uint64_t bytes) {
    EXPECT_EQ(Status(Op::kMemcpyDtoH, MemcpyReq{0, dptr, bytes, 0}), CUDA_SUCCESS);
    return std::vector<uint8_t>(channel_->window(), channel_->window() + bytes);
  }
  void Write(uint64_t dptr, const std::vector<uint8_t>& bytes) {
    std::memcpy(channel_->window(), bytes.data(), bytes.size());
    EXPECT_EQ(Status(Op::kMemcpyHtoD, MemcpyReq{dptr, 0, bytes.size(), 0}), CUDA_SUCCESS);
  }

  SessionParams params_;
  MemoryChannel* channel_ = nullptr;
  std::unique_ptr<Session> session_;
  uint32_t seq_ = 0;
  uint64_t module_ = 0;  // the module Function loaded last
};

// Every row of ops.def reaches a handler of its own. A request of the row's shape, all zeros, is
// served (some status) or refused as a violation with its reason; none is "unknown".
TEST_F(SessionTest, EveryOpOfOpsDefHasAHandler) {
  Context();
  int rows = 0;
#define ORION_OP(Name, number, reply_kind, Req, shape_kind)                                                        \
  {                                                                                                                \
    ++rows;                                                                                                        \
    const uint32_t len =                                                                                           \
        OpShape::shape_kind == OpShape::kFixed || OpShape::shape_kind == OpShape::kHead ? RequestBytes<Req>() : 0; \
    const std::vector<uint8_t> zeros(len);                                                                         \
    const Outcome o = Raw(static_cast<uint16_t>(Op::k##Name), zeros.data(), len);                                  \
    EXPECT_EQ(o.why.find("unknown op"), std::string::npos) << #Name;                                               \
    EXPECT_TRUE(o.served || !o.why.empty()) << #Name << ": a violation always says why";                           \
  }
#include "orion/common/ops.def"
  int known = 0;  // the ops the wire knows (OpKnown, from the same file): each got its case above
  for (uint32_t op = 0; op <= 0xffff; ++op) known += OpKnown(static_cast<uint16_t>(op)) ? 1 : 0;
  EXPECT_EQ(rows, known);
}

// The ops that are never requests inside the frame stream are violations, each with its reason.
TEST_F(SessionTest, HelloAndServerMessagesInsideTheStreamAreViolations) {
  const Outcome hello = Send(Op::kHello, HelloReq{});
  EXPECT_FALSE(hello.served);
  EXPECT_EQ(hello.why, "second Hello");
  const Outcome rdma = Send(Op::kRdmaConnect, RdmaConnectInfo{});
  EXPECT_FALSE(rdma.served);
  EXPECT_EQ(rdma.why, "RdmaConnect inside the frame stream");
  // oriond's own messages to the client: the checkpoint refuses them before any handler.
  const Outcome keepalive = Send(Op::kKeepalive);
  EXPECT_FALSE(keepalive.served);
  EXPECT_EQ(keepalive.why, "a payload of 0 bytes, not a request the session dispatches");
  const Outcome unknown = Raw(999, nullptr, 0);
  EXPECT_FALSE(unknown.served);
  EXPECT_EQ(unknown.why, "unknown op 999");
}

// The checkpoint: a payload whose length is not the op's (ops.def) runs no handler.
TEST_F(SessionTest, APayloadOfTheWrongLengthIsAViolation) {
  Context();
  const MemAllocReq q{kMiB};
  const Outcome short_frame = Raw(static_cast<uint16_t>(Op::kMemAlloc), &q, sizeof q - 1);
  EXPECT_FALSE(short_frame.served);
  EXPECT_FALSE(short_frame.why.empty());
  const Outcome long_frame = Raw(static_cast<uint16_t>(Op::kNop), &q, sizeof q);
  EXPECT_FALSE(long_frame.served);
  // Nothing was allocated by the refused frame: the whole quota is still there.
  const Outcome info = Send(Op::kMemGetInfo);
  ASSERT_TRUE(info.served);
  EXPECT_EQ(info.As<MemGetInfoRep>().total, 64 * kMiB);
  const uint64_t before = info.As<MemGetInfoRep>().free;
  Alloc(kMiB);
  EXPECT_EQ(Send(Op::kMemGetInfo).As<MemGetInfoRep>().free, before - kMiB);
}

// A handle is looked up in the session's own table and must be of the kind the op takes.
TEST_F(SessionTest, HandlesAreCheckedForTheirKind) {
  const uint64_t ctx = Context();
  const Outcome created = Send(Op::kStreamCreate, StreamCreateReq{0, 0});
  ASSERT_TRUE(created.served);
  ASSERT_EQ(created.status, CUDA_SUCCESS);
  const uint64_t stream = created.As<HandleRep>().handle;
  ASSERT_NE(stream, ctx);
  EXPECT_EQ(Status(Op::kStreamDestroy, HandleReq{ctx}), CUDA_ERROR_INVALID_HANDLE);   // a context is no stream
  EXPECT_EQ(Status(Op::kCtxDestroy, HandleReq{stream}), CUDA_ERROR_INVALID_CONTEXT);  // nor a stream a context
  EXPECT_EQ(Status(Op::kEventRecord, EventRecordReq{stream, stream}), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(Status(Op::kStreamSynchronize, HandleReq{stream + 1}), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(Status(Op::kStreamDestroy, HandleReq{stream}), CUDA_SUCCESS);
  EXPECT_EQ(Status(Op::kStreamDestroy, HandleReq{stream}), CUDA_ERROR_INVALID_HANDLE);  // gone
}

// Allocations are charged to the vGPU's quota (at least kAllocGranularity each) and given back
// when freed; a copy must lie inside the session's own allocations.
TEST_F(SessionTest, QuotaAndDeviceRangesAreTheSessions) {
  EXPECT_EQ(Status(Op::kMemAlloc, MemAllocReq{kMiB}), CUDA_ERROR_INVALID_CONTEXT);  // no context yet
  Context();
  const uint64_t free0 = Send(Op::kMemGetInfo).As<MemGetInfoRep>().free;
  ASSERT_GT(free0, 40 * kMiB);
  const uint64_t big = Alloc(40 * kMiB);
  ASSERT_NE(big, 0u);
  Alloc(free0 - 40 * kMiB + 1, CUDA_ERROR_OUT_OF_MEMORY);  // one byte over what is left
  const uint64_t tiny = Alloc(1);                          // charged a whole granule
  EXPECT_EQ(Send(Op::kMemGetInfo).As<MemGetInfoRep>().free, free0 - 40 * kMiB - kAllocGranularity);
  EXPECT_EQ(Status(Op::kMemcpyDtoD, MemcpyReq{big, big + kMiB, kMiB, 0}), CUDA_SUCCESS);
  EXPECT_EQ(Status(Op::kMemcpyDtoD, MemcpyReq{big, big + 40 * kMiB - 4, 8, 0}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Status(Op::kMemcpyDtoD, MemcpyReq{tiny + 4096, big, 1, 0}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Status(Op::kMemFree, MemFreeReq{big + 1}), CUDA_ERROR_INVALID_VALUE);  // not an allocation's start
  EXPECT_EQ(Status(Op::kMemFree, MemFreeReq{big}), CUDA_SUCCESS);
  EXPECT_EQ(Status(Op::kMemFree, MemFreeReq{tiny}), CUDA_SUCCESS);
  EXPECT_EQ(Send(Op::kMemGetInfo).As<MemGetInfoRep>().free, free0);
  EXPECT_EQ(Status(Op::kMemFree, MemFreeReq{big}), CUDA_ERROR_INVALID_VALUE);  // twice
}

// A Batch runs each entry through the same checkpoint and dispatch; an entry that may not be
// batched, or is cut short, ends the session.
TEST_F(SessionTest, BatchEntriesAreCheckedLikeFrames) {
  Context();
  const uint64_t a = Alloc(kMiB);
  auto batch = [&](uint16_t op, const void* req, uint32_t len, uint32_t claimed) {
    std::vector<uint8_t> b(sizeof(BatchEntry) + ((len + 7) & ~7u));
    const BatchEntry e{op, 0, claimed};
    std::memcpy(b.data(), &e, sizeof e);
    std::memcpy(b.data() + sizeof e, req, len);
    return Raw(static_cast<uint16_t>(Op::kBatch), b.data(), static_cast<uint32_t>(b.size()));
  };
  const MemsetReq set{a, kMiB, 1, 0, 0, 0x5a, 1};
  const Outcome ok = batch(static_cast<uint16_t>(Op::kMemset), &set, sizeof set, sizeof set);
  EXPECT_TRUE(ok.served) << ok.why;
  EXPECT_EQ(ok.status, CUDA_SUCCESS);
  const MemAllocReq alloc{kMiB};
  const Outcome not_batchable = batch(static_cast<uint16_t>(Op::kMemAlloc), &alloc, sizeof alloc, sizeof alloc);
  EXPECT_FALSE(not_batchable.served);
  EXPECT_EQ(not_batchable.why, "bad Batch entry");
  const Outcome too_long = batch(static_cast<uint16_t>(Op::kMemset), &set, sizeof set, sizeof set + 64);
  EXPECT_FALSE(too_long.served);
  EXPECT_EQ(too_long.why, "bad Batch entry");
  // A failing entry is served, its error deferred as the batch's status.
  const MemsetReq outside{a + 2 * kMiB, 16, 1, 0, 0, 0, 1};
  const Outcome bad_range = batch(static_cast<uint16_t>(Op::kMemset), &outside, sizeof outside, sizeof outside);
  EXPECT_TRUE(bad_range.served) << bad_range.why;
  EXPECT_EQ(bad_range.status, CUDA_ERROR_INVALID_VALUE);
}

// A launch's parameters must be exactly the bytes after its head.
TEST_F(SessionTest, ALaunchWhoseParametersDoNotFillItsFrameIsAViolation) {
  Context();
  std::vector<uint8_t> frame(sizeof(LaunchReq) + 8);
  LaunchReq q{};
  q.param_bytes = 16;  // claims 16, carries 8
  std::memcpy(frame.data(), &q, sizeof q);
  const Outcome o = Raw(static_cast<uint16_t>(Op::kLaunchKernel), frame.data(), static_cast<uint32_t>(frame.size()));
  EXPECT_FALSE(o.served);
  EXPECT_EQ(o.why, "bad LaunchKernel");
  q.param_bytes = 8;  // consistent, but no such function
  std::memcpy(frame.data(), &q, sizeof q);
  EXPECT_EQ(Status(Op::kNop), CUDA_SUCCESS);
  const Outcome f = Raw(static_cast<uint16_t>(Op::kLaunchKernel), frame.data(), static_cast<uint32_t>(frame.size()));
  EXPECT_TRUE(f.served) << f.why;
  EXPECT_EQ(f.status, CUDA_ERROR_INVALID_HANDLE);
}

// Launch limits come from the device's attribute table (what the Welcome told the client) and are
// checked by the session for both backends, whatever a client checked or skipped; the answers are
// NVIDIA's driver's (kCudaErrorInvalidConfiguration for a grid or block past them, as the client
// answers at the call).
TEST_F(SessionTest, LaunchesPastTheDevicesLimitsAreRefusedByTheSession) {
  Context();
  const uint64_t fn =
      Function(".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry noop()\n{\n  ret;\n}\n", "noop");
  ASSERT_NE(fn, 0u);
  const auto launch = [&](std::array<uint32_t, 3> grid, std::array<uint32_t, 3> block, uint32_t smem) {
    LaunchReq q{};
    q.function = fn;
    std::memcpy(q.grid, grid.data(), sizeof q.grid);
    std::memcpy(q.block, block.data(), sizeof q.block);
    q.shared_mem_bytes = smem;
    return Status(Op::kLaunchKernel, q);
  };
  const auto bad_config = static_cast<CUresult>(kCudaErrorInvalidConfiguration);
  EXPECT_EQ(launch({1, 1, 1}, {32, 1, 1}, 0), CUDA_SUCCESS);
  EXPECT_EQ(launch({1, 1, 1}, {1024, 1, 1}, 0), CUDA_SUCCESS);
  EXPECT_EQ(launch({1, 1, 1}, {2048, 1, 1}, 0), bad_config);   // MAX_BLOCK_DIM_X 1024
  EXPECT_EQ(launch({1, 1, 1}, {32, 32, 2}, 0), bad_config);    // 2048 threads: MAX_THREADS_PER_BLOCK 1024
  EXPECT_EQ(launch({1, 1, 1}, {1, 1, 65}, 0), bad_config);     // MAX_BLOCK_DIM_Z 64
  EXPECT_EQ(launch({1, 65536, 1}, {1, 1, 1}, 0), bad_config);  // MAX_GRID_DIM_Y 65535
  EXPECT_EQ(launch({0, 1, 1}, {1, 1, 1}, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch({1, 1, 1}, {1, 0, 1}, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch({1, 1, 1}, {1, 1, 1}, 232448), CUDA_SUCCESS);  // SHARED_MEMORY_PER_BLOCK_OPTIN
  EXPECT_EQ(launch({1, 1, 1}, {1, 1, 1}, 232449), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Status(Op::kCtxSynchronize), CUDA_SUCCESS);  // nothing refused reached the executor
}

// ModuleGetFunction and ModuleGetGlobal each name themselves when their payload carries no name,
// and look the module up in the session's own table.
TEST_F(SessionTest, SymbolLookupsCheckTheirNameAndModule) {
  Context();
  for (const Op op : {Op::kModuleGetFunction, Op::kModuleGetGlobal}) {
    const ModuleSymbolReq q{0x10, 8, 0};  // claims an 8-byte name, carries none
    const Outcome o = Send(op, q);
    EXPECT_FALSE(o.served);
    EXPECT_EQ(o.why, std::string("bad ") + OpName(static_cast<uint16_t>(op)));
  }
  std::vector<uint8_t> frame(sizeof(ModuleSymbolReq) + 5);
  const ModuleSymbolReq q{0x10, 5, 0};  // no such module
  std::memcpy(frame.data(), &q, sizeof q);
  std::memcpy(frame.data() + sizeof q, "noop", 5);
  for (const Op op : {Op::kModuleGetFunction, Op::kModuleGetGlobal}) {
    const Outcome o = Raw(static_cast<uint16_t>(op), frame.data(), static_cast<uint32_t>(frame.size()));
    EXPECT_TRUE(o.served) << o.why;
    EXPECT_EQ(o.status, CUDA_ERROR_INVALID_HANDLE);
  }
}

// ---- Live migration, step 1 (issue #24): a session's snapshot restored into another session ----

// A kernel that adds 1 to p[tid] and counts its threads in a module variable (initially 7).
constexpr char kBumpPtx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .global .align 4 .u32 calls = 7;\n"
    ".visible .entry bump(.param .u64 p)\n{\n"
    "  .reg .u64 %rd<4>;\n  .reg .u32 %r<4>;\n"
    "  ld.param.u64 %rd1, [p];\n  cvta.to.global.u64 %rd1, %rd1;\n"
    "  mov.u32 %r1, %tid.x;\n  mul.wide.u32 %rd2, %r1, 4;\n  add.u64 %rd1, %rd1, %rd2;\n"
    "  ld.global.u32 %r2, [%rd1];\n  add.u32 %r2, %r2, 1;\n  st.global.u32 [%rd1], %r2;\n"
    "  atom.global.add.u32 %r3, [calls], 1;\n  ret;\n}\n";

class MigrationTest : public SessionTest {
 protected:
  void SetUp() override {
    cache_ = std::filesystem::temp_directory_path() / ("orion-snapshot-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(cache_);
    params_.cache_dir = cache_.string();
    Open(64 * kMiB);
  }
  void TearDown() override { std::filesystem::remove_all(cache_); }

  CUresult Bump(uint64_t fn, uint64_t stream, uint64_t p, uint32_t threads) {
    std::vector<uint8_t> frame(sizeof(LaunchReq) + sizeof p);
    LaunchReq q{};
    q.function = fn;
    q.stream = stream;
    q.grid[0] = q.grid[1] = q.grid[2] = 1;
    q.block[0] = threads;
    q.block[1] = q.block[2] = 1;
    q.param_bytes = sizeof p;
    std::memcpy(frame.data(), &q, sizeof q);
    std::memcpy(frame.data() + sizeof q, &p, sizeof p);
    const Outcome o = Raw(static_cast<uint16_t>(Op::kLaunchKernel), frame.data(), static_cast<uint32_t>(frame.size()));
    EXPECT_TRUE(o.served) << o.why;
    return o.status;
  }
  static uint32_t Word(const std::vector<uint8_t>& b, size_t i) {
    uint32_t v = 0;
    std::memcpy(&v, b.data() + 4 * i, 4);
    return v;
  }
  static std::vector<uint8_t> Pattern(size_t bytes, uint8_t seed) {
    std::vector<uint8_t> v(bytes);
    for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 7 + seed + (i >> 12));
    return v;
  }

  std::filesystem::path cache_;
};

// Everything the program holds works after the restore, under the same handles and at the same
// device addresses, with the same bytes and the same quota charge; the handles it gets next
// collide with none of them.
TEST_F(MigrationTest, ARestoredSessionServesTheSameHandlesAddressesAndBytes) {
  const uint64_t ctx = Context();
  const uint64_t fn = Function(kBumpPtx, "bump");
  ASSERT_NE(fn, 0u);
  const uint64_t a = Alloc(3 * kMiB + 100);
  const std::vector<uint8_t> a_bytes = Pattern(3 * kMiB + 100, 1);
  Write(a, a_bytes);
  const Outcome created = Send(Op::kStreamCreate, StreamCreateReq{CU_STREAM_NON_BLOCKING, -1});
  ASSERT_EQ(created.status, CUDA_SUCCESS);
  const uint64_t stream = created.As<HandleRep>().handle;
  ASSERT_EQ(Bump(fn, stream, a, 256), CUDA_SUCCESS);
  const Outcome ev = Send(Op::kEventCreate, EventCreateReq{CU_EVENT_DEFAULT, 0});
  const uint64_t before = ev.As<HandleRep>().handle;
  ASSERT_EQ(Status(Op::kEventRecord, EventRecordReq{before, stream}), CUDA_SUCCESS);
  // The module variable, as cudaMemcpyFromSymbol finds it.
  const uint64_t module = module_;
  const Outcome g = Symbol(Op::kModuleGetGlobal, module, "calls");
  ASSERT_EQ(g.status, CUDA_SUCCESS);
  const GlobalRep calls = g.As<GlobalRep>();
  ASSERT_EQ(calls.bytes, 4u);
  // VMM: a reservation with a physical allocation mapped at its start, released while mapped.
  const uint64_t res = Send(Op::kMemAddressReserve, MemReserveReq{2 * kVmmGranularity, 0, 0}).As<U64Rep>().value;
  const uint64_t phys = Send(Op::kMemCreate, MemCreateReq{kVmmGranularity, 0, 0}).As<HandleRep>().handle;
  ASSERT_EQ(Status(Op::kMemMap, MemMapReq{res, kVmmGranularity, 0, phys}), CUDA_SUCCESS);
  ASSERT_EQ(Status(Op::kMemSetAccess, MemSetAccessReq{res, kVmmGranularity, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}),
            CUDA_SUCCESS);
  const std::vector<uint8_t> v_bytes = Pattern(kVmmGranularity, 9);
  Write(res, v_bytes);
  ASSERT_EQ(Status(Op::kMemRelease, HandleReq{phys}), CUDA_SUCCESS);
  ASSERT_EQ(Status(Op::kCtxSetLimit, LimitReq{CU_LIMIT_STACK_SIZE, 0, 4096}), CUDA_SUCCESS);
  const DeviceMemoryRep charged = Send(Op::kDeviceMemoryInfo, DeviceReq{0, 0}).As<DeviceMemoryRep>();

  VectorWriter snap;
  std::string why;
  ASSERT_TRUE(session_->Snapshot(snap, &why)) << why;
  EXPECT_GE(snap.chunks.memory, 3 * kMiB + 100 + kVmmGranularity + 4);  // both allocations' bytes, and the variable's

  const std::unique_ptr<Session> source = Replace(64 * kMiB);
  SpanReader in(snap.bytes());
  ASSERT_TRUE(session_->Restore(in, &why)) << why;

  // The same charge on the target's quota.
  const DeviceMemoryRep now = Send(Op::kDeviceMemoryInfo, DeviceReq{0, 0}).As<DeviceMemoryRep>();
  EXPECT_EQ(now.allocated, charged.allocated);
  // The same bytes at the same addresses, then the same function on the same stream.
  EXPECT_EQ(Read(a, 3 * kMiB + 100)[4 * 256 + 5], a_bytes[4 * 256 + 5]);
  ASSERT_EQ(Bump(fn, stream, a, 256), CUDA_SUCCESS);
  ASSERT_EQ(Status(Op::kStreamSynchronize, HandleReq{stream}), CUDA_SUCCESS);
  const std::vector<uint8_t> after = Read(a, 3 * kMiB + 100);
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(Word(after, i), Word(a_bytes, i) + 2) << i;
  EXPECT_EQ(Word(after, 256), Word(a_bytes, 256));
  EXPECT_EQ(after.back(), a_bytes.back());
  EXPECT_EQ(Read(res, kVmmGranularity), v_bytes);
  // The module variable: at its address, counting on from where it was (7 + 256 + 256).
  EXPECT_EQ(Word(Read(calls.dptr, 4), 0), 7u + 512u);
  const GlobalRep again = Symbol(Op::kModuleGetGlobal, module, "calls").As<GlobalRep>();
  EXPECT_EQ(again.dptr, calls.dptr);
  EXPECT_EQ(Status(Op::kEventQuery, HandleReq{before}), CUDA_SUCCESS);
  const Outcome lim = Send(Op::kCtxGetLimit, LimitReq{CU_LIMIT_STACK_SIZE, 0, 0});
  EXPECT_EQ(lim.As<U64Rep>().value, 4096u);
  // New handles and addresses collide with none of the restored ones.
  const uint64_t b = Alloc(kMiB);
  EXPECT_TRUE(b >= a + 3 * kMiB + 100 || b + kMiB <= a) << std::hex << a << " " << b;
  const uint64_t s2 = Send(Op::kStreamCreate, StreamCreateReq{0, 0}).As<HandleRep>().handle;
  EXPECT_GT(s2, std::max({ctx, fn, stream, before}));
  // The objects go as they would have at the source.
  EXPECT_EQ(Status(Op::kMemUnmap, MemRangeReq{res, kVmmGranularity}), CUDA_SUCCESS);
  EXPECT_EQ(Status(Op::kMemAddressFree, MemRangeReq{res, 2 * kVmmGranularity}), CUDA_SUCCESS);
  EXPECT_EQ(Status(Op::kMemFree, MemFreeReq{a}), CUDA_SUCCESS);
  EXPECT_EQ(Status(Op::kStreamDestroy, HandleReq{stream}), CUDA_SUCCESS);
}

// What cannot move is refused before anything changes, with the reason; the session serves on.
TEST_F(MigrationTest, WhatCannotMoveIsRefusedWithItsReason) {
  Context();
  const uint64_t a = Alloc(kMiB);
  // Pinned memory (the window past its staging part) mapped for the device.
  ASSERT_EQ(Status(Op::kHostGetDevicePointer, WindowRangeReq{channel_->layout().staging_bytes, 4096, 0}), CUDA_SUCCESS);
  VectorWriter snap;
  std::string why;
  EXPECT_FALSE(session_->Snapshot(snap, &why));
  EXPECT_EQ(why, "it maps host memory for the device, which stays with this host");
  EXPECT_TRUE(snap.bytes().empty());
  EXPECT_EQ(Status(Op::kMemFree, MemFreeReq{a}), CUDA_SUCCESS);  // the source serves on
}

// CUDA arrays, mipmapped arrays, texture and surface objects move: the same handles and object
// values, the same texels, the same quota charge. An array the program destroyed lives on at the
// target for the texture object that uses it, and goes with that object, as at the source.
TEST_F(MigrationTest, ArraysAndTextureObjectsMoveWithTheirTexels) {
  Context();
  auto make = [&](Op op, const auto& q) {
    const Outcome o = Send(op, q);
    EXPECT_EQ(o.status, CUDA_SUCCESS) << OpName(static_cast<uint16_t>(op));
    return o.status == CUDA_SUCCESS ? o.As<HandleRep>().handle : 0;
  };
  auto copy = [&](uint64_t array, uint64_t row_bytes, uint64_t rows, uint64_t z, bool to_array) {
    ArrayCopyReq q{};
    (to_array ? q.dst : q.src) = array;
    (to_array ? q.src_pitch : q.dst_pitch) = row_bytes;
    (to_array ? q.dst_z : q.src_z) = z;
    q.width_bytes = row_bytes;
    q.height = rows;
    q.src_side = to_array ? kSideWindow : kSideArray;
    q.dst_side = to_array ? kSideArray : kSideWindow;
    return Status(Op::kMemcpyArray, q);
  };
  struct Texels {
    uint64_t array, row_bytes, rows, slices;
    std::vector<std::vector<uint8_t>> bytes;  // per slice
  };
  std::vector<Texels> arrays;
  auto fill = [&](uint64_t array, uint64_t row_bytes, uint64_t rows, uint64_t slices, uint8_t seed) {
    Texels t{array, row_bytes, rows, slices, {}};
    for (uint64_t z = 0; z < slices; ++z) {
      t.bytes.push_back(Pattern(row_bytes * rows, static_cast<uint8_t>(seed + z)));
      std::memcpy(channel_->window(), t.bytes.back().data(), row_bytes * rows);
      EXPECT_EQ(copy(array, row_bytes, rows, z, true), CUDA_SUCCESS);
    }
    arrays.push_back(std::move(t));
  };
  const uint64_t flat = make(Op::kArrayCreate, ArrayCreateReq{300, 70, 0, CU_AD_FORMAT_FLOAT, 1, 0, 0});
  const uint64_t line =
      make(Op::kArrayCreate, ArrayCreateReq{1000, 0, 0, CU_AD_FORMAT_SIGNED_INT32, 1, CUDA_ARRAY3D_SURFACE_LDST, 0});
  const uint64_t cube = make(Op::kArrayCreate, ArrayCreateReq{16, 8, 4, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0, 0});
  const uint64_t mip = make(Op::kMipmappedArrayCreate, MipmapCreateReq{{32, 32, 0, CU_AD_FORMAT_FLOAT, 2, 0, 0}, 3, 0});
  const uint64_t level1 = make(Op::kMipmappedArrayGetLevel, MipmapLevelReq{mip, 1, 0});
  fill(line, 4000, 1, 1, 3);
  fill(cube, 64, 8, 4, 5);
  fill(level1, 16 * 8, 16, 1, 7);
  fill(flat, 1200, 70, 1, 9);
  const uint64_t linear = Alloc(4096);
  std::vector<std::pair<uint64_t, bool>> objects;  // value, surface
  auto object = [&](TexObjectReq q) {
    const Outcome o = Send(Op::kTexObjectCreate, q);
    EXPECT_EQ(o.status, CUDA_SUCCESS);
    objects.emplace_back(o.As<U64Rep>().value, q.surface != 0);
    return objects.back().first;
  };
  TexObjectReq q{};
  q.res_type = CU_RESOURCE_TYPE_ARRAY;
  q.res = flat;
  q.filter_mode = CU_TR_FILTER_MODE_LINEAR;
  q.flags = CU_TRSF_NORMALIZED_COORDINATES;
  q.address_mode[0] = q.address_mode[1] = CU_TR_ADDRESS_MODE_CLAMP;
  const uint64_t on_flat = object(q);
  q = TexObjectReq{};
  q.res_type = CU_RESOURCE_TYPE_ARRAY;
  q.res = line;
  q.surface = 1;
  const uint64_t surface = object(q);
  q = TexObjectReq{};
  q.res_type = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
  q.res = mip;
  q.max_level = 0x40000000;  // 2.0f
  object(q);
  q = TexObjectReq{};
  q.res_type = CU_RESOURCE_TYPE_LINEAR;
  q.res = linear;
  q.format = CU_AD_FORMAT_FLOAT;
  q.channels = 1;
  q.width = 1024;
  object(q);
  ASSERT_EQ(Status(Op::kArrayDestroy, HandleReq{flat}), CUDA_SUCCESS);  // lives on for on_flat
  const DeviceMemoryRep charged = Send(Op::kDeviceMemoryInfo, DeviceReq{0, 0}).As<DeviceMemoryRep>();

  VectorWriter snap;
  std::string why;
  ASSERT_TRUE(session_->Snapshot(snap, &why)) << why;
  const auto source = Replace(64 * kMiB);
  SpanReader in(snap.bytes());
  ASSERT_TRUE(session_->Restore(in, &why)) << why;

  EXPECT_EQ(Send(Op::kDeviceMemoryInfo, DeviceReq{0, 0}).As<DeviceMemoryRep>().allocated, charged.allocated);
  for (const Texels& t : arrays) {
    if (t.array == flat) continue;  // destroyed: the program cannot copy from it
    for (uint64_t z = 0; z < t.slices; ++z) {
      ASSERT_EQ(copy(t.array, t.row_bytes, t.rows, z, false), CUDA_SUCCESS) << t.array;
      EXPECT_TRUE(std::equal(t.bytes[z].begin(), t.bytes[z].end(), channel_->window())) << t.array << " slice " << z;
    }
  }
  EXPECT_EQ(copy(flat, 1200, 70, 0, false), CUDA_ERROR_INVALID_VALUE);  // destroyed, as at the source
  EXPECT_EQ(make(Op::kMipmappedArrayGetLevel, MipmapLevelReq{mip, 1, 0}), level1);
  // A new object's value is none of the moved ones'; each moved one is destroyed by its value.
  q = TexObjectReq{};
  q.res_type = CU_RESOURCE_TYPE_ARRAY;
  q.res = cube;
  const Outcome fresh = Send(Op::kTexObjectCreate, q);
  ASSERT_EQ(fresh.status, CUDA_SUCCESS);
  for (const auto& [value, is_surface] : objects) EXPECT_NE(fresh.As<U64Rep>().value, value);
  EXPECT_EQ(Status(Op::kTexObjectDestroy, ObjectReq{surface, 0, 0}), CUDA_ERROR_INVALID_VALUE);  // a surface
  for (const auto& [value, is_surface] : objects)
    EXPECT_EQ(Status(Op::kTexObjectDestroy, ObjectReq{value, is_surface ? 1u : 0u, 0}), CUDA_SUCCESS) << value;
  // The destroyed array went with its last object: its charge is given back.
  constexpr uint64_t kFlatCharge = (300 * 70 * 4 + kAllocGranularity - 1) / kAllocGranularity * kAllocGranularity;
  EXPECT_EQ(Send(Op::kDeviceMemoryInfo, DeviceReq{0, 0}).As<DeviceMemoryRep>().allocated,
            charged.allocated - kFlatCharge);
  (void)on_flat;
}

// The target charges what it restores to its own quota: a smaller vGPU refuses the session.
TEST_F(MigrationTest, ATargetWithTooSmallAQuotaRefuses) {
  Context();
  Alloc(40 * kMiB);
  VectorWriter snap;
  std::string why;
  ASSERT_TRUE(session_->Snapshot(snap, &why)) << why;
  const auto source = Replace(32 * kMiB);
  SpanReader in(snap.bytes());
  EXPECT_FALSE(session_->Restore(in, &why));
  EXPECT_EQ(why, "its memory exceeds this vGPU's quota");
}

// cuEventElapsedTime across a move: between two events recorded before it, the time the source
// measured; from one recorded before to one recorded after, at least the time that passed.
TEST_F(MigrationTest, EventTimesCarryAcrossTheMove) {
  Context();
  const uint64_t e1 = Send(Op::kEventCreate, EventCreateReq{CU_EVENT_DEFAULT, 0}).As<HandleRep>().handle;
  const uint64_t e2 = Send(Op::kEventCreate, EventCreateReq{CU_EVENT_DEFAULT, 0}).As<HandleRep>().handle;
  const uint64_t never = Send(Op::kEventCreate, EventCreateReq{CU_EVENT_DEFAULT, 0}).As<HandleRep>().handle;
  ASSERT_EQ(Status(Op::kEventRecord, EventRecordReq{e1, 0}), CUDA_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(Status(Op::kEventRecord, EventRecordReq{e2, 0}), CUDA_SUCCESS);
  ASSERT_EQ(Status(Op::kEventSynchronize, HandleReq{e2}), CUDA_SUCCESS);
  const Outcome there = Send(Op::kEventElapsedTime, EventElapsedReq{e1, e2});
  ASSERT_EQ(there.status, CUDA_SUCCESS);
  const Outcome unrecorded = Send(Op::kEventElapsedTime, EventElapsedReq{e1, never});
  ASSERT_NE(unrecorded.status, CUDA_SUCCESS);
  VectorWriter snap;
  std::string why;
  ASSERT_TRUE(session_->Snapshot(snap, &why)) << why;
  const auto source = Replace(64 * kMiB);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  SpanReader in(snap.bytes());
  ASSERT_TRUE(session_->Restore(in, &why)) << why;
  const Outcome here = Send(Op::kEventElapsedTime, EventElapsedReq{e1, e2});
  ASSERT_EQ(here.status, CUDA_SUCCESS);
  EXPECT_NEAR(here.As<F32Rep>().ms, there.As<F32Rep>().ms, 0.01);
  EXPECT_EQ(Send(Op::kEventElapsedTime, EventElapsedReq{e1, never}).status, unrecorded.status);
  const uint64_t e3 = Send(Op::kEventCreate, EventCreateReq{CU_EVENT_DEFAULT, 0}).As<HandleRep>().handle;
  ASSERT_EQ(Status(Op::kEventRecord, EventRecordReq{e3, 0}), CUDA_SUCCESS);
  ASSERT_EQ(Status(Op::kEventSynchronize, HandleReq{e3}), CUDA_SUCCESS);
  const Outcome across = Send(Op::kEventElapsedTime, EventElapsedReq{e2, e3});
  ASSERT_EQ(across.status, CUDA_SUCCESS);
  EXPECT_GE(across.As<F32Rep>().ms, 30.0f);
  EXPECT_LT(across.As<F32Rep>().ms, 30000.0f);
  const Outcome backwards = Send(Op::kEventElapsedTime, EventElapsedReq{e3, e1});
  EXPECT_NEAR(backwards.As<F32Rep>().ms, -(across.As<F32Rep>().ms + here.As<F32Rep>().ms), 0.05);
  // Recorded again here, an event times as any other.
  ASSERT_EQ(Status(Op::kEventRecord, EventRecordReq{e1, 0}), CUDA_SUCCESS);
  ASSERT_EQ(Status(Op::kEventSynchronize, HandleReq{e1}), CUDA_SUCCESS);
  const Outcome fresh = Send(Op::kEventElapsedTime, EventElapsedReq{e3, e1});
  ASSERT_EQ(fresh.status, CUDA_SUCCESS);
  EXPECT_GE(fresh.As<F32Rep>().ms, 0.0f);
  EXPECT_LT(fresh.As<F32Rep>().ms, 30.0f);
}

// Device memory moves in chunks, each as it is, all zero, or lz4-compressed (snapshot_chunks.h):
// whichever the source chose, the target holds the same bytes at the same address, also where it
// commits its fresh memory ahead of the stream (an allocation of 4 chunks or more).
TEST_F(MigrationTest, MemoryMovesTheSameRawZeroOrCompressed) {
  Context();
  constexpr uint64_t kChunk = kSnapshotChunk, bytes = 5 * kChunk + 1000;
  const uint64_t a = Alloc(bytes);
  std::vector<uint8_t> want(bytes, 0);  // chunks 0 and 4 stay zero
  std::fill(want.begin() + kChunk, want.begin() + 2 * kChunk, 0x5a);
  std::mt19937 gen(7);
  for (uint64_t i = 2 * kChunk; i < 3 * kChunk; ++i) want[i] = static_cast<uint8_t>(gen());
  const std::vector<uint8_t> pattern = Pattern(kChunk, 4);
  std::copy(pattern.begin(), pattern.end(), want.begin() + 3 * kChunk);
  for (uint64_t i = 5 * kChunk; i < bytes; ++i) want[i] = static_cast<uint8_t>(gen());
  auto write_all = [&] {
    for (uint64_t off = 0; off < bytes; off += kMiB)
      Write(a + off, std::vector<uint8_t>(want.begin() + off, want.begin() + std::min(bytes, off + kMiB)));
  };
  write_all();
  for (const Compression mode : {Compression::kOff, Compression::kWhenItPays, Compression::kAlways}) {
    VectorWriter snap(mode);
    std::string why;
    ASSERT_TRUE(session_->Snapshot(snap, &why)) << why;
    EXPECT_EQ(snap.chunks.memory, bytes);
    if (mode == Compression::kOff) {
      EXPECT_EQ(snap.chunks.raw, 6u);
      EXPECT_GT(snap.bytes().size(), bytes);
    } else {
      EXPECT_EQ(snap.chunks.zero, 2u) << static_cast<int>(mode);
      EXPECT_GE(snap.chunks.lz4, 1u) << static_cast<int>(mode);  // at least the 0x5a one
      EXPECT_LT(snap.bytes().size(), 3 * kChunk) << static_cast<int>(mode);
    }
    const auto source = Replace(64 * kMiB);
    SpanReader in(snap.bytes());
    ASSERT_TRUE(session_->Restore(in, &why)) << why;
    for (uint64_t off = 0; off < bytes; off += kMiB) {
      const uint64_t n = std::min(kMiB, bytes - off);
      ASSERT_TRUE(Read(a + off, n) == std::vector<uint8_t>(want.begin() + off, want.begin() + off + n))
          << static_cast<int>(mode) << " at " << off;
    }
  }
}

// A move's manifest (sent when it is asked for) has the target allocate and commit the session's
// memory while the program still runs: the restore then fills what is still there, frees what the
// program freed since, and allocates what it made since. A manifest is hostile input too.
TEST_F(MigrationTest, TheManifestPreparesMemoryTheRestoreThenFills) {
  Context();
  const uint64_t kept = Alloc(3 * kMiB), freed = Alloc(2 * kMiB), guard = Alloc(kMiB);
  const std::vector<uint8_t> kept_bytes = Pattern(kMiB, 5);
  Write(kept + kMiB, kept_bytes);
  VectorWriter manifest;
  std::string why;
  ASSERT_TRUE(session_->SnapshotManifest(manifest, &why)) << why;
  // The program goes on: it frees one allocation and makes another (too large for the hole the
  // first left between its neighbours) before the move.
  ASSERT_EQ(Status(Op::kMemFree, MemFreeReq{freed}), CUDA_SUCCESS);
  const uint64_t made = Alloc(4 * kMiB);
  ASSERT_NE(made, freed);
  const std::vector<uint8_t> made_bytes = Pattern(kMiB, 6);
  Write(made, made_bytes);
  VectorWriter snap;
  ASSERT_TRUE(session_->Snapshot(snap, &why)) << why;
  const DeviceMemoryRep charged = Send(Op::kDeviceMemoryInfo, DeviceReq{0, 0}).As<DeviceMemoryRep>();

  std::vector<uint8_t> stream = manifest.bytes();
  stream.insert(stream.end(), snap.bytes().begin(), snap.bytes().end());
  const auto source = Replace(64 * kMiB);
  SpanReader in(stream);
  ASSERT_TRUE(session_->Restore(in, &why)) << why;
  EXPECT_EQ(Read(kept + kMiB, kMiB), kept_bytes);
  EXPECT_EQ(Read(made, kMiB), made_bytes);
  EXPECT_EQ(Send(Op::kDeviceMemoryInfo, DeviceReq{0, 0}).As<DeviceMemoryRep>().allocated, charged.allocated);
  // What the program freed is no memory of the restored session, and its range is free again.
  EXPECT_EQ(Status(Op::kMemFree, MemFreeReq{freed}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Status(Op::kMemFree, MemFreeReq{kept}), CUDA_SUCCESS);
  EXPECT_EQ(Status(Op::kMemFree, MemFreeReq{guard}), CUDA_SUCCESS);

  // Hostile manifests: each refused with the reason, before any record of the session.
  auto manifest_of = [](std::vector<std::array<uint64_t, 3>> entries) {  // addr, bytes, device
    std::vector<uint8_t> meta;
    for (const auto& e : entries) {
      const uint64_t rec[3] = {e[0], e[1], e[2]};  // ManifestEntry: addr, bytes, dev | pad << 32
      meta.insert(meta.end(), reinterpret_cast<const uint8_t*>(rec), reinterpret_cast<const uint8_t*>(rec) + 24);
    }
    const uint32_t head[2] = {17, 0};  // kRecManifest, flags
    const uint64_t sizes[2] = {meta.size(), 0};
    std::vector<uint8_t> out(reinterpret_cast<const uint8_t*>(head), reinterpret_cast<const uint8_t*>(head) + 8);
    out.insert(out.end(), reinterpret_cast<const uint8_t*>(sizes), reinterpret_cast<const uint8_t*>(sizes) + 16);
    out.insert(out.end(), meta.begin(), meta.end());
    return out;
  };
  const uint64_t base = kept;
  const std::vector<std::vector<std::array<uint64_t, 3>>> hostile = {
      {{base, 65 * kMiB, 0}},                         // more than the vGPU's quota
      {{base, kMiB, 0}, {base + kMiB / 2, kMiB, 0}},  // overlapping
      {{base, kMiB, 1}},                              // a device the session does not have
      {{base, 0, 0}},                                 // nothing
      {{UINT64_MAX - 10, kMiB, 0}},                   // past the end of the address space
      {{base, kMiB, uint64_t{1} << 32}},              // pad not 0
  };
  for (const auto& entries : hostile) {
    Replace(64 * kMiB);
    std::vector<uint8_t> bad = manifest_of(entries);
    bad.insert(bad.end(), snap.bytes().begin(), snap.bytes().end());
    SpanReader hostile_in(bad);
    why.clear();
    EXPECT_FALSE(session_->Restore(hostile_in, &why)) << entries.size();
    EXPECT_EQ(why, "the manifest is malformed or exceeds this vGPU's quota") << entries[0][0];
  }
  // A second manifest, or one after the header, is no record a snapshot has.
  Replace(64 * kMiB);
  std::vector<uint8_t> twice = manifest.bytes();
  twice.insert(twice.end(), stream.begin(), stream.end());
  SpanReader twice_in(twice);
  EXPECT_FALSE(session_->Restore(twice_in, &why));
  EXPECT_EQ(why, "the snapshot does not start with its header");
}

// The snapshot is hostile input to the target: cut short anywhere, or with a byte of a record's
// head or struct changed, the restore fails with a reason (never a crash, never a session that
// serves half of it).
TEST_F(MigrationTest, ABrokenSnapshotIsRefused) {
  Context();
  Function(kBumpPtx, "bump");
  const uint64_t a = Alloc(kMiB);
  Write(a, Pattern(kMiB, 3));
  ASSERT_EQ(Send(Op::kStreamCreate, StreamCreateReq{0, 0}).status, CUDA_SUCCESS);
  ASSERT_EQ(Send(Op::kEventCreate, EventCreateReq{0, 0}).status, CUDA_SUCCESS);
  VectorWriter snap;
  std::string why;
  ASSERT_TRUE(session_->Snapshot(snap, &why)) << why;
  const std::vector<uint8_t>& whole = snap.bytes();
  const auto source = Replace(64 * kMiB);
  // Cut short: at every 4 KiB, and every byte of the first records.
  std::vector<size_t> cuts;
  for (size_t at = 0; at < 600; ++at) cuts.push_back(at);
  for (size_t at = 600; at < whole.size(); at += 4096) cuts.push_back(at);
  cuts.push_back(whole.size() - 1);
  for (size_t cut : cuts) {
    Replace(64 * kMiB);
    SpanReader in(std::span<const uint8_t>(whole.data(), cut));
    why.clear();
    EXPECT_FALSE(session_->Restore(in, &why)) << cut;
    EXPECT_FALSE(why.empty()) << cut;
  }
  // Every byte of the header record and the context record changed (the records' fixed parts),
  // but for the header's counters and clock: any larger handle or physical-allocation counter is
  // as good (bytes 49..55 and 56..63), and the clock only times the move's gap (80..87).
  for (size_t at = 0; at < 24 + sizeof(uint64_t) * 8 + 24 + 24; ++at) {
    if ((at >= 49 && at < 64) || (at >= 80 && at < 88)) continue;
    std::vector<uint8_t> bad = whole;
    bad[at] ^= 0x5a;
    Replace(64 * kMiB);
    SpanReader in(bad);
    why.clear();
    if (session_->Restore(in, &why)) {
      ADD_FAILURE() << "byte " << at << " changed and the restore took it";
    }
  }
  // Whole, it restores.
  Replace(64 * kMiB);
  SpanReader in(whole);
  EXPECT_TRUE(session_->Restore(in, &why)) << why;
  // And a second restore into the same session is refused.
  SpanReader again(whole);
  EXPECT_FALSE(session_->Restore(again, &why));
  EXPECT_EQ(why, "the session restored into is not empty");
}

}  // namespace
}  // namespace orion::host::detail
