#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tide/common/buffer.h"

#include "common/clock.h"
#include "transport/frame.h"

// The transport: messages (a type, an id, metadata and buffers) between
// named peers, over one connection per ordered pair, opened on demand by
// the side that sends first (pipe_to) and chosen per pair:
//
//   shm  processes of one host and one network namespace: a Unix socket
//        (abstract name) carries the frames, and buffers of kShmThreshold
//        bytes or more travel through shared-memory segments passed over it
//        (transport/shm/): one copy, by the sender.
//   tcp  anything else, or when shm is off or its socket cannot be reached;
//        buffers follow the frame on the socket (sendmsg, no copy). With
//        lanes, the opening side adds that many TCP connections when the
//        first buffer of kLaneThreshold bytes or more crosses, and from then
//        on each such buffer is cut into one part per lane, sent on all of
//        them at once and put together by the receiver (transport/tcp/).
//
// The transport knows its own control messages (transport/control.h:
// handshakes, lanes, segment releases) and nothing of what the layer above
// sends: that layer names its types (TransportOptions::message_types),
// receives its messages in on_message, and hears when a connection it
// opened is lost (on_closed). Calls, replies, timeouts and remote errors
// are the rpc layer's (src/rpc/calls.h).
//
// Threads (docs/thread_model.md): the loop's handlers own every socket,
// connection and segment; they run on the I/O thread, or on a thread lent
// to the loop while it waits (help()), one thread at a time. A Pipe may be
// written from any thread.
namespace tide::transport {

constexpr uint16_t kFlagSharedMemory = 1;
constexpr uint16_t kFlagLanes = 2;
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

// A message of the layer above. buffers[0] is usually its encoded body; a
// buffer of kShmThreshold (kLaneThreshold) bytes or more past the first may
// travel through shared memory (lanes).
struct Message {
  MessageType type = 0;
  uint64_t id = 0;
  std::string metadata;
  std::vector<Buffer> buffers;
};

struct Connection;
class TimerQueue;

// A function the transport's loop runs at a time (Transport::schedule).
// Copyable; harmless after the transport is gone.
class Timer {
 public:
  Timer() = default;
  // Keeps the function from running: false when it has run, is running, or
  // was cancelled (or the transport is gone). Thread safe.
  bool cancel() const;

 private:
  friend class Transport;
  std::weak_ptr<TimerQueue> queue_;
  Clock::time_point at_{};
  uint64_t id_ = 0;
};

// One connection as the layer above holds it: a handle that stays valid
// (and harmless) after the connection or the whole transport is gone.
// Copyable; thread safe.
class Pipe {
 public:
  Pipe() = default;

  // The peer's id (from its handshake, or the one pipe_to() was given).
  int peer() const {
    return peer_;
  }
  // This side opened it (pipe_to()).
  bool outgoing() const {
    return outgoing_;
  }
  // Queues m and writes what the socket takes now; never waits for the
  // network. Returns false, with why in `why_not`, when the connection is
  // closed and its loss reported (on_closed has run, or is about to) or the
  // transport is gone: m was dropped. Throws InvalidArgument when m is over
  // the frame limits (the peer would drop the connection on it).
  // Throws NetworkError when the connection already queues
  // TransportOptions::max_queued_bytes (the peer does not read what it is
  // sent): m was dropped, the connection stays.
  bool send(Message m, std::string* why_not = nullptr) const;
  // Takes back what is still unsent of message `id` (a call that timed
  // out): its bytes are neither written nor kept. A frame already being
  // written, or one in shared memory or on lanes, goes on. Thread safe.
  void cancel(uint64_t id) const;
  // The connection's identity (never dereferenced).
  const void* id() const {
    return id_;
  }

 private:
  friend struct Connection;
  std::weak_ptr<Connection> conn_;
  // The transport's state, alive while the transport is.
  std::weak_ptr<void> transport_;
  const void* id_ = nullptr;
  int peer_ = -1;
  bool outgoing_ = false;
};

struct TransportOptions {
  int self_id = 0;
  std::string self_name;
  std::string listen_host = "127.0.0.1";
  // Listen on an abstract Unix socket too and use shared memory with peers
  // of this host.
  bool shared_memory = true;
  // The group's secret. Each side of a connection proves it holds the same
  // one (HMAC challenge-response, transport/auth.h) before anything else;
  // it never travels. Empty: no proof is asked or given.
  std::string token;
  // Extra TCP connections per TCP peer for large buffers (0: none; at most
  // kMaxLanes).
  size_t lanes = 0;
  // The layer above's message types (from kFirstUpperType); a peer sending
  // any other type is dropped.
  MessageTypes message_types;
  // How long the I/O thread and a thread lent to the loop keep polling after
  // their last work before they sleep (LendableLoop).
  std::chrono::microseconds poll{300};
  // Who else may connect to the Unix socket: peers' user ids are read from
  // the kernel (SO_PEERCRED), and only this process's own user is let in,
  // plus these. Empty: TIDE_RPC_ALLOW_UIDS (a comma-separated list of
  // uids, or "any").
  std::vector<uint32_t> allowed_uids;
  bool allow_any_uid = false;
  // An accepted connection that has not proved itself by then is closed;
  // at most max_unauthenticated such connections are held at once (more
  // are closed at accept).
  std::chrono::milliseconds handshake_timeout{10'000};
  size_t max_unauthenticated = 256;
  // Where a received buffer of a proven connection goes (FrameDecoder::
  // Placement): storage of exactly its length (say, one used again, where
  // a new allocation would fault its pages in each time), or an empty
  // Buffer for the transport's own. Called on the loop. Empty: always the
  // transport's own.
  FrameDecoder::Placement placement;
  // Bytes one connection may hold unsent (a peer that does not read): a
  // send() past it throws NetworkError. One message of any size goes when
  // nothing is queued.
  size_t max_queued_bytes = size_t{512} << 20;
};

struct TransportHandlers {
  // A message of the layer above came on `pipe` (after its handshake). On
  // the loop: must not block. A ProtocolError it throws drops the
  // connection (logged); so does any other exception.
  std::function<void(const Pipe& pipe, Message m)> on_message;
  // A connection closed: the peer went away, a write or read failed, the
  // peer misbehaved, or shutdown. Once per pipe, on the loop; for the
  // pipes this side opened (pipe_to) and for those a peer opened once it
  // said who it is (pipe.outgoing() tells them apart). The layer above
  // fails what it waits for on the first, and learns of a lost peer from
  // either.
  std::function<void(const Pipe& pipe, const std::string& reason)> on_closed;
};

class Transport {
 public:
  // Binds listen_host (port 0) and, with shared_memory, a Unix socket, and
  // starts the I/O thread. Throws NetworkError when an address cannot be
  // bound, InvalidArgument when listen_host is not an IP address.
  Transport(TransportOptions options, TransportHandlers handlers);
  // shutdown() and join().
  ~Transport();

  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  uint16_t port() const;
  // The abstract Unix socket name ("" without shared memory).
  const std::string& local_name() const;

  // Where each peer listens; before the first pipe_to(). Thread safe.
  void set_peers(std::vector<PeerAddress> peers);
  // "worker 'b' (id 1, host:port)", for messages. Thread safe.
  std::string peer_label(int id) const;

  // The connection this side opened to peer `to`, opened now when there is
  // none: its messages queue until it is connected and go in order. Thread
  // safe, never blocks on the network. Throws NetworkError after
  // shutdown(), InvalidArgument for a peer set_peers() did not name.
  Pipe pipe_to(int to);

  // Takes back what is still unsent of message `id` on the connection this
  // side opened to peer `to` (Pipe::cancel). Thread safe.
  void cancel(int to, uint64_t id);

  // "shm" or "tcp" for the connection this side opened to peer `to`, "" when
  // there is none (yet). Thread safe; waits for the loop.
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

  // Runs fn on the loop. Thread safe.
  void post(std::function<void()> fn);
  // Runs fn on the loop at `at`, once (at once when `at` has passed),
  // unless the returned Timer is cancelled first or the transport shuts
  // down (fn is then dropped unrun). Clock::time_point::max(): never. Any
  // number of timers; one asio timer serves them (transport/timers.h).
  // Thread safe.
  Timer schedule(Clock::time_point at, std::function<void()> fn);

  // Lends this thread to the loop while it would otherwise wait
  // (LendableLoop::lend). Thread safe.
  void help(const std::function<bool()>& done);

  // Closes every connection (on_closed runs for those this side opened);
  // later pipe_to() throws. Asynchronous, idempotent.
  void shutdown();
  // Waits for the I/O thread to end.
  void join();

  struct Impl;

 private:
  // Shared with pipes and with buffers received in shared memory, which
  // may outlive the transport (they find it expired).
  std::shared_ptr<Impl> impl_;
};

}  // namespace tide::transport
