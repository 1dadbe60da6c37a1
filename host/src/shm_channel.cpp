// The session worker's shared-memory channel (a container's or a VM's region): the request and
// reply rings of one channel, its lease, and the idle waits (futex from a container client, the
// VM's ivshmem-doorbell eventfd, or naps). The TCP and RDMA channels are net_channel.cpp and
// rdma_channel.cpp.
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cstring>

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
    last_lease_ = desc_->client_lease.load(std::memory_order_relaxed);
    lease_changed_ = MonotonicMs();
  }
  uint8_t* window() override { return window_; }
  const ChannelLayout& layout() const override { return layout_; }
  Status Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) override {
    return requests_.Pop(f, scratch, got);
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
  Status Reply(const FrameHeader& h, const void* payload, uint32_t) override {
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
      if (!requests_.HasData()) {
        rung = ivshmem::WaitEventFd(bell_.get(), timeout_ms);
      } else {
        (void)ivshmem::DrainEventFd(bell_.get());  // a ring for what is already here
      }
      desc_->server_sleeping.store(0, std::memory_order_relaxed);
      if (!rung) {
        ++bell_timeouts_;
      } else if (requests_.HasData()) {
        ++bell_wakes_;
        spurious_streak_ = 0;
      } else {
        ++bell_spurious_;
        ++spurious_streak_;
      }
      return true;
    }
    const uint32_t word = desc_->doorbell.load(std::memory_order_acquire);
    if (!requests_.HasData()) {
      ivshmem::FutexWait(&desc_->doorbell, word, static_cast<uint32_t>(timeout_ms) * 1000u);
      ++futex_waits_;
    }
    desc_->server_sleeping.store(0, std::memory_order_relaxed);
    return true;
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
  ivshmem::RingConsumer requests_;
  ivshmem::RingProducer replies_;
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
