#include "agent/transition.h"

#include <string.h>

namespace tide::agent::detail {

using status::NodeState;

const char* to_string(GroupEvent e) {
  switch (e) {
    case GroupEvent::kStarted:
      return "started";
    case GroupEvent::kSucceeded:
      return "succeeded";
    case GroupEvent::kFailed:
      return "failed";
    case GroupEvent::kMembershipChanged:
      return "membership changed";
    case GroupEvent::kStopRequested:
      return "stop requested";
    case GroupEvent::kRendezvousLost:
      return "rendezvous lost";
    case GroupEvent::kAborted:
      return "aborted";
  }
  return "?";
}

std::string signal_text(int sig) {
  const char* name = sigabbrev_np(sig);
  return std::string("SIG") + (name ? name : "?");
}

Transition decide(Observation o, Restarts restarts) {
  Transition t{
      .event = o.event,
      .failures = std::move(o.failures),
      .signal = o.stop_signal,
      .nodes_waiting = o.nodes_waiting,
      .restart_of = o.restart_of,
      .cause = o.cause,
      .seen = o.seen,
      .restarts = restarts,
  };
  auto move = [&](NodeState to, Action action, std::string reason = "") {
    t.to = to;
    t.action = action;
    t.reason = std::move(reason);
    return t;
  };
  switch (o.event) {
    case GroupEvent::kStarted:
      return move(NodeState::kHealthy, Action::kWatch);
    case GroupEvent::kSucceeded:
      return move(NodeState::kSucceeded, Action::kFinish);
    case GroupEvent::kFailed: {
      const ProcessFailure& first = t.failures.begin()->second;
      std::string why = "rank " + std::to_string(first.global_rank) +
                        " (local " + std::to_string(first.local_rank) +
                        "): " + first.message;
      if (o.stop_signal != 0) {
        return move(NodeState::kStopped, Action::kStop, why);
      }
      if (restarts.left > 0) {
        t.restarts = {.used = restarts.used + 1, .left = restarts.left - 1};
        return move(NodeState::kRestarting, Action::kRestart, why);
      }
      return move(NodeState::kFailed, Action::kGiveUp, why);
    }
    case GroupEvent::kMembershipChanged:
      return move(
          NodeState::kRestarting,
          Action::kRestart,
          "membership changed: " + std::to_string(o.nodes_waiting) +
              " node(s) waiting or lost");
    case GroupEvent::kStopRequested:
      return move(
          NodeState::kStopped,
          Action::kStop,
          "stopped by " + signal_text(o.stop_signal));
    case GroupEvent::kRendezvousLost:
      return move(NodeState::kFailed, Action::kStop, "rendezvous: " + o.error);
    case GroupEvent::kAborted:
      return move(NodeState::kFailed, Action::kNothing, o.error);
  }
  return t;
}

WorkerState worker_state(NodeState s) {
  switch (s) {
    case NodeState::kStarting:
      return WorkerState::kInit;
    case NodeState::kHealthy:
      return WorkerState::kHealthy;
    case NodeState::kRestarting:
    case NodeState::kStopped:
      return WorkerState::kStopped;
    case NodeState::kSucceeded:
      return WorkerState::kSucceeded;
    case NodeState::kFailed:
      return WorkerState::kFailed;
  }
  return WorkerState::kUnknown;
}

const char* attempt_outcome(GroupEvent e) {
  switch (e) {
    case GroupEvent::kStarted:
      return "RUNNING";
    case GroupEvent::kSucceeded:
      return "SUCCEEDED";
    case GroupEvent::kFailed:
      return "FAILED";
    default:
      return "TERMINATED";
  }
}

}  // namespace tide::agent::detail
