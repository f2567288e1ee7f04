#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include <asio/thread_pool.hpp>

#include "tide/common/future.h"

#include "transport/transport.h"

// The threads that run the work of the layer above (the functions called on
// a worker, the completions of its calls), beside a transport's loop.
//
// A burst of work wakes one thread, which runs it one function after
// another; another thread is woken whenever work is queued while every
// running one is inside a function (which may block), up to `threads`: so
// with T threads, T functions may block at once and the work queued behind
// them still runs; the (T+1)th waits for a thread. An idle thread waits for
// the next function a moment before it sleeps, lending itself to the
// transport's loop meanwhile (Transport::help): the message that brings the
// next function is then read on the thread that runs it, with no hand-off.
// One task per function would wake a thread per function (50-200 us on a
// virtual machine).
namespace tide::transport {

class Workers {
 public:
  // `transport` must outlive this. `thread_init`, when set, runs once on
  // each thread before its first function (say, to give it an interpreter
  // state it keeps).
  Workers(
      Transport& transport,
      size_t threads,
      std::function<void()> thread_init = {});
  // join().
  ~Workers();
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // Queues fn (moved from) and returns true; false, leaving fn alone, after
  // join() has begun. Thread safe. An exception fn throws is logged.
  bool run(std::function<void()>&& fn);
  // run(fn), or fn here once join() has begun (a completion during
  // shutdown must still happen).
  void run_or_here(std::function<void()>&& fn) {
    if (!run(std::move(fn))) {
      fn();
    }
  }
  size_t threads() const {
    return threads_;
  }
  // Threads inside a function now.
  size_t busy() const {
    return busy_.load(std::memory_order_relaxed);
  }
  // Functions waiting for a thread now.
  size_t queued() const {
    return queued_.load(std::memory_order_relaxed);
  }
  // Whether a peer's request may still queue: the layers above refuse the
  // ones past this (each holds its message until it runs), answering with
  // an error, so a peer that floods a worker cannot grow it without bound.
  bool full() const {
    return queued() >= kMaxQueuedRequests;
  }
  static constexpr size_t kMaxQueuedRequests = 65'536;

  // Refuses new work, runs what is queued, then waits for the threads to
  // end. Idempotent.
  void join();

 private:
  // A thread's task: runs queued functions until none has come for a while.
  void drain();
  // Posts one more runner when queued work has none free to take it and the
  // pool has a thread left; releases `lock` (on mutex_) first.
  void add_runner_and_unlock(std::unique_lock<std::mutex>& lock);

  Transport& transport_;
  const size_t threads_;
  const std::function<void()> thread_init_;
  asio::thread_pool pool_;
  std::mutex mutex_;
  std::deque<std::function<void()>> queue_;  // Guarded by mutex_.
  // queue_.size(), readable without the mutex: an idle thread watches it
  // instead of taking the lock over and over from under the I/O thread.
  std::atomic<size_t> queued_{0};
  size_t runners_ = 0;           // Tasks posted to the pool, not yet finished.
  std::atomic<size_t> busy_{0};  // Runners inside a function.
  bool joined_ = false;          // Guarded by mutex_.
};

// Runs the continuations of futures whose producer must not block (an I/O
// loop; Future::via) on `workers`; on the completing thread once they are
// joined (shutdown).
class WorkersExecutor final : public Executor {
 public:
  explicit WorkersExecutor(std::shared_ptr<Workers> workers)
      : workers_(std::move(workers)) {}
  void run(std::function<void()> task) override {
    workers_->run_or_here(std::move(task));
  }

 private:
  const std::shared_ptr<Workers> workers_;
};

}  // namespace tide::transport
