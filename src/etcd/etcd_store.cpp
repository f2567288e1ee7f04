// The etcd store: each call borrows an EtcdClient from a pool; read-modify-
// write calls are compare-and-swap loops on mod_revision.
#include "tide/etcd/etcd_store.h"

#include <algorithm>
#include <mutex>
#include <optional>

#include "tide/common/error.h"

#include "etcd/etcd_client.h"
#include "store/keys.h"
#include "store/kv_map.h"

namespace tide::etcd {

using store::Clock;

// Idle clients, each with its kept-alive connection. A call takes one (or
// makes one when none is idle) and gives it back when done, so the mutex is
// held only to move a pointer, never across I/O.
class EtcdStore::ClientPool {
 public:
  explicit ClientPool(std::string endpoints)
      : endpoints_(std::move(endpoints)) {
    // give_back() never allocates.
    idle_.reserve(kMaxIdle);
    // Parses the endpoints now, so a bad list fails the constructor.
    idle_.push_back(std::make_unique<EtcdClient>(endpoints_, kDefaultTimeout));
  }

  // Runs fn(client) with a client whose attempts are bounded by timeout,
  // and by kMaxAttemptTimeout: a healthy member answers well within it
  // (etcd gives up on a request itself after about 7 s), so a member that
  // hangs (stopped, cut off) must not hold a call for all of a 300 s store
  // timeout before the next member is tried.
  template <typename F>
  auto with_client(milliseconds timeout, F&& fn) {
    std::unique_ptr<EtcdClient> client = take();
    client->set_request_timeout(std::min(timeout, kMaxAttemptTimeout));
    // Given back on every path: the client stays usable after any error.
    struct GiveBack {
      ClientPool* pool;
      std::unique_ptr<EtcdClient>& client;
      ~GiveBack() {
        pool->give_back(std::move(client));
      }
    } give_back{this, client};
    return fn(*client);
  }

 private:
  // More idle clients than this are closed: one per thread that uses the
  // store at once is plenty.
  static constexpr size_t kMaxIdle = 8;
  static constexpr milliseconds kMaxAttemptTimeout{30'000};

  std::unique_ptr<EtcdClient> take() {
    {
      std::lock_guard lock(mutex_);
      if (!idle_.empty()) {
        auto client = std::move(idle_.back());
        idle_.pop_back();
        return client;
      }
    }
    return std::make_unique<EtcdClient>(endpoints_, kDefaultTimeout);
  }

  void give_back(std::unique_ptr<EtcdClient> client) noexcept {
    std::lock_guard lock(mutex_);
    if (idle_.size() < kMaxIdle) {
      idle_.push_back(std::move(client));
    }
  }

  const std::string endpoints_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<EtcdClient>> idle_;  // Guarded by mutex_.
};

namespace {

std::string with_slash(std::string prefix) {
  if (prefix.empty() || prefix.back() != '/') {
    prefix += '/';
  }
  return prefix;
}

}  // namespace

EtcdStore::EtcdStore(
    const std::string& endpoints, std::string key_prefix, milliseconds timeout)
    : Store(timeout),
      prefix_(with_slash(std::move(key_prefix))),
      clients_(std::make_unique<ClientPool>(endpoints)) {}

EtcdStore::~EtcdStore() = default;

std::string EtcdStore::full(std::string_view key) const {
  return store::detail::with_prefix(prefix_, key);
}

std::vector<std::string> EtcdStore::full(
    const std::vector<std::string>& keys) const {
  return store::detail::with_prefix(prefix_, keys);
}

std::vector<std::string> EtcdStore::read_when_present(
    const std::vector<std::string>& keys,
    milliseconds timeout,
    std::string_view what,
    bool keys_only) {
  auto deadline = Clock::now() + timeout;
  std::vector<std::string> full_keys = full(keys);
  return clients_->with_client(this->timeout(), [&](EtcdClient& client) {
    for (;;) {
      auto read = client.get_many(full_keys, keys_only);
      std::vector<std::string> missing;
      size_t first_missing = keys.size();
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!read.kvs[i]) {
          missing.push_back(keys[i]);
          first_missing = std::min(first_missing, i);
        }
      }
      if (missing.empty()) {
        std::vector<std::string> values;
        values.reserve(keys.size());
        for (auto& kv : read.kvs) {
          values.push_back(std::move(kv->value));
        }
        return values;
      }
      auto left =
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        store::detail::throw_wait_timeout(what, timeout, missing);
      }
      // The key was absent at read.revision or later: any event after that
      // revision is news. Whatever wakes us, read all keys again.
      client.watch(full_keys[first_missing], read.revision + 1, left);
    }
  });
}

void EtcdStore::set(std::string_view key, std::string_view value) {
  clients_->with_client(
      timeout(), [&](EtcdClient& client) { client.put(full(key), value); });
}

std::string EtcdStore::get(std::string_view key) {
  return std::move(
      read_when_present({std::string(key)}, timeout(), "get", false).front());
}

int64_t EtcdStore::add(std::string_view key, int64_t delta) {
  std::string k = full(key);
  return clients_->with_client(timeout(), [&](EtcdClient& client) {
    std::optional<KeyValue> kv = client.get(k);
    for (;;) {
      int64_t current = kv ? store::detail::parse_counter(key, kv->value) : 0;
      int64_t sum = 0;
      if (__builtin_add_overflow(current, delta, &sum)) {
        throw InvalidArgument(
            "add(\"" + std::string(key) + "\", " + std::to_string(delta) +
            ") overflows int64 (current value " + std::to_string(current) +
            ")");
      }
      TxnResult r = client.put_if_mod_revision(
          k, kv ? kv->mod_revision : 0, std::to_string(sum));
      if (r.succeeded) {
        return sum;
      }
      // Another client wrote in between: start from what it wrote.
      kv = std::move(r.current);
    }
  });
}

std::string EtcdStore::compare_set(
    std::string_view key, std::string_view expected, std::string_view desired) {
  std::string k = full(key);
  return clients_->with_client(timeout(), [&](EtcdClient& client) {
    for (;;) {
      if (!expected.empty()) {
        TxnResult r = client.put_if_value(k, expected, desired);
        if (r.succeeded) {
          return std::string(desired);
        }
        // Absent: torch's rule returns expected and writes nothing.
        return r.current ? std::move(r.current->value) : std::string(expected);
      }
      // Empty expected: an absent key, or one holding "", is set.
      TxnResult created = client.put_if_mod_revision(k, 0, desired);
      if (created.succeeded) {
        return std::string(desired);
      }
      if (created.current && !created.current->value.empty()) {
        return std::move(created.current->value);
      }
      TxnResult swapped = client.put_if_value(k, "", desired);
      if (swapped.succeeded) {
        return std::string(desired);
      }
      if (swapped.current) {
        return std::move(swapped.current->value);
      }
      // Deleted between the two transactions: try again from absent.
    }
  });
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full_keys = full(keys);
  return clients_->with_client(timeout(), [&](EtcdClient& client) {
    auto read = client.get_many(full_keys, /*keys_only=*/true);
    for (const auto& kv : read.kvs) {
      if (!kv) {
        return false;
      }
    }
    return true;
  });
}

void EtcdStore::wait(
    const std::vector<std::string>& keys, milliseconds timeout) {
  read_when_present(keys, timeout, "wait", /*keys_only=*/true);
}

bool EtcdStore::delete_key(std::string_view key) {
  return clients_->with_client(timeout(), [&](EtcdClient& client) {
    return client.delete_range(full(key)) > 0;
  });
}

int64_t EtcdStore::num_keys() {
  return clients_->with_client(timeout(), [&](EtcdClient& client) {
    return client.range(prefix_, {.prefix = true, .count_only = true}).count;
  });
}

void EtcdStore::append(std::string_view key, std::string_view value) {
  std::string k = full(key);
  clients_->with_client(timeout(), [&](EtcdClient& client) {
    std::optional<KeyValue> kv = client.get(k);
    for (;;) {
      std::string joined = kv ? std::move(kv->value) : std::string();
      joined.append(value);
      TxnResult r =
          client.put_if_mod_revision(k, kv ? kv->mod_revision : 0, joined);
      if (r.succeeded) {
        return;
      }
      kv = std::move(r.current);
    }
  });
}

std::vector<std::string> EtcdStore::multi_get(
    const std::vector<std::string>& keys) {
  return read_when_present(keys, timeout(), "multi_get", false);
}

void EtcdStore::set_many(
    const std::vector<std::string>& keys,
    const std::vector<std::string>& values) {
  std::vector<std::string> full_keys = full(keys);
  clients_->with_client(timeout(), [&](EtcdClient& client) {
    client.put_many(full_keys, values);
  });
}

}  // namespace tide::etcd
