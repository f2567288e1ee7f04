#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "tide/agent/worker.h"
#include "tide/agent/worker_spec.h"
#include "tide/common/error.h"
#include "tide/status/job_status.h"

// The agent: runs one node's worker group, restarts it on failure, admits
// new nodes, and reports how it ended (torch's LocalElasticAgent).
namespace tide::agent {

// run() was interrupted by request_stop(sig): the workers were stopped.
class SignalException : public Error {
 public:
  SignalException(int sig, const std::string& what) : Error(what), sig_(sig) {}
  int signal() const {
    return sig_;
  }

 private:
  int sig_;
};

// A snapshot of what the agent is doing, for health checks.
struct AgentStatus {
  WorkerState state = WorkerState::kInit;
  std::string run_id;
  int restart_count = 0;
  int remaining_restarts = 0;
  int group_rank = -1;
  int group_world_size = -1;
  std::vector<Worker> workers;
  // Seconds since the epoch: when the agent started, and the last sign of
  // progress (a worker started or ended, or a timer request arrived).
  double started_at = 0;
  double last_progress = 0;
};

struct AgentOptions {
  // Make the agent a child subreaper and reap any child: orphans of
  // workers (their own children) then end up reaped by the agent instead
  // of init. For programs whose only children are the agent's (tiderun).
  bool adopt_orphans = false;
};

// Thread safety: run() blocks its thread and must not be called twice at
// once; request_stop() may be called from any thread or signal handler.
class LocalElasticAgent {
 public:
  explicit LocalElasticAgent(WorkerSpec spec, AgentOptions options = {});
  ~LocalElasticAgent();
  LocalElasticAgent(const LocalElasticAgent&) = delete;
  LocalElasticAgent& operator=(const LocalElasticAgent&) = delete;

  // Rendezvous, start the workers, watch them; restart the group on a
  // failure while restarts remain, and when nodes wait to join; run the
  // exit barrier after success (docs/tiderun.md#the-exit-barrier). Returns
  // SUCCEEDED with return values or FAILED with failures. Throws
  // SignalException after request_stop(), RendezvousError /
  // RendezvousClosedError / TimeoutError when the rendezvous fails,
  // InvalidArgument for a bad spec.
  RunResult run();

  // Stops the workers with `sig` (then SIGKILL after the grace period) and
  // makes run() throw SignalException; in the exit barrier, where the
  // workers already succeeded, run() leaves it within a second and returns
  // the success. Async-signal-safe.
  void request_stop(int sig) noexcept;

  const WorkerSpec& spec() const {
    return spec_;
  }
  // The group of the current or last attempt.
  const WorkerGroup& worker_group() const;
  // Restarts left after failures (max_restarts at first). The agent's
  // thread, or after run() returned.
  int remaining_restarts() const;
  // Thread safe.
  AgentStatus status() const;
  // This node's record for the job's status board (tide/status/
  // job_status.h), as last made; thread safe.
  status::NodeStatus node_status() const;
  // The directory of local rank's output files (stdout.log, stderr.log,
  // when redirected) in the current attempt; "" before the first start.
  // Thread safe.
  std::string worker_log_dir(int local_rank) const;
  // This run's log directory (<log_dir>/<run_id>_<random>), once run() has
  // started.
  const std::string& run_log_dir() const;

  struct Impl;

 private:
  WorkerSpec spec_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tide::agent
