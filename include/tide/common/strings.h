#pragma once

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
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

// `text` without the blanks (spaces, tabs, CR, LF) at either end.
inline std::string_view trim(std::string_view text) {
  constexpr std::string_view kBlank = " \t\r\n";
  auto first = text.find_first_not_of(kBlank);
  if (first == std::string_view::npos) {
    return {};
  }
  return text.substr(first, text.find_last_not_of(kBlank) - first + 1);
}

// Constant time in the contents, for secrets: the comparison leaks only the
// length.
inline bool token_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) {
    return false;
  }
  unsigned diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

// `text` as it may go into a log line or an error message when a peer chose
// it: control bytes (a newline, an escape sequence) and backslashes written
// as \xNN, and at most `max` bytes kept ("..." after them), so a peer cannot
// forge or hide log lines.
inline std::string printable(std::string_view text, size_t max = 128) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < text.size() && i < max; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > max) {
    out += "...";
  }
  return out;
}

// A byte count as people read it, in powers of 1024: "512 B", "1.5 GiB".
inline std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(units)) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace tide
