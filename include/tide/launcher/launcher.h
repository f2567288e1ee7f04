#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "tide/agent/local_elastic_agent.h"
#include "tide/agent/worker_spec.h"

// The launcher behind tiderun (torch's torch.distributed.launcher.api):
// a LaunchConfig, the agent it runs, and torchrun's failure summary.
namespace tide::launcher {

// One node's share of a job: tiderun's flags, as torch's LaunchConfig has
// them (docs/tiderun.md names each flag).
struct LaunchConfig {
  // --nnodes=MIN:MAX: the nodes a round needs, and takes at most.
  int min_nodes = 1;
  int max_nodes = 1;
  // Workers on this node (--nproc-per-node).
  int nproc_per_node = 1;
  // The job's name in the rendezvous (--rdzv-id); the same on every node.
  std::string run_id = "none";
  // The workers' role (ROLE_NAME).
  std::string role = "default";
  // A registered rendezvous backend: "static", "c10d", "etcd", or a
  // plugin's (--rdzv-backend).
  std::string rdzv_backend = "static";
  // host[:port] of the rendezvous store or of etcd (--rdzv-endpoint).
  std::string rdzv_endpoint;
  // --rdzv-conf key=value pairs, given to the backend as they are.
  std::map<std::string, std::string> rdzv_configs;
  // The job's secret (WorkerSpec::job_secret), also the token of the c10d
  // store (TIDE_JOB_SECRET, or the file --rdzv-conf secret_file= names).
  std::string job_secret;
  // The address other nodes reach this one at (--local-addr; empty: this
  // host's name).
  std::string local_addr;
  // Restarts of the worker group after failures (--max-restarts).
  int max_restarts = 0;
  // How often a healthy group asks whether nodes wait to join.
  std::chrono::milliseconds monitor_interval{100};
  // How workers start: exec of the command, or fork (function workers).
  agent::StartMethod start_method = agent::StartMethod::kSpawn;
  // Where <run_id>_<random>/attempt_<n>/<rank>/ goes (empty: a new
  // directory under TMPDIR).
  std::string log_dir;
  // Which ranks' stdout/stderr go to files only (--redirects), and to
  // files and the console (--tee).
  agent::StdSpec redirects;
  agent::StdSpec tee;
  // The local ranks whose console output is shown (empty: all).
  std::set<int> local_ranks_filter;
  // --duplicate-stdout-filters, --duplicate-stderr-filters,
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE and --virtual-local-rank
  // (agent::WorkerSpec has what each does).
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  std::string log_line_prefix_template;
  bool virtual_local_rank = false;
  // From a stop signal to the workers to SIGKILL (--shutdown-timeout).
  std::chrono::milliseconds shutdown_grace{30'000};
  // How long a node whose workers succeeded waits for the other nodes
  // (--exit-barrier-timeout); docs/tiderun.md#the-exit-barrier.
  std::chrono::milliseconds exit_barrier_timeout{300'000};
  // Expiration timers for the workers, and the FIFO's path for kFile
  // (empty: in the run's log directory).
  agent::WorkerSpec::Timer timer = agent::WorkerSpec::Timer::kNone;
  std::string timer_file;
  // Binding of the workers to CPUs and memory (--numa-binding), and the
  // sysfs root the NUMA topology is read from (TIDE_TOPOLOGY_ROOT).
  agent::NumaBinding numa_binding = agent::NumaBinding::kNone;
  std::string topology_root = "/sys";
  // Hang detection (--heartbeat-timeout; 0: off) and the health checks
  // before each rendezvous (--health-check*).
  std::chrono::milliseconds heartbeat_timeout{0};
  agent::HealthCheckPolicy health;
  // The job's status records (--status-interval; 0: none), the straggler
  // threshold (--straggler-threshold), and this node's health endpoint
  // (host:port, "" for none) for its record: agent::WorkerSpec has what
  // each does.
  std::chrono::milliseconds status_interval{5'000};
  double straggler_threshold = 0.7;
  std::string health_endpoint;
  // Prestarted workers (--prestart, --prestart-spares, --prestart-imports).
  agent::WorkerSpec::Prestart prestart;
  // In-memory checkpoints (--checkpoint-memory, --checkpoint-dir,
  // --checkpoint-keep).
  agent::WorkerSpec::Checkpoints checkpoints;
  // Per-step fault tolerance (--ft-store, --replica-group-id,
  // --num-replica-groups, --min-replica-size).
  agent::WorkerSpec::ReplicaGroup replica_group;
  // The workers reach the job's store through this node's fan-in
  // (--store-fan-in).
  bool store_fan_in = false;
};

// The outcome of launch(): the agent's result, or the signal that stopped it.
struct LaunchResult {
  agent::RunResult result;
  int stopped_by_signal = 0;
};

// Runs one node's agent to the end: makes the rendezvous handler, runs the
// agent, shuts the rendezvous down (unless a signal stopped the agent, so
// other nodes may go on). Blocks the calling thread for the whole job:
// rounds, restarts, the exit barrier. `on_agent` sees the agent before it
// runs and null before it is destroyed (to forward signals to it; it may
// call request_stop() from a signal handler meanwhile). Throws
// InvalidArgument for a bad config or an unknown backend, and what the
// rendezvous throws (RendezvousClosedError when another node ended the
// job, RendezvousError when the backend is gone), and HealthCheckError
// when this node gave up on its health checks (the others go on without
// it: the rendezvous is left open).
LaunchResult launch(
    const LaunchConfig& config,
    const agent::Entrypoint& entrypoint,
    const std::function<void(agent::LocalElasticAgent*)>& on_agent = {});

// torchrun's ChildFailedError text for a failed result: root cause first,
// then the other failures, in torch's layout.
std::string format_failure_summary(
    const std::string& entrypoint_name, const agent::RunResult& result);

// Writes torchrun's own error file (its TORCHELASTIC_ERROR_FILE): the
// root-cause worker's error JSON with message.errorCode set to its exit
// code, or, when that worker wrote none, a record holding `summary`.
void write_error_file_for_launcher(
    const std::string& path,
    const agent::RunResult& result,
    const std::string& summary);

}  // namespace tide::launcher
