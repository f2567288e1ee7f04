// The transport: listening, the connections by peer, opening a pipe,
// shutdown. A connection's own life is connection.cpp's.
#include "transport/transport.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <string_view>
#include <vector>

#include <asio/ip/address.hpp>
#include <asio/post.hpp>

#include "tide/common/error.h"
#include "tide/common/future.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "common/random.h"
#include "net/address.h"
#include "net/eviction.h"
#include "transport/auth.h"
#include "transport/control.h"
#include "transport/tcp/lane_path.h"
#include "transport/transport_impl.h"

namespace tide::transport {

namespace {

using asio::ip::tcp;
using Endpoint = asio::generic::stream_protocol::endpoint;

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

TransportOptions with_uids_from_env(TransportOptions o) {
  const char* env = std::getenv("TIDE_RPC_ALLOW_UIDS");
  if (!o.allowed_uids.empty() || o.allow_any_uid || env == nullptr ||
      *env == '\0') {
    return o;
  }
  if (std::string_view(env) == "any") {
    o.allow_any_uid = true;
    return o;
  }
  for (const auto& part : split(env, ',')) {
    uint32_t uid = 0;
    auto [end, ec] =
        std::from_chars(part.data(), part.data() + part.size(), uid);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size()) {
      throw InvalidArgument(
          "TIDE_RPC_ALLOW_UIDS='" + std::string(env) +
          "': expected user ids separated by commas, or 'any'");
    }
    o.allowed_uids.push_back(uid);
  }
  return o;
}

MessageTypes all_types(const MessageTypes& upper) {
  for (MessageType t : upper.all()) {
    if (t < kFirstUpperType) {
      throw InvalidArgument(
          "message type " + std::to_string(t) +
          " is the transport's own: the layer above numbers its types from " +
          std::to_string(kFirstUpperType));
    }
  }
  MessageTypes types;
  types.add(control_types()).add(upper);
  return types;
}

}  // namespace

std::string local_host_key() {
  std::array<char, 128> ns{};
  ssize_t n = ::readlink("/proc/self/ns/net", ns.data(), ns.size() - 1);
  return read_first_line("/proc/sys/kernel/random/boot_id") + "/" +
         (n > 0 ? std::string(ns.data(), static_cast<size_t>(n)) : "?");
}

Transport::Impl::Impl(TransportOptions o, TransportHandlers h)
    : options(with_uids_from_env(std::move(o))),
      handlers(std::move(h)),
      types(all_types(options.message_types)),
      acceptor(loop.io()),
      local_acceptor(loop.io()) {}

std::string Transport::Impl::peer_label(int id) const {
  if (id < 0) {
    return "a peer before its handshake";
  }
  std::lock_guard lock(peers_mutex);
  auto it = peers.find(id);
  if (it == peers.end()) {
    return "worker " + std::to_string(id);
  }
  // Names come from the store, which anyone may write to.
  return "worker '" + printable(it->second.name) + "' (id " +
         std::to_string(id) + ", " +
         net::format_host_port(it->second.host, it->second.port) + ")";
}

bool Transport::Impl::uid_allowed(uint32_t uid) const {
  return options.allow_any_uid || uid == ::geteuid() ||
         std::find(
             options.allowed_uids.begin(), options.allowed_uids.end(), uid) !=
             options.allowed_uids.end();
}

bool Transport::Impl::warn_now() {
  auto now = Clock::now();
  if (now - last_warning < std::chrono::seconds(1)) {
    return false;
  }
  last_warning = now;
  return true;
}

void Transport::Impl::adopt(Socket socket, Admission who) {
  if (unauthenticated >= options.max_unauthenticated) {
    make_room();
  }
  auto conn =
      std::make_shared<Connection>(*this, std::move(socket), false, who.local);
  conn->peer_pid = who.pid;
  conn->source = std::move(who.source);
  conn->refusal = std::move(who.refusal);
  conn->accepted_at = Clock::now();
  conn->make_handle();
  conn->counted = true;
  ++unauthenticated;
  incoming.insert(conn);
  conn->start();
}

void Transport::Impl::make_room() {
  std::vector<std::shared_ptr<Connection>> waiting;
  for (const auto& c : incoming) {
    if (c->counted) {
      waiting.push_back(c);
    }
  }
  auto evicted = net::pick_eviction(
      waiting,
      [](const auto& c) { return std::string_view(c->source); },
      [](const auto& c) { return c->accepted_at; });
  if (!evicted) {
    return;
  }
  auto level = warn_now() ? spdlog::level::warn : spdlog::level::debug;
  tide::logger().log(
      level,
      "[{}] {} connections have not proved themselves yet "
      "(TransportOptions::max_unauthenticated); closing the oldest of {}, "
      "which holds {} of them, to admit a new one",
      options.self_name,
      unauthenticated,
      evicted->connection->source,
      evicted->held);
  evicted->connection->fail("closed to make room for a newer connection");
}

void Transport::Impl::left_handshake(Connection& conn) {
  if (conn.counted) {
    conn.counted = false;
    --unauthenticated;
  }
}

void Transport::Impl::accept_failed(
    const char* what, const asio::error_code& ec, bool local) {
  auto& backoff = local ? local_accept_backoff : accept_backoff;
  auto& timer = local ? local_accept_timer : accept_timer;
  bool first = backoff.count() == 0;
  backoff = std::min<std::chrono::milliseconds>(
      std::chrono::seconds(1),
      first ? std::chrono::milliseconds(10) : backoff * 2);
  auto level = first ? spdlog::level::warn : spdlog::level::debug;
  tide::logger().log(
      level,
      "[{}] accept on the {} failed: {}; accepting again in {} ms (backing "
      "off up to 1 s while it fails)",
      options.self_name,
      what,
      ec.message(),
      backoff.count());
  timer.expires_after(backoff);
  timer.async_wait([this, local](const asio::error_code& e) {
    if (e || stopped_on_loop) {
      return;
    }
    if (local) {
      start_local_accept();
    } else {
      start_accept();
    }
  });
}

void Transport::Impl::start_local_accept() {
  local_acceptor.async_accept([this](
                                  const asio::error_code& ec,
                                  asio::local::stream_protocol::socket s) {
    if (ec == asio::error::operation_aborted || !local_acceptor.is_open()) {
      return;
    }
    if (ec) {
      accept_failed("Unix socket", ec, true);
      return;
    }
    local_accept_backoff = {};
    // Who is at the other end, from the kernel: only this user's processes
    // (and those allowed) may even say hello.
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(s.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) !=
            0 ||
        !uid_allowed(cred.uid)) {
      auto level = warn_now() ? spdlog::level::warn : spdlog::level::debug;
      tide::logger().log(
          level,
          "[{}] refused a local connection from user {} (process {}): only "
          "this worker's own user may connect (TIDE_RPC_ALLOW_UIDS lets "
          "others in)",
          options.self_name,
          cred.uid,
          cred.pid);
      asio::error_code ignored;
      s.close(ignored);
    } else {
      adopt(
          Socket(
              loop.io(),
              asio::generic::stream_protocol(AF_UNIX, 0),
              s.release()),
          Admission{
              .local = true,
              .pid = cred.pid,
              .source = "user " + std::to_string(cred.uid)});
    }
    start_local_accept();
  });
}

void Transport::Impl::connect_on_loop(const std::shared_ptr<Connection>& conn) {
  if (conn->state == Connection::State::kClosed) {
    return;  // Shut down before it could connect.
  }
  if (!conn->local) {
    connect_tcp(conn);
    return;
  }
  std::string name;
  {
    std::lock_guard lock(peers_mutex);
    name = std::string(1, '\0') + peers.at(conn->peer_id).local_name;
  }
  Endpoint ep{asio::local::stream_protocol::endpoint(name)};
  conn->socket.async_connect(ep, [this, conn](const asio::error_code& e) {
    if (conn->state == Connection::State::kClosed) {
      return;
    }
    if (!e) {
      conn->start();
      return;
    }
    // The name is per network namespace and host: a peer that shares our
    // key but not our namespace view (or that is gone) is reached by TCP.
    TIDE_LOG_DEBUG(
        "[{}] no local socket to {} ({}); using TCP",
        options.self_name,
        peer_label(conn->peer_id),
        e.message());
    asio::error_code ignored;
    conn->socket.close(ignored);
    conn->local = false;
    // The handshake (first in the queue, unsent) must not offer shared
    // memory over TCP.
    {
      std::lock_guard lock(conn->wmutex);
      conn->queued_bytes -= conn->queue.front().total;
      conn->queue.pop_front();
      conn->queue_locked(Message{
          ControlType::kHandshake,
          0,
          handshake_metadata(false, conn->session.caller_nonce),
          {}});
    }
    connect_tcp(conn);
  });
}

void Transport::Impl::connection_failed(
    Connection& conn, const std::string& reason) {
  auto self = conn.shared_from_this();  // Keep it alive through the erase.
  left_handshake(conn);
  if (conn.lane) {
    incoming.erase(self);
    TIDE_LOG_DEBUG(
        "[{}] lane to {} closed: {}",
        options.self_name,
        peer_label(conn.peer_id),
        reason);
    // Its parts are lost: so are the messages of its connection.
    auto p = conn.parent.lock();
    if (p && p->state != Connection::State::kClosed &&
        LanePath::of(*p).has(self)) {
      p->fail("one of its lanes failed: " + reason);
    }
    return;
  }
  if (!conn.outgoing) {
    incoming.erase(self);
    TIDE_LOG_DEBUG(
        "[{}] connection from {} closed: {}",
        options.self_name,
        conn.who(),
        reason);
    if (conn.pipe().peer() >= 0) {  // it proved who it is
      handlers.on_closed(conn.pipe(), reason);
    }
    return;
  }
  {
    std::lock_guard lock(pipes_mutex);
    if (auto it = outgoing.find(conn.peer_id);
        it != outgoing.end() && it->second == self) {
      outgoing.erase(it);
    }
  }
  handlers.on_closed(conn.pipe(), reason);
}

void Transport::Impl::stop_on_loop() {
  std::unordered_map<int, std::shared_ptr<Connection>> out;
  {
    std::lock_guard lock(pipes_mutex);
    if (stopped) {
      return;
    }
    stopped = true;
    out = outgoing;
  }
  stopped_on_loop = true;
  asio::error_code ignored;
  acceptor.close(ignored);
  local_acceptor.close(ignored);
  accept_timer.cancel();
  local_accept_timer.cancel();
  for (auto& [id, conn] : out) {
    conn->fail("the rpc agent shut down");
  }
  auto in = incoming;
  for (const auto& conn : in) {
    conn->fail("the rpc agent shut down");
  }
  timers->close_on_loop();
  loop.release_work();
}

Transport::Transport(TransportOptions options, TransportHandlers handlers)
    : impl_(std::make_shared<Impl>(std::move(options), std::move(handlers))) {
  Impl& impl = *impl_;
  const std::string& listen_host = impl.options.listen_host;
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
  if (impl.options.token.empty() && !address.is_loopback()) {
    TIDE_LOG_WARN(
        "[{}] listening on {} without a token: anyone who reaches port {} can "
        "run functions on this worker; give every worker the same "
        "RpcBackendOptions::token or TIDE_RPC_TOKEN (tiderun does so by "
        "itself)",
        impl.options.self_name,
        listen_host,
        impl.port);
  }
  impl.start_accept();
  if (impl.options.shared_memory) {
    std::string name =
        "tide-rpc-" + std::to_string(::getpid()) + "-" + random_id(16);
    asio::local::stream_protocol::endpoint local(std::string(1, '\0') + name);
    impl.local_acceptor.open(local.protocol(), ec);
    if (!ec) {
      impl.local_acceptor.bind(local, ec);
    }
    if (!ec) {
      impl.local_acceptor.listen(asio::socket_base::max_listen_connections, ec);
    }
    if (ec) {
      // TCP still works: peers of this host connect over it.
      TIDE_LOG_WARN(
          "[{}] no local socket for shared memory ({}); using TCP only",
          impl.options.self_name,
          ec.message());
      impl.local_acceptor.close(ec);
    } else {
      impl.local_name = name;
      impl.start_local_accept();
    }
  }
  impl.loop.start();
}

Transport::~Transport() {
  shutdown();
  join();
}

uint16_t Transport::port() const {
  return impl_->port;
}

const std::string& Transport::local_name() const {
  return impl_->local_name;
}

void Transport::set_peers(std::vector<PeerAddress> peers) {
  std::lock_guard lock(impl_->peers_mutex);
  for (auto& p : peers) {
    impl_->peers[p.id] = std::move(p);
  }
}

std::string Transport::peer_label(int id) const {
  return impl_->peer_label(id);
}

Pipe Transport::pipe_to(int to) {
  Impl& impl = *impl_;
  auto shut_down = [&] {
    return NetworkError(
        "rpc agent '" + impl.options.self_name + "' is shut down");
  };
  if (impl.stopping.load()) {
    throw shut_down();
  }
  std::unique_lock lock(impl.pipes_mutex);
  if (impl.stopped) {
    throw shut_down();
  }
  if (auto it = impl.outgoing.find(to); it != impl.outgoing.end()) {
    return it->second->pipe();
  }
  bool local = false;
  {
    std::lock_guard peers_lock(impl.peers_mutex);
    auto peer = impl.peers.find(to);
    if (peer == impl.peers.end()) {
      throw InvalidArgument("no worker with id " + std::to_string(to));
    }
    local = impl.options.shared_memory && !peer->second.local_name.empty() &&
            peer->second.host_key == impl.host_key;
  }
  auto conn =
      std::make_shared<Connection>(impl, Socket(impl.loop.io()), true, local);
  conn->peer_id = to;
  conn->session.caller_nonce = auth::nonce();
  conn->session.caller_id = impl.options.self_id;
  conn->session.callee_id = to;
  conn->make_handle();
  // Queued first, written once connected; what callers send from now on
  // is held until the callee proves itself.
  conn->send(Message{
      ControlType::kHandshake,
      0,
      impl.handshake_metadata(local, conn->session.caller_nonce),
      {}});
  {
    std::lock_guard hold(conn->wmutex);
    conn->holding = true;
  }
  impl.outgoing[to] = conn;
  // Posted under the lock, before stop_on_loop() can mark the transport
  // stopped: the loop connects it (or finds it failed by the shutdown).
  asio::post(impl.loop.io(), [impl = impl_.get(), conn] {
    impl->connect_on_loop(conn);
  });
  return conn->pipe();
}

void Transport::cancel(int to, uint64_t id) {
  std::shared_ptr<Connection> conn;
  {
    std::lock_guard lock(impl_->pipes_mutex);
    auto it = impl_->outgoing.find(to);
    if (it == impl_->outgoing.end()) {
      return;
    }
    conn = it->second;
  }
  conn->cancel(id);
}

std::string Transport::connection_kind(int to) {
  auto done = std::make_shared<Promise<std::string>>();
  asio::post(impl_->loop.io(), [impl = impl_.get(), to, done] {
    std::lock_guard lock(impl->pipes_mutex);
    auto it = impl->outgoing.find(to);
    done->set_value(
        it == impl->outgoing.end() ? ""
        : it->second->local        ? "shm"
                                   : "tcp");
  });
  return done->get_future().wait(std::chrono::seconds(60));
}

Transport::Stats Transport::stats() const {
  return Stats{
      impl_->buffers_via_shm.load(),
      impl_->bytes_via_shm.load(),
      impl_->segments.load(),
      impl_->buffers_returned.load(),
      impl_->buffers_via_lanes.load(),
      impl_->bytes_via_lanes.load()};
}

void Transport::post(std::function<void()> fn) {
  asio::post(impl_->loop.io(), std::move(fn));
}

Timer Transport::schedule(Clock::time_point at, std::function<void()> fn) {
  Timer t;
  if (at == Clock::time_point::max()) {
    return t;
  }
  t.id_ = impl_->timers->add(at, std::move(fn));
  t.at_ = at;
  t.queue_ = impl_->timers;
  return t;
}

bool Timer::cancel() const {
  auto queue = queue_.lock();
  return queue && id_ != 0 && queue->cancel(at_, id_);
}

void Transport::help(const std::function<bool()>& done) {
  auto keep = impl_;
  keep->loop.lend(done);
}

void Transport::shutdown() {
  if (impl_->stopping.exchange(true)) {
    return;
  }
  asio::post(impl_->loop.io(), [impl = impl_.get()] { impl->stop_on_loop(); });
}

void Transport::join() {
  impl_->loop.join();
}

}  // namespace tide::transport
