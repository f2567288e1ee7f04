#pragma once

#include <charconv>
#include <optional>
#include <string_view>

namespace tide {

// The decimal integer that is the whole of `text` ("-12"), or nullopt
// (empty, other characters, out of T's range).
template <typename T>
std::optional<T> to_integer(std::string_view text) {
  T v{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return std::nullopt;
  }
  return v;
}

}  // namespace tide
