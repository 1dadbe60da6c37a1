// orion/common/net.h — a TCP connection to "host:port", bounded in time: the guest runtime's to
// oriond (ORION_SERVER) and a moving session's from one oriond to another (host/src/session_move.cpp).
//
//   auto fd = ConnectTcp("10.0.0.21:9960", 5000, "oriond at ");
//   if (!fd.ok()) ...;   // the message names the address and the cause
#pragma once

#include <string>

#include "orion/common/status.h"

namespace orion {

// Splits "host:port" ("[v6addr]:port": the brackets dropped). False when `address` has not that shape.
bool SplitHostPort(const std::string& address, std::string* host, std::string* port);

// A TCP socket connected to `address` (host:port; a name or a numeric address) within `timeout_ms`,
// non-blocking and close-on-exec, with TCP_NODELAY; the caller owns it. Errors: kInvalidArgument
// "'<address>' is not host:port"; kUnavailable "cannot resolve <address>: ..." or
// "cannot connect to <peer><address>: <reason>" (`peer` names what is there, e.g. "oriond at ").
Result<int> ConnectTcp(const std::string& address, int timeout_ms, const std::string& peer = "");

}  // namespace orion
