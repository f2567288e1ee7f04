#pragma once

// Expiration timers for the workers (torch's timer server, run by the
// agent): the server (a file or a socket), which processes it may signal
// (the workers and their descendants: each worker leads a session of its
// own), and the failures it caused (the worker's message says which timer
// expired and by how much).
//
// Thread safety: the timer server's thread asks allow_pid and reports reaps
// while the agent's thread changes the workers; last_progress() from any
// thread.
#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "tide/timer/timer_server.h"

#include "agent/component.h"

namespace tide::agent::detail {

class GroupProcesses;
class Reporter;

class WorkerTimers final : public Component {
 public:
  WorkerTimers(
      const AgentView& view,
      const GroupProcesses& processes,
      const Reporter& reporter);
  // Stops the server first: its thread calls back into this component.
  ~WorkerTimers() override;

  // The last timer request seen, in seconds since the epoch (0: none, or
  // no server).
  double last_progress() const;

  // Starts the server (--timer file or socket).
  void start() override;
  // Where the workers' clients find the server.
  void add_env(std::map<std::string, std::string>& env) const override;
  // A worker killed by its expired timer: says which, and by how much.
  void explain(ProcessFailure& failure) const override;
  // kStarted: the new workers may be signalled, the last group's timers go.
  void acted(const Transition& t) override;
  // Reaped workers' timers go (their pids may be reused).
  void exited(const std::set<pid_t>& pids) override;

 private:
  // Whether pid is a running worker or one of its descendants: each worker
  // leads a session of its own, which its children inherit (a child that
  // starts a session of its own leaves the worker's care).
  bool is_worker_or_descendant(pid_t pid) const;

  const AgentView& view_;
  const GroupProcesses& processes_;
  const Reporter& reporter_;
  mutable std::mutex mutex_;
  std::set<pid_t> worker_pids_;                  // Guarded by mutex_.
  std::map<pid_t, timer::ExpiredTimer> reaped_;  // Guarded by mutex_.
  // The variable that tells workers where the server is, and its value
  // ("": no server).
  std::string env_name_;
  std::string env_path_;
  mutable std::mutex server_mutex_;
  // Written under server_mutex_ by the agent's thread, which reads it
  // without.
  std::unique_ptr<timer::TimerServer> server_;
};

}  // namespace tide::agent::detail
