#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/subprocess.h"

// Strangers holding a server's door (support/stranger_flood.py), for the
// admission tests of the transport and the store.
namespace tide::test {

inline std::string hex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

// Starts stranger_flood.py as user nobody (so needs root) against
// 127.0.0.1:port: `idle` silent connections and `slow` ones trickling
// `handshake` a byte every half second, each opened again as soon as the
// server closes it. Returns once all are open; close_stdin() stops it.
inline std::unique_ptr<Subprocess> flood(
    uint16_t port, int idle, int slow, const std::string& handshake) {
  using namespace std::chrono_literals;
  auto p = std::make_unique<Subprocess>(
      std::vector<std::string>{
          "/usr/bin/setpriv",
          "--reuid=65534",
          "--regid=65534",
          "--clear-groups",
          "/usr/bin/python3",
          TIDE_SOURCE_DIR "/tests/support/stranger_flood.py",
          "127.0.0.1",
          std::to_string(port),
          std::to_string(idle),
          std::to_string(slow),
          hex(handshake)},
      SubprocessOptions{.merge_stderr = true, .pipe_stdin = true});
  auto line = p->read_line(120s);
  if (!line || line->rfind("holding", 0) != 0) {
    throw std::runtime_error("the flood said: " + line.value_or("nothing"));
  }
  return p;
}

// How soon a legitimate client must be served while strangers hold the
// door: one handshake, with room for a loaded machine, and far below the
// strangers' deadline in these tests (60 s), so that it is eviction, not
// their expiry, that lets it in.
constexpr auto kAdmittedWithin = std::chrono::seconds(10);

}  // namespace tide::test
