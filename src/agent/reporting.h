#pragma once

// Reporting (docs/observability.md): what the agent tells the world of each
// transition, written once: its log lines, torch's worker and agent events,
// torch's legacy metrics and tide's native ones, and the status snapshot of
// the health endpoint. The other components report through it, with the
// agent's labels and metadata.
//
// Thread safety: snapshot() from any thread; agent_event(), count() and
// labels() from the agent's thread and from the timer server's; the rest
// from the agent's thread.
#include <mutex>
#include <string>

#include "tide/agent/local_elastic_agent.h"
#include "tide/events/events.h"
#include "tide/metrics/registry.h"

#include "agent/component.h"
#include "common/clock.h"

namespace tide::agent::detail {

class GroupProcesses;

class Reporter final : public Component {
 public:
  Reporter(const AgentView& view, const GroupProcesses& processes);

  // torch's agent event torchelastic.agent.<what>, with the agent's run,
  // role, host and restarts added.
  void agent_event(const std::string& what, events::Event::Metadata meta) const;
  // Native metrics' labels: role, run and node (the host), and `more`.
  metrics::Labels labels(metrics::Labels more = {}) const;
  // Adds n to this agent's counter `name` (..._total).
  void count(const char* name, const char* help, double n = 1) const;
  // torch's legacy metric name: workers.<role>.<name>.
  std::string metric(const std::string& name) const;

  // A rendezvous round this node joined, from `start`: completed or not.
  void round(Clock::time_point start, bool completed) const;
  // The status snapshot (LocalElasticAgent::status(), but last_progress).
  AgentStatus snapshot() const;

  void entered(const Transition& t) override;
  void acted(const Transition& t) override;

 private:
  void set_state(WorkerState s);
  // torch's torchelastic.worker.status.<state> for each worker; a failed
  // one's raw_error is its error file, or else its message.
  void worker_events(const Transition& t) const;
  void worker_event(
      const Worker& w, const char* state, const std::string& raw_error) const;
  // torch's _record_metrics and _record_flakiness_metric.
  void record_run_metrics(bool succeeded) const;

  const AgentView& view_;
  const GroupProcesses& processes_;
  mutable std::mutex mutex_;
  AgentStatus status_;  // Guarded by mutex_.
};

}  // namespace tide::agent::detail
