// Driver::kEpoll: N client connections multiplexed by one epoll thread (or a
// few), each sending exactly the requests a TcpStore client sends for the
// workload, one outstanding request per connection. Client CPU per op is a
// send, a recv and a share of an epoll_wait, so the server is what limits.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "tide/common/error.h"

#include "bench_util.h"
#include "store/wire.h"
#include "worker.h"

namespace tide::bench::detail {

namespace {

using std::chrono::milliseconds;
using store::Dialect;
using store::wire::Op;
using store::wire::Writer;

// Ops one connection may run in a row without a reply (sets) before it lets
// the others go.
constexpr int kMaxUnansweredInARow = 16;

// A request's first byte in dialect d.
std::string begin(Op op, Dialect d) {
  std::string out;
  Writer(out).u8(*store::wire::op_code(op, d));
  return out;
}

// What a connection waits for.
enum class Await : uint8_t {
  kNothing,     // In the ready list: its next op goes out.
  kSetFlushed,  // A set's bytes are still in `out`.
  kWaitReply,   // STOP_WAITING; then the GET goes out.
  kGetReply,    // u64 length and the value.
  kAddReply,    // i64.
  kCheckReply,  // The final sync.
  kDone,
};

struct Conn {
  Fd fd;
  // The client's requests, encoded once, as TcpStore encodes them (keys
  // with its "/" prefix).
  std::string set_req;
  std::string wait_req;
  std::string get_req;
  std::string add_req;
  std::string check_req;
  std::string out;  // Bytes the socket did not take yet.
  std::string in;   // Reply bytes received so far.
  Await await = Await::kNothing;
  uint64_t step = 0;
  bool want_out = false;  // EPOLLOUT is registered.
};

class EpollWorker {
 public:
  EpollWorker(
      const CellConfig& cfg,
      uint16_t port,
      int first,
      int count,
      CellState& state)
      : cfg_(cfg), port_(port), first_(first), state_(state) {
    conns_.resize(static_cast<size_t>(count));
  }

  // Connects every client and sets its key (so get never waits).
  void connect_all() {
    ep_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
    if (ep_.get() < 0) {
      throw NetworkError(errno_text("epoll_create1", errno));
    }
    const std::string value(kValueBytes, 'v');
    const std::string counter = std::string("/") + kCounterKey;
    for (size_t i = 0; i < conns_.size(); ++i) {
      Conn& c = conns_[i];
      c.fd = connect_one();
      std::string key = "/" + client_key(first_ + static_cast<int>(i));
      const Dialect d = cfg_.dialect;
      c.set_req = begin(Op::kSet, d);
      Writer(c.set_req).str(key).str(value);
      c.wait_req = begin(Op::kWait, d);
      Writer(c.wait_req).u64(1).str(key);
      c.get_req = begin(Op::kGet, d);
      Writer(c.get_req).str(key);
      c.add_req = begin(Op::kAdd, d);
      Writer(c.add_req).str(counter).i64(1);
      c.check_req = begin(Op::kCheck, d);
      Writer(c.check_req).u64(1).str(key);
      epoll_event ev{.events = EPOLLIN, .data = {.u64 = i}};
      if (::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, c.fd.get(), &ev) != 0) {
        throw NetworkError(errno_text("epoll_ctl", errno));
      }
      if (d == Dialect::kModern) {
        // As a torch >= 2.2 client opens: VALIDATE (no reply) first.
        std::string validate = begin(Op::kValidate, d);
        Writer(validate).u32(store::wire::kValidateMagic);
        send(i, validate);
      }
      send(i, c.set_req);
    }
  }

  // Runs ops until the phase is kStop, then syncs every connection. Returns
  // the ops completed while the phase was kMeasure.
  uint64_t run() {
    for (size_t i = 0; i < conns_.size(); ++i) {
      conns_[i].await =
          conns_[i].out.empty() ? Await::kNothing : Await::kSetFlushed;
      if (conns_[i].await == Await::kNothing) {
        ready_.push_back(i);
      }
    }
    std::vector<epoll_event> events(std::max<size_t>(conns_.size(), 1));
    std::vector<size_t> batch;
    last_progress_ = Clock::now();
    for (;;) {
      Phase p = state_.phase();
      if (p == kAbort) {
        return ops_;
      }
      draining_ = draining_ || p >= kStop;
      batch.swap(ready_);
      for (size_t i : batch) {
        if (draining_) {
          send(i, conns_[i].check_req);
          conns_[i].await = Await::kCheckReply;
        } else {
          issue(i);
        }
      }
      batch.clear();
      if (draining_ && done_ == conns_.size()) {
        return ops_;
      }
      // Without ready work, block; wake now and then to see phase changes.
      int n = ::epoll_wait(
          ep_.get(),
          events.data(),
          static_cast<int>(events.size()),
          ready_.empty() ? 20 : 0);
      if (n < 0 && errno != EINTR) {
        throw NetworkError(errno_text("epoll_wait", errno));
      }
      for (int k = 0; k < n; ++k) {
        size_t i = events[static_cast<size_t>(k)].data.u64;
        uint32_t e = events[static_cast<size_t>(k)].events;
        if ((e & EPOLLOUT) != 0) {
          on_writable(i);
        }
        if ((e & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0) {
          on_readable(i);
        }
      }
      if (n <= 0 && Clock::now() - last_progress_ > cfg_.op_timeout) {
        throw TimeoutError(
            "no reply from the server at 127.0.0.1:" + std::to_string(port_) +
            " in " + std::to_string(cfg_.op_timeout.count()) + " ms");
      }
    }
  }

 private:
  Fd connect_one() {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) {
      throw NetworkError(errno_text("socket", errno));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int r = ::connect(
        fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{.fd = fd.get(), .events = POLLOUT, .revents = 0};
      int err = ETIMEDOUT;
      if (::poll(&p, 1, static_cast<int>(cfg_.op_timeout.count())) == 1) {
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
      r = err == 0 ? 0 : -1;
      errno = err;
    }
    if (r != 0) {
      throw NetworkError(errno_text(
          "cannot connect to 127.0.0.1:" + std::to_string(port_), errno));
    }
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
  }

  void count_op() {
    if (state_.phase() == kMeasure) {
      ++ops_;
    }
    last_progress_ = Clock::now();
  }

  // Sends ops until one awaits a reply (or the socket is full).
  void issue(size_t i) {
    Conn& c = conns_[i];
    for (int n = 0; n < kMaxUnansweredInARow; ++n) {
      switch (op_at(cfg_.workload, c.step++)) {
        case OpKind::kSet:
          send(i, c.set_req);
          if (!c.out.empty()) {
            c.await = Await::kSetFlushed;
            return;
          }
          count_op();  // TcpStore::set returns once sent, too.
          continue;
        case OpKind::kGet:
          send(i, c.wait_req);  // TcpStore::get is WAIT, then GET.
          c.await = Await::kWaitReply;
          return;
        case OpKind::kAdd:
          send(i, c.add_req);
          c.await = Await::kAddReply;
          return;
      }
    }
    c.await = Await::kNothing;
    ready_.push_back(i);
  }

  // Sends req after whatever is queued.
  void send(size_t i, const std::string& req) {
    Conn& c = conns_[i];
    if (!c.out.empty()) {
      c.out += req;
      return;
    }
    size_t sent = 0;
    while (sent < req.size()) {
      ssize_t n = ::send(
          c.fd.get(), req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        throw NetworkError(errno_text("send", errno));
      }
    }
    if (sent < req.size()) {
      c.out.assign(req, sent);
      watch_writable(i, true);
    }
  }

  void watch_writable(size_t i, bool on) {
    Conn& c = conns_[i];
    if (c.want_out == on) {
      return;
    }
    c.want_out = on;
    epoll_event ev{
        .events = EPOLLIN | (on ? EPOLLOUT : 0u), .data = {.u64 = i}};
    if (::epoll_ctl(ep_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) != 0) {
      throw NetworkError(errno_text("epoll_ctl", errno));
    }
  }

  void on_writable(size_t i) {
    Conn& c = conns_[i];
    std::string rest = std::move(c.out);
    c.out.clear();
    send(i, rest);
    if (!c.out.empty()) {
      return;
    }
    watch_writable(i, false);
    if (c.await == Await::kSetFlushed) {
      count_op();
      c.await = Await::kNothing;
      ready_.push_back(i);
    }
  }

  void on_readable(size_t i) {
    Conn& c = conns_[i];
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        if (static_cast<size_t>(n) < sizeof buf) {
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
      throw NetworkError(
          n == 0 ? std::string("the server closed the connection")
                 : errno_text("recv", errno));
    }
    while (take_reply(i)) {
    }
  }

  // Consumes the awaited reply when whole; false when more bytes are needed.
  bool take_reply(size_t i) {
    Conn& c = conns_[i];
    auto u64_at = [&](size_t pos) {
      return store::wire::load<uint64_t>(c.in.data() + pos);
    };
    switch (c.await) {
      case Await::kWaitReply:
        if (c.in.empty()) {
          return false;
        }
        if (c.in[0] != static_cast<char>(store::wire::kStopWaiting)) {
          throw ProtocolError("WAIT answered with something else");
        }
        c.in.erase(0, 1);
        send(i, c.get_req);
        c.await = Await::kGetReply;
        last_progress_ = Clock::now();
        return true;
      case Await::kGetReply: {
        if (c.in.size() < 8 || c.in.size() < 8 + u64_at(0)) {
          return false;
        }
        if (u64_at(0) != kValueBytes) {
          throw ProtocolError("GET returned a value of another size");
        }
        c.in.erase(0, 8 + kValueBytes);
        break;
      }
      case Await::kAddReply:
        if (c.in.size() < 8) {
          return false;
        }
        c.in.erase(0, 8);
        break;
      case Await::kCheckReply:
        if (c.in.empty()) {
          return false;
        }
        c.in.erase(0, 1);
        c.await = Await::kDone;
        ++done_;
        last_progress_ = Clock::now();
        return true;
      case Await::kNothing:
      case Await::kSetFlushed:
      case Await::kDone:
        if (!c.in.empty()) {
          throw ProtocolError("the server sent bytes nobody asked for");
        }
        return false;
    }
    count_op();
    c.await = Await::kNothing;
    ready_.push_back(i);
    return true;
  }

  const CellConfig& cfg_;
  const uint16_t port_;
  const int first_;
  CellState& state_;
  Fd ep_;
  std::vector<Conn> conns_;
  // Connections whose next op may go out.
  std::vector<size_t> ready_;
  bool draining_ = false;
  size_t done_ = 0;
  uint64_t ops_ = 0;
  Clock::time_point last_progress_;
};

}  // namespace

void run_epoll_worker(
    const CellConfig& cfg,
    uint16_t port,
    int first,
    int count,
    CellState& state,
    WorkerSlot& slot) {
  bool arrived = false;
  try {
    EpollWorker w(cfg, port, first, count, state);
    w.connect_all();
    arrived = true;
    state.arrive();
    if (state.await_start(cfg.op_timeout)) {
      uint64_t ops = w.run();
      if (state.phase() == kStop) {
        slot.synced = Clock::now();
        slot.ops = ops;
      }
    }
  } catch (const std::exception& e) {
    slot.failed_clients = count;
    slot.error = e.what();
  }
  if (!arrived) {
    state.arrive();
  }
  state.finish();
}

}  // namespace tide::bench::detail
