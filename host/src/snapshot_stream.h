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

// The bytes of a snapshot, in order. Write returns false when the stream is broken (the move then
// fails; the source keeps its session).
class SnapshotWriter {
 public:
  virtual ~SnapshotWriter() = default;
  virtual bool Write(const void* data, size_t bytes) = 0;
};

// The bytes of a snapshot, in order. Read fills exactly `bytes` or returns false (the stream ended
// or broke).
class SnapshotReader {
 public:
  virtual ~SnapshotReader() = default;
  virtual bool Read(void* data, size_t bytes) = 0;
};

// A snapshot kept in memory.
class VectorWriter final : public SnapshotWriter {
 public:
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
