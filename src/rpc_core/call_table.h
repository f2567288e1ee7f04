#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tide/common/logging.h"

#include "common/clock.h"
#include "rpc_core/call_metrics.h"
#include "transport/transport.h"

// The calls a worker made and waits for, for both rpc front ends: each call
// is its request's id, the connection it went out on, its deadline and what
// to do when it ends. Exactly one of these ends it, whichever comes first:
//
//   kReplied   its reply came on the connection the request went out on
//              (from any other connection it is ignored: a peer cannot
//              answer another's call)
//   kBadReply  a reply came there that the front end could not read
//   kTimedOut  its deadline passed (its unsent bytes are taken back)
//   kLost      the connection it went out on closed
//   kNotSent   no connection could take it (no such peer, over the limits,
//              shut down)
//   kStopped   fail_all(): the front end shut down
//
// The table knows nothing of what the messages carry: each front end's
// codec makes the request, reads the reply into a `Reply` (the C++ agent's
// transport::Message, the torch backend's torch Message) and settles the
// caller's future in `done`. Deadlines are timers of the transport
// (Transport::schedule).
//
// Thread safety: every method from any thread. `done` runs on the thread
// that ends the call (the loop for replies, deadlines and losses; the
// caller's for kNotSent), never under the table's lock, exactly once; what
// it throws is logged.
//
// Each call is counted in the process's rpc metrics (call_metrics.h) as it
// starts and ends: kTimedOut is a timeout, kReplied ok unless `is_error`
// says the reply carries the callee's exception, the rest errors.
namespace tide::rpc_core {

template <typename Reply>
struct CallEnd {
  enum class How { kReplied, kBadReply, kTimedOut, kLost, kNotSent, kStopped };
  How how = How::kReplied;
  Reply reply{};  // kReplied
  // Why (all but kReplied and kTimedOut); for kNotSent, also the error the
  // transport threw when it threw one (InvalidArgument for a message over
  // the limits, NetworkError for a connection that queues too much).
  std::string reason;
  std::exception_ptr error;
};

template <typename Reply>
class CallTable {
 public:
  using End = CallEnd<Reply>;
  using How = typename End::How;
  using Done = std::function<void(End)>;
  // Whether a reply reports the callee's exception (for the metrics).
  using IsError = std::function<bool(const Reply&)>;

  // `transport` must outlive the table's calls (fail_all() after it stops).
  // `is_error` empty: every reply is ok.
  explicit CallTable(transport::Transport& transport, IsError is_error = {})
      : transport_(transport), is_error_(std::move(is_error)) {}
  CallTable(const CallTable&) = delete;
  CallTable& operator=(const CallTable&) = delete;

  // A fresh id for a request (unique among this worker's calls).
  uint64_t new_id() {
    return next_id_.fetch_add(1);
  }

  // Sends `request` (whose id is new_id()'s) to peer `to` and books it;
  // `timeout` 0 or past a century: no deadline. Never blocks on the
  // network.
  void start(
      int to,
      transport::Message request,
      std::chrono::milliseconds timeout,
      Done done) {
    count_.fetch_add(1);
    call_started();
    uint64_t id = request.id;
    Call call{nullptr, to, {}, std::move(done), Clock::now()};
    transport::Pipe pipe;
    try {
      pipe = transport_.pipe_to(to);
    } catch (const std::exception& e) {
      end(call, End{How::kNotSent, {}, e.what(), std::current_exception()});
      return;
    }
    call.pipe = pipe.id();
    {
      std::lock_guard lock(mutex_);
      auto& booked = calls_.emplace(id, std::move(call)).first->second;
      // Booked before its timer: the timer finds it.
      if (timeout.count() > 0 && timeout < std::chrono::hours(24 * 365 * 100)) {
        booked.deadline =
            transport_.schedule(Clock::now() + timeout, [this, id] {
              if (auto late = take(id)) {
                // Its request may still wait behind others (a peer that
                // does not read): it is not sent late, nor kept.
                transport_.cancel(late->peer, id);
                end(*late, End{How::kTimedOut, {}, {}, nullptr});
              }
            });
      }
    }
    // On the books first: a connection lost after this ends the call
    // (on_closed); one lost before it says so here.
    std::string why_not;
    std::exception_ptr error;
    try {
      if (pipe.send(std::move(request), &why_not)) {
        return;
      }
    } catch (const std::exception& e) {
      why_not = e.what();
      error = std::current_exception();
    }
    if (auto call = take(id)) {
      end(*call, End{How::kNotSent, {}, why_not, error});
    }
  }

  // The reply to call `id` came on `pipe`, one this side opened: true when
  // it ended that call, false when it is late or not an answer to a call
  // that went there (ignored).
  bool on_reply(const transport::Pipe& pipe, uint64_t id, Reply reply) {
    return end_one(pipe, id, End{How::kReplied, std::move(reply), {}, nullptr});
  }
  // A reply to call `id` came on `pipe` that could not be read (`why`).
  bool on_bad_reply(
      const transport::Pipe& pipe, uint64_t id, const std::string& why) {
    return end_one(pipe, id, End{How::kBadReply, {}, why, nullptr});
  }
  // A connection this side opened closed: its calls end kLost.
  void on_closed(const transport::Pipe& pipe, const std::string& reason) {
    end_all(
        [id = pipe.id()](const Call& c) { return c.pipe == id; },
        How::kLost,
        reason);
  }
  // Ends every call still booked kStopped.
  void fail_all(const std::string& why) {
    end_all([](const Call&) { return true; }, How::kStopped, why);
  }

  // Calls booked now.
  size_t pending() const {
    return count_.load();
  }

 private:
  struct Call {
    const void* pipe = nullptr;  // Pipe::id() of the connection it went on
    int peer = 0;
    transport::Timer deadline;
    Done done;
    Clock::time_point started;
  };

  // Takes call `id` off the books (only when it went out on `pipe`, when
  // given); nullopt when it ended already.
  std::optional<Call> take(uint64_t id, const void* pipe = nullptr) {
    std::optional<Call> call;
    {
      std::lock_guard lock(mutex_);
      auto it = calls_.find(id);
      if (it == calls_.end() || (pipe != nullptr && it->second.pipe != pipe)) {
        return std::nullopt;
      }
      call = std::move(it->second);
      calls_.erase(it);
    }
    call->deadline.cancel();
    return call;
  }

  bool end_one(const transport::Pipe& pipe, uint64_t id, End how) {
    auto call = take(id, pipe.id());
    if (!call) {
      return false;
    }
    end(*call, std::move(how));
    return true;
  }

  void end_all(
      const std::function<bool(const Call&)>& which,
      How how,
      const std::string& reason) {
    std::vector<uint64_t> ids;
    {
      std::lock_guard lock(mutex_);
      for (const auto& [id, call] : calls_) {
        if (which(call)) {
          ids.push_back(id);
        }
      }
    }
    for (uint64_t id : ids) {
      if (auto call = take(id)) {
        end(*call, End{how, {}, reason, nullptr});
      }
    }
  }

  void end(Call& call, End how) {
    count_.fetch_sub(1);
    Outcome outcome = Outcome::kError;
    if (how.how == How::kTimedOut) {
      outcome = Outcome::kTimeout;
    } else if (how.how == How::kReplied) {
      try {
        outcome =
            is_error_ && is_error_(how.reply) ? Outcome::kError : Outcome::kOk;
      } catch (const std::exception& e) {
        TIDE_LOG_ERROR("reading a reply's outcome threw: {}", e.what());
      }
    }
    call_ended(outcome, Clock::now() - call.started);
    // `done` completes futures whose continuations run user code: one that
    // throws must not take the loop (or a reader) down with it.
    try {
      call.done(std::move(how));
    } catch (const std::exception& e) {
      TIDE_LOG_ERROR("a call's continuation threw: {}", e.what());
    } catch (...) {
      TIDE_LOG_ERROR("a call's continuation threw");
    }
  }

  transport::Transport& transport_;
  const IsError is_error_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<size_t> count_{0};

  std::mutex mutex_;
  std::unordered_map<uint64_t, Call> calls_;  // Guarded by mutex_.
};

}  // namespace tide::rpc_core
