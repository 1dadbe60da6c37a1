// host/src/snapshot_chunks.h — device memory in a session's snapshot, a chunk at a time, each
// sent as it is, as "all zero", or lz4-compressed when that pays (live migration, issue #24;
// docs/design/migration.md, "Records of the snapshot").
//
// On the stream a chunk of n bytes (n ≤ kSnapshotChunk; the record says how many bytes of memory
// follow, so every chunk's n is known to both sides) is a ChunkHead, then `stored` bytes:
//   kRaw   stored == n, the bytes themselves;
//   kZero  stored == 0, every byte is zero;
//   kLz4   0 < stored < n, an LZ4 block (lz4's block format, LZ4_compress_default) of n bytes.
//
// "When it pays" (Compression::kWhenItPays, what a move uses): a zero chunk always goes as kZero;
// otherwise lz4 compresses a 64 KiB sample of the chunk first, and the whole chunk is compressed
// when the sample says that saves more time on the stream than compressing costs:
// (1 - ratio) x compression speed > the stream's speed, both measured as the move goes (the stream
// from the writes of earlier chunks). So random or already dense memory goes raw at the cost of the
// samples (about 1.5% of the bytes through lz4), and sparse or repetitive memory small.
//
//   ChunkEncoder enc(out);                        // one per snapshot: it learns the stream's speed
//   enc.Write(bytes, n);                          // false: the stream broke
//   ReadChunk(in, dst, n, &scratch, &why);        // false: broken or hostile, why says which
//
// Not thread-safe; one encoder per writer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "snapshot_stream.h"

namespace orion::host::detail {

inline constexpr uint64_t kSnapshotChunk = uint64_t{4} << 20;  // device memory moves in pieces of this size

enum class ChunkForm : uint32_t { kRaw = 0, kZero = 1, kLz4 = 2 };

struct ChunkHead {
  uint32_t form;    // ChunkForm
  uint32_t stored;  // bytes that follow on the stream
};

class ChunkEncoder {
 public:
  // `stream_ns_per_byte`: the stream's speed where it is known before anything was written (tests);
  // 0: learned from the writes.
  explicit ChunkEncoder(SnapshotWriter& out, double stream_ns_per_byte = 0)
      : out_(out), stream_ns_per_byte_(stream_ns_per_byte) {}
  // Writes n (1..kSnapshotChunk) bytes at `data` as one chunk. False when the stream broke.
  bool Write(const uint8_t* data, uint32_t n);

 private:
  // Whether compressing a chunk whose sample compressed to `ratio` (stored / sampled bytes) at
  // `ns_per_byte` saves time on this stream.
  bool Pays(double ratio, double ns_per_byte) const;
  bool Put(ChunkForm form, const void* stored, uint32_t bytes);

  SnapshotWriter& out_;
  std::vector<uint8_t> packed_;  // the compressed chunk (or sample)
  double stream_ns_per_byte_;    // the stream's measured speed; 0 until a large write was timed
  double lz4_ns_per_byte_ = 0;   // lz4's measured speed on this memory
};

// Reads one chunk of n (1..kSnapshotChunk) bytes from `in` into dst[0, n). `scratch` holds a
// compressed chunk between calls. False, with why, when the stream ended or the chunk is malformed
// (a form that does not exist, a size that does not match its form, an LZ4 block that does not
// decode to exactly n bytes): the stream is hostile input.
bool ReadChunk(SnapshotReader& in, uint8_t* dst, uint32_t n, std::vector<uint8_t>* scratch, std::string* why);

// Whether every one of the n bytes at p is zero.
bool AllZero(const uint8_t* p, size_t n);

}  // namespace orion::host::detail
