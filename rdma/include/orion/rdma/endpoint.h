// orion/rdma/endpoint.h — one end of an RDMA RC queue pair carrying Orion frames (rdma-core
// ibverbs, loaded with dlopen: a machine without rdma-core, or without an RDMA device, gets a
// Status that says why, and its caller falls back to TCP).
//
// Both ends of a network session keep a private copy of the channel's data window. The endpoint
// registers that copy, a set of send buffers and a set of receive buffers; frames travel as SENDs
// (several frames may share one SEND: a batch), window ranges as RDMA WRITEs into the peer's copy
// at the same offset, posted before the SEND of the frame that needs them (RC ordering: the peer
// sees the SEND only after the WRITE's data is placed). docs/spec/frames.md, "RDMA".
//
//   auto port = rdma::FindPort(local_sockaddr);            // the device that owns our TCP address
//   auto ep = rdma::Endpoint::Create(*port, window, window_bytes, &done_word, 16);
//   RdmaConnectInfo mine = (*ep)->Local();                  // exchanged over the TCP socket
//   (*ep)->Connect(theirs);
//   uint8_t* b = (*ep)->SendBuffer(); ... (*ep)->PostSend(len);
//
// An Endpoint is used by one thread at a time (the guest's Client lock, or the session worker).
// Verbs resources are created in the process that uses them (oriond: in the forked worker).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <string>

#include "orion/common/frame.h"
#include "orion/common/status.h"

namespace orion::rdma {

// The largest SEND either end posts: a 64 KiB batch of frames, or one frame with its largest
// payload (32-byte header + kMaxPayload), with room to spare.
inline constexpr uint32_t kSlotBytes = 72 * 1024;
inline constexpr uint32_t kSendSlots = 8;

// A usable RDMA port: the device whose GID table holds the address a TCP connection uses.
struct Port {
  std::string device;  // "rxe0"
  uint8_t port = 1;
  int gid_index = -1;
  uint8_t gid[16] = {};
  uint32_t mtu = 1024;           // the port's active MTU in bytes; the path MTU is the smaller of both ends'
  std::string Describe() const;  // "rxe0 port 1 gid 1 (::ffff:10.9.0.1) mtu 4096"
};

// Whether libibverbs can be loaded; "" if so, else why not (for logs).
std::string VerbsUnavailableReason();

// The RDMA devices of this host, "rxe0, mlx5_0"; kUnavailable with the reason when there are none.
Result<std::string> ListDevices();

// The port whose GID table holds `local` (IPv4 as an IPv4-mapped GID, or IPv6), for RoCE; the
// local end of the TCP connection to the peer is the natural `local`. kUnavailable with the reason
// (no rdma-core, no device, no device with that address).
Result<Port> FindPort(const sockaddr* local);

class Endpoint {
 public:
  // Opens `port`'s device, registers `window` (remote-writable by the peer) and, if non-null,
  // `done_word` (8 bytes the peer writes its last executed seq into), makes `recv_slots` receive
  // buffers and kSendSlots send buffers, and an RC queue pair in INIT with the receives posted.
  static Result<std::unique_ptr<Endpoint>> Create(const Port& port, uint8_t* window, uint64_t window_bytes,
                                                  uint64_t* done_word, uint32_t recv_slots);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // This end's half of the exchange.
  RdmaConnectInfo Local() const;
  // Checks the peer's half (window size must be `window_bytes`, slots large enough) and moves the
  // queue pair to RTS. kDataLoss: the peer's info is impossible; kUnavailable: verbs refused.
  Status Connect(const RdmaConnectInfo& peer);

  // ---- Sending (all work requests are signaled; completions are retired by PollSend).
  // Room for `wrs` more work requests and a free current send buffer now.
  bool CanPost(uint32_t wrs) const;
  // The current send buffer (kSlotBytes); valid only while CanPost() holds for it.
  uint8_t* SendBuffer();
  // window[offset, +bytes) -> the peer's window at the same offset. The caller checked the range.
  Status PostWindowWrite(uint64_t offset, uint64_t bytes);
  // Writes `seq` into the peer's done word (inline: nothing to keep alive). No-op without one.
  Status PostDoneWrite(uint64_t seq);
  // SENDs the first `len` bytes of the current send buffer; the next buffer becomes current.
  Status PostSend(uint32_t len);
  // Retires send completions. kUnavailable when one failed (peer gone, queue pair in error).
  Status PollSend();
  // Work requests posted and not yet completed.
  uint32_t Outstanding() const;

  // ---- Receiving
  // A received message: its buffer and length; nullptr when none. kUnavailable on an error
  // completion (a peer that sent more than a slot, a broken queue pair).
  Status PollRecv(const uint8_t** data, uint32_t* len);
  // Whether a received message (or an error) is waiting, without taking it.
  Status PeekRecv(bool* any);
  // Gives the buffer of the message returned last back to the device.
  Status RepostLast();

  // ---- Blocking (oriond's idle worker): arm, re-check, then poll() on fd().
  int completion_fd() const;
  Status ArmRecv();
  void AckRecvEvent();

 private:
  struct Impl;
  explicit Endpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Text of a GID for logs: "::ffff:10.9.0.1" style for IPv4-mapped ones, else hex groups.
std::string GidText(const uint8_t gid[16]);

}  // namespace orion::rdma
