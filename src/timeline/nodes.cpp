#include "timeline/nodes.h"

#include <algorithm>
#include <limits>

#include "timeline/text.h"

namespace tide::timeline {
namespace {

// The attempt of the lane's worker alive at t (the last one started by t).
int64_t attempt_at(const WorkerLane& lane, int64_t t) {
  int64_t attempt = lane.bars.empty() ? 0 : lane.bars.front().attempt;
  for (const Bar& bar : lane.bars) {
    if (bar.start_ms <= t) {
      attempt = bar.attempt;
    }
  }
  return attempt;
}

std::vector<AttemptSummary> summarise(
    const std::vector<const WorkerLane*>& ws) {
  std::map<int64_t, AttemptSummary> by_attempt;
  for (const WorkerLane* lane : ws) {
    for (const Bar& bar : lane->bars) {
      auto [it, first] = by_attempt.try_emplace(bar.attempt);
      AttemptSummary& a = it->second;
      if (first) {
        a = AttemptSummary{
            .attempt = bar.attempt,
            .start_ms = bar.start_ms,
            .end_ms = bar.end_ms,
            .worst = bar.outcome};
      }
      a.start_ms = std::min(a.start_ms, bar.start_ms);
      a.end_ms = std::max(a.end_ms, bar.end_ms);
      a.start_seen = a.start_seen && bar.start_seen;
      if (severity(bar.outcome) > severity(a.worst)) {
        a.worst = bar.outcome;
      }
      ++a.outcomes[bar.outcome];
    }
  }
  std::vector<AttemptSummary> out;
  for (auto& [attempt, a] : by_attempt) {
    out.push_back(std::move(a));
  }
  return out;
}

// One note per (attempt, mark): the earliest, its label naming its rank and
// how many more there were; the tooltip lists them all.
std::vector<Note> fold_notes(const std::vector<const WorkerLane*>& ws) {
  std::map<
      std::pair<int64_t, Mark>,
      std::vector<std::pair<const WorkerLane*, const Note*>>>
      folds;
  for (const WorkerLane* lane : ws) {
    for (const Note& n : lane->notes) {
      int64_t attempt =
          attempt_at(*lane, n.mark == Mark::kFailure ? n.from_ms : n.t_ms);
      folds[{attempt, n.mark}].emplace_back(lane, &n);
    }
  }
  constexpr size_t kListed = 20;
  std::vector<Note> out;
  for (auto& [key, notes] : folds) {
    std::stable_sort(
        notes.begin(), notes.end(), [](const auto& a, const auto& b) {
          return a.second->t_ms < b.second->t_ms;
        });
    const auto& [lane, first] = notes.front();
    Note n = *first;
    std::string rank = "rank " + std::to_string(lane->rank);
    n.label = rank + ": " + first->label;
    if (notes.size() > 1) {
      n.label += " (+" + std::to_string(notes.size() - 1) + " more)";
    }
    n.tooltip = "attempt " + std::to_string(key.first) + ", " +
                std::to_string(notes.size()) + " of the node's workers:";
    json ranks = json::array();
    for (size_t i = 0; i < notes.size(); ++i) {
      ranks.push_back(notes[i].first->rank);
      if (i < kListed) {
        n.tooltip += "\nrank " + std::to_string(notes[i].first->rank) + ": " +
                     notes[i].second->label;
      }
    }
    if (notes.size() > kListed) {
      n.tooltip +=
          "\n... and " + std::to_string(notes.size() - kListed) + " more";
    }
    n.args["ranks"] = std::move(ranks);
    out.push_back(std::move(n));
  }
  std::stable_sort(out.begin(), out.end(), [](const Note& a, const Note& b) {
    return a.mark == Mark::kFailure && b.mark != Mark::kFailure;
  });
  return out;
}

}  // namespace

std::vector<Node> group_by_node(const Timeline& tl) {
  std::map<std::string, Node> by_host;
  for (const auto& [host, notes] : tl.agent_notes) {
    by_host[host].agent_notes = notes;
  }
  for (const auto& [key, lane] : tl.workers) {
    by_host[key.first].workers.push_back(&lane);
  }
  for (const auto& [host, record] : tl.records) {
    by_host[host].record = &record;
  }
  std::vector<Node> nodes;
  for (auto& [host, node] : by_host) {
    node.host = host;
    if (auto it = tl.host_order.find(host); it != tl.host_order.end()) {
      node.order = it->second;
    }
    node.group_rank = node.record ? node.record->group_rank : node.order;
    node.attempts = summarise(node.workers);
    node.summary_notes = fold_notes(node.workers);
    nodes.push_back(std::move(node));
  }
  std::stable_sort(
      nodes.begin(), nodes.end(), [](const Node& a, const Node& b) {
        return a.order.value_or(std::numeric_limits<int64_t>::max()) <
               b.order.value_or(std::numeric_limits<int64_t>::max());
      });
  return nodes;
}

std::set<int64_t> ranks_of(const Node& node) {
  if (node.record) {
    return {node.record->ranks.begin(), node.record->ranks.end()};
  }
  std::set<int64_t> ranks;
  for (const WorkerLane* w : node.workers) {
    ranks.insert(w->rank);
  }
  return ranks;
}

std::string rank_ranges(const std::set<int64_t>& ranks) {
  std::string out;
  for (auto it = ranks.begin(); it != ranks.end();) {
    int64_t first = *it;
    int64_t last = first;
    while (++it != ranks.end() && *it == last + 1) {
      last = *it;
    }
    out += (out.empty() ? "" : ", ") + std::to_string(first);
    if (last != first) {
      out += "\u2013" + std::to_string(last);
    }
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

std::string outcome_counts(const AttemptSummary& a) {
  std::vector<std::pair<Outcome, size_t>> counts(
      a.outcomes.begin(), a.outcomes.end());
  std::stable_sort(
      counts.begin(), counts.end(), [](const auto& x, const auto& y) {
        return severity(x.first) > severity(y.first);
      });
  std::string out;
  for (const auto& [o, n] : counts) {
    out += (out.empty() ? "" : ", ") + std::to_string(n) + " " + css_class(o);
  }
  return out;
}

}  // namespace tide::timeline
