// hostile_client: talks to oriond without the guest runtime, the way a malicious or broken guest
// could, to check that oriond validates everything against the session's own tables and ends only
// the offending session.
//
//   hostile_client REGION bogus    # valid session; bogus handles, pointers, window offsets, quota
//   hostile_client REGION garbage  # random bytes in the request ring with an impossible cursor
//   hostile_client REGION unknown  # a well-formed frame with an unknown op
//   hostile_client REGION overflow # 2D copy / memset sizes whose span wraps around 2^64
//   hostile_client REGION slot     # a sync slot call (ring.h) answered there, then one after ring
//                                  # frames it says were published and were not
//   hostile_client REGION slotlen  # a sync slot call whose payload is longer than the slot
// Prints "RESULT <check> ok|FAIL ..." lines; exits 0 when oriond answered every check as expected.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda.h>

#include "orion/common/frame.h"
#include "orion/ivshmem/region.h"
#include "orion/ivshmem/ring.h"

using namespace orion;
using namespace orion::ivshmem;

namespace {

int g_failed = 0;
void Report(const std::string& name, bool ok, const std::string& detail = "") {
  std::printf("RESULT %s %s%s\n", name.c_str(), ok ? "ok" : "FAIL ", ok ? "" : detail.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failed;
}

void Expect(const std::string& name, int got, int want) {
  Report(name, got == want, "got " + std::to_string(got) + " want " + std::to_string(want));
}

struct Chan {
  RegionHeader* hdr;
  ChannelDesc* desc;
  ChannelLayout layout;
  uint8_t* base;
  RingProducer req;
  RingConsumer rep;
  std::vector<uint8_t> scratch;
  uint32_t seq = 1;
  bool stop_lease = false;
};

bool Claim(MappedRegion& r, Chan* c) {
  auto h = ValidateHeader(r.data(), r.size());
  if (!h.ok()) return false;
  c->hdr = Header(r.data());
  for (uint32_t i = 0; i < c->hdr->channel_count; ++i) {
    uint32_t expect = kChannelFree;
    if (c->hdr->channels[i].state.compare_exchange_strong(expect, kChannelClaimed)) {
      c->desc = &c->hdr->channels[i];
      c->layout = ChannelLayout::Compute(c->hdr->channel_bytes);
      c->base = ChannelBase(r.data(), c->hdr->channel_bytes, i);
      const uint32_t gen = c->desc->generation;
      c->req = RingProducer(c->base + c->layout.request_ring_offset,
                            static_cast<uint32_t>(c->layout.request_ring_bytes), gen);
      c->rep =
          RingConsumer(c->base + c->layout.reply_ring_offset, static_cast<uint32_t>(c->layout.reply_ring_bytes), gen);
      c->desc->client_lease.store(1);
      return true;
    }
  }
  return false;
}

// Sends a frame; when `wait`, returns the reply's status (and deferred status), or -1 on timeout.
int Send(Chan* c, Op op, const void* payload, uint32_t len, bool wait, int* deferred = nullptr,
         std::vector<uint8_t>* reply = nullptr, uint16_t raw_op = 0) {
  FrameHeader h = MakeFrameHeader(raw_op != 0 ? raw_op : static_cast<uint16_t>(op), c->seq++, len);
  h.flags = wait || op == Op::kNop ? kFlagWantsReply : 0;  // a Nop always asks for its reply
  if (!c->req.Push(h, payload)) return -2;
  if (!wait) return 0;
  for (int i = 0; i < 5000; ++i) {
    c->desc->client_lease.fetch_add(1);
    FrameView f{};
    bool got = false;
    if (!c->rep.Pop(&f, &c->scratch, &got).ok()) return -3;
    if (got) {
      if (deferred != nullptr) *deferred = f.header.deferred;
      if (reply != nullptr) reply->assign(f.payload, f.payload + f.header.payload_len);
      return f.header.status;
    }
    usleep(1000);
  }
  return -1;
}

bool WaitDead(Chan* c, int seconds) {
  for (int i = 0; i < seconds * 100; ++i) {
    if (c->desc->state.load() == kChannelDead) return true;
    c->desc->client_lease.fetch_add(1);
    usleep(10000);
  }
  return false;
}

bool Hello(Chan* c, uint16_t transports = 0, WelcomeRep* welcome = nullptr) {
  HelloReq hello{};
  hello.protocol_version = kProtocolVersion;
  hello.transports = transports;
  hello.vgpu_count = 1;
  hello.gmem_mib = 64;
  std::snprintf(hello.process_name, sizeof hello.process_name, "hostile");
  std::vector<uint8_t> rep;
  if (Send(c, Op::kHello, &hello, sizeof hello, true, nullptr, &rep) != 0 || rep.size() < sizeof(WelcomeRep))
    return false;
  if (welcome != nullptr) std::memcpy(welcome, rep.data(), sizeof *welcome);
  return true;
}

// A call through the sync slot: `len` payload bytes (the header says `claimed`), after ring position
// `after`; returns the reply's status, or -1 when none comes within 5 s.
int SlotCall(Chan* c, uint32_t call, Op op, const void* payload, uint32_t len, uint32_t claimed, uint32_t after) {
  SyncSlot* in = SyncSlotOf(c->base + c->layout.request_ring_offset);
  SyncSlot* out = SyncSlotOf(c->base + c->layout.reply_ring_offset);
  FrameHeader h = MakeFrameHeader(static_cast<uint16_t>(op), c->seq++, claimed);
  h.flags = kFlagWantsReply;
  std::memcpy(&in->header, &h, sizeof h);
  std::memcpy(in->payload, payload, std::min<uint32_t>(len, kSyncSlotPayload));
  in->word.store((uint64_t{call} << 32) | after, std::memory_order_release);
  if (c->desc->server_sleeping.load() != 0) {
    c->desc->doorbell.fetch_add(1);
    FutexWake(&c->desc->doorbell);
  }
  for (int i = 0; i < 5000; ++i) {
    c->desc->client_lease.fetch_add(1);
    const uint64_t w = out->word.load(std::memory_order_acquire);
    if (static_cast<uint32_t>(w >> 32) == call) {
      FrameHeader r;
      std::memcpy(&r, &out->header, sizeof r);
      return r.seq == h.seq && static_cast<uint32_t>(w) == kSlotReplyHere ? r.status : -4;
    }
    usleep(1000);
  }
  return -1;
}

uint64_t Handle(Chan* c, Op op, const void* q, uint32_t len) {
  std::vector<uint8_t> rep;
  if (Send(c, op, q, len, true, nullptr, &rep) != 0 || rep.size() < 8) return 0;
  uint64_t v;
  std::memcpy(&v, rep.data(), 8);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: hostile_client REGION bogus|garbage|unknown|cursor|overflow|batch|shape|slot|slotlen\n");
    return 2;
  }
  std::string path = argv[1];
  if (path == "ivshmem") {
    // Inside a VM: the Orion ivshmem device's BAR2 (PCI 1af4:1110).
    path.clear();
    for (int slot = 0; slot < 32 && path.empty(); ++slot) {
      char dev[64];
      std::snprintf(dev, sizeof dev, "/sys/bus/pci/devices/0000:00:%02x.0", slot);
      char vendor[16] = {}, device[16] = {};
      FILE* v = std::fopen((std::string(dev) + "/vendor").c_str(), "r");
      FILE* d = std::fopen((std::string(dev) + "/device").c_str(), "r");
      if (v != nullptr && d != nullptr && std::fgets(vendor, sizeof vendor, v) &&
          std::fgets(device, sizeof device, d) && std::strncmp(vendor, "0x1af4", 6) == 0 &&
          std::strncmp(device, "0x1110", 6) == 0) {
        path = std::string(dev) + "/resource2";
        if (FILE* e = std::fopen((std::string(dev) + "/enable").c_str(), "w")) {
          std::fputs("1", e);
          std::fclose(e);
        }
      }
      if (v != nullptr) std::fclose(v);
      if (d != nullptr) std::fclose(d);
    }
  }
  auto r = MappedRegion::Open(path);
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    return 2;
  }
  Chan c{};
  if (!Claim(*r, &c)) {
    std::fprintf(stderr, "no free channel\n");
    return 2;
  }
  const std::string mode = argv[2];
  if (mode == "garbage") {
    // Random bytes everywhere in the request ring, and a valid stamp on the first record so that
    // oriond takes it as published: the "frame" it finds is garbage.
    std::mt19937 rng(42);
    uint8_t* data = c.base + c.layout.request_ring_offset + kRingCursorBytes;
    for (uint64_t i = 0; i < c.layout.request_ring_bytes; ++i) data[i] = static_cast<uint8_t>(rng());
    const uint64_t stamp = Stamp(c.desc->generation, 0);
    std::memcpy(data, &stamp, sizeof stamp);
    Report("garbage_ends_session", WaitDead(&c, 10), "channel not closed");
    return g_failed == 0 ? 0 : 1;
  }
  WelcomeRep welcome{};
  const bool slot = mode == "slot" || mode == "slotlen";
  if (!Hello(&c, slot ? kTransportShm | kTransportSyncSlot : 0, &welcome)) {
    Report("hello", false, "no Welcome");
    return 1;
  }
  Report("hello", true);
  if (slot) {
    Report("welcome_serves_the_sync_slot", (welcome.features & kWelcomeSyncSlot) != 0);
    const auto at = static_cast<uint32_t>(c.req.position());
    Expect("a_call_through_the_slot", SlotCall(&c, 1, Op::kNop, nullptr, 0, 0, at), 0);
    if (mode == "slotlen") {
      uint8_t bytes[kSyncSlotPayload] = {};
      SlotCall(&c, 2, Op::kNop, bytes, sizeof bytes, 200, at);
    } else {
      SlotCall(&c, 2, Op::kNop, nullptr, 0, 0, at + 4096);  // ring frames that were never published
    }
    Report("a_lying_slot_call_ends_session", WaitDead(&c, 10), "channel not closed");
    return g_failed == 0 ? 0 : 1;
  }
  if (mode == "unknown") {
    Send(&c, Op::kNop, nullptr, 0, false, nullptr, nullptr, 999);
    Report("unknown_op_ends_session", WaitDead(&c, 10), "channel not closed");
    return g_failed == 0 ? 0 : 1;
  }
  if (mode == "cursor") {
    // Claim to have consumed replies that were never sent, then ask for replies without reading
    // them: when oriond runs short of reply room it reads our impossible cursor.
    auto* cur = reinterpret_cast<RingCursors*>(c.base + c.layout.reply_ring_offset);
    cur->tail.store(0x40000004u);
    for (int i = 0; i < 30000 && c.desc->state.load() != kChannelDead; ++i) {
      if (Send(&c, Op::kNop, nullptr, 0, false, nullptr, nullptr, 0) != 0) usleep(1000);
    }
    Report("impossible_cursor_ends_session", WaitDead(&c, 10), "channel not closed");
    return g_failed == 0 ? 0 : 1;
  }
  if (mode == "overflow") {
    // Sizes whose products wrap to 0 in 64 bits: (2^24 - 1) * 2^40 + 2^40 = 2^64. Unchecked, the
    // span check passes and the worker copies (or sets) a terabyte.
    DeviceReq dq{0, 0};
    Report("primary_ctx", Handle(&c, Op::kPrimaryCtxRetain, &dq, sizeof dq) != 0);
    MemAllocReq aq{1 << 20};
    const uint64_t dptr = Handle(&c, Op::kMemAlloc, &aq, sizeof aq);
    Report("alloc", dptr != 0);
    Memcpy2DReq q{};
    q.src = 0;
    q.src_side = kSideWindow;
    q.dst = 0;
    q.dst_side = kSideWindow;
    q.width_bytes = uint64_t{1} << 40;
    q.src_pitch = q.dst_pitch = uint64_t{1} << 40;
    q.height = uint64_t{1} << 24;
    Expect("memcpy2d_window_wrapping_span", Send(&c, Op::kMemcpy2D, &q, sizeof q, true), CUDA_ERROR_INVALID_VALUE);
    q.dst = dptr;
    q.dst_side = kSideDevice;
    Expect("memcpy2d_wrapping_span", Send(&c, Op::kMemcpy2D, &q, sizeof q, true), CUDA_ERROR_INVALID_VALUE);
    q.src = dptr;
    q.src_side = kSideDevice;
    Expect("memcpy2d_dtod_wrapping_span", Send(&c, Op::kMemcpy2D, &q, sizeof q, true), CUDA_ERROR_INVALID_VALUE);
    MemsetReq sq{dptr, uint64_t{1} << 38, uint64_t{1} << 24, uint64_t{1} << 40, 0, 0x55, 4};
    Expect("memset_wrapping_span", Send(&c, Op::kMemset, &sq, sizeof sq, true), CUDA_ERROR_INVALID_VALUE);
    MemsetReq wq{dptr, uint64_t{1} << 62, 1, 0, 0, 0x55, 4};  // width * 4 wraps to 0
    Expect("memset_wrapping_width", Send(&c, Op::kMemset, &wq, sizeof wq, true), CUDA_ERROR_INVALID_VALUE);
    MemcpyReq ok{dptr, 0, 64, 0};
    Report("session_still_serves", Send(&c, Op::kMemcpyHtoD, &ok, sizeof ok, true) == 0);
    uint8_t junk[3] = {1, 2, 3};
    Send(&c, Op::kMemAlloc, junk, sizeof junk, false);
    Report("malformed_payload_ends_session", WaitDead(&c, 10), "channel not closed");
    return g_failed == 0 ? 0 : 1;
  }
  if (mode == "shape") {
    // The checkpoint (ops.def's shapes): a request whose payload is not the length its op has ends
    // the session, whatever the op. Ops without a request were served with any bytes behind them
    // before (a Sync carrying 8 stray bytes was answered).
    uint64_t stray = 0x5555;
    Send(&c, Op::kSync, &stray, sizeof stray, false);
    Report("payload_on_an_op_without_one_ends_session", WaitDead(&c, 10), "channel not closed");
    return g_failed == 0 ? 0 : 1;
  }
  if (mode == "batch") {
    // A Batch frame (a graph launch): its entries run in order, a bad entry's error is deferred
    // and the next entries still run; an entry that is not batchable ends the session.
    DeviceReq bdq{0, 0};
    Report("primary_ctx", Handle(&c, Op::kPrimaryCtxRetain, &bdq, sizeof bdq) != 0);
    MemAllocReq baq{4096};
    const uint64_t buf = Handle(&c, Op::kMemAlloc, &baq, sizeof baq);
    Report("alloc", buf != 0);
    std::vector<uint8_t> batch;
    auto add = [&](Op op, const void* p, uint32_t n) {
      BatchEntry e{static_cast<uint16_t>(op), 0, n};
      const size_t at = batch.size();
      batch.resize(at + sizeof e + ((n + 7u) & ~7u), 0);
      std::memcpy(batch.data() + at, &e, sizeof e);
      std::memcpy(batch.data() + at + sizeof e, p, n);
    };
    MemsetReq first{buf, 1024, 1, 0, 0, 0x11111111u, 4};
    MemsetReq bogus{0xdead0000ull, 16, 1, 0, 0, 0, 4};
    MemsetReq last{buf, 16, 1, 0, 0, 0x22u, 1};
    add(Op::kMemset, &first, sizeof first);
    add(Op::kMemset, &bogus, sizeof bogus);
    add(Op::kMemset, &last, sizeof last);
    Send(&c, Op::kBatch, batch.data(), static_cast<uint32_t>(batch.size()), false);
    int deferred = 0;
    std::vector<uint8_t> got;
    MemcpyReq back{0, buf, 32, 0};
    const int st = Send(&c, Op::kMemcpyDtoH, &back, sizeof back, true, &deferred, &got);
    Report("batch_error_deferred", st == 0 && deferred == CUDA_ERROR_INVALID_VALUE,
           "deferred " + std::to_string(deferred));
    const uint8_t* w = c.base + c.layout.window_offset;
    Report("batch_entries_after_error_ran", w[0] == 0x22 && w[15] == 0x22 && w[16] == 0x11 && w[31] == 0x11,
           "window bytes not as the batch wrote them");
    batch.clear();
    MemAllocReq nested{64};
    add(Op::kMemAlloc, &nested, sizeof nested);  // not batchable: a protocol violation
    Send(&c, Op::kBatch, batch.data(), static_cast<uint32_t>(batch.size()), false);
    Report("unbatchable_entry_ends_session", WaitDead(&c, 10), "channel not closed");
    return g_failed == 0 ? 0 : 1;
  }
  // bogus: every request names something this session does not own.
  DeviceReq dq{0, 0};
  const uint64_t ctx = Handle(&c, Op::kPrimaryCtxRetain, &dq, sizeof dq);
  Report("primary_ctx", ctx != 0);
  int st = 0;
  MemFreeReq fq{0xdeadbeef000ull};
  Expect("free_bogus_pointer", Send(&c, Op::kMemFree, &fq, sizeof fq, true), CUDA_ERROR_INVALID_VALUE);
  MemAllocReq aq{1 << 20};
  const uint64_t dptr = Handle(&c, Op::kMemAlloc, &aq, sizeof aq);
  Report("alloc", dptr != 0);
  MemcpyReq mq{dptr + (1 << 20) - 8, 0, 16, 0};  // runs 8 bytes past the allocation
  Expect("htod_past_end", Send(&c, Op::kMemcpyHtoD, &mq, sizeof mq, true), CUDA_ERROR_INVALID_VALUE);
  MemcpyReq wq{dptr, c.layout.window_bytes - 4, 16, 0};  // source runs past the window
  Expect("htod_window_overflow", Send(&c, Op::kMemcpyHtoD, &wq, sizeof wq, true), CUDA_ERROR_INVALID_VALUE);
  MemcpyReq hq{0, 0xffffffffffff0000ull, 16, 0};  // DtoH from an address nobody allocated
  Expect("dtoh_bogus_pointer", Send(&c, Op::kMemcpyDtoH, &hq, sizeof hq, true), CUDA_ERROR_INVALID_VALUE);
  MemsetReq sq{dptr, uint64_t{1} << 62, 1, 0, 0, 0, 1};  // absurd width
  Expect("memset_absurd", Send(&c, Op::kMemset, &sq, sizeof sq, true), CUDA_ERROR_INVALID_VALUE);
  MemAllocReq big{uint64_t{1} << 40};
  Expect("alloc_over_quota", Send(&c, Op::kMemAlloc, &big, sizeof big, true), CUDA_ERROR_OUT_OF_MEMORY);
  ModuleSymbolReq gq{0x12340, 2, 0};
  uint8_t gbuf[sizeof gq + 2];
  std::memcpy(gbuf, &gq, sizeof gq);
  gbuf[sizeof gq] = 'f';
  gbuf[sizeof gq + 1] = 0;
  Expect("bogus_module", Send(&c, Op::kModuleGetFunction, gbuf, sizeof gbuf, true), CUDA_ERROR_INVALID_HANDLE);
  HandleReq bogus_stream{0x77777};
  Expect("bogus_stream", Send(&c, Op::kStreamSynchronize, &bogus_stream, sizeof bogus_stream, true),
         CUDA_ERROR_INVALID_HANDLE);
  // CUDA arrays and texture objects: extents, formats, handles and boxes are all checked.
  ArrayCreateReq huge_arr{uint64_t{1} << 40, 1, 1, CU_AD_FORMAT_FLOAT, 4, 0, 0};
  Expect("array_absurd_extent", Send(&c, Op::kArrayCreate, &huge_arr, sizeof huge_arr, true), CUDA_ERROR_INVALID_VALUE);
  ArrayCreateReq quota_arr{16384, 16384, 16, CU_AD_FORMAT_FLOAT, 4, 0, 0};  // 64 GiB
  Expect("array_over_quota", Send(&c, Op::kArrayCreate, &quota_arr, sizeof quota_arr, true), CUDA_ERROR_OUT_OF_MEMORY);
  ArrayCreateReq odd_arr{16, 16, 0, 0x7777, 1, 0, 0};
  Expect("array_unknown_format", Send(&c, Op::kArrayCreate, &odd_arr, sizeof odd_arr, true), CUDA_ERROR_NOT_SUPPORTED);
  ArrayCreateReq small_arr{16, 16, 0, CU_AD_FORMAT_FLOAT, 1, 0, 0};
  const uint64_t arr = Handle(&c, Op::kArrayCreate, &small_arr, sizeof small_arr);
  Report("array", arr != 0);
  ArrayCopyReq box{};
  box.src = dptr;
  box.src_pitch = 64;
  box.dst = arr;
  box.dst_side = kSideArray;
  box.dst_x = 60;  // 60 + 8 bytes runs past the 64-byte row
  box.width_bytes = 8;
  box.height = 1;
  Expect("array_box_past_row", Send(&c, Op::kMemcpyArray, &box, sizeof box, true), CUDA_ERROR_INVALID_VALUE);
  box.dst_x = 0;
  box.dst_y = 15;
  box.height = 2;  // past the last row
  Expect("array_box_past_rows", Send(&c, Op::kMemcpyArray, &box, sizeof box, true), CUDA_ERROR_INVALID_VALUE);
  box.dst_y = 0;
  box.dst = 0x55550;  // not an array of this session
  Expect("array_bogus_handle", Send(&c, Op::kMemcpyArray, &box, sizeof box, true), CUDA_ERROR_INVALID_VALUE);
  box.dst = arr;
  box.dst_side = 7;
  Expect("array_bogus_side", Send(&c, Op::kMemcpyArray, &box, sizeof box, true), CUDA_ERROR_INVALID_VALUE);
  TexObjectReq tq{};
  tq.res_type = CU_RESOURCE_TYPE_LINEAR;
  tq.res = dptr + (1 << 20) - 64;  // 64 bytes left, 1024 asked for
  tq.format = CU_AD_FORMAT_FLOAT;
  tq.channels = 1;
  tq.width = 256;
  Expect("texture_past_allocation", Send(&c, Op::kTexObjectCreate, &tq, sizeof tq, true), CUDA_ERROR_INVALID_VALUE);
  tq.res_type = CU_RESOURCE_TYPE_ARRAY;
  tq.res = arr;
  tq.surface = 1;  // the array was not made for surface load/store
  Expect("surface_without_ldst", Send(&c, Op::kTexObjectCreate, &tq, sizeof tq, true), CUDA_ERROR_INVALID_VALUE);
  ObjectReq oq{12345, 0, 0};
  Expect("texture_bogus_destroy", Send(&c, Op::kTexObjectDestroy, &oq, sizeof oq, true), CUDA_ERROR_INVALID_VALUE);
  MipmapCreateReq mq_many{{16, 16, 0, CU_AD_FORMAT_FLOAT, 1, 0, 0}, 6, 0};  // a 16x16 array has 5 levels
  Expect("mipmap_too_many_levels", Send(&c, Op::kMipmappedArrayCreate, &mq_many, sizeof mq_many, true),
         CUDA_ERROR_INVALID_VALUE);
  MipmapCreateReq mq_ok{{16, 16, 0, CU_AD_FORMAT_FLOAT, 1, 0, 0}, 5, 0};
  const uint64_t mip = Handle(&c, Op::kMipmappedArrayCreate, &mq_ok, sizeof mq_ok);
  Report("mipmap", mip != 0);
  MipmapLevelReq mlq{mip, 5, 0};
  Expect("mipmap_level_past_end", Send(&c, Op::kMipmappedArrayGetLevel, &mlq, sizeof mlq, true),
         CUDA_ERROR_INVALID_VALUE);
  mlq.level = 4;
  const uint64_t level = Handle(&c, Op::kMipmappedArrayGetLevel, &mlq, sizeof mlq);
  HandleReq lvq{level};
  Expect("mipmap_level_not_destroyable", Send(&c, Op::kArrayDestroy, &lvq, sizeof lvq, true),
         CUDA_ERROR_INVALID_HANDLE);
  HandleReq mdq{mip};
  Report("mipmap_destroy", Send(&c, Op::kMipmappedArrayDestroy, &mdq, sizeof mdq, true) == 0);
  ArrayCopyReq lbox{};
  lbox.src = dptr;
  lbox.src_pitch = 4;
  lbox.dst = level;  // its mipmapped array is gone
  lbox.dst_side = kSideArray;
  lbox.width_bytes = 4;
  lbox.height = 1;
  Expect("destroyed_mipmap_level_refused", Send(&c, Op::kMemcpyArray, &lbox, sizeof lbox, true),
         CUDA_ERROR_INVALID_VALUE);
  HandleReq aq2{arr};
  Report("array_destroy", Send(&c, Op::kArrayDestroy, &aq2, sizeof aq2, true) == 0);
  Expect("array_destroy_twice", Send(&c, Op::kArrayDestroy, &aq2, sizeof aq2, true), CUDA_ERROR_INVALID_HANDLE);
  // An asynchronous launch of a function that does not exist: reported as deferred at the next reply.
  uint8_t lbuf[sizeof(LaunchReq)] = {};
  LaunchReq lq{};
  lq.function = 0x99990;
  lq.grid[0] = lq.grid[1] = lq.grid[2] = 1;
  lq.block[0] = lq.block[1] = lq.block[2] = 1;
  std::memcpy(lbuf, &lq, sizeof lq);
  Send(&c, Op::kLaunchKernel, lbuf, sizeof lbuf, false);
  int deferred = 0;
  st = Send(&c, Op::kNop, nullptr, 0, true, &deferred);
  Report("bogus_launch_deferred", st == 0 && deferred == CUDA_ERROR_INVALID_HANDLE,
         "status " + std::to_string(st) + " deferred " + std::to_string(deferred));
  // The session still works after all that.
  MemcpyReq ok{dptr, 0, 64, 0};
  Report("session_still_serves", Send(&c, Op::kMemcpyHtoD, &ok, sizeof ok, true) == 0);
  // A payload of the wrong size is a protocol violation: the session ends.
  uint8_t junk[3] = {1, 2, 3};
  Send(&c, Op::kMemAlloc, junk, sizeof junk, false);
  Report("malformed_payload_ends_session", WaitDead(&c, 10), "channel not closed");
  return g_failed == 0 ? 0 : 1;
}
