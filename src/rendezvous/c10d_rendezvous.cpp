// The "c10d" backend: the dynamic rendezvous over a tide Store. One agent
// hosts a store server at --rdzv-endpoint; every agent is a client of it,
// over one connection (a MuxStore) that its rendezvous, keep-alive and
// status records share.

#include <ifaddrs.h>
#include <netdb.h>
#include <unistd.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "tide/common/host.h"
#include "tide/common/logging.h"
#include "tide/rendezvous/dynamic_rendezvous.h"
#include "tide/store/mux_store.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"

#include "net/address.h"
#include "rendezvous/conf_keys.h"
#include "rendezvous/store_keys.h"

namespace tide::rendezvous {

namespace {

using Clock = std::chrono::steady_clock;

// The c10d store is always a tide server (an agent hosts it, or tide-store).
// Outside tools (open_c10d_job_store) speak the modern dialect to it, which
// cancels a wait that times out instead of reconnecting.
constexpr store::Dialect kDialect = store::Dialect::kModern;

// key's value, or nullopt when it is not set (never waits). One request,
// where check-then-get takes three (CHECK, and get's WAIT and GET): a
// compare-and-set whose expected and desired value are one text no record
// holds writes nothing, and returns the value when the key is set and the
// expected text when it is not (torch's rule for an absent key). The
// keep-alive reads the job record this way every interval.
std::optional<std::string> value_if_set(
    store::Store& s, const std::string& key) {
  std::string v = s.compare_set(key, kAbsent, kAbsent);
  if (v == kAbsent) {
    return std::nullopt;
  }
  return v;
}

// Arrivals of round r. Reads without creating the counter: the counter's
// existence is what waiters for a round's first arrival wait for.
int64_t count(store::Store& s, const StoreKeys& keys, int64_t r) {
  auto n = value_if_set(s, keys.count(r));
  return n ? std::stoll(*n) : 0;
}

// store.wait with a timeout, as a bool.
bool wait_for(
    store::Store& s,
    const std::vector<std::string>& keys,
    milliseconds timeout) {
  try {
    s.wait(keys, timeout);
    return true;
  } catch (const TimeoutError&) {
    return false;
  }
}
bool wait_for(store::Store& s, const std::string& key, milliseconds timeout) {
  return wait_for(s, std::vector<std::string>{key}, timeout);
}

// The keep-alive's client, shared by the monitors of successive rounds (and
// with keep-alive threads that outlive their handler). It is made on first
// use, by the keep-alive thread, so that a failed connect counts as a missed
// keep-alive rather than failing the round; and it is kept, because
// thousands of agents reconnecting the moment a round completes overflow
// the store host's accept queue. (tiderun's is a handle on the agent's one
// connection, which its MuxStore reconnects when lost.)
class KeepAliveConnection {
 public:
  explicit KeepAliveConnection(
      std::function<std::shared_ptr<store::Store>()> connect)
      : connect_(std::move(connect)) {}

  std::shared_ptr<store::Store> get() {
    std::lock_guard lock(mutex_);
    if (!store_) {
      store_ = connect_();
    }
    return store_;
  }

 private:
  std::function<std::shared_ptr<store::Store>()> connect_;
  std::mutex mutex_;
  std::shared_ptr<store::Store> store_;
};

class StoreRoundMonitor final : public RoundMonitor {
 public:
  StoreRoundMonitor(
      std::shared_ptr<KeepAliveConnection> conn,
      StoreKeys keys,
      int64_t round,
      int64_t index,
      milliseconds lost_after)
      : conn_(std::move(conn)),
        keys_(std::move(keys)),
        round_(round),
        index_(index),
        lost_after_(lost_after) {}

  void beat() override {
    store().add(keys_.heartbeat(round_, index_), 1);
  }

  bool alive(int64_t index) override {
    auto asked = Clock::now();
    return seen(index, store().add(keys_.heartbeat(round_, index), 0), asked);
  }

  bool has_left(int64_t index) override {
    return store().check({keys_.left(round_, index)});
  }

  std::optional<std::string> state() override {
    return value_if_set(store(), keys_.state());
  }

  Tick tick(int64_t peer) override {
    store::MuxStore* mux = shared();
    if (mux == nullptr) {
      return RoundMonitor::tick(peer);
    }
    // One write, one reply packet: the three requests of an interval.
    auto batch = mux->batch();
    batch.add(keys_.heartbeat(round_, index_), 1);
    size_t state = batch.compare_set(keys_.state(), kAbsent, kAbsent);
    size_t beats = peer > 0 ? batch.add(keys_.heartbeat(round_, peer), 0) : 0;
    auto asked = Clock::now();
    batch.run();
    Tick t;
    if (batch.value(state) != kAbsent) {
      t.state = batch.value(state);
    }
    if (peer > 0) {
      t.peer_alive = seen(peer, batch.number(beats), asked);
    }
    return t;
  }

  int64_t wait_next_round(milliseconds timeout) override {
    // The counter appears with the first arrival's add().
    store::MuxStore* mux = shared();
    if (mux == nullptr) {
      if (!wait_for(store(), keys_.count(round_ + 1), timeout)) {
        return 0;
      }
      return count(store(), keys_, round_ + 1);
    }
    // On a shared connection the wait stays at the store across calls
    // (intervals) rather than ending and being asked again at each.
    if (!next_ || next_->ended) {
      auto next = std::make_shared<NextRound>();
      mux->wait_async(
          {keys_.count(round_ + 1)},
          kNextRoundWait,
          [next](store::MuxStore::WaitEnd end) {
            std::lock_guard lock(next->mutex);
            next->ended = true;
            next->end = end;
            next->cv.notify_all();
          });
      next_ = std::move(next);
    }
    std::unique_lock lock(next_->mutex);
    if (!next_->cv.wait_for(lock, timeout, [&] { return next_->ended; }) ||
        next_->end == store::MuxStore::WaitEnd::kTimedOut) {
      return 0;
    }
    if (next_->end == store::MuxStore::WaitEnd::kFailed) {
      throw NetworkError(
          "the wait for round " + std::to_string(round_ + 1) +
          " failed: the connection to the store was lost");
    }
    lock.unlock();
    return count(store(), keys_, round_ + 1);
  }

 private:
  struct Seen {
    int64_t beats;
    Clock::time_point at;
  };
  // The next round's wait in flight.
  struct NextRound {
    std::mutex mutex;
    std::condition_variable cv;
    bool ended = false;
    store::MuxStore::WaitEnd end{};
  };
  // How long one wait for the next round stays at the store (asked again
  // when it ends).
  static constexpr milliseconds kNextRoundWait{60'000};

  // Whether index, whose heartbeat counter read `beats` when asked at
  // `asked`, is alive. Clock-free: a counter seen to move is alive; one
  // standing still for lost_after (on this node's clock) is not. The times
  // are those of the asking, which the keep-alive's intervals space evenly
  // (the replies' times vary with the store's load): a counter unchanged
  // over keep_alive_max_attempt intervals is lost at that interval, not
  // one later.
  bool seen(int64_t index, int64_t beats, Clock::time_point asked) {
    auto [it, fresh] = seen_.try_emplace(index, Seen{beats, asked});
    if (fresh || it->second.beats != beats) {
      it->second = Seen{beats, asked};
      return true;
    }
    return asked - it->second.at < lost_after_;
  }

  // The connection lives as long as conn_, which this monitor holds.
  store::Store& store() {
    return *conn_->get();
  }
  // The store as a connection shared with tagged frames (tiderun's), or
  // null (a plain TcpStore): what batches and waits that hold no thread
  // need.
  store::MuxStore* shared() {
    return dynamic_cast<store::MuxStore*>(&store());
  }

  std::shared_ptr<KeepAliveConnection> conn_;
  StoreKeys keys_;
  int64_t round_;
  int64_t index_;
  milliseconds lost_after_;
  std::map<int64_t, Seen> seen_;
  std::shared_ptr<NextRound> next_;
};

class StoreBackend final : public RendezvousBackend {
 public:
  StoreBackend(
      std::shared_ptr<store::Store> store,
      std::function<std::shared_ptr<store::Store>()> connect,
      const std::string& run_id,
      std::shared_ptr<store::TcpStoreServer> hosted)
      : store_(std::move(store)),
        connect_(connect),
        keepalive_(std::make_shared<KeepAliveConnection>(std::move(connect))),
        keys_(run_id),
        run_id_(run_id),
        hosted_(std::move(hosted)) {}

  std::optional<std::string> get_state() override {
    return value_if_set(*store_, keys_.state());
  }

  std::string compare_set_state(
      const std::optional<std::string>& expected,
      const std::string& desired) override {
    // Store::compare_set: an empty expected value means "absent"; a record
    // is never empty.
    return store_->compare_set(
        keys_.state(), expected.value_or(std::string()), desired);
  }

  int64_t join(int64_t round, const std::string& node) override {
    int64_t i = store_->add(keys_.count(round), 1);
    store_->set(keys_.node(round, i), node);
    return i;
  }

  std::optional<std::vector<std::string>> participants(
      int64_t round, int64_t count, milliseconds timeout) override {
    std::vector<std::string> keys;
    for (int64_t i = 1; i <= count; ++i) {
      keys.push_back(keys_.node(round, i));
    }
    if (!wait_for(*store_, keys, timeout)) {
      return std::nullopt;
    }
    return store_->multi_get(keys);
  }

  int64_t arrivals(int64_t round) override {
    return count(*store_, keys_, round);
  }

  std::string set_once(
      int64_t round,
      const std::string& name,
      const std::string& value) override {
    return store_->compare_set(keys_.value(round, name), "", value);
  }

  std::optional<std::string> get_value(
      int64_t round, const std::string& name) override {
    return value_if_set(*store_, keys_.value(round, name));
  }

  std::optional<std::string> wait_value(
      int64_t round, const std::string& name, milliseconds timeout) override {
    std::string key = keys_.value(round, name);
    if (!wait_for(*store_, key, timeout)) {
      return std::nullopt;
    }
    return store_->get(key);
  }

  void set_timeout(milliseconds timeout) override {
    store_->set_timeout(std::min(store_->timeout(), timeout));
  }

  void leave(
      int64_t round,
      int64_t index,
      int64_t size,
      const DynamicRendezvousSettings& s) override {
    store_->set(keys_.left(round, index), "1");
    if (store_->add(keys_.round(round, "left_count"), 1) >= size) {
      store_->set(keys_.round(round, "all_left"), "1");
    }
    if (hosted_ && s.close_timeout.count() > 0 &&
        !wait_for(*store_, keys_.round(round, "all_left"), s.close_timeout)) {
      TIDE_LOG_WARN(
          "[rendezvous {}] not every node left round {} within "
          "close_timeout ({} ms); stopping the c10d store anyway",
          run_id_,
          round,
          s.close_timeout.count());
    }
  }

  std::unique_ptr<RoundMonitor> monitor(
      int64_t round,
      int64_t index,
      const DynamicRendezvousSettings& s) override {
    return std::make_unique<StoreRoundMonitor>(
        keepalive_, keys_, round, index, s.lost_after());
  }

  std::shared_ptr<store::Store> round_store(int64_t round) override {
    return std::make_shared<store::PrefixStore>(
        keys_.round(round, "agents"), store_);
  }

  std::shared_ptr<store::Store> open_job_store() override {
    return std::make_shared<store::PrefixStore>(keys_.status(), connect_());
  }

 private:
  std::shared_ptr<store::Store> store_;
  const std::function<std::shared_ptr<store::Store>()> connect_;
  std::shared_ptr<KeepAliveConnection> keepalive_;
  StoreKeys keys_;
  std::string run_id_;
  // The store's server when this agent hosts it: it outlives the last
  // request of this backend (members are destroyed in reverse order).
  std::shared_ptr<store::TcpStoreServer> hosted_;
};

// Whether host names this machine (torch's _matches_machine_hostname):
// loopback, the host name, its FQDN, or an address of a local interface.
bool is_this_machine(const std::string& host) {
  if (host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1") {
    return true;
  }
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && host == name) {
    return true;
  }
  if (host == fqdn()) {
    return true;
  }
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) {
    return false;
  }
  bool found = false;
  for (ifaddrs* i = ifs; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_addr->sa_family != AF_INET &&
                                   i->ifa_addr->sa_family != AF_INET6)) {
      continue;
    }
    char text[NI_MAXHOST] = {};
    socklen_t len = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in)
                                                      : sizeof(sockaddr_in6);
    if (::getnameinfo(
            i->ifa_addr, len, text, sizeof text, nullptr, 0, NI_NUMERICHOST) ==
        0) {
      found = host == text;
    }
  }
  ::freeifaddrs(ifs);
  return found;
}

}  // namespace

std::unique_ptr<RendezvousBackend> make_store_backend(
    std::shared_ptr<store::Store> store,
    std::function<std::shared_ptr<store::Store>()> connect,
    const std::string& run_id,
    std::shared_ptr<store::TcpStoreServer> hosted) {
  return std::make_unique<StoreBackend>(
      std::move(store), std::move(connect), run_id, std::move(hosted));
}

std::unique_ptr<RendezvousHandler> make_c10d_handler(
    const RendezvousParameters& params) {
  warn_unknown_conf_keys(params, dynamic_conf_keys({"is_host"}));
  DynamicRendezvousSettings settings = DynamicRendezvousSettings::from(params);
  if (params.endpoint.empty()) {
    throw InvalidArgument(
        "the c10d rendezvous needs --rdzv-endpoint=HOST[:PORT] (the agent on "
        "HOST hosts the store)");
  }
  auto [host, port] = net::parse_host_port(params.endpoint, 29400);
  auto read_timeout =
      params.get_as_seconds("read_timeout", std::chrono::seconds(60));
  bool inferred = params.config.find("is_host") == params.config.end();
  bool is_host =
      inferred ? is_this_machine(host) : params.get_as_bool("is_host", false);

  std::shared_ptr<store::TcpStoreServer> hosted;
  if (is_host) {
    store::TcpStoreServerOptions so{
        .host = host, .port = port, .token = params.token};
    if (host.rfind("127.", 0) != 0 && host != "localhost" && host != "::1") {
      so.host = "0.0.0.0";  // reachable from the other hosts
    }
    try {
      hosted = store::TcpStoreServer::start(so);
      port = hosted->port();
      TIDE_LOG_INFO(
          "[rendezvous {}] this agent hosts the c10d store on port {}",
          params.run_id,
          port);
    } catch (const NetworkError& e) {
      if (!inferred) {
        throw RendezvousConnectionError(
            "is_host=true but the c10d store cannot listen on " +
            params.endpoint + ": " + e.what());
      }
      // Another agent on this machine hosts it already.
      TIDE_LOG_WARN(
          "[rendezvous {}] cannot host the c10d store at {} ({}); assuming "
          "another agent on this machine hosts it and connecting to it "
          "(give is_host=true or false to decide)",
          params.run_id,
          params.endpoint,
          e.what());
    }
  }
  // One connection per agent: the rendezvous, its keep-alive and the job's
  // status records share it, each with its own timeout (the keep-alive's
  // calls give up within one interval, so a lost host is seen within
  // lost_after).
  std::shared_ptr<store::MuxStore> main;
  try {
    main = std::make_shared<store::MuxStore>(store::MuxStoreOptions{
        .host = hosted ? "127.0.0.1" : host,
        .port = port,
        .token = params.token,
        .timeout = read_timeout});
  } catch (const Error& e) {
    throw RendezvousConnectionError(
        "cannot reach the c10d rendezvous store at " + params.endpoint + ": " +
        e.what());
  }
  auto connect = [main, interval = settings.keep_alive_interval] {
    return main->with_timeout(interval);
  };
  std::string addr = params.local_addr.empty() ? fqdn() : params.local_addr;
  return std::make_unique<DynamicRendezvousHandler>(
      "c10d",
      make_store_backend(main, connect, params.run_id, std::move(hosted)),
      settings,
      NodeDesc::make(addr));
}

std::shared_ptr<store::Store> open_c10d_job_store(
    const RendezvousParameters& params, milliseconds timeout) {
  if (params.endpoint.empty()) {
    throw InvalidArgument(
        "the c10d job store needs --rdzv-endpoint=HOST[:PORT], the "
        "endpoint the job's agents were given");
  }
  auto [host, port] = net::parse_host_port(params.endpoint, 29400);
  auto store = std::make_shared<store::TcpStore>(store::TcpStoreOptions{
      .host = host,
      .port = port,
      .dialect = kDialect,
      .token = params.token,
      .timeout = timeout});
  return std::make_shared<store::PrefixStore>(
      StoreKeys(params.run_id).status(), std::move(store));
}

}  // namespace tide::rendezvous
