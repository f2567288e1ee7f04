// A connection's life, its reading and its writing (connection.h has the
// state machine).
#include "transport/connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include <asio/post.hpp>

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "transport/control.h"
#include "transport/shm/shm_path.h"
#include "transport/tcp/lane_path.h"
#include "transport/transport_impl.h"

namespace tide::transport {

const char* Connection::state_name(State s) {
  switch (s) {
    case State::kConnecting:
      return "connecting";
    case State::kAwaitingAck:
      return "awaiting the handshake's ack";
    case State::kAwaitingHello:
      return "awaiting a handshake";
    case State::kAwaitingProof:
      return "awaiting the caller's proof";
    case State::kOpen:
      return "open";
    case State::kLane:
      return "a lane";
    case State::kRefused:
      return "refused";
    case State::kClosed:
      return "closed";
  }
  return "?";
}

Connection::Connection(
    Transport::Impl& owner, Socket socket, bool outgoing, bool local)
    : owner(owner),
      socket(std::move(socket)),
      outgoing(outgoing),
      local(local),
      state(outgoing ? State::kConnecting : State::kAwaitingHello),
      handshake_timer(owner.loop.io()),
      decoder(owner.types, FrameLimits{}, kHandshakeLimits),
      read_buf(std::make_unique_for_overwrite<char[]>(kHandshakeReadBuffer)),
      read_cap(kHandshakeReadBuffer) {
  if (owner.options.placement) {
    decoder.set_placement(owner.options.placement);
  }
}

void Connection::grow_read_buffer() {
  if (read_cap < kReadBuffer) {
    read_buf = std::make_unique_for_overwrite<char[]>(kReadBuffer);
    read_cap = kReadBuffer;
  }
}

void Connection::start_handshake_deadline() {
  handshake_timer.expires_after(owner.options.handshake_timeout);
  handshake_timer.async_wait([weak = weak_from_this()](
                                 const asio::error_code& ec) {
    auto self = weak.lock();
    if (ec || !self || self->handshaken() || self->state == State::kClosed) {
      return;
    }
    std::string reason =
        "no handshake within " +
        std::to_string(self->owner.options.handshake_timeout.count()) + " ms";
    // Strangers' connections expire by the hundred: logged at most once a
    // second, so that they cannot fill the log.
    auto level =
        self->owner.warn_now() ? spdlog::level::warn : spdlog::level::debug;
    tide::logger().log(
        level,
        "[{}] dropping connection with {}: {}",
        self->owner.options.self_name,
        self->who(),
        reason);
    self->fail(reason);
  });
}

void Connection::set_state(State next) {
  TIDE_LOG_TRACE(
      "[{}] connection with {}: {} -> {}",
      owner.options.self_name,
      who(),
      state_name(state),
      state_name(next));
  state = next;
  if (next == State::kClosed) {
    closed_flag.store(true, std::memory_order_release);
  }
}

void Connection::make_handle() {
  handle.conn_ = weak_from_this();
  handle.transport_ = owner.weak_from_this();
  handle.id_ = this;
  handle.peer_ = peer_id;
  handle.outgoing_ = outgoing;
}

void Pipe::cancel(uint64_t id) const {
  auto alive = transport_.lock();
  if (auto c = conn_.lock(); alive && c) {
    c->cancel(id);
  }
}

bool Pipe::send(Message m, std::string* why_not) const {
  // The transport first: a connection refers to it.
  auto alive = transport_.lock();
  auto c = conn_.lock();
  if (!alive || !c) {
    if (why_not != nullptr) {
      *why_not = "the connection closed";
    }
    return false;
  }
  if (c->send(std::move(m))) {
    return true;
  }
  if (why_not != nullptr) {
    *why_not = c->close_reason;
  }
  return false;
}

void Connection::start() {
  asio::error_code ignored;
  socket.non_blocking(true, ignored);
  if (!local) {
    int one = 1;
    ::setsockopt(
        socket.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  if (state == State::kConnecting) {
    // A lane is a lane from its first frame; a caller waits for its ack.
    set_state(lane ? State::kLane : State::kAwaitingAck);
  }
  if (state == State::kLane) {
    grow_read_buffer();
  } else {
    start_handshake_deadline();
  }
  {
    std::unique_lock lock(wmutex);
    if (writer == Writer::kNotConnected) {
      writer = Writer::kIdle;
    }
    flush(lock);
  }
  wait_readable();
}

void Connection::wait_readable() {
  socket.async_wait(
      Socket::wait_read,
      [self = shared_from_this()](const asio::error_code& ec) {
        if (self->state == State::kClosed) {
          return;
        }
        if (ec) {
          self->fail(ec.message());
          return;
        }
        self->read_ready();
      });
}

void Connection::read_ready() {
  for (int turn = 0; turn < kReadsPerTurn; ++turn) {
    // A large buffer in progress is read into its place; what follows it
    // into read_buf.
    std::span<char> direct;
    try {
      direct = decoder.window();
    } catch (const std::exception& e) {
      drop(e.what());
      return;
    }
    std::array<iovec, 2> iov{};
    size_t niov = 0;
    if (!direct.empty()) {
      iov[niov++] = {direct.data(), direct.size()};
    }
    // Read before a frame may grow it (a peer that proves itself).
    char* buf = read_buf.get();
    size_t cap = read_cap;
    iov[niov++] = {buf, cap};
    alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * 253)> control;
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = niov;
    if (local) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
    }
    ssize_t k = ::recvmsg(
        socket.native_handle(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (k < 0) {
      int e = errno;
      if (e == EINTR) {
        continue;
      }
      if (e == EAGAIN || e == EWOULDBLOCK) {
        wait_readable();
        return;
      }
      fail(std::strerror(e));
      return;
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; ++i) {
          int fd = 0;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          received_fds.emplace_back(fd);
        }
      }
    }
    // A caller's first frame after its PROOF may carry descriptors, and
    // one read may take both: only the first frames of each side may not.
    bool first_frame =
        state == State::kAwaitingHello || state == State::kAwaitingAck;
    if ((msg.msg_flags & MSG_CTRUNC) != 0 ||
        received_fds.size() > kMaxFdsPerFrame ||
        (first_frame && !received_fds.empty())) {
      drop("protocol error: the peer passed descriptors it may not pass");
      return;
    }
    if (k == 0) {
      fail(
          decoder.mid_frame()
              ? "connection closed by the peer in the middle of a frame"
              : "connection closed by the peer");
      return;
    }
    try {
      size_t got = static_cast<size_t>(k);
      size_t placed = std::min(got, direct.size());
      if (placed > 0) {
        decoder.commit(placed);
      }
      decoder.feed(buf, got - placed);
      while (auto frame = decoder.next()) {
        on_frame(std::move(*frame));
        if (state == State::kClosed) {
          return;
        }
      }
      // Descriptors come with their frame's first byte: between frames
      // none may be left over.
      if (!decoder.mid_frame() && !received_fds.empty()) {
        throw ProtocolError("descriptors that no frame's table claimed");
      }
      // A read short of what was offered took all there was (on a Unix
      // socket, unless it stopped at descriptors): wait instead of asking
      // again only to hear EAGAIN. (Arming the wait rechecks readiness,
      // EPOLL_CTL_MOD, so bytes that came meanwhile are not missed.)
      if (got < direct.size() + cap && msg.msg_controllen == 0) {
        wait_readable();
        return;
      }
    } catch (const ProtocolError& e) {
      drop(std::string("protocol error: ") + e.what());
      return;
    } catch (const std::exception& e) {
      drop(e.what());
      return;
    }
  }
  // More may be waiting: read on after the others had their turn.
  asio::post(owner.loop.io(), [self = shared_from_this()] {
    if (self->state != State::kClosed) {
      self->read_ready();
    }
  });
}

void Connection::drop(const std::string& reason) {
  TIDE_LOG_WARN(
      "[{}] dropping connection with {}: {}",
      owner.options.self_name,
      who(),
      reason);
  fail(reason);
}

std::string Connection::who() const {
  if (outgoing || lane || handle.peer() >= 0 || peer_id < 0) {
    return owner.peer_label(peer_id);
  }
  return "a peer claiming to be worker " + std::to_string(peer_id) +
         " (not proved)";
}

void Connection::on_frame(Frame frame) {
  switch (state) {
    case State::kRefused:
      return;  // What the peer sent after its refused handshake is moot.
    case State::kAwaitingAck:
    case State::kAwaitingHello:
    case State::kAwaitingProof:
      expect_handshake(frame);
      return;
    case State::kLane:
      LanePath::on_lane_frame(*this, frame);
      return;
    case State::kOpen:
      break;
    case State::kConnecting:
    case State::kClosed:
      return;
  }
  if (frame.type < kFirstUpperType) {
    if (path->on_control(frame)) {
      return;
    }
    throw ProtocolError(
        std::string("unexpected ") + owner.types.name(frame.type) +
        " on an open connection");
  }
  if (!path->park(frame)) {
    dispatch(frame);
  }
}

void Connection::dispatch(Frame& frame) {
  Message m{frame.type, frame.id, std::move(frame.metadata), {}};
  m.buffers = path->take(frame);
  owner.handlers.on_message(handle, std::move(m));
}

void Connection::choose_path(bool shm) {
  std::unique_ptr<BufferPath> chosen;
  if (shm) {
    chosen = std::make_unique<ShmPath>(*this);
  } else if (!local) {
    chosen = std::make_unique<LanePath>(*this);
  } else {
    return;  // Inline, as it is.
  }
  std::lock_guard lock(wmutex);
  path = std::move(chosen);
}

size_t Connection::message_bytes(const Message& m) {
  size_t n = m.metadata.size();
  for (const auto& b : m.buffers) {
    n += b.size();
  }
  return n;
}

bool Connection::send(Message m) {
  std::unique_lock lock(wmutex);
  if (writer == Writer::kClosing || writer == Writer::kClosed) {
    // Reported as lost once closed_flag is set (fail() sets it before it
    // closes the writer); a write error's fail() is still on its way.
    return !closed_flag.load(std::memory_order_acquire);
  }
  if (m.type >= kFirstUpperType) {
    size_t waiting = queued_bytes + held_bytes;
    size_t bytes = message_bytes(m);
    if (waiting > 0 && waiting + bytes > owner.options.max_queued_bytes) {
      throw NetworkError(
          "the connection to " + owner.peer_label(peer_id) + " holds " +
          std::to_string(waiting >> 20) + " MiB unsent, and " +
          std::to_string(bytes >> 20) + " MiB more would pass its limit of " +
          std::to_string(owner.options.max_queued_bytes >> 20) +
          " MiB (TransportOptions::max_queued_bytes): the peer is not "
          "reading what it is sent; this message was dropped");
    }
    if (holding) {
      // Checked now as it would be when encoded: the caller hears of it.
      (void)encode_head(
          {m.type, 0, m.id, m.metadata, m.buffers},
          FrameLimits{},
          &owner.types);
      held_bytes += bytes;
      held.push_back(std::move(m));
      return true;
    }
  }
  queue_locked(std::move(m));
  flush(lock);
  return true;
}

void Connection::queue_locked(Message m) {
  OutFrame f = encode_frame(std::move(m));
  queued_bytes += f.total;
  queue.push_back(std::move(f));
}

void Connection::cancel(uint64_t id) {
  std::lock_guard lock(wmutex);
  for (auto it = held.begin(); it != held.end();) {
    if (it->id == id) {
      held_bytes -= message_bytes(*it);
      it = held.erase(it);
    } else {
      ++it;
    }
  }
  if (writer == Writer::kWriting || writer == Writer::kClosing) {
    return;  // A writer's iovecs point into the queue.
  }
  for (size_t i = 0; i < queue.size();) {
    OutFrame& f = queue[i];
    if (f.cancellable && f.id == id && (i > 0 || front_sent == 0)) {
      queued_bytes -= f.total;
      queue.erase(queue.begin() + static_cast<ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

OutFrame Connection::encode_frame(Message m) {
  OutFrame out;
  uint16_t flags = path->place(m, out.fds);
  for (const auto& b : m.buffers) {
    out.total += b.size();
  }
  out.head = encode_head(
      {m.type, flags, m.id, m.metadata, m.buffers},
      FrameLimits{},
      &owner.types);
  out.total += out.head.size();
  out.buffers = std::move(m.buffers);
  out.id = m.id;
  out.cancellable = m.type >= kFirstUpperType && flags == 0 && out.fds.empty();
  return out;
}

void Connection::flush(std::unique_lock<std::mutex>& lock) {
  if (writer != Writer::kIdle) {
    return;  // Not connected, someone writes, the loop waits, or closing.
  }
  writer = Writer::kWriting;
  while (!queue.empty() && writer == Writer::kWriting) {
    std::array<iovec, kMaxIov> iov{};
    size_t n = 0;
    std::vector<int>* fds = nullptr;
    size_t skip = front_sent;
    auto add = [&](const char* p, size_t len) {
      if (skip >= len) {
        skip -= len;
        return;
      }
      if (n < kMaxIov) {
        iov[n++] = {const_cast<char*>(p + skip), len - skip};
      }
      skip = 0;
    };
    for (size_t q = 0; q < queue.size() && n < kMaxIov; ++q) {
      OutFrame& f = queue[q];
      if (!f.fds.empty()) {
        // Descriptors ride with their frame's first byte: it starts a
        // sendmsg of its own.
        if (q > 0) {
          break;
        }
        fds = &f.fds;
      }
      add(f.head.data(), f.head.size());
      for (const auto& b : f.buffers) {
        add(b.data(), b.size());
      }
    }
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = n;
    alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)>
        control{};
    if (fds != nullptr) {
      size_t bytes = fds->size() * sizeof(int);
      msg.msg_control = control.data();
      msg.msg_controllen = CMSG_SPACE(bytes);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(bytes);
      std::memcpy(CMSG_DATA(c), fds->data(), bytes);
    }
    // The frames the iovecs point into stay: others only append to the
    // queue, and fail() leaves it to this writer.
    int fd = socket.native_handle();
    lock.unlock();
    ssize_t k = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    int e = errno;
    lock.lock();
    if (writer != Writer::kWriting) {
      break;  // Closed meanwhile.
    }
    if (k < 0) {
      if (e == EINTR) {
        continue;
      }
      if (e == EAGAIN || e == EWOULDBLOCK) {
        writer = Writer::kBlocked;
        asio::post(owner.loop.io(), [self = shared_from_this()] {
          self->wait_writable();
        });
        return;
      }
      fail_later(std::string("write failed: ") + std::strerror(e));
      break;
    }
    if (fds != nullptr) {
      fds->clear();
    }
    auto left = static_cast<size_t>(k);
    while (left > 0) {
      size_t rest = queue.front().total - front_sent;
      if (left < rest) {
        front_sent += left;
        break;
      }
      left -= rest;
      queued_bytes -= queue.front().total;
      queue.pop_front();
      front_sent = 0;
    }
  }
  if (writer == Writer::kWriting) {
    writer = Writer::kIdle;
    if (queue.empty() && close_when_drained) {
      fail_later("refused the peer");
    }
    return;
  }
  // Closed while this thread wrote: what is queued goes nowhere, and the
  // socket is closed now that no one is in sendmsg.
  queue.clear();
  queued_bytes = 0;
  writer = Writer::kClosed;
  asio::post(
      owner.loop.io(), [self = shared_from_this()] { self->close_socket(); });
}

void Connection::wait_writable() {
  if (state == State::kClosed) {
    return;
  }
  socket.async_wait(
      Socket::wait_write,
      [self = shared_from_this()](const asio::error_code& ec) {
        if (self->state == State::kClosed) {
          return;
        }
        if (ec) {
          self->fail("write failed: " + ec.message());
          return;
        }
        std::unique_lock lock(self->wmutex);
        if (self->writer == Writer::kBlocked) {
          self->writer = Writer::kIdle;
          self->flush(lock);
        }
      });
}

void Connection::fail_later(std::string reason) {
  // Nothing more is written; a writer in sendmsg finishes the close.
  writer = writer == Writer::kWriting ? Writer::kClosing : Writer::kClosed;
  asio::post(owner.loop.io(), [self = shared_from_this(), reason] {
    // What the peer sent before it closed may say why (a REFUSED behind
    // the broken pipe it caused): read it first.
    if (self->state != State::kClosed && self->state != State::kConnecting) {
      self->read_ready();
    }
    self->fail(reason);
  });
}

void Connection::fail(const std::string& reason) {
  if (state == State::kClosed) {
    return;
  }
  close_reason = reason;
  set_state(State::kClosed);
  handshake_timer.cancel();
  {
    std::lock_guard lock(wmutex);
    held.clear();
    held_bytes = 0;
    if (writer != Writer::kClosing) {
      writer = writer == Writer::kWriting ? Writer::kClosing : Writer::kClosed;
    }
  }
  close_socket();
  path->close();
  owner.connection_failed(*this, reason);
}

void Connection::close_socket() {
  std::lock_guard lock(wmutex);
  asio::error_code ignored;
  socket.shutdown(Socket::shutdown_both, ignored);
  if (writer == Writer::kClosing) {
    return;  // The writer in sendmsg closes it when it comes out.
  }
  writer = Writer::kClosed;
  queue.clear();
  queued_bytes = 0;
  socket.close(ignored);
}

}  // namespace tide::transport
