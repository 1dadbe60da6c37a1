// Device memory in a snapshot (snapshot_chunks.h): every chunk reads back as the bytes it was, in
// each form and each compression mode; the form follows from the bytes and, for "when it pays", from
// how fast the stream is; a malformed chunk is refused with a reason.
#include "snapshot_chunks.h"

#include <gtest/gtest.h>
#include <lz4.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

namespace orion::host::detail {
namespace {

constexpr uint32_t kN = static_cast<uint32_t>(kSnapshotChunk);

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

// Random 64-byte runs between zero runs: lz4 halves it, about.
std::vector<uint8_t> HalfRandom(size_t n, uint32_t seed) {
  std::vector<uint8_t> v = Random(n, seed);
  for (size_t i = 0; i < n; i += 128) std::memset(v.data() + i, 0, std::min<size_t>(64, n - i));
  return v;
}

// Writes `chunks` with one encoder, reads them back into memory holding garbage; returns what the
// stream said about them.
ChunkCounts RoundTrip(Compression mode, const std::vector<std::vector<uint8_t>>& chunks) {
  VectorWriter out(mode);
  ChunkEncoder enc(out);
  for (const auto& c : chunks) EXPECT_TRUE(enc.Write(c.data(), static_cast<uint32_t>(c.size())));
  SpanReader in(out.bytes());
  std::vector<uint8_t> scratch;
  std::string why;
  for (const auto& c : chunks) {
    std::vector<uint8_t> back(c.size(), 0xcd);
    EXPECT_TRUE(ReadChunk(in, back.data(), static_cast<uint32_t>(back.size()), &scratch, &why)) << why;
    EXPECT_EQ(back, c);
  }
  uint8_t more;
  EXPECT_FALSE(in.Read(&more, 1));  // nothing after the last chunk
  EXPECT_EQ(out.chunks.stored, out.bytes().size());
  return out.chunks;
}

TEST(SnapshotChunks, EveryFormReadsBackAsTheBytesItWas) {
  const std::vector<std::vector<uint8_t>> chunks = {std::vector<uint8_t>(kN, 0),
                                                    std::vector<uint8_t>(kN, 0x5a),
                                                    Random(kN, 1),
                                                    HalfRandom(kN, 2),
                                                    std::vector<uint8_t>(3, 0),
                                                    {7},
                                                    std::vector<uint8_t>(1000, 0x11)};
  uint64_t memory = 0;
  for (const auto& c : chunks) memory += c.size();

  const ChunkCounts off = RoundTrip(Compression::kOff, chunks);
  EXPECT_EQ(off.raw, chunks.size());
  EXPECT_EQ(off.memory, memory);
  EXPECT_EQ(off.stored, memory + chunks.size() * sizeof(ChunkHead));

  // Wherever lz4 makes a chunk smaller: the zero ones go as zero, random memory as it is.
  const ChunkCounts always = RoundTrip(Compression::kAlways, chunks);
  EXPECT_EQ(always.zero, 2u);
  EXPECT_EQ(always.raw, 2u);  // Random(kN) and the single byte
  EXPECT_EQ(always.lz4, 3u);
  EXPECT_LT(always.stored, memory / 2);

  // When it pays: zeros, then the first nonzero chunk before the stream was timed (the 0x5a one
  // halves and more, so it is compressed), then random memory as it is.
  const ChunkCounts pays = RoundTrip(Compression::kWhenItPays, chunks);
  EXPECT_EQ(pays.zero, 2u);
  EXPECT_GE(pays.lz4, 1u);
  EXPECT_EQ(pays.raw + pays.lz4 + pays.zero, chunks.size());
  EXPECT_EQ(pays.memory, memory);
}

TEST(SnapshotChunks, AZeroChunkOverFreshMemoryLeavesItUntouchedAndClearsAnyOther) {
  VectorWriter out;
  ChunkEncoder enc(out);
  const std::vector<uint8_t> zero(kN, 0);
  ASSERT_TRUE(enc.Write(zero.data(), kN));
  EXPECT_EQ(out.bytes().size(), sizeof(ChunkHead));  // nothing but the head on the stream
  std::vector<uint8_t> dirty(kN, 0xee), scratch;
  std::string why;
  SpanReader in(out.bytes());
  ASSERT_TRUE(ReadChunk(in, dirty.data(), kN, &scratch, &why)) << why;
  EXPECT_EQ(dirty, zero);
}

// A writer as slow as a 200 MB/s network.
class SlowWriter final : public SnapshotWriter {
 public:
  bool Write(const void* data, size_t bytes) override {
    std::this_thread::sleep_for(std::chrono::nanoseconds(5 * bytes));
    return kept_.Write(data, bytes);
  }
  const std::vector<uint8_t>& bytes() const { return kept_.bytes(); }

 private:
  VectorWriter kept_;
};

// A half-compressible chunk after a random one has timed the stream: compressed on a slow stream
// (lz4 is faster than the time it saves there); sent as it is on a stream known to run at 100 GB/s,
// where compressing costs more than it saves.
TEST(SnapshotChunks, WhenItPaysFollowsTheStreamsSpeed) {
  const std::vector<uint8_t> random = Random(kN, 3), half = HalfRandom(kN, 4);
  SlowWriter slow;
  ChunkEncoder learns(slow);
  ASSERT_TRUE(learns.Write(random.data(), kN));
  ASSERT_TRUE(learns.Write(half.data(), kN));
  EXPECT_EQ(slow.chunks.raw, 1u);
  EXPECT_EQ(slow.chunks.lz4, 1u);
  SpanReader in(slow.bytes());
  std::vector<uint8_t> back(kN), scratch;
  std::string why;
  ASSERT_TRUE(ReadChunk(in, back.data(), kN, &scratch, &why)) << why;
  EXPECT_EQ(back, random);
  ASSERT_TRUE(ReadChunk(in, back.data(), kN, &scratch, &why)) << why;
  EXPECT_EQ(back, half);

  VectorWriter fast;
  ChunkEncoder knows(fast, /*stream_ns_per_byte=*/0.01);
  ASSERT_TRUE(knows.Write(half.data(), kN));
  EXPECT_EQ(fast.chunks.raw, 1u);
  EXPECT_EQ(fast.chunks.lz4, 0u);
}

// One chunk on the stream: its head, then `body`.
std::vector<uint8_t> Chunk(uint32_t form, uint32_t stored, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> s(sizeof(ChunkHead) + body.size());
  const ChunkHead h{form, stored};
  std::memcpy(s.data(), &h, sizeof h);
  std::copy(body.begin(), body.end(), s.begin() + sizeof h);
  return s;
}

std::string ReadFails(const std::vector<uint8_t>& stream, uint32_t n) {
  SpanReader in(stream);
  std::vector<uint8_t> dst(n), scratch;
  std::string why;
  EXPECT_FALSE(ReadChunk(in, dst.data(), n, &scratch, &why));
  return why;
}

TEST(SnapshotChunks, AMalformedChunkIsRefusedWithAReason) {
  constexpr uint32_t n = 4096;
  const std::vector<uint8_t> raw(n, 1);
  std::vector<uint8_t> packed(static_cast<size_t>(LZ4_compressBound(n)));
  const int packed_bytes =
      LZ4_compress_default(reinterpret_cast<const char*>(raw.data()), reinterpret_cast<char*>(packed.data()), n,
                           static_cast<int>(packed.size()));
  ASSERT_GT(packed_bytes, 0);
  packed.resize(static_cast<size_t>(packed_bytes));
  const auto lz4 = static_cast<uint32_t>(ChunkForm::kLz4);
  // The well-formed one first: it decodes.
  {
    const std::vector<uint8_t> good = Chunk(lz4, static_cast<uint32_t>(packed.size()), packed);
    SpanReader in(good);
    std::vector<uint8_t> dst(n), scratch;
    std::string why;
    ASSERT_TRUE(ReadChunk(in, dst.data(), n, &scratch, &why)) << why;
    EXPECT_EQ(dst, raw);
  }
  EXPECT_EQ(ReadFails(Chunk(0, n - 1, raw), n), "a raw chunk of device memory stores 4095 bytes for a chunk of 4096");
  EXPECT_EQ(ReadFails(Chunk(1, 1, {0}), n), "a zero chunk of device memory stores 1 bytes for a chunk of 4096");
  EXPECT_EQ(ReadFails(Chunk(lz4, 0, {}), n), "a compressed chunk of device memory stores 0 bytes for a chunk of 4096");
  EXPECT_EQ(ReadFails(Chunk(lz4, n, raw), n),
            "a compressed chunk of device memory stores 4096 bytes for a chunk of 4096");
  // An LZ4 block of fewer bytes than the chunk, one of more, and one that is not LZ4.
  EXPECT_EQ(ReadFails(Chunk(lz4, static_cast<uint32_t>(packed.size()), packed), n + 1),
            "a compressed chunk of device memory does not decode to its 4097 bytes");
  EXPECT_EQ(ReadFails(Chunk(lz4, static_cast<uint32_t>(packed.size()), packed), n - 1),
            "a compressed chunk of device memory does not decode to its 4095 bytes");
  const std::vector<uint8_t> junk = Random(100, 5);
  EXPECT_EQ(ReadFails(Chunk(lz4, 100, junk), n),
            "a compressed chunk of device memory does not decode to its 4096 bytes");
  EXPECT_EQ(ReadFails(Chunk(3, 0, {}), n), "a chunk of device memory in a form that does not exist (3)");
  // Cut short: in the head, and in the bytes.
  EXPECT_EQ(ReadFails({1, 0, 0}, n), "the snapshot ended inside device memory");
  EXPECT_EQ(ReadFails(Chunk(0, n, std::vector<uint8_t>(n - 1, 1)), n), "the snapshot ended inside device memory");
  EXPECT_EQ(
      ReadFails(
          Chunk(lz4, static_cast<uint32_t>(packed.size()), std::vector<uint8_t>(packed.begin(), packed.end() - 1)), n),
      "the snapshot ended inside device memory");
}

TEST(SnapshotChunks, AllZeroJudgesEveryByte) {
  std::vector<uint8_t> v(kN, 0);
  EXPECT_TRUE(AllZero(v.data(), v.size()));
  EXPECT_TRUE(AllZero(v.data(), 0));
  for (size_t at : {size_t{0}, size_t{15}, size_t{16}, size_t{17}, size_t{kN / 2}, size_t{kN - 1}}) {
    v[at] = 1;
    EXPECT_FALSE(AllZero(v.data(), v.size())) << at;
    EXPECT_FALSE(AllZero(v.data() + at, 1)) << at;
    v[at] = 0;
  }
}

}  // namespace
}  // namespace orion::host::detail
