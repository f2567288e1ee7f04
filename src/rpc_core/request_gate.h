#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "transport/transport.h"

// What a worker does with the requests it cannot serve now. Those that
// arrive before it can serve any wait at a RequestGate: before it knows its
// group (the C++ agent: the names its RRefs and autograd contexts need) or
// before torch starts its agent (the TIDE backend); a caller may meet the
// group first and call at once. They are held in the order they came,
// bounded as the workers' queue is, and served when the gate opens, before
// any request that comes later. Those that find its pool full are refused,
// in busy_refusal()'s words.
namespace tide::rpc_core {

class RequestGate {
 public:
  using Serve = std::function<void(const transport::Pipe&, transport::Message)>;

  // Once open: false, and the caller serves m now. Before: holds m and
  // returns true. Throws ProtocolError (the connection goes, and the call
  // with it) past transport::Workers::kMaxQueuedRequests held. Thread safe.
  bool hold(const transport::Pipe& pipe, transport::Message& m);

  // Serves what is held, in order, then opens. A request arriving meanwhile
  // waits for the last held one to be served. `serve` may throw: that
  // request is dropped with a warning naming `who`, the others go on. Once.
  void open(const Serve& serve, const std::string& who);

  // Drops what is held (the worker stops before it opened).
  void drop();

 private:
  std::atomic<bool> open_{false};
  std::mutex mutex_;
  std::vector<std::pair<transport::Pipe, transport::Message>> held_;
};

// Why a request was refused because `worker`'s pool already queues
// `queued` (transport::Workers::full()): the caller's error, naming the
// call (`what`).
std::string busy_refusal(
    const std::string& worker, size_t queued, const std::string& what);

}  // namespace tide::rpc_core
