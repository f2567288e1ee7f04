#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "tide/common/buffer.h"
#include "tide/common/future.h"

#include "common/clock.h"
#include "rpc/messages.h"
#include "transport/transport.h"

// The books of the calls a worker made: each call waits for its reply
// (RESPONSE or ERROR with its id), its deadline, or the loss of the
// connection it went out on, whichever comes first, and exactly one of them
// completes it. One alarm of the transport serves every deadline.
namespace tide::rpc::detail {

class Calls {
 public:
  Calls(transport::Transport& transport, std::string self_name);
  Calls(const Calls&) = delete;
  Calls& operator=(const Calls&) = delete;

  // Sends fn(args) to worker `to`; the future completes with the reply, or
  // RemoteError (the function threw there), TimeoutError after `timeout`,
  // NetworkError (connection lost, shut down) or InvalidArgument (no such
  // worker, a message over the limits). Thread safe; never blocks on the
  // network.
  // `type` and `extra` (metadata fields after the function and timeout)
  // make it another kind of call: an RRef's creation (rrefs.h).
  Future<Payload> start(
      int to,
      std::string fn,
      std::chrono::milliseconds timeout,
      Payload args,
      transport::MessageType type = MessageType::kRequest,
      std::string_view extra = {});

  // A RESPONSE or ERROR came on `pipe`, one this side opened. On the loop;
  // throws ProtocolError for any other message (the connection is dropped).
  void on_reply(const transport::Pipe& pipe, transport::Message m);
  // A connection this side opened closed: its calls fail with `reason`. On
  // the loop.
  void on_closed(const transport::Pipe& pipe, const std::string& reason);
  // Fails every call still waiting (after the transport stopped).
  void fail_all(const std::string& why);

  // Calls not yet completed. Thread safe.
  size_t pending() const {
    return count_.load();
  }

 private:
  using Deadlines = std::multimap<Clock::time_point, uint64_t>;
  struct Pending {
    Promise<Payload> promise;
    const void* pipe = nullptr;  // Pipe::id() of the connection it went on
    int peer = 0;
    std::string fn;
    std::chrono::milliseconds timeout{0};
    Deadlines::iterator deadline;
  };

  // Removes call `id` from the books; nullopt when it completed already (a
  // late reply, a timer that lost the race). Any thread.
  std::optional<Pending> take(uint64_t id);
  // Completes a call taken off the books. Any thread.
  void complete(
      Pending& call, std::optional<Payload> value, std::exception_ptr error);
  void fail(Pending& call, std::exception_ptr error) {
    complete(call, std::nullopt, std::move(error));
  }
  // Fails the calls whose deadline passed; arms the alarm for the next. On
  // the loop.
  void expire();

  transport::Transport& transport_;
  const std::string self_name_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<size_t> count_{0};

  std::mutex mutex_;
  std::unordered_map<uint64_t, Pending> pending_;  // Guarded by mutex_.
  // Every deadline in order, and when the alarm is set to go off (max: not
  // set). Guarded by mutex_.
  Deadlines deadlines_;
  Clock::time_point alarm_at_ = Clock::time_point::max();
};

}  // namespace tide::rpc::detail
