#include "orion/ivshmem/ring.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace orion::ivshmem {
namespace {

struct RingMem {
  explicit RingMem(uint32_t capacity) : cap(capacity), bytes(kRingCursorBytes + capacity + 128) {
    base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(bytes.data()) + 127) & ~uintptr_t{127});
  }
  uint32_t cap;
  std::vector<uint8_t> bytes;
  uint8_t* base;
};

FrameHeader Hdr(uint16_t op, uint32_t seq, uint32_t len) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kProtocolVersion;
  h.op = op;
  h.seq = seq;
  h.payload_len = len;
  return h;
}

TEST(Ring, PushPopRoundTrip) {
  RingMem m(4096);
  RingProducer p(m.base, m.cap);
  RingConsumer c(m.base, m.cap);
  std::vector<uint8_t> scratch;
  FrameView f{};
  bool got = true;
  ASSERT_TRUE(c.Pop(&f, &scratch, &got).ok());
  EXPECT_FALSE(got);
  const char msg[] = "hello ring";
  ASSERT_TRUE(p.Push(Hdr(3, 7, sizeof(msg)), msg));
  ASSERT_TRUE(c.Pop(&f, &scratch, &got).ok());
  ASSERT_TRUE(got);
  EXPECT_EQ(f.header.seq, 7u);
  EXPECT_EQ(f.header.payload_len, sizeof(msg));
  EXPECT_EQ(std::memcmp(f.payload, msg, sizeof(msg)), 0);
  EXPECT_FALSE(c.HasData());
}

TEST(Ring, FullRingRefusesThenAcceptsAfterPop) {
  RingMem m(1024);
  RingProducer p(m.base, m.cap);
  RingConsumer c(m.base, m.cap);
  std::vector<uint8_t> payload(200, 0xAB);
  int pushed = 0;
  while (p.Push(Hdr(3, static_cast<uint32_t>(pushed), 200), payload.data())) ++pushed;
  EXPECT_EQ(pushed, 1024 / 232);  // 232 = FrameSpan(200)
  std::vector<uint8_t> scratch;
  FrameView f{};
  bool got = false;
  ASSERT_TRUE(c.Pop(&f, &scratch, &got).ok());
  ASSERT_TRUE(got);
  EXPECT_TRUE(p.Push(Hdr(3, 99, 200), payload.data()));
}

TEST(Ring, FramesWrapWithPadAndStayContiguous) {
  RingMem m(512);
  RingProducer p(m.base, m.cap);
  RingConsumer c(m.base, m.cap);
  std::vector<uint8_t> scratch;
  for (uint32_t i = 0; i < 1000; ++i) {
    const uint32_t len = (i * 37) % 200;
    std::vector<uint8_t> payload(len, static_cast<uint8_t>(i));
    ASSERT_TRUE(p.Push(Hdr(3, i, len), payload.data())) << i;
    FrameView f{};
    bool got = false;
    ASSERT_TRUE(c.Pop(&f, &scratch, &got).ok()) << i;
    ASSERT_TRUE(got);
    ASSERT_EQ(f.header.seq, i);
    ASSERT_EQ(f.header.payload_len, len);
    for (uint32_t k = 0; k < len; ++k) ASSERT_EQ(f.payload[k], static_cast<uint8_t>(i));
  }
}

TEST(Ring, LargestFrameIsHalfTheRing) {
  RingMem m(1024);
  RingProducer p(m.base, m.cap);
  EXPECT_EQ(p.Reserve(512 - 32 + 1), nullptr);
  EXPECT_NE(p.Reserve(512 - 32), nullptr);
}

// Hostile producer: every impossible state is a kDataLoss, never a crash or an over-read.
struct HostileCase {
  const char* name;
  void (*corrupt)(RingCursors*, uint8_t* data, uint32_t cap);
};

TEST(Ring, HostileProducerStatesAreRejected) {
  const HostileCase cases[] = {
      {"head beyond capacity", [](RingCursors* r, uint8_t*, uint32_t cap) { r->head.store(cap + 8); }},
      {"head not multiple of 8", [](RingCursors* r, uint8_t*, uint32_t) { r->head.store(12); }},
      {"head behind tail", [](RingCursors* r, uint8_t*, uint32_t) { r->head.store(0xFFFFFFF8u); }},
      {"garbage magic",
       [](RingCursors* r, uint8_t* d, uint32_t) {
         std::memset(d, 0x5A, 64);
         r->head.store(64);
       }},
      {"payload longer than published",
       [](RingCursors* r, uint8_t* d, uint32_t) {
         FrameHeader h = Hdr(3, 1, 100);
         std::memcpy(d, &h, sizeof(h));
         r->head.store(64);
       }},
      {"payload larger than kMaxPayload",
       [](RingCursors* r, uint8_t* d, uint32_t) {
         FrameHeader h = Hdr(3, 1, kMaxPayload + 1);
         std::memcpy(d, &h, sizeof(h));
         r->head.store(1024);
       }},
      {"wrong version",
       [](RingCursors* r, uint8_t* d, uint32_t) {
         FrameHeader h = Hdr(3, 1, 0);
         h.version = 99;
         std::memcpy(d, &h, sizeof(h));
         r->head.store(32);
       }},
      {"pad marker with nothing after it",
       [](RingCursors* r, uint8_t* d, uint32_t) {
         uint32_t mk = kPadMarker;
         std::memcpy(d, &mk, 4);
         r->head.store(8);
       }},
      {"frame crossing the end",
       [](RingCursors* r, uint8_t* d, uint32_t cap) {
         r->tail.store(cap - 32);
         FrameHeader h = Hdr(3, 1, 64);
         std::memcpy(d + cap - 32, &h, sizeof(h));
         r->head.store(cap - 32 + 96);
       }},
  };
  for (const auto& tc : cases) {
    RingMem m(2048);
    auto* cur = reinterpret_cast<RingCursors*>(m.base);
    tc.corrupt(cur, m.base + kRingCursorBytes, m.cap);
    RingConsumer c(m.base, m.cap);
    std::vector<uint8_t> scratch;
    FrameView f{};
    bool got = false;
    Status s = c.Pop(&f, &scratch, &got);
    EXPECT_EQ(s.code(), Code::kDataLoss) << tc.name << ": " << s.ToString();
    EXPECT_FALSE(got) << tc.name;
  }
}

// Two threads, one producer one consumer, random frame sizes; every frame arrives once, in order,
// intact.
TEST(RingStress, TwoThreadsInOrderIntact) {
  RingMem m(1 << 14);
  constexpr uint32_t kFrames = 300000;
  std::thread producer([&] {
    RingProducer p(m.base, m.cap);
    std::mt19937 rng(1);
    std::vector<uint8_t> payload(1024);
    for (uint32_t i = 0; i < kFrames; ++i) {
      const uint32_t len = static_cast<uint32_t>(rng() % 600);
      for (uint32_t k = 0; k < len; ++k) payload[k] = static_cast<uint8_t>(i + k);
      Backoff b(100, 10, 50);
      while (!p.Push(Hdr(3, i, len), payload.data())) b.Pause();
    }
  });
  RingConsumer c(m.base, m.cap);
  std::mt19937 rng(1);
  std::vector<uint8_t> scratch;
  uint32_t bad = 0;
  for (uint32_t i = 0; i < kFrames; ++i) {
    FrameView f{};
    bool got = false;
    Backoff b(100, 10, 50);
    for (;;) {
      Status s = c.Pop(&f, &scratch, &got);
      ASSERT_TRUE(s.ok()) << s.ToString();
      if (got) break;
      b.Pause();
    }
    const uint32_t len = static_cast<uint32_t>(rng() % 600);
    if (f.header.seq != i || f.header.payload_len != len) ++bad;
    for (uint32_t k = 0; k < f.header.payload_len; ++k)
      if (f.payload[k] != static_cast<uint8_t>(i + k)) ++bad;
  }
  producer.join();
  EXPECT_EQ(bad, 0u);
}

}  // namespace
}  // namespace orion::ivshmem
