#include "orion/ivshmem/ring.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

#include <string>

namespace orion::ivshmem {
namespace {
inline std::atomic_ref<uint64_t> StampAt(uint8_t* data, uint64_t offset) noexcept {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(data + offset));
}
}  // namespace

RingProducer::RingProducer(uint8_t* ring, uint32_t capacity, uint32_t generation, uint64_t position) noexcept
    : cursors_(reinterpret_cast<RingCursors*>(ring)),
      data_(ring + kRingCursorBytes),
      capacity_(capacity),
      generation_(generation),
      pos_(position),
      tail_cache_(static_cast<uint32_t>(position)) {}

uint8_t* RingProducer::Reserve(uint32_t payload_len) noexcept {
  const uint32_t span = RecordSpan(payload_len);
  if (span > capacity_ / 2 || corrupt_) return nullptr;
  const uint32_t off = static_cast<uint32_t>(pos_) & (capacity_ - 1);
  const uint32_t to_end = capacity_ - off;
  const uint32_t need = span <= to_end ? span : to_end + span;  // pad to the end, then the record
  const auto head32 = static_cast<uint32_t>(pos_);
  if (capacity_ - (head32 - tail_cache_) < need) {
    // A1: acquire the consumer cursor; pairs with C1 in RingConsumer::Pop: its reads of the bytes
    // we are about to overwrite happened before. The value is the peer's and is checked.
    const uint32_t tail = cursors_->tail.load(std::memory_order_acquire);
    if (head32 - tail > capacity_ || (tail & 7u) != 0) {
      corrupt_ = true;
      return nullptr;
    }
    tail_cache_ = tail;
    if (capacity_ - (head32 - tail_cache_) < need) return nullptr;
  }
  if (span > to_end) {
    // Pad record: stamp, then a header whose magic is kPadMarker; the consumer skips to offset 0.
    const uint32_t marker = kPadMarker;
    std::memcpy(data_ + off + kStampBytes, &marker, sizeof marker);
    // P0: publishes the pad; pairs with C0.
    StampAt(data_, off).store(Stamp(generation_, pos_), std::memory_order_release);
    pos_ += to_end;
  }
  pending_at_ = pos_;
  return data_ + (static_cast<uint32_t>(pos_) & (capacity_ - 1)) + kStampBytes;
}

void RingProducer::Commit() noexcept {
  const uint8_t* h = data_ + (static_cast<uint32_t>(pending_at_) & (capacity_ - 1)) + kStampBytes;
  uint32_t payload_len;
  std::memcpy(&payload_len, h + offsetof(FrameHeader, payload_len), sizeof payload_len);
  // P1: publishes the record written after Reserve; pairs with C0 in RingConsumer::Pop.
  StampAt(data_, static_cast<uint32_t>(pending_at_) & (capacity_ - 1))
      .store(Stamp(generation_, pending_at_), std::memory_order_release);
  pos_ = pending_at_ + RecordSpan(payload_len);
  cursors_->head.store(static_cast<uint32_t>(pos_), std::memory_order_relaxed);  // diagnostics only
}

bool RingProducer::Push(const FrameHeader& h, const void* payload) noexcept {
  uint8_t* p = Reserve(h.payload_len);
  if (p == nullptr) return false;
  std::memcpy(p, &h, sizeof h);
  if (h.payload_len != 0) std::memcpy(p + sizeof h, payload, h.payload_len);
  Commit();
  return true;
}

bool RingProducer::Empty() const noexcept {
  return cursors_->tail.load(std::memory_order_acquire) == static_cast<uint32_t>(pos_);  // pairs with C1
}

RingConsumer::RingConsumer(uint8_t* ring, uint32_t capacity, uint32_t generation, uint64_t position) noexcept
    : cursors_(reinterpret_cast<RingCursors*>(ring)),
      data_(ring + kRingCursorBytes),
      capacity_(capacity),
      generation_(generation),
      pos_(position) {}

uint64_t RingConsumer::LoadStamp(uint64_t offset) const noexcept {
  // C0: acquire the stamp; pairs with P0/P1 in RingProducer: the record's bytes are visible.
  return StampAt(data_, offset).load(std::memory_order_acquire);
}

bool RingConsumer::HasData() const noexcept {
  return LoadStamp(static_cast<uint32_t>(pos_) & (capacity_ - 1)) == Stamp(generation_, pos_);
}

Status RingConsumer::Pop(FrameView* out, std::vector<uint8_t>* scratch, bool* got) noexcept {
  *got = false;
  uint32_t off = static_cast<uint32_t>(pos_) & (capacity_ - 1);
  if (LoadStamp(off) != Stamp(generation_, pos_)) return Status::Ok();
  uint32_t to_end = capacity_ - off;
  uint32_t marker;
  std::memcpy(&marker, data_ + off + kStampBytes, sizeof marker);
  if (marker == kPadMarker) {
    if (off == 0) return DataLoss("ring holds a pad record at its start");
    pos_ += to_end;
    off = 0;
    to_end = capacity_;
    if (LoadStamp(0) != Stamp(generation_, pos_)) {
      cursors_->tail.store(static_cast<uint32_t>(pos_), std::memory_order_release);  // C1 (see below)
      return Status::Ok();
    }
  }
  if (to_end < RecordSpan(0)) return DataLoss("ring record runs past the end of the ring");
  FrameHeader h;
  std::memcpy(&h, data_ + off + kStampBytes, sizeof h);  // the one read of the header
  if (h.magic != kFrameMagic) return DataLoss("frame has a bad magic");
  if (h.version != kProtocolVersion) {
    return DataLoss("frame protocol version " + std::to_string(h.version) + " is not " +
                    std::to_string(kProtocolVersion));
  }
  if (h.payload_len > kMaxPayload) {
    return DataLoss("frame payload of " + std::to_string(h.payload_len) + " bytes is too large");
  }
  const uint32_t span = RecordSpan(h.payload_len);
  if (span > to_end || span > capacity_ / 2) return DataLoss("frame runs past the end of the ring");
  if (scratch->size() < h.payload_len) scratch->resize(std::max<size_t>(h.payload_len, 256));
  if (h.payload_len != 0) {
    std::memcpy(scratch->data(), data_ + off + kStampBytes + sizeof h, h.payload_len);
  }
  pos_ += span;
  // C1: releases the record bytes we just copied; pairs with A1 in RingProducer::Reserve.
  cursors_->tail.store(static_cast<uint32_t>(pos_), std::memory_order_release);
  out->header = h;
  out->payload = scratch->data();
  *got = true;
  return Status::Ok();
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, uint32_t timeout_us) noexcept {
  timespec ts{static_cast<time_t>(timeout_us / 1000000), static_cast<long>(timeout_us % 1000000) * 1000};
  // Not FUTEX_PRIVATE: the word is in memory shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) noexcept {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

void Backoff::Pause() noexcept {
  if (n_ < spin_) {
    ++n_;
    CpuRelax();
    return;
  }
  if (n_ < spin_ + yields_) {
    ++n_;
    sched_yield();
    return;
  }
  timespec ts{0, static_cast<long>(sleep_us_) * 1000};
  nanosleep(&ts, nullptr);
  if (sleep_us_ < max_sleep_us_) sleep_us_ = std::min(max_sleep_us_, sleep_us_ * 2);
}

}  // namespace orion::ivshmem
