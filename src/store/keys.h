#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tide::store::detail {

// `prefix` then `key`: how a store names a key in the space below it
// (TcpStore's "/", a PrefixStore's "<prefix>/", an EtcdStore's prefix).
inline std::string with_prefix(std::string_view prefix, std::string_view key) {
  std::string k;
  k.reserve(prefix.size() + key.size());
  k.append(prefix).append(key);
  return k;
}

inline std::vector<std::string> with_prefix(
    std::string_view prefix, const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) {
    out.push_back(with_prefix(prefix, k));
  }
  return out;
}

}  // namespace tide::store::detail
