// host/src/snapshot_stream.h — where a session's snapshot goes and where a restore reads it from
// (live migration, issue #24; docs/design/migration.md). Session::Snapshot writes a sequence of
// records, Session::Restore reads them back: a byte stream in both directions, so that the same
// code serves a buffer in memory (tests, a move on one host) and, later, a TCP connection.
//
//   VectorWriter w;
//   if (!source.Snapshot(w, &why)) ...;              // refused: why says what cannot move
//   SpanReader r(w.bytes());
//   if (!target.Restore(r, &why)) ...;                // the stream is hostile input: why says what was wrong
//
// Not thread-safe; one writer and one reader per move.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace orion::host::detail {

// How device memory goes into a snapshot (snapshot_chunks.h): as it is (zero chunks too), lz4 where
// that saves time on the stream (what a move uses), or lz4 wherever it makes a chunk smaller.
enum class Compression { kOff, kWhenItPays, kAlways };

// What a snapshot's device memory became on the stream: chunks by form, and bytes.
struct ChunkCounts {
  uint64_t raw = 0, zero = 0, lz4 = 0;  // chunks
  uint64_t memory = 0, stored = 0;      // bytes of device memory, and what went on the stream for them
};

// The bytes of a snapshot, in order. Write returns false when the stream is broken (the move then
// fails; the source keeps its session).
class SnapshotWriter {
 public:
  explicit SnapshotWriter(Compression mode = Compression::kWhenItPays) : compression(mode) {}
  virtual ~SnapshotWriter() = default;
  virtual bool Write(const void* data, size_t bytes) = 0;

  const Compression compression;
  ChunkCounts chunks;  // kept by the snapshot's ChunkEncoders
};

// The bytes of a snapshot, in order. Read fills exactly `bytes` or returns false (the stream ended
// or broke).
class SnapshotReader {
 public:
  virtual ~SnapshotReader() = default;
  virtual bool Read(void* data, size_t bytes) = 0;
  // The manifest was prepared (a move's first record; session_snapshot.cpp): a network reader
  // tells the source, and then waits longer for the rest, which comes when the program pauses.
  // False when the source cannot be told.
  virtual bool Prepared() { return true; }
};

// A snapshot kept in memory.
class VectorWriter final : public SnapshotWriter {
 public:
  explicit VectorWriter(Compression mode = Compression::kWhenItPays) : SnapshotWriter(mode) {}
  bool Write(const void* data, size_t bytes) override {
    const auto* b = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), b, b + bytes);
    return true;
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// A snapshot read from memory the caller keeps alive.
class SpanReader final : public SnapshotReader {
 public:
  explicit SpanReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  bool Read(void* data, size_t bytes) override {
    if (bytes > bytes_.size() - at_) return false;
    if (bytes != 0) std::memcpy(data, bytes_.data() + at_, bytes);
    at_ += bytes;
    return true;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
};

}  // namespace orion::host::detail
