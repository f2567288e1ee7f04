#pragma once

#include <string_view>
#include <vector>

namespace tide {

// The pieces of `text` between `sep`s ("a,b" -> {"a", "b"}); empty text
// gives no pieces. The views point into text.
inline std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    auto at = text.find(sep);
    out.push_back(text.substr(0, at));
    text =
        at == std::string_view::npos ? std::string_view() : text.substr(at + 1);
  }
  return out;
}

}  // namespace tide
