#include "rpc_core/retry.h"

#include <cmath>
#include <memory>

#include "common/clock.h"

namespace tide::rpc_core {

namespace {

struct Retrying : std::enable_shared_from_this<Retrying> {
  transport::Transport& transport;
  std::function<Future<void>()> attempt;
  std::function<bool(const std::exception_ptr&)> again;
  std::function<void(int, std::chrono::milliseconds)> on_retry;
  RetryPolicy policy;
  Promise<void> done;
  int tries = 0;

  Retrying(
      transport::Transport& t,
      std::function<Future<void>()> a,
      std::function<bool(const std::exception_ptr&)> g,
      std::function<void(int, std::chrono::milliseconds)> r,
      RetryPolicy p)
      : transport(t),
        attempt(std::move(a)),
        again(std::move(g)),
        on_retry(std::move(r)),
        policy(p) {}

  void make_one() {
    Future<void> f = [&] {
      try {
        return attempt();
      } catch (...) {
        return Future<void>::make_failed(std::current_exception());
      }
    }();
    f.on_complete([self = shared_from_this()](const Future<void>& r) {
      self->settle(r.error());
    });
  }

  void settle(std::exception_ptr error) {
    int made = ++tries;
    if (!error) {
      done.set_value();
      return;
    }
    if (made >= policy.tries || !again(error)) {
      done.set_exception(std::move(error));
      return;
    }
    auto pause = std::chrono::milliseconds(static_cast<int64_t>(
        static_cast<double>(policy.first_pause.count()) *
        std::pow(policy.growth, made - 1)));
    if (on_retry) {
      on_retry(made, pause);
    }
    transport.schedule(Clock::now() + pause, [self = shared_from_this()] {
      self->make_one();
    });
  }
};

}  // namespace

Future<void> retry(
    transport::Transport& transport,
    std::function<Future<void>()> attempt,
    std::function<bool(const std::exception_ptr&)> again,
    std::function<void(int, std::chrono::milliseconds)> on_retry,
    RetryPolicy policy) {
  auto r = std::make_shared<Retrying>(
      transport,
      std::move(attempt),
      std::move(again),
      std::move(on_retry),
      policy);
  Future<void> f = r->done.get_future();
  r->make_one();
  return f;
}

}  // namespace tide::rpc_core
