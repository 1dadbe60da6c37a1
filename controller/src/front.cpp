// The controller's connection front: see front.h.
#include "front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/optional.hpp>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace orion::controller {

namespace {

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;

// After an error reply that closes the connection, the rest of what the client sends is read and
// dropped for this long (at most kLingerBytes) before the close: closing a socket with unread
// input sends a reset, which can destroy the reply before the client reads it.
constexpr int kLingerMs = 2000;
constexpr size_t kLingerBytes = 1 << 20;
constexpr size_t kReadChunk = 16 * 1024;
constexpr int kTickMs = 100;
// The first byte of a TLS connection: a handshake record.
constexpr unsigned char kTlsHandshake = 0x16;

// OpenSSL's queued errors as one line (the queue emptied).
std::string OpenSslError() {
  std::string s;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    s += (s.empty() ? "" : "; ") + std::string(buf);
  }
  return s.empty() ? "unknown OpenSSL error" : s;
}

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

// A request body as Beast's parser decodes it: a string, each byte counted against the bytes the
// front holds for all connections (no_buffer_space past `cap`: 503).
struct CountedBody {
  struct value_type {
    std::string data;
    size_t* held = nullptr;
    size_t cap = 0;
  };
  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(http::header<isRequest, Fields>& /*head*/, value_type& body) : body_(body) {}
    void init(const boost::optional<uint64_t>& /*length*/, boost::system::error_code& ec) { ec = {}; }
    template <class Buffers>
    size_t put(const Buffers& buffers, boost::system::error_code& ec) {
      const size_t n = boost::asio::buffer_size(buffers);
      if (*body_.held + n > body_.cap) {
        ec = boost::system::errc::make_error_code(boost::system::errc::no_buffer_space);
        return 0;
      }
      for (const auto b : boost::beast::buffers_range_ref(buffers))
        body_.data.append(static_cast<const char*>(b.data()), b.size());
      *body_.held += n;
      ec = {};
      return n;
    }
    void finish(boost::system::error_code& ec) { ec = {}; }

   private:
    value_type& body_;
  };
};
using Parser = http::request_parser<CountedBody>;

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
    if (tls_) SSL_CTX_free(tls_);
  }
  std::string UseTls(const std::string& cert, const std::string& key, const std::string& client_ca);

  bool Serve(int listen_fd);
  void Stop() {
    stop_.store(true);
    const uint64_t one = 1;
    if (wake_ >= 0) (void)!::write(wake_, &one, sizeof one);
  }
  size_t connections() const { return open_.load(); }

 private:
  enum class State { kHandshake, kRead, kBusy, kWriting, kLinger };
  struct Conn {
    int fd = -1;
    SSL* ssl = nullptr;     // TLS (after the handshake's first byte, until the close)
    uint32_t watching = 0;  // the epoll interest now
    uint64_t gen = 0;       // accept order: the oldest is evicted first
    State state = State::kRead;
    std::string in;                // read, not yet parsed
    std::optional<Parser> parser;  // the request being read (its head and body), from its first byte
    std::string head;              // its head as httplib sees it (rebuilt once checked)
    size_t head_used = 0;          // bytes of its head the parser took
    size_t lingered = 0;           // bytes dropped while lingering
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
  void Handshake(Conn& c);
  // Reads or writes the connection (TLS or not): > 0 bytes; 0 closed or failed; -1 would block,
  // with the interest it waits for in *want (EPOLLIN or EPOLLOUT: TLS may read to write).
  ssize_t Recv(Conn& c, char* p, size_t n, uint32_t* want);
  ssize_t Send(Conn& c, const char* p, size_t n, uint32_t* want);
  void OnReadable(Conn& c);
  void Advance(Conn& c);
  bool CheckHead(Conn& c);
  void Dispatch(Conn& c);
  void OnWritable(Conn& c);
  void Reply(Conn& c, int status, const std::string& json);
  void Watch(Conn& c, uint32_t events);
  void Close(int fd);
  bool Evict();
  std::string TooLarge() const {
    return "the request body is larger than " + std::to_string(lim_.max_body_bytes) + " bytes";
  }
  void ReleaseBody(Conn& c) {
    if (c.parser) buffered_ -= std::min(buffered_, c.parser->get().body().data.size());
    c.parser.reset();
  }

  FrontServer& owner_;
  FrontLimits lim_;
  HeadCheck check_;
  SSL_CTX* tls_ = nullptr;  // HTTPS only, when set
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
      if (c.state == State::kHandshake) {
        if (!stopping) Handshake(c);
      } else if (c.state == State::kBusy) {
        // Gone while its route runs: stop listening (a hang-up is reported until the close);
        // the reply is dropped when it comes.
        if (evs[i].events & (EPOLLHUP | EPOLLERR)) {
          epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
          c.gone = true;
        }
      } else if (c.state == State::kWriting) {
        // TLS may wait to read before it can write.
        if (c.ssl != nullptr || (evs[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) OnWritable(c);
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
        if ((c.state == State::kRead && !c.started) || c.state == State::kHandshake) {
          Close(fd);  // an idle keep-alive connection, or a TLS handshake not done in the idle time
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
    if (tls_ != nullptr) c.state = State::kHandshake;
    epoll_event e{};
    e.events = EPOLLIN | EPOLLRDHUP;
    e.data.fd = fd;
    c.watching = e.events;
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
  if (it->second.ssl != nullptr) SSL_free(it->second.ssl);
  epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  conns_.erase(it);
  open_.store(conns_.size());
}

void FrontServer::Front::Watch(Conn& c, uint32_t events) {
  if (c.watching == events) return;
  c.watching = events;
  epoll_event e{};
  e.events = events;
  e.data.fd = c.fd;
  epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &e);
}

void FrontServer::Front::OnReadable(Conn& c) {
  char buf[kReadChunk];
  const int fd = c.fd;
  for (;;) {
    // Never more than a head's worth ahead of the parser: it takes a body as it comes.
    if (c.state != State::kLinger && c.in.size() >= lim_.max_head_bytes + kReadChunk) break;
    uint32_t want = EPOLLIN;
    const ssize_t n = Recv(c, buf, sizeof buf, &want);
    if (n == 0) {
      Close(fd);
      return;
    }
    if (n < 0) {
      Watch(c, want | EPOLLRDHUP);
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

// Feeds what c.in holds to the request's parser (Beast's), as far as it goes: its head is checked
// before the parser takes one byte of its body; a complete request goes to a worker.
void FrontServer::Front::Advance(Conn& c) {
  for (;;) {
    if (!c.parser) {
      // Empty lines before a request line are allowed (RFC 9112 2.2).
      size_t skip = 0;
      while (skip + 1 < c.in.size() && c.in[skip] == '\r' && c.in[skip + 1] == '\n') skip += 2;
      c.in.erase(0, skip);
      if (c.in.empty()) {
        c.started = false;
        c.deadline = Clock::now() + std::chrono::milliseconds(lim_.idle_timeout_ms);
        return;
      }
      c.parser.emplace();
      c.parser->header_limit(static_cast<uint32_t>(std::min<size_t>(lim_.max_head_bytes, UINT32_MAX)));
      // No limit until the head is checked (a 401 before a 413). Not boost::none: Beast 1.74 compares
      // a Content-Length with an empty optional as greater.
      c.parser->body_limit(UINT64_MAX);
      c.parser->get().body().held = &buffered_;
      c.parser->get().body().cap = lim_.max_body_buffered;
      c.head_used = 0;
    }
    Parser& p = *c.parser;
    if (c.in.empty()) return;
    // The parser sees at most what is left of the head's bytes, or a head's worth after it: a head,
    // a chunk line or the final chunk with its trailer must fit (Beast does not bound the trailer,
    // and counts the request line apart from the fields).
    const bool had_head = p.is_header_done();
    const size_t room =
        had_head ? lim_.max_head_bytes : lim_.max_head_bytes - std::min(lim_.max_head_bytes, c.head_used);
    const size_t fed = std::min(c.in.size(), room);
    boost::system::error_code ec;
    const size_t k = p.put(boost::asio::buffer(c.in.data(), fed), ec);
    c.in.erase(0, k);
    if (!had_head) c.head_used += k;
    const bool stuck = ec == http::error::need_more || (!ec && k == 0);
    if (stuck && k > 0) continue;
    if (stuck && fed < room) return;
    if (stuck || ec == http::error::header_limit) {
      return Reply(c, 431,
                   std::string(had_head ? "a chunk line or the trailer" : "the request head") + " is larger than " +
                       std::to_string(lim_.max_head_bytes) + " bytes");
    }
    if (ec == http::error::body_limit) return Reply(c, 413, TooLarge());
    if (ec == boost::system::errc::no_buffer_space) {
      return Reply(c, 503, "the controller holds too many request bodies now; retry");
    }
    if (ec) return Reply(c, 400, "malformed request: " + ec.message());
    if (!had_head && p.is_header_done() && !CheckHead(c)) return;
    if (p.is_done()) return Dispatch(c);
  }
}

// The parser has the head and none of its body: what Beast accepts and we do not (a target that is
// not a path, Transfer-Encoding other than chunked, Content-Length and Transfer-Encoding together),
// then the REST layer's checks (keys, Content-Length), before the body is read.
bool FrontServer::Front::CheckHead(Conn& c) {
  Parser& p = *c.parser;
  const auto& m = p.get();
  httplib::Request req;
  req.method = std::string(m.method_string());
  req.target = std::string(m.target());
  req.version = m.version() == 10 ? "HTTP/1.0" : "HTTP/1.1";
  req.path = req.target.substr(0, req.target.find('?'));
  // The head httplib will see: the same request line and fields, the body's length as
  // Content-Length (at dispatch), no Transfer-Encoding (Beast decodes chunks) and no Expect (answered
  // here). Trailer fields, which Beast adds to the message, are not passed on.
  c.head = req.method + " " + req.target + " " + req.version + "\r\n";
  for (const auto& f : m) {
    req.headers.emplace(std::string(f.name_string()), std::string(f.value()));
    if (f.name() != http::field::content_length && f.name() != http::field::transfer_encoding &&
        f.name() != http::field::expect) {
      c.head += std::string(f.name_string()) + ": " + std::string(f.value()) + "\r\n";
    }
  }
  const auto te = m.find(http::field::transfer_encoding);
  const auto length = m.find(http::field::content_length);
  const auto expect = m.find(http::field::expect);
  auto fail = [&](int status, const std::string& message) {
    Reply(c, status, message);
    return false;
  };
  if (req.target.empty() || req.target[0] != '/') return fail(400, "malformed request line");
  if (m.count(http::field::content_length) > 1 ||
      (length != m.end() && length->value().find_first_not_of("0123456789") != boost::string_view::npos)) {
    return fail(400, "Content-Length must be one decimal number");
  }
  if (m.count(http::field::transfer_encoding) > 1) return fail(400, "more than one Transfer-Encoding");
  if (te != m.end() && !boost::beast::iequals(te->value(), "chunked")) {
    return fail(501, "the only Transfer-Encoding accepted is chunked");
  }
  for (auto [e, end] = m.equal_range(http::field::expect); e != end; ++e) {
    if (!boost::beast::iequals(e->value(), "100-continue"))
      return fail(417, "the only Expect accepted is 100-continue");
  }
  if (te != m.end() && length != m.end()) return fail(400, "Content-Length and Transfer-Encoding together");
  httplib::Response res;
  if (check_ && check_(req, res)) return fail(res.status > 0 ? res.status : 400, res.body.empty() ? "{}" : res.body);
  if (p.content_length().value_or(0) > lim_.max_body_bytes) return fail(413, TooLarge());
  p.body_limit(lim_.max_body_bytes);  // the decoded body, chunked or not
  p.eager(true);
  if (expect != m.end() && !p.is_done()) {
    static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
    uint32_t want = 0;
    if (Send(c, kContinue, sizeof kContinue - 1, &want) != static_cast<ssize_t>(sizeof kContinue - 1)) {
      Close(c.fd);
      return false;
    }
  }
  return true;
}

void FrontServer::Front::Dispatch(Conn& c) {
  const std::string& body = c.parser->get().body().data;
  std::string request = std::move(c.head);
  request += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
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
    uint32_t want = EPOLLOUT;
    const ssize_t n = Send(c, c.out.data() + c.out_pos, c.out.size() - c.out_pos, &want);
    if (n < 0) {
      Watch(c, want);
      return;
    }
    if (n == 0) {
      Close(c.fd);
      return;
    }
    c.out_pos += static_cast<size_t>(n);
  }
  std::string().swap(c.out);
  c.out_pos = 0;
  if (c.close_after) {
    // The client may still be sending (an unread body): linger, so the reply is not reset. TLS says
    // close_notify first (once, not waited for); what comes after is dropped unread by TLS.
    if (c.ssl != nullptr) (void)SSL_shutdown(c.ssl);
    ::shutdown(c.fd, SHUT_WR);
    c.state = State::kLinger;
    c.in.clear();
    c.deadline = Clock::now() + std::chrono::milliseconds(kLingerMs);
    Watch(c, EPOLLIN | EPOLLRDHUP);
    return;
  }
  c.state = State::kRead;
  c.started = !c.in.empty();
  c.deadline = Clock::now() + std::chrono::milliseconds(c.started ? lim_.request_timeout_ms : lim_.idle_timeout_ms);
  Watch(c, EPOLLIN | EPOLLRDHUP);
  // A pipelined request may be complete already.
  const int fd = c.fd;
  Advance(c);
  if (conns_.find(fd) != conns_.end() && c.state == State::kRead) {
    Watch(c, EPOLLIN | EPOLLRDHUP);
    // TLS may hold decrypted bytes of the next request that epoll will not report.
    if (c.ssl != nullptr && SSL_has_pending(c.ssl) == 1) OnReadable(c);
  }
}

// A TLS connection's first bytes: a plain-HTTP client gets a plain 400 (and the close); TLS goes
// through SSL_accept, as far as the bytes that came allow.
void FrontServer::Front::Handshake(Conn& c) {
  if (c.ssl == nullptr) {
    unsigned char first = 0;
    const ssize_t n = ::recv(c.fd, &first, 1, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) return Close(c.fd);
    if (first != kTlsHandshake) {
      c.state = State::kRead;
      c.started = true;
      return Reply(c, 400,
                   "this Orion Controller serves HTTPS only: use https://" + c.lip + ":" + std::to_string(c.lport));
    }
    c.ssl = SSL_new(tls_);
    if (c.ssl == nullptr || SSL_set_fd(c.ssl, c.fd) != 1) return Close(c.fd);
  }
  ERR_clear_error();
  const int r = SSL_accept(c.ssl);
  if (r == 1) {
    c.state = State::kRead;
    Watch(c, EPOLLIN | EPOLLRDHUP);
    return OnReadable(c);  // a request may have come with the handshake's last bytes
  }
  switch (SSL_get_error(c.ssl, r)) {
    case SSL_ERROR_WANT_READ: return Watch(c, EPOLLIN | EPOLLRDHUP);
    case SSL_ERROR_WANT_WRITE: return Watch(c, EPOLLOUT | EPOLLRDHUP);
    default:
      // No TLS version or cipher in common, a client certificate refused, garbage. OpenSSL has
      // queued its alert: linger as after an error reply, so that the client's next bytes (TLS 1.3
      // sends its request before it reads the server's verdict) do not reset the alert away.
      ERR_clear_error();
      ::shutdown(c.fd, SHUT_WR);
      c.state = State::kLinger;
      c.deadline = Clock::now() + std::chrono::milliseconds(kLingerMs);
      return Watch(c, EPOLLIN | EPOLLRDHUP);
  }
}

ssize_t FrontServer::Front::Recv(Conn& c, char* p, size_t n, uint32_t* want) {
  if (c.ssl == nullptr || c.state == State::kLinger) {
    for (;;) {
      const ssize_t k = ::recv(c.fd, p, n, 0);
      if (k >= 0) return k;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return 0;
      *want = EPOLLIN;
      return -1;
    }
  }
  ERR_clear_error();
  const int k = SSL_read(c.ssl, p, static_cast<int>(std::min<size_t>(n, INT32_MAX)));
  if (k > 0) return k;
  switch (SSL_get_error(c.ssl, k)) {
    case SSL_ERROR_WANT_READ: *want = EPOLLIN; return -1;
    case SSL_ERROR_WANT_WRITE: *want = EPOLLOUT; return -1;
    default: ERR_clear_error(); return 0;
  }
}

ssize_t FrontServer::Front::Send(Conn& c, const char* p, size_t n, uint32_t* want) {
  if (c.ssl == nullptr) {
    for (;;) {
      const ssize_t k = ::send(c.fd, p, n, MSG_NOSIGNAL);
      if (k > 0) return k;
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        *want = EPOLLOUT;
        return -1;
      }
      return 0;
    }
  }
  ERR_clear_error();
  const int k = SSL_write(c.ssl, p, static_cast<int>(std::min<size_t>(n, INT32_MAX)));
  if (k > 0) return k;
  switch (SSL_get_error(c.ssl, k)) {
    case SSL_ERROR_WANT_READ: *want = EPOLLIN; return -1;
    case SSL_ERROR_WANT_WRITE: *want = EPOLLOUT; return -1;
    default: ERR_clear_error(); return 0;
  }
}

std::string FrontServer::Front::UseTls(const std::string& cert, const std::string& key, const std::string& client_ca) {
  for (const auto& [name, path] : {std::pair{"tls_cert", cert}, std::pair{"tls_key", key}}) {
    if (path.empty()) return std::string(name) + " is not set (HTTPS needs tls_cert and tls_key)";
    if (!std::ifstream(path)) return std::string(name) + ": cannot read " + path + ": " + std::strerror(errno);
  }
  if (!client_ca.empty() && !std::ifstream(client_ca)) {
    return "tls_client_ca: cannot read " + client_ca + ": " + std::strerror(errno);
  }
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return "cannot make a TLS context: " + OpenSslError();
  std::string why;
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
    why = "cannot require TLS 1.2: " + OpenSslError();
  } else if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1) {
    why = "tls_cert " + cert + " is not a PEM certificate: " + OpenSslError();
  } else {
    EVP_PKEY* pkey = nullptr;
    if (BIO* bio = BIO_new_file(key.c_str(), "r")) {
      // No passphrase prompt (OpenSSL's default reads the terminal): an encrypted key is refused.
      pkey = PEM_read_bio_PrivateKey(
          bio, nullptr, [](char*, int, int, void*) { return 0; }, nullptr);
      BIO_free(bio);
    }
    if (pkey == nullptr) {
      why = "tls_key " + key + " is not a PEM private key (without a passphrase): " + OpenSslError();
    } else if (SSL_CTX_use_PrivateKey(ctx, pkey) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
      why = "tls_key " + key + " is not the key of tls_cert " + cert + ": " + OpenSslError();
    }
    EVP_PKEY_free(pkey);
  }
  if (why.empty() && !client_ca.empty()) {
    // Mutual TLS: a client must show a certificate that this CA file's CAs signed.
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(client_ca.c_str());
    if (names == nullptr || SSL_CTX_load_verify_locations(ctx, client_ca.c_str(), nullptr) != 1) {
      why = "tls_client_ca " + client_ca + " holds no PEM CA certificate: " + OpenSslError();
      if (names != nullptr) sk_X509_NAME_pop_free(names, X509_NAME_free);
    } else {
      SSL_CTX_set_client_CA_list(ctx, names);
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      static const unsigned char kSessionContext[] = "orion-controller";
      SSL_CTX_set_session_id_context(ctx, kSessionContext, sizeof kSessionContext - 1);
    }
  }
  if (!why.empty()) {
    SSL_CTX_free(ctx);
    return why;
  }
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  // Partial writes of a reply, retried from a std::string; buffers given back while idle.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
  if (tls_) SSL_CTX_free(tls_);
  tls_ = ctx;
  return "";
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

std::string FrontServer::UseTls(const std::string& cert_file, const std::string& key_file,
                                const std::string& client_ca_file) {
  return front_->UseTls(cert_file, key_file, client_ca_file);
}

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
