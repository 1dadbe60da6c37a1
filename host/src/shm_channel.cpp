// The session worker's shared-memory channel (a container's or a VM's region): the request and
// reply rings of one channel, its lease, and the idle waits (futex from a container client, the
// VM's ivshmem-doorbell eventfd, or naps). The TCP and RDMA channels are net_channel.cpp and
// rdma_channel.cpp.
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "orion/common/clock.h"
#include "orion/host/session.h"
#include "orion/ivshmem/doorbell.h"
#include "orion/ivshmem/ring.h"

namespace orion::host {
namespace {

using ivshmem::ChannelLayout;

class ShmSessionChannel final : public SessionChannel {
 public:
  ShmSessionChannel(uint8_t* region, uint64_t channel_bytes, uint32_t channel, uint32_t generation,
                    uint64_t request_position, uint64_t lease_timeout_ms, int doorbell_fd)
      : layout_(ChannelLayout::Compute(channel_bytes)), lease_timeout_ms_(lease_timeout_ms), bell_(doorbell_fd) {
    uint8_t* chan = ivshmem::ChannelBase(region, channel_bytes, channel);
    desc_ = &ivshmem::Header(region)->channels[channel];
    requests_ = ivshmem::RingConsumer(chan + layout_.request_ring_offset,
                                      static_cast<uint32_t>(layout_.request_ring_bytes), generation, request_position);
    replies_ = ivshmem::RingProducer(chan + layout_.reply_ring_offset, static_cast<uint32_t>(layout_.reply_ring_bytes),
                                     generation);
    window_ = chan + layout_.window_offset;
    request_slot_ = ivshmem::SyncSlotOf(chan + layout_.request_ring_offset);
    reply_slot_ = ivshmem::SyncSlotOf(chan + layout_.reply_ring_offset);
    last_lease_ = desc_->client_lease.load(std::memory_order_relaxed);
    lease_changed_ = MonotonicMs();
  }
  uint8_t* window() override { return window_; }
  const ChannelLayout& layout() const override { return layout_; }
  Status Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) override {
    from_slot_ = false;
    if (Status s = requests_.Pop(f, scratch, got); !s.ok() || *got || !slot_) return s;
    return PopSlot(f, scratch, got);
  }
  bool ServeSyncSlot() override {
    // Nothing of an earlier session on this channel is taken for a call: both lines start empty.
    request_slot_->word.store(0, std::memory_order_relaxed);
    reply_slot_->word.store(0, std::memory_order_release);
    slot_ = true;
    return true;
  }
  // Temporal slipping (FastForward, Giacomoni et al., PPoPP 2008): a consumer that polls the
  // record the producer is writing pulls that cache line across cores once per record, and the
  // producer pulls it back for the next one: a launch burst then runs at the speed of line
  // transfers (12.5 M/s here instead of 15 M/s: bench/orion_bench launches, 2-core VM). So after an
  // asynchronous frame taken the moment it was published, the worker waits (watching only the
  // client's head cursor, a line of its own) until the client is kSlipBytes ahead, or stops
  // writing, or kSlipPolls polls pass. Synchronous frames never wait: their client waits for the
  // reply and writes nothing meanwhile.
  static constexpr uint32_t kSlipBytes = 1024;
  static constexpr int kSlipPolls = 64;
  void Slip() override {
    uint32_t ahead = requests_.Ahead();
    for (int i = 0; i < kSlipPolls && ahead < kSlipBytes; ++i) {
      ivshmem::CpuRelax();
      const uint32_t now = requests_.Ahead();
      if (now == ahead) return;  // the client stopped writing: it waits for a reply, or is idle
      ahead = now;
    }
  }
  Status Done(const FrameHeader& req, const uint8_t*) override {
    // D0: releases the frame's staging bytes; pairs with S0 in Client::ReclaimLocked.
    desc_->server_done_seq.store(req.seq, std::memory_order_release);
    return Status::Ok();
  }
  Status Reply(const FrameHeader& h, const void* payload, uint32_t len) override {
    if (from_slot_) {
      // The answer to the sync slot's call: in the reply line when it fits, else the reply ring's
      // next record, which the line then points to.
      from_slot_ = false;
      if (len <= ivshmem::kSyncSlotPayload) {
        std::memcpy(&reply_slot_->header, &h, sizeof h);
        if (len != 0) std::memcpy(reply_slot_->payload, payload, len);
        // SS3: publishes the reply; pairs with SS2 in the client.
        reply_slot_->word.store((uint64_t{slot_call_} << 32) | ivshmem::kSlotReplyHere, std::memory_order_release);
        return Status::Ok();
      }
      if (Status s = PushReplyRecord(h, payload); !s.ok()) return s;
      ++slot_ring_replies_;
      reply_slot_->word.store((uint64_t{slot_call_} << 32) | ivshmem::kSlotReplyInRing, std::memory_order_release);
      return Status::Ok();
    }
    return PushReplyRecord(h, payload);
  }
  Status PushReplyRecord(const FrameHeader& h, const void* payload) {
    if (replies_.Push(h, payload)) return Status::Ok();  // the common case: no clock, no backoff
    ivshmem::Backoff backoff(1000, 100, 1000);
    const uint64_t start = MonotonicMs();
    while (!replies_.Push(h, payload)) {
      if (replies_.corrupt()) return DataLoss("the reply ring's consumer cursor is impossible");
      // The client is not draining its replies; give up when its lease has expired.
      if (MonotonicMs() - start > lease_timeout_ms_ * 4) return Unavailable("the client does not read its replies");
      backoff.Pause();
    }
    return Status::Ok();
  }
  std::string ClientGone(uint64_t now, uint64_t* seen, uint64_t* seen_ms) const override {
    const uint64_t lease = desc_->client_lease.load(std::memory_order_relaxed);
    if (lease != *seen || *seen_ms == 0) {
      *seen = lease;
      *seen_ms = now;
      return "";
    }
    return now - *seen_ms > lease_timeout_ms_
               ? "client lease expired (" + std::to_string(lease_timeout_ms_) + " ms without renewal)"
               : "";
  }
  Status Idle(uint64_t now) override {
    const uint64_t lease = desc_->client_lease.load(std::memory_order_relaxed);
    if (lease != last_lease_) {
      last_lease_ = lease;
      lease_changed_ = now;
    } else if (now - lease_changed_ > lease_timeout_ms_) {
      return Unavailable("client lease expired (" + std::to_string(lease_timeout_ms_) + " ms without renewal)");
    }
    return Status::Ok();
  }
  // Sleeps until the client rings, the way it says it can (client_rings: a futex on this kernel, or
  // the VM's ivshmem doorbell when oriond serves one for this channel); else the caller naps.
  bool WaitIdle(int timeout_ms) override {
    const uint32_t rings = desc_->client_rings.load(std::memory_order_relaxed);
    const bool bell = rings == ivshmem::kRingsIvshmem && bell_;
    if (!bell && rings != ivshmem::kRingsFutex) return false;
    if (bell && spurious_streak_ >= kStormStreak) {
      // Rings with nothing behind them, again and again: a storm from a hostile or broken guest.
      // Each costs this worker a wake-up; throttled to about a thousand a second.
      timespec ts{0, 1000000};
      nanosleep(&ts, nullptr);
      ++throttled_;
    }
    // B0: announce sleep with a full barrier, then look once more, so a frame published before the
    // client saw the flag is not slept through. Pairs with B1/B1s in the client's RingDoorbell.
    desc_->server_sleeping.exchange(1, std::memory_order_seq_cst);
    if (bell) {
      bool rung = false;
      if (!requests_.HasData() && !SlotCalled()) {
        rung = ivshmem::WaitEventFd(bell_.get(), timeout_ms);
      } else {
        (void)ivshmem::DrainEventFd(bell_.get());  // a ring for what is already here
      }
      desc_->server_sleeping.store(0, std::memory_order_relaxed);
      if (!rung) {
        ++bell_timeouts_;
      } else if (requests_.HasData() || SlotCalled()) {
        ++bell_wakes_;
        spurious_streak_ = 0;
      } else {
        ++bell_spurious_;
        ++spurious_streak_;
      }
      return true;
    }
    const uint32_t word = desc_->doorbell.load(std::memory_order_acquire);
    if (!requests_.HasData() && !SlotCalled()) {
      ivshmem::FutexWait(&desc_->doorbell, word, static_cast<uint32_t>(timeout_ms) * 1000u);
      ++futex_waits_;
    }
    desc_->server_sleeping.store(0, std::memory_order_relaxed);
    return true;
  }
  std::string SlotStats() const override {
    if (!slot_) return "";
    return std::to_string(slot_calls_) + " calls through the sync slot (" + std::to_string(slot_ring_replies_) +
           " answered through the reply ring)";
  }
  std::string WaitStats() const override {
    std::string s = "futex waits=" + std::to_string(futex_waits_);
    if (bell_) {
      s += ", ivshmem-doorbell wake-ups=" + std::to_string(bell_wakes_) +
           " spurious=" + std::to_string(bell_spurious_) + " throttled=" + std::to_string(throttled_) +
           " timeouts=" + std::to_string(bell_timeouts_);
    }
    return s;
  }
  void Serving() override {
    // W0: the session is served; pairs with the client's and the daemon's acquire loads.
    desc_->state.store(ivshmem::kChannelActive, std::memory_order_release);
  }
  void Closing(int32_t reason) override { desc_->close_reason.store(reason, std::memory_order_relaxed); }

 private:
  ChannelLayout layout_;
  uint64_t lease_timeout_ms_;
  ivshmem::ChannelDesc* desc_ = nullptr;
  // Whether the sync slot holds the next call (SS1: acquire; pairs with SS0 in the client: the
  // call's header and payload, and every ring frame published before it, are visible).
  bool SlotCalled() const { return slot_ && IsNextCall(request_slot_->word.load(std::memory_order_acquire)); }
  bool IsNextCall(uint64_t word) const {
    return static_cast<uint32_t>(word >> 32) == ivshmem::NextSlotCall(slot_call_);
  }
  // The sync slot's call, when the ring is empty (the ring's frames before it run first). Its
  // header is copied once and checked; a call that says the ring holds frames the ring does not
  // show, or that does not fit, ends the session.
  Status PopSlot(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) {
    const uint64_t word = request_slot_->word.load(std::memory_order_acquire);  // SS1
    if (!IsNextCall(word)) return Status::Ok();
    // Published before the word: a ring frame the first Pop missed is there now, and goes first.
    if (requests_.HasData()) return requests_.Pop(f, scratch, got);
    if (static_cast<uint32_t>(word) != static_cast<uint32_t>(requests_.position())) {
      return DataLoss("a sync slot call after ring position " + std::to_string(static_cast<uint32_t>(word)) +
                      ", which the request ring has not published (it is at " +
                      std::to_string(static_cast<uint32_t>(requests_.position())) + ")");
    }
    FrameHeader h;
    std::memcpy(&h, &request_slot_->header, sizeof h);  // the one read of the header
    if (h.magic != kFrameMagic || h.version != kProtocolVersion) {
      return DataLoss("a sync slot call with a bad magic or protocol version");
    }
    if (h.payload_len > ivshmem::kSyncSlotPayload) return DataLoss("a sync slot call longer than the slot");
    if ((h.flags & kFlagWantsReply) == 0) return DataLoss("a sync slot call that wants no reply");
    if (scratch->size() < ivshmem::kSyncSlotPayload) scratch->resize(256);
    std::memcpy(scratch->data(), request_slot_->payload, h.payload_len);
    slot_call_ = ivshmem::NextSlotCall(slot_call_);
    ++slot_calls_;
    from_slot_ = true;
    f->header = h;
    f->payload = scratch->data();
    *got = true;
    return Status::Ok();
  }

  ivshmem::RingConsumer requests_;
  ivshmem::RingProducer replies_;
  ivshmem::SyncSlot* request_slot_ = nullptr;
  ivshmem::SyncSlot* reply_slot_ = nullptr;
  bool slot_ = false;       // the client may call through the sync slot (ServeSyncSlot)
  bool from_slot_ = false;  // the frame Pop returned last is the slot's call: its reply goes there
  uint32_t slot_call_ = 0;  // the slot's last call taken
  uint64_t slot_calls_ = 0, slot_ring_replies_ = 0;
  uint8_t* window_ = nullptr;
  uint64_t last_lease_ = 0;
  uint64_t lease_changed_ = 0;
  static constexpr uint32_t kStormStreak = 16;  // spurious rings in a row that mean a storm
  ivshmem::UniqueFd bell_;                      // the VM's ivshmem-doorbell eventfd for this channel
  uint64_t bell_wakes_ = 0, bell_spurious_ = 0, bell_timeouts_ = 0, throttled_ = 0, futex_waits_ = 0;
  uint32_t spurious_streak_ = 0;
};

}  // namespace

bool PushReply(uint8_t* region, uint64_t channel_bytes, uint32_t channel, uint32_t generation,
               const FrameHeader& request, int32_t status, const void* payload, uint32_t payload_len) {
  const ChannelLayout l = ChannelLayout::Compute(channel_bytes);
  uint8_t* chan = ivshmem::ChannelBase(region, channel_bytes, channel);
  ivshmem::RingProducer rp(chan + l.reply_ring_offset, static_cast<uint32_t>(l.reply_ring_bytes), generation);
  return rp.Push(ReplyHeader(request, status, payload_len), payload);
}

std::unique_ptr<SessionChannel> MakeShmSessionChannel(uint8_t* region, uint64_t channel_bytes, uint32_t channel,
                                                      uint32_t generation, uint64_t request_position,
                                                      uint64_t lease_timeout_ms, int doorbell_fd) {
  return std::make_unique<ShmSessionChannel>(region, channel_bytes, channel, generation, request_position,
                                             lease_timeout_ms, doorbell_fd);
}

}  // namespace orion::host
