// RDMA endpoint over ibverbs, loaded with dlopen (the guest runtime must run where rdma-core is
// absent; oriond must start on hosts without RDMA). Only exported libibverbs functions are looked
// up; the data-path calls (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) are
// header inlines that go through the context's provider ops.
#include "orion/rdma/endpoint.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <vector>

namespace orion::rdma {
namespace {

struct Verbs {
  ibv_device** (*get_device_list)(int*);
  void (*free_device_list)(ibv_device**);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  int (*close_device)(ibv_context*);
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int);
  int (*dereg_mr)(ibv_mr*);
  ibv_comp_channel* (*create_comp_channel)(ibv_context*);
  int (*destroy_comp_channel)(ibv_comp_channel*);
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroy_cq)(ibv_cq*);
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**);
  void (*ack_cq_events)(ibv_cq*, unsigned int);
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
  int (*destroy_qp)(ibv_qp*);
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*);
  // The exported ibv_query_port takes the older, shorter attribute struct (the header's inline
  // wrapper passes a zeroed ibv_port_attr the same way); only its leading fields are used here.
  int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*);
};

std::once_flag g_once;
Verbs g_verbs{};
std::string g_why;  // "" when g_verbs is usable

void Load() {
  void* h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    g_why = std::string("libibverbs.so.1 cannot be loaded (rdma-core is not installed?)") +
            (e ? std::string(": ") + e : "");
    return;
  }
  bool ok = true;
  auto sym = [&](auto& fn, const char* name) {
    void* p = dlsym(h, name);
    if (p == nullptr) ok = false;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  sym(g_verbs.get_device_list, "ibv_get_device_list");
  sym(g_verbs.free_device_list, "ibv_free_device_list");
  sym(g_verbs.get_device_name, "ibv_get_device_name");
  sym(g_verbs.open_device, "ibv_open_device");
  sym(g_verbs.close_device, "ibv_close_device");
  sym(g_verbs.alloc_pd, "ibv_alloc_pd");
  sym(g_verbs.dealloc_pd, "ibv_dealloc_pd");
  sym(g_verbs.reg_mr, "ibv_reg_mr");
  sym(g_verbs.dereg_mr, "ibv_dereg_mr");
  sym(g_verbs.create_comp_channel, "ibv_create_comp_channel");
  sym(g_verbs.destroy_comp_channel, "ibv_destroy_comp_channel");
  sym(g_verbs.create_cq, "ibv_create_cq");
  sym(g_verbs.destroy_cq, "ibv_destroy_cq");
  sym(g_verbs.get_cq_event, "ibv_get_cq_event");
  sym(g_verbs.ack_cq_events, "ibv_ack_cq_events");
  sym(g_verbs.create_qp, "ibv_create_qp");
  sym(g_verbs.destroy_qp, "ibv_destroy_qp");
  sym(g_verbs.modify_qp, "ibv_modify_qp");
  sym(g_verbs.query_gid, "ibv_query_gid");
  sym(g_verbs.query_port, "ibv_query_port");
  if (!ok) g_why = "libibverbs.so.1 lacks a needed function (too old?)";
}

const Verbs* V(std::string* why) {
  std::call_once(g_once, Load);
  if (!g_why.empty()) {
    if (why != nullptr) *why = g_why;
    return nullptr;
  }
  return &g_verbs;
}

// The GID an address has on a RoCE port: IPv4 as IPv4-mapped, IPv6 as is.
bool AddressGid(const sockaddr* a, uint8_t gid[16]) {
  std::memset(gid, 0, 16);
  if (a->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a);
    gid[10] = gid[11] = 0xff;
    std::memcpy(gid + 12, &in->sin_addr, 4);
    return true;
  }
  if (a->sa_family == AF_INET6) {
    std::memcpy(gid, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, 16);
    return true;
  }
  return false;
}

uint32_t MtuBytes(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
    default: return 1024;
  }
}

ibv_mtu MtuEnum(uint32_t bytes) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
    default: return IBV_MTU_1024;
  }
}

// wr_id: kind in the high 32 bits, send slot in the low ones.
constexpr uint64_t kWrSend = 1ull << 32;
constexpr uint64_t kWrWrite = 2ull << 32;
constexpr uint32_t kMaxSendWr = 128;

}  // namespace

std::string Port::Describe() const {
  return device + " port " + std::to_string(port) + " gid " + std::to_string(gid_index) + " (" + GidText(gid) +
         ") mtu " + std::to_string(mtu);
}

std::string GidText(const uint8_t gid[16]) {
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char buf[64];
  if (std::memcmp(gid, kMapped, 12) == 0) {
    std::snprintf(buf, sizeof buf, "::ffff:%u.%u.%u.%u", gid[12], gid[13], gid[14], gid[15]);
    return buf;
  }
  in6_addr a;
  std::memcpy(&a, gid, 16);
  return inet_ntop(AF_INET6, &a, buf, sizeof buf) != nullptr ? buf : "?";
}

std::string VerbsUnavailableReason() {
  std::string why;
  return V(&why) == nullptr ? why : "";
}

Result<std::string> ListDevices() {
  std::string why;
  const Verbs* v = V(&why);
  if (v == nullptr) return Unavailable(why);
  int n = 0;
  errno = 0;
  ibv_device** list = v->get_device_list(&n);
  const int e = errno;
  std::string names;
  for (int d = 0; list != nullptr && d < n; ++d) {
    const char* name = v->get_device_name(list[d]);
    names += (names.empty() ? "" : ", ") + std::string(name ? name : "?");
  }
  if (list != nullptr) v->free_device_list(list);
  if (names.empty()) {
    return Unavailable(std::string("this host has no RDMA device") +
                       (e != 0 ? std::string(" (ibv_get_device_list: ") + std::strerror(e) + ")" : ""));
  }
  return names;
}

Result<Port> FindPort(const sockaddr* local) {
  std::string why;
  const Verbs* v = V(&why);
  if (v == nullptr) return Unavailable(why);
  uint8_t want[16];
  if (!AddressGid(local, want)) return Unavailable("the connection is not over IP");
  int n = 0;
  errno = 0;
  ibv_device** list = v->get_device_list(&n);
  if (list == nullptr || n == 0) {
    const int e = errno;
    if (list != nullptr) v->free_device_list(list);
    return Unavailable(std::string("this host has no RDMA device") +
                       (e != 0 ? std::string(" (ibv_get_device_list: ") + std::strerror(e) + ")" : ""));
  }
  std::string names;
  Result<Port> found = Unavailable("");
  for (int d = 0; d < n && !found.ok(); ++d) {
    const char* name = v->get_device_name(list[d]);
    names += (names.empty() ? "" : ", ") + std::string(name ? name : "?");
    ibv_context* ctx = v->open_device(list[d]);
    if (ctx == nullptr) continue;
    for (uint8_t port = 1; port <= 2 && !found.ok(); ++port) {
      for (int i = 0; i < 64; ++i) {
        ibv_gid g{};
        if (v->query_gid(ctx, port, i, &g) != 0) break;
        if (std::memcmp(g.raw, want, 16) == 0) {
          ibv_port_attr pa{};
          if (v->query_port(ctx, port, &pa) != 0 || pa.state != IBV_PORT_ACTIVE) break;  // a port that is down
          Port p;
          p.mtu = MtuBytes(pa.active_mtu);
          p.device = name ? name : "?";
          p.port = port;
          p.gid_index = i;
          std::memcpy(p.gid, want, 16);
          found = p;
          break;
        }
      }
    }
    v->close_device(ctx);
  }
  v->free_device_list(list);
  if (!found.ok()) return Unavailable("no RDMA device (" + names + ") has the address " + GidText(want));
  return found;
}

struct Endpoint::Impl {
  const Verbs* v = nullptr;
  Port port;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* send_cq = nullptr;
  ibv_cq* recv_cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* window_mr = nullptr;
  ibv_mr* done_mr = nullptr;
  ibv_mr* bufs_mr = nullptr;
  uint8_t* window = nullptr;
  uint64_t window_bytes = 0;
  uint64_t* done_word = nullptr;
  uint8_t* bufs = nullptr;  // kSendSlots send buffers, then recv_slots receive buffers
  size_t bufs_bytes = 0;
  uint32_t recv_slots = 0;
  uint32_t psn = 0;
  RdmaConnectInfo peer{};
  bool connected = false;
  bool send_busy[kSendSlots] = {};
  uint32_t send_cur = 0;
  uint32_t outstanding = 0;
  uint32_t events_unacked = 0;
  std::deque<ibv_wc> recv_ready;  // completions polled but not yet handed out
  int last_slot = -1;

  uint8_t* SendSlot(uint32_t i) { return bufs + static_cast<size_t>(i) * kSlotBytes; }
  uint8_t* RecvSlot(uint32_t i) { return bufs + static_cast<size_t>(kSendSlots + i) * kSlotBytes; }

  Status PostRecv(uint32_t i) {
    ibv_sge sge{reinterpret_cast<uint64_t>(RecvSlot(i)), kSlotBytes, bufs_mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (int rc = ibv_post_recv(qp, &wr, &bad); rc != 0)
      return Unavailable(std::string("ibv_post_recv: ") + std::strerror(rc));
    return Status::Ok();
  }

  ~Impl() {
    if (v == nullptr) return;
    if (qp != nullptr) v->destroy_qp(qp);
    if (recv_cq != nullptr) {
      if (events_unacked != 0) v->ack_cq_events(recv_cq, events_unacked);
      v->destroy_cq(recv_cq);
    }
    if (send_cq != nullptr) v->destroy_cq(send_cq);
    if (channel != nullptr) v->destroy_comp_channel(channel);
    if (bufs_mr != nullptr) v->dereg_mr(bufs_mr);
    if (done_mr != nullptr) v->dereg_mr(done_mr);
    if (window_mr != nullptr) v->dereg_mr(window_mr);
    if (bufs != nullptr) munmap(bufs, bufs_bytes);
    if (pd != nullptr) v->dealloc_pd(pd);
    if (ctx != nullptr) v->close_device(ctx);
  }
};

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Endpoint::~Endpoint() = default;

Result<std::unique_ptr<Endpoint>> Endpoint::Create(const Port& port, uint8_t* window, uint64_t window_bytes,
                                                   uint64_t* done_word, uint32_t recv_slots) {
  std::string why;
  const Verbs* v = V(&why);
  if (v == nullptr) return Unavailable(why);
  auto m = std::make_unique<Impl>();
  m->v = v;
  m->port = port;
  m->window = window;
  m->window_bytes = window_bytes;
  m->done_word = done_word;
  m->recv_slots = recv_slots;
  auto fail = [&](const char* what) {
    const int e = errno;
    std::string hint;
    rlimit rl{};
    if ((e == ENOMEM || e == EPERM || e == EAGAIN) && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
        rl.rlim_cur != RLIM_INFINITY) {
      const uint64_t need = window_bytes + static_cast<uint64_t>(kSendSlots + recv_slots) * kSlotBytes;
      hint = " (`ulimit -l` is " + std::to_string(rl.rlim_cur / 1024) + " KiB, and RDMA registers about " +
             std::to_string((need >> 20) + 1) + " MiB here: raise it, e.g. to unlimited)";
    }
    return Unavailable(std::string(what) + " failed on " + port.device + ": " + std::strerror(e) + hint);
  };
  // Registered memory counts against RLIMIT_MEMLOCK (unless CAP_IPC_LOCK): take what is allowed.
  if (rlimit rl{}; getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_MEMLOCK, &rl);
  }
  int n = 0;
  ibv_device** list = v->get_device_list(&n);
  for (int d = 0; list != nullptr && d < n && m->ctx == nullptr; ++d) {
    const char* name = v->get_device_name(list[d]);
    if (name != nullptr && port.device == name) m->ctx = v->open_device(list[d]);
  }
  if (list != nullptr) v->free_device_list(list);
  if (m->ctx == nullptr) return Unavailable("cannot open RDMA device " + port.device);
  if ((m->pd = v->alloc_pd(m->ctx)) == nullptr) return fail("ibv_alloc_pd");
  if ((m->channel = v->create_comp_channel(m->ctx)) == nullptr) return fail("ibv_create_comp_channel");
  if ((m->send_cq = v->create_cq(m->ctx, static_cast<int>(kMaxSendWr), nullptr, nullptr, 0)) == nullptr) {
    return fail("ibv_create_cq");
  }
  if ((m->recv_cq = v->create_cq(m->ctx, static_cast<int>(recv_slots), nullptr, m->channel, 0)) == nullptr) {
    return fail("ibv_create_cq");
  }
  m->bufs_bytes = static_cast<size_t>(kSendSlots + recv_slots) * kSlotBytes;
  void* p = mmap(nullptr, m->bufs_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return fail("mmap");
  m->bufs = static_cast<uint8_t*>(p);
  if ((m->bufs_mr = v->reg_mr(m->pd, m->bufs, m->bufs_bytes, IBV_ACCESS_LOCAL_WRITE)) == nullptr) {
    return fail("ibv_reg_mr (buffers)");
  }
  if ((m->window_mr = v->reg_mr(m->pd, window, window_bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)) ==
      nullptr) {
    return fail("ibv_reg_mr (window)");
  }
  if (done_word != nullptr && (m->done_mr = v->reg_mr(m->pd, done_word, sizeof *done_word,
                                                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)) == nullptr) {
    return fail("ibv_reg_mr (done word)");
  }
  ibv_qp_init_attr qa{};
  qa.send_cq = m->send_cq;
  qa.recv_cq = m->recv_cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = kMaxSendWr;
  qa.cap.max_recv_wr = recv_slots;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = 64;
  qa.sq_sig_all = 1;
  if ((m->qp = v->create_qp(m->pd, &qa)) == nullptr) return fail("ibv_create_qp");
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port.port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (int rc = v->modify_qp(m->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS); rc != 0) {
    errno = rc;
    return fail("ibv_modify_qp (INIT)");
  }
  for (uint32_t i = 0; i < recv_slots; ++i) {
    if (Status s = m->PostRecv(i); !s.ok()) return s;
  }
  std::random_device rd;
  m->psn = rd() & 0xffffffu;
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(m)));
}

RdmaConnectInfo Endpoint::Local() const {
  RdmaConnectInfo i{};
  std::memcpy(i.gid, impl_->port.gid, 16);
  i.qpn = impl_->qp->qp_num;
  i.psn = impl_->psn;
  i.window_addr = reinterpret_cast<uint64_t>(impl_->window);
  i.window_bytes = impl_->window_bytes;
  i.window_rkey = impl_->window_mr->rkey;
  if (impl_->done_mr != nullptr) {
    i.done_rkey = impl_->done_mr->rkey;
    i.done_addr = reinterpret_cast<uint64_t>(impl_->done_word);
  }
  i.recv_slots = impl_->recv_slots;
  i.slot_bytes = kSlotBytes;
  i.mtu = impl_->port.mtu;
  return i;
}

Status Endpoint::Connect(const RdmaConnectInfo& peer) {
  Impl& m = *impl_;
  if (peer.window_bytes != m.window_bytes) {
    return DataLoss("the peer's window is " + std::to_string(peer.window_bytes) + " bytes, not " +
                    std::to_string(m.window_bytes));
  }
  if (peer.slot_bytes < kSlotBytes || peer.recv_slots == 0) return DataLoss("the peer's receive buffers are too small");
  if (peer.qpn == 0 || peer.qpn > 0xffffffu) return DataLoss("the peer's queue pair number is impossible");
  m.peer = peer;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = MtuEnum(std::min(m.port.mtu, peer.mtu));  // MtuEnum: anything odd becomes 1024
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn & 0xffffffu;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;  // 0.01 ms: a receiver out of buffers is retried soon
  a.ah_attr.is_global = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(m.port.gid_index);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = m.port.port;
  int rc = m.v->modify_qp(m.qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) return Unavailable(std::string("ibv_modify_qp (RTR): ") + std::strerror(rc));
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 17;  // 4.096 us * 2^17 = 0.5 s per try: emulated RoCE under load is slow
  a.retry_cnt = 7;
  a.rnr_retry = 7;  // a receiver briefly out of buffers is waited for (flow control)
  a.sq_psn = m.psn;
  a.max_rd_atomic = 1;
  rc = m.v->modify_qp(
      m.qp, &a,
      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) return Unavailable(std::string("ibv_modify_qp (RTS): ") + std::strerror(rc));
  m.connected = true;
  return Status::Ok();
}

bool Endpoint::CanPost(uint32_t wrs) const {
  return impl_->outstanding + wrs <= kMaxSendWr && !impl_->send_busy[impl_->send_cur];
}

uint8_t* Endpoint::SendBuffer() { return impl_->SendSlot(impl_->send_cur); }

Status Endpoint::PostWindowWrite(uint64_t offset, uint64_t bytes) {
  Impl& m = *impl_;
  if (bytes == 0) return Status::Ok();
  if (offset > m.window_bytes || bytes > m.window_bytes - offset || bytes > 0x7fffffffu) {
    return Internal("window write out of range");
  }
  ibv_sge sge{reinterpret_cast<uint64_t>(m.window + offset), static_cast<uint32_t>(bytes), m.window_mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kWrWrite;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = m.peer.window_addr + offset;
  wr.wr.rdma.rkey = m.peer.window_rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(m.qp, &wr, &bad); rc != 0)
    return Unavailable(std::string("ibv_post_send: ") + std::strerror(rc));
  ++m.outstanding;
  return Status::Ok();
}

Status Endpoint::PostDoneWrite(uint64_t seq) {
  Impl& m = *impl_;
  if (m.peer.done_rkey == 0) return Status::Ok();
  uint64_t value = seq;
  ibv_sge sge{reinterpret_cast<uint64_t>(&value), sizeof value, 0};
  ibv_send_wr wr{};
  wr.wr_id = kWrWrite;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  wr.wr.rdma.remote_addr = m.peer.done_addr;
  wr.wr.rdma.rkey = m.peer.done_rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(m.qp, &wr, &bad); rc != 0)
    return Unavailable(std::string("ibv_post_send: ") + std::strerror(rc));
  ++m.outstanding;
  return Status::Ok();
}

Status Endpoint::PostSend(uint32_t len) {
  Impl& m = *impl_;
  if (len > kSlotBytes) return Internal("message larger than a send buffer");
  ibv_sge sge{reinterpret_cast<uint64_t>(m.SendSlot(m.send_cur)), len, m.bufs_mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kWrSend | m.send_cur;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(m.qp, &wr, &bad); rc != 0)
    return Unavailable(std::string("ibv_post_send: ") + std::strerror(rc));
  ++m.outstanding;
  m.send_busy[m.send_cur] = true;
  m.send_cur = (m.send_cur + 1) % kSendSlots;
  return Status::Ok();
}

Status Endpoint::PollSend() {
  Impl& m = *impl_;
  ibv_wc wc[16];
  for (;;) {
    const int n = ibv_poll_cq(m.send_cq, 16, wc);
    if (n < 0) return Unavailable("ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        return Unavailable(std::string("RDMA send failed: ") + std::to_string(static_cast<int>(wc[i].status)) +
                           " (peer gone or refused the access)");
      }
      if (m.outstanding > 0) --m.outstanding;
      if ((wc[i].wr_id & ~0xffffffffull) == kWrSend) m.send_busy[(wc[i].wr_id & 0xffffffffull) % kSendSlots] = false;
    }
    if (n < 16) return Status::Ok();
  }
}

uint32_t Endpoint::Outstanding() const { return impl_->outstanding; }

Status Endpoint::PollRecv(const uint8_t** data, uint32_t* len) {
  Impl& m = *impl_;
  *data = nullptr;
  *len = 0;
  if (m.recv_ready.empty()) {
    ibv_wc wc[8];
    const int n = ibv_poll_cq(m.recv_cq, 8, wc);
    if (n < 0) return Unavailable("ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) m.recv_ready.push_back(wc[i]);
  }
  if (m.recv_ready.empty()) return Status::Ok();
  const ibv_wc wc = m.recv_ready.front();
  m.recv_ready.pop_front();
  if (wc.status != IBV_WC_SUCCESS) {
    return Unavailable(wc.status == IBV_WC_LOC_LEN_ERR
                           ? "the peer sent a message larger than a receive buffer"
                           : "RDMA receive failed: " + std::to_string(static_cast<int>(wc.status)));
  }
  if (wc.wr_id >= m.recv_slots || wc.byte_len > kSlotBytes) return Internal("impossible receive completion");
  m.last_slot = static_cast<int>(wc.wr_id);
  *data = m.RecvSlot(static_cast<uint32_t>(wc.wr_id));
  *len = wc.byte_len;
  return Status::Ok();
}

Status Endpoint::PeekRecv(bool* any) {
  Impl& m = *impl_;
  if (m.recv_ready.empty()) {
    ibv_wc wc[8];
    const int n = ibv_poll_cq(m.recv_cq, 8, wc);
    if (n < 0) return Unavailable("ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) m.recv_ready.push_back(wc[i]);
  }
  *any = !m.recv_ready.empty();
  return Status::Ok();
}

Status Endpoint::RepostLast() {
  Impl& m = *impl_;
  if (m.last_slot < 0) return Status::Ok();
  const auto slot = static_cast<uint32_t>(m.last_slot);
  m.last_slot = -1;
  return m.PostRecv(slot);
}

int Endpoint::completion_fd() const { return impl_->channel->fd; }

Status Endpoint::ArmRecv() {
  if (int rc = ibv_req_notify_cq(impl_->recv_cq, 0); rc != 0) return Unavailable("ibv_req_notify_cq failed");
  return Status::Ok();
}

void Endpoint::AckRecvEvent() {
  Impl& m = *impl_;
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  if (m.v->get_cq_event(m.channel, &cq, &ctx) == 0) {
    if (++m.events_unacked >= 64) {
      m.v->ack_cq_events(m.recv_cq, m.events_unacked);
      m.events_unacked = 0;
    }
  }
}

}  // namespace orion::rdma
