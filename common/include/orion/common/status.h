// orion/common/status.h — the error type for transport, protocol and OS failures.
//
// Modelled on absl::Status: a canonical code plus a message. CUresult values are *data*
// (they travel in replies verbatim) and are never wrapped in a Status; where the guest runtime must
// answer a CUDA call for a failed Status, the call site picks the CUresult the CUDA documentation
// gives that call (e.g. CUDA_ERROR_NO_DEVICE when no oriond can be reached).
//
//   orion::Result<int> ParsePort(std::string_view s);
//   auto port = ParsePort("9960");
//   if (!port.ok()) log(port.status().ToString());
//   use(*port);
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace orion {

enum class Code : uint8_t {
  kOk = 0,
  kInvalidArgument,  // malformed input (config, frame, CLI)
  kNotFound,         // a file, handle or name does not exist
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,   // quota, ring space, vGPUs
  kFailedPrecondition,  // wrong state (region not formatted, channel not claimed)
  kOutOfRange,          // an offset or length outside its buffer
  kUnavailable,         // peer gone (stale lease, dead daemon)
  kDataLoss,            // protocol violation by the peer: tear the session down
  kInternal,
  kUnimplemented,
};

const char* CodeName(Code c) noexcept;

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const noexcept { return code_ == Code::kOk; }
  Code code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // "INVALID_ARGUMENT: listen_port = 'abc' is not a port number"
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {Code::kOutOfRange, std::move(m)}; }
inline Status DataLoss(std::string m) { return {Code::kDataLoss, std::move(m)}; }
inline Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
inline Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {Code::kResourceExhausted, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {Code::kFailedPrecondition, std::move(m)}; }

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  // An error. An OK status here is a bug (there is no value): it becomes kInternal, never a
  // Result whose ok() is false while its status() is OK.
  Result(Status status)  // NOLINT: implicit by design
      : v_(status.ok() ? Status(Code::kInternal, "a Result was built from an OK status, without a value")
                       : std::move(status)) {}
  bool ok() const noexcept { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace orion
