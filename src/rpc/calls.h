#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "tide/common/buffer.h"
#include "tide/common/future.h"

#include "rpc/messages.h"
#include "rpc_core/call_table.h"
#include "transport/transport.h"

// The C++ agent's calls: its codec on the endpoint's call table
// (rpc_core/call_table.h), which also ends them when their connection is
// lost or the agent stops. A call is a REQUEST frame; its reply a RESPONSE (the
// result's payload) or ERROR (what the function threw there), read here into
// the caller's future.
namespace tide::rpc::detail {

class Calls {
 public:
  // `table` is the endpoint's (rpc_core/endpoint.h).
  Calls(
      transport::Transport& transport,
      rpc_core::CallTable<transport::Message>& table)
      : transport_(transport), table_(table) {}
  Calls(const Calls&) = delete;
  Calls& operator=(const Calls&) = delete;

  // Sends fn(args) to worker `to`; the future completes with the reply, or
  // RemoteError (the function threw there), TimeoutError after `timeout`,
  // NetworkError (connection lost, shut down) or InvalidArgument (no such
  // worker, a message over the limits). Thread safe; never blocks on the
  // network.
  // Errors name the call as `label`'s (fn's when empty): an RRef's
  // creation names the function it runs.
  Future<Payload> start(
      int to,
      const std::string& fn,
      std::chrono::milliseconds timeout,
      Payload args,
      std::string label = {});

  // A message came on `pipe`, one this side opened. On the loop; throws
  // ProtocolError for anything but a well-formed RESPONSE or ERROR (the
  // connection is dropped).
  void on_reply(const transport::Pipe& pipe, transport::Message m);
  transport::Transport& transport() {
    return transport_;
  }

  // Calls not yet completed. Thread safe.
  size_t pending() const {
    return table_.pending();
  }

 private:
  transport::Transport& transport_;
  rpc_core::CallTable<transport::Message>& table_;
};

}  // namespace tide::rpc::detail
