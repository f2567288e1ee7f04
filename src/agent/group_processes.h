#pragma once

// The processes of one worker group (docs/agent.md#the-groups-processes):
// starting them (cold, or handed to a prestarted interpreter, bound as the
// NUMA plan says, with torchrun's environment), watching them (pidfds and
// tee pipes for the agent's poll loop), reaping them (and, as a subreaper,
// their orphans), stopping them (a signal, SIGKILL after the grace period,
// abandoned past that), and what they left (failures, return values).
// Behind it: the prestart pool and the janitor that kills a group left
// behind if the agent dies.
//
// Thread safety: the agent's thread only, but attempt_log_dir() (any
// thread).
#include <poll.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tide/agent/local_elastic_agent.h"
#include "tide/agent/numa.h"

#include "agent/component.h"
#include "agent/janitor.h"
#include "agent/prestart.h"
#include "agent/worker_process.h"
#include "common/clock.h"

namespace tide::agent::detail {

// How long after an attempt's start the interpreters that refill the
// prestart pool wait before importing: past the restarted workers' own
// start (imports, the process group, loading a checkpoint), which their
// imports would slow down on a node short of cores.
inline constexpr auto kPrestartRelease = std::chrono::seconds(5);

// Each local rank's --numa-binding (empty when off), planned once per start
// so that a topology that cannot hold the group fails the start, not a
// worker (numa.cpp).
std::vector<RankBinding> plan_numa(const WorkerSpec& spec);

class GroupProcesses {
 public:
  struct Options {
    bool adopt_orphans = false;  // AgentOptions::adopt_orphans
    // The variables the agent's components give each worker.
    std::function<void(std::map<std::string, std::string>&)> component_env;
    // Workers reaped (their pids may be reused from now on).
    std::function<void(const std::set<pid_t>&)> exited;
  };
  GroupProcesses(const AgentView& view, Options options);
  ~GroupProcesses();
  GroupProcesses(const GroupProcesses&) = delete;
  GroupProcesses& operator=(const GroupProcesses&) = delete;

  // run() begins: the environment workers inherit, the janitor.
  void open();
  // --prestart: the pool, when the workers run a Python script, and its
  // interpreters (their imports run while the rendezvous does). After the
  // components started: the interpreters get their variables.
  void open_prestart();
  // run() ends: the waiting interpreters go.
  void close();

  // The round's secret for the workers' rpc (WorkerSpec::job_secret, or
  // one agreed through the round's store).
  void choose_rpc_secret();
  // Readies the next start: a new attempt directory and its files, the
  // executable and the NUMA plan (what can fail before a worker starts).
  void prepare();
  // Starts one worker per local rank of `group` as prepared, and fills in
  // their pids.
  void start(WorkerGroup& group);
  // `sig` to each worker's process group, SIGKILL after `grace`, and gives
  // up on those that survive even that; drains the tee pipes.
  void stop(int sig, std::chrono::milliseconds grace);
  // SIGKILL to local rank i's worker, and waits up to kill_wait for its
  // exit.
  void kill(size_t local_rank);

  // The descriptors to poll for the workers (exits, output).
  void add_fds(std::vector<pollfd>& fds) const;
  // After a poll: pumps output and reaps what exited.
  void on_wake();
  // When the interpreters the pool started with the workers may import
  // (--prestart: kPrestartRelease after the start; max: nothing to do),
  // and letting them then.
  Clock::time_point deadline() const {
    return release_at_;
  }
  void due();

  // The group as its workers' exits say: HEALTHY while any runs, FAILED
  // once one failed, SUCCEEDED when every one exited 0.
  WorkerState state() const;
  // The failed workers, by global rank; `explain` rewrites a message a
  // component caused.
  std::map<int, ProcessFailure> failures(
      const std::function<void(ProcessFailure&)>& explain) const;
  std::map<int, std::string> return_values() const;

  size_t size() const {
    return processes_.size();
  }
  const WorkerProcess& operator[](size_t local_rank) const {
    return *processes_[local_rank];
  }
  // The local rank whose worker is pid or leads pid's session; -1 if none.
  int local_rank_of(pid_t pid) const;
  const std::string& error_file(size_t local_rank) const {
    return error_files_[local_rank];
  }
  // This attempt's log directory ("" before the first start).
  std::string attempt_log_dir() const;

 private:
  // attempt_<restarts used>, or attempt_<n>.<k> after a membership change.
  std::string attempt_dir() const;
  std::vector<std::string> worker_env(const Worker& w) const;
  std::string resolve_exe() const;
  LaunchSpec launch_spec(
      const Worker& w,
      const std::string& exe,
      const std::vector<RankBinding>& numa,
      const std::string& dir) const;
  // A warm worker from the prestart pool when it can take `ls`, else a
  // cold one (the log says why).
  std::unique_ptr<WorkerProcess> start_process(const LaunchSpec& ls);
  // Starts the prestarted interpreters missing, bound as `numa` plans.
  void fill_prestart(
      const std::string& exe,
      const std::vector<RankBinding>& numa,
      bool gated = false);
  int running() const;
  // Waits for the workers' events until `deadline`.
  void wait(Clock::time_point deadline);
  void reap();

  const AgentView& view_;
  const Options options_;
  std::map<std::string, std::string> base_env_;
  bool warned_omp_ = false;
  std::string rpc_secret_;
  bool warned_shared_secret_ = false;
  // Before the processes: they tell it about themselves until they go.
  std::unique_ptr<Janitor> janitor_;
  std::unique_ptr<PrestartPool> prestart_;
  std::optional<PythonCommand> prestart_cmd_;
  Clock::time_point release_at_ = Clock::time_point::max();
  std::vector<std::unique_ptr<WorkerProcess>> processes_;
  std::vector<std::string> result_files_;
  std::vector<std::string> error_files_;
  // This attempt's filtered_stdout.log and filtered_stderr.log (null: no
  // --duplicate-*-filters).
  std::shared_ptr<const DuplicateSink> duplicate_out_;
  std::shared_ptr<const DuplicateSink> duplicate_err_;
  // prepare()'s: the executable ("" for a function) and the NUMA plan.
  std::string exe_;
  std::vector<RankBinding> numa_;
  mutable std::mutex dir_mutex_;
  std::string attempt_log_dir_;  // Guarded by dir_mutex_.
};

}  // namespace tide::agent::detail
