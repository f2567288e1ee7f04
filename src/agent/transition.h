#pragma once

// A worker group's life, written once (docs/agent.md#the-groups-life): the
// events the agent observes, the state each moves the node to, and what the
// agent does about it. decide() is the table; the agent's run loop only
// observes, asks decide() and acts, and its components (agent/component.h)
// report each transition.
#include <exception>
#include <map>
#include <optional>
#include <string>

#include "tide/agent/local_elastic_agent.h"
#include "tide/status/job_status.h"

#include "common/clock.h"

namespace tide::agent::detail {

// What happened to the worker group.
enum class GroupEvent {
  kStarted,            // a round completed and its workers started
  kSucceeded,          // every worker exited 0
  kFailed,             // a worker exited non-zero or by a signal
  kMembershipChanged,  // nodes wait to join, or a member was lost
  kStopRequested,      // the agent was asked to stop (request_stop)
  kRendezvousLost,     // the rendezvous is gone or closed (another node ended
                       // the job)
  kAborted,            // run() ended by an error (no workers left to stop)
};
const char* to_string(GroupEvent e);

// What the agent does once a transition is announced.
enum class Action {
  kWatch,    // the workers run: watch them
  kRestart,  // stop the workers, then a new round and a new group
  kFinish,   // stop the workers (draining their output), wait in the exit
             // barrier, return success
  kGiveUp,   // stop the workers, end the job for every node, return the
             // failures
  kStop,     // stop the workers and raise (the signal, or the rendezvous'
             // error)
  kNothing,  // nothing to act on (aborted: the error goes on up)
};

// Restarts after failures: used so far (TORCHELASTIC_RESTART_COUNT, the
// attempt directories, events) and left. Admitting nodes uses none.
struct Restarts {
  int used = 0;
  int left = 0;
};

// What the agent saw, for decide().
struct Observation {
  GroupEvent event = GroupEvent::kStarted;
  // kFailed: the failed workers, by global rank (not empty).
  std::map<int, ProcessFailure> failures;
  // A stop requested (its signal), or 0.
  int stop_signal = 0;
  // kMembershipChanged: the nodes waiting or lost.
  int nodes_waiting = 0;
  // kRendezvousLost, kAborted: the error's text; kRendezvousLost: the
  // error itself, raised once the workers are stopped.
  std::string error;
  std::exception_ptr cause;
  // kStarted: the transition whose restart this group is (none for the
  // first group).
  std::optional<GroupEvent> restart_of;
  // When the agent saw it (kStarted: when it saw what it restarts for).
  Clock::time_point seen = Clock::now();
};

// One move of the node's state, announced to every component.
struct Transition {
  GroupEvent event = GroupEvent::kStarted;
  status::NodeState to = status::NodeState::kStarting;
  Action action = Action::kWatch;
  // Why, as the status board and the logs say it ("" when nothing needs
  // explaining: started, succeeded).
  std::string reason;
  std::map<int, ProcessFailure> failures;  // kFailed
  int signal = 0;                          // kStopRequested
  int nodes_waiting = 0;                   // kMembershipChanged
  std::optional<GroupEvent> restart_of;    // kStarted
  std::exception_ptr cause;                // kRendezvousLost
  Clock::time_point seen;
  // The restarts once the agent has acted: one more used when a failure
  // restarts the group.
  Restarts restarts;
};

// The table: the transition the agent makes on `o`, with `restarts` as they
// stand.
Transition decide(Observation o, Restarts restarts);

// The torch state (WorkerGroup::state) of a node in state `s`: torch's agent
// stops a group it restarts (STOPPED) and starts it again.
WorkerState worker_state(status::NodeState s);

// The attempt's outcome on the status board when `e` ends it.
const char* attempt_outcome(GroupEvent e);

// The "SIGTERM" of a signal number.
std::string signal_text(int sig);

}  // namespace tide::agent::detail
