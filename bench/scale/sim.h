#pragma once

#include <netinet/in.h>

#include <chrono>
#include <coroutine>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tide/common/fd.h"

#include "store/wire.h"

// Simulated store clients for the scale benches: many connections driven by
// one epoll loop per thread, each client a C++20 coroutine that sends exactly
// the requests tide's TcpStore client sends, in the same order. A coroutine
// reads like the blocking code it simulates:
//
//   Co<void> client(Conn& c) {
//     co_await c.connect();
//     int64_t n = co_await c.add("count", 1);
//     ...
//   }
//
// Nothing here is thread safe: a Loop, its Conns and its coroutines belong to
// one thread.
//
// GCC 12 miscompiles co_await inside a condition (`if (co_await f())`), a
// `co_return co_await`, or next to a braced list: the coroutines here
// co_await only as a statement or to initialise a variable.
namespace tide::bench::sim {

// ---------------------------------------------------------------------------
// Coroutines.

class PromiseBase {
 public:
  struct Final {
    bool await_ready() noexcept {
      return false;
    }
    template <typename P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      return h.promise().continuation;
    }
    void await_resume() noexcept {}
  };
  std::suspend_always initial_suspend() noexcept {
    return {};
  }
  Final final_suspend() noexcept {
    return {};
  }
  void unhandled_exception() {
    error = std::current_exception();
  }

  std::coroutine_handle<> continuation = std::noop_coroutine();
  std::exception_ptr error;
};

template <typename T>
struct Promise : PromiseBase {
  void return_value(T v) {
    value.emplace(std::move(v));
  }
  T take() {
    if (error) {
      std::rethrow_exception(error);
    }
    return std::move(*value);
  }
  std::optional<T> value;
};

template <>
struct Promise<void> : PromiseBase {
  void return_void() {}
  void take() {
    if (error) {
      std::rethrow_exception(error);
    }
  }
};

// A coroutine that starts when awaited and resumes its awaiter when it ends
// (its result or its exception).
template <typename T = void>
class [[nodiscard]] Co {
 public:
  struct promise_type : Promise<T> {  // NOLINT(readability-identifier-naming)
    Co get_return_object() {
      return Co(std::coroutine_handle<promise_type>::from_promise(*this));
    }
  };

  Co(Co&& other) noexcept : h_(std::exchange(other.h_, {})) {}
  Co& operator=(Co&&) = delete;
  ~Co() {
    if (h_) {
      h_.destroy();
    }
  }

  bool await_ready() const noexcept {
    return false;
  }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> caller) {
    h_.promise().continuation = caller;
    return h_;
  }
  T await_resume() {
    return h_.promise().take();
  }

 private:
  explicit Co(std::coroutine_handle<promise_type> h) : h_(h) {}
  std::coroutine_handle<promise_type> h_;
};

// ---------------------------------------------------------------------------
// The loop.

// Something registered with the loop's epoll.
class IoHandler {
 public:
  virtual ~IoHandler() = default;
  virtual void on_io(uint32_t events) = 0;
};

class Loop {
 public:
  using TimerId = std::pair<int64_t, uint64_t>;

  Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Starts co now (it runs until its first suspension); `done` gets its
  // exception, or null, when it ends.
  void spawn(Co<void> co, std::function<void(std::exception_ptr)> done = {});
  // Runs until no spawned coroutine is left (true), the deadline (mono_ns
  // clock) passes or `stop()` is called (false). Throws Interrupted.
  bool run(int64_t deadline_ns);
  void stop() {
    stopped_ = true;
  }
  size_t live() const {
    return live_;
  }
  // From now on Conn::connect() throws: coroutines that the closing of
  // their connections resumes end instead of connecting again.
  void begin_teardown() {
    tearing_down_ = true;
  }
  bool tearing_down() const {
    return tearing_down_;
  }

  // Resumes h from the loop's top, soon: a Conn never resumes a coroutine
  // from inside its own methods, since the coroutine may end and destroy
  // the Conn it owns.
  void post(std::coroutine_handle<> h) {
    ready_.push_back(h);
  }

  // fn runs on the loop at `at_ns` (mono_ns clock) unless cancelled first.
  TimerId at(int64_t at_ns, std::function<void()> fn);
  void cancel(const TimerId& id);

  // co_await loop.sleep_until(t): resumes at t (mono_ns clock).
  auto sleep_until(int64_t at_ns) {
    struct Awaiter {
      Loop& loop;
      int64_t at;
      bool await_ready() const noexcept {
        return false;
      }
      void await_suspend(std::coroutine_handle<> h) {
        loop.at(at, [h] { h.resume(); });
      }
      void await_resume() const noexcept {}
    };
    return Awaiter{*this, at_ns};
  }

  // Registers fd for handler, edge-triggered for reading and writing.
  // Closing fd removes it.
  void watch(int fd, IoHandler* handler);

  // Bounds how many connects of this loop are in flight (SYN sent, not yet
  // established): a client acquires a slot before connect() and releases it
  // once connected or failed.
  void set_connect_window(size_t n) {
    connect_window_ = n;
  }
  auto connect_slot() {
    struct Awaiter {
      Loop& loop;
      bool await_ready() const noexcept {
        if (loop.connecting_ < loop.connect_window_) {
          ++loop.connecting_;
          return true;
        }
        return false;
      }
      void await_suspend(std::coroutine_handle<> h) {
        loop.connect_queue_.push_back(h);
      }
      void await_resume() const noexcept {}
    };
    return Awaiter{*this};
  }
  void release_connect_slot();

 private:
  Fd ep_;
  size_t live_ = 0;
  bool stopped_ = false;
  bool tearing_down_ = false;
  uint64_t next_timer_ = 0;
  std::map<TimerId, std::function<void()>> timers_;
  std::deque<std::coroutine_handle<>> ready_;
  size_t connect_window_ = SIZE_MAX;
  size_t connecting_ = 0;
  std::deque<std::coroutine_handle<>> connect_queue_;
};

// ---------------------------------------------------------------------------
// A store client connection.

struct ConnOptions {
  // The server: 127.0.0.1 unless told (host byte order).
  uint32_t host = INADDR_LOOPBACK;
  uint16_t port = 0;
  // Source address (127.x.y.z, host byte order); 0: the kernel's choice.
  uint32_t source = 0;
  store::Dialect dialect = store::Dialect::kModern;
  // tide's tagged frames (modern dialect, a tide server), as MuxStore
  // sends them: every request in a frame of its own tag, replies matched by
  // tag, a WAIT bounded by the server (no CANCEL_WAIT); many coroutines
  // share the connection with their requests in flight at once.
  bool tagged = false;
  std::string token;
  // How long connect() keeps trying (the server's backlog may be full).
  int64_t connect_timeout_ns = 60'000'000'000;
};

// 127.B.C.D for the i-th block of `per_address` clients, from 127.1.0.1, so
// no source address runs out of ephemeral ports.
uint32_t source_address(size_t client, size_t per_address);

// What a client sent and received.
struct ConnStats {
  uint64_t requests = 0;
  uint64_t bytes_out = 0;
  uint64_t bytes_in = 0;
};

// One TcpStore client on a loop. Requests go out in order and replies come
// back in order; the awaiting coroutine resumes when its reply is whole.
// Like TcpStore, it (re)connects on the first request after connect() or a
// failure, and a failure (the server closed the connection, a protocol
// error) fails every pending request and closes it. The Conn must outlive
// the coroutines that use it.
class Conn final : public IoHandler {
 public:
  Conn(Loop& loop, ConnOptions options);
  ~Conn() override;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Connects (within connect_timeout_ns, retrying refused and unanswered
  // connects as TcpStore does) and runs the handshake (AUTH with the token;
  // VALIDATE and PING in the modern dialect). Throws NetworkError.
  Co<void> connect();
  bool connected() const {
    return fd_.get() >= 0 && ready_;
  }
  // Closes the connection; pending requests fail.
  void close();

  // TcpStore's calls, with keys as the caller gives them (the "/" prefix is
  // added here, as TcpStore does).
  Co<void> set(std::string key, std::string value);
  Co<int64_t> add(std::string key, int64_t delta);
  Co<std::string> get(std::string key);
  Co<bool> check(std::vector<std::string> keys);
  Co<std::string> compare_set(
      std::string key, std::string expected, std::string desired);
  // True once every key is set; false after timeout_ns (then CANCEL_WAIT in
  // the modern dialect, a dropped connection in the legacy one, as TcpStore
  // does).
  Co<bool> wait(std::vector<std::string> keys, int64_t timeout_ns);
  // WAIT then MULTI_GET (modern) or pipelined GETs (legacy), as TcpStore.
  Co<std::vector<std::string>> multi_get(std::vector<std::string> keys);
  Co<int64_t> delete_key(std::string key);
  // ADD_WAIT (a tide server's): the count, and key's value once it exists
  // or at once when the count reached target (Store::add_wait).
  struct Tally {
    int64_t count = 0;
    std::string value;
  };
  Co<Tally> add_wait(
      std::string counter, int64_t delta, int64_t target, std::string key);

  // Tagged mode: ADDs and COMPARE_SETs sent in one write and answered
  // together, as MuxStore::Batch sends them.
  struct Call {
    bool add = false;
    std::string key;
    int64_t delta = 0;
    std::string expected;
    std::string desired;
  };
  struct Result {
    int64_t number = 0;  // an ADD's
    std::string value;   // a COMPARE_SET's
  };
  Co<std::vector<Result>> together(std::vector<Call> calls);

  const ConnStats& stats() const {
    return stats_;
  }

  void on_io(uint32_t events) override;

 private:
  // kCount: an i64, then a value (ADD_WAIT's).
  enum class Reply : uint8_t { kNone, kByte, kU32, kI64, kBytes, kCount };
  struct Pending {
    Reply kind = Reply::kNone;
    // Replies of this kind to collect (pipelined GETs).
    size_t count = 1;
    std::coroutine_handle<> waiter;
    // Filled as replies arrive.
    std::vector<std::string> values;
    int64_t number = 0;
    std::exception_ptr error;
    // A WAIT whose timeout passed: CANCEL_WAIT went out after it.
    bool cancelled = false;
    bool done = false;
    uint64_t tag = 0;  // tagged mode
  };
  struct ReplyAwaiter;
  struct BatchAwaiter;

  // Queues a request and, unless kind is kNone, waits for its reply.
  ReplyAwaiter request(std::string bytes, Reply kind, size_t count = 1);
  Co<void> ensure_connected();
  // A request's first bytes: its code, after a frame header in tagged mode
  // (whose tag the next request() takes); wait_ms bounds a tagged WAIT.
  std::string begin(store::wire::Op op, uint64_t wait_ms = 0);
  void send(std::string_view bytes);
  void flush();
  void fail(std::exception_ptr error);
  // Completes pending replies from in_; false when more bytes are needed.
  bool take_reply();
  // Parses p's reply at the front of `in`; the bytes it took, or 0 when
  // more are needed.
  size_t parse_reply(Pending* p, std::string_view in);
  void on_timeout(Pending* p);

  Loop& loop_;
  ConnOptions options_;
  Fd fd_;
  bool ready_ = false;
  bool connect_ready_ = false;
  std::coroutine_handle<> connect_waiter_;
  std::string out_;
  std::string in_;
  size_t in_pos_ = 0;
  std::deque<Pending*> pending_;
  // Tagged mode: pending_ in sending order, found by tag when replies come.
  std::map<uint64_t, Pending*> by_tag_;
  uint64_t next_tag_ = 1;
  uint64_t last_tag_ = 0;
  ConnStats stats_;
};

// Descriptors a bench process needs beyond its connections.
constexpr uint64_t kSpareFds = 256;
// How long a store server of the bench may take to start listening.
constexpr auto kServerStartTimeout = std::chrono::milliseconds(60'000);

// Raises RLIMIT_NOFILE (soft and, where allowed, hard) towards `want`
// descriptors; children inherit it. Returns the limit reached.
uint64_t raise_fd_limit(uint64_t want);
// Why a cell that needs `need` descriptors cannot run under `have`.
std::string fd_limit_note(uint64_t need, uint64_t have);

}  // namespace tide::bench::sim
