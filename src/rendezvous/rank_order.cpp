#include "rendezvous/rank_order.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "tide/common/error.h"

namespace tide::rendezvous {

using nlohmann::json;

namespace {

struct OrderName {
  RankOrder order;
  std::string_view name;
};

constexpr OrderName kOrderNames[] = {
    {RankOrder::kArrival, "arrival"},
    {RankOrder::kNatural, "natural"},
    {RankOrder::kNodeRank, "node-rank"},
    {RankOrder::kLexicographic, "lexicographic"},
};

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// The run of digits of s starting at i, without its leading zeros; i moves
// past the run.
std::string_view digit_run(std::string_view s, size_t& i) {
  size_t start = i;
  while (i < s.size() && is_digit(s[i])) {
    ++i;
  }
  std::string_view run = s.substr(start, i - start);
  size_t first = run.find_first_not_of('0');
  return first == std::string_view::npos ? std::string_view()
                                         : run.substr(first);
}

int sign(int c) {
  return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

// Why the participants cannot be ordered by node rank (empty when they
// can): who gave none, and which ranks more than one gave.
std::string node_rank_problem(const std::vector<Participant>& ps) {
  std::string none;
  std::map<int64_t, std::vector<const Participant*>> by_rank;
  for (const auto& p : ps) {
    if (!p.node_rank) {
      none += (none.empty() ? "" : ", ") + p.name();
    } else {
      by_rank[*p.node_rank].push_back(&p);
    }
  }
  std::string why;
  if (!none.empty()) {
    why = "no node rank from " + none;
  }
  for (const auto& [rank, holders] : by_rank) {
    if (holders.size() < 2) {
      continue;
    }
    std::string names;
    for (const Participant* p : holders) {
      names += (names.empty() ? "" : ", ") + p->name();
    }
    why += (why.empty() ? "" : "; ") + std::string("node rank ") +
           std::to_string(rank) + " from each of " + names;
  }
  return why;
}

}  // namespace

RankOrder parse_rank_order(std::string_view text) {
  for (const auto& [order, name] : kOrderNames) {
    if (text == name) {
      return order;
    }
  }
  throw InvalidArgument(
      "rank_order=" + std::string(text) +
      " is not a rank order; expected arrival, natural, node-rank or "
      "lexicographic");
}

std::string_view rank_order_name(RankOrder order) {
  for (const auto& [o, name] : kOrderNames) {
    if (o == order) {
      return name;
    }
  }
  return "unknown";
}

std::string Participant::name() const {
  std::string desc =
      addr + "_" + std::to_string(pid) + "_" + std::to_string(local_id);
  return host.empty() ? desc : host + " (" + desc + ")";
}

int natural_compare(std::string_view a, std::string_view b) {
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      // Without leading zeros, the longer number is the larger one; this
      // never overflows, however long the run.
      std::string_view x = digit_run(a, i);
      std::string_view y = digit_run(b, j);
      if (x.size() != y.size()) {
        return x.size() < y.size() ? -1 : 1;
      }
      if (int c = x.compare(y); c != 0) {
        return sign(c);
      }
      continue;
    }
    if (a[i] != b[j]) {
      return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j])
                 ? -1
                 : 1;
    }
    ++i;
    ++j;
  }
  if (i < a.size() || j < b.size()) {
    return i < a.size() ? 1 : -1;  // a prefix comes first
  }
  return sign(a.compare(b));
}

int64_t RankAssignment::rank_of(int64_t arrival) const {
  auto it = std::find(arrivals.begin(), arrivals.end(), arrival);
  TIDE_CHECK(it != arrivals.end());
  return it - arrivals.begin();
}

RankAssignment assign_ranks(
    RankOrder order, std::vector<Participant> participants) {
  auto& ps = participants;
  auto by_arrival = [](const Participant& x, const Participant& y) {
    return x.arrival < y.arrival;
  };
  std::sort(ps.begin(), ps.end(), by_arrival);
  RankAssignment out{.order = order};
  switch (order) {
    case RankOrder::kArrival:
      break;
    case RankOrder::kNatural:
      std::sort(ps.begin(), ps.end(), [](const auto& x, const auto& y) {
        if (int c = natural_compare(x.host, y.host); c != 0) {
          return c < 0;
        }
        return std::tie(x.addr, x.arrival) < std::tie(y.addr, y.arrival);
      });
      break;
    case RankOrder::kLexicographic:
      std::sort(ps.begin(), ps.end(), [](const auto& x, const auto& y) {
        return std::tie(x.addr, x.pid, x.local_id, x.arrival) <
               std::tie(y.addr, y.pid, y.local_id, y.arrival);
      });
      break;
    case RankOrder::kNodeRank:
      out.fallback = node_rank_problem(ps);
      if (!out.fallback.empty()) {
        out.order = RankOrder::kArrival;
        break;
      }
      std::sort(ps.begin(), ps.end(), [](const auto& x, const auto& y) {
        return *x.node_rank < *y.node_rank;
      });
      break;
  }
  for (const auto& p : ps) {
    out.arrivals.push_back(p.arrival);
  }
  return out;
}

std::string encode_descriptor(
    const NodeDesc& self, const DynamicRendezvousSettings& s) {
  json j{
      {"addr", self.addr},
      {"pid", self.pid},
      {"local_id", self.local_id},
      {"host", self.host},
      {"rank_order", rank_order_name(s.rank_order)}};
  if (s.node_rank) {
    j["node_rank"] = *s.node_rank;
  }
  return j.dump();
}

namespace {

// A participant's descriptor and the rank order it uses ("arrival" for a
// node that does not say: a tide before --rank-order).
struct Descriptor {
  Participant who;
  std::string rank_order;
};

// Throws RendezvousStateError naming the round and arrival for a malformed
// descriptor.
Descriptor decode_descriptor(
    int64_t round, int64_t arrival, const std::string& text) {
  json j = json::parse(text, nullptr, false);
  auto is = [&](const char* name, auto check) {
    auto it = j.find(name);
    return it != j.end() && check(*it);
  };
  auto string = [](const json& v) { return v.is_string(); };
  auto integer = [](const json& v) { return v.is_number_integer(); };
  if (!j.is_object() || !is("addr", string) || !is("pid", integer) ||
      !is("local_id", integer) || (j.contains("host") && !is("host", string)) ||
      (j.contains("rank_order") && !is("rank_order", string)) ||
      (j.contains("node_rank") && !is("node_rank", integer))) {
    throw RendezvousStateError(
        "round " + std::to_string(round) +
        " has a malformed descriptor for arrival " + std::to_string(arrival) +
        ": " + text.substr(0, 200));
  }
  Descriptor d{
      .who =
          Participant{
              .arrival = arrival,
              .host = j.value("host", std::string()),
              .addr = j["addr"].get<std::string>(),
              .pid = j["pid"].get<int64_t>(),
              .local_id = j["local_id"].get<int64_t>()},
      .rank_order = j.value("rank_order", std::string("arrival"))};
  if (j.contains("node_rank")) {
    d.who.node_rank = j["node_rank"].get<int64_t>();
  }
  return d;
}

}  // namespace

RoundRanks rank_round(
    int64_t round, const std::vector<std::string>& texts, RankOrder order) {
  RoundRanks out;
  std::vector<Participant> ps;
  for (size_t i = 0; i < texts.size(); ++i) {
    Descriptor d =
        decode_descriptor(round, static_cast<int64_t>(i + 1), texts[i]);
    if (d.rank_order != rank_order_name(order)) {
      out.mixed += (out.mixed.empty() ? "" : ", ") + d.who.name() + " uses " +
                   d.rank_order;
    }
    ps.push_back(std::move(d.who));
  }
  if (out.mixed.empty()) {
    out.ranks = assign_ranks(order, std::move(ps));
  }
  return out;
}

}  // namespace tide::rendezvous
