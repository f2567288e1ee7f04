#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "tide/store/store.h"

// The TCP store: a server and a client that speak PyTorch's c10d TCPStore
// wire protocol (docs/store-protocol.md). A torch TCPStore client works
// against a tide server and a tide client works against a torch server.
namespace tide::store {

// torch's TCPStore port (the static backend's MASTER_PORT default).
constexpr uint16_t kDefaultPort = 29500;

// Which of torch's two incompatible TCPStore protocols to speak.
enum class Dialect : uint8_t {
  // torch 1.13 (Debian 12's python3-torch) through 2.1: no handshake,
  // SET = 0 ... DELETE_KEY = 8.
  kLegacy,
  // torch since 2.2: a VALIDATE handshake with a magic number first, every
  // code shifted by one (SET = 1), plus PING, APPEND, MULTI_GET/SET,
  // CANCEL_WAIT and queues.
  kModern,
};

// Bounds on what one client may send or leave unread. torch's libuv server
// has the same first three. A request over a bound closes that client's
// connection.
struct StoreLimits {
  size_t max_key_bytes = 8 * 1024;
  size_t max_value_bytes = 8 * 1024 * 1024;
  size_t max_keys_per_call = 128 * 1024;
  // One request, all keys and values included.
  size_t max_request_bytes = 64 * 1024 * 1024;
  // All keys and values the server holds; a write past it is refused.
  uint64_t max_total_bytes = 4ull * 1024 * 1024 * 1024;
  // Replies one client has not read yet. A reply that would pass it is not
  // built: the client's further requests wait until it reads (a client
  // pipelining GETs of big values is paced, not refused), so the server
  // holds about this plus one value per client. A MULTI_GET of several
  // keys whose reply alone is larger closes the connection.
  size_t max_pending_reply_bytes = 64 * 1024 * 1024;
};

// The store a fan-in forwards to (TcpStoreServerOptions::upstream).
struct StoreUpstream {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string token;
  // Connecting at start retries with backoff until then.
  milliseconds connect_timeout{30'000};
};

struct TcpStoreServerOptions {
  // Address to listen on: "127.0.0.1" (default: this host only), "0.0.0.0"
  // (all IPv4), "::" (all IPv4 and IPv6), or a host name.
  std::string host = "127.0.0.1";
  // 0 lets the kernel pick; port() tells which.
  uint16_t port = 0;
  // When not empty, a client must present this token before anything else
  // (torch clients cannot, so it is off by default).
  std::string token;
  StoreLimits limits;
  // A request must arrive whole within this time of its first byte, or the
  // client is disconnected (a client sending one byte a second).
  milliseconds request_timeout{30'000};
  // Connections beyond this are closed at accept.
  size_t max_connections = 100'000;
  // With a token: a connection must present it within auth_timeout, and
  // at most max_unauthenticated connections may be waiting to; past that,
  // the oldest of the source (a user of this host, or another host) that
  // holds the most is closed to admit a new one, so a flood of idle
  // connections from one source never locks out another's clients.
  milliseconds auth_timeout{10'000};
  size_t max_unauthenticated = 1024;
  // When set, this server holds no keys: it is a store fan-in, which
  // forwards its clients' requests to this store (a tide store) over one
  // connection, answering identical reads and waits of its clients once
  // and batching their writes (docs/store-fan-in.md). start() connects
  // first and throws what connecting throws.
  std::optional<StoreUpstream> upstream;
};

// A running store server: one thread, an event loop, any number of clients.
// Thread safety: all members are thread safe.
class TcpStoreServer {
 public:
  // Binds, listens and starts the loop thread. Throws NetworkError when the
  // address cannot be bound (the message names it), InvalidArgument for a
  // bad host.
  static std::unique_ptr<TcpStoreServer> start(TcpStoreServerOptions options);

  // Stops and joins.
  ~TcpStoreServer();

  // The bound port (the real one when options.port was 0).
  uint16_t port() const;

  // A fan-in's (options.upstream) counts so far: its clients' requests,
  // and the frames it sent upstream for them. Zero for a server that holds
  // keys.
  struct FanInCounts {
    uint64_t requests = 0;
    uint64_t frames = 0;
  };
  FanInCounts fan_in_counts() const;

  // Erases every key and queue whose name (as clients send it, torch's
  // leading "/" included) does not start with `prefix`, and returns how
  // many: what an agent does between two attempts of its workers, so that
  // the new attempt sees nothing of the previous one's. Waits for the
  // server's loop; 0 once the server has stopped.
  size_t erase_outside(std::string prefix);

  // Closes the listener and every connection; asynchronous and idempotent.
  void shutdown();
  // Waits for the loop thread to end (after shutdown()).
  void join();

  struct Impl;
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

struct TcpStoreOptions {
  // Server to connect to.
  std::string host = "127.0.0.1";
  uint16_t port = kDefaultPort;
  // Start a server on host:port in this process first (torch's is_master).
  // With port 0 the kernel picks the port; port() tells which.
  bool is_server = false;
  Dialect dialect = Dialect::kLegacy;
  // Sent before anything else when not empty; must match the server's.
  std::string token;
  // Default timeout of blocking calls, and of connecting (the server may
  // start after the client; connect retries with backoff until then).
  milliseconds timeout = Store::kDefaultTimeout;
  // Where the embedded server listens when is_server; empty: `host`.
  // ("::" or "0.0.0.0" to serve other hosts while connecting locally.)
  std::string listen_host;
  // Limits and timeouts of the embedded server (its host, port and token
  // come from the fields above).
  TcpStoreServerOptions server;
};

// A Store client over TCP, with an optional embedded server. Like torch's
// TCPStore client it puts "/" in front of every key, so tide and torch
// clients of one server see the same keys.
//
// Dialect kLegacy has no APPEND on torch 1.13 servers, so append() is
// emulated there with compare_set: two clients appending the very same bytes
// to one key at the same moment can be merged into one append. A tide server
// serves APPEND in both dialects; use kModern against it for exact appends.
//
// Thread safety: calls are serialised on one connection (one outstanding
// request, as in torch). After a TimeoutError or NetworkError the connection
// is dropped and the next call opens a new one.
class TcpStore final : public Store {
 public:
  // Connects (and starts the server when is_server). Throws TimeoutError when
  // the server cannot be reached within timeout, NetworkError when the
  // server refuses the token.
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  int64_t add(std::string_view key, int64_t delta) override;
  // One ADD_WAIT: a tide server's command (a torch server closes the
  // connection at it: NetworkError, saying so).
  Tally add_wait(
      std::string_view counter,
      int64_t delta,
      int64_t target,
      std::string_view key) override;
  std::string compare_set(
      std::string_view key,
      std::string_view expected,
      std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(
      const std::vector<std::string>& keys, milliseconds timeout) override;
  bool delete_key(std::string_view key) override;
  int64_t num_keys() override;
  void append(std::string_view key, std::string_view value) override;
  std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) override;

  // Round trip to the server; kModern only (throws InvalidArgument else).
  void ping();
  // Queues (kModern only): push wakes one waiter; pop returns nullopt when
  // the queue is empty.
  void queue_push(std::string_view key, std::string_view value);
  std::optional<std::string> queue_pop(std::string_view key);
  int64_t queue_len(std::string_view key);

  // The server's port (the real one when is_server with port 0).
  uint16_t port() const;
  Dialect dialect() const {
    return options_.dialect;
  }
  // The embedded server, or null.
  TcpStoreServer* server() const {
    return server_.get();
  }

  struct Connection;

 protected:
  void set_many(
      const std::vector<std::string>& keys,
      const std::vector<std::string>& values) override;

 private:
  // Runs fn on a live connection, connecting first if needed; drops the
  // connection when fn throws.
  template <typename F>
  auto with_connection(F&& fn);

  std::string wire_key(std::string_view key) const;
  std::vector<std::string> wire_keys(
      const std::vector<std::string>& keys) const;
  std::vector<std::string> missing_keys(const std::vector<std::string>& keys);
  // After a wait timed out (modern dialect): cancels it, keeping the
  // connection. True when it was met just before the cancel arrived.
  bool cancel_wait(Connection& c);
  static constexpr int64_t kCancelTimeoutMs = 5'000;

  TcpStoreOptions options_;
  std::unique_ptr<TcpStoreServer> server_;
  std::mutex mutex_;
  std::unique_ptr<Connection> conn_;  // Guarded by mutex_.
};

}  // namespace tide::store
