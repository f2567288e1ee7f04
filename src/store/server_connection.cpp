// One client's connection to the store server (server_impl.h): reading and
// parsing its requests, its token, its request timer, writing its replies.
#include <algorithm>
#include <chrono>
#include <exception>

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "store/server_impl.h"

namespace tide::store::detail {

using asio::ip::tcp;

namespace {

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

void release_buffer(std::string& buffer) {
  buffer.clear();
  if (buffer.capacity() > kKeepBuffer) {
    std::string().swap(buffer);
  }
}

}  // namespace

Connection::Connection(
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

void Connection::start() {
  TIDE_LOG_DEBUG("[store] client {} ({}) connected", id_, peer_);
  arm_read();
}

void Connection::close(
    spdlog::level::level_enum level, std::string_view reason) {
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

void Connection::send_tagged(const uint64_t* tag, std::string_view bytes) {
  if (closed_) {
    return;
  }
  if (tag) {
    wire::Writer(out_).u64(*tag);
  }
  out_.append(bytes);
  if (!in_read_) {
    flush();
  }
}

void Connection::send_byte(uint8_t b) {
  char c = static_cast<char>(b);
  send(std::string_view(&c, 1));
}

void Connection::release() {
  held_ = false;
  if (closed_ || in_read_) {
    return;  // serve() goes on by itself
  }
  // A held connection arms no read (arm_read), so none is pending here.
  serve();
}

void Connection::arm_read() {
  // While paused, requests wait in in_ and the socket; otherwise in_ holds
  // at most one incomplete request, which must be read whole (however
  // many replies are unread) or its timer would drop an honest client.
  if (closed_ || reading_ || paused_ || held_) {
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

void Connection::serve() {
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

void Connection::on_read_error(const asio::error_code& ec) {
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

void Connection::process() {
  while (!closed_ && !paused_ && !held_) {
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
    if (paused_ || held_) {
      disarm_request_timer();  // The server is the one waiting now.
    } else {
      arm_request_timer();
    }
  }
}

bool Connection::step(std::string_view view) {
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
  wire::Tagged tag;
  bool tagged = *dialect_ == Dialect::kModern &&
                static_cast<uint8_t>(view[0]) == wire::kTaggedCode;
  auto d = tagged ? wire::decode_tagged(view, server_.options.limits, tag, req)
                  : wire::decode_request(
                        view, *dialect_, server_.options.limits, req);
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
  if (tagged) {
    tag_ = tag;
  }
  if (server_.seen[op]++ % kTimeOneIn != 0) {
    server_.handle(shared_from_this(), req);
  } else {
    auto start = std::chrono::steady_clock::now();
    server_.handle(shared_from_this(), req);
    m.seconds.observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  tag_.reset();
  m.requests.inc();
  server_.count_keys();
  return true;
}

bool Connection::fits_output(const wire::Request& req) {
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

void Connection::consume(size_t n) {
  in_pos_ += n;
  need_ = 1;
}

void Connection::authenticate(std::string_view token) {
  if (!server_.options.token.empty() &&
      !token_equal(token, server_.options.token)) {
    close(spdlog::level::warn, "wrong token");
    return;
  }
  authed_ = true;
  server_.strangers.erase(shared_from_this());
  send_byte(wire::kAuthOk);
}

void Connection::disarm_request_timer() {
  if (timer_armed_) {
    request_timer_.cancel();
    timer_armed_ = false;
    ++timer_generation_;  // A handler already queued must not fire.
  }
}

void Connection::arm_request_timer() {
  if (timer_armed_) {
    return;
  }
  timer_armed_ = true;
  request_timer_.expires_after(server_.options.request_timeout);
  request_timer_.async_wait(
      [weak = weak_from_this(),
       generation = timer_generation_](const asio::error_code& ec) {
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

void Connection::flush() {
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
    release_buffer(out_);
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
        release_buffer(self->writing_);
        if (ec) {
          if (ec != asio::error::operation_aborted) {
            self->close(spdlog::level::debug, "write failed: " + ec.message());
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

}  // namespace tide::store::detail
