#include "rpc_core/in_flight.h"

#include <algorithm>

namespace tide::rpc_core {

namespace {

// How often wait_idle() asks `also` again.
constexpr std::chrono::milliseconds kPoll{5};

}  // namespace

void InFlight::add(int64_t delta) {
  bool idle = false;
  {
    std::lock_guard lock(mutex_);
    count_ += delta;
    idle = count_ == 0;
  }
  if (idle) {
    idle_.notify_all();
  }
}

int64_t InFlight::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

bool InFlight::wait_idle(
    std::chrono::steady_clock::time_point deadline,
    const std::function<int64_t()>& also) const {
  std::unique_lock lock(mutex_);
  auto idle = [&] { return count_ == 0 && (!also || also() == 0); };
  if (!also && deadline == std::chrono::steady_clock::time_point::max()) {
    idle_.wait(lock, idle);
    return true;
  }
  for (;;) {
    auto until =
        also ? std::min(deadline, std::chrono::steady_clock::now() + kPoll)
             : deadline;
    if (idle_.wait_until(lock, until, idle)) {
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
  }
}

}  // namespace tide::rpc_core
