// The TCP store server: one loop thread (asio), incremental parsing, waiters
// woken by the writes that satisfy them. Threading and protocol notes are in
// docs/store-protocol.md; one client's connection is server_connection.cpp.
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
#include "store/server_impl.h"

namespace tide::store {

using asio::ip::tcp;

using detail::Connection;
using detail::Waiter;

namespace {

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
  if (forwarder) {
    forwarder->close();
  }
  auto conns = connections;
  for (const auto& c : conns) {
    c->close(spdlog::level::debug, "server shutting down");
  }
  waiters.clear();
  bound_timer.cancel();
  bounds = {};
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
      conn->send_tagged(w->tag ? &*w->tag : nullptr, waited(w->count, w->keys));
    }
  }
}

std::string TcpStoreServer::Impl::waited(
    const std::optional<int64_t>& count,
    const std::vector<std::string>& keys) const {
  std::string out;
  wire::Writer w(out);
  if (!count) {
    w.u8(wire::kStopWaiting);
    return out;
  }
  const std::string* v = kv.find(keys.at(0));
  w.i64(*count).str(v ? std::string_view(*v) : std::string_view());
  return out;
}

void TcpStoreServer::Impl::add_waiter(
    const std::shared_ptr<Connection>& conn,
    std::vector<std::string> keys,
    std::optional<int64_t> count) {
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<std::string> asked = keys;
  std::erase_if(keys, [this](const std::string& k) { return present(k); });
  if (keys.empty()) {
    conn->send(waited(count, asked));
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
  w->count = count;
  w->missing = keys.size();
  for (const auto& k : keys) {
    waiters[k].list.push_back(w);
  }
  w->keys = std::move(keys);
  if (conn->tag()) {
    w->tag = conn->tag()->tag;
    // A bound is a WAIT's; an ADD_WAIT waits for its key.
    if (conn->tag()->wait_ms > 0 && !count) {
      bounds.push(
          {std::chrono::steady_clock::now() +
               std::chrono::milliseconds(
                   std::min<uint64_t>(conn->tag()->wait_ms, 1ull << 40)),
           w});
      arm_bounds();
    }
  }
  conn->wait_keys += w->keys.size();
  conn->waits.push_back(std::move(w));
}

void TcpStoreServer::Impl::arm_bounds() {
  if (bounds.empty()) {
    return;
  }
  auto at = std::max(bounds.top().at, last_sweep + kBoundSweep);
  if (bound_timer_at && *bound_timer_at <= at) {
    return;  // armed for then or sooner
  }
  bound_timer_at = at;
  bound_timer.expires_at(at);
  bound_timer.async_wait([this](const asio::error_code& ec) {
    if (!ec) {
      sweep_bounds();
    }
  });
}

void TcpStoreServer::Impl::sweep_bounds() {
  bound_timer_at.reset();
  last_sweep = std::chrono::steady_clock::now();
  while (!bounds.empty() && bounds.top().at <= last_sweep) {
    auto waiter = bounds.top().waiter.lock();
    bounds.pop();
    if (waiter && !waiter->done) {
      expire(waiter);
    }
  }
  arm_bounds();
}

void TcpStoreServer::Impl::retire(Waiter& w) {
  w.done = true;
  for (const auto& k : w.keys) {
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

void TcpStoreServer::Impl::expire(const std::shared_ptr<Waiter>& w) {
  retire(*w);
  if (auto conn = w->conn.lock()) {
    conn->wait_keys -= w->keys.size();
    std::erase(conn->waits, w);
    char out = wire::kWaitTimedOut;
    conn->send_tagged(&*w->tag, std::string_view(&out, 1));
  }
}

void TcpStoreServer::Impl::drop_waiters(Connection& conn) {
  for (auto& w : conn.waits) {
    retire(*w);
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
    case Op::kAddWait:
      return 2 * sizeof(uint64_t) + stored(req.keys[1]);
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
  if (forwarder) {
    switch (req.op) {
      case Op::kValidate:
      case Op::kAuth:
      case Op::kPing:
        break;  // answered here
      case Op::kCancelWait:
        forwarder->cancel_wait(*conn);
        return;
      default:
        forwarder->forward(conn, req);
        return;
    }
  }
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
    case Op::kAdd:
    case Op::kAddWait: {
      int64_t count = 0;
      try {
        count = kv.add(req.keys[0], req.delta);
      } catch (const InvalidArgument& e) {
        // The protocol has no error reply: closing is the only answer a
        // torch client understands. Nothing stored changes.
        conn->close(spdlog::level::warn, e.what());
        return;
      }
      if (req.op == Op::kAdd) {
        conn->send(encode_i64(count));
        notify(req.keys[0]);
        return;
      }
      notify(req.keys[0]);
      std::vector<std::string> key{std::move(req.keys[1])};
      if (count >= req.target) {
        conn->send(waited(count, key));  // this add completed the count
      } else {
        add_waiter(conn, std::move(key), count);
      }
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

namespace {

// Connects the fan-in's upstream (if any) and opens the listener.
void open_server(TcpStoreServer::Impl& impl) {
  if (impl.options.upstream) {
    impl.forwarder = std::make_unique<detail::Forwarder>(
        impl.io, *impl.options.upstream, impl.connections);
    impl.forwarder->start();
  }
  impl.open();
  impl.accept();
}

}  // namespace

std::unique_ptr<TcpStoreServer> TcpStoreServer::start(
    TcpStoreServerOptions options) {
  raise_fd_limit();
  auto impl = std::make_unique<Impl>(std::move(options));
  open_server(*impl);
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

std::unique_ptr<TcpStoreServer> detail::start_server_on(
    asio::io_context& io, TcpStoreServerOptions options) {
  auto impl = std::make_unique<TcpStoreServer::Impl>(std::move(options), &io);
  open_server(*impl);
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

TcpStoreServer::FanInCounts TcpStoreServer::fan_in_counts() const {
  if (!impl_->forwarder) {
    return {};
  }
  auto c = impl_->forwarder->counts();
  return {.requests = c.requests, .frames = c.frames};
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
