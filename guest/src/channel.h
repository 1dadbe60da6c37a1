// guest/src/channel.h — how the guest runtime moves frames: the rings of a shared-memory channel, a
// TCP connection to oriond, or an RDMA queue pair to it. The Client above is the same for all.
//
// Over TCP the data window is a private copy on each end (docs/spec/frames.md, "TCP"): Commit()
// sends a frame followed by the window bytes it reads; Pop() applies WindowData from oriond (the
// bytes a request wrote) to the local window before it returns the replies that follow them.
// Over RDMA the window is a private copy too, but registered: window ranges travel as RDMA WRITEs
// into the peer's copy, posted before the SEND of the frame (docs/spec/frames.md, "RDMA").
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "orion/common/frame.h"
#include "orion/common/status.h"
#include "orion/ivshmem/region.h"
#include "orion/ivshmem/ring.h"
#include "orion/rdma/endpoint.h"
#include "orion/tls/stream.h"

namespace orion::guest {

class FrameChannel {
 public:
  virtual ~FrameChannel() = default;
  // Room for a frame with `payload_len` payload bytes (header first), or nullptr if none now.
  virtual uint8_t* Reserve(uint32_t payload_len) noexcept = 0;
  // The same for a frame that wants a reply, which the caller waits for before it sends another
  // (shared memory: the sync slot, when the worker serves it and the payload fits).
  virtual uint8_t* ReserveCall(uint32_t payload_len) noexcept { return Reserve(payload_len); }
  // Publishes the reserved frame. False: the transport failed (the session is lost).
  virtual bool Commit() noexcept = 0;
  virtual Status Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) noexcept = 0;
  // Sends what is held back (network channels batch asynchronous frames). False: transport failed.
  virtual bool Flush() noexcept { return true; }
  // At exit, after the last Flush: waits (briefly) until what was sent has left this process.
  virtual void Close() noexcept {}
  // Blocks until oriond may have sent something, or `max_us` passes. False: this channel cannot
  // block (shared memory, RDMA): it returned at once, and the caller naps instead.
  virtual bool AwaitInput(uint32_t /*max_us*/) noexcept { return false; }
};

class ShmFrameChannel final : public FrameChannel {
 public:
  ShmFrameChannel(uint8_t* requests, uint32_t request_bytes, uint8_t* replies, uint32_t reply_bytes,
                  uint32_t generation) noexcept
      : requests_(requests, request_bytes, generation),
        replies_(replies, reply_bytes, generation),
        request_slot_(ivshmem::SyncSlotOf(requests)),
        reply_slot_(ivshmem::SyncSlotOf(replies)) {}
  // After a Welcome with kWelcomeSyncSlot: calls whose payload fits go through the sync slot.
  void UseSyncSlot() noexcept { slot_ = true; }
  uint8_t* Reserve(uint32_t payload_len) noexcept override {
    in_slot_ = false;
    return requests_.Reserve(payload_len);
  }
  uint8_t* ReserveCall(uint32_t payload_len) noexcept override {
    if (!slot_ || payload_len > ivshmem::kSyncSlotPayload) return Reserve(payload_len);
    in_slot_ = true;
    return reinterpret_cast<uint8_t*>(&request_slot_->header);
  }
  bool Commit() noexcept override {
    if (!in_slot_) {
      requests_.Commit();
      return true;
    }
    in_slot_ = false;
    call_ = ivshmem::NextSlotCall(call_);
    awaiting_ = true;
    // SS0: publishes the call (and every ring frame before it); pairs with SS1 in the worker.
    request_slot_->word.store((uint64_t{call_} << 32) | static_cast<uint32_t>(requests_.position()),
                              std::memory_order_release);
    return true;
  }
  Status Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) noexcept override;

 private:
  ivshmem::RingProducer requests_;
  ivshmem::RingConsumer replies_;
  ivshmem::SyncSlot* request_slot_;
  ivshmem::SyncSlot* reply_slot_;
  bool slot_ = false;      // the worker serves the sync slot
  bool in_slot_ = false;   // the reserved frame is the slot's
  bool awaiting_ = false;  // the last call went through the slot; its reply comes there
  uint32_t call_ = 0;      // the slot's last call number
};

// A TCP connection. It also owns the stand-ins for what a shared-memory region would give the
// Client: a channel descriptor (state ACTIVE while connected, DEAD after an error; server_done_seq =
// the last frame sent, whose staging bytes were copied into the socket) and a region header whose
// heartbeat moves while the connection is healthy.
class TcpFrameChannel final : public FrameChannel {
 public:
  // Connects to "host:port"; with `tls`, over TLS, verifying oriond against `tls_ca` (PEM; "": the
  // system's CAs) and the host's name or address. Errors name the address and the reason.
  static Result<std::unique_ptr<TcpFrameChannel>> Connect(const std::string& address, bool tls = false,
                                                          const std::string& tls_ca = "");
  ~TcpFrameChannel() override;
  // Lays out the data window once the server said how big the channel is (Welcome).
  bool SetWindow(uint64_t window_bytes) noexcept;
  // Takes `from`'s window, bytes and all (a session moved to another oriond: issue #24); `from`
  // has none after.
  void TakeWindow(TcpFrameChannel& from) noexcept {
    window_ = from.window_;
    window_bytes_ = from.window_bytes_;
    from.window_ = nullptr;
    from.window_bytes_ = 0;
  }
  // Takes the private mapping [p, p+bytes) as its window (a shared-memory session moving to TCP:
  // Client::PrivateWindowLocked made it), unmapped at destruction unless released first.
  void AdoptWindow(uint8_t* p, uint64_t bytes) noexcept {
    window_ = p;
    window_bytes_ = bytes;
  }
  // Gives the window up without unmapping it (the way back to shared memory).
  void ReleaseWindow() noexcept {
    window_ = nullptr;
    window_bytes_ = 0;
  }
  uint8_t* window() noexcept { return window_; }
  ivshmem::ChannelDesc* desc() noexcept { return &desc_; }
  ivshmem::RegionHeader* header() noexcept { return &header_; }
  const std::string& address() const noexcept { return address_; }
  int fd() const noexcept { return fd_; }
  // "TCP", or the TLS version and cipher (and whether kernel TLS took it).
  std::string Describe() const { return stream_->Describe(); }
  bool secure() const noexcept { return stream_->secure(); }
  // Bounds a message from oriond that has begun to arrive (a frame, or WindowData and its bytes): it
  // must be complete within `stall_ms` plus one second per MiB it announced, else the connection
  // fails (a server that stops, or drips a byte at a time, in the middle of a message). 0: no bound.
  void SetStallLimit(uint64_t stall_ms) noexcept { stall_ms_ = stall_ms; }
  // When bytes from oriond last arrived (a reply, WindowData, or a Keepalive, which oriond sends
  // every 250 ms while requests execute and it has sent nothing else), on the monotonic clock.
  uint64_t heard_ns() const noexcept { return heard_ns_; }
  // Why the connection failed ("" while it is healthy), for the log line that ends the session.
  const std::string& why() const noexcept { return why_; }
  // Hands the connection over (to an RDMA channel after its Welcome; plain TCP only), blocking
  // again; this channel is then unusable.
  int ReleaseFd() noexcept;

  uint8_t* Reserve(uint32_t payload_len) noexcept override;
  // Asynchronous frames that carry no window bytes are held back (up to kBatchBytes) and sent with
  // the next frame that wants a reply: over a network nothing the program can observe about them
  // (results, events, errors) bypasses such a frame.
  bool Commit() noexcept override;
  Status Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) noexcept override;
  bool Flush() noexcept override;
  // Sleeps in poll(2) on the socket: a reply wakes the client as a kernel wake-up would, not at
  // its next nap's end, and a long wait (a synchronize) costs no CPU.
  bool AwaitInput(uint32_t max_us) noexcept override;
  static constexpr size_t kBatchBytes = 64 * 1024;

 private:
  TcpFrameChannel(int fd, std::unique_ptr<tls::Stream> stream, std::string address) noexcept;
  // Reads into [p, p+len): > 0 bytes; 0 closed; kAgain (nothing now, when !wait); kError.
  ssize_t ReadSome(uint8_t* p, uint64_t len, bool wait) noexcept;
  // Sends all of [p, p+len), reading (and queueing) what oriond sends meanwhile, so neither side
  // can block the other with full socket buffers.
  bool Send(const uint8_t* p, uint64_t len) noexcept;
  // Reads what is available; applies WindowData, queues frames. False on a broken connection.
  bool Drain(bool wait) noexcept;
  // Checks the message in progress against the stall limit; false (and failed) past it.
  bool CheckStall() noexcept;
  // A WindowData header from oriond: accepted only for a range a request we sent writes.
  bool AcceptWindowData(const FrameHeader& h, const WindowDataHdr& d) noexcept;
  // A reply: the window bytes of its request must all have arrived if it succeeded.
  bool AcceptReply(const FrameHeader& h) noexcept;
  void Fail(std::string why) noexcept;

  int fd_;
  std::unique_ptr<tls::Stream> stream_;  // the connection's bytes: plain, or TLS
  std::string address_;
  std::string why_;
  uint64_t stall_ms_ = 30000;
  uint64_t msg_start_ns_ = 0;   // when the message in progress began (0: none)
  uint64_t heard_ns_ = 0;       // when bytes last arrived
  uint64_t pending_total_ = 0;  // bytes of the WindowData in progress, header included
  // Window ranges that requests we sent write and whose WindowData has not fully arrived, in order.
  struct Expected {
    uint32_t seq;
    uint64_t offset;
    uint64_t bytes;
  };
  std::deque<Expected> expected_;
  static constexpr size_t kMaxExpected = 65536;  // failed async copies never get theirs: bounded
  std::vector<uint8_t> out_;                     // the frame being built
  std::vector<uint8_t> batch_;                   // asynchronous frames not sent yet
  std::vector<uint8_t> in_;                      // received, not yet parsed
  std::vector<std::vector<uint8_t>> ready_;      // parsed frames (header + payload), in order
  uint64_t pending_data_ = 0;                    // WindowData bytes still to receive
  uint64_t pending_offset_ = 0;
  uint8_t* window_ = nullptr;
  uint64_t window_bytes_ = 0;
  ivshmem::ChannelDesc desc_{};
  ivshmem::RegionHeader header_{};
};

// An RDMA RC queue pair to oriond, set up after a Welcome that chose RDMA. The TCP connection of
// the Hello stays open as the liveness signal (oriond closing it ends the session). Like TCP it
// owns stand-ins for the region's channel descriptor and header; oriond RDMA-writes the seq of the
// last frame whose window bytes it consumed into the descriptor's server_done_seq (staging release).
class RdmaFrameChannel final : public FrameChannel {
 public:
  // Takes `fd` (closed on failure too), makes this end on `port` with a window of `window_bytes`,
  // sends `connect` (an RdmaConnect header) with our half and connects to oriond's half.
  static Result<std::unique_ptr<RdmaFrameChannel>> Connect(int fd, const rdma::Port& port, std::string address,
                                                           uint64_t window_bytes, const FrameHeader& connect);
  ~RdmaFrameChannel() override;
  uint8_t* window() noexcept { return window_; }
  ivshmem::ChannelDesc* desc() noexcept { return &desc_; }
  ivshmem::RegionHeader* header() noexcept { return &header_; }

  uint8_t* Reserve(uint32_t payload_len) noexcept override;
  // Asynchronous frames without window reads are batched into one SEND (up to kBatchBytes); a frame
  // that reads window bytes flushes the batch, then posts an RDMA WRITE per range and its SEND.
  bool Commit() noexcept override;
  Status Pop(ivshmem::FrameView* f, std::vector<uint8_t>* scratch, bool* got) noexcept override;
  bool Flush() noexcept override;
  void Close() noexcept override;
  static constexpr uint32_t kBatchBytes = 64 * 1024;
  static constexpr uint32_t kRecvSlots = 32;  // more than the 24 DtoH chunks a copy keeps in flight

 private:
  RdmaFrameChannel(int fd, std::string address) noexcept;
  // Room for `wrs` work requests and a free send buffer; false (and failed) when oriond is gone.
  bool Room(uint32_t wrs) noexcept;
  bool SocketAlive() noexcept;
  void Fail() noexcept;

  int fd_;
  std::string address_;
  std::unique_ptr<rdma::Endpoint> ep_;
  std::vector<uint8_t> out_;      // the frame being built
  uint32_t batch_len_ = 0;        // bytes of held-back frames in the current send buffer
  const uint8_t* msg_ = nullptr;  // the received message being taken apart
  uint32_t msg_len_ = 0;
  uint32_t at_ = 0;
  uint32_t idle_polls_ = 0;
  uint8_t* window_ = nullptr;
  uint64_t window_bytes_ = 0;
  ivshmem::ChannelDesc desc_{};
  ivshmem::RegionHeader header_{};
};

}  // namespace orion::guest
