#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>

#include "tide/common/error.h"

// Expiration timers (torch.distributed.elastic.timer): a worker says "if this
// block is not done in 60 s, reclaim me", and its agent's timer server kills
// it when the deadline passes, so the group restarts instead of hanging.
//
//   tide::timer::configure(std::make_shared<tide::timer::FileTimerClient>(
//       std::getenv("TORCHELASTIC_TIMER_FILE")));
//   {
//     auto guard = tide::timer::expires(std::chrono::seconds(60));
//     train_step();                       // killed if it takes over 60 s
//   }
//   tide::timer::expires(std::chrono::seconds(5), [&] { save_checkpoint(); });
namespace tide::timer {

using Seconds = std::chrono::duration<double>;

// One request to a timer server. A negative expiration_time releases the
// timer (worker_id, scope_id).
struct TimerRequest {
  pid_t worker_id = 0;
  std::string scope_id;
  // Seconds since the epoch (time.time() in Python).
  double expiration_time = 0;
  // The signal that reclaims the worker; 0 for a release.
  int signal = 0;
};

// Seconds since the epoch, as a double.
double now();

// A worker's side of a timer server. Thread safe.
class TimerClient {
 public:
  virtual ~TimerClient() = default;
  // Arms (or re-arms) the timer `scope_id` to expire at `expiration_time`.
  // Throws Error when the server cannot be reached.
  virtual void acquire(const std::string& scope_id, double expiration_time) = 0;
  // Disarms it.
  virtual void release(const std::string& scope_id) = 0;
};

// A client whose requests go to the server as (scope, expiration, signal)
// messages: acquire sends the client's signal, release a negative
// expiration and no signal. The channel is the subclass's.
class TimerChannelClient : public TimerClient {
 public:
  void acquire(const std::string& scope_id, double expiration_time) final {
    send(scope_id, expiration_time, signal_);
  }
  void release(const std::string& scope_id) final {
    send(scope_id, -1, 0);
  }

 protected:
  explicit TimerChannelClient(int signal) : signal_(signal) {}
  // Delivers one request; throws Error when the server cannot be reached.
  virtual void send(
      const std::string& scope_id, double expiration_time, int signal) = 0;

 private:
  const int signal_;
};

// Sets the client expires() uses by default (process-wide).
void configure(std::shared_ptr<TimerClient> client);
std::shared_ptr<TimerClient> configured_client();

// Arms a timer for the life of the object. Move-only; the destructor
// releases (and never throws: a release that fails is logged).
class Expires {
 public:
  Expires(
      std::shared_ptr<TimerClient> client, std::string scope, Seconds after);
  ~Expires();
  Expires(Expires&& other) noexcept;
  Expires& operator=(Expires&&) = delete;
  Expires(const Expires&) = delete;

  const std::string& scope() const {
    return scope_;
  }

 private:
  std::shared_ptr<TimerClient> client_;
  std::string scope_;
};

// Arms a timer expiring `after` from now, released when the returned guard
// is destroyed. The scope defaults to "<file>#<line>" of the caller (as in
// torch); `client` defaults to the configured one (InvalidArgument when none
// is configured).
[[nodiscard]] Expires expires(
    Seconds after,
    std::string scope = "",
    std::shared_ptr<TimerClient> client = nullptr,
    std::source_location where = std::source_location::current());

// Runs fn under a timer expiring `after` from now and returns its result.
template <typename F>
requires std::is_invocable_v<F>
auto expires(
    Seconds after,
    F&& fn,
    std::string scope = "",
    std::source_location where = std::source_location::current()) {
  auto guard = expires(after, std::move(scope), nullptr, where);
  return std::forward<F>(fn)();
}

}  // namespace tide::timer
