#include "tide-timeline/model.h"

#include <string.h>

#include <algorithm>

#include "tide-timeline/text.h"

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

namespace {

std::string signal_text(int64_t sig) {
  const char* name =
      sig > 0 && sig < 65 ? sigabbrev_np(static_cast<int>(sig)) : nullptr;
  return name ? std::string("SIG") + name : "signal " + std::to_string(sig);
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
    }
  }

  Timeline finish() && {
    for (auto& [key, lane] : tl_.workers) {
      for (Bar& bar : lane.bars) {
        if (bar.outcome == Outcome::kRunning) {
          bar.end_ms = tl_.t1;
        }
        if (bar.outcome == Outcome::kFailed) {
          lane.notes.push_back(Note{
              .mark = Mark::kFailure,
              .t_ms = bar.end_ms,
              .from_ms = bar.start_ms,
              .label = short_error(bar.error),
              .tooltip = "rank " + std::to_string(lane.rank) + " (pid " +
                         bar.pid + ") failed:\n" + bar.error});
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
                   str(md, "master_endpoint").value_or("?")});
  }

  void restart(const Record& r, const std::string& host, int64_t restarts) {
    std::string label =
        "restart: " + str(r.body, "reason").value_or("unknown reason");
    if (auto left = integer(r.body, "remaining_restarts")) {
      label += " (" + std::to_string(*left) + " left)";
    }
    tl_.agent_notes[host].push_back(Note{
        .mark = Mark::kRestart,
        .t_ms = r.t_ms,
        .label = label,
        .tooltip = label + "\nthen attempt " + std::to_string(restarts)});
    tl_.boundaries.push_back(Boundary{
        .t_ms = r.t_ms, .label = "attempt " + std::to_string(restarts)});
  }

  void timer_expired(const Record& r, const std::string& host) {
    const json& md = r.body;
    std::string pid = str(md, "worker_id").value_or("?");
    std::string label = "timer expired";
    if (auto scope = str(md, "scope_id")) {
      label += ": " + truncate(one_line(*scope), 40);
    }
    if (auto over = integer(md, "overrun_ms"); over && *over > 0) {
      label += " +" + std::to_string(*over) + " ms";
    }
    if (auto sig = integer(md, "signal")) {
      label += ", " + signal_text(*sig);
    }
    Note note{
        .mark = Mark::kTimer,
        .t_ms = r.t_ms,
        .label = label,
        .tooltip = label + "\nworker pid " + pid};
    auto lane = by_pid_.find({host, pid});
    if (lane != by_pid_.end()) {
      lane->second->notes.push_back(std::move(note));
    } else {
      tl_.agent_notes[host].push_back(std::move(note));
    }
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
          notes.push_back(Note{
              .mark = Mark::kFailure,
              .t_ms = r->t_ms,
              .label =
                  "rendezvous failed: " +
                  truncate(message.empty() ? one_line(trace) : message, 80),
              .tooltip = message + "\n" + trace});
        }
      }
      const Record* last = events.back();
      bool done = std::any_of(notes.begin(), notes.end(), [&](const Note& n) {
        return n.mark == Mark::kRendezvous && n.t_ms >= last->t_ms;
      });
      if (!done && str(last->body, "node_state") == "INIT") {
        std::string message = one_line(str(last->body, "message").value_or(""));
        notes.push_back(Note{
            .mark = Mark::kRdzvPending,
            .t_ms = last->t_ms,
            .label = "in rendezvous: " + truncate(message, 80),
            .tooltip = message});
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
