#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tide/common/error.h"

// Store: the key-value contract every part of tide meets at (rendezvous
// rounds, agent bookkeeping, worker bootstrap, rpc init). It mirrors
// PyTorch's c10d::Store. Keys are strings; values are arbitrary bytes held in
// std::string.
//
// Thread safety: every implementation is safe to call from many threads.
// Blocking: get, wait and multi_get block until their keys exist, at most
// timeout() (or the given timeout), then throw TimeoutError naming the missing
// keys. Other calls may block on I/O for at most timeout().
// Errors: TimeoutError, NetworkError (store unreachable), InvalidArgument
// (a value over the limits, add() on a value that is not an integer).
namespace tide::store {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

class Store {
 public:
  // torch's default store timeout (c10d::Store::kDefaultTimeout).
  static constexpr milliseconds kDefaultTimeout{300'000};

  virtual ~Store() = default;

  // Sets key to value and wakes everyone waiting for it.
  virtual void set(std::string_view key, std::string_view value) = 0;

  // Returns the value of key, waiting up to timeout() for it to exist.
  virtual std::string get(std::string_view key) = 0;

  // Adds delta to the integer at key (absent counts as 0), stores it as a
  // decimal string and returns the new value. Throws InvalidArgument when the
  // stored value is not a decimal integer or the sum overflows.
  virtual int64_t add(std::string_view key, int64_t delta) = 0;

  // Atomically: if key is absent and expected is empty, sets desired; if key
  // holds expected, sets desired. Returns the value after the operation, or
  // expected when the key is absent and expected is not empty (torch's rule).
  virtual std::string compare_set(
      std::string_view key,
      std::string_view expected,
      std::string_view desired) = 0;

  // True when every key exists. Never waits.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Waits until every key exists; throws TimeoutError naming the missing ones.
  void wait(const std::vector<std::string>& keys) {
    wait(keys, timeout());
  }
  virtual void wait(
      const std::vector<std::string>& keys, milliseconds timeout) = 0;

  // Deletes key; returns whether it existed.
  virtual bool delete_key(std::string_view key) = 0;

  // Number of keys in the store (for a prefix store: in the whole store).
  virtual int64_t num_keys() = 0;

  // Appends value to the value at key, creating it when absent.
  virtual void append(std::string_view key, std::string_view value) = 0;

  // The values of keys, in order, waiting up to timeout() for all of them.
  virtual std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) = 0;

  // A vote with its outcome, in one request where the store has it (tide's
  // server: ADD_WAIT): adds delta to the integer at `counter`, then returns
  // once `key` exists, or at once when the new count reached `target`: the
  // count and key's value ("" when absent). So the caller whose add
  // completes the count sees "" and decides, writing `key`; the others get
  // what it wrote. Elsewhere: add(), then get() unless the count reached
  // target first. Blocks at most timeout() (TimeoutError; the add stays).
  struct Tally {
    int64_t count = 0;
    std::string value;
  };
  virtual Tally add_wait(
      std::string_view counter,
      int64_t delta,
      int64_t target,
      std::string_view key) {
    int64_t n = add(counter, delta);
    std::vector<std::string> keys{std::string(key)};
    if (n >= target && !check(keys)) {
      return {n, ""};
    }
    return {n, get(key)};
  }

  // Sets keys[i] to values[i]; InvalidArgument when the sizes differ.
  void multi_set(
      const std::vector<std::string>& keys,
      const std::vector<std::string>& values) {
    if (keys.size() != values.size()) {
      throw InvalidArgument(
          "multi_set: " + std::to_string(keys.size()) + " keys but " +
          std::to_string(values.size()) + " values");
    }
    set_many(keys, values);
  }

  // The default timeout of blocking calls. Thread safe.
  milliseconds timeout() const {
    return milliseconds(timeout_ms_.load(std::memory_order_relaxed));
  }
  virtual void set_timeout(milliseconds timeout) {
    timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  }

 protected:
  explicit Store(milliseconds timeout = kDefaultTimeout)
      : timeout_ms_(timeout.count()) {}

  // multi_set(), its sizes checked.
  virtual void set_many(
      const std::vector<std::string>& keys,
      const std::vector<std::string>& values) = 0;

 private:
  std::atomic<int64_t> timeout_ms_;
};

}  // namespace tide::store
