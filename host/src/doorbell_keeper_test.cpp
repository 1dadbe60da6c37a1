#include "orion/host/doorbell_keeper.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

namespace orion::host {
namespace {

// A keeper process serving a socket in a fresh directory (forked: RunDoorbellKeeper as oriond runs it).
class KeeperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = std::filesystem::temp_directory_path().string() + "/orion-keeper-XXXXXX";
    ASSERT_NE(mkdtemp(t.data()), nullptr);
    dir_ = t;
    path_ = dir_ + "/vms.json.doorbells";
    UniqueFd l(::socket(AF_UNIX, SOCK_SEQPACKET, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path_.c_str());
    ASSERT_EQ(::bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(l.get(), 8), 0);
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) ::_exit(RunDoorbellKeeper(l.get(), path_));
  }
  void TearDown() override {
    if (pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  // Whether the keeper process ended within `ms`, with status 0.
  bool KeeperExited(int ms) {
    for (int i = 0; i < ms / 10; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
      }
      ::usleep(10000);
    }
    return false;
  }
  // A raw request on a connection of our own: the reply's text.
  std::string Raw(const std::string& text, const std::vector<int>& fds) {
    UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path_.c_str());
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "connect failed";
    iovec iov{const_cast<char*>(text.data()), text.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    if (!fds.empty()) {
      m.msg_control = control.data();
      m.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    if (::sendmsg(s.get(), &m, MSG_NOSIGNAL) < 0) return "send failed";
    char buf[600];
    const ssize_t n = ::recv(s.get(), buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "no reply";
  }
  std::string dir_, path_;
  pid_t pid_ = -1;
};

UniqueFd NewEventFd() { return UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)); }

TEST_F(KeeperTest, ANewConnectionGetsTheSameEventFdsBackAndPruneDropsTheRest) {
  UniqueFd a0 = NewEventFd(), a1 = NewEventFd(), b0 = NewEventFd();
  {
    DoorbellKeeper first(path_);  // oriond before its restart
    ASSERT_TRUE(first.Put("vm-a", {a0.get(), a1.get()}).ok());
    ASSERT_TRUE(first.Put("vm-b", {b0.get()}).ok());
  }
  b0.reset();
  // The old oriond is gone; a guest rings vector 1 (QEMU writes the eventfd it holds).
  const uint64_t one = 1;
  ASSERT_EQ(::write(a1.get(), &one, sizeof one), 8);
  DoorbellKeeper second(path_);  // the restarted oriond
  auto got = second.Get("vm-a");
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), 2u);
  uint64_t count = 0;
  EXPECT_EQ(::read((*got)[1].get(), &count, sizeof count), 8) << "not the eventfd QEMU rings";
  EXPECT_EQ(count, 1u);
  EXPECT_NE(::read((*got)[0].get(), &count, sizeof count), 8);  // vector 0 was not rung
  // vm-b was not restored: prune lets it go, vm-a stays.
  ASSERT_TRUE(second.Prune().ok());
  auto b = second.Get("vm-b");
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->empty());
  EXPECT_EQ(second.Get("vm-a")->size(), 2u);
  // Detached: nothing held; once oriond goes, the keeper ends and removes its socket.
  ASSERT_TRUE(second.Drop("vm-a").ok());
  EXPECT_TRUE(second.Get("vm-a")->empty());
  EXPECT_FALSE(KeeperExited(300)) << "it must wait while an oriond is connected";
  second.CloseInChild();
  EXPECT_TRUE(KeeperExited(5000));
  EXPECT_FALSE(std::filesystem::exists(path_));
  // No keeper: Get finds nothing kept rather than failing.
  DoorbellKeeper third(path_);
  auto none = third.Get("vm-a");
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_TRUE(none->empty());
}

TEST_F(KeeperTest, ItHoldsWhatItHoldsWhileNoOriondRuns) {
  UniqueFd e = NewEventFd();
  {
    DoorbellKeeper k(path_);
    ASSERT_TRUE(k.Put("vm", {e.get()}).ok());
  }
  EXPECT_FALSE(KeeperExited(1500));  // oriond is down, the VM runs: keep its eventfds
  DoorbellKeeper k(path_);
  EXPECT_EQ(k.Get("vm")->size(), 1u);
}

TEST_F(KeeperTest, BadRequestsAreRefusedAndChangeNothing) {
  UniqueFd e = NewEventFd();
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  UniqueFd r(pipe_fds[0]), w(pipe_fds[1]);
  DoorbellKeeper k(path_);
  ASSERT_TRUE(k.Put("vm", {e.get()}).ok());
  EXPECT_EQ(Raw("put other", {r.get()}).rfind("error put carries", 0), 0u);  // not an eventfd
  EXPECT_EQ(Raw("put other", {}).rfind("error put carries", 0), 0u);
  EXPECT_EQ(Raw("put ../x", {e.get()}).rfind("error expected", 0), 0u);
  EXPECT_EQ(Raw("get vm extra", {}).rfind("error expected", 0), 0u);
  EXPECT_EQ(Raw("get vm", {e.get()}), "error only put carries fds");
  EXPECT_EQ(Raw("launch", {}).rfind("error expected", 0), 0u);
  EXPECT_EQ(Raw(std::string(700, 'x'), {}).rfind("error a request is at most", 0), 0u);
  std::vector<int> many(40, e.get());
  const std::string too_many = Raw("put other", many);
  EXPECT_TRUE(too_many.rfind("error", 0) == 0 || too_many == "send failed") << too_many;
  EXPECT_TRUE(k.Get("other")->empty());
  EXPECT_EQ(k.Get("vm")->size(), 1u);
  // Up to kMaxKeptVms VMs, then a clear refusal.
  for (size_t i = 1; i < kMaxKeptVms; ++i) ASSERT_TRUE(k.Put("vm" + std::to_string(i), {e.get()}).ok()) << i;
  const Status full = k.Put("one-more", {e.get()});
  EXPECT_FALSE(full.ok());
  EXPECT_NE(full.message().find("holds 256 VMs already"), std::string::npos) << full.message();
  EXPECT_TRUE(k.Put("vm7", {e.get()}).ok());  // replacing is not growing
}

}  // namespace
}  // namespace orion::host
