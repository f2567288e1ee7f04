#include "timeline/trace.h"

#include <algorithm>
#include <set>

#include "timeline/nodes.h"
#include "timeline/text.h"

namespace tide::timeline {
namespace {

constexpr int64_t kAgentTid = 1;
// A job view's node: its attempts' track (it has no workers' tracks).
constexpr int64_t kAttemptsTid = 2;

int64_t worker_tid(int64_t rank) {
  return rank + 2;
}

// The colour chrome://tracing draws an outcome in (one of its reserved
// names; Perfetto picks its own).
const char* colour(Outcome o) {
  switch (o) {
    case Outcome::kSucceeded:
      return "good";
    case Outcome::kFailed:
      return "terrible";
    case Outcome::kTerminated:
      return "grey";
    case Outcome::kRunning:
      return "generic_work";
  }
  return "generic_work";
}

std::string event_name(const Note& n) {
  switch (n.mark) {
    case Mark::kRendezvous:
      return "rendezvous";
    case Mark::kRestart:
      return "restart";
    case Mark::kTimer:
      return "timer expired";
    case Mark::kHang:
      return "worker hung";
    case Mark::kRdzvPending:
      return "in rendezvous";
    case Mark::kFailure:
      // "rendezvous failed", "health check nccl failed", ...
      return n.label.substr(0, n.label.find(':'));
  }
  return "note";
}

// A worker's OS pid as a number when it is one.
json pid_value(const std::string& pid) {
  json j = json::parse(pid, nullptr, false);
  return j.is_number_integer() ? j : json(pid);
}

class Trace {
 public:
  explicit Trace(const Timeline& tl) : tl_(tl) {}

  std::string build(const std::string& title) {
    std::vector<Node> nodes = group_by_node(tl_);
    for (size_t i = 0; i < nodes.size(); ++i) {
      node(nodes[i], static_cast<int64_t>(i) + 1);
    }
    attempts(nodes);
    std::stable_sort(
        events_.begin(), events_.end(), [](const json& a, const json& b) {
          return a.value("ts", int64_t{0}) < b.value("ts", int64_t{0});
        });
    json other = {
        {"generator", "tide-timeline"},
        {"title", title},
        {"first_event_utc", utc_text(tl_.t0)},
        {"first_event_unix_ms", tl_.t0}};
    if (!tl_.run_id.empty()) {
      other["run_id"] = tl_.run_id;
    }
    // An event a line: a diff or grep of the file stays readable.
    std::string out = "{\"traceEvents\":[\n";
    bool first = true;
    for (const std::vector<json>* list : {&metadata_, &events_}) {
      for (const json& e : *list) {
        out += (first ? "" : ",\n") + e.dump();
        first = false;
      }
    }
    return out +
           "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":" + other.dump() +
           "}\n";
  }

 private:
  int64_t us(int64_t t_ms) const {
    return (std::max(t_ms, tl_.t0) - tl_.t0) * 1000;
  }

  void meta(const char* name, int64_t pid, int64_t tid, json args) {
    metadata_.push_back(
        {{"name", name},
         {"ph", "M"},
         {"pid", pid},
         {"tid", tid},
         {"args", std::move(args)}});
  }

  void node(const Node& node, int64_t pid) {
    meta("process_name", pid, 0, {{"name", node.host}});
    meta("process_sort_index", pid, 0, {{"sort_index", pid}});
    if (node.group_rank) {
      meta(
          "process_labels",
          pid,
          0,
          {{"labels", "group rank " + std::to_string(*node.group_rank)}});
    }
    meta("thread_name", pid, kAgentTid, {{"name", "agent"}});
    meta("thread_sort_index", pid, kAgentTid, {{"sort_index", 0}});
    for (const Note& n : node.agent_notes) {
      note(n, pid, kAgentTid);
    }
    if (node.record) {
      meta("thread_name", pid, kAttemptsTid, {{"name", "attempts"}});
      meta("thread_sort_index", pid, kAttemptsTid, {{"sort_index", 1}});
      for (const RecordedAttempt& a : node.record->attempts) {
        recorded(node, a, pid);
      }
    }
    for (const WorkerLane* w : node.workers) {
      int64_t tid = worker_tid(w->rank);
      meta(
          "thread_name",
          pid,
          tid,
          {{"name", "rank " + std::to_string(w->rank)}});
      meta("thread_sort_index", pid, tid, {{"sort_index", w->rank + 1}});
      for (const Bar& bar : w->bars) {
        worker(*w, bar, pid, tid);
      }
      for (const Note& n : w->notes) {
        // A failure is its worker's event already.
        if (n.mark != Mark::kFailure) {
          note(n, pid, tid);
        }
      }
    }
  }

  void worker(const WorkerLane& w, const Bar& bar, int64_t pid, int64_t tid) {
    json args = {
        {"pid", pid_value(bar.pid)},
        {"attempt", bar.attempt},
        {"outcome", css_class(bar.outcome)},
        {"rank", w.rank},
        {"host", w.host}};
    if (w.local_rank) {
      args["local_rank"] = *w.local_rank;
    }
    if (!w.role.empty()) {
      args["role"] = w.role;
    }
    if (bar.outcome == Outcome::kFailed) {
      args["error"] = short_error(bar.error);
      if (one_line(bar.error) != args["error"].get<std::string>()) {
        args["raw_error"] = bar.error;
      }
    }
    if (!bar.start_seen) {
      args["started_before_file"] = true;
    }
    events_.push_back(
        {{"name", css_class(bar.outcome)},
         {"cat", "worker"},
         {"ph", "X"},
         {"ts", us(bar.start_ms)},
         {"dur", us(bar.end_ms) - us(bar.start_ms)},
         {"pid", pid},
         {"tid", tid},
         {"cname", colour(bar.outcome)},
         {"args", std::move(args)}});
  }

  // A job view's attempt of a node, as its agent recorded it.
  void recorded(const Node& node, const RecordedAttempt& a, int64_t pid) {
    json args = {
        {"attempt", a.attempt},
        {"round", a.round},
        {"outcome", outcome_name(a.outcome)},
        {"host", node.host}};
    if (!a.reason.empty()) {
      args["reason"] = a.reason;
    }
    events_.push_back(
        {{"name", css_class(a.outcome)},
         {"cat", "attempt"},
         {"ph", "X"},
         {"ts", us(a.start_ms)},
         {"dur", us(a.end_ms) - us(a.start_ms)},
         {"pid", pid},
         {"tid", kAttemptsTid},
         {"cname", colour(a.outcome)},
         {"args", std::move(args)}});
  }

  void note(const Note& n, int64_t pid, int64_t tid) {
    json args = n.args.is_object() ? n.args : json::object();
    args["label"] = n.label;
    json e = {
        {"name", event_name(n)},
        {"cat", "agent"},
        {"pid", pid},
        {"tid", tid},
        {"args", std::move(args)}};
    // A wait that began before the file did is clipped to its start.
    if (n.mark == Mark::kRendezvous && us(n.from_ms) < us(n.t_ms)) {
      e["ph"] = "X";
      e["ts"] = us(n.from_ms);
      e["dur"] = us(n.t_ms) - us(n.from_ms);
    } else {
      e["ph"] = "i";
      e["s"] = "t";
      e["ts"] = us(n.t_ms);
    }
    events_.push_back(std::move(e));
  }

  // Each attempt's start, once however many agents restarted into it: a
  // global instant, drawn across every track.
  void attempts(const std::vector<Node>& nodes) {
    if (nodes.empty()) {
      return;
    }
    events_.push_back(
        {{"name", "attempt 0"},
         {"cat", "attempt"},
         {"ph", "i"},
         {"s", "g"},
         {"ts", 0},
         {"pid", 1},
         {"tid", kAgentTid}});
    std::set<std::string> seen;
    for (const Boundary& b : tl_.boundaries) {
      if (seen.insert(b.label).second) {
        events_.push_back(
            {{"name", b.label},
             {"cat", "attempt"},
             {"ph", "i"},
             {"s", "g"},
             {"ts", us(b.t_ms)},
             {"pid", 1},
             {"tid", kAgentTid}});
      }
    }
  }

  const Timeline& tl_;
  std::vector<json> metadata_;
  std::vector<json> events_;
};

}  // namespace

std::string render_trace(const Timeline& timeline, const std::string& title) {
  return Trace(timeline).build(title);
}

}  // namespace tide::timeline
