#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

// The clocks of tide: a monotonic one for deadlines and timeouts, and the
// wall clock in seconds since the epoch, the unit torch's records use
// (expiration times, event and failure timestamps).
namespace tide {

using Clock = std::chrono::steady_clock;

// Seconds since the epoch, as Python's time.time().
inline double now_seconds() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Milliseconds left until `deadline`, for poll(): 0 once it passed, and no
// more than INT32_MAX however far away it is.
inline int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - Clock::now())
                  .count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT32_MAX));
}

// Milliseconds from `since` to now.
inline int64_t elapsed_ms(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             Clock::now() - since)
      .count();
}

}  // namespace tide
