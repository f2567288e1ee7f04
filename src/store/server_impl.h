#pragma once

// The store server's insides, shared by its two files: tcp_store_server.cpp
// (the server: listening, accepting, the keys, the waiters, the operations)
// and server_connection.cpp (one client's connection: reading and parsing
// its requests, its token, its request timer, writing its replies).
// Everything here runs on the server's loop thread, but for what Impl says.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <asio.hpp>

#include "tide/common/logging.h"
#include "tide/store/tcp_store.h"

#include "store/fan_in.h"
#include "store/kv_map.h"
#include "store/server_metrics.h"
#include "store/wire.h"

namespace tide::store {

namespace detail {

class Connection;

// A WAIT that is not yet satisfied. Registered under each distinct key that
// was missing; replied to when the last one arrives.
struct Waiter {
  std::weak_ptr<Connection> conn;
  std::vector<std::string> keys;
  size_t missing = 0;
  bool done = false;
  // A tagged WAIT's tag.
  std::optional<uint64_t> tag;
  // An ADD_WAIT's count: its reply is the count and its one key's value.
  std::optional<int64_t> count;
};

}  // namespace detail

struct TcpStoreServer::Impl {
  // On its own loop (run by start()'s thread), or on a loop the caller
  // runs (start_server_on).
  explicit Impl(TcpStoreServerOptions opts, asio::io_context* shared = nullptr)
      : options(std::move(opts)),
        own_io(shared ? nullptr : std::make_unique<asio::io_context>()),
        io(shared ? *shared : *own_io),
        acceptor(io),
        accept_retry(io) {}

  void open();
  void accept();
  void on_accept(const asio::error_code& ec, asio::ip::tcp::socket socket);
  // Strangers: with a token, connections that have not presented it yet,
  // bounded in number (max_unauthenticated: the oldest of the source that
  // holds the most makes room) and in age (auth_timeout, swept each
  // second). Loop thread only.
  void make_room();
  void sweep_strangers();
  void stop_on_loop();
  void handle(
      const std::shared_ptr<detail::Connection>& conn, wire::Request& req);
  void notify(std::string_view key, bool wake_one = false);
  bool present(std::string_view key) const;
  // A WAIT's (count empty) or an ADD_WAIT's.
  void add_waiter(
      const std::shared_ptr<detail::Connection>& conn,
      std::vector<std::string> keys,
      std::optional<int64_t> count = std::nullopt);
  // What ends a wait: STOP_WAITING, or an ADD_WAIT's count and the value
  // of its key (empty when absent).
  std::string waited(
      const std::optional<int64_t>& count,
      const std::vector<std::string>& keys) const;
  void drop_waiters(detail::Connection& conn);
  // Marks w done and counts it dead in the lists of its keys.
  void retire(detail::Waiter& w);
  // A tagged WAIT whose bound passed: answered WAIT_TIMED_OUT.
  void expire(const std::shared_ptr<detail::Waiter>& w);
  // The bounds of tagged WAITs: one timer for them all, at the earliest
  // bound but no sooner than kBoundSweep after the last sweep, so that
  // thousands of keep-alive waits a second cost no timer each.
  void arm_bounds();
  void sweep_bounds();
  // False (and logs) when the write would pass max_total_bytes.
  bool has_room(detail::Connection& conn, const wire::Request& req);
  // Bytes of the reply to req, known before it is built (an upper bound for
  // COMPARE_SET).
  uint64_t reply_bytes(const wire::Request& req) const;

  const TcpStoreServerOptions options;
  std::unique_ptr<asio::io_context> own_io;
  asio::io_context& io;
  asio::ip::tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  uint16_t port = 0;
  std::thread thread;
  std::once_flag shutdown_once;
  // Set by shutdown() before it posts the stop; erase_outside() posts only
  // while it is false.
  std::mutex stop_mutex;
  bool stopping = false;
  std::atomic<bool> loop_ended = false;

  // Loop thread only.
  uint64_t next_conn_id = 1;
  std::unordered_set<std::shared_ptr<detail::Connection>> connections;
  detail::KvMap kv;
  std::unordered_map<
      std::string,
      std::deque<std::string>,
      detail::StringHash,
      std::equal_to<>>
      queues;
  uint64_t queue_bytes = 0;
  detail::ServerMetrics& metrics = detail::server_metrics();
  // Requests seen by operation, for the sample that is timed.
  std::vector<uint32_t> seen = std::vector<uint32_t>(metrics.by_op.size());
  // What this server added to metrics.keys and .clients.
  size_t counted_keys = 0;
  size_t counted_clients = 0;
  // Brings the shared gauges to what this server holds.
  void count_keys() {
    if (kv.size() != counted_keys) {
      metrics.keys.inc(
          static_cast<double>(kv.size()) - static_cast<double>(counted_keys));
      counted_keys = kv.size();
    }
  }
  void count_clients() {
    if (connections.size() != counted_clients) {
      metrics.clients.inc(
          static_cast<double>(connections.size()) -
          static_cast<double>(counted_clients));
      counted_clients = connections.size();
    }
  }
  // WAITs by missing key. A cancelled one stays in its lists, marked done,
  // until they are mostly dead: removing it at once would cost O(waiters)
  // per CANCEL_WAIT, and thousands of agents cancel a wait on one key each
  // keep-alive interval.
  struct WaiterList {
    std::vector<std::shared_ptr<detail::Waiter>> list;
    size_t dead = 0;
  };
  std::unordered_map<
      std::string,
      WaiterList,
      detail::StringHash,
      std::equal_to<>>
      waiters;
  // The peer of the connection being accepted.
  asio::ip::tcp::endpoint accepting_peer;
  std::unordered_set<std::shared_ptr<detail::Connection>> strangers;
  asio::steady_timer sweep{io};
  bool sweeping = false;
  struct Bound {
    std::chrono::steady_clock::time_point at;
    std::weak_ptr<detail::Waiter> waiter;
    bool operator>(const Bound& o) const {
      return at > o.at;
    }
  };
  std::priority_queue<Bound, std::vector<Bound>, std::greater<>> bounds;
  asio::steady_timer bound_timer{io};
  std::optional<std::chrono::steady_clock::time_point> bound_timer_at;
  std::chrono::steady_clock::time_point last_sweep;
  static constexpr std::chrono::milliseconds kBoundSweep{10};
  // A store fan-in's (options.upstream): where requests go instead of kv.
  std::unique_ptr<detail::Forwarder> forwarder;
};

namespace detail {

// A server on a loop the caller runs, with no thread of its own: for
// programs that host many (the scale bench's simulated nodes, each with a
// fan-in). shutdown() posts to that loop; join() returns at once.
std::unique_ptr<TcpStoreServer> start_server_on(
    asio::io_context& io, TcpStoreServerOptions options);

// One client's connection: its requests are read into one buffer, parsed
// there as they complete, and handled in order; its replies go out in one
// write per wake-up.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Impl = TcpStoreServer::Impl;

  // TCP_NODELAY comes from the listening socket (Linux copies it).
  Connection(
      Impl& server,
      asio::ip::tcp::socket socket,
      const asio::ip::tcp::endpoint& peer,
      uint64_t id,
      std::string source);

  void start();

  // Closes the connection once; `reason` is logged at `level`.
  void close(spdlog::level::level_enum level, std::string_view reason);

  // Queues a reply (after the tag of the tagged request being handled, if
  // it is one). Replies to requests read in one wake-up go out in one
  // write at its end; others (a WAIT woken by another client) at once.
  void send(std::string_view bytes) {
    send_tagged(tag_ ? &tag_->tag : nullptr, bytes);
  }
  void send_tagged(const uint64_t* tag, std::string_view bytes);

  void send_byte(uint8_t b);

  // The frame of the tagged request being handled, if it is one.
  const std::optional<wire::Tagged>& tag() const {
    return tag_;
  }

  const std::string& peer() const {
    return peer_;
  }
  // Whom strangers are counted by ("user <uid>" or "host <address>"), and
  // when it connected.
  const std::string& source() const {
    return source_;
  }
  std::chrono::steady_clock::time_point accepted() const {
    return accepted_;
  }
  uint64_t id() const {
    return id_;
  }
  std::optional<Dialect> dialect() const {
    return dialect_;
  }

  // Pending WAITs of this connection. Loop thread only.
  std::vector<std::shared_ptr<Waiter>> waits;
  size_t wait_keys = 0;

  // A store fan-in's (store/fan_in.h): the request just handled is answered
  // from upstream later, and no further request of this connection is read
  // or handled until release(), so its replies keep their order. (A WAIT
  // is not held: as on a server that holds the keys, the requests after it
  // are answered while it waits.)
  void hold() {
    held_ = true;
  }
  void release();
  // The tag of the last write forwarded for this connection (the fan-in's).
  uint64_t last_write_tag = 0;

 private:
  size_t pending_output() const {
    return out_.size() + writing_.size();
  }

  void arm_read();

  // Handles the requests that have arrived, sends their replies, and reads
  // more. Not while a read is pending: it would own the tail of in_.
  void serve();

  void on_read_error(const asio::error_code& ec);

  void process();

  // Handles the request at the front of view; false when it is incomplete.
  bool step(std::string_view view);

  // Whether req's reply may be built now. A reply is built only while the
  // unread ones stay within max_pending_reply_bytes, or alone: a server
  // holds at most about the bound plus one value per client, however many
  // requests arrive at once. Otherwise the request stays in in_ (decoded
  // again on resume) until the client reads. A MULTI_GET of several keys
  // whose reply alone passes the bound is refused; one value never is.
  bool fits_output(const wire::Request& req);

  void consume(size_t n);

  void authenticate(std::string_view token);

  void disarm_request_timer();

  void arm_request_timer();

  void flush();

  Impl& server_;
  asio::ip::tcp::socket socket_;
  asio::steady_timer request_timer_;
  const uint64_t id_;
  std::string peer_;
  const std::string source_;
  const std::chrono::steady_clock::time_point accepted_ =
      std::chrono::steady_clock::now();
  // The last read filled its buffer: more is likely queued.
  bool busy_ = false;
  bool closed_ = false;
  bool reading_ = false;
  bool authed_ = false;
  bool timer_armed_ = false;
  uint64_t timer_generation_ = 0;
  bool in_read_ = false;
  // Requests wait in in_ until the client reads its replies (fits_output);
  // no read is pending meanwhile.
  bool paused_ = false;
  // hold(): a request is answered from elsewhere.
  bool held_ = false;
  std::optional<Dialect> dialect_;
  std::optional<wire::Tagged> tag_;
  std::string in_;
  size_t in_pos_ = 0;
  // Bytes of in_ that hold data (the rest is room for a pending read).
  size_t filled_ = 0;
  size_t need_ = 1;
  std::string out_;
  std::string writing_;
};

}  // namespace detail

}  // namespace tide::store
