#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include "tide/common/logging.h"
#include "tide/rendezvous/rendezvous_handler.h"

#include "rendezvous/conf_keys.h"

namespace tide::rendezvous {

std::string RendezvousParameters::get(
    const std::string& key, const std::string& fallback) const {
  auto it = config.find(key);
  return it == config.end() ? fallback : it->second;
}

int64_t RendezvousParameters::get_as_int(
    const std::string& key, int64_t fallback) const {
  auto it = config.find(key);
  if (it == config.end()) {
    return fallback;
  }
  const std::string& v = it->second;
  int64_t n = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc() || ptr != v.data() + v.size()) {
    throw InvalidArgument(
        "rendezvous config " + key + "=" + v + " is not an integer");
  }
  return n;
}

bool RendezvousParameters::get_as_bool(
    const std::string& key, bool fallback) const {
  auto it = config.find(key);
  if (it == config.end()) {
    return fallback;
  }
  std::string v = it->second;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  if (v == "1" || v == "true" || v == "t" || v == "yes" || v == "y") {
    return true;
  }
  if (v == "0" || v == "false" || v == "f" || v == "no" || v == "n") {
    return false;
  }
  throw InvalidArgument(
      "rendezvous config " + key + "=" + it->second +
      " is not a boolean (use 1/true/yes or 0/false/no)");
}

std::chrono::milliseconds RendezvousParameters::get_as_seconds(
    const std::string& key, std::chrono::milliseconds fallback) const {
  auto it = config.find(key);
  if (it == config.end()) {
    return fallback;
  }
  double s = 0;
  const std::string& v = it->second;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), s);
  if (v.empty() || ec != std::errc() || ptr != v.data() + v.size() || s < 0 ||
      !std::isfinite(s)) {
    throw InvalidArgument(
        "rendezvous config " + key + "=" + v +
        " is not a non-negative number of seconds");
  }
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::llround(s * 1000)));
}

}  // namespace tide::rendezvous

namespace tide::rendezvous {

void warn_unknown_conf_keys(
    const RendezvousParameters& params, const std::vector<std::string>& known) {
  for (const auto& [key, value] : params.config) {
    if (std::find(known.begin(), known.end(), key) != known.end()) {
      continue;
    }
    std::string list;
    for (const auto& k : known) {
      list += (list.empty() ? "" : ", ") + k;
    }
    TIDE_LOG_WARN(
        "--rdzv-conf {}={} is not a setting of the {} rendezvous and is "
        "ignored (known: {})",
        key,
        value,
        params.backend,
        list);
  }
}

std::vector<std::string> dynamic_conf_keys(
    std::initializer_list<const char*> backend_keys) {
  std::vector<std::string> keys{
      "join_timeout",
      "timeout",
      "last_call_timeout",
      "close_timeout",
      "keep_alive_interval",
      "keep_alive_max_attempt",
      "read_timeout",
      "rank_order",
      "node_rank"};
  keys.insert(keys.end(), backend_keys.begin(), backend_keys.end());
  return keys;
}

}  // namespace tide::rendezvous
