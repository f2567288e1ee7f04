#include "timeline/job_view.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "timeline/events.h"
#include "timeline/text.h"

namespace tide::timeline {
namespace {

// A view shorter than this is drawn this long, so that a job that just
// started is not a picture of a few milliseconds.
constexpr int64_t kMinSpanMs = 10'000;
// A restart recorded this close to an attempt's start is that attempt's.
constexpr int64_t kSameRestartMs = 5'000;
// A job of more nodes than this has its alike nodes folded (fold()): the
// picture of a big job stays a few lanes high, its odd nodes standing out,
// as its page's cards turn compact past the same size.
constexpr size_t kFoldAbove = 32;

std::optional<double> seconds(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) {
    return std::nullopt;
  }
  double v = it->get<double>();
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

int64_t ms(double seconds) {
  return static_cast<int64_t>(std::llround(seconds * 1000));
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

Outcome outcome_of(const std::string& name) {
  for (Outcome o :
       {Outcome::kSucceeded,
        Outcome::kFailed,
        Outcome::kTerminated,
        Outcome::kRunning}) {
    if (name == outcome_name(o)) {
      return o;
    }
  }
  return Outcome::kTerminated;  // a state this reader does not know: ended
}

// The restarts of a node: at each attempt's start after its first, named by
// how the attempt before it ended, or by the node's last restart's reason
// when that is the one; and the last restart itself when no attempt starts
// near it (its attempt not yet recorded).
std::vector<Note> restarts(
    const std::string& name,
    const std::vector<RecordedAttempt>& attempts,
    const json& node) {
  std::optional<int64_t> last_at;
  std::string last_reason;
  if (auto it = node.find("last_restart");
      it != node.end() && it->is_object()) {
    if (auto at = seconds(*it, "at")) {
      last_at = ms(*at);
      last_reason = text(*it, "reason");
    }
  }
  auto near_last = [&](int64_t t) {
    return last_at && std::llabs(*last_at - t) < kSameRestartMs;
  };
  std::vector<Note> notes;
  auto add = [&](int64_t t, const std::string& reason) {
    Note n{.mark = Mark::kRestart, .t_ms = t};
    n.label = reason.empty() ? "restart" : reason;
    n.tooltip = n.label + "\n" + name + " restarted at " + utc_text(t);
    notes.push_back(std::move(n));
  };
  for (size_t i = 0; i < attempts.size(); ++i) {
    const RecordedAttempt& a = attempts[i];
    if (i == 0 && a.attempt == 0) {
      continue;
    }
    std::string reason;
    if (i > 0) {
      const RecordedAttempt& before = attempts[i - 1];
      reason = std::string(outcome_name(before.outcome)) +
               (before.reason.empty() ? "" : ": " + before.reason);
    }
    if (near_last(a.start_ms) && !last_reason.empty()) {
      reason = last_reason;
    }
    add(a.start_ms, reason);
  }
  if (last_at && std::none_of(notes.begin(), notes.end(), [&](const Note& n) {
        return near_last(n.t_ms);
      })) {
    add(*last_at, last_reason);
  }
  return notes;
}

// A node as read from the view, before it is put in the Timeline.
struct Lane {
  int64_t slot = 0;
  std::string name;
  NodeRecord record;
  std::vector<Note> restarts;
};

// Whether two nodes' histories draw alike: the same attempts (number,
// round, outcome), both silent or neither.
std::string history(const NodeRecord& r) {
  std::string key = r.silent ? "silent" : "";
  for (const RecordedAttempt& a : r.attempts) {
    key += " " + std::to_string(a.attempt) + "/" + std::to_string(a.round) +
           "/" + outcome_name(a.outcome);
  }
  return key;
}

// The nodes of a big job folded: nodes whose histories are alike become one
// lane, named by its first node and how many more it stands for, spanning
// their attempts (earliest start to latest end), its restarts the first
// node's; a node unlike the others keeps a lane of its own.
std::vector<Lane> fold(std::vector<Lane> lanes) {
  std::stable_sort(
      lanes.begin(), lanes.end(), [](const Lane& a, const Lane& b) {
        return a.slot < b.slot;
      });
  std::map<std::string, size_t> index;  // history -> place in out
  std::vector<Lane> out;
  for (Lane& lane : lanes) {
    auto [it, first] = index.try_emplace(history(lane.record), out.size());
    if (first) {
      out.push_back(std::move(lane));
      continue;
    }
    NodeRecord& into = out[it->second].record;
    const NodeRecord& r = lane.record;
    into.nodes += 1;
    into.group_rank.reset();
    into.age = std::max(into.age, r.age);
    into.ranks.insert(into.ranks.end(), r.ranks.begin(), r.ranks.end());
    for (size_t i = 0; i < into.attempts.size(); ++i) {
      into.attempts[i].start_ms =
          std::min(into.attempts[i].start_ms, r.attempts[i].start_ms);
      into.attempts[i].end_ms =
          std::max(into.attempts[i].end_ms, r.attempts[i].end_ms);
    }
  }
  for (Lane& lane : out) {
    if (lane.record.nodes > 1) {
      lane.name += " and " + std::to_string(lane.record.nodes - 1) + " more";
    }
  }
  return out;
}

}  // namespace

Timeline timeline_of_job(const json& view) {
  if (!view.is_object()) {
    throw Fatal("not a job view: expected a JSON object");
  }
  auto now = seconds(view, "now");
  auto nodes = view.find("nodes");
  if (!now || nodes == view.end() || !nodes->is_array()) {
    throw Fatal(
        "not a job view: expected \"now\" (seconds) and a \"nodes\" array, "
        "as tiderun status --json writes");
  }
  Timeline tl;
  tl.live = true;
  tl.run_id = text(view, "run_id");
  tl.state = text(view, "state");
  tl.t1 = ms(*now);
  tl.t0 = tl.t1;
  // Names as the picture shows them: the agent's host, with its slot when
  // two agents share a host.
  std::map<std::string, int> named;
  for (const json& node : *nodes) {
    if (node.is_object()) {
      ++named[text(node, "node")];
    }
  }
  std::vector<Lane> lanes;
  for (const json& node : *nodes) {
    if (!node.is_object()) {
      continue;
    }
    Lane lane{.slot = static_cast<int64_t>(seconds(node, "slot").value_or(0))};
    lane.name = text(node, "node");
    if (named[lane.name] > 1) {
      lane.name += " #" + std::to_string(lane.slot);
    }
    if (lane.name.empty()) {
      lane.name = "?";
    }
    NodeRecord& r = lane.record;
    if (auto g = seconds(node, "group_rank"); g && *g >= 0) {
      r.group_rank = static_cast<int64_t>(*g);
    }
    r.silent = node.value("stale", false) == true;
    r.age = seconds(node, "age").value_or(0);
    if (auto ranks = node.find("ranks");
        ranks != node.end() && ranks->is_array()) {
      for (const json& rank : *ranks) {
        if (auto g = rank.is_object() ? seconds(rank, "rank") : std::nullopt) {
          r.ranks.push_back(static_cast<int64_t>(*g));
        }
      }
    }
    if (auto started = seconds(node, "started_at")) {
      tl.t0 = std::min(tl.t0, ms(*started));
    }
    auto attempts = node.find("attempts");
    if (attempts != node.end() && attempts->is_array()) {
      for (const json& a : *attempts) {
        auto start = a.is_object() ? seconds(a, "start") : std::nullopt;
        if (!start) {
          continue;
        }
        RecordedAttempt ra{
            .attempt = static_cast<int64_t>(seconds(a, "attempt").value_or(0)),
            .round = static_cast<int64_t>(seconds(a, "round").value_or(0)),
            .start_ms = ms(*start),
            .outcome = outcome_of(text(a, "outcome")),
            .reason = text(a, "reason")};
        auto end = seconds(a, "end");
        ra.end_ms = std::max(ra.start_ms, end ? ms(*end) : tl.t1);
        if (!end) {
          ra.outcome = Outcome::kRunning;
        }
        r.attempts.push_back(std::move(ra));
      }
    }
    lane.restarts = restarts(lane.name, r.attempts, node);
    lanes.push_back(std::move(lane));
  }
  if (lanes.size() > kFoldAbove) {
    lanes = fold(std::move(lanes));
  }
  // Each attempt's boundary where its first node started it.
  std::map<int64_t, int64_t> first_start;
  for (Lane& lane : lanes) {
    for (const RecordedAttempt& a : lane.record.attempts) {
      tl.t0 = std::min(tl.t0, a.start_ms);
      tl.attempts = std::max(tl.attempts, a.attempt + 1);
      auto [it, first] = first_start.try_emplace(a.attempt, a.start_ms);
      it->second = std::min(it->second, a.start_ms);
    }
    if (!lane.restarts.empty()) {
      tl.agent_notes[lane.name] = std::move(lane.restarts);
    }
    tl.host_order[lane.name] = lane.slot;
    tl.records[lane.name] = std::move(lane.record);
  }
  for (const auto& [attempt, start] : first_start) {
    if (attempt > 0) {
      tl.boundaries.push_back({start, "attempt " + std::to_string(attempt)});
    }
  }
  std::sort(
      tl.boundaries.begin(),
      tl.boundaries.end(),
      [](const Boundary& a, const Boundary& b) { return a.t_ms < b.t_ms; });
  tl.t0 = std::min(tl.t0, tl.t1 - kMinSpanMs);
  return tl;
}

std::optional<json> as_job_view(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("now") ||
      !j.contains("nodes") || !j["nodes"].is_array()) {
    return std::nullopt;
  }
  return j;
}

}  // namespace tide::timeline
