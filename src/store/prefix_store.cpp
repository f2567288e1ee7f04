#include "tide/store/prefix_store.h"

#include "tide/common/error.h"

#include "store/keys.h"

namespace tide::store {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : Store(store ? store->timeout() : kDefaultTimeout),
      prefix_(std::move(prefix)),
      scope_(prefix_ + "/"),
      store_(std::move(store)) {
  if (!store_) {
    throw InvalidArgument("PrefixStore(\"" + prefix_ + "\"): store is null");
  }
}

std::string PrefixStore::full(std::string_view key) const {
  return detail::with_prefix(scope_, key);
}

std::vector<std::string> PrefixStore::full(
    const std::vector<std::string>& keys) const {
  return detail::with_prefix(scope_, keys);
}

void PrefixStore::set(std::string_view key, std::string_view value) {
  store_->set(full(key), value);
}

std::string PrefixStore::get(std::string_view key) {
  return store_->get(full(key));
}

int64_t PrefixStore::add(std::string_view key, int64_t delta) {
  return store_->add(full(key), delta);
}

Store::Tally PrefixStore::add_wait(
    std::string_view counter,
    int64_t delta,
    int64_t target,
    std::string_view key) {
  return store_->add_wait(full(counter), delta, target, full(key));
}

std::string PrefixStore::compare_set(
    std::string_view key, std::string_view expected, std::string_view desired) {
  return store_->compare_set(full(key), expected, desired);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return store_->check(full(keys));
}

void PrefixStore::wait(
    const std::vector<std::string>& keys, milliseconds timeout) {
  store_->wait(full(keys), timeout);
}

bool PrefixStore::delete_key(std::string_view key) {
  return store_->delete_key(full(key));
}

int64_t PrefixStore::num_keys() {
  return store_->num_keys();
}

void PrefixStore::append(std::string_view key, std::string_view value) {
  store_->append(full(key), value);
}

std::vector<std::string> PrefixStore::multi_get(
    const std::vector<std::string>& keys) {
  return store_->multi_get(full(keys));
}

void PrefixStore::set_many(
    const std::vector<std::string>& keys,
    const std::vector<std::string>& values) {
  store_->multi_set(full(keys), values);
}

void PrefixStore::set_timeout(milliseconds timeout) {
  Store::set_timeout(timeout);
  store_->set_timeout(timeout);
}

}  // namespace tide::store
