#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

// The work one worker has in flight, as the group's drain counts it
// (GroupBarrier::drain): calls it waits for, or functions it runs. Both rpc
// front ends count theirs in one (the C++ agent its running functions, the
// TIDE backend its calls); the shutdown barrier waits until it is idle.
//
// Thread safety: any thread.
namespace tide::rpc_core {

class InFlight {
 public:
  // One more (+1) or one less (-1); waiters are woken when it reaches 0.
  void add(int64_t delta);
  int64_t count() const;
  // Waits until count() is 0 and `also` (work counted elsewhere that ends
  // without telling this count: polled every few milliseconds) says 0 too,
  // or `deadline` passes; whether it is idle.
  bool wait_idle(
      std::chrono::steady_clock::time_point deadline,
      const std::function<int64_t()>& also = nullptr) const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable idle_;
  int64_t count_ = 0;  // Guarded by mutex_.
};

}  // namespace tide::rpc_core
