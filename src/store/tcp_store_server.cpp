// The TCP store server: one loop thread (asio), incremental parsing, waiters
// woken by the writes that satisfy them. Threading and protocol notes are in
// docs/store-protocol.md.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <asio.hpp>

#include "tide/common/error.h"
#include "tide/common/fd_limit.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"
#include "tide/store/tcp_store.h"

#include "net/eviction.h"
#include "net/peer_owner.h"
#include "store/kv_map.h"
#include "store/server_metrics.h"
#include "store/wire.h"

namespace tide::store {

using asio::ip::tcp;

using detail::kTimeOneIn;
using detail::server_metrics;
using detail::ServerMetrics;

namespace {

class Connection;

// A WAIT that is not yet satisfied. Registered under each distinct key that
// was missing; replied to when the last one arrives.
struct Waiter {
  std::weak_ptr<Connection> conn;
  std::vector<std::string> keys;
  size_t missing = 0;
  bool done = false;
};

// Bytes read per read: at least one chunk, more for a request known to be
// long, at most the maximum before other clients get their turn. The chunk
// is small because every idle connection holds one (a job's clients mostly
// wait); a connection whose reads fill it gets a bigger one.
constexpr size_t kReadChunk = 512;
constexpr size_t kBusyReadChunk = 16 * 1024;
constexpr size_t kMaxReadChunk = 1024 * 1024;
// A buffer over this is freed when it empties rather than kept for an idle
// connection.
constexpr size_t kKeepBuffer = 64 * 1024;

void release(std::string& buffer) {
  buffer.clear();
  if (buffer.capacity() > kKeepBuffer) {
    std::string().swap(buffer);
  }
}

}  // namespace

struct TcpStoreServer::Impl {
  explicit Impl(TcpStoreServerOptions opts)
      : options(std::move(opts)), acceptor(io), accept_retry(io) {}

  void open();
  void accept();
  void on_accept(const asio::error_code& ec, tcp::socket socket);
  // Strangers: with a token, connections that have not presented it yet,
  // bounded in number (max_unauthenticated: the oldest of the source that
  // holds the most makes room) and in age (auth_timeout, swept each
  // second). Loop thread only.
  void make_room();
  void sweep_strangers();
  void stop_on_loop();
  void handle(const std::shared_ptr<Connection>& conn, wire::Request& req);
  void notify(std::string_view key, bool wake_one = false);
  bool present(std::string_view key) const;
  void add_waiter(
      const std::shared_ptr<Connection>& conn, std::vector<std::string> keys);
  void drop_waiters(Connection& conn);
  // False (and logs) when the write would pass max_total_bytes.
  bool has_room(Connection& conn, const wire::Request& req);
  // Bytes of the reply to req, known before it is built (an upper bound for
  // COMPARE_SET).
  uint64_t reply_bytes(const wire::Request& req) const;

  const TcpStoreServerOptions options;
  asio::io_context io;
  tcp::acceptor acceptor;
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
  std::unordered_set<std::shared_ptr<Connection>> connections;
  detail::KvMap kv;
  std::unordered_map<
      std::string,
      std::deque<std::string>,
      detail::StringHash,
      std::equal_to<>>
      queues;
  uint64_t queue_bytes = 0;
  ServerMetrics& metrics = server_metrics();
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
    std::vector<std::shared_ptr<Waiter>> list;
    size_t dead = 0;
  };
  std::unordered_map<
      std::string,
      WaiterList,
      detail::StringHash,
      std::equal_to<>>
      waiters;
  // The peer of the connection being accepted.
  tcp::endpoint accepting_peer;
  std::unordered_set<std::shared_ptr<Connection>> strangers;
  asio::steady_timer sweep{io};
  bool sweeping = false;
};

namespace {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Impl = TcpStoreServer::Impl;

  // TCP_NODELAY comes from the listening socket (Linux copies it).
  Connection(
      Impl& server,
      tcp::socket socket,
      const tcp::endpoint& peer,
      uint64_t id,
      std::string source)
      : server_(server),
        socket_(std::move(socket)),
        request_timer_(server.io),
        id_(id),
        source_(std::move(source)) {
    peer_ = peer.address().to_string() + ":" + std::to_string(peer.port());
    asio::error_code ec;
    socket_.non_blocking(true, ec);
    authed_ = server_.options.token.empty();
  }

  void start() {
    TIDE_LOG_DEBUG("[store] client {} ({}) connected", id_, peer_);
    arm_read();
  }

  // Closes the connection once; `reason` is logged at `level`.
  void close(spdlog::level::level_enum level, std::string_view reason) {
    if (closed_) {
      return;
    }
    closed_ = true;
    SPDLOG_LOGGER_CALL(
        &tide::logger(),
        level,
        "[store] closing client {} ({}): {}",
        id_,
        peer_,
        reason);
    asio::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    request_timer_.cancel();
    server_.drop_waiters(*this);
    Impl& server = server_;  // The erase may end this connection.
    server.strangers.erase(shared_from_this());
    server.connections.erase(shared_from_this());
    server.count_clients();
  }

  // Queues a reply. Replies to requests read in one wake-up go out in one
  // write at its end; others (a WAIT woken by another client) at once.
  void send(std::string_view bytes) {
    if (closed_) {
      return;
    }
    out_.append(bytes);
    if (!in_read_) {
      flush();
    }
  }

  void send_byte(uint8_t b) {
    char c = static_cast<char>(b);
    send(std::string_view(&c, 1));
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

 private:
  size_t pending_output() const {
    return out_.size() + writing_.size();
  }

  void arm_read() {
    // While paused, requests wait in in_ and the socket; otherwise in_ holds
    // at most one incomplete request, which must be read whole (however
    // many replies are unread) or its timer would drop an honest client.
    if (closed_ || reading_ || paused_) {
      return;
    }
    reading_ = true;
    // Read straight into the tail of in_: no buffer beyond what the
    // connection holds, and asio queues the read without a system call when
    // nothing has arrived yet. A request known to be long is read in bigger
    // pieces. Nothing else touches in_ while the read is pending.
    size_t avail = in_.size() - in_pos_;
    size_t want = std::clamp(
        need_ > avail ? need_ - avail : 0,
        busy_ ? kBusyReadChunk : kReadChunk,
        kMaxReadChunk);
    size_t old = in_.size();
    filled_ = old;
    in_.resize(old + want);
    socket_.async_read_some(
        asio::buffer(in_.data() + old, want),
        [self = shared_from_this(), old, want](
            const asio::error_code& ec, size_t n) {
          self->reading_ = false;
          self->busy_ = !ec && n == want;
          if (n > 0) {
            self->server_.metrics.bytes_received.inc(static_cast<double>(n));
          }
          self->in_.resize(old + (ec ? 0 : n));
          self->filled_ = self->in_.size();
          if (ec) {
            self->on_read_error(ec);
            return;
          }
          self->serve();
        });
  }

  // Handles the requests that have arrived, sends their replies, and reads
  // more. Not while a read is pending: it would own the tail of in_.
  void serve() {
    TIDE_DCHECK(!reading_);
    do {
      paused_ = false;
      in_read_ = true;
      process();
      in_read_ = false;
      flush();
      // Paused, but the replies went out at once: no write completion will
      // resume us, so go on now.
    } while (paused_ && !closed_ && writing_.empty());
    arm_read();
  }

  void on_read_error(const asio::error_code& ec) {
    if (ec == asio::error::operation_aborted) {
      return;
    }
    if (in_pos_ < in_.size()) {
      close(
          spdlog::level::warn,
          "disconnected in the middle of a request (" +
              std::to_string(in_.size() - in_pos_) + " bytes received)");
    } else {
      close(
          spdlog::level::debug,
          ec == asio::error::eof ? "disconnected" : ec.message());
    }
  }

  void process() {
    while (!closed_ && !paused_) {
      size_t avail = in_.size() - in_pos_;
      if (avail == 0 || avail < need_) {
        break;
      }
      std::string_view view(in_.data() + in_pos_, avail);
      try {
        if (!step(view)) {
          break;
        }
      } catch (const ProtocolError& e) {
        server_.metrics.bad_requests.inc();
        close(spdlog::level::warn, std::string("protocol error: ") + e.what());
        return;
      } catch (const std::exception& e) {
        // Whatever failed, it stays with this client: the others go on.
        close(spdlog::level::err, std::string("internal error: ") + e.what());
        return;
      }
    }
    if (closed_) {
      return;
    }
    if (in_pos_ == in_.size()) {
      in_.clear();
      // A big request's buffer is not kept idle, nor a busy spell's once
      // the connection is quiet again.
      if (in_.capacity() > kKeepBuffer ||
          (!busy_ && in_.capacity() > 4 * kReadChunk)) {
        in_.shrink_to_fit();
      }
      in_pos_ = 0;
      disarm_request_timer();
    } else {
      // The clock runs from the start of the request now at the front: a
      // client that completes requests is making progress.
      bool progressed = in_pos_ > 0;
      if (progressed) {
        in_.erase(0, in_pos_);
        in_pos_ = 0;
        disarm_request_timer();
      }
      if (paused_) {
        disarm_request_timer();  // The server is the one waiting now.
      } else {
        arm_request_timer();
      }
    }
  }

  // Handles the request at the front of view; false when it is incomplete.
  bool step(std::string_view view) {
    if (!dialect_ && static_cast<uint8_t>(view[0]) == wire::kAuthCode) {
      wire::Request req;
      auto d = wire::decode_request(
          view, Dialect::kLegacy, server_.options.limits, req);
      if (d.consumed == 0) {
        need_ = d.need;
        return false;
      }
      consume(d.consumed);
      authenticate(req.values[0]);
      return true;
    }
    if (!authed_) {
      close(
          spdlog::level::warn,
          "sent a request before authenticating; this server requires a "
          "token");
      return false;
    }
    if (!dialect_) {
      dialect_ = wire::detect_dialect(view);
      if (!dialect_) {
        need_ = 5;
        return false;
      }
      TIDE_LOG_DEBUG(
          "[store] client {} speaks the {} dialect",
          id_,
          *dialect_ == Dialect::kModern ? "modern" : "legacy");
    }
    wire::Request req;
    auto d = wire::decode_request(view, *dialect_, server_.options.limits, req);
    if (d.consumed == 0) {
      need_ = d.need;
      return false;
    }
    if (!fits_output(req)) {
      return false;
    }
    consume(d.consumed);
    auto op = static_cast<size_t>(req.op);
    auto& m = server_.metrics.by_op[op];
    if (server_.seen[op]++ % kTimeOneIn != 0) {
      server_.handle(shared_from_this(), req);
    } else {
      auto start = std::chrono::steady_clock::now();
      server_.handle(shared_from_this(), req);
      m.seconds.observe(std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - start)
                            .count());
    }
    m.requests.inc();
    server_.count_keys();
    return true;
  }

  // Whether req's reply may be built now. A reply is built only while the
  // unread ones stay within max_pending_reply_bytes, or alone: a server
  // holds at most about the bound plus one value per client, however many
  // requests arrive at once. Otherwise the request stays in in_ (decoded
  // again on resume) until the client reads. A MULTI_GET of several keys
  // whose reply alone passes the bound is refused; one value never is.
  bool fits_output(const wire::Request& req) {
    const size_t bound = server_.options.limits.max_pending_reply_bytes;
    uint64_t reply = server_.reply_bytes(req);
    if (req.op == wire::Op::kMultiGet && req.keys.size() > 1 && reply > bound) {
      close(
          spdlog::level::warn,
          "MULTI_GET of " + std::to_string(req.keys.size()) +
              " keys would reply " + std::to_string(reply) +
              " bytes, over max_pending_reply_bytes " + std::to_string(bound) +
              "; ask for fewer keys per call");
      return false;
    }
    size_t pending = pending_output();
    if (pending > 0 && pending + reply > bound) {
      paused_ = true;  // Resumed by the write that drains the replies.
      return false;
    }
    return true;
  }

  void consume(size_t n) {
    in_pos_ += n;
    need_ = 1;
  }

  void authenticate(std::string_view token) {
    if (!server_.options.token.empty() &&
        !token_equal(token, server_.options.token)) {
      close(spdlog::level::warn, "wrong token");
      return;
    }
    authed_ = true;
    server_.strangers.erase(shared_from_this());
    send_byte(wire::kAuthOk);
  }

  void disarm_request_timer() {
    if (timer_armed_) {
      request_timer_.cancel();
      timer_armed_ = false;
      ++timer_generation_;  // A handler already queued must not fire.
    }
  }

  void arm_request_timer() {
    if (timer_armed_) {
      return;
    }
    timer_armed_ = true;
    request_timer_.expires_after(server_.options.request_timeout);
    request_timer_.async_wait([weak = weak_from_this(),
                               generation = timer_generation_](
                                  const asio::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || generation != self->timer_generation_) {
        return;
      }
      self->close(
          spdlog::level::warn,
          "request incomplete after " +
              std::to_string(self->server_.options.request_timeout.count()) +
              " ms (" + std::to_string(self->filled_ - self->in_pos_) +
              " bytes received)");
    });
  }

  void flush() {
    if (writing_.size() > 0 || out_.empty() || closed_) {
      return;
    }
    // Most replies fit the socket buffer: write them now, and leave only a
    // remainder to an asynchronous write.
    asio::error_code ec;
    size_t n = socket_.write_some(asio::buffer(out_), ec);
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
      close(spdlog::level::debug, "write failed: " + ec.message());
      return;
    }
    if (n > 0) {
      server_.metrics.bytes_sent.inc(static_cast<double>(n));
    }
    if (n == out_.size()) {
      release(out_);
      return;
    }
    // Swapped, not copied: the replies are held once. out_ gets the empty
    // buffer of the last write.
    writing_.swap(out_);
    asio::async_write(
        socket_,
        asio::buffer(writing_) + n,
        [self = shared_from_this()](const asio::error_code& ec, size_t sent) {
          if (sent > 0) {
            self->server_.metrics.bytes_sent.inc(static_cast<double>(sent));
          }
          release(self->writing_);
          if (ec) {
            if (ec != asio::error::operation_aborted) {
              self->close(
                  spdlog::level::debug, "write failed: " + ec.message());
            }
            return;
          }
          if (self->paused_) {
            self->serve();  // No read is pending while paused.
          } else {
            self->flush();
            self->arm_read();
          }
        });
  }

  Impl& server_;
  tcp::socket socket_;
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
  std::optional<Dialect> dialect_;
  std::string in_;
  size_t in_pos_ = 0;
  // Bytes of in_ that hold data (the rest is room for a pending read).
  size_t filled_ = 0;
  size_t need_ = 1;
  std::string out_;
  std::string writing_;
};

std::string encode_i64(int64_t v) {
  std::string s;
  wire::Writer(s).i64(v);
  return s;
}

std::string encode_str(std::string_view v) {
  std::string s;
  wire::Writer(s).str(v);
  return s;
}

}  // namespace

void TcpStoreServer::Impl::open() {
  asio::error_code ec;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(
      options.host,
      std::to_string(options.port),
      tcp::resolver::passive | tcp::resolver::numeric_service,
      ec);
  if (ec || results.empty()) {
    throw InvalidArgument(
        "store server: cannot resolve host \"" + options.host +
        "\": " + ec.message());
  }
  std::string errors;
  for (const auto& entry : results) {
    tcp::endpoint ep = entry.endpoint();
    asio::error_code e;
    acceptor.open(ep.protocol(), e);
    if (!e && ep.address().is_v6() && ep.address().is_unspecified()) {
      acceptor.set_option(asio::ip::v6_only(false), e);
    }
    if (!e) {
      acceptor.set_option(tcp::acceptor::reuse_address(true), e);
    }
    if (!e) {
      // Accepted sockets inherit it: one system call instead of one per
      // client.
      acceptor.set_option(tcp::no_delay(true), e);
    }
    if (!e) {
      acceptor.bind(ep, e);
    }
    if (!e) {
      acceptor.listen(asio::socket_base::max_listen_connections, e);
    }
    if (!e) {
      port = acceptor.local_endpoint().port();
      return;
    }
    errors += (errors.empty() ? "" : "; ") + ep.address().to_string() + ":" +
              std::to_string(ep.port()) + ": " + e.message();
    asio::error_code ignored;
    acceptor.close(ignored);
  }
  throw NetworkError(
      "store server: cannot listen on " + options.host + ":" +
      std::to_string(options.port) + " (" + errors +
      "); pick another port, or 0 to let the kernel choose");
}

void TcpStoreServer::Impl::accept() {
  acceptor.async_accept(
      accepting_peer, [this](const asio::error_code& ec, tcp::socket socket) {
        on_accept(ec, std::move(socket));
      });
}

void TcpStoreServer::Impl::on_accept(
    const asio::error_code& ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted || !acceptor.is_open()) {
    return;
  }
  if (ec) {
    // Out of descriptors or similar: keep serving the clients we have and
    // try again shortly rather than spinning or giving up.
    TIDE_LOG_WARN(
        "[store] accept failed: {}{}; retrying in 100 ms",
        ec.message(),
        ec == asio::error::no_descriptors
            ? fmt::format(
                  " ({} clients; this process may open {} descriptors: "
                  "raise its hard limit, ulimit -Hn)",
                  connections.size(),
                  raise_fd_limit())
            : std::string());
    accept_retry.expires_after(std::chrono::milliseconds(100));
    accept_retry.async_wait([this](const asio::error_code& e) {
      if (!e) {
        accept();
      }
    });
    return;
  }
  if (connections.size() >= options.max_connections) {
    TIDE_LOG_WARN(
        "[store] refusing a connection: {} clients already (max_connections)",
        connections.size());
    asio::error_code ignored;
    socket.close(ignored);
  } else {
    std::string source = "host " + accepting_peer.address().to_string();
    if (!options.token.empty()) {
      net::PeerOwner owner = net::tcp_peer_owner(socket.native_handle());
      if (owner.kind == net::PeerOwner::Kind::kLocal) {
        source = "user " + std::to_string(owner.uid);
      }
      if (strangers.size() >= options.max_unauthenticated) {
        make_room();
      }
    }
    auto conn = std::make_shared<Connection>(
        *this,
        std::move(socket),
        accepting_peer,
        next_conn_id++,
        std::move(source));
    connections.insert(conn);
    if (!options.token.empty()) {
      strangers.insert(conn);
      sweep_strangers();
    }
    count_clients();
    conn->start();
  }
  accept();
}

void TcpStoreServer::Impl::make_room() {
  auto evicted = net::pick_eviction(
      strangers,
      [](const auto& c) { return std::string_view(c->source()); },
      [](const auto& c) { return c->accepted(); });
  if (!evicted) {
    return;
  }
  evicted->connection->close(
      spdlog::level::debug,
      fmt::format(
          "{} connections have not presented the token "
          "(max_unauthenticated); the oldest of {}, which holds {}, makes "
          "room for a new one",
          strangers.size(),
          evicted->connection->source(),
          evicted->held));
}

void TcpStoreServer::Impl::sweep_strangers() {
  if (sweeping || strangers.empty()) {
    return;
  }
  sweeping = true;
  sweep.expires_after(std::chrono::seconds(1));
  sweep.async_wait([this](const asio::error_code& ec) {
    sweeping = false;
    if (ec) {
      return;
    }
    auto now = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<Connection>> late;
    for (const auto& c : strangers) {
      if (now - c->accepted() >= options.auth_timeout) {
        late.push_back(c);
      }
    }
    for (const auto& c : late) {
      c->close(
          spdlog::level::debug,
          fmt::format(
              "no token within {} ms (auth_timeout)",
              options.auth_timeout.count()));
    }
    sweep_strangers();
  });
}

void TcpStoreServer::Impl::stop_on_loop() {
  asio::error_code ignored;
  acceptor.close(ignored);
  accept_retry.cancel();
  sweep.cancel();
  auto conns = connections;
  for (const auto& c : conns) {
    c->close(spdlog::level::debug, "server shutting down");
  }
  waiters.clear();
  // What this server held leaves the shared gauges with it.
  metrics.keys.dec(static_cast<double>(counted_keys));
  counted_keys = 0;
  count_clients();
}

bool TcpStoreServer::Impl::present(std::string_view key) const {
  if (kv.contains(key)) {
    return true;
  }
  auto q = queues.find(key);
  return q != queues.end() && !q->second.empty();
}

void TcpStoreServer::Impl::notify(std::string_view key, bool wake_one) {
  auto it = waiters.find(key);
  if (it == waiters.end()) {
    return;
  }
  auto& list = it->second.list;
  size_t i = 0;
  size_t dead_passed = 0;
  std::vector<std::shared_ptr<Waiter>> woken;
  for (; i < list.size(); ++i) {
    auto& w = list[i];
    if (w->done) {
      ++dead_passed;
      continue;
    }
    if (--w->missing == 0) {
      w->done = true;
      woken.push_back(w);
    }
    if (wake_one) {
      ++i;
      break;
    }
  }
  // Entries before i are gone: dead ones, woken ones, and ones that no
  // longer wait for this key. wake_one may stop early.
  list.erase(list.begin(), list.begin() + static_cast<ptrdiff_t>(i));
  it->second.dead -= std::min(it->second.dead, dead_passed);
  if (list.empty()) {
    waiters.erase(it);
  }
  for (auto& w : woken) {
    if (auto conn = w->conn.lock()) {
      conn->wait_keys -= w->keys.size();
      std::erase(conn->waits, w);
      conn->send_byte(wire::kStopWaiting);
    }
  }
}

void TcpStoreServer::Impl::add_waiter(
    const std::shared_ptr<Connection>& conn, std::vector<std::string> keys) {
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::erase_if(keys, [this](const std::string& k) { return present(k); });
  if (keys.empty()) {
    conn->send_byte(wire::kStopWaiting);
    return;
  }
  if (conn->wait_keys + keys.size() > options.limits.max_keys_per_call) {
    conn->close(
        spdlog::level::warn,
        "too many keys in pending waits (" +
            std::to_string(conn->wait_keys + keys.size()) + ", limit " +
            std::to_string(options.limits.max_keys_per_call) + ")");
    return;
  }
  auto w = std::make_shared<Waiter>();
  w->conn = conn;
  w->missing = keys.size();
  for (const auto& k : keys) {
    waiters[k].list.push_back(w);
  }
  w->keys = std::move(keys);
  conn->wait_keys += w->keys.size();
  conn->waits.push_back(std::move(w));
}

void TcpStoreServer::Impl::drop_waiters(Connection& conn) {
  for (auto& w : conn.waits) {
    w->done = true;
    for (const auto& k : w->keys) {
      auto it = waiters.find(k);
      if (it == waiters.end()) {
        continue;
      }
      WaiterList& l = it->second;
      if (++l.dead * 2 > l.list.size()) {
        std::erase_if(l.list, [](const auto& x) { return x->done; });
        l.dead = 0;
      }
      if (l.list.empty()) {
        waiters.erase(it);
      }
    }
  }
  conn.waits.clear();
  conn.wait_keys = 0;
}

bool TcpStoreServer::Impl::has_room(
    Connection& conn, const wire::Request& req) {
  uint64_t incoming = 0;
  for (const auto& k : req.keys) {
    incoming += k.size();
  }
  for (const auto& v : req.values) {
    incoming += v.size();
  }
  uint64_t held = kv.bytes() + queue_bytes;
  if (held + incoming <= options.limits.max_total_bytes) {
    return true;
  }
  conn.close(
      spdlog::level::err,
      "store full: " + std::to_string(held) + " bytes held, " +
          std::to_string(incoming) + " more would pass max_total_bytes " +
          std::to_string(options.limits.max_total_bytes));
  return false;
}

uint64_t TcpStoreServer::Impl::reply_bytes(const wire::Request& req) const {
  using wire::Op;
  auto stored = [this](std::string_view key) -> uint64_t {
    const std::string* v = kv.find(key);
    return v ? v->size() : 0;
  };
  switch (req.op) {
    case Op::kGet:
      return sizeof(uint64_t) + stored(req.keys[0]);
    case Op::kMultiGet: {
      uint64_t n = 0;
      for (const auto& k : req.keys) {
        n += sizeof(uint64_t) + stored(k);
      }
      return n;
    }
    case Op::kCompareSet:
      // The value after the operation, or `expected`.
      return sizeof(uint64_t) + std::max<uint64_t>(
                                    {stored(req.keys[0]),
                                     req.values[0].size(),
                                     req.values[1].size()});
    case Op::kQueuePop: {
      auto it = queues.find(req.keys[0]);
      return 2 * sizeof(uint64_t) + (it == queues.end() || it->second.empty()
                                         ? 0
                                         : it->second.front().size());
    }
    case Op::kSet:
    case Op::kAdd:
    case Op::kCheck:
    case Op::kWait:
    case Op::kNumKeys:
    case Op::kDeleteKey:
    case Op::kAppend:
    case Op::kMultiSet:
    case Op::kCancelWait:
    case Op::kPing:
    case Op::kValidate:
    case Op::kQueuePush:
    case Op::kQueueLen:
    case Op::kAuth:
      return sizeof(uint64_t);  // A number or a byte, or none.
  }
  TIDE_CHECK(false);
}

void TcpStoreServer::Impl::handle(
    const std::shared_ptr<Connection>& conn, wire::Request& req) {
  using wire::Op;
  TIDE_LOG_TRACE("[store] client {}: {}", conn->id(), wire::op_name(req.op));
  switch (req.op) {
    case Op::kSet:
      if (has_room(*conn, req)) {
        kv.set(req.keys[0], req.values[0]);
        notify(req.keys[0]);
      }
      return;
    case Op::kCompareSet: {
      if (!has_room(*conn, req)) {
        return;
      }
      bool wrote = false;
      std::string result =
          kv.compare_set(req.keys[0], req.values[0], req.values[1], wrote);
      conn->send(encode_str(result));
      if (wrote) {
        notify(req.keys[0]);
      }
      return;
    }
    case Op::kGet: {
      // torch 1.13 drops the connection here; an empty value is kinder and
      // is what torch's libuv server answers.
      const std::string* v = kv.find(req.keys[0]);
      conn->send(encode_str(v ? std::string_view(*v) : std::string_view()));
      return;
    }
    case Op::kAdd: {
      int64_t result = 0;
      try {
        result = kv.add(req.keys[0], req.delta);
      } catch (const InvalidArgument& e) {
        // The protocol has no error reply: closing is the only answer a
        // torch client understands. Nothing stored changes.
        conn->close(spdlog::level::warn, e.what());
        return;
      }
      conn->send(encode_i64(result));
      notify(req.keys[0]);
      return;
    }
    case Op::kCheck: {
      bool all = std::all_of(
          req.keys.begin(), req.keys.end(), [this](const std::string& k) {
            return present(k);
          });
      conn->send_byte(all ? wire::kCheckReady : wire::kCheckNotReady);
      return;
    }
    case Op::kWait:
      add_waiter(conn, std::move(req.keys));
      return;
    case Op::kNumKeys:
      conn->send(encode_i64(static_cast<int64_t>(kv.size())));
      return;
    case Op::kDeleteKey:
      conn->send(encode_i64(kv.erase(req.keys[0]) ? 1 : 0));
      return;
    case Op::kAppend:
      if (has_room(*conn, req)) {
        kv.append(req.keys[0], req.values[0]);
        notify(req.keys[0]);
      }
      return;
    case Op::kMultiGet: {
      std::string out;
      wire::Writer w(out);
      for (const auto& k : req.keys) {
        const std::string* v = kv.find(k);
        w.str(v ? std::string_view(*v) : std::string_view());
      }
      conn->send(std::move(out));
      return;
    }
    case Op::kMultiSet:
      if (has_room(*conn, req)) {
        for (size_t i = 0; i < req.keys.size(); ++i) {
          kv.set(req.keys[i], req.values[i]);
        }
        for (const auto& k : req.keys) {
          notify(k);
        }
      }
      return;
    case Op::kCancelWait:
      drop_waiters(*conn);
      conn->send_byte(wire::kWaitCanceled);
      return;
    case Op::kPing: {
      std::string out;
      wire::Writer(out).u32(req.number);
      conn->send(std::move(out));
      return;
    }
    case Op::kValidate:
      if (req.number != wire::kValidateMagic) {
        conn->close(spdlog::level::warn, "VALIDATE with a wrong magic number");
      }
      return;
    case Op::kQueuePush:
      if (has_room(*conn, req)) {
        queue_bytes += req.values[0].size();
        queues[req.keys[0]].push_back(std::move(req.values[0]));
        notify(req.keys[0], /*wake_one=*/true);
      }
      return;
    case Op::kQueuePop: {
      auto it = queues.find(req.keys[0]);
      int64_t len =
          it == queues.end() ? 0 : static_cast<int64_t>(it->second.size());
      std::string out;
      wire::Writer w(out);
      w.i64(len);
      if (len > 0) {
        w.str(it->second.front());
        queue_bytes -= it->second.front().size();
        it->second.pop_front();
        if (it->second.empty()) {
          queues.erase(it);
        }
      }
      conn->send(std::move(out));
      return;
    }
    case Op::kQueueLen: {
      auto it = queues.find(req.keys[0]);
      conn->send(encode_i64(
          it == queues.end() ? 0 : static_cast<int64_t>(it->second.size())));
      return;
    }
    case Op::kAuth:
      conn->send_byte(wire::kAuthOk);  // Already authenticated.
      return;
  }
}

std::unique_ptr<TcpStoreServer> TcpStoreServer::start(
    TcpStoreServerOptions options) {
  raise_fd_limit();
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->open();
  impl->accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    try {
      raw->io.run();
    } catch (const std::exception& e) {
      TIDE_LOG_ERROR(
          "[store] server loop stopped by an exception: {}", e.what());
    }
    raw->loop_ended = true;
  });
  TIDE_LOG_DEBUG("[store] listening on {}:{}", raw->options.host, raw->port);
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

TcpStoreServer::~TcpStoreServer() {
  shutdown();
  join();
}

uint16_t TcpStoreServer::port() const {
  return impl_->port;
}

size_t TcpStoreServer::erase_outside(std::string prefix) {
  auto done = std::make_shared<std::promise<size_t>>();
  auto erased = done->get_future();
  {
    // Posted before shutdown()'s stop, or not at all: the loop runs it.
    std::lock_guard lock(impl_->stop_mutex);
    if (impl_->stopping) {
      return 0;
    }
    asio::post(
        impl_->io, [impl = impl_.get(), prefix = std::move(prefix), done] {
          size_t n = impl->kv.erase_outside(prefix);
          for (auto it = impl->queues.begin(); it != impl->queues.end();) {
            if (it->first.starts_with(prefix)) {
              ++it;
              continue;
            }
            for (const auto& v : it->second) {
              impl->queue_bytes -= v.size();
            }
            it = impl->queues.erase(it);
            ++n;
          }
          impl->count_keys();
          done->set_value(n);
        });
  }
  // Unless the loop died of an exception first (then nothing runs it).
  while (erased.wait_for(std::chrono::milliseconds(100)) !=
         std::future_status::ready) {
    if (impl_->loop_ended) {
      return 0;
    }
  }
  return erased.get();
}

void TcpStoreServer::shutdown() {
  std::call_once(impl_->shutdown_once, [this] {
    std::lock_guard lock(impl_->stop_mutex);
    impl_->stopping = true;
    asio::post(impl_->io, [impl = impl_.get()] { impl->stop_on_loop(); });
  });
}

void TcpStoreServer::join() {
  if (impl_->thread.joinable() &&
      impl_->thread.get_id() != std::this_thread::get_id()) {
    impl_->thread.join();
  }
}

}  // namespace tide::store
