#pragma once

#include <memory>
#include <string>

#include "tide/store/store.h"

namespace tide::store {

// A view of another store that puts "<prefix>/" in front of every key, as
// torch's PrefixStore does: PrefixStore("/worker/attempt_0", s).set("k")
// writes "/worker/attempt_0/k" in s. num_keys() counts the whole store.
// The timeout is the underlying store's.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  int64_t add(std::string_view key, int64_t delta) override;
  Tally add_wait(
      std::string_view counter,
      int64_t delta,
      int64_t target,
      std::string_view key) override;
  std::string compare_set(
      std::string_view key,
      std::string_view expected,
      std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(
      const std::vector<std::string>& keys, milliseconds timeout) override;
  bool delete_key(std::string_view key) override;
  int64_t num_keys() override;
  void append(std::string_view key, std::string_view value) override;
  std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) override;
  void set_timeout(milliseconds timeout) override;

  const std::string& prefix() const {
    return prefix_;
  }
  const std::shared_ptr<Store>& underlying() const {
    return store_;
  }

 protected:
  void set_many(
      const std::vector<std::string>& keys,
      const std::vector<std::string>& values) override;

 private:
  std::string full(std::string_view key) const;
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  const std::string prefix_;
  const std::string scope_;  // prefix_ + "/"
  const std::shared_ptr<Store> store_;
};

}  // namespace tide::store
