#include "transport/lendable_loop.h"

#include <chrono>

#include "tide/common/logging.h"

namespace tide::transport {

namespace {

// The loop whose handlers this thread runs now (the I/O thread: always its
// own): lending it again would wait on itself.
thread_local const LendableLoop* t_loop = nullptr;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// The polling after the last work (TransportOptions::poll): a reply on one
// host comes back sooner than a sleeping core wakes up, and a core that has
// just seen work is likely to see more.
LendableLoop::LendableLoop(std::chrono::microseconds poll)
    : work_(asio::make_work_guard(io_)),
      poll_ns_(std::chrono::nanoseconds(poll).count()) {}

LendableLoop::~LendableLoop() {
  release_work();
  join();
}

bool LendableLoop::on_loop() const {
  return t_loop == this;
}

void LendableLoop::start() {
  thread_ = std::jthread([this] { run_io_thread(); });
}

void LendableLoop::release_work() {
  work_.reset();
}

void LendableLoop::join() {
  if (thread_.joinable()) {
    thread_.join();
  }
}

bool LendableLoop::work_is_recent() const {
  return now_ns() - last_work_ns_.load(std::memory_order_relaxed) < poll_ns_;
}

size_t LendableLoop::poll_holding_loop(bool one) {
  const LendableLoop* was = std::exchange(t_loop, this);
  size_t n = 1;
  try {
    n = one ? io_.poll_one() : io_.poll();
  } catch (const std::exception& e) {
    TIDE_LOG_ERROR("I/O loop: a handler threw: {}", e.what());
  } catch (...) {
    TIDE_LOG_ERROR("I/O loop: a handler threw a non-standard exception");
  }
  t_loop = was;
  if (n > 0) {
    last_work_ns_.store(now_ns(), std::memory_order_relaxed);
  }
  return n;
}

// While a lent thread has work the I/O thread stands aside: two pollers
// would only take turns.
void LendableLoop::run_io_thread() {
  t_loop = this;
  while (!io_.stopped()) {
    if (lenders_.load(std::memory_order_relaxed) > 0 && work_is_recent()) {
      std::this_thread::yield();
      continue;
    }
    std::unique_lock loop(loop_mutex_);
    if (poll_holding_loop(false) > 0) {
      continue;
    }
    if (io_.stopped()) {
      return;
    }
    if (work_is_recent()) {
      loop.unlock();
      std::this_thread::yield();
      continue;
    }
    io_sleeping_.store(true);
    size_t ran = 0;
    try {
      ran = io_.run_one();
    } catch (const std::exception& e) {
      TIDE_LOG_ERROR("I/O loop: a handler threw: {}", e.what());
      ran = 1;
    } catch (...) {
      TIDE_LOG_ERROR("I/O loop: a handler threw a non-standard exception");
      ran = 1;
    }
    io_sleeping_.store(false);
    if (ran == 0) {
      return;  // Out of work: shut down.
    }
    last_work_ns_.store(now_ns(), std::memory_order_relaxed);
  }
}

void LendableLoop::lend(const std::function<bool()>& done) {
  if (t_loop != nullptr) {
    return;  // Running a handler (of this loop or another) already.
  }
  lenders_.fetch_add(1);
  int64_t last = now_ns();
  while (!done() && !io_.stopped() && now_ns() - last < poll_ns_) {
    std::unique_lock loop(loop_mutex_, std::try_to_lock);
    if (!loop.owns_lock()) {
      if (io_sleeping_.load()) {
        break;
      }
      std::this_thread::yield();
      continue;
    }
    // One handler at a time: done() may hold after any, and the I/O thread
    // takes the rest when this one leaves (a pool thread has a function to
    // run).
    size_t ran = poll_holding_loop(true);
    loop.unlock();
    if (ran > 0) {
      last = now_ns();
    } else {
      std::this_thread::yield();
    }
  }
  lenders_.fetch_sub(1);
}

}  // namespace tide::transport
