#include "timeline/model.h"

#include <string.h>

#include <algorithm>

#include "timeline/text.h"

namespace tide::timeline {

const char* css_class(Outcome o) {
  switch (o) {
    case Outcome::kSucceeded:
      return "succeeded";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kTerminated:
      return "terminated";
    case Outcome::kRunning:
      return "running";
  }
  return "running";
}

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kSucceeded:
      return "SUCCEEDED";
    case Outcome::kFailed:
      return "FAILED";
    case Outcome::kTerminated:
      return "TERMINATED";
    case Outcome::kRunning:
      return "RUNNING";
  }
  return "RUNNING";
}

const char* mark_name(Mark m) {
  switch (m) {
    case Mark::kRendezvous:
      return "rendezvous";
    case Mark::kRestart:
      return "restart";
    case Mark::kTimer:
      return "timer";
    case Mark::kFailure:
      return "failure";
    case Mark::kRdzvPending:
      return "pending";
    case Mark::kHang:
      return "hang";
  }
  return "rendezvous";
}

int severity(Outcome o) {
  switch (o) {
    case Outcome::kSucceeded:
      return 0;
    case Outcome::kRunning:
      return 1;
    case Outcome::kTerminated:
      return 2;
    case Outcome::kFailed:
      return 3;
  }
  return 0;
}

namespace {

std::string signal_text(int64_t sig) {
  const char* name =
      sig > 0 && sig < 65 ? sigabbrev_np(static_cast<int>(sig)) : nullptr;
  return name ? std::string("SIG") + name : "signal " + std::to_string(sig);
}

// The fields of j named in keys that it holds, for a note's args.
json fields(const json& j, std::initializer_list<const char*> keys) {
  json out = json::object();
  for (const char* key : keys) {
    if (auto it = j.find(key); it != j.end() && !it->is_null()) {
      out[key] = *it;
    }
  }
  return out;
}

// Turns time-ordered records into a Timeline.
class Builder {
 public:
  Builder(const std::vector<Record>& records, Warnings& warnings)
      : warnings_(warnings) {
    tl_.t0 = records.front().t_ms;
    tl_.t1 = records.back().t_ms;
  }

  void add(const Record& r) {
    const json& md = r.body;
    std::string host = str(md, "hostname").value_or("?");
    if (r.rdzv) {
      rdzv_[host].push_back(&r);
      return;
    }
    if (r.name.rfind("torchelastic.", 0) != 0) {
      return;
    }
    int64_t restarts = integer(md, "agent_restarts").value_or(0);
    tl_.attempts = std::max(tl_.attempts, restarts + 1);
    if (auto g = integer(md, "group_rank"); g && !tl_.host_order.count(host)) {
      tl_.host_order[host] = *g;
    }
    if (r.name.rfind(kStatus, 0) == 0) {
      worker_status(r, host, restarts);
    } else if (r.name == "torchelastic.agent.rendezvous") {
      rendezvous(r, host);
    } else if (r.name == "torchelastic.agent.restart") {
      restart(r, host, restarts);
    } else if (r.name == "torchelastic.agent.timer_expired") {
      timer_expired(r, host);
    } else if (r.name == "torchelastic.agent.worker_hung") {
      worker_hung(r, host);
    } else if (r.name == "torchelastic.agent.health_check") {
      health_check(r, host);
    }
  }

  Timeline finish() && {
    for (auto& [key, lane] : tl_.workers) {
      for (Bar& bar : lane.bars) {
        if (bar.outcome == Outcome::kRunning) {
          bar.end_ms = tl_.t1;
        }
        if (bar.outcome == Outcome::kFailed) {
          lane.notes.push_back(failure_note(lane, bar));
        }
      }
    }
    for (auto& [key, lane] : tl_.workers) {
      // Failure messages get the first row under the bars.
      std::stable_partition(
          lane.notes.begin(), lane.notes.end(), [](const Note& n) {
            return n.mark == Mark::kFailure;
          });
    }
    place_rdzv_events();
    for (auto& [host, notes] : tl_.agent_notes) {
      std::stable_sort(
          notes.begin(), notes.end(), [](const Note& a, const Note& b) {
            return a.t_ms < b.t_ms;
          });
    }
    return std::move(tl_);
  }

 private:
  static constexpr std::string_view kStatus = "torchelastic.worker.status.";

  static Note failure_note(const WorkerLane& lane, const Bar& bar) {
    std::string message = short_error(bar.error);
    std::string tooltip = message + "\nrank " + std::to_string(lane.rank) +
                          " on " + lane.host + ", pid " + bar.pid +
                          ", attempt " + std::to_string(bar.attempt);
    // The raw error too when the label is only part of it (torch's JSON).
    if (one_line(bar.error) != message && !one_line(bar.error).empty()) {
      tooltip += "\n\n" + bar.error;
    }
    return Note{
        .mark = Mark::kFailure,
        .t_ms = bar.end_ms,
        .from_ms = bar.start_ms,
        .label = message,
        .tooltip = tooltip,
        .args = {
            {"rank", lane.rank},
            {"pid", bar.pid},
            {"attempt", bar.attempt},
            {"error", message}}};
  }

  void worker_status(
      const Record& r, const std::string& host, int64_t restarts) {
    const json& md = r.body;
    std::string state = r.name.substr(kStatus.size());
    auto pid = str(md, "worker_id");
    auto rank = integer(md, "global_rank");
    if (!pid || !rank) {
      warnings_.add(r.line, r.name + " without worker_id or global_rank");
      return;
    }
    WorkerLane& lane = tl_.workers[{host, *rank}];
    lane.host = host;
    lane.rank = *rank;
    lane.role = str(md, "role").value_or("");
    tl_.roles.insert(lane.role);
    if (auto inner = str(md, "metadata")) {
      json extra = json::parse(*inner, nullptr, false);
      if (extra.is_object()) {
        lane.local_rank = integer(extra, "local_rank");
      }
    }
    by_pid_[{host, *pid}] = &lane;
    auto it = open_.find({host, *pid});
    if (state == "HEALTHY") {
      if (it == open_.end()) {
        lane.bars.push_back(
            Bar{.start_ms = r.t_ms, .pid = *pid, .attempt = restarts});
        open_[{host, *pid}] = {&lane, lane.bars.size() - 1};
      }
      return;
    }
    Outcome outcome;
    if (state == "SUCCEEDED") {
      outcome = Outcome::kSucceeded;
    } else if (state == "FAILED") {
      outcome = Outcome::kFailed;
    } else if (state == "TERMINATED" || state == "STOPPED") {
      outcome = Outcome::kTerminated;
    } else {
      return;  // INIT, UNHEALTHY, UNKNOWN: no change to draw
    }
    Bar* bar = nullptr;
    if (it != open_.end()) {
      bar = &it->second.first->bars[it->second.second];
      open_.erase(it);
    } else {
      lane.bars.push_back(
          Bar{.start_ms = tl_.t0,
              .start_seen = false,
              .pid = *pid,
              .attempt = restarts});
      bar = &lane.bars.back();
    }
    bar->end_ms = r.t_ms;
    bar->outcome = outcome;
    if (outcome == Outcome::kFailed) {
      bar->error = str(md, "raw_error").value_or("");
    }
  }

  void rendezvous(const Record& r, const std::string& host) {
    const json& md = r.body;
    int64_t waited =
        std::max<int64_t>(0, integer(md, "duration_ms").value_or(0));
    std::string label = "rendezvous";
    if (auto ws = integer(md, "group_world_size")) {
      label += ": world size " + std::to_string(*ws);
    }
    if (waited > 0) {
      label +=
          " (waited " +
          (waited < 1000 ? std::to_string(waited) + " ms"
                         : seconds_text(static_cast<double>(waited) / 1000)) +
          ")";
    }
    tl_.agent_notes[host].push_back(Note{
        .mark = Mark::kRendezvous,
        .t_ms = r.t_ms,
        .from_ms = r.t_ms - waited,
        .label = label,
        .tooltip = label + "\ngroup rank " +
                   str(md, "group_rank").value_or("?") + ", master " +
                   str(md, "master_endpoint").value_or("?"),
        .args = fields(
            md,
            {"group_rank",
             "group_world_size",
             "master_endpoint",
             "duration_ms"})});
  }

  void restart(const Record& r, const std::string& host, int64_t restarts) {
    std::string label =
        "restart: " + str(r.body, "reason").value_or("unknown reason");
    if (auto left = integer(r.body, "remaining_restarts")) {
      label += " (" + std::to_string(*left) + " left)";
    }
    json args = fields(r.body, {"reason", "remaining_restarts"});
    args["next_attempt"] = restarts;
    tl_.agent_notes[host].push_back(Note{
        .mark = Mark::kRestart,
        .t_ms = r.t_ms,
        .label = label,
        .tooltip = label + "\nthen attempt " + std::to_string(restarts),
        .args = std::move(args)});
    tl_.boundaries.push_back(Boundary{
        .t_ms = r.t_ms, .label = "attempt " + std::to_string(restarts)});
  }

  void timer_expired(const Record& r, const std::string& host) {
    const json& md = r.body;
    std::string pid = str(md, "worker_id").value_or("?");
    std::string label = "timer expired";
    if (auto scope = str(md, "scope_id")) {
      label += ": " + one_line(*scope);
    }
    if (auto over = integer(md, "overrun_ms"); over && *over > 0) {
      label += " +" + std::to_string(*over) + " ms";
    }
    if (auto sig = integer(md, "signal")) {
      label += ", " + signal_text(*sig);
    }
    place_on_worker(
        host,
        pid,
        std::nullopt,
        Note{
            .mark = Mark::kTimer,
            .t_ms = r.t_ms,
            .label = label,
            .tooltip = label + "\nworker pid " + pid,
            .args =
                fields(md, {"worker_id", "scope_id", "overrun_ms", "signal"})});
  }

  void worker_hung(const Record& r, const std::string& host) {
    const json& md = r.body;
    std::string label = "hung";
    if (auto age = integer(md, "heartbeat_age_ms")) {
      label += ": no heartbeat for " +
               seconds_text(static_cast<double>(*age) / 1000);
    }
    std::string pid = str(md, "pid").value_or("?");
    std::string tooltip = label + "\nrank " + str(md, "rank").value_or("?") +
                          ", pid " + pid + "; killed with SIGKILL";
    if (auto stack = str(md, "stack"); stack && !one_line(*stack).empty()) {
      tooltip += "\n\n" + *stack;
    }
    place_on_worker(
        host,
        pid,
        integer(md, "rank"),
        Note{
            .mark = Mark::kHang,
            .t_ms = r.t_ms,
            .label = label,
            .tooltip = tooltip,
            .args = fields(
                md,
                {"rank", "local_rank", "pid", "heartbeat_age_ms", "stack"})});
  }

  // Only failed checks: a passing one changes nothing worth drawing.
  void health_check(const Record& r, const std::string& host) {
    const json& md = r.body;
    if (str(md, "healthy").value_or("true") != "false") {
      return;
    }
    std::string label = "health check " + str(md, "check").value_or("?") +
                        " failed: " + one_line(str(md, "detail").value_or(""));
    tl_.agent_notes[host].push_back(Note{
        .mark = Mark::kFailure,
        .t_ms = r.t_ms,
        .label = label,
        .tooltip = label,
        .args = fields(md, {"check", "detail", "duration_ms", "attempt"})});
  }

  // On the lane of the worker with that pid (or else rank) on host, or on
  // the host's agent lane when the worker is not known.
  void place_on_worker(
      const std::string& host,
      const std::string& pid,
      std::optional<int64_t> rank,
      Note note) {
    WorkerLane* lane = nullptr;
    if (auto it = by_pid_.find({host, pid}); it != by_pid_.end()) {
      lane = it->second;
    } else if (auto w =
                   rank ? tl_.workers.find({host, *rank}) : tl_.workers.end();
               w != tl_.workers.end()) {
      lane = &w->second;
    }
    (lane ? lane->notes : tl_.agent_notes[host]).push_back(std::move(note));
  }

  // Rendezvous events go on their host's agent lane; a host name that no
  // agent event uses goes on the only host's, if there is one. Failed rounds
  // are drawn, and a round still joining at the end of the file.
  void place_rdzv_events() {
    std::set<std::string> hosts;
    for (const auto& [host, notes] : tl_.agent_notes) {
      hosts.insert(host);
    }
    for (const auto& [key, lane] : tl_.workers) {
      hosts.insert(key.first);
    }
    for (const auto& [rdzv_host, events] : rdzv_) {
      std::string host = rdzv_host;
      if (!hosts.count(host) && hosts.size() == 1) {
        host = *hosts.begin();
      }
      std::vector<Note>& notes = tl_.agent_notes[host];
      for (const Record* r : events) {
        std::string message = one_line(str(r->body, "message").value_or(""));
        std::string trace = str(r->body, "error_trace").value_or("");
        if (str(r->body, "node_state") == "FAILED" || !trace.empty()) {
          std::string label = "rendezvous failed: " +
                              (message.empty() ? one_line(trace) : message);
          notes.push_back(Note{
              .mark = Mark::kFailure,
              .t_ms = r->t_ms,
              .label = label,
              .tooltip = label + (trace.empty() ? "" : "\n\n" + trace),
              .args =
                  fields(r->body, {"message", "node_state", "error_trace"})});
        }
      }
      const Record* last = events.back();
      bool done = std::any_of(notes.begin(), notes.end(), [&](const Note& n) {
        return n.mark == Mark::kRendezvous && n.t_ms >= last->t_ms;
      });
      if (!done && str(last->body, "node_state") == "INIT") {
        std::string message = one_line(str(last->body, "message").value_or(""));
        std::string label = "in rendezvous: " + message;
        notes.push_back(Note{
            .mark = Mark::kRdzvPending,
            .t_ms = last->t_ms,
            .label = label,
            .tooltip = label,
            .args = fields(last->body, {"message", "node_state"})});
      }
    }
  }

  Timeline tl_;
  Warnings& warnings_;
  // The bar of each live worker, by (host, pid).
  std::map<std::pair<std::string, std::string>, std::pair<WorkerLane*, size_t>>
      open_;
  std::map<std::pair<std::string, std::string>, WorkerLane*> by_pid_;
  // Rendezvous events by their own hostname, placed once all agent events
  // are in (their hostname need not match the agent's).
  std::map<std::string, std::vector<const Record*>> rdzv_;
};

}  // namespace

Timeline build_timeline(
    const std::vector<Record>& records, Warnings& warnings) {
  Builder builder(records, warnings);
  for (const Record& r : records) {
    builder.add(r);
  }
  return std::move(builder).finish();
}

}  // namespace tide::timeline
