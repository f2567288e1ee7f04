// What the agent tells the world: the status snapshot (health endpoint),
// torch's worker and agent events, and its metrics.
#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "tide/metrics/metrics.h"
#include "tide/metrics/registry.h"

#include "agent/agent_impl.h"

namespace tide::agent {

using status::NodeState;

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

}  // namespace

AgentStatus LocalElasticAgent::status() const {
  std::lock_guard lock(impl_->status_mutex);
  AgentStatus s = impl_->status;
  if (impl_->timer_server) {
    s.last_progress =
        std::max(s.last_progress, impl_->timer_server->last_progress_time());
  }
  return s;
}

void LocalElasticAgent::Impl::enter(NodeState s) {
  node_state = s;
  switch (s) {
    case NodeState::kStarting:
      post_status(/*urgent=*/true);
      return;
    case NodeState::kHealthy:
      return set_state(WorkerState::kHealthy);
    case NodeState::kRestarting:
      // torch's agent stops the group (STOPPED) and starts it again.
      return set_state(WorkerState::kStopped);
    case NodeState::kSucceeded:
      return set_state(WorkerState::kSucceeded);
    case NodeState::kFailed:
      return set_state(WorkerState::kFailed);
    case NodeState::kStopped:
      return set_state(WorkerState::kStopped);
  }
}

void LocalElasticAgent::Impl::set_state(WorkerState s) {
  group.state = s;
  metrics::put_metric(metric(lower(to_string(s))), 1);
  set_state_metrics(s);
  std::unique_lock lock(status_mutex);
  status.state = s;
  status.run_id = self.spec_.rdzv_handler->get_run_id();
  status.restart_count = restarts.used;
  status.remaining_restarts = restarts.left;
  status.group_rank = group.group_rank;
  status.group_world_size = group.group_world_size;
  status.workers = group.workers;
  status.started_at = started_at;
  status.last_progress = now_seconds();
  lock.unlock();
  post_status(/*urgent=*/true);
}

void LocalElasticAgent::Impl::worker_event(
    const Worker& w, const char* state, const std::string& raw_error) {
  if (!events::enabled()) {
    return;
  }
  // An ended worker's event carries the time it ended, not the time the
  // agent got round to reporting it.
  int64_t at = 0;
  for (const auto& p : processes) {
    if (p->local_rank() == w.local_rank && p->exited()) {
      at = static_cast<int64_t>(p->exit_time() * 1000);
    }
  }
  const WorkerSpec& spec = self.spec_;
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
          {"hostname", host},
          {"state", std::string(state)},
          {"total_run_time", static_cast<int64_t>(now_seconds() - started_at)},
          {"rdzv_backend", spec.rdzv_handler->get_backend()},
          {"raw_error",
           raw_error.empty() ? events::MetadataValue{} : raw_error},
          {"metadata", md.dump()},
          {"agent_restarts", int64_t{restarts.used}},
      }};
  events::record(std::move(e));
}

void LocalElasticAgent::Impl::agent_event(
    const std::string& what, events::Event::Metadata meta) {
  if (!events::enabled()) {
    return;
  }
  meta["run_id"] = self.spec_.rdzv_handler->get_run_id();
  meta["role"] = self.spec_.role;
  meta["hostname"] = host;
  meta["agent_restarts"] = int64_t{restarts.used};
  events::record(events::Event{
      .name = "torchelastic.agent." + what,
      .source = events::EventSource::kAgent,
      .metadata = std::move(meta)});
}

void LocalElasticAgent::Impl::record_run_metrics(bool succeeded) {
  // torch's _record_metrics and _record_flakiness_metric.
  const WorkerSpec& spec = self.spec_;
  bool retried = restarts.used > 0;
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
    flakiness = 100 - 100 * (restarts.left + 1) / (spec.max_restarts + 1);
  }
  metrics::put_metric(metric("flakiness"), flakiness);
}

metrics::Labels LocalElasticAgent::Impl::metric_labels(
    metrics::Labels more) const {
  more["role"] = self.spec_.role;
  more["run"] = self.spec_.rdzv_handler->get_run_id();
  more["node"] = host;
  return more;
}

void LocalElasticAgent::Impl::set_state_metrics(WorkerState s) {
  // One series per state, 1 for the group's: a panel or alert selects the
  // state by label (tide_agent_state{state="failed"} == 1).
  for (WorkerState each : kStates) {
    metrics::gauge(
        "tide_agent_state",
        "1 for the state the agent's worker group is in, 0 for the others.",
        metric_labels({{"state", lower(to_string(each))}}))
        .set(each == s ? 1 : 0);
  }
  metrics::gauge(
      "tide_agent_workers",
      "Worker processes the agent runs now.",
      metric_labels())
      .set(
          s == WorkerState::kHealthy ? static_cast<double>(group.workers.size())
                                     : 0);
  metrics::gauge(
      "tide_agent_remaining_restarts",
      "Restarts after failures the agent has left (--max-restarts).",
      metric_labels())
      .set(restarts.left);
}

void LocalElasticAgent::Impl::count_restart(const char* reason) {
  metrics::counter(
      "tide_agent_restarts_total",
      "Restarts of the worker group, after a worker failure or a change of "
      "membership.",
      metric_labels({{"reason", reason}}))
      .inc();
}

void LocalElasticAgent::Impl::time_restart(
    const char* reason, Clock::time_point seen) {
  metrics::histogram(
      "tide_agent_restart_seconds",
      "Time from a failure or change of membership seen to the new workers "
      "started (stop, rendezvous, start).",
      metric_labels({{"reason", reason}}))
      .observe(std::chrono::duration<double>(Clock::now() - seen).count());
}

void LocalElasticAgent::Impl::count_round(
    Clock::time_point start, bool completed) {
  const WorkerSpec& spec = self.spec_;
  metrics::Labels labels = {
      {"run", spec.rdzv_handler->get_run_id()},
      {"node", host},
      {"backend", spec.rdzv_handler->get_backend()}};
  if (!completed) {
    metrics::counter(
        "tide_rendezvous_failures_total",
        "Rendezvous rounds this node joined that failed.",
        labels)
        .inc();
    return;
  }
  metrics::counter(
      "tide_rendezvous_rounds_total",
      "Rendezvous rounds this node completed.",
      labels)
      .inc();
  metrics::histogram(
      "tide_rendezvous_round_seconds",
      "Time this node spent in a rendezvous round, from joining to the "
      "group known.",
      labels)
      .observe(std::chrono::duration<double>(Clock::now() - start).count());
  metrics::gauge(
      "tide_rendezvous_nodes",
      "Nodes in the last rendezvous round (its world size).",
      labels)
      .set(rdzv.world_size);
}

void LocalElasticAgent::Impl::count_agent_event(
    const char* name, const char* help, double n) {
  metrics::counter(name, help, metric_labels()).inc(n);
}

}  // namespace tide::agent
