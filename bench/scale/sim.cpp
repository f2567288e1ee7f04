#include "sim.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "tide/common/error.h"

#include "bench_util.h"

namespace tide::bench::sim {

namespace {

using store::Dialect;
using store::wire::Op;
using store::wire::Writer;

// A coroutine nobody awaits: spawn()'s driver. It starts at once and frees
// itself when it ends.
struct Detached {
  struct promise_type {  // NOLINT(readability-identifier-naming): C++'s name
    Detached get_return_object() {
      return {};
    }
    std::suspend_never initial_suspend() noexcept {
      return {};
    }
    std::suspend_never final_suspend() noexcept {
      return {};
    }
    void return_void() {}
    void unhandled_exception() {
      std::terminate();  // drive() catches everything
    }
  };
};

Detached drive(
    Co<void> co, size_t* live, std::function<void(std::exception_ptr)> done) {
  std::exception_ptr error;
  try {
    co_await co;
  } catch (...) {
    error = std::current_exception();
  }
  --*live;
  if (done) {
    done(error);
  }
}

// The largest value a reply may carry: a bench's values are small, so a
// bigger length is a protocol error, not an allocation.
constexpr uint64_t kMaxValueBytes = 64 * 1024 * 1024;
constexpr int64_t kMsNs = 1'000'000;

}  // namespace

// ---------------------------------------------------------------------------
// Loop

Loop::Loop() : ep_(::epoll_create1(EPOLL_CLOEXEC)) {
  if (ep_.get() < 0) {
    throw NetworkError(errno_text("epoll_create1", errno));
  }
}

void Loop::spawn(Co<void> co, std::function<void(std::exception_ptr)> done) {
  ++live_;
  drive(std::move(co), &live_, std::move(done));
}

Loop::TimerId Loop::at(int64_t at_ns, std::function<void()> fn) {
  TimerId id{at_ns, next_timer_++};
  timers_.emplace(id, std::move(fn));
  return id;
}

void Loop::cancel(const TimerId& id) {
  timers_.erase(id);
}

void Loop::watch(int fd, IoHandler* handler) {
  // Edge-triggered, for reading and writing at once: no epoll_ctl per
  // change of interest; handlers read and write until EAGAIN.
  epoll_event ev{
      .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
      .data = {.ptr = handler}};
  if (::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    throw NetworkError(errno_text("epoll_ctl", errno));
  }
}

void Loop::release_connect_slot() {
  if (!connect_queue_.empty()) {
    post(connect_queue_.front());  // the slot passes on
    connect_queue_.pop_front();
    return;
  }
  --connecting_;
}

bool Loop::run(int64_t deadline_ns) {
  stopped_ = false;
  std::vector<epoll_event> events(1024);
  while (live_ > 0 && !stopped_) {
    throw_if_interrupted();
    while (!ready_.empty() && !stopped_) {
      auto h = ready_.front();
      ready_.pop_front();
      h.resume();
    }
    int64_t now = mono_ns();
    while (!timers_.empty() && timers_.begin()->first.first <= now &&
           !stopped_) {
      auto fn = std::move(timers_.begin()->second);
      timers_.erase(timers_.begin());
      fn();
    }
    if (live_ == 0 || stopped_) {
      break;
    }
    if (now >= deadline_ns) {
      return false;
    }
    if (!ready_.empty()) {
      continue;  // a timer made work
    }
    int64_t next = deadline_ns;
    if (!timers_.empty()) {
      next = std::min(next, timers_.begin()->first.first);
    }
    // Wake at least every 100 ms for the interrupt flag.
    int timeout_ms = static_cast<int>(
        std::clamp<int64_t>((next - now + 999'999) / 1'000'000, 0, 100));
    int n = ::epoll_wait(
        ep_.get(), events.data(), static_cast<int>(events.size()), timeout_ms);
    if (n < 0 && errno != EINTR) {
      throw NetworkError(errno_text("epoll_wait", errno));
    }
    for (int k = 0; k < n; ++k) {
      static_cast<IoHandler*>(events[static_cast<size_t>(k)].data.ptr)
          ->on_io(events[static_cast<size_t>(k)].events);
    }
  }
  return live_ == 0;
}

// ---------------------------------------------------------------------------
// Conn

uint32_t source_address(size_t client, size_t per_address) {
  size_t block = client / std::max<size_t>(per_address, 1);
  // 127.1.0.1, 127.1.0.2, ... skipping .0 and .255 in the last byte.
  size_t host = 1 * 65536 + (block / 254) * 256 + (block % 254) + 1;
  return (127u << 24) | static_cast<uint32_t>(host);
}

struct Conn::ReplyAwaiter {
  Conn& conn;
  std::string bytes;
  Pending p;
  int64_t timeout_ns = 0;
  std::optional<Loop::TimerId> timer;

  bool await_ready() const noexcept {
    return false;
  }
  bool await_suspend(std::coroutine_handle<> h) {
    p.waiter = h;
    if (!conn.connected()) {
      p.error = std::make_exception_ptr(
          NetworkError("the connection to the store is closed"));
      return false;
    }
    conn.pending_.push_back(&p);
    if (conn.options_.tagged) {
      p.tag = conn.last_tag_;
      conn.by_tag_[p.tag] = &p;
    } else if (timeout_ns > 0) {
      timer = conn.loop_.at(
          mono_ns() + timeout_ns, [c = &conn, pp = &p] { c->on_timeout(pp); });
    }
    conn.send(bytes);
    return true;
  }
  Pending await_resume() {
    if (timer) {
      conn.loop_.cancel(*timer);
    }
    if (p.error) {
      std::rethrow_exception(p.error);
    }
    return std::move(p);
  }
};

// Registers every request of a batch and sends them in one write; resumes
// when the last reply is in (the server answers frames in order).
struct Conn::BatchAwaiter {
  Conn& conn;
  std::string bytes;
  std::vector<Pending>& ps;

  bool await_ready() const noexcept {
    return false;
  }
  bool await_suspend(std::coroutine_handle<> h) {
    if (!conn.connected()) {
      ps.back().error = std::make_exception_ptr(
          NetworkError("the connection to the store is closed"));
      return false;
    }
    for (Pending& p : ps) {
      p.waiter = std::noop_coroutine();
      conn.pending_.push_back(&p);
      conn.by_tag_[p.tag] = &p;
    }
    ps.back().waiter = h;
    conn.send(bytes);
    return true;
  }
  void await_resume() {
    for (Pending& p : ps) {
      if (p.error) {
        std::rethrow_exception(p.error);
      }
    }
    TIDE_CHECK(std::all_of(
        ps.begin(), ps.end(), [](const Pending& p) { return p.done; }));
  }
};

Conn::Conn(Loop& loop, ConnOptions options)
    : loop_(loop), options_(std::move(options)) {}

Conn::~Conn() {
  close();
}

std::string Conn::begin(Op op, uint64_t wait_ms) {
  std::string out;
  if (options_.tagged && op != Op::kValidate) {
    last_tag_ = next_tag_++;
    Writer(out).u8(store::wire::kTaggedCode).u64(last_tag_).u64(wait_ms);
  }
  Writer(out).u8(*store::wire::op_code(op, options_.dialect));
  return out;
}

Conn::ReplyAwaiter Conn::request(std::string bytes, Reply kind, size_t count) {
  ++stats_.requests;
  ReplyAwaiter a{.conn = *this, .bytes = std::move(bytes)};
  a.p.kind = kind;
  a.p.count = count;
  return a;
}

Co<void> Conn::connect() {
  close();
  if (loop_.tearing_down()) {
    throw NetworkError("the bench is stopping");
  }
  int64_t deadline = mono_ns() + options_.connect_timeout_ns;
  int64_t backoff = 10'000'000;
  std::string error;
  for (;;) {
    if (loop_.tearing_down()) {
      throw NetworkError("the bench is stopping");
    }
    co_await loop_.connect_slot();
    int err = 0;
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) {
      loop_.release_connect_slot();
      throw NetworkError(errno_text("socket", errno));
    }
    if (options_.source != 0) {
      int one = 1;
      ::setsockopt(
          fd.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
      sockaddr_in src{};
      src.sin_family = AF_INET;
      src.sin_addr.s_addr = htonl(options_.source);
      if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&src), sizeof src) !=
          0) {
        loop_.release_connect_slot();
        throw NetworkError(errno_text("bind to a 127.x source address", errno));
      }
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(options_.port);
    addr.sin_addr.s_addr = htonl(options_.host);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) !=
        0) {
      err = errno;
    }
    if (err == EINPROGRESS) {
      fd_ = std::move(fd);
      loop_.watch(fd_.get(), this);
      struct Connected {
        Conn& c;
        bool await_ready() const noexcept {
          return false;
        }
        void await_suspend(std::coroutine_handle<> h) {
          c.connect_waiter_ = h;
        }
        void await_resume() const noexcept {}
      };
      // Bounded: the kernel retries an unanswered SYN for minutes.
      auto timer = loop_.at(deadline, [this] {
        if (connect_waiter_) {
          on_io(0);
        }
      });
      co_await Connected{*this};
      loop_.cancel(timer);
      socklen_t len = sizeof err;
      err = 0;
      if (fd_.get() < 0) {
        err = ECONNABORTED;  // closed while connecting
      } else {
        ::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
      if (err == 0 && !connect_ready_) {
        err = ETIMEDOUT;  // the deadline passed, not the connect
      }
      if (err != 0) {
        fd_.reset();  // closing it leaves the epoll set too
      }
    } else if (err == 0) {
      fd_ = std::move(fd);
      loop_.watch(fd_.get(), this);
    }
    loop_.release_connect_slot();
    if (err == 0) {
      break;
    }
    error = std::strerror(err);
    if (mono_ns() >= deadline) {
      throw NetworkError(fmt::format(
          "cannot connect to the store at 127.0.0.1:{} within {} s: {}",
          options_.port,
          options_.connect_timeout_ns / 1'000'000'000,
          error));
    }
    co_await loop_.sleep_until(mono_ns() + backoff);
    backoff = std::min<int64_t>(backoff * 2, 1'000'000'000);
  }
  int one = 1;
  ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ready_ = true;
  if (!options_.token.empty()) {
    std::string req;
    Writer(req).u8(store::wire::kAuthCode).str(options_.token);
    co_await request(std::move(req), Reply::kByte);
  }
  if (options_.dialect == Dialect::kModern) {
    std::string req = begin(Op::kValidate);
    Writer(req).u32(store::wire::kValidateMagic);
    std::string ping = begin(Op::kPing);
    uint32_t nonce = static_cast<uint32_t>(fd_.get());
    Writer(ping).u32(nonce);
    Pending p = co_await request(req + ping, Reply::kU32);
    if (static_cast<uint32_t>(p.number) != nonce) {
      close();
      throw ProtocolError("the store answered PING with a wrong nonce");
    }
  }
}

Co<void> Conn::ensure_connected() {
  if (!connected()) {
    co_await connect();
  }
}

void Conn::close() {
  if (connect_waiter_) {
    connect_ready_ = false;  // it sees a failed connect
    loop_.post(std::exchange(connect_waiter_, {}));
  }
  fd_.reset();  // closing it leaves the epoll set too
  ready_ = false;
  out_.clear();
  in_.clear();
  in_pos_ = 0;
  fail(std::make_exception_ptr(
      NetworkError("the connection to the store was closed")));
}

void Conn::fail(std::exception_ptr error) {
  fd_.reset();
  ready_ = false;
  std::deque<Pending*> failed;
  failed.swap(pending_);
  by_tag_.clear();
  for (Pending* p : failed) {
    p->error = error;
    p->done = true;
    loop_.post(p->waiter);
  }
}

void Conn::send(std::string_view bytes) {
  stats_.bytes_out += bytes.size();
  out_.append(bytes);
  flush();
}

void Conn::flush() {
  size_t sent = 0;
  while (sent < out_.size() && fd_.get() >= 0) {
    ssize_t n =
        ::send(fd_.get(), out_.data() + sent, out_.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      // Failed from on_io, which the shut-down socket wakes: failing here
      // would resume a coroutine that is still suspending.
      ::shutdown(fd_.get(), SHUT_RDWR);
      out_.clear();
      return;
    }
  }
  out_.erase(0, sent);
}

void Conn::on_io(uint32_t events) {
  if (connect_waiter_) {
    connect_ready_ = (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) != 0;
    loop_.post(std::exchange(connect_waiter_, {}));
    return;  // nothing was sent yet, so nothing can have come
  }
  if (fd_.get() < 0) {
    return;  // closed earlier in this batch of events
  }
  if ((events & EPOLLOUT) != 0) {
    flush();
  }
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) == 0) {
    return;
  }
  char buf[16384];
  for (;;) {
    ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
    if (n > 0) {
      stats_.bytes_in += static_cast<size_t>(n);
      in_.append(buf, static_cast<size_t>(n));
      // A short read drained the socket: the next arrival is a new edge.
      if (static_cast<size_t>(n) < sizeof buf &&
          (events & (EPOLLRDHUP | EPOLLHUP)) == 0) {
        break;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    }
    fail(std::make_exception_ptr(NetworkError(
        n == 0 ? std::string("the store closed the connection")
               : errno_text("recv", errno))));
    return;
  }
  try {
    while (!pending_.empty() && take_reply()) {
    }
  } catch (const ProtocolError&) {
    fail(std::current_exception());
    return;
  }
  if (pending_.empty() && in_pos_ < in_.size()) {
    fail(std::make_exception_ptr(
        ProtocolError("the store sent bytes nobody asked for")));
    return;
  }
  if (in_pos_ == in_.size()) {
    in_.clear();
    in_pos_ = 0;
  } else if (in_pos_ > 65536) {
    in_.erase(0, in_pos_);
    in_pos_ = 0;
  }
}

bool Conn::take_reply() {
  std::string_view in(in_.data() + in_pos_, in_.size() - in_pos_);
  Pending* p = pending_.front();
  size_t header = 0;
  if (options_.tagged) {
    if (in.size() < sizeof(uint64_t)) {
      return false;
    }
    auto it = by_tag_.find(store::wire::load<uint64_t>(in.data()));
    if (it == by_tag_.end()) {
      throw ProtocolError("the store answered a tag nobody sent");
    }
    p = it->second;
    header = sizeof(uint64_t);
  }
  size_t used = parse_reply(p, in.substr(header));
  if (used == 0) {
    return false;
  }
  in_pos_ += header + used;
  if (options_.tagged) {
    by_tag_.erase(p->tag);
    std::erase(pending_, p);
  } else {
    pending_.pop_front();
  }
  p->done = true;
  loop_.post(p->waiter);
  return true;
}

size_t Conn::parse_reply(Pending* p, std::string_view in) {
  size_t used = 0;
  auto u64_at = [&](size_t pos) {
    return store::wire::load<uint64_t>(in.data() + pos);
  };
  switch (p->kind) {
    case Reply::kNone:
      TIDE_CHECK(false);
    case Reply::kByte:
      if (in.empty()) {
        return 0;
      }
      // A WAIT cancelled after its timeout: STOP_WAITING (it was met
      // first) and then WAIT_CANCELED, or WAIT_CANCELED alone.
      if (p->cancelled &&
          static_cast<uint8_t>(in[0]) == store::wire::kStopWaiting) {
        if (in.size() < 2) {
          return 0;
        }
        p->number = store::wire::kStopWaiting;
        used = 2;
      } else {
        p->number = static_cast<uint8_t>(in[0]);
        used = 1;
      }
      break;
    case Reply::kU32:
      if (in.size() < 4) {
        return 0;
      }
      p->number = store::wire::load<uint32_t>(in.data());
      used = 4;
      break;
    case Reply::kI64:
      if (in.size() < 8) {
        return 0;
      }
      p->number = store::wire::load<int64_t>(in.data());
      used = 8;
      break;
    case Reply::kCount:
      if (in.size() < 8) {
        return 0;
      }
      p->number = store::wire::load<int64_t>(in.data());
      used = 8;  // then its value, as a GET's
      [[fallthrough]];
    case Reply::kBytes:
      while (p->values.size() < p->count) {
        if (in.size() < used + 8) {
          break;
        }
        uint64_t len = u64_at(used);
        if (len > kMaxValueBytes) {
          throw ProtocolError(fmt::format(
              "the store sent a value of {} bytes (at most {} expected)",
              len,
              kMaxValueBytes));
        }
        if (in.size() < used + 8 + len) {
          break;
        }
        p->values.emplace_back(in.substr(used + 8, len));
        used += 8 + len;
      }
      if (p->values.size() < p->count) {
        p->values.clear();  // parsed again, whole, when the rest has come
        return 0;
      }
      break;
  }
  return used;
}

void Conn::on_timeout(Pending* p) {
  if (p->done || p->cancelled) {
    return;
  }
  if (options_.dialect == Dialect::kModern) {
    // TcpStore::wait's timeout: CANCEL_WAIT, then the reply to both.
    p->cancelled = true;
    send(begin(Op::kCancelWait));
    ++stats_.requests;
    return;
  }
  // A legacy server cannot cancel: the connection is dropped.
  auto keep = pending_;
  pending_.clear();
  for (Pending* q : keep) {
    if (q != p) {
      pending_.push_back(q);
    }
  }
  p->number = -1;
  p->done = true;
  close();
  loop_.post(p->waiter);
}

Co<void> Conn::set(std::string key, std::string value) {
  co_await ensure_connected();
  ++stats_.requests;
  std::string req = begin(Op::kSet);
  Writer(req).str("/" + key).str(value);
  send(req);
}

Co<int64_t> Conn::add(std::string key, int64_t delta) {
  co_await ensure_connected();
  std::string req = begin(Op::kAdd);
  Writer(req).str("/" + key).i64(delta);
  Pending p = co_await request(std::move(req), Reply::kI64);
  co_return p.number;
}

Co<std::string> Conn::get(std::string key) {
  co_await ensure_connected();
  // TcpStore::get is WAIT for the key, then GET.
  std::string req = begin(Op::kWait);
  Writer(req).u64(1).str("/" + key);
  Pending w = co_await request(std::move(req), Reply::kByte);
  std::string get = begin(Op::kGet);
  Writer(get).str("/" + key);
  Pending p = co_await request(std::move(get), Reply::kBytes);
  co_return std::move(p.values.at(0));
}

Co<bool> Conn::check(std::vector<std::string> keys) {
  co_await ensure_connected();
  std::string req = begin(Op::kCheck);
  Writer w(req);
  w.u64(keys.size());
  for (const auto& k : keys) {
    w.str("/" + k);
  }
  Pending p = co_await request(std::move(req), Reply::kByte);
  co_return p.number == store::wire::kCheckReady;
}

Co<std::string> Conn::compare_set(
    std::string key, std::string expected, std::string desired) {
  co_await ensure_connected();
  std::string req = begin(Op::kCompareSet);
  Writer(req).str("/" + key).str(expected).str(desired);
  Pending p = co_await request(std::move(req), Reply::kBytes);
  co_return std::move(p.values.at(0));
}

Co<int64_t> Conn::delete_key(std::string key) {
  co_await ensure_connected();
  std::string req = begin(Op::kDeleteKey);
  Writer(req).str("/" + key);
  Pending p = co_await request(std::move(req), Reply::kI64);
  co_return p.number;
}

Co<Conn::Tally> Conn::add_wait(
    std::string counter, int64_t delta, int64_t target, std::string key) {
  co_await ensure_connected();
  std::string req = begin(Op::kAddWait);
  Writer(req).str("/" + counter).i64(delta).i64(target).str("/" + key);
  Pending p = co_await request(std::move(req), Reply::kCount);
  co_return Tally{p.number, std::move(p.values.at(0))};
}

Co<std::vector<Conn::Result>> Conn::together(std::vector<Call> calls) {
  TIDE_CHECK(options_.tagged && !calls.empty());
  co_await ensure_connected();
  std::string bytes;
  std::vector<Pending> ps(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    const Call& c = calls[i];
    ++stats_.requests;
    bytes += begin(c.add ? Op::kAdd : Op::kCompareSet);
    Writer w(bytes);
    w.str("/" + c.key);
    if (c.add) {
      w.i64(c.delta);
    } else {
      w.str(c.expected).str(c.desired);
    }
    ps[i].kind = c.add ? Reply::kI64 : Reply::kBytes;
    ps[i].tag = last_tag_;
  }
  BatchAwaiter sent{*this, std::move(bytes), ps};
  co_await sent;
  std::vector<Result> out(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    out[i].number = ps[i].number;
    if (!ps[i].values.empty()) {
      out[i].value = std::move(ps[i].values[0]);
    }
  }
  co_return out;
}

Co<bool> Conn::wait(std::vector<std::string> keys, int64_t timeout_ns) {
  co_await ensure_connected();
  std::string req = begin(
      Op::kWait,
      static_cast<uint64_t>(std::max<int64_t>(timeout_ns / kMsNs, 1)));
  Writer w(req);
  w.u64(keys.size());
  for (const auto& k : keys) {
    w.str("/" + k);
  }
  auto a = request(std::move(req), Reply::kByte);
  a.timeout_ns = timeout_ns;
  Pending p = co_await a;
  co_return p.number == store::wire::kStopWaiting;
}

Co<std::vector<std::string>> Conn::multi_get(std::vector<std::string> keys) {
  bool met = co_await wait(keys, options_.connect_timeout_ns);
  if (!met) {
    throw TimeoutError("multi_get: the keys did not appear");
  }
  std::string req;
  if (options_.dialect == Dialect::kModern) {
    req = begin(Op::kMultiGet);
    Writer w(req);
    w.u64(keys.size());
    for (const auto& k : keys) {
      w.str("/" + k);
    }
  } else {
    for (const auto& k : keys) {
      req += begin(Op::kGet);
      Writer(req).str("/" + k);
    }
  }
  Pending p = co_await request(std::move(req), Reply::kBytes, keys.size());
  co_return std::move(p.values);
}

// ---------------------------------------------------------------------------
// Descriptor limits

uint64_t raise_fd_limit(uint64_t want) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    return 0;
  }
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
    rlimit up{.rlim_cur = want, .rlim_max = want};
    if (::setrlimit(RLIMIT_NOFILE, &up) == 0) {
      return want;
    }
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, want);
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur == RLIM_INFINITY ? want : rl.rlim_cur;
}

std::string fd_limit_note(uint64_t need, uint64_t have) {
  return fmt::format(
      "not run here: needs {} descriptors in one process, and RLIMIT_NOFILE "
      "stops at {} (raising the hard limit takes CAP_SYS_RESOURCE)",
      need,
      have);
}

}  // namespace tide::bench::sim
