// The TCP store client: blocking calls over one socket, each bounded by a
// deadline (poll), in either of torch's dialects.
#include "tide/store/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "net/address.h"
#include "net/socket.h"
#include "store/keys.h"
#include "store/kv_map.h"
#include "store/wire.h"

namespace tide::store {

namespace {

using wire::Op;

std::string errno_text(int err) {
  return std::strerror(err);
}

}  // namespace

struct TcpStore::Connection {
  Connection(Fd fd, std::string where, Dialect dialect)
      : fd(std::move(fd)), where(std::move(where)), dialect(dialect) {}
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts a request: its command byte in this dialect.
  std::string request(Op op) const {
    std::optional<uint8_t> code = wire::op_code(op, dialect);
    if (!code) {
      throw InvalidArgument(
          std::string(wire::op_name(op)) +
          " needs the modern dialect (TcpStoreOptions::dialect = kModern); "
          "torch 1.13 servers do not have it");
    }
    std::string out;
    wire::Writer(out).u8(*code);
    return out;
  }

  void send(
      std::string_view bytes, Clock::time_point deadline, const char* what) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n > 0) {
        bytes.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        await(POLLOUT, deadline, what);
        continue;
      }
      throw NetworkError(
          std::string(what) + ": sending to the store at " + where +
          " failed: " + errno_text(errno));
    }
  }

  // Replies are read through a buffer: one recv usually brings a whole
  // reply (length and bytes), and the socket is polled only when the
  // buffer is empty, since a reply is seldom there the moment a request
  // has gone out.
  void recv(
      char* buf, size_t len, Clock::time_point deadline, const char* what) {
    while (len > 0) {
      if (rpos < rlen) {
        size_t n = std::min(len, rlen - rpos);
        std::memcpy(buf, rbuf.get() + rpos, n);
        rpos += n;
        buf += n;
        len -= n;
        continue;
      }
      await(POLLIN, deadline, what);
      // Large values go straight to the caller's buffer.
      char* dst = buf;
      size_t room = len;
      if (len < kReadChunk) {
        if (!rbuf) {
          rbuf = std::make_unique<char[]>(kReadChunk);
        }
        rpos = rlen = 0;
        dst = rbuf.get();
        room = kReadChunk;
      }
      ssize_t n = ::recv(fd.get(), dst, room, 0);
      if (n > 0) {
        if (dst == buf) {
          buf += n;
          len -= static_cast<size_t>(n);
        } else {
          rlen = static_cast<size_t>(n);
        }
        continue;
      }
      if (n == 0) {
        throw NetworkError(
            std::string(what) + ": the store at " + where +
            " closed the connection (server gone, or it rejected the "
            "request; its log says which)");
      }
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
        continue;
      }
      throw NetworkError(
          std::string(what) + ": receiving from the store at " + where +
          " failed: " + errno_text(errno));
    }
  }

  template <typename T>
  T read(Clock::time_point deadline, const char* what) {
    char buf[sizeof(T)];
    recv(buf, sizeof buf, deadline, what);
    return wire::load<T>(buf);
  }

  std::string read_string(Clock::time_point deadline, const char* what) {
    auto len = read<uint64_t>(deadline, what);
    // A reply is trusted no more than a request.
    if (len > (uint64_t{1} << 40)) {
      throw ProtocolError(
          std::string(what) + ": the store at " + where +
          " announced a value of " + std::to_string(len) + " bytes");
    }
    std::string s(len, '\0');
    recv(s.data(), len, deadline, what);
    return s;
  }

  void await(short events, Clock::time_point deadline, const char* what) {
    for (;;) {
      pollfd p{.fd = fd.get(), .events = events, .revents = 0};
      int ms = remaining_ms(deadline);
      int r = ::poll(&p, 1, ms);
      if (r > 0) {
        return;
      }
      if (r < 0 && errno == EINTR) {
        continue;
      }
      if (r == 0) {
        throw TimeoutError(
            std::string(what) + ": no reply from the store at " + where +
            " in time");
      }
      throw NetworkError(
          std::string(what) + ": poll failed: " + errno_text(errno));
    }
  }

  const Fd fd;
  const std::string where;
  const Dialect dialect;
  static constexpr size_t kReadChunk = 16 * 1024;
  std::unique_ptr<char[]> rbuf;  // read ahead of the caller: [rpos, rlen)
  size_t rpos = 0;
  size_t rlen = 0;
};

namespace {}  // namespace

template <typename F>
auto TcpStore::with_connection(F&& fn) {
  if (!conn_) {
    std::string host = options_.host;
    if (server_ && (host == "0.0.0.0" || host == "::" || host.empty())) {
      host = "127.0.0.1";
    }
    uint16_t port = this->port();
    std::string where = net::format_host_port(host, port);
    auto deadline = Clock::now() + timeout();
    std::string error;
    auto backoff = milliseconds(10);
    std::minstd_rand jitter(static_cast<unsigned>(::getpid()));
    Fd fd;
    for (;;) {
      fd = net::connect_tcp(host, port, deadline, error);
      if (fd || Clock::now() >= deadline) {
        break;
      }
      // The server may not be up yet (torch's clients wait for it too).
      auto pause = std::min<milliseconds>(
          backoff + milliseconds(jitter() % 10),
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
      std::this_thread::sleep_for(pause);
      backoff = std::min(backoff * 2, milliseconds(1000));
    }
    if (!fd) {
      throw TimeoutError(
          "cannot connect to the store at " + where + " within " +
          std::to_string(timeout().count()) + " ms: " + error);
    }
    auto conn =
        std::make_unique<Connection>(std::move(fd), where, options_.dialect);
    if (!options_.token.empty()) {
      std::string req;
      wire::Writer(req).u8(wire::kAuthCode).str(options_.token);
      conn->send(req, deadline, "authenticate");
      try {
        conn->read<uint8_t>(deadline, "authenticate");
      } catch (const NetworkError&) {
        throw NetworkError(
            "the store at " + where + " refused this client's token");
      }
    }
    if (options_.dialect == Dialect::kModern) {
      std::string req = conn->request(Op::kValidate);
      wire::Writer(req).u32(wire::kValidateMagic);
      uint32_t nonce = static_cast<uint32_t>(::getpid());
      std::string ping = conn->request(Op::kPing);
      wire::Writer(ping).u32(nonce);
      conn->send(req + ping, deadline, "validate");
      if (conn->read<uint32_t>(deadline, "validate") != nonce) {
        throw ProtocolError(
            "the store at " + where + " answered PING with a wrong nonce");
      }
    }
    conn_ = std::move(conn);
  }
  try {
    return fn(*conn_);
  } catch (...) {
    // The connection may be mid-reply: never reuse it.
    conn_.reset();
    throw;
  }
}

TcpStore::TcpStore(TcpStoreOptions options)
    : Store(options.timeout), options_(std::move(options)) {
  if (options_.is_server) {
    TcpStoreServerOptions so = options_.server;
    so.host =
        options_.listen_host.empty() ? options_.host : options_.listen_host;
    so.port = options_.port;
    so.token = options_.token;
    server_ = TcpStoreServer::start(std::move(so));
  }
  std::lock_guard lock(mutex_);
  with_connection([](Connection&) {});
}

TcpStore::~TcpStore() = default;

uint16_t TcpStore::port() const {
  return server_ ? server_->port() : options_.port;
}

std::string TcpStore::wire_key(std::string_view key) const {
  return detail::with_prefix("/", key);
}

std::vector<std::string> TcpStore::wire_keys(
    const std::vector<std::string>& keys) const {
  return detail::with_prefix("/", keys);
}

void TcpStore::set(std::string_view key, std::string_view value) {
  std::lock_guard lock(mutex_);
  with_connection([&](Connection& c) {
    std::string req = c.request(Op::kSet);
    wire::Writer(req).str(wire_key(key)).str(value);
    c.send(req, Clock::now() + timeout(), "set");
  });
}

std::string TcpStore::get(std::string_view key) {
  // As torch's client does: WAIT for the key, then GET it.
  wait({std::string(key)}, timeout());
  std::lock_guard lock(mutex_);
  return with_connection([&](Connection& c) {
    std::string req = c.request(Op::kGet);
    wire::Writer(req).str(wire_key(key));
    auto deadline = Clock::now() + timeout();
    c.send(req, deadline, "get");
    return c.read_string(deadline, "get");
  });
}

int64_t TcpStore::add(std::string_view key, int64_t delta) {
  std::lock_guard lock(mutex_);
  return with_connection([&](Connection& c) {
    std::string req = c.request(Op::kAdd);
    wire::Writer(req).str(wire_key(key)).i64(delta);
    auto deadline = Clock::now() + timeout();
    c.send(req, deadline, "add");
    return c.read<int64_t>(deadline, "add");
  });
}

Store::Tally TcpStore::add_wait(
    std::string_view counter,
    int64_t delta,
    int64_t target,
    std::string_view key) {
  std::lock_guard lock(mutex_);
  return with_connection([&](Connection& c) {
    std::string req = c.request(Op::kAddWait);
    wire::Writer(req)
        .str(wire_key(counter))
        .i64(delta)
        .i64(target)
        .str(wire_key(key));
    auto deadline = Clock::now() + timeout();
    try {
      c.send(req, deadline, "add_wait");
      Tally t;
      t.count = c.read<int64_t>(deadline, "add_wait");
      t.value = c.read_string(deadline, "add_wait");
      return t;
    } catch (const NetworkError& e) {
      throw NetworkError(
          std::string(e.what()) +
          " (add_wait is a tide store's command: a torch store closes the "
          "connection at it)");
    }
  });
}

std::string TcpStore::compare_set(
    std::string_view key, std::string_view expected, std::string_view desired) {
  std::lock_guard lock(mutex_);
  return with_connection([&](Connection& c) {
    std::string req = c.request(Op::kCompareSet);
    wire::Writer(req).str(wire_key(key)).str(expected).str(desired);
    auto deadline = Clock::now() + timeout();
    c.send(req, deadline, "compare_set");
    return c.read_string(deadline, "compare_set");
  });
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  return with_connection([&](Connection& c) {
    std::string req = c.request(Op::kCheck);
    wire::Writer w(req);
    w.u64(keys.size());
    for (const auto& k : keys) {
      w.str(wire_key(k));
    }
    auto deadline = Clock::now() + timeout();
    c.send(req, deadline, "check");
    return c.read<uint8_t>(deadline, "check") == wire::kCheckReady;
  });
}

std::vector<std::string> TcpStore::missing_keys(
    const std::vector<std::string>& keys) {
  // Best effort, for the timeout message only.
  std::vector<std::string> missing;
  try {
    for (size_t i = 0; i < keys.size() && i < 100; ++i) {
      if (!check({keys[i]})) {
        missing.push_back(keys[i]);
      }
    }
  } catch (const Error&) {
  }
  return missing;
}

void TcpStore::wait(
    const std::vector<std::string>& keys, milliseconds timeout) {
  bool met = false;
  try {
    std::lock_guard lock(mutex_);
    met = with_connection([&](Connection& c) {
      std::string req = c.request(Op::kWait);
      wire::Writer w(req);
      w.u64(keys.size());
      for (const auto& k : keys) {
        w.str(wire_key(k));
      }
      auto deadline = Clock::now() + timeout;
      c.send(req, deadline, "wait");
      uint8_t reply = 0;
      try {
        reply = c.read<uint8_t>(deadline, "wait");
      } catch (const TimeoutError&) {
        if (c.dialect != Dialect::kModern) {
          throw;  // torch 1.13 cannot cancel: the connection is dropped
        }
        return cancel_wait(c);
      }
      if (reply != wire::kStopWaiting) {
        throw ProtocolError(
            "wait: the store at " + c.where + " answered " +
            std::to_string(reply) + " instead of STOP_WAITING");
      }
      return true;
    });
  } catch (const TimeoutError&) {
  }
  if (!met) {
    // One key was missing for sure; for several, ask which (best effort).
    detail::throw_wait_timeout(
        "wait", timeout, keys.size() == 1 ? keys : missing_keys(keys));
  }
}

bool TcpStore::cancel_wait(Connection& c) {
  // CANCEL_WAIT keeps the connection: a client that waits with a timeout
  // again and again (the rendezvous' keep-alive, every interval) would
  // otherwise reconnect each time. The server answers WAIT_CANCELED, after
  // STOP_WAITING if the wait was met just before the cancel arrived.
  auto deadline =
      Clock::now() + std::min(timeout(), milliseconds(kCancelTimeoutMs));
  c.send(c.request(Op::kCancelWait), deadline, "cancel_wait");
  auto reply = c.read<uint8_t>(deadline, "cancel_wait");
  bool met = reply == wire::kStopWaiting;
  if (met) {
    reply = c.read<uint8_t>(deadline, "cancel_wait");
  }
  if (reply != wire::kWaitCanceled) {
    throw ProtocolError(
        "cancel_wait: the store at " + c.where + " answered " +
        std::to_string(reply) + " instead of WAIT_CANCELED");
  }
  return met;
}

bool TcpStore::delete_key(std::string_view key) {
  std::lock_guard lock(mutex_);
  return with_connection([&](Connection& c) {
    std::string req = c.request(Op::kDeleteKey);
    wire::Writer(req).str(wire_key(key));
    auto deadline = Clock::now() + timeout();
    c.send(req, deadline, "delete_key");
    return c.read<int64_t>(deadline, "delete_key") != 0;
  });
}

int64_t TcpStore::num_keys() {
  std::lock_guard lock(mutex_);
  return with_connection([&](Connection& c) {
    std::string req = c.request(Op::kNumKeys);
    auto deadline = Clock::now() + timeout();
    c.send(req, deadline, "num_keys");
    return c.read<int64_t>(deadline, "num_keys");
  });
}

void TcpStore::append(std::string_view key, std::string_view value) {
  if (options_.dialect == Dialect::kLegacy) {
    // torch 1.13 servers have no APPEND: emulate it with compare_set, which
    // retries only when another client changed the key in between.
    std::string current = check({std::string(key)}) ? get(key) : "";
    for (;;) {
      std::string desired = current + std::string(value);
      std::string now = compare_set(key, current, desired);
      if (now == desired) {
        return;
      }
      // Our expected value back means the key was deleted meanwhile (torch's
      // rule for an absent key): start from empty, or this would loop.
      current = now == current ? std::string() : std::move(now);
    }
  }
  std::lock_guard lock(mutex_);
  with_connection([&](Connection& c) {
    std::string req = c.request(Op::kAppend);
    wire::Writer(req).str(wire_key(key)).str(value);
    c.send(req, Clock::now() + timeout(), "append");
  });
}

std::vector<std::string> TcpStore::multi_get(
    const std::vector<std::string>& keys) {
  wait(keys, timeout());
  std::lock_guard lock(mutex_);
  return with_connection([&](Connection& c) {
    std::string req;
    if (c.dialect == Dialect::kModern) {
      req = c.request(Op::kMultiGet);
      wire::Writer w(req);
      w.u64(keys.size());
      for (const auto& k : keys) {
        w.str(wire_key(k));
      }
    } else {
      // Pipelined GETs: the server answers in order.
      for (const auto& k : keys) {
        req += c.request(Op::kGet);
        wire::Writer(req).str(wire_key(k));
      }
    }
    auto deadline = Clock::now() + timeout();
    c.send(req, deadline, "multi_get");
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      values.push_back(c.read_string(deadline, "multi_get"));
    }
    return values;
  });
}

void TcpStore::set_many(
    const std::vector<std::string>& keys,
    const std::vector<std::string>& values) {
  std::lock_guard lock(mutex_);
  with_connection([&](Connection& c) {
    std::string req;
    if (c.dialect == Dialect::kModern) {
      req = c.request(Op::kMultiSet);
      wire::Writer w(req);
      w.u64(keys.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        w.str(wire_key(keys[i])).str(values[i]);
      }
    } else {
      for (size_t i = 0; i < keys.size(); ++i) {
        req += c.request(Op::kSet);
        wire::Writer(req).str(wire_key(keys[i])).str(values[i]);
      }
    }
    c.send(req, Clock::now() + timeout(), "multi_set");
  });
}

void TcpStore::ping() {
  std::lock_guard lock(mutex_);
  with_connection([&](Connection& c) {
    std::string req = c.request(Op::kPing);
    uint32_t nonce = static_cast<uint32_t>(::getpid());
    wire::Writer(req).u32(nonce);
    auto deadline = Clock::now() + timeout();
    c.send(req, deadline, "ping");
    if (c.read<uint32_t>(deadline, "ping") != nonce) {
      throw ProtocolError(
          "ping: the store at " + c.where + " answered a wrong nonce");
    }
  });
}

void TcpStore::queue_push(std::string_view key, std::string_view value) {
  std::lock_guard lock(mutex_);
  with_connection([&](Connection& c) {
    std::string req = c.request(Op::kQueuePush);
    wire::Writer(req).str(wire_key(key)).str(value);
    c.send(req, Clock::now() + timeout(), "queue_push");
  });
}

std::optional<std::string> TcpStore::queue_pop(std::string_view key) {
  std::lock_guard lock(mutex_);
  return with_connection([&](Connection& c) -> std::optional<std::string> {
    std::string req = c.request(Op::kQueuePop);
    wire::Writer(req).str(wire_key(key));
    auto deadline = Clock::now() + timeout();
    c.send(req, deadline, "queue_pop");
    if (c.read<int64_t>(deadline, "queue_pop") <= 0) {
      return std::nullopt;
    }
    return c.read_string(deadline, "queue_pop");
  });
}

int64_t TcpStore::queue_len(std::string_view key) {
  std::lock_guard lock(mutex_);
  return with_connection([&](Connection& c) {
    std::string req = c.request(Op::kQueueLen);
    wire::Writer(req).str(wire_key(key));
    auto deadline = Clock::now() + timeout();
    c.send(req, deadline, "queue_len");
    return c.read<int64_t>(deadline, "queue_len");
  });
}

}  // namespace tide::store
