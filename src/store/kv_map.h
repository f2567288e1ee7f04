#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

// The map behind HashStore and the TCP store server, with torch's value
// semantics for add and compare_set in one place. Not thread safe: the
// owner serialises access (a mutex, or the server's loop thread).
namespace tide::store::detail {

struct StringHash {
  using is_transparent = void;  // NOLINT(readability-identifier-naming)
  size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

class KvMap {
 public:
  // Null when absent. The pointer lives until the next mutation.
  const std::string* find(std::string_view key) const;
  bool contains(std::string_view key) const {
    return find(key) != nullptr;
  }

  void set(std::string_view key, std::string_view value);

  // Throws InvalidArgument when the stored value is not a decimal integer or
  // the sum overflows int64; the stored value is then left as it was.
  int64_t add(std::string_view key, int64_t delta);

  // torch's compare_set; `wrote` tells whether the map changed.
  std::string compare_set(
      std::string_view key,
      std::string_view expected,
      std::string_view desired,
      bool& wrote);

  void append(std::string_view key, std::string_view value);
  bool erase(std::string_view key);
  // Erases every key that does not start with `prefix`; returns how many.
  size_t erase_outside(std::string_view prefix);
  size_t size() const {
    return map_.size();
  }
  // Key and value bytes held, for the server's memory bound.
  uint64_t bytes() const {
    return bytes_;
  }

 private:
  std::unordered_map<std::string, std::string, StringHash, std::equal_to<>>
      map_;
  uint64_t bytes_ = 0;
};

// Throws TimeoutError: "<what> timed out after N ms; missing keys: a, b".
[[noreturn]] void throw_wait_timeout(
    std::string_view what,
    std::chrono::milliseconds timeout,
    const std::vector<std::string>& missing);

// Parses a whole decimal int64 ("-12"); throws InvalidArgument naming key.
int64_t parse_counter(std::string_view key, std::string_view value);

}  // namespace tide::store::detail
