#include "orion/common/frame.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <set>
#include <string>

namespace orion {
namespace {

// Layout pins: these numbers are the wire format. Changing one is a protocol version bump.
TEST(FrameLayout, HeaderIsPinned) {
  EXPECT_EQ(sizeof(FrameHeader), 32u);
  EXPECT_EQ(offsetof(FrameHeader, magic), 0u);
  EXPECT_EQ(offsetof(FrameHeader, version), 4u);
  EXPECT_EQ(offsetof(FrameHeader, op), 6u);
  EXPECT_EQ(offsetof(FrameHeader, seq), 8u);
  EXPECT_EQ(offsetof(FrameHeader, payload_len), 12u);
  EXPECT_EQ(offsetof(FrameHeader, status), 16u);
  EXPECT_EQ(offsetof(FrameHeader, deferred), 20u);
  EXPECT_EQ(offsetof(FrameHeader, flags), 24u);
}

TEST(FrameLayout, PayloadsArePinned) {
  EXPECT_EQ(sizeof(HelloReq), 264u);
  EXPECT_EQ(offsetof(HelloReq, share), 224u);
  EXPECT_EQ(offsetof(HelloReq, allocation_id), 120u);
  EXPECT_EQ(offsetof(HelloReq, hostname), 160u);
  EXPECT_EQ(offsetof(HelloReq, key), 88u);
  EXPECT_EQ(offsetof(HelloReq, gmem_mib), 8u);
  EXPECT_EQ(offsetof(HelloReq, process_name), 24u);
  EXPECT_EQ(offsetof(HelloReq, kind), 22u);
  EXPECT_EQ(sizeof(MovedRep), 144u);
  EXPECT_EQ(offsetof(MovedRep, token), 64u);
  EXPECT_EQ(offsetof(MovedRep, back_token), 104u);
  EXPECT_NE(kStatusMoved, kStatusNeedBytes);
  EXPECT_EQ(sizeof(DeviceInfo), 952u);
  EXPECT_EQ(offsetof(DeviceInfo, total_mem), 272u);
  EXPECT_EQ(offsetof(DeviceInfo, attributes), 280u);
  EXPECT_EQ(sizeof(WelcomeRep), 160u);
  EXPECT_EQ(offsetof(WelcomeRep, share), 120u);
  EXPECT_EQ(offsetof(WelcomeRep, allocation_id), 80u);
  EXPECT_EQ(sizeof(MemcpyReq), 32u);
  EXPECT_EQ(sizeof(DeviceMemoryRep), 24u);
  EXPECT_EQ(offsetof(DeviceMemoryRep, allocated), 8u);
  EXPECT_EQ(offsetof(DeviceMemoryRep, context_overhead), 16u);
  EXPECT_EQ(sizeof(Memcpy2DReq), 64u);
  EXPECT_EQ(offsetof(Memcpy2DReq, src_side), 56u);
  EXPECT_EQ(sizeof(MemsetReq), 48u);
  EXPECT_EQ(offsetof(MemsetReq, value), 40u);
  EXPECT_EQ(sizeof(ModuleLoadReq), 24u);
  EXPECT_EQ(sizeof(BlobPutReq), 48u);
  EXPECT_EQ(sizeof(LaunchReq), 48u);
  EXPECT_EQ(offsetof(LaunchReq, grid), 16u);
  EXPECT_EQ(offsetof(LaunchReq, block), 28u);
  EXPECT_EQ(offsetof(LaunchReq, shared_mem_bytes), 40u);
  EXPECT_EQ(offsetof(LaunchReq, param_bytes), 44u);
  EXPECT_EQ(sizeof(FunctionRep), 24u);
  EXPECT_EQ(sizeof(ModuleFunctionNameReq), 16u);
  EXPECT_EQ(offsetof(ModuleFunctionNameReq, index), 8u);
  EXPECT_EQ(sizeof(ModuleFunctionNameRep), 8u);
  EXPECT_EQ(offsetof(ModuleFunctionNameRep, name_len), 4u);
  EXPECT_EQ(sizeof(OccupancyReq), 24u);
  EXPECT_EQ(sizeof(StreamWaitEventReq), 24u);
  EXPECT_EQ(sizeof(RdmaConnectInfo), 72u);
  EXPECT_EQ(offsetof(RdmaConnectInfo, qpn), 16u);
  EXPECT_EQ(offsetof(RdmaConnectInfo, window_addr), 24u);
  EXPECT_EQ(offsetof(RdmaConnectInfo, window_rkey), 40u);
  EXPECT_EQ(offsetof(RdmaConnectInfo, done_addr), 48u);
  EXPECT_EQ(offsetof(RdmaConnectInfo, recv_slots), 56u);
  EXPECT_EQ(offsetof(RdmaConnectInfo, mtu), 64u);
}

TEST(Ops, NumbersAreStableAndNamed) {
  // A few pinned numbers: never renumber.
  EXPECT_EQ(static_cast<int>(Op::kHello), 1);
  EXPECT_EQ(static_cast<int>(Op::kMemAlloc), 20);
  EXPECT_EQ(static_cast<int>(Op::kLaunchKernel), 47);
  EXPECT_EQ(static_cast<int>(Op::kEventElapsedTime), 70);
  EXPECT_EQ(static_cast<int>(Op::kRdmaConnect), 91);
  EXPECT_STREQ(OpName(47), "LaunchKernel");
  EXPECT_EQ(OpName(0), nullptr);
  EXPECT_EQ(OpName(9), nullptr);
  EXPECT_EQ(OpName(65535), nullptr);
  EXPECT_FALSE(OpKnown(0));
}

TEST(Ops, EveryOpHasAUniqueNameAndReplyKind) {
  std::set<std::string> names;
  int count = 0;
#define ORION_OP(name, number, reply, ...)          \
  ++count;                                          \
  EXPECT_TRUE(names.insert(#name).second) << #name; \
  EXPECT_STREQ(OpName(number), #name);              \
  EXPECT_EQ(OpWantsReply(number), ReplyKind::reply == ReplyKind::kSync) << #name;
#include "orion/common/ops.def"
  EXPECT_EQ(static_cast<int>(names.size()), count);
  EXPECT_TRUE(OpWantsReply(static_cast<uint16_t>(Op::kMemAlloc)));
  EXPECT_FALSE(OpWantsReply(static_cast<uint16_t>(Op::kLaunchKernel)));
}

TEST(Checkpoint, EveryOpAcceptsExactlyItsShape) {
  // Generated from ops.def, as the checkpoint is: each op's own length passes, one byte more or
  // less does not (kHead: more passes, up to kMaxPayload); kOwn ops are never dispatched.
  std::string why;
  int checked = 0;
#define ORION_OP(name, number, reply, req, shape)                                           \
  {                                                                                         \
    const uint32_t n = RequestBytes<req>();                                                 \
    switch (OpShape::shape) {                                                               \
      case OpShape::kEmpty:                                                                 \
        EXPECT_TRUE(CheckRequestShape(number, 0, &why)) << #name;                           \
        EXPECT_FALSE(CheckRequestShape(number, 8, &why)) << #name;                          \
        break;                                                                              \
      case OpShape::kFixed:                                                                 \
        EXPECT_GT(n, 0u) << #name;                                                          \
        EXPECT_TRUE(CheckRequestShape(number, n, &why)) << #name;                           \
        EXPECT_FALSE(CheckRequestShape(number, n - 1, &why)) << #name;                      \
        EXPECT_FALSE(CheckRequestShape(number, n + 1, &why)) << #name;                      \
        EXPECT_FALSE(CheckRequestShape(number, 0, &why)) << #name;                          \
        break;                                                                              \
      case OpShape::kHead:                                                                  \
        EXPECT_TRUE(CheckRequestShape(number, n, &why)) << #name;                           \
        EXPECT_TRUE(CheckRequestShape(number, n + 100, &why)) << #name;                     \
        EXPECT_TRUE(CheckRequestShape(number, kMaxPayload, &why)) << #name;                 \
        EXPECT_FALSE(CheckRequestShape(number, n - 1, &why)) << #name;                      \
        EXPECT_FALSE(CheckRequestShape(number, kMaxPayload + 1, &why)) << #name;            \
        break;                                                                              \
      case OpShape::kOwn: EXPECT_FALSE(CheckRequestShape(number, n, &why)) << #name; break; \
    }                                                                                       \
    ++checked;                                                                              \
  }
#include "orion/common/ops.def"
  EXPECT_GT(checked, 70);
  EXPECT_FALSE(CheckRequestShape(999, 0, &why));
  EXPECT_EQ(why, "unknown op 999");
  EXPECT_FALSE(CheckRequestShape(static_cast<uint16_t>(Op::kMemAlloc), 12, &why));
  EXPECT_EQ(why, "a payload of 12 bytes, expected exactly 8");
  // The typed decode reads the struct ops.def names for the op.
  static_assert(std::is_same_v<OpRequestT<Op::kMemAlloc>, MemAllocReq>);
  MemAllocReq q{12345};
  EXPECT_EQ(DecodeReq<Op::kMemAlloc>(reinterpret_cast<const uint8_t*>(&q)).bytes, 12345u);
}

// The one window check of every transport: inside, at the very end, and what would wrap.
TEST(Limits, InWindowRefusesRangesPastTheWindowAndWraps) {
  EXPECT_TRUE(InWindow({0, 4096}, 4096));
  EXPECT_TRUE(InWindow({4096, 0}, 4096));
  EXPECT_TRUE(InWindow({1000, 3096}, 4096));
  EXPECT_FALSE(InWindow({1000, 3097}, 4096));
  EXPECT_FALSE(InWindow({4097, 0}, 4096));
  EXPECT_FALSE(InWindow({8, UINT64_MAX - 4}, 4096));  // offset + bytes wraps to a small number
  EXPECT_FALSE(InWindow({UINT64_MAX, 2}, 4096));
}

TEST(Limits, Span2DRefusesWhatWrapsOrExceeds) {
  uint64_t span = 0;
  EXPECT_TRUE(Span2D(1, 0, 100, &span));
  EXPECT_EQ(span, 100u);
  EXPECT_TRUE(Span2D(3, 256, 100, &span));
  EXPECT_EQ(span, 612u);
  EXPECT_TRUE(Span2D(kMax2DHeight, kMax2DPitch / 2, 8, &span));
  // (2^24 - 1) * 2^40 + 2^40 = 2^64: wraps to 0 unchecked.
  EXPECT_FALSE(Span2D(kMax2DHeight, kMax2DPitch, kMax2DPitch, &span));
  EXPECT_FALSE(Span2D(kMax2DHeight + 1, 1, 1, &span));
  EXPECT_FALSE(Span2D(2, kMax2DPitch + 1, 1, &span));
  EXPECT_FALSE(Span2D(1, 0, kMax2DPitch + 1, &span));
  EXPECT_FALSE(Span2D(0, 1, 1, &span));
  EXPECT_FALSE(Span2D(1, 1, 0, &span));
  EXPECT_FALSE(Span2D(2, 4, 8, &span));  // overlapping rows
  uint64_t v = 0;
  EXPECT_FALSE(CheckedMul(uint64_t{1} << 62, 4, &v));
  EXPECT_FALSE(CheckedAdd(~uint64_t{0}, 1, &v));
  EXPECT_TRUE(CheckedAdd(1, 2, &v));
  EXPECT_EQ(v, 3u);
}

TEST(Limits, WindowRangesOfAWrappingMemcpy2DAreEmpty) {
  Memcpy2DReq q{};
  q.src_side = kSideWindow;
  q.dst_side = kSideWindow;
  q.width_bytes = q.src_pitch = q.dst_pitch = kMax2DPitch;
  q.height = kMax2DHeight;
  WindowRanges r;
  ASSERT_TRUE(
      FrameWindowRanges(static_cast<uint16_t>(Op::kMemcpy2D), reinterpret_cast<const uint8_t*>(&q), sizeof q, &r));
  EXPECT_EQ(r.nreads, 0u);  // unchecked: one read range of 0 bytes
  EXPECT_EQ(r.nwrites, 0u);
  q.height = 2;
  q.width_bytes = 16;
  q.src_pitch = q.dst_pitch = 32;
  ASSERT_TRUE(
      FrameWindowRanges(static_cast<uint16_t>(Op::kMemcpy2D), reinterpret_cast<const uint8_t*>(&q), sizeof q, &r));
  ASSERT_EQ(r.nreads, 1u);
  EXPECT_EQ(r.reads[0].bytes, 48u);
  ASSERT_EQ(r.nwrites, 1u);
  EXPECT_EQ(r.writes[0].bytes, 48u);
}

TEST(Limits, WindowRangesOfAnArrayCopy) {
  // Only a window side crosses the network; an array side (a handle and an origin) never does.
  ArrayCopyReq q{};
  q.src_side = kSideWindow;
  q.src = 4096;
  q.src_pitch = 64;
  q.dst_side = kSideArray;
  q.dst = 0x10010;
  q.dst_x = 16;
  q.width_bytes = 48;
  q.height = 3;
  WindowRanges r;
  ASSERT_TRUE(
      FrameWindowRanges(static_cast<uint16_t>(Op::kMemcpyArray), reinterpret_cast<const uint8_t*>(&q), sizeof q, &r));
  ASSERT_EQ(r.nreads, 1u);
  EXPECT_EQ(r.reads[0].offset, 4096u);
  EXPECT_EQ(r.reads[0].bytes, 2u * 64 + 48);
  EXPECT_EQ(r.nwrites, 0u);
  std::swap(q.src_side, q.dst_side);
  std::swap(q.src, q.dst);
  std::swap(q.src_pitch, q.dst_pitch);
  ASSERT_TRUE(
      FrameWindowRanges(static_cast<uint16_t>(Op::kMemcpyArray), reinterpret_cast<const uint8_t*>(&q), sizeof q, &r));
  EXPECT_EQ(r.nreads, 0u);
  ASSERT_EQ(r.nwrites, 1u);
  EXPECT_EQ(r.writes[0].bytes, 2u * 64 + 48);
  EXPECT_FALSE(FrameWindowRanges(static_cast<uint16_t>(Op::kMemcpyArray), reinterpret_cast<const uint8_t*>(&q),
                                 sizeof q - 8, &r));  // truncated: malformed
}

TEST(Frame, SpanRoundsToEight) {
  EXPECT_EQ(FrameSpan(0), 32u);
  EXPECT_EQ(FrameSpan(1), 40u);
  EXPECT_EQ(FrameSpan(8), 40u);
  EXPECT_EQ(FrameSpan(9), 48u);
}

// Every reply oriond sends is built by ReplyHeader: the request's op and seq, the status, nothing
// else set (flags, deferred and reserved are the sender's to fill).
TEST(FrameHeaders, ReplyHeaderEchoesTheRequest) {
  FrameHeader req = MakeFrameHeader(static_cast<uint16_t>(Op::kMemAlloc), 77, 8);
  req.flags = kFlagWantsReply;
  EXPECT_EQ(req.magic, kFrameMagic);
  EXPECT_EQ(req.version, kProtocolVersion);
  const FrameHeader r = ReplyHeader(req, 2, 16);
  EXPECT_EQ(r.magic, kFrameMagic);
  EXPECT_EQ(r.version, kProtocolVersion);
  EXPECT_EQ(r.op, static_cast<uint16_t>(Op::kMemAlloc));
  EXPECT_EQ(r.seq, 77u);
  EXPECT_EQ(r.payload_len, 16u);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.flags, 0u);
  EXPECT_EQ(r.deferred, 0);
  EXPECT_EQ(r.reserved, 0u);
}

}  // namespace
}  // namespace orion
