// What the agent tells the world: the status snapshot (health endpoint),
// torch's worker and agent events, and its metrics.
#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "tide/metrics/metrics.h"

#include "agent/agent_impl.h"

namespace tide::agent {

AgentStatus LocalElasticAgent::status() const {
  std::lock_guard lock(impl_->status_mutex);
  AgentStatus s = impl_->status;
  if (impl_->timer_server) {
    s.last_progress =
        std::max(s.last_progress, impl_->timer_server->last_progress_time());
  }
  return s;
}

void LocalElasticAgent::Impl::set_state(WorkerState s) {
  group.state = s;
  std::string name = to_string(s);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  metrics::put_metric(metric(name), 1);
  std::lock_guard lock(status_mutex);
  status.state = s;
  status.run_id = self.spec_.rdzv_handler->get_run_id();
  status.restart_count = restarts.used;
  status.remaining_restarts = restarts.left;
  status.group_rank = group.group_rank;
  status.group_world_size = group.group_world_size;
  status.workers = group.workers;
  status.started_at = started_at;
  status.last_progress = now_seconds();
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

}  // namespace tide::agent
