#pragma once

// A feature of the agent as a part of its own (docs/agent.md#components):
// it owns its state, reads the agent's core through an AgentView, and
// observes the group's transitions. One that watches a file descriptor or a
// deadline hands it to the agent's poll loop, which knows none of them by
// name. A new feature is a new component, not new fields in the agent.
#include <sys/types.h>

#include <map>
#include <set>
#include <string>

#include "tide/agent/local_elastic_agent.h"
#include "tide/rendezvous/rendezvous_handler.h"

#include "agent/transition.h"
#include "common/clock.h"

namespace tide::agent::detail {

class GroupProcesses;

// The agent's core, as its parts read it (references into the agent, valid
// while it lives; written by the agent's thread only).
struct AgentView {
  const WorkerSpec& spec;
  const std::string& host;
  // The run's log directory: set when run() begins, before any component
  // starts.
  const std::string& run_log_dir;
  // The round's group: its ranks, its workers' pids once started.
  const WorkerGroup& group;
  const rendezvous::RendezvousInfo& rdzv;
  const Restarts& restarts;
  const double& started_at;  // seconds since the epoch
};

// Every hook runs on the agent's thread, in the order the components were
// added; all have a default that does nothing.
class Component {
 public:
  virtual ~Component() = default;

  // run() begins (the log directory exists). May throw: the run fails.
  virtual void start() {}
  // Before each rendezvous (the node may still choose not to join: throw).
  virtual void before_rendezvous() {}
  // The variables this component gives each worker.
  virtual void add_env(std::map<std::string, std::string>& /*env*/) const {}
  // Rewrites a failure's message when this component caused it.
  virtual void explain(ProcessFailure& /*failure*/) const {}

  // The node enters t.to, before the agent acts on it (kStarted: before
  // the workers start).
  virtual void entered(const Transition& /*t*/) {}
  // The agent acted: the workers started (kStarted) or were stopped, and
  // the restarts are counted.
  virtual void acted(const Transition& /*t*/) {}
  // These workers ended (their pids may be reused from now on).
  virtual void exited(const std::set<pid_t>& /*pids*/) {}

  // A descriptor for the poll loop (-1: none), and what to do once it is
  // readable.
  virtual int fd() const {
    return -1;
  }
  virtual void readable() {}
  // When the component must act next (max: never), and acting then.
  virtual Clock::time_point deadline() const {
    return Clock::time_point::max();
  }
  virtual void due() {}
};

}  // namespace tide::agent::detail
