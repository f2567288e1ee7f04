#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <unordered_map>

// Which connection gives way when a server holds as many unauthenticated
// connections as it allows and a new one arrives: the oldest of the source
// (a local user, a remote host) that holds the most. A peer that floods a
// server with idle connections then closes its own, never a legitimate
// peer's, and the newest connection (perhaps that legitimate peer) is
// admitted. The store server and the rpc transport both decide this way.
namespace tide::net {

template <class Connection>
struct Evicted {
  Connection connection;  // the oldest connection of the busiest source
  size_t held = 0;        // how many the busiest source holds
};

// Among `waiting` (connections that have not authenticated yet), the one to
// close; nothing when there are none. `source(c)` names c's source (a
// string_view valid while c lives), `accepted(c)` is when c was accepted.
template <class Range, class Source, class Accepted>
auto pick_eviction(const Range& waiting, Source source, Accepted accepted)
    -> std::optional<Evicted<typename Range::value_type>> {
  std::unordered_map<std::string_view, size_t> held;
  for (const auto& c : waiting) {
    ++held[source(c)];
  }
  std::string_view busiest;
  size_t most = 0;
  for (const auto& [name, count] : held) {
    if (count > most) {
      busiest = name;
      most = count;
    }
  }
  std::optional<Evicted<typename Range::value_type>> out;
  for (const auto& c : waiting) {
    if (source(c) == busiest &&
        (!out || accepted(c) < accepted(out->connection))) {
      out = Evicted<typename Range::value_type>{c, most};
    }
  }
  return out;
}

}  // namespace tide::net
