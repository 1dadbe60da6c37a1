#include "orion/ivshmem/doorbell.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace orion::ivshmem {
namespace {

struct Msg {
  int64_t value;
  int fd;  // -1: none
};

// Reads one protocol message the way QEMU does (8 bytes, maybe an fd).
bool Recv(int sock, Msg* m) {
  uint8_t b[8];
  iovec iov{b, sizeof b};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  h.msg_control = control;
  h.msg_controllen = sizeof control;
  if (recvmsg(sock, &h, MSG_WAITALL) != 8) return false;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{b[i]} << (8 * i);
  m->value = static_cast<int64_t>(v);
  m->fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
    if (c->cmsg_type == SCM_RIGHTS) std::memcpy(&m->fd, CMSG_DATA(c), sizeof(int));
  }
  return true;
}

int Connect(const std::string& path) {
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(s);
    return -1;
  }
  return s;
}

class DoorbellTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/orion-bell-XXXXXX";
    dir_ = mkdtemp(tmpl);
    region_ = dir_ + "/orionsock-vm";
    const int fd = open(region_.c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
    close(fd);
    sock_ = dir_ + "/orionsock-vm.sock";
  }
  void TearDown() override { (void)std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_, region_, sock_;
};

TEST_F(DoorbellTest, SendsTheIvshmemSetupAndWakesOnAVector) {
  auto srv = DoorbellServer::Create(sock_, region_, 3, getuid(), getgid());
  ASSERT_TRUE(srv.ok()) << srv.status().ToString();
  struct stat st {};
  ASSERT_EQ(stat(sock_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  const int c = Connect(sock_);
  ASSERT_GE(c, 0);
  EXPECT_NE((*srv)->Accept().find("connected (3 vectors)"), std::string::npos);
  EXPECT_TRUE((*srv)->connected());
  std::vector<Msg> got;
  Msg m;
  for (int i = 0; i < 3 + 3 + 3 && Recv(c, &m); ++i) got.push_back(m);
  ASSERT_EQ(got.size(), 9u);
  EXPECT_EQ(got[0].value, 0);  // protocol version
  EXPECT_EQ(got[0].fd, -1);
  EXPECT_EQ(got[1].value, kGuestPeer);  // our id
  EXPECT_EQ(got[1].fd, -1);
  EXPECT_EQ(got[2].value, -1);  // the memory: the region file itself
  ASSERT_GE(got[2].fd, 0);
  struct stat a {
  }, b{};
  ASSERT_EQ(fstat(got[2].fd, &a), 0);
  ASSERT_EQ(stat(region_.c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  for (int v = 0; v < 3; ++v) {
    EXPECT_EQ(got[3 + v].value, kHostPeer);   // oriond's vectors
    EXPECT_EQ(got[6 + v].value, kGuestPeer);  // the guest's own
  }
  // Ringing vector 1 (what QEMU does for a Doorbell write of 0 << 16 | 1) wakes vector 1 only.
  const uint64_t one = 1;
  ASSERT_EQ(write(got[4].fd, &one, sizeof one), 8);
  EXPECT_FALSE(WaitEventFd((*srv)->vector_fd(0), 0));
  EXPECT_TRUE(WaitEventFd((*srv)->vector_fd(1), 1000));
  EXPECT_FALSE(WaitEventFd((*srv)->vector_fd(1), 0));  // reset by the wait
  EXPECT_EQ((*srv)->vector_fd(3), -1);
  // A second connection is refused while the VM is connected.
  const int c2 = Connect(sock_);
  EXPECT_NE((*srv)->Accept().find("refused a second connection"), std::string::npos);
  char x;
  EXPECT_EQ(read(c2, &x, 1), 0);
  close(c2);
  // The peer leaves: the next one gets the same vectors.
  close(c);
  EXPECT_NE((*srv)->PeerReadable().find("disconnected"), std::string::npos);
  EXPECT_FALSE((*srv)->connected());
  const int c3 = Connect(sock_);
  EXPECT_NE((*srv)->Accept().find("connected"), std::string::npos);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Recv(c3, &m));
  ASSERT_GE(m.fd, 0);
  ASSERT_EQ(write(m.fd, &one, sizeof one), 8);
  EXPECT_TRUE(WaitEventFd((*srv)->vector_fd(0), 1000));
  close(c3);
  for (const Msg& g : got)
    if (g.fd >= 0) close(g.fd);
  srv->reset();
  EXPECT_NE(access(sock_.c_str(), F_OK), 0);  // removed with the server
}

TEST_F(DoorbellTest, GarbageFromThePeerEndsOnlyThatConnection) {
  auto srv = DoorbellServer::Create(sock_, region_, 1, getuid(), getgid());
  ASSERT_TRUE(srv.ok());
  const int c = Connect(sock_);
  (*srv)->Accept();
  ASSERT_EQ(write(c, "garbage!", 8), 8);
  EXPECT_NE((*srv)->PeerReadable().find("one-way"), std::string::npos);
  EXPECT_FALSE((*srv)->connected());
  close(c);
  const int c2 = Connect(sock_);
  EXPECT_NE((*srv)->Accept().find("connected"), std::string::npos);
  close(c2);
}

TEST_F(DoorbellTest, RefusesBadArgumentsAndForeignFiles) {
  EXPECT_EQ(DoorbellServer::Create(sock_, region_, 0, getuid(), getgid()).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DoorbellServer::Create(sock_, region_, kMaxDoorbellVectors + 1, getuid(), getgid()).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(DoorbellServer::Create("relative.sock", region_, 1, getuid(), getgid()).status().code(),
            Code::kInvalidArgument);
  // A regular file at the path is never replaced.
  EXPECT_EQ(DoorbellServer::Create(region_, region_, 1, getuid(), getgid()).status().code(), Code::kAlreadyExists);
  // A live server's socket is not taken; a stale one is.
  auto first = DoorbellServer::Create(sock_, region_, 1, getuid(), getgid());
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(DoorbellServer::Create(sock_, region_, 1, getuid(), getgid()).status().code(), Code::kAlreadyExists);
  const int stale = socket(AF_UNIX, SOCK_STREAM, 0);
  first->reset();
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, sock_.c_str(), sizeof a.sun_path - 1);
  ASSERT_EQ(bind(stale, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);  // bound, never listening
  close(stale);
  EXPECT_TRUE(DoorbellServer::Create(sock_, region_, 1, getuid(), getgid()).ok());
}

TEST_F(DoorbellTest, GuestRingWritesTheDoorbellRegister) {
  // A plain file stands in for BAR0: Ring is one 32-bit store at offset 12.
  const std::string bar0 = dir_ + "/resource0";
  const int fd = open(bar0.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  const uint32_t pos = kGuestPeer;
  ASSERT_EQ(pwrite(fd, &pos, 4, 8), 4);
  auto g = GuestDoorbell::Open(bar0);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)->position(), kGuestPeer);
  (*g)->Ring(kHostPeer, 5);
  uint32_t v = 0;
  ASSERT_EQ(pread(fd, &v, 4, 12), 4);
  EXPECT_EQ(v, (kHostPeer << 16) | 5u);
  close(fd);
  EXPECT_EQ(GuestDoorbell::Open(dir_ + "/none").status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace orion::ivshmem
