#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include "common/clock.h"

// The transport's timers: functions to run on the loop at a time, any number
// of them, behind one asio timer set to the earliest. The layers above keep
// no deadline books or timing threads of their own: a call's deadline, a
// retry's pause, a handshake's limit each schedule one here
// (Transport::schedule) and cancel it when it is no longer needed.
//
// Thread safety: add() and cancel() from any thread; the functions run on
// the loop, one at a time, never under the queue's lock.
namespace tide::transport {

class TimerQueue {
 public:
  explicit TimerQueue(asio::io_context& io) : timer_(io) {}
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Queues fn to run on the loop at `at` (at once when `at` has passed);
  // returns its id. After close_on_loop() fn is dropped unrun (id 0).
  uint64_t add(Clock::time_point at, std::function<void()> fn);
  // Unqueues the timer `id` added for `at`: false when it has run, runs
  // now, or was cancelled already.
  bool cancel(Clock::time_point at, uint64_t id);
  // Drops every timer unrun and takes no more, so that nothing keeps the
  // loop from running out of work. On the loop, at shutdown.
  void close_on_loop();

  // Timers waiting. Thread safe.
  size_t size();

 private:
  using Key = std::pair<Clock::time_point, uint64_t>;

  // Sets the asio timer to the earliest timer. On the loop.
  void arm_on_loop();
  // Runs the timers whose time has come. On the loop.
  void fire_on_loop();

  std::mutex mutex_;
  // Guarded by mutex_.
  std::map<Key, std::function<void()>> queue_;
  // When the asio timer goes off, or is about to be set to (max: never).
  Clock::time_point armed_ = Clock::time_point::max();
  uint64_t next_id_ = 1;
  bool closed_ = false;

  asio::steady_timer timer_;  // Loop only.
};

}  // namespace tide::transport
