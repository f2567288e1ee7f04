#include "transport/workers.h"

#include <exception>
#include <utility>

#include <asio/post.hpp>

#include "tide/common/logging.h"

namespace tide::transport {

Workers::Workers(
    Transport& transport, size_t threads, std::function<void()> thread_init)
    : transport_(transport),
      threads_(threads),
      thread_init_(std::move(thread_init)),
      pool_(threads) {}

Workers::~Workers() {
  join();
}

bool Workers::run(std::function<void()>&& fn) {
  std::unique_lock lock(mutex_);
  if (joined_) {
    return false;
  }
  queue_.push_back(std::move(fn));
  queued_.store(queue_.size(), std::memory_order_release);
  add_runner_and_unlock(lock);
  return true;
}

void Workers::add_runner_and_unlock(std::unique_lock<std::mutex>& lock) {
  // No runner is needed while nothing waits, or a free one will take it;
  // none can be added past the pool's size.
  bool add = !queue_.empty() &&
             runners_ == busy_.load(std::memory_order_relaxed) &&
             runners_ < threads_;
  if (add) {
    ++runners_;
  }
  lock.unlock();
  if (add) {
    asio::post(pool_, [this] { drain(); });
  }
}

void Workers::drain() {
  // The pool's threads serve this object alone.
  thread_local bool initialized = false;
  if (thread_init_ && !initialized) {
    initialized = true;
    try {
      thread_init_();
    } catch (const std::exception& e) {
      TIDE_LOG_ERROR("a transport worker's thread_init threw: {}", e.what());
    }
  }
  std::unique_lock lock(mutex_);
  bool waited = false;
  for (;;) {
    if (!queue_.empty()) {
      auto next = std::move(queue_.front());
      queue_.pop_front();
      queued_.store(queue_.size(), std::memory_order_relaxed);
      busy_.fetch_add(1, std::memory_order_relaxed);
      // This function may block for as long as it likes (a lock, a
      // condition, a call that waits for a later request): what is queued
      // behind it must not wait for it. Every runner now inside a function
      // means one more, up to the pool's size.
      add_runner_and_unlock(lock);
      try {
        next();
      } catch (const std::exception& e) {
        TIDE_LOG_ERROR("a transport worker's task threw: {}", e.what());
      } catch (...) {
        TIDE_LOG_ERROR("a transport worker's task threw a non-exception");
      }
      next = nullptr;
      lock.lock();
      busy_.fetch_sub(1, std::memory_order_relaxed);
      waited = false;
      continue;
    }
    if (waited || joined_) {
      break;
    }
    // Work comes in streams: waiting a moment for the next is cheaper than
    // waking a thread for it. Meanwhile this thread reads messages itself
    // when the loop is free.
    lock.unlock();
    transport_.help(
        [this] { return queued_.load(std::memory_order_acquire) > 0; });
    lock.lock();
    waited = true;
  }
  --runners_;
}

void Workers::join() {
  {
    std::lock_guard lock(mutex_);
    if (joined_) {
      return;
    }
    joined_ = true;
  }
  // What is queued runs: a runner takes every function queued before it
  // ends, and no function comes after joined_.
  pool_.join();
}

}  // namespace tide::transport
