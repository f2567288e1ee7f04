#include "tide/store/mux_store.h"

#include <condition_variable>
#include <mutex>

#include "tide/common/error.h"

#include "store/keys.h"
#include "store/kv_map.h"
#include "store/mux_connection.h"

namespace tide::store {

namespace {

using wire::Op;

// How long past a WAIT's own bound its reply may take before the
// connection is taken for dead.
constexpr milliseconds kWaitGrace{5'000};

std::vector<std::string> slashed(const std::vector<std::string>& keys) {
  return detail::with_prefix("/", keys);
}

// Sends reqs in one write and waits for every reply (its WAITs bounded by
// wait_ms); throws the first error, or TimeoutError without a reply within
// timeout.
std::vector<wire::Reply> call_all(
    detail::MuxConnection& conn,
    const std::vector<wire::Request>& reqs,
    milliseconds timeout,
    uint64_t wait_ms = 0) {
  struct Replies {
    std::mutex mutex;
    std::condition_variable cv;
    std::vector<wire::Reply> replies;
    size_t left = 0;
    std::exception_ptr error;
  };
  auto r = std::make_shared<Replies>();
  r->replies.resize(reqs.size());
  r->left = reqs.size();
  std::vector<detail::MuxConnection::Submission> all;
  bool waits = false;
  for (size_t i = 0; i < reqs.size(); ++i) {
    waits = waits || reqs[i].op == Op::kWait;
    all.push_back(
        {reqs[i],
         reqs[i].op == Op::kWait ? wait_ms : 0,
         [r, i](std::exception_ptr error, wire::Reply& reply) {
           std::lock_guard lock(r->mutex);
           if (error && !r->error) {
             r->error = error;
           }
           r->replies[i] = std::move(reply);
           if (--r->left == 0) {
             r->cv.notify_all();
           }
         }});
  }
  auto start = Clock::now();
  conn.submit_all(std::move(all), start + timeout);
  auto bound = timeout + (waits ? kWaitGrace : milliseconds(0));
  std::unique_lock lock(r->mutex);
  if (!r->cv.wait_for(lock, bound, [&] { return r->left == 0; })) {
    lock.unlock();
    std::string why = std::string(wire::op_name(reqs.front().op)) +
                      (reqs.size() > 1 ? " and others" : "") +
                      ": no reply from the store at " + conn.where() +
                      " within " + std::to_string(bound.count()) + " ms";
    // A server silent the whole time is taken for gone: the connection is
    // dropped (failing the calls in flight) and the next call reconnects.
    // One that answered others meanwhile is only slow: the others keep the
    // connection, and this call's late reply is dropped when it comes.
    if (conn.last_heard() < start) {
      conn.reset(why);
    }
    throw TimeoutError(why);
  }
  if (r->error) {
    std::rethrow_exception(r->error);
  }
  return std::move(r->replies);
}

wire::Reply call(
    detail::MuxConnection& conn,
    wire::Request req,
    milliseconds timeout,
    uint64_t wait_ms = 0) {
  std::vector<wire::Request> one;
  one.push_back(std::move(req));
  return std::move(call_all(conn, one, timeout, wait_ms).front());
}

}  // namespace

MuxStore::MuxStore(MuxStoreOptions options)
    : Store(options.timeout),
      conn_(std::make_shared<detail::MuxConnection>(detail::MuxEndpoint{
          .host = options.host,
          .port = options.port,
          .token = options.token,
          .connect_timeout = options.timeout})) {
  conn_->connect();
}

MuxStore::MuxStore(
    std::shared_ptr<detail::MuxConnection> conn, milliseconds timeout)
    : Store(timeout), conn_(std::move(conn)) {}

MuxStore::~MuxStore() = default;

std::shared_ptr<MuxStore> MuxStore::with_timeout(milliseconds timeout) const {
  return std::shared_ptr<MuxStore>(new MuxStore(conn_, timeout));
}

void MuxStore::set(std::string_view key, std::string_view value) {
  conn_->submit(
      {.op = Op::kSet,
       .keys = {detail::with_prefix("/", key)},
       .values = {std::string(value)}},
      0,
      nullptr,
      Clock::now() + timeout());
}

std::string MuxStore::get(std::string_view key) {
  wait({std::string(key)}, timeout());
  auto r = call(
      *conn_,
      {.op = Op::kGet, .keys = {detail::with_prefix("/", key)}},
      timeout());
  return std::move(r.values.at(0));
}

int64_t MuxStore::add(std::string_view key, int64_t delta) {
  return call(
             *conn_,
             {.op = Op::kAdd,
              .keys = {detail::with_prefix("/", key)},
              .delta = delta},
             timeout())
      .number;
}

std::string MuxStore::compare_set(
    std::string_view key, std::string_view expected, std::string_view desired) {
  auto r = call(
      *conn_,
      {.op = Op::kCompareSet,
       .keys = {detail::with_prefix("/", key)},
       .values = {std::string(expected), std::string(desired)}},
      timeout());
  return std::move(r.values.at(0));
}

bool MuxStore::check(const std::vector<std::string>& keys) {
  return call(*conn_, {.op = Op::kCheck, .keys = slashed(keys)}, timeout())
             .byte == wire::kCheckReady;
}

void MuxStore::wait(
    const std::vector<std::string>& keys, milliseconds timeout) {
  auto wait_ms = static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 1));
  auto r =
      call(*conn_, {.op = Op::kWait, .keys = slashed(keys)}, timeout, wait_ms);
  if (r.byte == wire::kStopWaiting) {
    return;
  }
  if (r.byte != wire::kWaitTimedOut) {
    throw ProtocolError(
        "wait: the store at " + conn_->where() + " answered " +
        std::to_string(r.byte));
  }
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (missing.size() < 100 && (keys.size() == 1 || !check({k}))) {
      missing.push_back(k);
    }
  }
  detail::throw_wait_timeout("wait", timeout, missing);
}

bool MuxStore::delete_key(std::string_view key) {
  return call(
             *conn_,
             {.op = Op::kDeleteKey, .keys = {detail::with_prefix("/", key)}},
             timeout())
             .number != 0;
}

int64_t MuxStore::num_keys() {
  return call(*conn_, {.op = Op::kNumKeys}, timeout()).number;
}

void MuxStore::append(std::string_view key, std::string_view value) {
  conn_->submit(
      {.op = Op::kAppend,
       .keys = {detail::with_prefix("/", key)},
       .values = {std::string(value)}},
      0,
      nullptr,
      Clock::now() + timeout());
}

std::vector<std::string> MuxStore::multi_get(
    const std::vector<std::string>& keys) {
  wait(keys, timeout());
  return call(*conn_, {.op = Op::kMultiGet, .keys = slashed(keys)}, timeout())
      .values;
}

void MuxStore::set_many(
    const std::vector<std::string>& keys,
    const std::vector<std::string>& values) {
  conn_->submit(
      {.op = Op::kMultiSet, .keys = slashed(keys), .values = values},
      0,
      nullptr,
      Clock::now() + timeout());
}

size_t MuxStore::Batch::add(std::string_view key, int64_t delta) {
  calls_.push_back({.add = true, .key = std::string(key), .delta = delta});
  return calls_.size() - 1;
}

size_t MuxStore::Batch::compare_set(
    std::string_view key, std::string_view expected, std::string_view desired) {
  calls_.push_back(
      {.key = std::string(key),
       .expected = std::string(expected),
       .desired = std::string(desired)});
  return calls_.size() - 1;
}

void MuxStore::Batch::run() {
  std::vector<wire::Request> reqs;
  for (const Call& c : calls_) {
    wire::Request req{
        .op = c.add ? Op::kAdd : Op::kCompareSet,
        .keys = {detail::with_prefix("/", c.key)},
        .delta = c.delta};
    if (!c.add) {
      req.values = {c.expected, c.desired};
    }
    reqs.push_back(std::move(req));
  }
  results_.clear();
  if (reqs.empty()) {
    return;
  }
  for (wire::Reply& r : call_all(*store_.conn_, reqs, store_.timeout())) {
    results_.push_back(
        {.number = r.number,
         .value = r.values.empty() ? std::string() : std::move(r.values[0])});
  }
}

void MuxStore::wait_async(
    const std::vector<std::string>& keys,
    milliseconds bound,
    std::function<void(WaitEnd)> done) {
  auto wait_ms = static_cast<uint64_t>(std::max<int64_t>(bound.count(), 1));
  conn_->submit(
      {.op = Op::kWait, .keys = slashed(keys)},
      wait_ms,
      [done = std::move(done)](std::exception_ptr error, wire::Reply& r) {
        done(
            error                           ? WaitEnd::kFailed
            : r.byte == wire::kStopWaiting  ? WaitEnd::kMet
            : r.byte == wire::kWaitTimedOut ? WaitEnd::kTimedOut
                                            : WaitEnd::kFailed);
      },
      Clock::now() + timeout());
}

void MuxStore::ping() {
  auto nonce = static_cast<uint32_t>(::getpid());
  if (call(*conn_, {.op = Op::kPing, .number = nonce}, timeout()).number !=
      nonce) {
    throw ProtocolError(
        "ping: the store at " + conn_->where() + " answered a wrong nonce");
  }
}

}  // namespace tide::store
