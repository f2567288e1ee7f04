#include "tide/status/job_status.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "tide/common/error.h"

#include "common/clock.h"

namespace tide::status {

using nlohmann::json;

namespace {

// Record fields are read through these: a missing field takes its default,
// a field of the wrong type is a ProtocolError naming it.
template <typename T>
T field(const json& j, const char* name, T fallback) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    return fallback;
  }
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw ProtocolError(
        std::string("status record: field \"") + name + "\" holds " +
        it->dump().substr(0, 40) + ", of the wrong type");
  }
}

template <typename T>
std::optional<T> optional_field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    return std::nullopt;
  }
  return field<T>(j, name, T{});
}

// Seconds to the microsecond, times since the epoch to the millisecond: a
// record is written thousands of times a second in a large job, and
// seventeen digits of a double would be a third of its bytes.
double us(double seconds) {
  return std::round(seconds * 1e6) / 1e6;
}
double ms(double seconds) {
  return std::round(seconds * 1e3) / 1e3;
}

template <typename T>
json or_null(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}
json or_null_us(const std::optional<double>& v) {
  return v ? json(us(*v)) : json(nullptr);
}

json parse_object(std::string_view text, const char* what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    throw ProtocolError(
        std::string(what) + " is not JSON: \"" +
        std::string(text.substr(0, 40)) + "\"");
  }
  return j;
}

// A retired record: readers skip it.
constexpr std::string_view kRetired = "{}";

std::string slot_key(const char* kind, int64_t slot) {
  return std::string(kind) + "/" + std::to_string(slot);
}

}  // namespace

std::string to_json(const NodeStatus& s) {
  json ranks = json::array();
  for (const auto& r : s.ranks) {
    ranks.push_back({
        {"local_rank", r.local_rank},
        {"rank", r.rank},
        {"pid", r.pid},
        {"state", r.state},
        {"beat_age", or_null_us(r.beat_age)},
        {"step", or_null(r.step)},
        {"step_time", or_null_us(r.step_time)},
        {"best_step_time", or_null_us(r.best_step_time)},
    });
  }
  return json{
      {"node", s.node},
      {"slot", s.slot},
      {"health", s.health},
      {"pid", s.pid},
      {"role", s.role},
      {"state", s.state},
      {"round", s.round},
      {"group_rank", s.group_rank},
      {"group_world_size", s.group_world_size},
      {"restarts", s.restarts},
      {"max_restarts", s.max_restarts},
      {"last_restart",
       s.last_restart_at > 0
           ? json{{"at", ms(s.last_restart_at)}, {"reason", s.last_restart_reason}}
           : json(nullptr)},
      {"started_at", ms(s.started_at)},
      {"updated_at", ms(s.updated_at)},
      {"interval", s.interval},
      {"ranks", ranks},
  }
      .dump();
}

NodeStatus node_status_from_json(std::string_view text) {
  json j = parse_object(text, "status record");
  if (!j.is_object() || !j.contains("node") || !j.contains("updated_at")) {
    throw ProtocolError(
        "status record: expected an object with \"node\" and "
        "\"updated_at\", got " +
        std::string(text.substr(0, 40)));
  }
  NodeStatus s;
  s.node = field<std::string>(j, "node", "");
  s.slot = field<int64_t>(j, "slot", -1);
  s.health = field<std::string>(j, "health", "");
  s.pid = field<int64_t>(j, "pid", 0);
  s.role = field<std::string>(j, "role", "");
  s.state = field<std::string>(j, "state", "UNKNOWN");
  s.round = field<int64_t>(j, "round", 0);
  s.group_rank = field<int>(j, "group_rank", -1);
  s.group_world_size = field<int>(j, "group_world_size", -1);
  s.restarts = field<int>(j, "restarts", 0);
  s.max_restarts = field<int>(j, "max_restarts", 0);
  if (auto it = j.find("last_restart"); it != j.end() && it->is_object()) {
    s.last_restart_at = field<double>(*it, "at", 0);
    s.last_restart_reason = field<std::string>(*it, "reason", "");
  }
  s.started_at = field<double>(j, "started_at", 0);
  s.updated_at = field<double>(j, "updated_at", 0);
  s.interval = field<double>(j, "interval", 0);
  for (const json& r : field<json>(j, "ranks", json::array())) {
    if (!r.is_object()) {
      throw ProtocolError("status record: a rank is not an object");
    }
    s.ranks.push_back(RankStatus{
        .local_rank = field<int>(r, "local_rank", 0),
        .rank = field<int>(r, "rank", 0),
        .pid = field<int64_t>(r, "pid", 0),
        .state = field<std::string>(r, "state", "UNKNOWN"),
        .beat_age = optional_field<double>(r, "beat_age"),
        .step = optional_field<int64_t>(r, "step"),
        .step_time = optional_field<double>(r, "step_time"),
        .best_step_time = optional_field<double>(r, "best_step_time"),
    });
  }
  return s;
}

std::string attempts_to_json(const std::vector<AttemptStatus>& attempts) {
  json out = json::array();
  for (const auto& a : attempts) {
    out.push_back({
        {"attempt", a.attempt},
        {"round", a.round},
        {"start", a.start},
        {"end", or_null(a.end)},
        {"outcome", a.outcome},
        {"reason", a.reason},
    });
  }
  return out.dump();
}

std::vector<AttemptStatus> attempts_from_json(std::string_view text) {
  json j = parse_object(text, "attempts record");
  if (!j.is_array()) {
    throw ProtocolError("attempts record: expected a JSON array");
  }
  std::vector<AttemptStatus> out;
  for (const json& a : j) {
    if (!a.is_object()) {
      throw ProtocolError("attempts record: an attempt is not an object");
    }
    out.push_back(AttemptStatus{
        .attempt = field<int>(a, "attempt", 0),
        .round = field<int64_t>(a, "round", 0),
        .start = field<double>(a, "start", 0),
        .end = optional_field<double>(a, "end"),
        .outcome = field<std::string>(a, "outcome", "UNKNOWN"),
        .reason = field<std::string>(a, "reason", ""),
    });
  }
  return out;
}

const char* to_string(NodeState s) {
  switch (s) {
    case NodeState::kStarting:
      return "STARTING";
    case NodeState::kHealthy:
      return "HEALTHY";
    case NodeState::kRestarting:
      return "RESTARTING";
    case NodeState::kSucceeded:
      return "SUCCEEDED";
    case NodeState::kFailed:
      return "FAILED";
    case NodeState::kStopped:
      return "STOPPED";
  }
  return "UNKNOWN";
}

bool is_final(NodeState s) {
  return s == NodeState::kSucceeded || s == NodeState::kFailed ||
         s == NodeState::kStopped;
}

const char* rank_state(
    NodeState node, std::optional<int> exitcode, bool failed) {
  if (!exitcode) {
    return node == NodeState::kHealthy ? "HEALTHY" : "STOPPING";
  }
  if (*exitcode == 0) {
    return "SUCCEEDED";
  }
  return failed ? "FAILED" : "STOPPED";
}

bool Scores::below(double threshold) const {
  return (relative && *relative < threshold) ||
         (individual && *individual < threshold);
}

Scores score(const RankStatus& r, std::optional<double> fastest_step_time) {
  Scores s;
  if (!r.step_time || *r.step_time <= 0) {
    return s;
  }
  if (fastest_step_time && *fastest_step_time > 0) {
    s.relative = std::min(1.0, *fastest_step_time / *r.step_time);
  }
  if (r.best_step_time && *r.best_step_time > 0) {
    s.individual = std::min(1.0, *r.best_step_time / *r.step_time);
  }
  return s;
}

std::optional<double> fastest_step_time(const std::vector<NodeStatus>& nodes) {
  std::optional<double> fastest;
  for (const auto& n : nodes) {
    if (n.state != "HEALTHY") {
      continue;  // a group that is not running has no current pace
    }
    for (const auto& r : n.ranks) {
      if (r.state == "HEALTHY" && r.step_time && *r.step_time > 0 &&
          (!fastest || *r.step_time < *fastest)) {
        fastest = r.step_time;
      }
    }
  }
  return fastest;
}

double effective_status_interval(double base_seconds, int nodes) {
  return std::max(base_seconds, std::max(nodes, 1) / kBoardWritesPerSecond);
}

double silent_after(const NodeStatus& s) {
  // Three missed updates, and a second for clocks and the store.
  return 3 * s.interval + 1;
}

double expires_after(const NodeStatus& s) {
  return std::max(60.0, 10 * s.interval);
}

StatusBoard::StatusBoard(store::Store& store) : store_(&store) {}

int64_t StatusBoard::claim_slot() {
  return store_->add("slots", 1) - 1;
}

void StatusBoard::publish(const NodeStatus& s, bool with_attempts) {
  if (with_attempts) {
    store_->multi_set(
        {slot_key("attempts", s.slot), slot_key("node", s.slot)},
        {attempts_to_json(s.attempts), to_json(s)});
  } else {
    store_->set(slot_key("node", s.slot), to_json(s));
  }
}

void StatusBoard::retire(int64_t slot) {
  store_->multi_set(
      {slot_key("node", slot), slot_key("attempts", slot)},
      {std::string(kRetired), "[]"});
}

std::vector<NodeStatus> StatusBoard::read(
    std::vector<std::string>* unreadable) {
  int64_t slots = store_->add("slots", 0);
  std::vector<std::string> keys;
  for (int64_t i = 0; i < slots; ++i) {
    keys.push_back(slot_key("node", i));
    keys.push_back(slot_key("attempts", i));
  }
  std::vector<std::string> values(keys.size());
  if (store_->check(keys)) {
    values = store_->multi_get(keys);
  } else {
    // A slot claimed a moment ago and not written yet (or a store that lost
    // keys): read those that are there, one by one.
    for (size_t k = 0; k < keys.size(); ++k) {
      if (store_->check({keys[k]})) {
        values[k] = store_->get(keys[k]);
      }
    }
  }
  std::vector<NodeStatus> out;
  for (int64_t i = 0; i < slots; ++i) {
    const std::string& node = values[static_cast<size_t>(2 * i)];
    const std::string& attempts = values[static_cast<size_t>(2 * i + 1)];
    if (node.empty() || node == kRetired) {
      continue;
    }
    try {
      NodeStatus s = node_status_from_json(node);
      s.slot = i;
      if (!attempts.empty()) {
        s.attempts = attempts_from_json(attempts);
      }
      out.push_back(std::move(s));
    } catch (const ProtocolError& e) {
      if (unreadable != nullptr) {
        unreadable->push_back("slot " + std::to_string(i) + ": " + e.what());
      }
    }
  }
  return out;
}

void StatusBoard::set_fastest_step_time(std::optional<double> seconds) {
  store_->set("job", json{{"fastest_step_time", or_null(seconds)}}.dump());
}

std::optional<double> StatusBoard::fastest_step_time() {
  // One request, not check() then get(): compare_set with a value no key
  // holds answers the value, or that value when the key is absent.
  constexpr std::string_view kAbsent = "\x01tide.absent";
  std::string text = store_->compare_set("job", kAbsent, kAbsent);
  if (text == kAbsent) {
    return std::nullopt;
  }
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) {
    return std::nullopt;  // not ours to judge; the leader rewrites it
  }
  auto it = j.find("fastest_step_time");
  if (it == j.end() || !it->is_number() || it->get<double>() <= 0) {
    return std::nullopt;
  }
  return it->get<double>();
}

JobView make_job_view(
    std::string run_id,
    std::vector<NodeStatus> records,
    double now,
    double threshold) {
  JobView v{.run_id = std::move(run_id), .now = now, .threshold = threshold};
  std::erase_if(records, [&](const NodeStatus& s) {
    return now - s.updated_at > expires_after(s);
  });
  for (const auto& s : records) {
    v.round = std::max(v.round, s.round);
  }
  std::vector<NodeStatus> live;
  for (const auto& s : records) {
    if (s.round == v.round && now - s.updated_at <= silent_after(s)) {
      live.push_back(s);
    }
  }
  auto fastest = fastest_step_time(live);
  // What the members show, for the job's state.
  int members = 0;
  std::map<std::string, int> states;
  bool any_silent = false, any_straggler = false;
  for (auto& s : records) {
    JobView::Node n;
    n.age = std::max(0.0, now - s.updated_at);
    n.silent = n.age > silent_after(s);
    n.member = s.round == v.round;
    for (const auto& r : s.ranks) {
      JobView::Rank rank{.scores = score(r, fastest)};
      rank.straggler = n.member && !n.silent && s.state == "HEALTHY" &&
                       r.state == "HEALTHY" && rank.scores.below(threshold);
      any_straggler |= rank.straggler;
      n.ranks.push_back(rank);
    }
    if (n.member) {
      ++members;
      ++states[s.state];
      v.restarts += s.restarts;
      v.ranks += static_cast<int>(s.ranks.size());
      // A silent node that was done is done.
      any_silent |= n.silent && s.state != "SUCCEEDED";
    }
    n.status = std::move(s);
    v.nodes.push_back(std::move(n));
  }
  auto count = [&](const char* state) {
    auto it = states.find(state);
    return it == states.end() ? 0 : it->second;
  };
  int succeeded = count("SUCCEEDED"), stopped = count("STOPPED");
  if (members == 0) {
    v.state = "UNKNOWN";
  } else if (count("FAILED") > 0) {
    v.state = "FAILED";  // a node that failed for good ends the job
  } else if (succeeded == members) {
    v.state = "SUCCEEDED";
  } else if (stopped > 0 && succeeded + stopped == members) {
    v.state = "STOPPED";
  } else if (any_silent || any_straggler || stopped > 0) {
    v.state = "DEGRADED";
  } else if (count("RESTARTING") > 0) {
    v.state = "RESTARTING";
  } else if (count("HEALTHY") + succeeded == members) {
    v.state = "HEALTHY";
  } else {
    v.state = "STARTING";  // STARTING, or a state this reader does not know
  }
  return v;
}

JobView read_job_view(
    store::Store& store, std::string run_id, double threshold) {
  std::vector<std::string> unreadable;
  auto records = StatusBoard(store).read(&unreadable);
  JobView v = make_job_view(
      std::move(run_id), std::move(records), now_seconds(), threshold);
  v.unreadable = std::move(unreadable);
  return v;
}

std::string to_json(const JobView& v) {
  json nodes = json::array();
  json stragglers = json::array();
  for (const auto& n : v.nodes) {
    json node = json::parse(to_json(n.status));
    node["age"] = n.age;
    node["stale"] = n.silent;
    node["member"] = n.member;
    node["attempts"] = json::parse(attempts_to_json(n.status.attempts));
    for (size_t i = 0; i < n.ranks.size(); ++i) {
      const auto& r = n.ranks[i];
      json& out = node["ranks"][i];
      out["relative_score"] = or_null(r.scores.relative);
      out["individual_score"] = or_null(r.scores.individual);
      out["straggler"] = r.straggler;
      if (r.straggler) {
        stragglers.push_back({
            {"node", n.status.node},
            {"slot", n.status.slot},
            {"rank", n.status.ranks[i].rank},
            {"local_rank", n.status.ranks[i].local_rank},
            {"relative_score", or_null(r.scores.relative)},
            {"individual_score", or_null(r.scores.individual)},
        });
      }
    }
    nodes.push_back(std::move(node));
  }
  return json{
      {"run_id", v.run_id},
      {"now", v.now},
      {"state", v.state},
      {"round", v.round},
      {"threshold", v.threshold},
      {"restarts", v.restarts},
      {"ranks", v.ranks},
      {"nodes", nodes},
      {"stragglers", stragglers},
      {"unreadable", v.unreadable},
  }
      .dump();
}

}  // namespace tide::status
