#include "agent/reporting.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "tide/common/logging.h"
#include "tide/metrics/metrics.h"

#include "agent/group_processes.h"

namespace tide::agent::detail {

namespace {

constexpr WorkerState kStates[] = {
    WorkerState::kUnknown,
    WorkerState::kInit,
    WorkerState::kHealthy,
    WorkerState::kUnhealthy,
    WorkerState::kStopped,
    WorkerState::kSucceeded,
    WorkerState::kFailed,
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  return s;
}

// The reason label of a restart's metrics.
const char* restart_label(GroupEvent e) {
  return e == GroupEvent::kFailed ? "worker_failure" : "membership_change";
}

}  // namespace

Reporter::Reporter(const AgentView& view, const GroupProcesses& processes)
    : view_(view), processes_(processes) {}

std::string Reporter::metric(const std::string& name) const {
  return "workers." + view_.spec.role + "." + name;
}

metrics::Labels Reporter::labels(metrics::Labels more) const {
  more["role"] = view_.spec.role;
  more["run"] = view_.spec.rdzv_handler->get_run_id();
  more["node"] = view_.host;
  return more;
}

void Reporter::count(const char* name, const char* help, double n) const {
  metrics::counter(name, help, labels()).inc(n);
}

AgentStatus Reporter::snapshot() const {
  std::lock_guard lock(mutex_);
  return status_;
}

void Reporter::entered(const Transition& t) {
  const WorkerSpec& spec = view_.spec;
  switch (t.event) {
    case GroupEvent::kStarted:
      // Before the first worker runs: anything a worker makes visible (a
      // line of output, a store key) comes after the agent says it runs.
      metrics::put_metric(metric("remaining_restarts"), view_.restarts.left);
      break;
    case GroupEvent::kSucceeded:
      record_run_metrics(true);
      TIDE_LOG_INFO("[{}] all workers succeeded", spec.role);
      break;
    case GroupEvent::kFailed:
      count(
          "tide_agent_worker_failures_total",
          "Workers that failed (exited non-zero or by a signal).",
          static_cast<double>(t.failures.size()));
      for (const auto& [rank, f] : t.failures) {
        TIDE_LOG_WARN(
            "[{}] worker rank {} (local {}, pid {}) failed: {}",
            spec.role,
            rank,
            f.local_rank,
            f.pid,
            f.message);
      }
      break;
    case GroupEvent::kMembershipChanged:
      TIDE_LOG_INFO(
          "[{}] membership changed ({} node(s) waiting or lost); restarting "
          "the group (not counted as a restart)",
          spec.role,
          t.nodes_waiting);
      break;
    case GroupEvent::kStopRequested:
      TIDE_LOG_WARN(
          "[{}] received {}; stopping workers",
          spec.role,
          signal_text(t.signal));
      break;
    case GroupEvent::kRendezvousLost:
      TIDE_LOG_ERROR("[{}] {}; stopping workers", spec.role, t.reason);
      break;
    case GroupEvent::kAborted:
      break;
  }
  set_state(worker_state(t.to));
}

void Reporter::acted(const Transition& t) {
  const WorkerSpec& spec = view_.spec;
  worker_events(t);
  switch (t.action) {
    case Action::kWatch: {
      {
        std::lock_guard lock(mutex_);
        status_.workers = view_.group.workers;  // now with their pids
      }
      const auto& workers = view_.group.workers;
      TIDE_LOG_INFO(
          "[{}] started {} workers (attempt {}, ranks {}-{} of {}, {} "
          "restarts left)",
          spec.role,
          spec.local_world_size,
          view_.restarts.used,
          workers.front().global_rank,
          workers.back().global_rank,
          workers.front().world_size,
          view_.restarts.left);
      if (t.restart_of) {
        metrics::histogram(
            "tide_agent_restart_seconds",
            "Time from a failure or change of membership seen to the new "
            "workers started (stop, rendezvous, start).",
            labels({{"reason", restart_label(*t.restart_of)}}))
            .observe(
                std::chrono::duration<double>(Clock::now() - t.seen).count());
      }
      return;
    }
    case Action::kRestart: {
      if (t.event == GroupEvent::kFailed) {
        TIDE_LOG_INFO(
            "[{}] restarting the worker group ({} of {} restarts used)",
            spec.role,
            t.restarts.used,
            spec.max_restarts);
        agent_event(
            "restart",
            {{"reason", std::string("worker failure")},
             {"remaining_restarts", int64_t{t.restarts.left}}});
      } else {
        agent_event(
            "restart",
            {{"reason", std::string("membership changed")},
             {"nodes_waiting", int64_t{t.nodes_waiting}}});
      }
      metrics::counter(
          "tide_agent_restarts_total",
          "Restarts of the worker group, after a worker failure or a change "
          "of membership.",
          labels({{"reason", restart_label(t.event)}}))
          .inc();
      return;
    }
    case Action::kGiveUp:
      record_run_metrics(false);
      TIDE_LOG_ERROR(
          "[{}] worker group failed and no restarts are left ({} allowed)",
          spec.role,
          spec.max_restarts);
      return;
    default:
      return;
  }
}

void Reporter::set_state(WorkerState s) {
  metrics::put_metric(metric(lower(to_string(s))), 1);
  // One series per state, 1 for the group's: a panel or alert selects the
  // state by label (tide_agent_state{state="failed"} == 1).
  for (WorkerState each : kStates) {
    metrics::gauge(
        "tide_agent_state",
        "1 for the state the agent's worker group is in, 0 for the others.",
        labels({{"state", lower(to_string(each))}}))
        .set(each == s ? 1 : 0);
  }
  metrics::gauge(
      "tide_agent_workers", "Worker processes the agent runs now.", labels())
      .set(
          s == WorkerState::kHealthy
              ? static_cast<double>(view_.group.workers.size())
              : 0);
  metrics::gauge(
      "tide_agent_remaining_restarts",
      "Restarts after failures the agent has left (--max-restarts).",
      labels())
      .set(view_.restarts.left);
  std::lock_guard lock(mutex_);
  status_.state = s;
  status_.run_id = view_.spec.rdzv_handler->get_run_id();
  status_.restart_count = view_.restarts.used;
  status_.remaining_restarts = view_.restarts.left;
  status_.group_rank = view_.group.group_rank;
  status_.group_world_size = view_.group.group_world_size;
  status_.workers = view_.group.workers;
  status_.started_at = view_.started_at;
  status_.last_progress = now_seconds();
}

void Reporter::worker_events(const Transition& t) const {
  const char* state = nullptr;
  switch (t.event) {
    case GroupEvent::kStarted:
      state = "HEALTHY";
      break;
    case GroupEvent::kSucceeded:
      state = "SUCCEEDED";
      break;
    case GroupEvent::kAborted:
      return;
    default:
      state = "TERMINATED";
      break;
  }
  for (const Worker& w : view_.group.workers) {
    auto f = t.failures.find(w.global_rank);
    if (f == t.failures.end()) {
      worker_event(w, state, "");
      continue;
    }
    worker_event(
        w,
        "FAILED",
        f->second.error_file_data.empty() ? f->second.message
                                          : f->second.error_file_data);
  }
}

void Reporter::worker_event(
    const Worker& w, const char* state, const std::string& raw_error) const {
  if (!events::enabled()) {
    return;
  }
  // An ended worker's event carries the time it ended, not the time the
  // agent got round to reporting it.
  int64_t at = 0;
  auto i = static_cast<size_t>(w.local_rank);
  if (i < processes_.size() && processes_[i].exited()) {
    at = static_cast<int64_t>(processes_[i].exit_time() * 1000);
  }
  const WorkerSpec& spec = view_.spec;
  const WorkerGroup& group = view_.group;
  nlohmann::json md = {
      {"group_world_size", group.group_world_size},
      {"entry_point", entrypoint_name(spec.entrypoint)},
      {"local_rank", w.local_rank},
      {"role_rank", w.role_rank},
      {"role_world_size", w.role_world_size},
  };
  events::Event e{
      .name = std::string("torchelastic.worker.status.") + state,
      .source = events::EventSource::kAgent,
      .timestamp = at,
      .metadata = {
          {"run_id", spec.rdzv_handler->get_run_id()},
          {"global_rank", int64_t{w.global_rank}},
          {"group_rank", int64_t{group.group_rank}},
          {"worker_id", std::to_string(w.pid)},
          {"role", spec.role},
          {"hostname", view_.host},
          {"state", std::string(state)},
          {"total_run_time",
           static_cast<int64_t>(now_seconds() - view_.started_at)},
          {"rdzv_backend", spec.rdzv_handler->get_backend()},
          {"raw_error",
           raw_error.empty() ? events::MetadataValue{} : raw_error},
          {"metadata", md.dump()},
          {"agent_restarts", int64_t{view_.restarts.used}},
      }};
  events::record(std::move(e));
}

void Reporter::agent_event(
    const std::string& what, events::Event::Metadata meta) const {
  if (!events::enabled()) {
    return;
  }
  meta["run_id"] = view_.spec.rdzv_handler->get_run_id();
  meta["role"] = view_.spec.role;
  meta["hostname"] = view_.host;
  meta["agent_restarts"] = int64_t{view_.restarts.used};
  events::record(events::Event{
      .name = "torchelastic.agent." + what,
      .source = events::EventSource::kAgent,
      .metadata = std::move(meta)});
}

void Reporter::record_run_metrics(bool succeeded) const {
  const WorkerSpec& spec = view_.spec;
  bool retried = view_.restarts.used > 0;
  metrics::put_metric(metric("run_total"), 1);
  // All four, 1 for the one that happened and 0 for the others, as torch.
  for (bool success : {true, false}) {
    for (bool retries : {true, false}) {
      metrics::put_metric(
          metric(
              std::string(success ? "run_success" : "run_failed") +
              (retries ? "_with_retries" : "_no_retries")),
          success == succeeded && retries == retried ? 1 : 0);
    }
  }
  int64_t flakiness = 100;
  if (succeeded) {
    flakiness = 100 - 100 * (view_.restarts.left + 1) / (spec.max_restarts + 1);
  }
  metrics::put_metric(metric("flakiness"), flakiness);
}

void Reporter::round(Clock::time_point start, bool completed) const {
  const WorkerSpec& spec = view_.spec;
  const auto& rdzv = view_.rdzv;
  metrics::Labels round_labels = {
      {"run", spec.rdzv_handler->get_run_id()},
      {"node", view_.host},
      {"backend", spec.rdzv_handler->get_backend()}};
  if (!completed) {
    metrics::counter(
        "tide_rendezvous_failures_total",
        "Rendezvous rounds this node joined that failed.",
        round_labels)
        .inc();
    return;
  }
  auto took = Clock::now() - start;
  metrics::counter(
      "tide_rendezvous_rounds_total",
      "Rendezvous rounds this node completed.",
      round_labels)
      .inc();
  metrics::histogram(
      "tide_rendezvous_round_seconds",
      "Time this node spent in a rendezvous round, from joining to the "
      "group known.",
      round_labels)
      .observe(std::chrono::duration<double>(took).count());
  metrics::gauge(
      "tide_rendezvous_nodes",
      "Nodes in the last rendezvous round (its world size).",
      round_labels)
      .set(rdzv.world_size);
  auto took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(took);
  agent_event(
      "rendezvous",
      {{"group_rank", int64_t{rdzv.rank}},
       {"group_world_size", int64_t{rdzv.world_size}},
       {"duration_ms", static_cast<int64_t>(took_ms.count())},
       {"master_endpoint",
        rdzv.bootstrap.master_addr + ":" +
            std::to_string(rdzv.bootstrap.master_port)}});
  TIDE_LOG_INFO(
      "[{}] rendezvous complete in {} ms: this node is {} of {} (run {})",
      spec.role,
      took_ms.count(),
      rdzv.rank,
      rdzv.world_size,
      spec.rdzv_handler->get_run_id());
}

}  // namespace tide::agent::detail
