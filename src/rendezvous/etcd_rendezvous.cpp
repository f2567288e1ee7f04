// The "etcd" backend: the dynamic rendezvous over an etcd v3 cluster through
// its JSON gateway. No agent hosts anything, so the job survives any agent;
// liveness is an etcd lease per participant.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <mutex>
#include <string_view>
#include <vector>

#include "tide/common/host.h"
#include "tide/common/logging.h"
#include "tide/etcd/etcd_store.h"
#include "tide/rendezvous/dynamic_rendezvous.h"

#include "etcd/etcd_client.h"
#include "rendezvous/conf_keys.h"

namespace tide::rendezvous {

namespace {

using etcd::EtcdClient;
using etcd::RangeOptions;

// Keys, all under "<etcd_prefix>/<run_id>/":
//   state            the job record (JSON, compare-and-set)
//   r<R>/count       arrival counter: its version is the last index given
//   r<R>/join/<i>    arrival i's descriptor (JSON)
//   r<R>/v/<name>    write-once values: last_call, size, master
//   r<R>/alive/<i>   arrival i's liveness, attached to its lease
//   r<R>/left/<i>    arrival i finished
//   r<R>/agents/...  the round's store for the agents
//   status/...       the agents' status records (status/job_status.h)
class EtcdKeys {
 public:
  EtcdKeys(const std::string& prefix, const std::string& run_id)
      : base_(prefix + "/" + run_id + "/") {}
  std::string state() const {
    return base_ + "state";
  }
  std::string status() const {
    return base_ + "status/";
  }
  std::string round(int64_t r, const std::string& rest) const {
    return base_ + "r" + std::to_string(r) + "/" + rest;
  }
  std::string joins(int64_t r) const {
    return round(r, "join/");
  }

 private:
  std::string base_;
};

// key's value, or nullopt when it is absent.
std::optional<std::string> value_of(EtcdClient& c, const std::string& key) {
  auto kv = c.get(key);
  return kv ? std::optional(std::move(kv->value)) : std::nullopt;
}

// Arrivals of round r so far, and the revision read at.
std::pair<int64_t, int64_t> count_joins(
    EtcdClient& c, const EtcdKeys& keys, int64_t r) {
  auto res = c.range(keys.round(r, "count"));
  return {res.kvs.empty() ? 0 : res.kvs.front().version, res.revision};
}

int64_t wait_joins(
    EtcdClient& c, const EtcdKeys& keys, int64_t r, milliseconds timeout) {
  auto [n, revision] = count_joins(c, keys, r);
  if (n > 0) {
    return n;
  }
  if (!c.watch(keys.round(r, "count"), revision + 1, timeout)) {
    return 0;
  }
  return count_joins(c, keys, r).first;
}

std::optional<std::string> wait_key(
    EtcdClient& c, const std::string& key, milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto res = c.range(key);
    if (!res.kvs.empty()) {
      return res.kvs.front().value;
    }
    auto left = std::chrono::duration_cast<milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left <= milliseconds(0) || !c.watch(key, res.revision + 1, left)) {
      return std::nullopt;
    }
  }
}

class EtcdRoundMonitor final : public RoundMonitor {
 public:
  EtcdRoundMonitor(
      const std::string& endpoints,
      EtcdKeys keys,
      int64_t round,
      int64_t index,
      const DynamicRendezvousSettings& s)
      : client_(endpoints, s.keep_alive_interval),
        keys_(std::move(keys)),
        round_(round),
        index_(index),
        ttl_(std::max<int64_t>(
            2,
            static_cast<int64_t>(std::ceil(s.lost_after().count() / 1000.0)))) {
    grant();
  }

  ~EtcdRoundMonitor() override {
    try {
      client_.lease_revoke(lease_);
    } catch (const Error&) {
      // Expires by itself within its TTL.
    }
  }

  void beat() override {
    if (client_.lease_keepalive(lease_) == 0) {
      grant();  // expired during a long pause: show up again
    }
  }

  bool alive(int64_t index) override {
    return client_.get(alive_key(index)).has_value();
  }

  bool has_left(int64_t index) override {
    return client_.get(keys_.round(round_, "left/" + std::to_string(index)))
        .has_value();
  }

  std::optional<std::string> state() override {
    return value_of(client_, keys_.state());
  }

  int64_t wait_next_round(milliseconds timeout) override {
    return wait_joins(client_, keys_, round_ + 1, timeout);
  }

 private:
  std::string alive_key(int64_t index) const {
    return keys_.round(round_, "alive/" + std::to_string(index));
  }
  void grant() {
    lease_ = client_.lease_grant(std::chrono::seconds(ttl_));
    client_.put(alive_key(index_), "1", lease_);
  }

  EtcdClient client_;
  EtcdKeys keys_;
  int64_t round_;
  int64_t index_;
  int64_t ttl_;
  int64_t lease_ = 0;
};

class EtcdBackend final : public RendezvousBackend {
 public:
  EtcdBackend(
      std::string endpoints,
      const std::string& prefix,
      const std::string& run_id,
      milliseconds timeout)
      : endpoints_(std::move(endpoints)),
        keys_(prefix, run_id),
        timeout_(timeout),
        client_(endpoints_, timeout) {}

  std::optional<std::string> get_state() override {
    std::lock_guard lock(mutex_);
    return value_of(client_, keys_.state());
  }

  std::string compare_set_state(
      const std::optional<std::string>& expected,
      const std::string& desired) override {
    std::lock_guard lock(mutex_);
    auto r = expected ? client_.put_if_value(keys_.state(), *expected, desired)
                      : client_.put_if_mod_revision(keys_.state(), 0, desired);
    if (r.succeeded) {
      return desired;
    }
    return r.current ? r.current->value : std::string();
  }

  int64_t join(int64_t round, const std::string& node) override {
    // The arrival index is the version of the round's counter key after
    // our write; the node's key is for the arrivals count and for people.
    std::lock_guard lock(mutex_);
    int64_t index = client_.increment(keys_.round(round, "count"));
    client_.put(keys_.joins(round) + std::to_string(index), node);
    return index;
  }

  std::optional<std::vector<std::string>> participants(
      int64_t round, int64_t count, milliseconds timeout) override {
    std::lock_guard lock(mutex_);
    const std::string prefix = keys_.joins(round);
    auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto res = client_.range(prefix, RangeOptions{.prefix = true});
      std::vector<std::optional<std::string>> found(static_cast<size_t>(count));
      for (auto& kv : res.kvs) {
        int64_t i = 0;
        std::string_view rest = std::string_view(kv.key).substr(prefix.size());
        auto [end, ec] =
            std::from_chars(rest.data(), rest.data() + rest.size(), i);
        if (ec == std::errc() && end == rest.data() + rest.size() && i >= 1 &&
            i <= count) {
          found[static_cast<size_t>(i - 1)] = std::move(kv.value);
        }
      }
      if (std::all_of(found.begin(), found.end(), [](const auto& f) {
            return f.has_value();
          })) {
        std::vector<std::string> out;
        for (auto& f : found) {
          out.push_back(std::move(*f));
        }
        return out;
      }
      auto left = std::chrono::duration_cast<milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left <= milliseconds(0) ||
          !client_.watch(prefix, res.revision + 1, left, /*prefix=*/true)) {
        return std::nullopt;
      }
    }
  }

  int64_t arrivals(int64_t round) override {
    std::lock_guard lock(mutex_);
    return count_joins(client_, keys_, round).first;
  }

  std::string set_once(
      int64_t round,
      const std::string& name,
      const std::string& value) override {
    std::lock_guard lock(mutex_);
    auto r = client_.put_if_mod_revision(value_key(round, name), 0, value);
    return r.succeeded ? value : r.current->value;
  }

  std::optional<std::string> get_value(
      int64_t round, const std::string& name) override {
    std::lock_guard lock(mutex_);
    return value_of(client_, value_key(round, name));
  }

  std::optional<std::string> wait_value(
      int64_t round, const std::string& name, milliseconds timeout) override {
    std::lock_guard lock(mutex_);
    return wait_key(client_, value_key(round, name), timeout);
  }

  void set_timeout(milliseconds timeout) override {
    std::lock_guard lock(mutex_);
    client_.set_request_timeout(std::min(timeout_, timeout));
  }

  void leave(
      int64_t round,
      int64_t index,
      int64_t /*size*/,
      const DynamicRendezvousSettings& /*s*/) override {
    std::lock_guard lock(mutex_);
    client_.put(keys_.round(round, "left/" + std::to_string(index)), "1");
  }

  std::unique_ptr<RoundMonitor> monitor(
      int64_t round,
      int64_t index,
      const DynamicRendezvousSettings& s) override {
    return std::make_unique<EtcdRoundMonitor>(
        endpoints_, keys_, round, index, s);
  }

  std::shared_ptr<store::Store> round_store(int64_t round) override {
    return std::make_shared<etcd::EtcdStore>(
        endpoints_, keys_.round(round, "agents/"), timeout_);
  }

  std::shared_ptr<store::Store> open_job_store() override {
    return std::make_shared<etcd::EtcdStore>(
        endpoints_, keys_.status(), timeout_);
  }

 private:
  std::string value_key(int64_t round, const std::string& name) const {
    return keys_.round(round, "v/" + name);
  }

  std::string endpoints_;
  EtcdKeys keys_;
  milliseconds timeout_;
  std::mutex mutex_;  // client_ is used by one thread at a time
  EtcdClient client_;
};

}  // namespace

std::unique_ptr<RendezvousHandler> make_etcd_handler(
    const RendezvousParameters& params) {
  warn_unknown_conf_keys(
      params,
      dynamic_conf_keys({"etcd_prefix", "protocol", "cacert", "cert", "key"}));
  DynamicRendezvousSettings settings = DynamicRendezvousSettings::from(params);
  if (params.get("protocol", "http") != "http" ||
      !params.get("cacert").empty() || !params.get("cert").empty() ||
      !params.get("key").empty()) {
    throw InvalidArgument(
        "the etcd rendezvous speaks plain http to etcd's gateway; TLS "
        "(protocol=https, cacert, cert, key) is not supported yet");
  }
  if (params.endpoint.empty()) {
    throw InvalidArgument(
        "the etcd rendezvous needs --rdzv-endpoint=HOST:PORT[,HOST:PORT...] "
        "(etcd's client URLs)");
  }
  std::string prefix = params.get("etcd_prefix", "/tide/rdzv");
  auto timeout =
      params.get_as_seconds("read_timeout", std::chrono::seconds(60));
  std::string addr = params.local_addr.empty() ? fqdn() : params.local_addr;
  TIDE_LOG_INFO(
      "[rendezvous {}] etcd at {}, keys under {}/{}/",
      params.run_id,
      params.endpoint,
      prefix,
      params.run_id);
  return std::make_unique<DynamicRendezvousHandler>(
      "etcd",
      std::make_unique<EtcdBackend>(
          params.endpoint, prefix, params.run_id, timeout),
      settings,
      NodeDesc::make(addr));
}

std::shared_ptr<store::Store> open_etcd_job_store(
    const RendezvousParameters& params, milliseconds timeout) {
  if (params.endpoint.empty()) {
    throw InvalidArgument(
        "the etcd job store needs --rdzv-endpoint=HOST:PORT[,HOST:PORT...]");
  }
  EtcdKeys keys(params.get("etcd_prefix", "/tide/rdzv"), params.run_id);
  return std::make_shared<etcd::EtcdStore>(
      params.endpoint, keys.status(), timeout);
}

}  // namespace tide::rendezvous
