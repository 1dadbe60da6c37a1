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

FrameHeader Hdr(uint16_t op, uint32_t seq, uint32_t len) { return MakeFrameHeader(op, seq, len); }

TEST(Ring, PushPopRoundTrip) {
  RingMem m(4096);
  RingProducer p(m.base, m.cap, 1);
  RingConsumer c(m.base, m.cap, 1);
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

// Ahead(): what the producer has published past the consumer, from its head cursor (a hint for the
// worker's temporal slipping); it follows pushes and pops exactly.
TEST(Ring, AheadCountsThePublishedBytesNotYetTaken) {
  RingMem m(4096);
  RingProducer p(m.base, m.cap, 1);
  RingConsumer c(m.base, m.cap, 1);
  EXPECT_EQ(c.Ahead(), 0u);
  const uint8_t payload[40] = {};
  ASSERT_TRUE(p.Push(Hdr(1, 1, 40), payload));
  ASSERT_TRUE(p.Push(Hdr(1, 2, 0), nullptr));
  EXPECT_EQ(c.Ahead(), RecordSpan(40) + RecordSpan(0));
  std::vector<uint8_t> scratch;
  FrameView f{};
  bool got = false;
  ASSERT_TRUE(c.Pop(&f, &scratch, &got).ok());
  ASSERT_TRUE(got);
  EXPECT_EQ(c.Ahead(), RecordSpan(0));
  ASSERT_TRUE(c.Pop(&f, &scratch, &got).ok());
  EXPECT_EQ(c.Ahead(), 0u);
}

TEST(Ring, FullRingRefusesThenAcceptsAfterPop) {
  RingMem m(1024);
  RingProducer p(m.base, m.cap, 1);
  RingConsumer c(m.base, m.cap, 1);
  std::vector<uint8_t> payload(200, 0xAB);
  int pushed = 0;
  while (p.Push(Hdr(3, static_cast<uint32_t>(pushed), 200), payload.data())) ++pushed;
  EXPECT_EQ(pushed, 1024 / 240);  // 240 = RecordSpan(200)
  std::vector<uint8_t> scratch;
  FrameView f{};
  bool got = false;
  ASSERT_TRUE(c.Pop(&f, &scratch, &got).ok());
  ASSERT_TRUE(got);
  EXPECT_TRUE(p.Push(Hdr(3, 99, 200), payload.data()));
}

TEST(Ring, FramesWrapWithPadAndStayContiguous) {
  RingMem m(512);
  RingProducer p(m.base, m.cap, 1);
  RingConsumer c(m.base, m.cap, 1);
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
  RingProducer p(m.base, m.cap, 1);
  EXPECT_EQ(p.Reserve(512 - 40 + 1), nullptr);
  EXPECT_NE(p.Reserve(512 - 40), nullptr);
}

// Hostile producer: a published record that is not a valid frame is a kDataLoss, never a crash
// or an over-read; unpublished or stale bytes are simply not frames.
void Publish(uint8_t* data, uint64_t pos, uint32_t gen, const FrameHeader& h) {
  const uint64_t stamp = Stamp(gen, pos);
  std::memcpy(data + (pos & 2047), &stamp, 8);
  std::memcpy(data + (pos & 2047) + 8, &h, sizeof h);
}

TEST(Ring, HostileRecordsAreRejected) {
  struct Case {
    const char* name;
    void (*corrupt)(uint8_t* data);
  } cases[] = {
      {"garbage magic",
       [](uint8_t* d) {
         FrameHeader h = Hdr(3, 1, 0);
         h.magic = 0x5A5A5A5A;
         Publish(d, 0, 1, h);
       }},
      {"wrong version",
       [](uint8_t* d) {
         FrameHeader h = Hdr(3, 1, 0);
         h.version = 99;
         Publish(d, 0, 1, h);
       }},
      {"payload larger than kMaxPayload", [](uint8_t* d) { Publish(d, 0, 1, Hdr(3, 1, kMaxPayload + 1)); }},
      {"frame larger than half the ring", [](uint8_t* d) { Publish(d, 0, 1, Hdr(3, 1, 1500)); }},
      {"pad record at the start",
       [](uint8_t* d) {
         FrameHeader h = Hdr(3, 1, 0);
         h.magic = kPadMarker;
         Publish(d, 0, 1, h);
       }},
  };
  for (const auto& tc : cases) {
    RingMem m(2048);
    tc.corrupt(m.base + kRingCursorBytes);
    RingConsumer c(m.base, m.cap, 1);
    std::vector<uint8_t> scratch;
    FrameView f{};
    bool got = false;
    Status s = c.Pop(&f, &scratch, &got);
    EXPECT_EQ(s.code(), Code::kDataLoss) << tc.name << ": " << s.ToString();
    EXPECT_FALSE(got) << tc.name;
  }
}

TEST(Ring, FrameCrossingTheEndIsRejected) {
  RingMem m(2048);
  RingConsumer c(m.base, m.cap, 1, 2048 - 40);  // a consumer continuing near the end
  Publish(m.base + kRingCursorBytes, 2048 - 40, 1, Hdr(3, 1, 64));
  std::vector<uint8_t> scratch;
  FrameView f{};
  bool got = false;
  EXPECT_EQ(c.Pop(&f, &scratch, &got).code(), Code::kDataLoss);
}

TEST(Ring, UnpublishedAndStaleBytesAreNotFrames) {
  RingMem m(2048);
  uint8_t* d = m.base + kRingCursorBytes;
  std::mt19937 rng(7);
  for (uint32_t i = 0; i < 2048; ++i) d[i] = static_cast<uint8_t>(rng());
  Publish(d, 0, 1, Hdr(3, 1, 0));    // a record of generation 1 (an ended session)...
  RingConsumer c(m.base, m.cap, 2);  // ...is not a frame for generation 2
  std::vector<uint8_t> scratch;
  FrameView f{};
  bool got = true;
  EXPECT_TRUE(c.Pop(&f, &scratch, &got).ok());
  EXPECT_FALSE(got);
  Publish(d, 2048, 2, Hdr(3, 1, 0));  // the same offset one lap later is not position 0 either
  EXPECT_TRUE(c.Pop(&f, &scratch, &got).ok());
  EXPECT_FALSE(got);
  EXPECT_NE(Stamp(1, 0), Stamp(2, 0));
  EXPECT_NE(Stamp(1, 0), Stamp(1, 2048));
  EXPECT_NE(Stamp(0, 0), 0u);
}

TEST(Ring, ImpossibleConsumerCursorMarksTheProducerCorrupt) {
  RingMem m(1024);
  RingProducer p(m.base, m.cap, 1);
  std::vector<uint8_t> payload(200);
  while (p.Push(Hdr(3, 1, 200), payload.data())) {
  }
  EXPECT_FALSE(p.corrupt());  // merely full
  reinterpret_cast<RingCursors*>(m.base)->tail.store(0x40000004u);
  EXPECT_FALSE(p.Push(Hdr(3, 1, 200), payload.data()));
  EXPECT_TRUE(p.corrupt());
}

// Two threads, one producer one consumer, random frame sizes; every frame arrives once, in order,
// intact.
TEST(RingStress, TwoThreadsInOrderIntact) {
  RingMem m(1 << 14);
  constexpr uint32_t kFrames = 300000;
  std::thread producer([&] {
    RingProducer p(m.base, m.cap, 1);
    std::mt19937 rng(1);
    std::vector<uint8_t> payload(1024);
    for (uint32_t i = 0; i < kFrames; ++i) {
      const uint32_t len = static_cast<uint32_t>(rng() % 600);
      for (uint32_t k = 0; k < len; ++k) payload[k] = static_cast<uint8_t>(i + k);
      Backoff b(100, 10, 50);
      while (!p.Push(Hdr(3, i, len), payload.data())) b.Pause();
    }
  });
  RingConsumer c(m.base, m.cap, 1);
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
