#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

// The transport's I/O loop, which a thread about to wait may run itself.
//
// The loop's handlers (reads, connects, timers, completions) run on one
// thread at a time: the I/O thread, or a thread lent to the loop. A caller
// waiting in rpc_sync, or a pool thread waiting for its next request, lends
// itself (lend()): it takes the loop while no one else holds it and runs one
// ready handler at a time until what it waits for is in, so the reply or
// request it waits for is read on the thread that needs it, with no hand-off
// (a wake-up and a switch, ~2 us each here). Meanwhile the I/O thread stands
// aside. docs/thread_model.md#a-waiting-thread-runs-the-loop says more.
namespace tide::transport {

class LendableLoop {
 public:
  // `poll`: how long the I/O thread, and a thread lent to the loop, keep
  // polling after their last work before they sleep.
  explicit LendableLoop(std::chrono::microseconds poll);
  ~LendableLoop();
  LendableLoop(const LendableLoop&) = delete;
  LendableLoop& operator=(const LendableLoop&) = delete;

  asio::io_context& io() {
    return io_;
  }

  // Starts the I/O thread, which runs the loop until it runs out of work
  // after release_work().
  void start();
  // Lets the loop end once its handlers are done. Any thread; once.
  void release_work();
  // Waits for the I/O thread to end.
  void join();

  // Runs the loop's ready handlers on this thread, one at a time, while the
  // loop is free, until done() holds, the polling time passes without work,
  // or the I/O thread sleeps in epoll (it then takes what comes); then returns,
  // and the caller blocks as it would have. Does nothing on a thread that is
  // running a loop's handlers (this one's or another's). Thread safe.
  void lend(const std::function<bool()>& done);

  // Whether this thread is running this loop's handlers now.
  bool on_loop() const;

 private:
  // The I/O thread: polls while work is recent, then sleeps in epoll;
  // stands aside while a lent thread has work.
  void run_io_thread();
  // Runs ready handlers (only the first with `one`) on this thread, which
  // holds loop_mutex_; logs a handler that threw and serves on.
  size_t poll_holding_loop(bool one);
  bool work_is_recent() const;

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  // Who runs the loop's handlers: whoever holds it.
  std::mutex loop_mutex_;
  std::atomic<int> lenders_{0};           // Threads in lend().
  std::atomic<bool> io_sleeping_{false};  // The I/O thread waits in epoll.
  std::atomic<int64_t> last_work_ns_{0};  // When a handler last ran.
  const int64_t poll_ns_;
  std::jthread thread_;
};

}  // namespace tide::transport
