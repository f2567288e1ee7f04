#pragma once

// The agent's state, shared by its files: the run loop
// (local_elastic_agent.cpp), the exit barrier (exit_barrier.cpp), status,
// events and metrics (reporting.cpp), and the workers' timers
// (worker_timers.cpp). Private to the agent; the agent's thread owns it
// unless a member says otherwise.
#include <sys/eventfd.h>
#include <sys/types.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tide/agent/local_elastic_agent.h"
#include "tide/common/fd.h"
#include "tide/common/host.h"
#include "tide/events/events.h"
#include "tide/metrics/registry.h"
#include "tide/rendezvous/rendezvous_handler.h"
#include "tide/status/job_status.h"
#include "tide/timer/heartbeat.h"
#include "tide/timer/timer_server.h"

#include "agent/janitor.h"
#include "agent/prestart.h"
#include "agent/status_publisher.h"
#include "agent/worker_process.h"
#include "common/clock.h"

namespace tide::agent {

using std::chrono::milliseconds;

struct LocalElasticAgent::Impl {
  explicit Impl(LocalElasticAgent& agent, AgentOptions opts)
      : self(agent), options(opts) {
    wake_fd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_fd) {
      throw Error(std::string("eventfd failed: ") + std::strerror(errno));
    }
  }
  ~Impl() {
    {
      std::lock_guard lock(status_mutex);  // status() reads it
      timer_server.reset();
    }
    processes.clear();
  }

  RunResult run();
  // run()'s loop: rendezvous, start, watch and restart groups until one
  // succeeds or fails for good.
  RunResult run_groups();
  // Throws SignalException (after stopping the workers) once a stop was
  // requested.
  void check_stop();
  void initialize_workers();
  void rendezvous();
  void assign_ranks();
  // The round's secret for the workers' rpc (WorkerSpec::job_secret).
  void choose_rpc_secret();
  void start_workers();
  // The Command entrypoint's resolved executable ("" for a function).
  std::string resolve_exe() const;
  // How local rank w's worker is started in attempt directory `dir`.
  detail::LaunchSpec launch_spec(
      const Worker& w,
      const std::string& exe,
      const std::vector<RankBinding>& numa,
      const std::string& dir) const;
  // A warm worker from the prestart pool when it can take `ls`, else a
  // cold one (the log says why).
  std::unique_ptr<detail::WorkerProcess> start_process(
      const detail::LaunchSpec& ls);
  // --prestart: makes the pool (when the workers run a Python script) and
  // starts its interpreters.
  void start_prestart();
  // Starts the prestarted interpreters missing (all local ranks), bound as
  // `numa` plans.
  void fill_prestart(
      const std::string& exe, const std::vector<RankBinding>& numa);
  // Each local rank's --numa-binding (empty when off), planned once per
  // start so that a topology that cannot hold the group fails the start,
  // not a worker (numa.cpp).
  std::vector<RankBinding> plan_numa() const;
  // Stops every running worker: `sig` to each process group, SIGKILL after
  // the grace period, and gives up on those that survive even that.
  void stop_workers(int sig, milliseconds grace);
  // Waits for events until `deadline`; returns false on timeout.
  bool wait_for_events(Clock::time_point deadline);
  void reap();
  void pump_output();
  WorkerState group_state() const;
  std::map<int, ProcessFailure> failures() const;
  std::map<int, std::string> return_values() const;
  // The exit barrier: count_in() marks this node's part of the job over
  // (the last node to count in completes the barrier); exit_barrier()
  // counts in a node whose workers succeeded and waits for the others.
  void count_in(bool failed);
  void count_in_failed();  // logs instead of throwing
  void exit_barrier();
  std::string attempt_dir() const;
  std::vector<std::string> worker_env(const Worker& w) const;

  LocalElasticAgent& self;
  const AgentOptions options;
  Fd wake_fd;
  std::atomic<int> stop_signal{0};
  std::unique_ptr<detail::Janitor> janitor;
  std::string run_log_dir;
  std::string host = tide::fqdn();
  WorkerGroup group;
  rendezvous::RendezvousInfo rdzv;
  std::string rpc_secret;
  bool warned_shared_secret = false;
  // Restarts after failures: used so far (TORCHELASTIC_RESTART_COUNT, the
  // attempt directories, events) and left. Admitting nodes uses none.
  struct Restarts {
    int used = 0;
    int left = 0;
  } restarts;
  std::vector<std::unique_ptr<detail::WorkerProcess>> processes;
  // --prestart: the waiting interpreters, and the script they run.
  std::unique_ptr<detail::PrestartPool> prestart;
  std::optional<detail::PythonCommand> prestart_cmd;
  std::vector<std::string> result_files;
  std::vector<std::string> error_files;
  // This attempt's filtered_stdout.log and filtered_stderr.log (null: no
  // --duplicate-*-filters).
  std::shared_ptr<const detail::DuplicateSink> duplicate_out;
  std::shared_ptr<const detail::DuplicateSink> duplicate_err;
  std::map<std::string, std::string> base_env;
  bool warned_omp = false;

  // The node's state moves to `s` (tide/status/job_status.h), in one place:
  // the group's WorkerState (torch's: status(), metrics) follows, and the
  // node's record is posted at once. Called after the attempt's outcome is
  // recorded (end_attempt) and before the agent acts on the move, so a
  // record never shows a group doing what its state denies.
  void enter(status::NodeState s);
  status::NodeState node_state = status::NodeState::kStarting;
  // Local ranks whose exit ended the running attempt (failures()).
  std::set<int> attempt_failures;
  // Metrics, events and the status snapshot (read by other threads).
  void set_state(WorkerState s);
  void worker_event(
      const Worker& w, const char* state, const std::string& raw_error = "");
  void agent_event(const std::string& what, events::Event::Metadata meta);
  void record_run_metrics(bool succeeded);
  // Native metrics (registry.h, docs/observability.md), labelled role, run
  // and node (the host); reporting.cpp. A restart is counted when decided
  // and timed from `seen` (the failure or change) to its workers' start.
  metrics::Labels metric_labels(metrics::Labels more = {}) const;
  void set_state_metrics(WorkerState s);
  void count_restart(const char* reason);
  void time_restart(const char* reason, Clock::time_point seen);
  void count_round(Clock::time_point start, bool completed);
  // Adds n to the counter `name` (..._total) of this agent.
  void count_agent_event(const char* name, const char* help, double n = 1);
  std::string metric(const std::string& name) const {
    return "workers." + self.spec_.role + "." + name;
  }
  double started_at = now_seconds();
  mutable std::mutex status_mutex;
  AgentStatus status;  // Guarded by status_mutex.

  // Expiration timers. The watchdog thread reads the worker pids and writes
  // the reaped timers, so both are guarded by timer_mutex.
  void start_timer_server();
  // Whether pid is a running worker or one of its descendants: each worker
  // leads a session of its own, which its children inherit (a child that
  // starts a session of its own leaves the worker's care). Thread safe.
  bool is_worker_or_descendant(pid_t pid) const;
  std::unique_ptr<timer::TimerServer> timer_server;
  mutable std::mutex timer_mutex;
  std::set<pid_t> worker_pids;                  // Guarded by timer_mutex.
  std::map<pid_t, timer::ExpiredTimer> reaped;  // Guarded by timer_mutex.

  // Health checks before each rendezvous (health_check.cpp). Throws
  // HealthCheckError when the node gives up, SignalException when a stop
  // was requested meanwhile.
  void check_health();
  // Waits until `deadline`; throws SignalException once a stop is requested.
  void sleep_unless_stopped(Clock::time_point deadline);

  // Hang detection (heartbeats.cpp). The receiver is polled by
  // wait_for_events(); last_beat holds, by local rank, the time of the
  // last heartbeat of the workers that sent one.
  void start_heartbeats();
  // Forgets the last group's heartbeats; before a group starts.
  void reset_heartbeats();
  void read_heartbeats();
  // The local rank whose worker is pid or leads pid's session; -1 if none.
  int local_rank_of(pid_t pid) const;
  // When the first watched worker times out (max() when none is watched).
  Clock::time_point next_heartbeat_deadline() const;
  // Captures the stack of each watched worker past its timeout, writes its
  // error file, kills it and waits for its exit.
  void check_heartbeats();
  std::unique_ptr<timer::HeartbeatReceiver> heartbeats;
  std::vector<std::optional<Clock::time_point>> last_beat;

  // The job's status board (status.cpp): this node's record, posted to a
  // publisher thread every status_interval and at each state change; the
  // group's attempts; the ranks' step times from their heartbeats' step
  // numbers, scored for stragglers each interval.
  void start_status();
  void post_status(bool urgent);
  void begin_attempt();
  // Ends the running attempt (RUNNING -> outcome), if one runs.
  void end_attempt(const std::string& outcome, const std::string& reason);
  void note_restart(const std::string& reason);
  void note_step(size_t local_rank, int64_t step, Clock::time_point at);
  // Each status interval: the step times of the interval, then the flags.
  void measure_steps();
  void flag_stragglers();
  // A rank's pace: its last step, the start of the interval being
  // measured, its step time over the last interval and its best.
  struct StepClock {
    struct Mark {
      int64_t step = 0;
      Clock::time_point at;
    };
    std::optional<int64_t> step;
    Clock::time_point at;
    std::optional<Mark> mark;
    std::optional<double> step_time;
    std::optional<double> best;
    bool flagged = false;  // a straggler now
  };
  std::unique_ptr<detail::StatusPublisher> status_publisher;
  Clock::time_point next_status = Clock::time_point::max();
  std::vector<status::AttemptStatus> attempts;
  struct LastRestart {
    double at = 0;
    std::string reason;
  } last_restart;
  std::vector<StepClock> steps;  // by local rank
  // Guarded by status_mutex: the last record made, and the attempt's log
  // directory.
  status::NodeStatus last_record;
  std::string attempt_log_dir;
};

}  // namespace tide::agent
