// hostile_rdma: an RDMA client of oriond without the guest runtime, the way a malicious or broken
// client could behave, to check that oriond ends only the offending session.
//
//   hostile_rdma HOST PORT MODE
//     badconnect  RdmaConnect with a window size that is not the channel's
//     garbage     (after a good Nop round trip over RDMA) a SEND of random bytes
//     window      (after a good Nop) a MemcpyHtoD whose window range lies past the window
//     tcpbytes    (after a good Nop) bytes on the TCP socket, which must stay silent under RDMA
// Prints "RESULT <check> ok|FAIL ..." lines; exits 0 when oriond behaved as expected.
#include <netdb.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "orion/common/frame.h"
#include "orion/ivshmem/region.h"
#include "orion/rdma/endpoint.h"

using namespace orion;

namespace {

int g_failed = 0;
void Report(const std::string& name, bool ok, const std::string& detail = "") {
  std::printf("RESULT %s %s%s\n", name.c_str(), ok ? "ok" : "FAIL ", ok ? "" : detail.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failed;
}

bool RecvAll(int fd, void* p, size_t len) {
  auto* b = static_cast<uint8_t*>(p);
  while (len > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 10000) <= 0) return false;
    const ssize_t n = recv(fd, b, len, 0);
    if (n <= 0) return false;
    b += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

FrameHeader Header(Op op, uint32_t seq, uint32_t len, bool reply) {
  FrameHeader h = MakeFrameHeader(static_cast<uint16_t>(op), seq, len);
  h.flags = reply ? kFlagWantsReply : 0;
  return h;
}

// oriond closes the session's TCP connection within 10 s.
bool Closed(int fd) {
  for (int i = 0; i < 100; ++i) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 100) == 1) {
      char c;
      const ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: hostile_rdma HOST PORT badconnect|garbage|window|tcpbytes\n");
    return 2;
  }
  const std::string mode = argv[3];
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(argv[1], argv[2], &hints, &res) != 0) return 2;
  const int fd = socket(res->ai_family, SOCK_STREAM, 0);
  if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    Report("connect", false, std::strerror(errno));
    return 1;
  }
  freeaddrinfo(res);
  HelloReq hello{};
  hello.protocol_version = kProtocolVersion;
  hello.transports = kTransportTcp | kTransportRdma;
  hello.vgpu_count = 1;
  hello.gmem_mib = 64;
  std::strcpy(hello.process_name, "hostile_rdma");
  FrameHeader h = Header(Op::kHello, 1, sizeof hello, true);
  send(fd, &h, sizeof h, 0);
  send(fd, &hello, sizeof hello, 0);
  std::vector<uint8_t> welcome;
  if (!RecvAll(fd, &h, sizeof h) || h.status != 0 || h.payload_len < sizeof(WelcomeRep)) {
    Report("welcome", false);
    return 1;
  }
  welcome.resize(h.payload_len);
  RecvAll(fd, welcome.data(), welcome.size());
  WelcomeRep w;
  std::memcpy(&w, welcome.data(), sizeof w);
  Report("welcome_chose_rdma", w.transport == kTransportRdma, "transport " + std::to_string(w.transport));
  const uint64_t window_bytes = ivshmem::ChannelLayout::Compute(w.channel_bytes).window_bytes;
  auto* window =
      static_cast<uint8_t*>(mmap(nullptr, window_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl);
  auto port = rdma::FindPort(reinterpret_cast<sockaddr*>(&ss));
  if (!port.ok()) {
    Report("rdma_port", false, port.status().message());
    return 1;
  }
  static uint64_t done = 0;
  auto ep = rdma::Endpoint::Create(*port, window, window_bytes, &done, 4);
  if (!ep.ok()) {
    Report("rdma_endpoint", false, ep.status().message());
    return 1;
  }
  RdmaConnectInfo mine = (*ep)->Local();
  if (mode == "badconnect") mine.window_bytes += 4096;
  h = Header(Op::kRdmaConnect, 2, sizeof mine, true);
  send(fd, &h, sizeof h, 0);
  send(fd, &mine, sizeof mine, 0);
  if (mode == "badconnect") {
    Report("bad_rdma_connect_ends_session", Closed(fd));
    return g_failed == 0 ? 0 : 1;
  }
  RdmaConnectInfo theirs;
  if (!RecvAll(fd, &h, sizeof h) || !RecvAll(fd, &theirs, sizeof theirs) || !(*ep)->Connect(theirs).ok()) {
    Report("rdma_connect", false);
    return 1;
  }
  // A good round trip first: the session works over RDMA.
  h = Header(Op::kNop, 3, 0, true);
  std::memcpy((*ep)->SendBuffer(), &h, sizeof h);
  bool nop_ok = (*ep)->PostSend(sizeof h).ok();
  const uint8_t* msg = nullptr;
  uint32_t len = 0;
  for (int i = 0; nop_ok && msg == nullptr && i < 1000000; ++i) {
    (void)(*ep)->PollSend();
    if (!(*ep)->PollRecv(&msg, &len).ok()) break;
    if (msg == nullptr) usleep(10);
  }
  FrameHeader rep{};
  if (msg != nullptr && len >= sizeof rep) std::memcpy(&rep, msg, sizeof rep);
  Report("nop_over_rdma", msg != nullptr && rep.seq == 3 && rep.status == 0);
  while ((*ep)->Outstanding() > 0 && (*ep)->PollSend().ok()) usleep(10);
  if (mode == "garbage") {
    uint8_t* b = (*ep)->SendBuffer();
    for (int i = 0; i < 512; ++i) b[i] = static_cast<uint8_t>(i * 37 + 11);
    (void)(*ep)->PostSend(512);
    Report("rdma_garbage_ends_session", Closed(fd));
  } else if (mode == "window") {
    MemcpyReq q{0x1000, window_bytes - 16, 4096, 0};
    h = Header(Op::kMemcpyHtoD, 4, sizeof q, true);
    std::memcpy((*ep)->SendBuffer(), &h, sizeof h);
    std::memcpy((*ep)->SendBuffer() + sizeof h, &q, sizeof q);
    (void)(*ep)->PostSend(sizeof h + sizeof q);
    Report("rdma_window_overrun_ends_session", Closed(fd));
  } else if (mode == "tcpbytes") {
    send(fd, "x", 1, MSG_NOSIGNAL);
    Report("tcp_bytes_under_rdma_end_session", Closed(fd));
  } else {
    Report("mode", false, mode);
  }
  return g_failed == 0 ? 0 : 1;
}
