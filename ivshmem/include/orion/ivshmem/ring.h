// orion/ivshmem/ring.h — single-producer single-consumer ring of frames in shared memory.
//
// Layout at the ring's offset: a producer cursor line and a consumer cursor line (kCacheLine
// apart), then `capacity` bytes (a power of two, multiple of 8) of records. A record is an 8-byte
// stamp, then a FrameHeader and its payload, padded to 8 bytes. A frame never wraps: when one does
// not fit before the end, the producer writes a pad record (FrameHeader.magic == kPadMarker) and
// continues at offset 0.
//
// Publication: the producer writes the record, then stores its stamp with release. The stamp is
// Stamp(generation, position): the record's 64-bit byte position in the stream plus one, tagged
// with the channel's generation (bumped by oriond each time a channel is reset). The consumer polls
// the stamp it expects at its own position — one cache line per frame crosses cores, and the
// producer's cursor line never bounces. Stale bytes (an earlier lap, an earlier session) can never
// carry the expected stamp. The producer cursor (`head`) is written for diagnostics only and never
// read by the consumer; the consumer cursor (`tail`, low 32 bits of its position) is read by the
// producer to know how much room there is.
//
//   RingProducer p(ring_base, capacity, generation);     // client: request ring; server: reply ring
//   p.Push(header, payload);                              // false if no room now
//   RingConsumer c(ring_base, capacity, generation);
//   FrameView f; bool got; c.Pop(&f, &scratch, &got);     // copies the frame out, validates it
//
// The consumer treats everything the producer wrote as hostile: it copies the header out once,
// validates that copy, and never re-reads a checked field. A published record that is not a valid
// frame returns kDataLoss; the producer reports an impossible consumer cursor as corrupt(). Either
// way the session is torn down.
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
inline constexpr uint32_t kStampBytes = 8;

struct RingCursors {
  alignas(128) std::atomic<uint32_t> head;  // producer: low 32 bits of its position (diagnostics)
  uint8_t pad0[124];
  alignas(128) std::atomic<uint32_t> tail;  // consumer: low 32 bits of its position
  uint8_t pad1[124];
};
static_assert(sizeof(RingCursors) == kRingCursorBytes);

// The sync slot (docs/design/sync-slot.md): one line in each ring's cursor area that carries a
// synchronous call's request (in the request ring's) or its reply (in the reply ring's) when the
// payload fits, the same line for every such call, so the two sides meet on one line per
// direction as a bare ping-pong does (a record in the ring is several stores into a new line each
// time: 1.75x a bare ping-pong on this VM, bench/results/2026-11-29-null-call-ring-floor.txt). It
// lies in the second 64 bytes of the head cursor's block (RingCursors::pad0), which the ring never
// uses, so the channel's layout does not change. A client uses it only when the Welcome says the
// worker serves it (kWelcomeSyncSlot). The writer stores the header and payload, then `word` with
// release; the reader polls `word` alone, then copies and checks the rest (hostile input):
//   request: (call << 32) | low 32 bits of the request ring's position when the call was made
//            (every frame before it in the ring runs before it);
//   reply:   (call << 32) | kSlotReplyHere, or kSlotReplyInRing when the reply is the reply ring's
//            next record (published before the word).
// `call` counts 1, 2, ... from the Welcome, and skips 0 (an unused slot).
struct SyncSlot {
  std::atomic<uint64_t> word;
  FrameHeader header;
  uint8_t payload[24];
};
inline constexpr uint64_t kSyncSlotOffset = 64;  // from the ring's RingCursors
inline constexpr uint32_t kSyncSlotPayload = sizeof(SyncSlot::payload);
inline constexpr uint32_t kSlotReplyHere = 0;
inline constexpr uint32_t kSlotReplyInRing = 1;
// Within the head cursor's 128-byte block: the tail cursor's block starts at byte 128.
static_assert(sizeof(SyncSlot) == 64 && kSyncSlotOffset + sizeof(SyncSlot) <= 128);
inline SyncSlot* SyncSlotOf(uint8_t* ring) noexcept { return reinterpret_cast<SyncSlot*>(ring + kSyncSlotOffset); }
inline uint32_t NextSlotCall(uint32_t call) noexcept { return call + 1 == 0 ? 1 : call + 1; }

// The stamp of the record at byte `position` of a channel of `generation`. Never 0.
constexpr uint64_t Stamp(uint32_t generation, uint64_t position) noexcept {
  return (uint64_t{generation} << 48) | ((position + 1) & ((uint64_t{1} << 48) - 1));
}

// Bytes a frame with `payload_len` occupies in a ring: stamp + header + payload, rounded up to 8.
constexpr uint32_t RecordSpan(uint32_t payload_len) noexcept { return kStampBytes + FrameSpan(payload_len); }

class RingProducer {
 public:
  RingProducer() = default;
  // `ring` points at the RingCursors; `capacity` is the data size (power of two, multiple of 8),
  // known from the ChannelLayout, never read from shared memory. `position` is where the stream
  // continues (0 for a fresh channel).
  RingProducer(uint8_t* ring, uint32_t capacity, uint32_t generation, uint64_t position = 0) noexcept;

  // Reserves room for a frame with `payload_len` payload bytes and returns where to write its
  // FrameHeader (the payload follows it), or nullptr if there is no room now (or the consumer
  // cursor is impossible: see corrupt()). Commit() publishes it.
  uint8_t* Reserve(uint32_t payload_len) noexcept;
  void Commit() noexcept;
  // Reserve + copy + Commit.
  bool Push(const FrameHeader& h, const void* payload) noexcept;
  uint32_t capacity() const noexcept { return capacity_; }
  uint64_t position() const noexcept { return pos_; }
  // Whether the consumer has taken everything published.
  bool Empty() const noexcept;
  // The consumer cursor was seen at an impossible value (hostile or broken peer).
  bool corrupt() const noexcept { return corrupt_; }

 private:
  RingCursors* cursors_ = nullptr;
  uint8_t* data_ = nullptr;
  uint32_t capacity_ = 0;
  uint32_t generation_ = 0;
  uint64_t pos_ = 0;         // our position (we are its only writer)
  uint32_t tail_cache_ = 0;  // last consumer cursor seen
  uint64_t pending_at_ = 0;  // position of the reserved record
  bool corrupt_ = false;
};

struct FrameView {
  FrameHeader header;      // validated copy
  const uint8_t* payload;  // points into the caller's scratch buffer
};

class RingConsumer {
 public:
  RingConsumer() = default;
  RingConsumer(uint8_t* ring, uint32_t capacity, uint32_t generation, uint64_t position = 0) noexcept;

  // Pops one frame: copies header and payload into `scratch` (grown as needed) and releases the
  // ring space. Returns Ok with *got=false when no frame is published. Errors (kDataLoss): a
  // published record with a bad magic or version, payload_len > kMaxPayload, or a frame crossing
  // the end of the ring.
  Status Pop(FrameView* out, std::vector<uint8_t>* scratch, bool* got) noexcept;
  bool HasData() const noexcept;
  uint64_t position() const noexcept { return pos_; }
  // Bytes the producer says it has published past our position, from its head cursor (a line of
  // its own: reading it never disturbs the record lines). The peer's value: a hint for when to
  // poll, never used to read a record (the stamps alone say what is published).
  uint32_t Ahead() const noexcept {
    return cursors_->head.load(std::memory_order_relaxed) - static_cast<uint32_t>(pos_);
  }

 private:
  uint64_t LoadStamp(uint64_t offset) const noexcept;
  RingCursors* cursors_ = nullptr;
  uint8_t* data_ = nullptr;
  uint32_t capacity_ = 0;
  uint32_t generation_ = 0;
  uint64_t pos_ = 0;
};

// Shared futex on a word in the region (same kernel only). Wait returns after a wake-up, a value
// change or `timeout_us`; Wake wakes one waiter.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, uint32_t timeout_us) noexcept;
void FutexWake(std::atomic<uint32_t>* word) noexcept;

// One spin-wait step: the CPU's pause hint (x86 PAUSE, Arm YIELD).
inline void CpuRelax() noexcept {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Waiting: spin, then yield, then sleep with growing naps up to `max_sleep_us`. Call Pause() each
// time the awaited condition is false; Reset() when it became true.
class Backoff {
 public:
  explicit Backoff(uint32_t spin = 4000, uint32_t yields = 200, uint32_t max_sleep_us = 1000) noexcept
      : spin_(spin), yields_(yields), max_sleep_us_(max_sleep_us) {}
  void Pause() noexcept;
  void Reset() noexcept {
    n_ = 0;
    sleep_us_ = 1;
  }
  void set_max_sleep_us(uint32_t us) noexcept { max_sleep_us_ = us; }
  void set_spin(uint32_t spin) noexcept { spin_ = spin; }
  bool sleeping() const noexcept { return n_ >= spin_ + yields_; }

 private:
  uint32_t spin_, yields_, max_sleep_us_;
  uint32_t n_ = 0;
  uint32_t sleep_us_ = 1;
};

}  // namespace orion::ivshmem
