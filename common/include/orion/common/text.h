// orion/common/text.h — peer-supplied text made safe to log, to put in JSON, or to use as an id.
//
// Everything a peer sends (a refusal reason from oriond, a controller's message, an allocation id,
// placement text) is hostile: it may hold terminal escapes, CR/LF that forge log lines, invalid
// UTF-8, or megabytes. Every log line that quotes such text goes through LogSafe.
//
//   LogError("refused: " + LogSafe(reason));          // one bounded, printable line
//   req["process"] = ValidUtf8(ProcessName());          // nlohmann::json::dump cannot throw on it
//   if (!IsUuid(id)) return InvalidArgument("malformed allocation id " + LogSafe(id));
//
// Pure functions (RandomUuid excepted: it reads the kernel's random source): no allocation beyond
// the returned string, thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace orion {

inline constexpr size_t kLogSafeMax = 512;  // bytes of peer text quoted in one log line

// A printable, single-line rendering of `s`: valid UTF-8 characters that are not controls are kept;
// C0 and C1 controls, DEL, backslash and every byte of an invalid UTF-8 sequence become `\xNN`
// (backslash `\\`). At most `max_bytes` bytes of `s` are rendered; a longer `s` ends with
// `...(+N bytes)`. The result is at most 4 * max_bytes + 24 bytes.
std::string LogSafe(std::string_view s, size_t max_bytes = kLogSafeMax);

// `s` with every invalid UTF-8 sequence (stray continuation bytes, overlong forms, surrogates,
// code points past U+10FFFF, truncated sequences) replaced by U+FFFD. Valid input comes back equal.
std::string ValidUtf8(std::string_view s);

// Whether `s` is a canonical UUID: 36 characters, 8-4-4-4-12 hex digits separated by '-'.
bool IsUuid(std::string_view s) noexcept;

// A random (version 4, RFC 9562 section 5.4) UUID in canonical lower-case form, from getrandom(2):
// allocation ids, and the idempotency keys (request_id) clients send with POST /v1/allocations.
// Throws std::system_error when the kernel's random source cannot be read.
std::string RandomUuid();

// ORION_SHARE, the vGPU share of a process tree (README "A process tree shares its vGPUs"): when it
// is unset or empty, sets it to a new token (a random UUID's 32 hex digits) in this process's C
// environment, so that this process's session and those of the processes it starts meet on one
// share; "off" and a value already there are left alone. Call it before other threads read the
// environment (it is setenv(3)); an unreadable random source leaves ORION_SHARE unset.
void EnsureShareToken() noexcept;

}  // namespace orion
