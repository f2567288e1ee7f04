#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/steady_timer.hpp>

#include "transport/connection.h"
#include "transport/lendable_loop.h"
#include "transport/timers.h"
#include "transport/transport.h"

// The transport's state, shared by its files. Private to the transport.
//
// Every file of the transport includes a standard header before asio's:
// asio decides how it allocates (aligned_alloc or operator new) from
// macros the standard library defines, and two files deciding differently
// free with one what the other allocated.
namespace tide::transport {

// Per sendmsg: enough to batch many small frames; sendmsg takes up to
// IOV_MAX (1024).
constexpr size_t kMaxIov = 128;
// Descriptors one frame may pass (each new segment passes one); the kernel
// takes at most 253 per message.
constexpr size_t kMaxFdsPerFrame = 64;
constexpr size_t kReadBuffer = 256 * 1024;
// A peer's read buffer until it proves itself.
constexpr size_t kHandshakeReadBuffer = 4 * 1024;
// A handshake (or its refusal) is a few names: a peer not yet known sends
// no more before it is.
constexpr FrameLimits kHandshakeLimits{
    .max_metadata = 64 * 1024,
    .max_buffers = 0,
    .max_buffer = 0,
    .max_frame = 128 * 1024};
// Reads before another connection gets the loop.
constexpr int kReadsPerTurn = 32;

struct Transport::Impl : std::enable_shared_from_this<Transport::Impl> {
  Impl(TransportOptions o, TransportHandlers h);

  void start_accept();
  void start_local_accept();
  // Who an accepted connection comes from, as the kernel says before the
  // peer says a word (docs/security.md, "Admission").
  struct Admission {
    bool local = false;  // the Unix socket
    int pid = 0;         // its process (the Unix socket)
    // What strangers are counted by: "user <uid>" for a process of this
    // host, "host <address>" for another host.
    std::string source;
    // Why its hello will be refused ("" when it may go on).
    std::string refusal;
  };
  // Takes an accepted socket; when kMaxUnauthenticated others have not
  // proved themselves yet, the oldest stranger of the source that holds
  // the most goes first (make_room). Loop.
  void adopt(Socket socket, Admission who);
  // Closes the oldest connection not yet proved of the source holding the
  // most: a flood from one source costs that source its own places, never
  // another's. Loop.
  void make_room();
  // Who is at the other end of accepted TCP socket fd, and whether this
  // worker lets it say hello. (tcp/tcp.cpp)
  Admission admit_tcp(int fd, const std::string& address) const;
  // Connects a new outgoing connection: its Unix socket, or TCP. Loop.
  void connect_on_loop(const std::shared_ptr<Connection>& conn);
  // Connects conn over TCP and starts it, then runs `connected`. Loop.
  // (tcp/tcp.cpp)
  void connect_tcp(
      const std::shared_ptr<Connection>& conn,
      std::function<void()> connected = {});
  // A connection closed: forget it, tell the layer above about one this
  // side opened. Loop.
  void connection_failed(Connection& conn, const std::string& reason);
  void stop_on_loop();
  // HANDSHAKE's metadata: who this side is, shared memory offered or not,
  // its nonce, and whether it has a token. (handshake.cpp)
  std::string handshake_metadata(
      bool offer_shm, const std::string& nonce) const;
  // Why a peer claiming to be worker `id` called `name` on `conn` is not
  // who the peer table says ("" when it may be). (handshake.cpp)
  std::string identity_problem(
      int id, const std::string& name, const Connection& conn) const;
  // conn proved itself or closed: it no longer counts as unauthenticated.
  // Loop.
  void left_handshake(Connection& conn);
  // After an accept error: accepts again later, backing off (the process
  // may be out of descriptors). Loop.
  void accept_failed(const char* what, const asio::error_code& ec, bool local);
  // Whether a refusal may be logged as a warning now (at most one a second;
  // the rest go to debug): strangers must not fill the log.
  bool warn_now();
  bool uid_allowed(uint32_t uid) const;

  const TransportOptions options;
  const TransportHandlers handlers;
  // Every type a peer may send: the control types and the layer above's.
  const MessageTypes types;
  const std::string host_key = local_host_key();
  // The secret of this worker's connections to itself: a claim of its own
  // id proves itself with this key, which never leaves the process, so no
  // other process can make it.
  const std::string self_key = auth::nonce();
  std::string local_name;  // Without the leading NUL.

  LendableLoop loop{options.poll};
  asio::ip::tcp::acceptor acceptor;
  asio::local::stream_protocol::acceptor local_acceptor;
  uint16_t port = 0;
  std::atomic<bool> stopping{false};

  std::atomic<uint64_t> buffers_via_shm{0};
  std::atomic<uint64_t> bytes_via_shm{0};
  std::atomic<uint64_t> segments{0};
  std::atomic<uint64_t> buffers_returned{0};
  std::atomic<uint64_t> buffers_via_lanes{0};
  std::atomic<uint64_t> bytes_via_lanes{0};

  // Where peers listen. Guarded by peers_mutex.
  mutable std::mutex peers_mutex;
  std::unordered_map<int, PeerAddress> peers;
  std::string peer_label(int id) const;

  // Connections this side opened, by peer; any thread finds (or opens) one
  // here. Guarded by pipes_mutex, with `stopped`.
  std::mutex pipes_mutex;
  std::unordered_map<int, std::shared_ptr<Connection>> outgoing;
  bool stopped = false;

  // Loop only.
  std::unordered_set<std::shared_ptr<Connection>> incoming;
  uint64_t handshakes = 0;  // Accepted so far.
  size_t unauthenticated = 0;
  bool stopped_on_loop = false;
  asio::steady_timer accept_timer{loop.io()};
  asio::steady_timer local_accept_timer{loop.io()};
  std::chrono::milliseconds accept_backoff{0};
  std::chrono::milliseconds local_accept_backoff{0};
  Clock::time_point last_warning{};
  // Shared with the Timers handed out.
  const std::shared_ptr<TimerQueue> timers =
      std::make_shared<TimerQueue>(loop.io());
};

// A received buffer that lives in a shared-memory segment, which is the
// peer's (a lease: when the buffer dies, the peer may reuse the segment) or
// this side's own, sent back by the peer (reused here once the peer's
// release has come too). (shm/shm_path.cpp)
struct SegmentUse {
  SegmentUse(
      std::shared_ptr<void> memory,
      std::weak_ptr<Transport::Impl> transport,
      std::weak_ptr<Connection> conn,
      uint64_t segment,
      bool own)
      : memory(std::move(memory)),
        transport(std::move(transport)),
        conn(std::move(conn)),
        segment(segment),
        own(own) {}
  ~SegmentUse();
  SegmentUse(const SegmentUse&) = delete;
  SegmentUse& operator=(const SegmentUse&) = delete;

  std::shared_ptr<void> memory;  // Keeps the mapping.
  std::weak_ptr<Transport::Impl> transport;
  std::weak_ptr<Connection> conn;
  uint64_t segment = 0;
  bool own = false;
};

}  // namespace tide::transport
