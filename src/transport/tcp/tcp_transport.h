#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tide/common/future.h"
#include "tide/rpc/rpc.h"

// The TCP transport of tide's RPC: frames (rpc/frame.h) over one TCP
// connection per caller/callee pair, opened on demand by the caller.
//
// Messages (metadata is an encode_args tuple):
//   HANDSHAKE      caller -> callee  (caller id, caller name)
//   HANDSHAKE_ACK  callee -> caller  (callee id, callee name)
//   REQUEST        (function, timeout ms); buffers: args, out-of-band...
//   RESPONSE       buffers: result, out-of-band...
//   ERROR          (exception type, message)
// The caller sends its requests right after its handshake, without waiting
// for the ack.
//
// Threading: one I/O thread owns every socket, connection and pending call;
// public methods post to it.
namespace tide::rpc::detail {

struct PeerAddress {
  int id = 0;
  std::string name;
  std::string host;
  uint16_t port = 0;
};

// Runs a request: called on the I/O thread, must not block; returns the
// future of the encoded result (or of the error to send back).
using RequestHandler =
    std::function<Future<Payload>(int caller, std::string fn, Payload args)>;

class TcpTransport {
 public:
  // Binds listen_host (port 0) and starts the I/O thread. Throws
  // NetworkError when the address cannot be bound.
  TcpTransport(
      int self_id,
      std::string self_name,
      const std::string& listen_host,
      RequestHandler on_request);
  // shutdown() and join().
  ~TcpTransport();

  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  uint16_t port() const;

  // Where each peer listens; before the first call.
  void set_peers(std::vector<PeerAddress> peers);

  // Sends a request to peer `to`; the future completes with the reply, or
  // TimeoutError after `timeout`, or NetworkError. Thread safe, never blocks.
  Future<Payload> call(
      int to, std::string fn, std::chrono::milliseconds timeout, Payload args);

  // Calls not yet completed. Thread safe.
  size_t pending_calls() const;

  // Closes everything; pending calls fail with NetworkError. Asynchronous,
  // idempotent.
  void shutdown();
  // Waits for the I/O thread to end.
  void join();

  struct Impl;

 private:
  // Shared with replies of async functions that complete after the
  // transport is gone (they find it expired and drop the reply).
  std::shared_ptr<Impl> impl_;
};

}  // namespace tide::rpc::detail
