// The controller's connection front: see front.h.
#include "front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace orion::controller {

namespace {

using Clock = std::chrono::steady_clock;

// After an error reply that closes the connection, the rest of what the client sends is read and
// dropped for this long (at most kLingerBytes) before the close: closing a socket with unread
// input sends a reset, which can destroy the reply before the client reads it.
constexpr int kLingerMs = 2000;
constexpr size_t kLingerBytes = 1 << 20;
constexpr size_t kReadChunk = 16 * 1024;
constexpr size_t kMaxChunkLine = 256;  // "1a2b;ext=..." CRLF
constexpr int kTickMs = 100;

const char* Reason(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

void Address(int fd, bool peer, std::string* ip, int* port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  const int r = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                     : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (r != 0 || getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                            NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return;
  }
  *ip = host;
  *port = std::atoi(serv);
}

// A request as httplib reads it: from memory, its reply into a string.
class MemStream final : public httplib::Stream {
 public:
  MemStream(const std::string& in, std::string* out, const std::string& rip, int rport, const std::string& lip,
            int lport)
      : in_(in), out_(out), rip_(rip), lip_(lip), rport_(rport), lport_(lport) {}
  bool is_readable() const override { return true; }
  bool is_writable() const override { return true; }
  ssize_t read(char* p, size_t n) override {
    const size_t k = std::min(n, in_.size() - pos_);
    std::memcpy(p, in_.data() + pos_, k);
    pos_ += k;
    return static_cast<ssize_t>(k);
  }
  ssize_t write(const char* p, size_t n) override {
    out_->append(p, n);
    return static_cast<ssize_t>(n);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = rip_;
    port = rport_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = lip_;
    port = lport_;
  }
  // Not a socket (httplib compares it with FD_SETSIZE only).
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  const std::string& in_;
  std::string* out_;
  size_t pos_ = 0;
  std::string rip_, lip_;
  int rport_, lport_;
};

}  // namespace

// All connection state lives on the front thread; workers see a request's bytes and hand back a
// reply through done_ (under mu_) and the eventfd.
class FrontServer::Front {
 public:
  Front(FrontServer& owner, FrontLimits limits, HeadCheck check)
      : owner_(owner), lim_(limits), check_(std::move(check)) {
    wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~Front() {
    if (wake_ >= 0) ::close(wake_);
  }

  bool Serve(int listen_fd);
  void Stop() {
    stop_.store(true);
    const uint64_t one = 1;
    if (wake_ >= 0) (void)!::write(wake_, &one, sizeof one);
  }
  size_t connections() const { return open_.load(); }

 private:
  enum class State { kHead, kBody, kChunkSize, kChunkData, kChunkEnd, kTrailers, kBusy, kWriting, kLinger };
  struct Conn {
    int fd = -1;
    uint64_t gen = 0;  // accept order: the oldest is evicted first
    State state = State::kHead;
    std::string in;    // read, not yet parsed
    std::string head;  // the head httplib sees (rebuilt: Content-Length, no Transfer-Encoding)
    std::string body;
    size_t want = 0;      // body or chunk bytes still to read
    size_t trailer = 0;   // trailer bytes seen
    size_t lingered = 0;  // bytes dropped while lingering
    bool started = false;
    bool close_after = false;
    bool gone = false;  // hung up while busy (no longer in the epoll set)
    std::string out;
    size_t out_pos = 0;
    Clock::time_point deadline;
    std::string rip, lip;
    int rport = 0, lport = 0;
  };
  struct Done {
    int fd;
    uint64_t gen;
    std::string reply;
    bool close;
  };

  void Accept();
  void OnReadable(Conn& c);
  void Advance(Conn& c);
  bool ParseHead(Conn& c, size_t end);
  void Dispatch(Conn& c);
  void OnWritable(Conn& c);
  void Reply(Conn& c, int status, const std::string& json);
  void Watch(Conn& c, uint32_t events);
  void Close(int fd);
  bool Evict();
  void ReleaseBody(Conn& c) {
    buffered_ -= std::min(buffered_, c.body.size());
    std::string().swap(c.body);
  }
  bool AddBody(Conn& c, const char* p, size_t n) {
    if (c.body.size() + n > lim_.max_body_bytes) {
      Reply(c, 413, "the request body is larger than " + std::to_string(lim_.max_body_bytes) + " bytes");
      return false;
    }
    if (buffered_ + n > lim_.max_body_buffered) {
      Reply(c, 503, "the controller holds too many request bodies now; retry");
      return false;
    }
    c.body.append(p, n);
    buffered_ += n;
    return true;
  }

  FrontServer& owner_;
  FrontLimits lim_;
  HeadCheck check_;
  int ep_ = -1, wake_ = -1, listen_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> open_{0};
  std::map<int, Conn> conns_;
  uint64_t next_gen_ = 1;
  size_t buffered_ = 0;
  bool accept_paused_ = false;
  std::unique_ptr<httplib::ThreadPool> pool_;
  std::mutex mu_;
  std::deque<Done> done_;
  size_t busy_ = 0;
};

bool FrontServer::Front::Serve(int listen_fd) {
  if (wake_ < 0) return false;
  ep_ = epoll_create1(EPOLL_CLOEXEC);
  if (ep_ < 0) return false;
  listen_ = listen_fd;
  ::fcntl(listen_, F_SETFL, ::fcntl(listen_, F_GETFL) | O_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_;
  epoll_ctl(ep_, EPOLL_CTL_ADD, listen_, &ev);
  ev.data.fd = wake_;
  epoll_ctl(ep_, EPOLL_CTL_ADD, wake_, &ev);
  pool_ = std::make_unique<httplib::ThreadPool>(lim_.workers);
  std::vector<epoll_event> evs(256);
  auto last_tick = Clock::now();
  bool stopping = false;
  while (!stop_.load() || busy_ > 0) {
    const int n = epoll_wait(ep_, evs.data(), static_cast<int>(evs.size()), kTickMs);
    if (n < 0 && errno != EINTR) break;
    if (stop_.load() && !stopping) {
      // Stop: no new connections or requests; the routes in flight answer first.
      stopping = true;
      epoll_ctl(ep_, EPOLL_CTL_DEL, listen_, nullptr);
      std::vector<int> idle;
      for (const auto& [fd, c] : conns_) {
        if (c.state != State::kBusy && c.state != State::kWriting) idle.push_back(fd);
      }
      for (int fd : idle) Close(fd);
    }
    for (int i = 0; i < n; ++i) {
      const int fd = evs[i].data.fd;
      if (fd == wake_) {
        uint64_t v;
        (void)!::read(wake_, &v, sizeof v);
        std::deque<Done> done;
        {
          std::lock_guard<std::mutex> lock(mu_);
          done.swap(done_);
        }
        for (Done& d : done) {
          --busy_;
          auto it = conns_.find(d.fd);
          if (it == conns_.end() || it->second.gen != d.gen) continue;
          Conn& c = it->second;
          if (c.gone) {
            Close(c.fd);
            continue;
          }
          ReleaseBody(c);
          c.out = std::move(d.reply);
          c.out_pos = 0;
          c.close_after = d.close || stop_.load();
          c.state = State::kWriting;
          c.deadline = Clock::now() + std::chrono::milliseconds(lim_.write_timeout_ms);
          OnWritable(c);
        }
        continue;
      }
      if (fd == listen_) {
        if (!stopping) Accept();
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      Conn& c = it->second;
      if (c.state == State::kBusy) {
        // Gone while its route runs: stop listening (a hang-up is reported until the close);
        // the reply is dropped when it comes.
        if (evs[i].events & (EPOLLHUP | EPOLLERR)) {
          epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
          c.gone = true;
        }
      } else if (c.state == State::kWriting) {
        if (evs[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) OnWritable(c);
      } else if (c.state == State::kLinger || !stopping) {
        OnReadable(c);
      }
    }
    const auto now = Clock::now();
    if (now - last_tick >= std::chrono::milliseconds(kTickMs)) {
      last_tick = now;
      if (accept_paused_ && !stop_.load()) {
        accept_paused_ = false;
        epoll_event e{};
        e.events = EPOLLIN;
        e.data.fd = listen_;
        epoll_ctl(ep_, EPOLL_CTL_MOD, listen_, &e);
      }
      std::vector<int> expired;
      for (auto& [fd, c] : conns_) {
        if (c.state != State::kBusy && now >= c.deadline) expired.push_back(fd);
      }
      for (int fd : expired) {
        Conn& c = conns_.at(fd);
        if (c.state == State::kHead && !c.started) {
          Close(fd);  // an idle keep-alive connection
        } else if (c.state == State::kWriting || c.state == State::kLinger) {
          Close(fd);
        } else {
          Reply(c, 408, "the request did not arrive within " + std::to_string(lim_.request_timeout_ms) + " ms");
        }
      }
    }
    if (stop_.load() && busy_ == 0) break;
  }
  while (!conns_.empty()) Close(conns_.begin()->first);
  pool_->shutdown();
  pool_.reset();
  ::close(ep_);
  ep_ = -1;
  return true;
}

void FrontServer::Front::Accept() {
  for (;;) {
    const int fd = accept4(listen_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && Evict()) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        // Out of descriptors with nothing to give back: wait a tick rather than spin.
        accept_paused_ = true;
        epoll_event e{};
        e.data.fd = listen_;
        epoll_ctl(ep_, EPOLL_CTL_MOD, listen_, &e);
      }
      return;
    }
    if (conns_.size() >= lim_.max_connections) (void)Evict();
    Conn& c = conns_[fd];
    c.fd = fd;
    c.gen = next_gen_++;
    c.deadline = Clock::now() + std::chrono::milliseconds(lim_.idle_timeout_ms);
    Address(fd, true, &c.rip, &c.rport);
    Address(fd, false, &c.lip, &c.lport);
    epoll_event e{};
    e.events = EPOLLIN | EPOLLRDHUP;
    e.data.fd = fd;
    epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &e);
    open_.store(conns_.size());
  }
}

// Gives back the oldest connection nobody is answering (idle, reading, lingering); false if none.
bool FrontServer::Front::Evict() {
  int oldest = -1;
  uint64_t gen = UINT64_MAX;
  for (const auto& [fd, c] : conns_) {
    if (c.state != State::kBusy && c.state != State::kWriting && c.gen < gen) {
      gen = c.gen;
      oldest = fd;
    }
  }
  if (oldest < 0) return false;
  Close(oldest);
  return true;
}

void FrontServer::Front::Close(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  ReleaseBody(it->second);
  epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  conns_.erase(it);
  open_.store(conns_.size());
}

void FrontServer::Front::Watch(Conn& c, uint32_t events) {
  epoll_event e{};
  e.events = events;
  e.data.fd = c.fd;
  epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &e);
}

void FrontServer::Front::OnReadable(Conn& c) {
  char buf[kReadChunk];
  const int fd = c.fd;
  for (;;) {
    // Never more than a head's worth ahead of the parser: a body moves into c.body as it comes.
    if (c.state != State::kLinger && c.in.size() >= lim_.max_head_bytes + kReadChunk) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      Close(fd);
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (c.state == State::kLinger) {
      c.lingered += static_cast<size_t>(n);
      if (c.lingered > kLingerBytes) {
        Close(fd);
        return;
      }
      continue;
    }
    if (!c.started) {
      c.started = true;
      c.deadline = Clock::now() + std::chrono::milliseconds(lim_.request_timeout_ms);
    }
    c.in.append(buf, static_cast<size_t>(n));
    Advance(c);
    if (conns_.find(fd) == conns_.end()) return;
    if (c.state == State::kBusy || c.state == State::kWriting || c.state == State::kLinger) return;
  }
}

// Parses what c.in holds, as far as it goes: a head, then its body (by Content-Length or chunked).
void FrontServer::Front::Advance(Conn& c) {
  for (;;) {
    switch (c.state) {
      case State::kHead: {
        // Empty lines before a request line are allowed (RFC 9112 2.2).
        size_t skip = 0;
        while (skip + 1 < c.in.size() && c.in[skip] == '\r' && c.in[skip + 1] == '\n') skip += 2;
        if (skip > 0) c.in.erase(0, skip);
        if (c.in.empty()) {
          c.started = false;
          c.deadline = Clock::now() + std::chrono::milliseconds(lim_.idle_timeout_ms);
          return;
        }
        const size_t end = c.in.find("\r\n\r\n");
        if (end == std::string::npos || end + 4 > lim_.max_head_bytes) {
          if (c.in.size() > lim_.max_head_bytes || (end != std::string::npos)) {
            Reply(c, 431, "the request head is larger than " + std::to_string(lim_.max_head_bytes) + " bytes");
          }
          return;
        }
        if (!ParseHead(c, end)) return;
        break;
      }
      case State::kBody: {
        const size_t k = std::min(c.want, c.in.size());
        if (!AddBody(c, c.in.data(), k)) return;
        c.in.erase(0, k);
        c.want -= k;
        if (c.want > 0) return;
        Dispatch(c);
        return;
      }
      case State::kChunkSize: {
        const size_t eol = c.in.find("\r\n");
        if (eol == std::string::npos) {
          if (c.in.size() > kMaxChunkLine) Reply(c, 400, "a chunk size line is too long");
          return;
        }
        if (eol > kMaxChunkLine) return Reply(c, 400, "a chunk size line is too long");
        const std::string line = c.in.substr(0, eol);
        size_t digits = 0;
        while (digits < line.size() && std::isxdigit(static_cast<unsigned char>(line[digits]))) ++digits;
        if (digits == 0 || digits > 8 ||
            (digits < line.size() && line[digits] != ';' && line[digits] != ' ' && line[digits] != '\t')) {
          return Reply(c, 400, "a chunk size is not hexadecimal");
        }
        const size_t size = std::stoul(line.substr(0, digits), nullptr, 16);
        c.in.erase(0, eol + 2);
        if (size == 0) {
          c.state = State::kTrailers;
        } else if (c.body.size() + size > lim_.max_body_bytes) {
          return Reply(c, 413, "the request body is larger than " + std::to_string(lim_.max_body_bytes) + " bytes");
        } else {
          c.want = size;
          c.state = State::kChunkData;
        }
        break;
      }
      case State::kChunkData: {
        const size_t k = std::min(c.want, c.in.size());
        if (!AddBody(c, c.in.data(), k)) return;
        c.in.erase(0, k);
        c.want -= k;
        if (c.want > 0) return;
        c.state = State::kChunkEnd;
        break;
      }
      case State::kChunkEnd:
        if (c.in.size() < 2) return;
        if (c.in.compare(0, 2, "\r\n") != 0) return Reply(c, 400, "a chunk does not end with CRLF");
        c.in.erase(0, 2);
        c.state = State::kChunkSize;
        break;
      case State::kTrailers: {
        // Trailer fields are read and dropped (none of the routes uses one).
        const size_t eol = c.in.find("\r\n");
        if (eol == std::string::npos) {
          if (c.trailer + c.in.size() > lim_.max_head_bytes) Reply(c, 431, "the trailer is too large");
          return;
        }
        c.trailer += eol + 2;
        if (c.trailer > lim_.max_head_bytes) return Reply(c, 431, "the trailer is too large");
        c.in.erase(0, eol + 2);
        if (eol == 0) {
          Dispatch(c);
          return;
        }
        break;
      }
      default: return;
    }
  }
}

// The head is c.in[0, end + 4). Checks it and rebuilds it for httplib: the same request line and
// fields, the body's length as Content-Length, no Transfer-Encoding (the front decodes chunks) and
// no Expect (the front answers 100-continue itself).
bool FrontServer::Front::ParseHead(Conn& c, size_t end) {
  const std::string raw = c.in.substr(0, end + 2);
  c.in.erase(0, end + 4);
  httplib::Request req;
  size_t pos = raw.find("\r\n");
  const std::string line = raw.substr(0, pos);
  pos += 2;
  {
    const size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
    if (sp1 == std::string::npos || sp2 == sp1) {
      Reply(c, 400, "malformed request line");
      return false;
    }
    req.method = line.substr(0, sp1);
    req.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    req.version = line.substr(sp2 + 1);
    if (req.method.empty() || !std::all_of(req.method.begin(), req.method.end(), IsTokenChar) || req.target.empty() ||
        req.target[0] != '/' || (req.version != "HTTP/1.1" && req.version != "HTTP/1.0") ||
        std::any_of(line.begin(), line.end(), [](char ch) {
          return static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) == 0x7f;
        })) {
      Reply(c, 400, "malformed request line");
      return false;
    }
    req.path = req.target.substr(0, req.target.find('?'));
  }
  std::string rebuilt = line + "\r\n";
  int lengths = 0;
  size_t length = 0;
  bool chunked = false, has_te = false, expect = false;
  while (pos < raw.size()) {
    const size_t eol = raw.find("\r\n", pos);
    const std::string f = raw.substr(pos, eol - pos);
    pos = eol + 2;
    const size_t colon = f.find(':');
    if (colon == 0 || colon == std::string::npos || !std::all_of(f.begin(), f.begin() + colon, IsTokenChar)) {
      Reply(c, 400, "malformed header field");
      return false;
    }
    std::string value = f.substr(colon + 1);
    if (std::any_of(value.begin(), value.end(), [](char ch) {
          return (static_cast<unsigned char>(ch) < 0x20 && ch != '\t') || static_cast<unsigned char>(ch) == 0x7f;
        })) {
      Reply(c, 400, "malformed header field");
      return false;
    }
    const size_t b = value.find_first_not_of(" \t"), e = value.find_last_not_of(" \t");
    value = b == std::string::npos ? "" : value.substr(b, e - b + 1);
    const std::string name = f.substr(0, colon), lname = Lower(name);
    if (lname == "content-length") {
      if (++lengths > 1 || value.empty() || value.size() > 18 ||
          value.find_first_not_of("0123456789") != std::string::npos) {
        Reply(c, 400, "Content-Length must be one decimal number");
        return false;
      }
      length = std::stoull(value);
    } else if (lname == "transfer-encoding") {
      if (has_te) {
        Reply(c, 400, "more than one Transfer-Encoding");
        return false;
      }
      has_te = true;
      chunked = Lower(value) == "chunked";
      if (!chunked) {
        Reply(c, 501, "the only Transfer-Encoding accepted is chunked");
        return false;
      }
    } else if (lname == "expect") {
      if (Lower(value) != "100-continue") {
        Reply(c, 417, "the only Expect accepted is 100-continue");
        return false;
      }
      expect = true;
    } else {
      rebuilt += name + ": " + value + "\r\n";
    }
    req.headers.emplace(name, value);
  }
  if (has_te && lengths > 0) {
    Reply(c, 400, "Content-Length and Transfer-Encoding together");
    return false;
  }
  // The REST layer's checks (keys, Content-Length) before the body is read.
  httplib::Response res;
  if (check_ && check_(req, res)) {
    std::string body = res.body;
    if (body.empty()) body = "{}";
    Reply(c, res.status > 0 ? res.status : 400, body);
    return false;
  }
  if (length > lim_.max_body_bytes) {
    Reply(c, 413, "the request body is larger than " + std::to_string(lim_.max_body_bytes) + " bytes");
    return false;
  }
  if (expect && (chunked || length > 0)) {
    static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (::send(c.fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof kContinue - 1)) {
      Close(c.fd);
      return false;
    }
  }
  c.head = std::move(rebuilt);
  c.want = length;
  c.state = chunked ? State::kChunkSize : State::kBody;
  c.trailer = 0;
  return true;
}

void FrontServer::Front::Dispatch(Conn& c) {
  c.head += "Content-Length: " + std::to_string(c.body.size()) + "\r\n\r\n";
  std::string request = std::move(c.head);
  request += c.body;
  c.head.clear();
  c.state = State::kBusy;
  Watch(c, 0);
  ++busy_;
  const int fd = c.fd;
  const uint64_t gen = c.gen;
  pool_->enqueue(
      [this, fd, gen, request = std::move(request), rip = c.rip, rport = c.rport, lip = c.lip, lport = c.lport] {
        bool close = false;
        std::string reply = owner_.Route(request, rip, rport, lip, lport, &close);
        {
          std::lock_guard<std::mutex> lock(mu_);
          done_.push_back({fd, gen, std::move(reply), close});
        }
        const uint64_t one = 1;
        (void)!::write(wake_, &one, sizeof one);
      });
}

void FrontServer::Front::OnWritable(Conn& c) {
  while (c.out_pos < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      Watch(c, EPOLLOUT);
      return;
    }
    if (n <= 0) {
      Close(c.fd);
      return;
    }
    c.out_pos += static_cast<size_t>(n);
  }
  std::string().swap(c.out);
  c.out_pos = 0;
  if (c.close_after) {
    // The client may still be sending (an unread body): linger, so the reply is not reset.
    ::shutdown(c.fd, SHUT_WR);
    c.state = State::kLinger;
    c.in.clear();
    c.deadline = Clock::now() + std::chrono::milliseconds(kLingerMs);
    Watch(c, EPOLLIN | EPOLLRDHUP);
    return;
  }
  c.state = State::kHead;
  c.started = !c.in.empty();
  c.deadline = Clock::now() + std::chrono::milliseconds(c.started ? lim_.request_timeout_ms : lim_.idle_timeout_ms);
  Watch(c, EPOLLIN | EPOLLRDHUP);
  // A pipelined request may be complete already.
  const int fd = c.fd;
  Advance(c);
  if (conns_.find(fd) != conns_.end() && c.state == State::kHead) Watch(c, EPOLLIN | EPOLLRDHUP);
}

// An error reply from the front itself; the connection closes after it (what follows is not read).
void FrontServer::Front::Reply(Conn& c, int status, const std::string& json_or_message) {
  std::string body = json_or_message;
  if (body.empty() || body[0] != '{') {
    std::string esc;
    for (char ch : body) {
      if (ch == '"' || ch == '\\') esc += '\\';
      esc += ch;
    }
    body = "{\"error\":" + std::to_string(status) + ",\"message\":\"" + esc + "\"}";
  }
  ReleaseBody(c);
  c.in.clear();
  c.out = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) +
          "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\nConnection: close\r\n\r\n" + body;
  c.out_pos = 0;
  c.close_after = true;
  c.state = State::kWriting;
  c.deadline = Clock::now() + std::chrono::milliseconds(lim_.write_timeout_ms);
  OnWritable(c);
}

FrontServer::FrontServer(FrontLimits limits, HeadCheck check)
    : front_(std::make_unique<Front>(*this, limits, std::move(check))) {}

FrontServer::~FrontServer() = default;

bool FrontServer::Serve(int listen_fd) { return front_->Serve(listen_fd); }

void FrontServer::Stop() { front_->Stop(); }

size_t FrontServer::connections() const { return front_->connections(); }

std::string FrontServer::Route(const std::string& request, const std::string& remote_ip, int remote_port,
                               const std::string& local_ip, int local_port, bool* close) {
  std::string reply;
  MemStream strm(request, &reply, remote_ip, remote_port, local_ip, local_port);
  bool closed = false;
  if (!process_request(strm, false, closed, nullptr)) closed = true;
  *close = closed;
  return reply;
}

}  // namespace orion::controller
