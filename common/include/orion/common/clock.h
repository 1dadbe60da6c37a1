// orion/common/clock.h — the monotonic clock in milliseconds (CLOCK_MONOTONIC: never steps back,
// does not count a suspended host's sleep), for leases, deadlines and timeouts.
#pragma once

#include <time.h>

#include <cstdint>

namespace orion {

inline uint64_t MonotonicMs() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000ull + static_cast<uint64_t>(ts.tv_nsec) / 1000000ull;
}

}  // namespace orion
