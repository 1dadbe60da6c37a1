// orion/host/control.h — talking to oriond's control socket (a root-only Unix socket; one request
// line per connection, one reply line: "ok ..." or "error ..."). Used by the libvirt hook
// (orion-vm), orion-check and orion-smi.
//
//   auto reply = ControlRequest("/run/orion/oriond.sock", "status");
//   if (!reply.ok()) ...;   // kUnavailable: oriond is not running
#pragma once

#include <string>

#include "orion/common/status.h"

namespace orion::host {

// Sends `line` and returns oriond's reply line (without the newline). Errors: kUnavailable when
// nothing listens on `socket_path`, kPermissionDenied when this user may not connect (the socket is
// root-only), kDataLoss when oriond does not answer within `timeout_ms`.
Result<std::string> ControlRequest(const std::string& socket_path, const std::string& line, int timeout_ms = 15000);

}  // namespace orion::host
