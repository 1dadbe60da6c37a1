// orion/ivshmem/ring.h — single-producer single-consumer ring of frames in shared memory.
//
// Layout at the ring's offset: a producer cursor line, a consumer cursor line (kCacheLine apart),
// then `capacity` bytes (a power of two, multiple of 8). Cursors are free-running uint32 byte
// counts: used = head - tail (mod 2^32) is always in [0, capacity]; a slot's position is
// cursor & (capacity - 1). A frame never wraps: when it does not fit before the end, the producer
// writes a 4-byte kPadMarker and continues at position 0 (the pad counts as used bytes).
//
//   RingProducer p(ring_base, capacity);           // client: request ring; server: reply ring
//   p.Push(header, payload, payload_len);          // false if no space now
//   RingConsumer c(ring_base, capacity);
//   FrameView f; c.Pop(&f, scratch);               // copies the frame out, validates it
//
// The consumer treats everything the producer wrote as hostile: it loads the producer cursor once
// per Pop, checks it, copies the header out once and validates that copy, and never re-reads a
// checked field. A violation returns kDataLoss: the session is torn down.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "orion/common/frame.h"
#include "orion/common/status.h"

namespace orion::ivshmem {

inline constexpr uint32_t kPadMarker = 0x44415021u;  // "!PAD"
inline constexpr uint64_t kRingCursorBytes = 256;    // two kCacheLine cursor lines before the data

struct RingCursors {
  alignas(128) std::atomic<uint32_t> head;  // written by the producer only
  uint8_t pad0[124];
  alignas(128) std::atomic<uint32_t> tail;  // written by the consumer only
  uint8_t pad1[124];
};
static_assert(sizeof(RingCursors) == kRingCursorBytes);

class RingProducer {
 public:
  RingProducer() = default;
  // `ring` points at the RingCursors; `capacity` is the data size (power of two, multiple of 8),
  // known from the ChannelLayout, never read from shared memory.
  RingProducer(uint8_t* ring, uint32_t capacity) noexcept;

  // Reserves room for a frame with `payload_len` payload bytes and returns where to write the
  // header (the payload follows it), or nullptr if there is no room now. Commit() publishes it.
  uint8_t* Reserve(uint32_t payload_len) noexcept;
  void Commit() noexcept;
  // Reserve + copy + Commit.
  bool Push(const FrameHeader& h, const void* payload) noexcept;
  // Bytes that could be reserved right now (largest payload that fits, ignoring wrap).
  uint32_t capacity() const noexcept { return capacity_; }
  bool Empty() const noexcept;

 private:
  RingCursors* cursors_ = nullptr;
  uint8_t* data_ = nullptr;
  uint32_t capacity_ = 0;
  uint32_t head_ = 0;         // local copy of the producer cursor (we are its only writer)
  uint32_t tail_cache_ = 0;   // last tail seen
  uint32_t pending_ = 0;      // head after the reserved frame
};

struct FrameView {
  FrameHeader header;          // validated copy
  const uint8_t* payload;      // points into the caller's scratch buffer
};

class RingConsumer {
 public:
  RingConsumer() = default;
  RingConsumer(uint8_t* ring, uint32_t capacity) noexcept;

  // Pops one frame: copies header and payload into `scratch` (resized as needed) and releases the
  // ring space. Returns Ok with *got=false when the ring is empty. Errors (kDataLoss): impossible
  // cursor, bad magic or version, payload_len > kMaxPayload, frame crossing the end of the ring.
  Status Pop(FrameView* out, std::vector<uint8_t>* scratch, bool* got) noexcept;
  bool HasData() const noexcept;

 private:
  RingCursors* cursors_ = nullptr;
  uint8_t* data_ = nullptr;
  uint32_t capacity_ = 0;
  uint32_t tail_ = 0;          // local copy of the consumer cursor
};

// Waiting: spin, then yield, then sleep with growing naps up to `max_sleep_us`. Call Pause() each
// time the awaited condition is false; Reset() when it became true.
class Backoff {
 public:
  explicit Backoff(uint32_t spin = 4000, uint32_t yields = 200, uint32_t max_sleep_us = 1000) noexcept
      : spin_(spin), yields_(yields), max_sleep_us_(max_sleep_us) {}
  void Pause() noexcept;
  void Reset() noexcept { n_ = 0; sleep_us_ = 1; }
  bool sleeping() const noexcept { return n_ >= spin_ + yields_; }

 private:
  uint32_t spin_, yields_, max_sleep_us_;
  uint32_t n_ = 0;
  uint32_t sleep_us_ = 1;
};

}  // namespace orion::ivshmem
