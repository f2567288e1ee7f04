#include "store/kv_map.h"

#include <charconv>

#include "tide/common/error.h"

namespace tide::store::detail {

void throw_wait_timeout(
    std::string_view what,
    std::chrono::milliseconds timeout,
    const std::vector<std::string>& missing) {
  std::string msg = std::string(what) + " timed out after " +
                    std::to_string(timeout.count()) + " ms";
  if (!missing.empty()) {
    msg += "; missing keys: ";
    constexpr size_t kShown = 20;
    for (size_t i = 0; i < missing.size() && i < kShown; ++i) {
      msg += (i == 0 ? "" : ", ") + missing[i];
    }
    if (missing.size() > kShown) {
      msg += " and " + std::to_string(missing.size() - kShown) + " more";
    }
  }
  throw TimeoutError(msg);
}

int64_t parse_counter(std::string_view key, std::string_view value) {
  int64_t n = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, n);
  if (value.empty() || ec != std::errc() || ptr != end) {
    std::string shown(value.substr(0, 32));
    throw InvalidArgument(
        "add(\"" + std::string(key) +
        "\"): the stored value is not a decimal integer (it starts with \"" +
        shown + "\"); add() only works on keys written by add()");
  }
  return n;
}

const std::string* KvMap::find(std::string_view key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

void KvMap::set(std::string_view key, std::string_view value) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    bytes_ += key.size() + value.size();
    map_.emplace(std::string(key), std::string(value));
    return;
  }
  bytes_ = bytes_ - it->second.size() + value.size();
  it->second.assign(value);
}

int64_t KvMap::add(std::string_view key, int64_t delta) {
  int64_t current = 0;
  if (const std::string* v = find(key)) {
    current = parse_counter(key, *v);
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    throw InvalidArgument(
        "add(\"" + std::string(key) + "\", " + std::to_string(delta) +
        ") overflows int64 (current value " + std::to_string(current) + ")");
  }
  set(key, std::to_string(sum));
  return sum;
}

std::string KvMap::compare_set(
    std::string_view key,
    std::string_view expected,
    std::string_view desired,
    bool& wrote) {
  wrote = false;
  const std::string* current = find(key);
  if (current == nullptr) {
    if (!expected.empty()) {
      return std::string(expected);
    }
    set(key, desired);
    wrote = true;
    return std::string(desired);
  }
  if (*current == expected) {
    set(key, desired);
    wrote = true;
    return std::string(desired);
  }
  return *current;
}

void KvMap::append(std::string_view key, std::string_view value) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    set(key, value);
    return;
  }
  bytes_ += value.size();
  it->second.append(value);
}

bool KvMap::erase(std::string_view key) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    return false;
  }
  bytes_ -= it->first.size() + it->second.size();
  map_.erase(it);
  return true;
}

size_t KvMap::erase_outside(std::string_view prefix) {
  size_t erased = 0;
  for (auto it = map_.begin(); it != map_.end();) {
    if (it->first.starts_with(prefix)) {
      ++it;
      continue;
    }
    bytes_ -= it->first.size() + it->second.size();
    it = map_.erase(it);
    ++erased;
  }
  return erased;
}

}  // namespace tide::store::detail
