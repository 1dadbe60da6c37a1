// orion/host/metrics_server.h — oriond's Prometheus endpoint: `GET /metrics` on [orion]
// metrics_addr (host:port; off when empty), served by cpp-httplib on threads of its own.
//
// The daemon's loop owns every number it reports, so it renders the text itself about once a
// second and hands it over (Publish); the server only copies that snapshot out, under a mutex, and
// never touches the daemon's state. Anything but `GET /metrics` is a 404.
//
//   auto m = MetricsServer::Start("127.0.0.1:9964");   // kInvalidArgument / kUnavailable (bind)
//   (*m)->Publish(text);                                // from the daemon's loop
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "orion/common/status.h"

namespace httplib {
class Server;
}

namespace orion::host {

class MetricsServer {
 public:
  // Binds `addr` ("host:port"; port 0 picks a free one, see port()) and starts serving.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& addr);
  ~MetricsServer();  // stops the server and joins its thread
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  void Publish(std::string text);
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::string text_;
};

// A Prometheus label value: `"` `\` and newlines escaped, bytes outside printable ASCII replaced
// by '?' (client-supplied names are arbitrary bytes).
std::string PromLabel(const std::string& v);

}  // namespace orion::host
