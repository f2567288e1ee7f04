#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <asio/generic/stream_protocol.hpp>
#include <asio/steady_timer.hpp>

#include "tide/common/fd.h"

#include "transport/auth.h"
#include "transport/buffer_path.h"
#include "transport/frame.h"
#include "transport/transport.h"

// One connection, either way, over TCP or a Unix socket: its socket's I/O,
// its handshake and the state of its life. Its member functions live by
// concern: the life, reading and writing here (connection.cpp), the
// handshake (handshake.cpp). Where its large buffers travel is its buffer
// path's (buffer_path.h: inline, shared memory or lanes), chosen at the
// handshake.
//
// Life (State; loop only):
//
//   caller:        kConnecting --connected--> kAwaitingAck
//                  kAwaitingAck --ack, callee proved--> kOpen
//   callee:        kAwaitingHello --HANDSHAKE--> kAwaitingProof
//                  kAwaitingProof --PROOF--> kOpen
//                  kAwaitingHello --HANDSHAKE, no token or not the worker
//                                   it claims to be--> kRefused
//                  kAwaitingProof --PROOF, wrong token--> kRefused
//                  kAwaitingHello --LANE_HELLO, proved--> kLane
//   caller's lane: kConnecting --connected--> kLane
//   any state      --fail()--> kClosed
//   not handshaken within TransportOptions::handshake_timeout --> kClosed
//
//   kConnecting     the socket connects; the HANDSHAKE waits in the queue,
//                   the layer above's messages are held (not sent before
//                   the callee proves itself)
//   kAwaitingAck    the caller wrote its HANDSHAKE and waits for
//                   HANDSHAKE_ACK (or REFUSED)
//   kAwaitingHello  the callee accepted the socket and waits for the first
//                   frame (handshake limits: a stranger sends no buffers)
//   kAwaitingProof  the callee sent its ack and proof, and waits for the
//                   caller's PROOF (handshake limits still)
//   kOpen           handshaken: the layer above's messages flow both ways
//   kLane           one of a connection's lanes: BUFFER_PARTs flow
//   kRefused        the callee sends REFUSED and closes once it is written;
//                   what comes in meanwhile is ignored
//   kClosed         failed or closed: nothing more is read or written, and
//                   the transport was told (connection_failed) once
//
// Writing (Writer; guarded by wmutex, any thread):
//
//   kNotConnected --start()--> kIdle --a thread writes--> kWriting
//   kWriting --all written--> kIdle      kWriting --socket full--> kBlocked
//   kBlocked --the loop sees it drain--> kIdle (and writes on)
//   kWriting --closed meanwhile--> kClosing --the writer comes out--> kClosed
//   any other --closed--> kClosed
//
// One thread writes at a time, and without the lock: frames others queue
// meanwhile go out with its next sendmsg, so a busy connection makes few
// system calls. A connection closed while a thread is in sendmsg waits in
// kClosing for that thread, which drops the queue and has the socket closed
// (its descriptor is never closed under a writer). close_when_drained
// (kRefused) closes the connection once the queue is empty.
namespace tide::transport {

using Socket = asio::generic::stream_protocol::socket;

// A frame on its way out: the head, then the buffers, straight from where
// they live (sendmsg); descriptors go with its first byte.
struct OutFrame {
  std::string head;
  std::vector<Buffer> buffers;
  std::vector<int> fds;
  size_t total = 0;
  // The message's id, and whether it may be taken back before it goes
  // (Pipe::cancel: a plain frame of the layer above, nothing in segments or
  // on lanes).
  uint64_t id = 0;
  bool cancellable = false;
};

struct Connection : std::enable_shared_from_this<Connection> {
  enum class State {
    kConnecting,
    kAwaitingAck,
    kAwaitingHello,
    kAwaitingProof,
    kOpen,
    kLane,
    kRefused,
    kClosed,
  };
  enum class Writer {
    kNotConnected,
    kIdle,
    kWriting,
    kBlocked,
    kClosing,
    kClosed
  };
  static const char* state_name(State s);

  Connection(Transport::Impl& owner, Socket socket, bool outgoing, bool local);

  // --- life (connection.cpp) --------------------------------------------
  // The socket is connected: start reading and writing.
  void start();
  // Fails the connection after logging why (the peer misbehaved). Loop.
  void drop(const std::string& reason);
  // The peer, for logs: its label once it proved itself (or this side
  // chose it), what it claims until then. Loop.
  std::string who() const;
  // The key of this connection's proofs: the group's token, or this
  // worker's own key on a connection to itself (Transport::Impl::self_key).
  const std::string& secret() const;
  // Closes it and tells the transport once. Loop.
  void fail(const std::string& reason);
  // fail() on the loop, after reading what the socket still holds; any
  // thread, holding wmutex.
  void fail_later(std::string reason);
  // Closes the socket, unless a writer is in sendmsg (kClosing): it has
  // the socket closed when it comes out. Loop.
  void close_socket();
  void set_state(State next);
  bool handshaken() const {
    return state == State::kOpen || state == State::kLane;
  }
  // The handle the layer above holds: made once the connection is owned
  // (make_handle(), before it is shared), its peer set at the handshake.
  void make_handle();
  const Pipe& pipe() const {
    return handle;
  }

  // --- reading (connection.cpp) -----------------------------------------
  void wait_readable();
  void read_ready();
  // The full read buffer, once the peer proved itself (a stranger gets a
  // small one).
  void grow_read_buffer();
  // Drops the connection unless it is handshaken in time. Loop.
  void start_handshake_deadline();
  void on_frame(Frame frame);
  // A frame of a connection that is open, its buffers all in: to the layer
  // above.
  void dispatch(Frame& frame);

  // --- writing (connection.cpp) -----------------------------------------
  // Queues a message and writes what the socket takes now (the layer
  // above's are held until the handshake is done). Any thread; throws
  // InvalidArgument when it is over the frame limits, NetworkError when the
  // queue is over TransportOptions::max_queued_bytes. Returns false when
  // the connection is closed and its loss reported (m dropped).
  bool send(Message m);
  // Takes back the unsent frames of message `id` (Pipe::cancel). Any thread.
  void cancel(uint64_t id);
  OutFrame encode_frame(Message m);
  // Encodes m onto the queue and counts its bytes; holding wmutex.
  void queue_locked(Message m);
  static size_t message_bytes(const Message& m);
  void flush(std::unique_lock<std::mutex>& lock);
  void wait_writable();

  // --- handshake (handshake.cpp) ----------------------------------------
  // The first frames: HANDSHAKE, HANDSHAKE_ACK, PROOF, REFUSED or
  // LANE_HELLO.
  void expect_handshake(Frame& frame);
  void accept_hello(Frame& frame);
  void accept_proof(Frame& frame);
  void accept_ack(Frame& frame);
  // The peer proved itself: open for the layer above.
  void authenticated();
  // Refuses the peer: `logged` here, `told` to it (after "worker '<name>'
  // ").
  void refuse(const std::string& logged, const std::string& told);
  // The callee's side: LANE_HELLO makes this a lane of the caller's
  // connection.
  void attach_as_lane(Frame& frame);
  // The path the handshake agreed on: shared memory (`shm`), lanes (any
  // TCP connection) or inline. Loop.
  void choose_path(bool shm);

  // --- members ----------------------------------------------------------
  Transport::Impl& owner;
  Socket socket;
  const bool outgoing;
  // A Unix socket to a process of this host (TCP otherwise). Set before
  // the connection starts; the loop turns it off when the local connect
  // fails and TCP is tried instead.
  bool local;
  int peer_id = -1;
  // The name it claimed, and its process (SO_PEERCRED; local callees).
  std::string peer_name;
  int peer_pid = 0;
  // Its role: a lane of another connection (the caller's lanes from their
  // creation, the callee's from LANE_HELLO), and that connection. Loop
  // only.
  bool lane = false;
  std::weak_ptr<Connection> parent;

  // Loop only.
  State state;
  // Mirrors state == kClosed for other threads, and why: close_reason is
  // written before closed_flag is set, read after it.
  std::atomic<bool> closed_flag{false};
  std::string close_reason;
  Pipe handle;
  uint64_t handshake_seq = 0;  // Callee's side: the order of handshakes.
  // The nonces and ids the proofs cover, and (callee) the shared memory it
  // agreed to, in force from the caller's proof.
  auth::Session session;
  bool offered_shm = false;
  // Counted in Transport::Impl::unauthenticated (an accepted connection
  // until it proves itself or closes), by its source, from its accept
  // (Transport::Impl::Admission); and why its hello is to be refused.
  bool counted = false;
  std::string source;
  Clock::time_point accepted_at;
  std::string refusal;
  asio::steady_timer handshake_timer;
  FrameDecoder decoder;
  // Not zero-filled: pages are touched only as bytes come.
  std::unique_ptr<char[]> read_buf;
  size_t read_cap = 0;
  // Descriptors received, not yet claimed by a frame's table.
  std::deque<Fd> received_fds;

  // The sending side: any thread writes under wmutex (a reply goes out
  // from the worker thread that made it), the loop waits for a full socket.
  std::mutex wmutex;
  Writer writer = Writer::kNotConnected;  // Guarded by wmutex.
  bool close_when_drained = false;        // Guarded by wmutex.
  // Where its large buffers go: inline until the handshake chooses
  // (choose_path, on the loop, under wmutex); senders use it under wmutex,
  // the loop without.
  std::unique_ptr<BufferPath> path = std::make_unique<InlinePath>(*this);
  std::deque<OutFrame> queue;  // Guarded by wmutex.
  size_t front_sent = 0;       // Bytes of queue.front() written.
  // The layer above's messages held until the callee proved itself (the
  // caller's side). Guarded by wmutex.
  bool holding = false;
  std::deque<Message> held;
  // Bytes in queue and held, for max_queued_bytes. Guarded by wmutex.
  size_t queued_bytes = 0;
  size_t held_bytes = 0;
};

}  // namespace tide::transport
