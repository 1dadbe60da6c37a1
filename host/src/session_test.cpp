// Session's dispatch table and handlers, without a daemon, a region or a client: a Session on the
// sim backend (the fake GPU: device memory is host memory) and an in-memory channel, fed frames
// through Dispatch as Run feeds them. What the tests read back (statuses, handles, the quota) is
// what the handlers computed.
#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>

#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "session_impl.h"

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
    std::vector<uint8_t> get(sizeof(ModuleSymbolReq) + name.size() + 1);
    const ModuleSymbolReq q{m.As<ModuleLoadRep>().module, static_cast<uint32_t>(name.size() + 1), 0};
    std::memcpy(get.data(), &q, sizeof q);
    std::memcpy(get.data() + sizeof q, name.c_str(), name.size() + 1);
    const Outcome f = Raw(static_cast<uint16_t>(Op::kModuleGetFunction), get.data(), static_cast<uint32_t>(get.size()));
    EXPECT_TRUE(f.served && f.status == CUDA_SUCCESS) << f.why << " " << f.status;
    return f.As<FunctionRep>().function;
  }

  SessionParams params_;
  MemoryChannel* channel_ = nullptr;
  std::unique_ptr<Session> session_;
  uint32_t seq_ = 0;
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

}  // namespace
}  // namespace orion::host::detail
