#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "tide/common/error.h"

// Future<T> is tide's one async type: the result of an operation that
// completes later, on another thread, with a value or an exception.
//
//   Promise<int> p;
//   Future<int> f = p.get_future();
//   Future<std::string> g = f.then([](const int& v) { return std::to_string(v);
//   }); p.set_value(7);                      // runs the continuation here
//   std::string s = g.wait(std::chrono::seconds(1));
//
// Futures are cheap handles to a shared state; copies see the same result.
// All members are thread safe. Continuations run exactly once: inline in
// then() when the future is already complete, otherwise on the thread that
// completes it, never under a lock.
namespace tide {

template <typename T>
class Future;

// Runs tasks on threads of its own (a pool): where a future's
// continuations go when the thread that completes it must not block
// (Future::via).
class Executor {
 public:
  virtual ~Executor() = default;
  // Runs task on another thread, or now on this one when none can take it.
  // Thread safe.
  virtual void run(std::function<void()> task) = 0;
};

namespace detail {

template <typename T>
using Stored = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

// Callbacks hold a raw pointer to the state, not a shared_ptr: a pending
// future whose promise is gone must not keep itself alive through a cycle.
// The pointer is safe because a callback only runs inside complete() or
// on_complete(), whose callers hold a reference.
template <typename T>
struct FutureState : std::enable_shared_from_this<FutureState<T>> {
  std::mutex mutex;
  std::condition_variable done_cv;
  // Guarded by mutex.
  bool done = false;
  std::optional<Stored<T>> value;
  std::exception_ptr error;
  // Most futures get one or two continuations: they need no vector.
  std::array<std::function<void()>, 2> first_callbacks;
  std::vector<std::function<void()>> more_callbacks;
  // Where the continuations waiting at completion run (via()); null: on
  // the completing thread.
  std::shared_ptr<Executor> executor;
  // Copies of the promise alive; the last to go fails a pending future.
  std::atomic<size_t> promises{1};

  // Returns false (and changes nothing) when already complete.
  bool complete(std::optional<Stored<T>> v, std::exception_ptr e) {
    std::array<std::function<void()>, 2> first;
    std::vector<std::function<void()>> more;
    std::shared_ptr<Executor> elsewhere;
    {
      std::lock_guard lock(mutex);
      if (done) {
        return false;
      }
      value = std::move(v);
      error = std::move(e);
      done = true;
      if (executor && first_callbacks[0]) {
        // Once done, nothing else touches the callbacks (on_complete() runs
        // a late one at once): the task reads them where they are.
        elsewhere = std::move(executor);
      } else {
        first.swap(first_callbacks);
        more.swap(more_callbacks);
      }
    }
    done_cv.notify_all();
    if (elsewhere) {
      // The task keeps the state alive: the callbacks point into it.
      elsewhere->run([self = this->shared_from_this()] {
        run_callbacks(self->first_callbacks, self->more_callbacks);
      });
    } else {
      run_callbacks(first, more);
    }
    return true;
  }

  // Runs the callbacks, then frees them (and what they hold).
  static void run_callbacks(
      std::array<std::function<void()>, 2>& first,
      std::vector<std::function<void()>>& more) {
    for (auto& cb : first) {
      if (cb) {
        cb();
        cb = nullptr;
      }
    }
    for (auto& cb : more) {
      cb();
    }
    more.clear();
  }

  // The last promise went away: fails the future unless it is complete.
  void abandon() {
    {
      std::lock_guard lock(mutex);
      if (done) {
        return;
      }
    }
    complete(
        std::nullopt,
        std::make_exception_ptr(
            Error("promise dropped without a result; the producer went away")));
  }

  // Runs cb now when complete (kept as a std::function only when not).
  template <typename F>
  void on_complete(F cb) {
    {
      std::lock_guard lock(mutex);
      if (!done) {
        if (!first_callbacks[0]) {
          first_callbacks[0] = std::move(cb);
        } else if (!first_callbacks[1]) {
          first_callbacks[1] = std::move(cb);
        } else {
          more_callbacks.emplace_back(std::move(cb));
        }
        return;
      }
    }
    cb();
  }
};

}  // namespace detail

// The writing end of a Future. Completing an already complete promise is a
// no-op that returns false, so a reply racing a timeout is harmless.
template <typename T>
class Promise {
 public:
  Promise() : state_(std::make_shared<detail::FutureState<T>>()) {}
  Promise(const Promise& other) : state_(other.state_) {
    if (state_) {
      state_->promises.fetch_add(1, std::memory_order_relaxed);
    }
  }
  Promise(Promise&& other) noexcept = default;
  Promise& operator=(Promise other) noexcept {
    std::swap(state_, other.state_);
    return *this;
  }
  // When the last copy of a promise goes away without completing it, its
  // futures fail instead of waiting for nothing.
  ~Promise() {
    if (state_ &&
        state_->promises.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      state_->abandon();
    }
  }

  Future<T> get_future() const {
    return Future<T>(state_);
  }

  template <typename U = T>
  requires(!std::is_void_v<U>) bool set_value(U value) {
    return state_->complete(std::move(value), nullptr);
  }

  template <typename U = T>
  requires std::is_void_v<U>
  bool set_value() {
    return state_->complete(std::monostate{}, nullptr);
  }

  bool set_exception(std::exception_ptr error) {
    TIDE_CHECK(error != nullptr);
    return state_->complete(std::nullopt, std::move(error));
  }

  template <typename E>
  bool set_error(E error) {
    return set_exception(std::make_exception_ptr(std::move(error)));
  }

 private:
  std::shared_ptr<detail::FutureState<T>> state_;  // Null once moved from.
};

template <typename T>
class Future {
 public:
  using value_type = T;

  // A ready future holding `value`.
  template <typename U = T>
  requires(!std::is_void_v<U>) static Future make_ready(U value) {
    Promise<T> p;
    p.set_value(std::move(value));
    return p.get_future();
  }
  template <typename U = T>
  requires std::is_void_v<U>
  static Future make_ready() {
    Promise<T> p;
    p.set_value();
    return p.get_future();
  }
  // A future failed with `error`.
  static Future make_failed(std::exception_ptr error) {
    Promise<T> p;
    p.set_exception(std::move(error));
    return p.get_future();
  }

  // True once a value or an error is in. Never blocks.
  bool ready() const {
    std::lock_guard lock(state_->mutex);
    return state_->done;
  }

  // The error this future failed with, or null (also while pending).
  std::exception_ptr error() const {
    std::lock_guard lock(state_->mutex);
    return state_->error;
  }

  // Blocks until complete or `timeout` passes. Returns a copy of the value,
  // rethrows the stored error, or throws TimeoutError.
  T wait(std::chrono::milliseconds timeout) const {
    std::unique_lock lock(state_->mutex);
    if (!state_->done_cv.wait_for(
            lock, timeout, [this] { return state_->done; })) {
      throw TimeoutError(
          "future not complete after " + std::to_string(timeout.count()) +
          " ms");
    }
    if (state_->error) {
      std::rethrow_exception(state_->error);
    }
    if constexpr (!std::is_void_v<T>) {
      return *state_->value;
    }
  }

  // Calls `fn(const T&)` (or `fn()` for Future<void>) when this future
  // completes with a value, and returns a future of its result. An error in
  // this future, or thrown by fn, completes the returned future instead.
  template <typename F>
  auto then(F fn) const {
    using R = decltype(invoke_on_value(fn, std::declval<detail::Stored<T>&>()));
    Promise<R> next;
    state_->on_complete(
        [state = state_.get(), next, fn = std::move(fn)]() mutable {
          if (state->error) {
            next.set_exception(state->error);
            return;
          }
          try {
            if constexpr (std::is_void_v<R>) {
              invoke_on_value(fn, *state->value);
              next.set_value();
            } else {
              next.set_value(invoke_on_value(fn, *state->value));
            }
          } catch (...) {
            next.set_exception(std::current_exception());
          }
        });
    return next.get_future();
  }

  // The continuations waiting when this future completes run as one task
  // on `executor` instead of on the completing thread (one added after
  // completion runs inline, as always). For a producer whose thread must
  // not block, such as an I/O loop. Returns this future.
  Future via(std::shared_ptr<Executor> executor) const {
    std::lock_guard lock(state_->mutex);
    if (!state_->done) {
      state_->executor = std::move(executor);
    }
    return *this;
  }

  // Calls `fn(const Future<T>&)` once this future completes, with a value or
  // with an error. Runs inline if already complete.
  template <typename F>
  void on_complete(F fn) const {
    state_->on_complete([state = state_.get(), fn = std::move(fn)]() mutable {
      fn(Future<T>(state->shared_from_this()));
    });
  }

 private:
  friend class Promise<T>;
  explicit Future(std::shared_ptr<detail::FutureState<T>> state)
      : state_(std::move(state)) {}

  template <typename F>
  static decltype(auto) invoke_on_value(F& fn, detail::Stored<T>& value) {
    if constexpr (std::is_void_v<T>) {
      (void)value;
      return fn();
    } else {
      return fn(std::as_const(value));
    }
  }

  std::shared_ptr<detail::FutureState<T>> state_;
};

// Completes once every future in `futures` has: with the first error
// among them, if any (the others' results are dropped). Ready at once for
// none.
inline Future<void> when_all(std::vector<Future<void>> futures) {
  if (futures.empty()) {
    return Future<void>::make_ready();
  }
  struct Join {
    std::mutex mutex;
    size_t left = 0;
    std::exception_ptr error;  // The first. Guarded by mutex, as left.
    Promise<void> done;
  };
  auto join = std::make_shared<Join>();
  join->left = futures.size();
  Future<void> out = join->done.get_future();
  for (auto& f : futures) {
    f.on_complete([join](const Future<void>& r) {
      std::exception_ptr error;
      {
        std::lock_guard lock(join->mutex);
        if (auto e = r.error(); e && !join->error) {
          join->error = e;
        }
        if (--join->left > 0) {
          return;
        }
        error = join->error;
      }
      if (error) {
        join->done.set_exception(error);
      } else {
        join->done.set_value();
      }
    });
  }
  return out;
}

}  // namespace tide
