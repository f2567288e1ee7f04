#include "tide/store/hash_store.h"

#include <condition_variable>
#include <mutex>

#include "tide/common/error.h"

#include "store/kv_map.h"

namespace tide::store {

namespace {

class HashStore final : public Store {
 public:
  void set(std::string_view key, std::string_view value) override {
    {
      std::lock_guard lock(mutex_);
      map_.set(key, value);
    }
    changed_.notify_all();
  }

  std::string get(std::string_view key) override {
    std::vector<std::string> keys{std::string(key)};
    std::unique_lock lock(mutex_);
    wait_locked(lock, keys, timeout(), "get");
    return *map_.find(key);
  }

  int64_t add(std::string_view key, int64_t delta) override {
    int64_t result = 0;
    {
      std::lock_guard lock(mutex_);
      result = map_.add(key, delta);
    }
    changed_.notify_all();
    return result;
  }

  std::string compare_set(
      std::string_view key,
      std::string_view expected,
      std::string_view desired) override {
    bool wrote = false;
    std::string result;
    {
      std::lock_guard lock(mutex_);
      result = map_.compare_set(key, expected, desired, wrote);
    }
    if (wrote) {
      changed_.notify_all();
    }
    return result;
  }

  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard lock(mutex_);
    return missing_locked(keys).empty();
  }

  using Store::wait;
  void wait(
      const std::vector<std::string>& keys, milliseconds timeout) override {
    std::unique_lock lock(mutex_);
    wait_locked(lock, keys, timeout, "wait");
  }

  bool delete_key(std::string_view key) override {
    std::lock_guard lock(mutex_);
    return map_.erase(key);
  }

  int64_t num_keys() override {
    std::lock_guard lock(mutex_);
    return static_cast<int64_t>(map_.size());
  }

  void append(std::string_view key, std::string_view value) override {
    {
      std::lock_guard lock(mutex_);
      map_.append(key, value);
    }
    changed_.notify_all();
  }

  std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) override {
    std::unique_lock lock(mutex_);
    wait_locked(lock, keys, timeout(), "multi_get");
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (const auto& k : keys) {
      values.push_back(*map_.find(k));
    }
    return values;
  }

  void set_many(
      const std::vector<std::string>& keys,
      const std::vector<std::string>& values) override {
    {
      std::lock_guard lock(mutex_);
      for (size_t i = 0; i < keys.size(); ++i) {
        map_.set(keys[i], values[i]);
      }
    }
    changed_.notify_all();
  }

 private:
  std::vector<std::string> missing_locked(
      const std::vector<std::string>& keys) const {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!map_.contains(k)) {
        missing.push_back(k);
      }
    }
    return missing;
  }

  void wait_locked(
      std::unique_lock<std::mutex>& lock,
      const std::vector<std::string>& keys,
      milliseconds timeout,
      std::string_view what) {
    auto all_present = [&] { return missing_locked(keys).empty(); };
    if (!changed_.wait_for(lock, timeout, all_present)) {
      detail::throw_wait_timeout(what, timeout, missing_locked(keys));
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  detail::KvMap map_;  // Guarded by mutex_.
};

}  // namespace

std::shared_ptr<Store> make_hash_store() {
  return std::make_shared<HashStore>();
}

}  // namespace tide::store
