#include "orion/ivshmem/ring.h"

#include <sched.h>
#include <time.h>

#include <string>

namespace orion::ivshmem {
namespace {
inline void CpuRelax() noexcept {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

RingProducer::RingProducer(uint8_t* ring, uint32_t capacity) noexcept
    : cursors_(reinterpret_cast<RingCursors*>(ring)),
      data_(ring + kRingCursorBytes),
      capacity_(capacity) {
  // P0: our own cursor; only we write it, so a relaxed load gives its latest value.
  head_ = cursors_->head.load(std::memory_order_relaxed);
  tail_cache_ = cursors_->tail.load(std::memory_order_acquire);  // pairs with C1
}

uint8_t* RingProducer::Reserve(uint32_t payload_len) noexcept {
  const uint32_t span = FrameSpan(payload_len);
  if (span > capacity_ / 2) return nullptr;
  const uint32_t pos = head_ & (capacity_ - 1);
  const uint32_t to_end = capacity_ - pos;
  const uint32_t need = span <= to_end ? span : to_end + span;  // pad to the end, then the frame
  if (capacity_ - (head_ - tail_cache_) < need) {
    // A1: acquire the consumer's cursor; pairs with C1 (release store in RingConsumer::Pop), so the
    // consumer's reads of the bytes we are about to overwrite happened before.
    tail_cache_ = cursors_->tail.load(std::memory_order_acquire);
    if (capacity_ - (head_ - tail_cache_) < need) return nullptr;
  }
  uint32_t at = head_;
  if (span > to_end) {
    const uint32_t marker = kPadMarker;
    std::memcpy(data_ + pos, &marker, sizeof(marker));
    at += to_end;
  }
  pending_ = at + span;
  return data_ + (at & (capacity_ - 1));
}

void RingProducer::Commit() noexcept {
  head_ = pending_;
  // P1: publishes the frame bytes written after Reserve; pairs with C0 in RingConsumer::Pop.
  cursors_->head.store(head_, std::memory_order_release);
}

bool RingProducer::Push(const FrameHeader& h, const void* payload) noexcept {
  uint8_t* p = Reserve(h.payload_len);
  if (p == nullptr) return false;
  std::memcpy(p, &h, sizeof(h));
  if (h.payload_len != 0) std::memcpy(p + sizeof(h), payload, h.payload_len);
  Commit();
  return true;
}

bool RingProducer::Empty() const noexcept {
  return cursors_->tail.load(std::memory_order_acquire) == head_;  // pairs with C1
}

RingConsumer::RingConsumer(uint8_t* ring, uint32_t capacity) noexcept
    : cursors_(reinterpret_cast<RingCursors*>(ring)),
      data_(ring + kRingCursorBytes),
      capacity_(capacity) {
  tail_ = cursors_->tail.load(std::memory_order_relaxed);  // our own cursor
}

bool RingConsumer::HasData() const noexcept {
  return cursors_->head.load(std::memory_order_acquire) != tail_;  // pairs with P1
}

Status RingConsumer::Pop(FrameView* out, std::vector<uint8_t>* scratch, bool* got) noexcept {
  *got = false;
  // C0: acquire the producer's cursor; pairs with P1 (release in RingProducer::Commit): the frame
  // bytes before it are visible. Loaded once; the value is hostile and checked here.
  const uint32_t head = cursors_->head.load(std::memory_order_acquire);
  uint32_t used = head - tail_;
  if (used == 0) return Status::Ok();
  if (used > capacity_ || (used & 7u) != 0) {
    return DataLoss("ring producer cursor is impossible (used " + std::to_string(used) +
                    " of " + std::to_string(capacity_) + ")");
  }
  uint32_t pos = tail_ & (capacity_ - 1);
  uint32_t to_end = capacity_ - pos;
  uint32_t marker;
  std::memcpy(&marker, data_ + pos, sizeof(marker));
  if (marker == kPadMarker && to_end < used) {
    // Skip the pad to the end of the ring.
    tail_ += to_end;
    used -= to_end;
    pos = 0;
    to_end = capacity_;
  }
  if (used < sizeof(FrameHeader) || to_end < sizeof(FrameHeader)) {
    return DataLoss("ring holds a truncated frame header");
  }
  FrameHeader h;
  std::memcpy(&h, data_ + pos, sizeof(h));  // the one read of the header
  if (h.magic != kFrameMagic) return DataLoss("frame has a bad magic");
  if (h.version != kProtocolVersion) {
    return DataLoss("frame protocol version " + std::to_string(h.version) + " is not " +
                    std::to_string(kProtocolVersion));
  }
  if (h.payload_len > kMaxPayload) {
    return DataLoss("frame payload of " + std::to_string(h.payload_len) + " bytes is too large");
  }
  const uint32_t span = FrameSpan(h.payload_len);
  if (span > used || span > to_end) return DataLoss("frame runs past the producer cursor");
  if (scratch->size() < h.payload_len) scratch->resize(std::max<size_t>(h.payload_len, 256));
  if (h.payload_len != 0) std::memcpy(scratch->data(), data_ + pos + sizeof(h), h.payload_len);
  tail_ += span;
  // C1: releases the slot bytes we just copied; pairs with A1 in RingProducer::Reserve.
  cursors_->tail.store(tail_, std::memory_order_release);
  out->header = h;
  out->payload = scratch->data();
  *got = true;
  return Status::Ok();
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
