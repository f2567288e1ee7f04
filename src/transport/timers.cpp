#include "transport/timers.h"

#include <exception>
#include <vector>

#include <asio/post.hpp>

#include "tide/common/logging.h"

namespace tide::transport {

uint64_t TimerQueue::add(Clock::time_point at, std::function<void()> fn) {
  uint64_t id = 0;
  bool earlier = false;
  {
    std::lock_guard lock(mutex_);
    if (!closed_) {
      id = next_id_++;
      queue_.emplace(Key{at, id}, std::move(fn));
      // Timers mostly come later than the earliest (calls share a timeout):
      // those need no wake-up of the loop.
      earlier = at < armed_;
      if (earlier) {
        armed_ = at;
      }
    }
  }
  if (earlier) {
    asio::post(timer_.get_executor(), [this] { arm_on_loop(); });
  }
  return id;
}

bool TimerQueue::cancel(Clock::time_point at, uint64_t id) {
  std::function<void()> dropped;  // destroyed outside the lock
  std::lock_guard lock(mutex_);
  auto it = queue_.find(Key{at, id});
  if (it == queue_.end()) {
    return false;
  }
  dropped = std::move(it->second);
  queue_.erase(it);
  return true;
}

size_t TimerQueue::size() {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

void TimerQueue::arm_on_loop() {
  Clock::time_point next = Clock::time_point::max();
  {
    std::lock_guard lock(mutex_);
    if (closed_) {
      return;
    }
    if (!queue_.empty()) {
      next = queue_.begin()->first.first;
    }
    armed_ = next;
  }
  if (next == Clock::time_point::max()) {
    timer_.cancel();
    return;
  }
  timer_.expires_at(next);
  timer_.async_wait([this](const asio::error_code& ec) {
    if (!ec) {
      fire_on_loop();
    }
  });
}

void TimerQueue::fire_on_loop() {
  std::vector<std::function<void()>> due;
  {
    std::lock_guard lock(mutex_);
    auto now = Clock::now();
    while (!queue_.empty() && queue_.begin()->first.first <= now) {
      due.push_back(std::move(queue_.begin()->second));
      queue_.erase(queue_.begin());
    }
  }
  for (auto& fn : due) {
    // One that throws must not cost the others their turn.
    try {
      fn();
    } catch (const std::exception& e) {
      TIDE_LOG_ERROR("a timer's function threw: {}", e.what());
    } catch (...) {
      TIDE_LOG_ERROR("a timer's function threw");
    }
    fn = nullptr;
  }
  arm_on_loop();
}

void TimerQueue::close_on_loop() {
  std::map<Key, std::function<void()>> dropped;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    dropped.swap(queue_);
  }
  timer_.cancel();
}

}  // namespace tide::transport
