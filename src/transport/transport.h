#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tide/common/future.h"
#include "tide/common/buffer.h"

// The transport of tide's RPC: frames (rpc/frame.h) over one connection per
// caller/callee pair, opened on demand by the caller, chosen per pair:
//
//   shm  processes of one host and one network namespace: a Unix socket
//        (abstract name) carries the frames, and buffers of kShmThreshold
//        bytes or more travel through shared-memory segments passed over it
//        (transport/shm/segments.h): one copy, by the sender.
//   tcp  anything else, or when shm is off or its socket cannot be reached;
//        buffers follow the frame on the socket (writev, no copy). With
//        lanes, the caller opens that many more TCP connections to the
//        callee when the first buffer of kLaneThreshold bytes or more
//        crosses, and from then on each such buffer is cut into one part
//        per lane, sent on all of them at once and put together by the
//        receiver.
//
// Messages (metadata: the fields in transport/fields.h, in this order):
//   HANDSHAKE      caller -> callee  (caller id, caller name, features,
//                                     token)
//   HANDSHAKE_ACK  callee -> caller  (callee id, callee name, features)
//   ERROR, id 0    callee -> caller  the handshake was refused (type,
//                                     message); the callee closes
//   REQUEST        (function, timeout ms); buffers: args, out-of-band...
//   RESPONSE       buffers: result, out-of-band...
//   ERROR          (exception type, message)
//   BUFFER_RELEASE either way        (segment ids the sender may reuse)
//   LANE_HELLO     caller -> callee, first on a lane (caller id, lane
//                                     index, token)
//   BUFFER_PART    either way, on a lane; id: the transfer (part index,
//                                     parts, total bytes); buffer: the part
// A frame with kFlagSharedMemory has one more buffer, last: its table of
// shared-memory references (docs/rpc-protocol.md), and each buffer the table
// names is empty in the frame. A frame with kFlagLanes has its table of
// transfers last instead (docs/rpc-protocol.md), and waits for their parts.
// The caller sends its requests right after its handshake, without waiting
// for the ack.
//
// Threading: the loop's handlers own every socket, connection, segment and
// pending call; public methods post to it. They run on the I/O thread, or
// on a thread that lends itself to the loop while it waits (help()), one
// thread at a time.
namespace tide::rpc::detail {

constexpr uint16_t kFlagSharedMemory = 1;
constexpr uint16_t kFlagLanes = 2;
// Handshake features.
constexpr uint32_t kFeatureSharedMemory = 1;
// Buffers from this size go through shared memory on shm connections.
constexpr size_t kShmThreshold = size_t{256} << 10;
// Buffers from this size are cut over the lanes of TCP connections.
constexpr size_t kLaneThreshold = size_t{1} << 20;
constexpr size_t kMaxLanes = 16;

struct PeerAddress {
  int id = 0;
  std::string name;
  std::string host;
  uint16_t port = 0;
  // Same host and network namespace iff equal (local_host_key()).
  std::string host_key;
  // Abstract Unix socket name ("" when the peer does not take shm).
  std::string local_name;
};

// This process's host and network namespace: the boot id and the namespace's
// inode.
std::string local_host_key();

// Runs a request: called on the I/O thread, must not block; returns the
// future of the encoded result (or of the error to send back).
using RequestHandler =
    std::function<Future<Payload>(int caller, std::string fn, Payload args)>;

struct TransportOptions {
  int self_id = 0;
  std::string self_name;
  std::string listen_host = "127.0.0.1";
  // Listen on an abstract Unix socket too and use shared memory with peers
  // of this host.
  bool shared_memory = true;
  // When not empty, callers must present it and this side presents it.
  std::string token;
  // Extra TCP connections per TCP peer for large buffers (0: none; at most
  // kMaxLanes).
  size_t lanes = 0;
};

class Transport {
 public:
  // Binds listen_host (port 0) and, with shared_memory, a Unix socket, and
  // starts the I/O thread. Throws NetworkError when an address cannot be
  // bound, InvalidArgument when listen_host is not an IP address.
  Transport(TransportOptions options, RequestHandler on_request);
  // shutdown() and join().
  ~Transport();

  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  uint16_t port() const;
  // The abstract Unix socket name ("" without shared memory).
  const std::string& local_name() const;

  // Where each peer listens; before the first call.
  void set_peers(std::vector<PeerAddress> peers);

  // Sends a request to peer `to`; the future completes with the reply, or
  // TimeoutError after `timeout`, or NetworkError. Thread safe, never blocks.
  Future<Payload> call(
      int to, std::string fn, std::chrono::milliseconds timeout, Payload args);

  // Calls not yet completed. Thread safe.
  size_t pending_calls() const;

  // "shm" or "tcp" for the connection this side opened to peer `to`, "" when
  // there is none (yet). Thread safe; waits for the I/O thread.
  std::string connection_kind(int to);

  struct Stats {
    uint64_t buffers_via_shm = 0;
    uint64_t bytes_via_shm = 0;
    uint64_t segments = 0;  // created by this side
    // Buffers received in the peer's segments and sent back whole, as
    // references to them (no copy).
    uint64_t buffers_returned = 0;
    // Buffers sent cut over lanes, and their bytes.
    uint64_t buffers_via_lanes = 0;
    uint64_t bytes_via_lanes = 0;
  };
  Stats stats() const;

  // Lends this thread to the I/O loop while it would otherwise wait: runs
  // the loop's ready handlers here (replies, requests, completions of other
  // futures and their continuations) until done() holds or nothing came for
  // a while, then returns; the caller then blocks as it would have. Does
  // nothing on a thread inside a handler. Thread safe.
  void help(const std::function<bool()>& done);

  // Closes everything; pending calls fail with NetworkError. Asynchronous,
  // idempotent.
  void shutdown();
  // Waits for the I/O thread to end.
  void join();

  struct Impl;

 private:
  // Shared with replies of async functions and with buffers received in
  // shared memory, which may outlive the transport (they find it expired).
  std::shared_ptr<Impl> impl_;
};

}  // namespace tide::rpc::detail
