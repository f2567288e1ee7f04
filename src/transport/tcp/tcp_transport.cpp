#include "transport/tcp/tcp_transport.h"

#include <cxxabi.h>

#include <array>
#include <atomic>
#include <deque>
#include <thread>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include <asio.hpp>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/rpc/serialize.h"

#include "rpc/frame.h"

namespace tide::rpc::detail {

namespace {

using asio::ip::tcp;

std::string demangle(const char* name) {
  int status = 0;
  char* s = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || s == nullptr) {
    return name;
  }
  std::string out = s;
  std::free(s);  // NOLINT(cppcoreguidelines-no-malloc): demangle's contract
  return out;
}

// The type and message of an exception, for an ERROR frame.
std::pair<std::string, std::string> describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return {demangle(typeid(ex).name()), ex.what()};
  } catch (...) {
    return {"unknown", "a non-standard exception"};
  }
}

template <typename... A>
std::string encode_meta(const A&... args) {
  std::string out;
  Encoder e(out);
  encode_args(e, args...);
  return out;
}

// A frame whose buffers are the payload's stream then its buffers.
Frame payload_frame(
    MessageType type, uint64_t id, std::string meta, Payload p) {
  Frame f;
  f.type = type;
  f.id = id;
  f.metadata = std::move(meta);
  f.buffers.reserve(1 + p.buffers.size());
  f.buffers.push_back(std::move(p.data));
  for (auto& b : p.buffers) {
    f.buffers.push_back(std::move(b));
  }
  return f;
}

Payload frame_payload(Frame& f) {
  if (f.buffers.empty()) {
    throw ProtocolError(
        std::string(message_type_name(f.type)) +
        " frame without its payload buffer");
  }
  Payload p;
  p.data = std::move(f.buffers[0]);
  p.buffers.reserve(f.buffers.size() - 1);
  for (size_t i = 1; i < f.buffers.size(); ++i) {
    p.buffers.push_back(std::move(f.buffers[i]));
  }
  return p;
}

}  // namespace

struct Connection;

struct TcpTransport::Impl : std::enable_shared_from_this<TcpTransport::Impl> {
  Impl(int id, std::string name, RequestHandler handler)
      : self_id(id),
        self_name(std::move(name)),
        on_request(std::move(handler)),
        work(asio::make_work_guard(io)),
        acceptor(io) {}

  // A call waiting for its reply. Loop only.
  struct Pending {
    Promise<Payload> promise;
    int peer = 0;
    std::string fn;
    std::unique_ptr<asio::steady_timer> timer;
  };

  void start_accept();
  void start_call_on_loop(
      uint64_t id, int to, std::chrono::milliseconds timeout, Payload args);
  std::shared_ptr<Connection> connect_on_loop(int to);
  // Removes call `id` and completes it; no-op when it completed already.
  void finish_call(
      uint64_t id, std::optional<Payload> value, std::exception_ptr error);
  void connection_failed(Connection& conn, const std::string& reason);
  void stop_on_loop();
  std::string peer_label(int id) const;

  const int self_id;
  const std::string self_name;
  RequestHandler on_request;

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  tcp::acceptor acceptor;
  uint16_t port = 0;
  std::jthread thread;
  std::atomic<bool> stopping{false};
  std::atomic<size_t> pending_count{0};
  std::atomic<uint64_t> next_id{1};

  // Loop only.
  std::unordered_map<int, PeerAddress> peers;
  std::unordered_map<int, std::shared_ptr<Connection>> outgoing;
  std::unordered_set<std::shared_ptr<Connection>> incoming;
  std::unordered_map<uint64_t, Pending> pending;
  bool stopped = false;
};

// One TCP connection, either way. Loop only.
struct Connection : std::enable_shared_from_this<Connection> {
  Connection(TcpTransport::Impl& owner, tcp::socket socket, bool outgoing)
      : owner(owner), socket(std::move(socket)), outgoing(outgoing) {}

  void start_read() {
    socket.async_read_some(
        asio::buffer(read_buf),
        [self = shared_from_this()](const asio::error_code& ec, size_t n) {
          self->on_read(ec, n);
        });
  }

  void on_read(const asio::error_code& ec, size_t n) {
    if (closed) {
      return;
    }
    if (ec) {
      fail(
          ec == asio::error::eof ? "connection closed by the peer"
                                 : ec.message());
      return;
    }
    try {
      decoder.feed(read_buf.data(), n);
      while (auto frame = decoder.next()) {
        on_frame(std::move(*frame));
        if (closed) {
          return;
        }
      }
    } catch (const ProtocolError& e) {
      TIDE_LOG_WARN(
          "[{}] dropping connection with {}: {}",
          owner.self_name,
          owner.peer_label(peer_id),
          e.what());
      fail(std::string("protocol error: ") + e.what());
      return;
    } catch (const std::exception& e) {
      TIDE_LOG_WARN(
          "[{}] dropping connection with {}: {}",
          owner.self_name,
          owner.peer_label(peer_id),
          e.what());
      fail(e.what());
      return;
    }
    start_read();
  }

  void on_frame(Frame frame) {
    if (!handshaken) {
      expect_handshake(frame);
      return;
    }
    if (outgoing) {
      on_reply(frame);
    } else {
      on_request(frame);
    }
  }

  void expect_handshake(Frame& frame) {
    auto want = outgoing ? MessageType::kHandshakeAck : MessageType::kHandshake;
    if (frame.type != want) {
      throw ProtocolError(
          std::string("expected ") + message_type_name(want) + ", got " +
          message_type_name(frame.type));
    }
    Decoder d(frame.metadata);
    auto [id, name] = decode_args<std::tuple<int, std::string>>(d, "handshake");
    handshaken = true;
    if (outgoing) {
      if (id != peer_id) {
        throw ProtocolError(
            "connected to worker " + std::to_string(peer_id) +
            " but the peer says it is worker " + std::to_string(id) + " (" +
            name + ")");
      }
      return;
    }
    peer_id = id;
    Frame ack;
    ack.type = MessageType::kHandshakeAck;
    ack.metadata = encode_meta(owner.self_id, owner.self_name);
    send(ack);
  }

  void on_reply(Frame& frame) {
    switch (frame.type) {
      case MessageType::kResponse:
        owner.finish_call(frame.id, frame_payload(frame), nullptr);
        return;
      case MessageType::kError: {
        Decoder d(frame.metadata);
        auto [type, message] =
            decode_args<std::tuple<std::string, std::string>>(d, "error");
        auto it = owner.pending.find(frame.id);
        std::string fn = it == owner.pending.end() ? "?" : it->second.fn;
        owner.finish_call(
            frame.id,
            std::nullopt,
            std::make_exception_ptr(RemoteError(
                fn + "() on " + owner.peer_label(peer_id) + " raised " + type +
                ": " + message)));
        return;
      }
      default:
        throw ProtocolError(
            std::string("unexpected ") + message_type_name(frame.type) +
            " from a callee");
    }
  }

  void on_request(Frame& frame) {
    if (frame.type == MessageType::kCancel) {
      return;  // Best effort: a running function is not interrupted.
    }
    if (frame.type != MessageType::kRequest) {
      throw ProtocolError(
          std::string("unexpected ") + message_type_name(frame.type) +
          " from a caller");
    }
    Decoder d(frame.metadata);
    auto [fn, timeout_ms] =
        decode_args<std::tuple<std::string, int64_t>>(d, "request");
    (void)timeout_ms;
    uint64_t id = frame.id;
    Future<Payload> result = [&] {
      try {
        return owner.on_request(peer_id, fn, frame_payload(frame));
      } catch (...) {
        return Future<Payload>::make_failed(std::current_exception());
      }
    }();
    std::weak_ptr<Connection> weak = weak_from_this();
    // An async function may complete after the transport is gone.
    std::weak_ptr<TcpTransport::Impl> transport = owner.weak_from_this();
    result.on_complete([weak, transport, id](const Future<Payload>& f) {
      auto alive = transport.lock();
      if (!alive) {
        return;
      }
      // Completes on a worker thread (or inline here): reply on the loop.
      asio::post(alive->io, [weak, id, f] {
        auto self = weak.lock();
        if (!self || self->closed) {
          return;  // The caller is gone; so is its interest in the reply.
        }
        if (auto error = f.error()) {
          auto [type, message] = describe(error);
          Frame reply;
          reply.type = MessageType::kError;
          reply.id = id;
          reply.metadata = encode_meta(type, message);
          self->send(reply);
        } else {
          self->send(payload_frame(
              MessageType::kResponse,
              id,
              {},
              f.wait(std::chrono::milliseconds(0))));
        }
      });
    });
  }

  // Queues a frame; throws InvalidArgument when it is over the limits.
  void send(const Frame& frame) {
    write_queue.push_back(encode(frame));
    if (!writing) {
      write_next();
    }
  }

  void write_next() {
    if (write_queue.empty() || closed) {
      writing = false;
      return;
    }
    writing = true;
    asio::async_write(
        socket,
        asio::buffer(write_queue.front()),
        [self = shared_from_this()](const asio::error_code& ec, size_t) {
          if (self->closed) {
            return;
          }
          if (ec) {
            self->fail("write failed: " + ec.message());
            return;
          }
          self->write_queue.pop_front();
          self->write_next();
        });
  }

  void fail(const std::string& reason) {
    if (closed) {
      return;
    }
    closed = true;
    asio::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    owner.connection_failed(*this, reason);
  }

  TcpTransport::Impl& owner;
  tcp::socket socket;
  const bool outgoing;
  int peer_id = -1;
  bool handshaken = false;
  bool closed = false;
  bool writing = false;
  FrameDecoder decoder;
  std::array<char, 64 * 1024> read_buf{};
  std::deque<std::string> write_queue;
  // Outgoing only: ids of the calls waiting on this connection.
  std::unordered_set<uint64_t> calls;
};

std::string TcpTransport::Impl::peer_label(int id) const {
  if (id < 0) {
    return "a peer before its handshake";
  }
  auto it = peers.find(id);
  if (it == peers.end()) {
    return "worker " + std::to_string(id);
  }
  return "worker '" + it->second.name + "' (id " + std::to_string(id) + ", " +
         it->second.host + ":" + std::to_string(it->second.port) + ")";
}

void TcpTransport::Impl::start_accept() {
  acceptor.async_accept([this](const asio::error_code& ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) {
      return;
    }
    if (!ec) {
      asio::error_code ignored;
      s.set_option(tcp::no_delay(true), ignored);
      auto conn = std::make_shared<Connection>(*this, std::move(s), false);
      incoming.insert(conn);
      conn->start_read();
    } else {
      TIDE_LOG_WARN("[{}] accept failed: {}", self_name, ec.message());
    }
    start_accept();
  });
}

std::shared_ptr<Connection> TcpTransport::Impl::connect_on_loop(int to) {
  if (auto it = outgoing.find(to); it != outgoing.end()) {
    return it->second;
  }
  auto peer = peers.find(to);
  if (peer == peers.end()) {
    throw InvalidArgument("no worker with id " + std::to_string(to));
  }
  auto conn = std::make_shared<Connection>(*this, tcp::socket(io), true);
  conn->peer_id = to;
  outgoing[to] = conn;
  asio::error_code ec;
  auto address = asio::ip::make_address(peer->second.host, ec);
  std::vector<tcp::endpoint> endpoints;
  if (!ec) {
    endpoints.emplace_back(address, peer->second.port);
  } else {
    tcp::resolver resolver(io);
    for (const auto& r : resolver.resolve(
             peer->second.host, std::to_string(peer->second.port), ec)) {
      endpoints.push_back(r.endpoint());
    }
  }
  Frame hello;
  hello.type = MessageType::kHandshake;
  hello.metadata = encode_meta(self_id, self_name);
  // Queued now, written once connected; requests queue behind it.
  conn->write_queue.push_back(encode(hello));
  conn->writing = true;
  asio::async_connect(
      conn->socket,
      endpoints,
      [conn](const asio::error_code& e, const tcp::endpoint&) {
        if (conn->closed) {
          return;
        }
        if (e) {
          conn->fail("connect failed: " + e.message());
          return;
        }
        asio::error_code ignored;
        conn->socket.set_option(tcp::no_delay(true), ignored);
        conn->write_next();
        conn->start_read();
      });
  return conn;
}

void TcpTransport::Impl::start_call_on_loop(
    uint64_t id, int to, std::chrono::milliseconds timeout, Payload args) {
  auto it = pending.find(id);
  if (it == pending.end()) {
    return;
  }
  try {
    if (stopped) {
      throw NetworkError("rpc agent '" + self_name + "' is shut down");
    }
    auto conn = connect_on_loop(to);
    conn->calls.insert(id);
    it->second.timer = std::make_unique<asio::steady_timer>(io, timeout);
    it->second.timer->async_wait(
        [this, id, timeout](const asio::error_code& ec) {
          if (ec) {
            return;
          }
          auto p = pending.find(id);
          if (p == pending.end()) {
            return;
          }
          std::string what = p->second.fn + "() on " +
                             peer_label(p->second.peer) + " timed out after " +
                             std::to_string(timeout.count()) + " ms";
          finish_call(
              id, std::nullopt, std::make_exception_ptr(TimeoutError(what)));
        });
    conn->send(payload_frame(
        MessageType::kRequest,
        id,
        encode_meta(it->second.fn, static_cast<int64_t>(timeout.count())),
        std::move(args)));
  } catch (...) {
    finish_call(id, std::nullopt, std::current_exception());
  }
}

void TcpTransport::Impl::finish_call(
    uint64_t id, std::optional<Payload> value, std::exception_ptr error) {
  auto it = pending.find(id);
  if (it == pending.end()) {
    return;  // Timed out or failed already: a late reply is dropped.
  }
  Pending p = std::move(it->second);
  pending.erase(it);
  if (p.timer) {
    p.timer->cancel();
  }
  if (auto c = outgoing.find(p.peer); c != outgoing.end()) {
    c->second->calls.erase(id);
  }
  pending_count.fetch_sub(1);
  if (error) {
    p.promise.set_exception(std::move(error));
  } else {
    p.promise.set_value(std::move(*value));
  }
}

void TcpTransport::Impl::connection_failed(
    Connection& conn, const std::string& reason) {
  auto self = conn.shared_from_this();  // Keep it alive through the erase.
  if (!conn.outgoing) {
    incoming.erase(self);
    TIDE_LOG_DEBUG(
        "[{}] connection from {} closed: {}",
        self_name,
        peer_label(conn.peer_id),
        reason);
    return;
  }
  if (auto it = outgoing.find(conn.peer_id);
      it != outgoing.end() && it->second == self) {
    outgoing.erase(it);
  }
  std::vector<uint64_t> ids(conn.calls.begin(), conn.calls.end());
  conn.calls.clear();
  for (uint64_t id : ids) {
    auto p = pending.find(id);
    if (p == pending.end()) {
      continue;
    }
    std::string what = p->second.fn + "() on " + peer_label(conn.peer_id) +
                       " failed: " + reason;
    finish_call(id, std::nullopt, std::make_exception_ptr(NetworkError(what)));
  }
}

void TcpTransport::Impl::stop_on_loop() {
  if (stopped) {
    return;
  }
  stopped = true;
  asio::error_code ignored;
  acceptor.close(ignored);
  auto out = outgoing;
  for (auto& [id, conn] : out) {
    conn->fail("the rpc agent shut down");
  }
  auto in = incoming;
  for (const auto& conn : in) {
    conn->fail("the rpc agent shut down");
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, p] : pending) {
    ids.push_back(id);
  }
  for (uint64_t id : ids) {
    finish_call(
        id,
        std::nullopt,
        std::make_exception_ptr(
            NetworkError("rpc agent '" + self_name + "' is shut down")));
  }
  work.reset();
}

TcpTransport::TcpTransport(
    int self_id,
    std::string self_name,
    const std::string& listen_host,
    RequestHandler on_request)
    : impl_(std::make_shared<Impl>(
          self_id, std::move(self_name), std::move(on_request))) {
  Impl& impl = *impl_;
  asio::error_code ec;
  auto address = asio::ip::make_address(listen_host, ec);
  if (ec) {
    throw InvalidArgument(
        "rpc listen address '" + listen_host + "' is not an IP address");
  }
  tcp::endpoint ep(address, 0);
  impl.acceptor.open(ep.protocol(), ec);
  if (!ec) {
    impl.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    impl.acceptor.bind(ep, ec);
  }
  if (!ec) {
    impl.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  }
  if (ec) {
    throw NetworkError(
        "rpc agent cannot listen on " + listen_host + ": " + ec.message());
  }
  impl.port = impl.acceptor.local_endpoint().port();
  impl.start_accept();
  impl.thread = std::jthread([&impl] {
    try {
      impl.io.run();
    } catch (const std::exception& e) {
      TIDE_LOG_ERROR("[{}] rpc I/O loop died: {}", impl.self_name, e.what());
    }
  });
}

TcpTransport::~TcpTransport() {
  shutdown();
  join();
}

uint16_t TcpTransport::port() const {
  return impl_->port;
}

void TcpTransport::set_peers(std::vector<PeerAddress> peers) {
  auto done = std::make_shared<Promise<void>>();
  asio::post(impl_->io, [impl = impl_.get(), peers = std::move(peers), done] {
    for (auto& p : peers) {
      impl->peers[p.id] = p;
    }
    done->set_value();
  });
  done->get_future().wait(std::chrono::seconds(60));
}

Future<Payload> TcpTransport::call(
    int to, std::string fn, std::chrono::milliseconds timeout, Payload args) {
  Promise<Payload> promise;
  Future<Payload> future = promise.get_future();
  if (impl_->stopping.load()) {
    promise.set_error(
        NetworkError("rpc agent '" + impl_->self_name + "' is shut down"));
    return future;
  }
  uint64_t id = impl_->next_id.fetch_add(1);
  impl_->pending_count.fetch_add(1);
  asio::post(
      impl_->io,
      [impl = impl_.get(),
       id,
       to,
       timeout,
       fn = std::move(fn),
       args = std::move(args),
       promise = std::move(promise)]() mutable {
        impl->pending.emplace(
            id, Impl::Pending{std::move(promise), to, std::move(fn), nullptr});
        impl->start_call_on_loop(id, to, timeout, std::move(args));
      });
  return future;
}

size_t TcpTransport::pending_calls() const {
  return impl_->pending_count.load();
}

void TcpTransport::shutdown() {
  if (impl_->stopping.exchange(true)) {
    return;
  }
  asio::post(impl_->io, [impl = impl_.get()] { impl->stop_on_loop(); });
}

void TcpTransport::join() {
  if (impl_->thread.joinable()) {
    impl_->thread.join();
  }
}

}  // namespace tide::rpc::detail
