#include "orion/host/metrics_server.h"

#include <httplib.h>

namespace orion::host {

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0) return InvalidArgument("metrics_addr must be host:port, not " + addr);
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(addr.substr(colon + 1), &used);
    if (used != addr.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
    port = -1;
  }
  if (port < 0 || port > 65535) return InvalidArgument("metrics_addr " + addr + ": the port must be 0..65535");
  std::string host = addr.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->server_ = std::make_unique<httplib::Server>();
  httplib::Server& s = *m->server_;
  // Few, small, read-only requests: a small pool and short timeouts bound what a scraper (or
  // anyone reaching the port) can hold.
  s.new_task_queue = [] { return new httplib::ThreadPool(2); };
  s.set_read_timeout(5, 0);
  s.set_write_timeout(5, 0);
  s.set_keep_alive_max_count(10);
  s.set_payload_max_length(4096);
  MetricsServer* self = m.get();
  s.Get("/metrics", [self](const httplib::Request&, httplib::Response& res) {
    std::string body;
    {
      std::lock_guard<std::mutex> l(self->mu_);
      body = self->text_;
    }
    res.set_content(body, "text/plain; version=0.0.4");
  });
  const int bound = port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, port) ? port : -1);
  if (bound < 0) return Unavailable("metrics_addr " + addr + ": cannot listen there");
  m->port_ = bound;
  m->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
  return m;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void MetricsServer::Publish(std::string text) {
  std::lock_guard<std::mutex> l(mu_);
  text_ = std::move(text);
}

std::string PromLabel(const std::string& v) {
  std::string out;
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c >= 0x7f) {
      out += '?';
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace orion::host
