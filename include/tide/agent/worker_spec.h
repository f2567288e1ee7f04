#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "tide/agent/health_check.h"
#include "tide/agent/numa.h"
#include "tide/rendezvous/rendezvous_handler.h"

// What an agent runs: the worker specification and the worker's standard
// stream handling (torch's WorkerSpec, Std, LogsSpecs).
namespace tide::agent {

// A program to exec, with its arguments. argv[0] is looked up in PATH.
struct Command {
  std::vector<std::string> argv;
};

// A C++ function registered with register_function(), and its arguments.
struct FunctionCall {
  std::string name;
  std::vector<std::string> args;
};

using Entrypoint = std::variant<Command, FunctionCall>;

// How a FunctionCall worker starts (a Command is always exec'd).
enum class StartMethod {
  // fork() of the agent, then the function: fastest; the function sees a
  // copy of the agent's memory. Only safe while the agent has no threads
  // holding locks the function needs.
  kFork,
  // fork() + exec of the agent's own binary (/proc/self/exe), which runs the
  // function from main() via run_worker_if_spawned(): a fresh process, like
  // torch's "spawn".
  kSpawn,
};

// Which of a worker's streams go to its log files (torch's Std).
enum class Std : uint8_t { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

// Per local rank, or one value for all ("0:1,1:2" or "3" on the command line).
struct StdSpec {
  Std all = Std::kNone;
  std::map<int, Std> by_rank;
  Std for_rank(int local_rank) const;
};

// Parses torch's -r/-t syntax: "3" or "0:1,1:2". Throws InvalidArgument.
StdSpec parse_std_spec(const std::string& text, const char* flag);

struct WorkerSpec {
  std::string role = "default";
  int local_world_size = 1;
  Entrypoint entrypoint;
  StartMethod start_method = StartMethod::kSpawn;
  std::shared_ptr<rendezvous::RendezvousHandler> rdzv_handler;
  // Restarts of the worker group after a failure, per agent.
  int max_restarts = 3;
  // How often the agent asks the rendezvous whether nodes wait to join.
  // Worker exits are seen at once, whatever this is.
  std::chrono::milliseconds monitor_interval{100};
  // Streams written to <log dir>/attempt_<n>/<local_rank>/{stdout,stderr}.log
  // (redirects), or written there and copied to the console with a
  // "[<role><local_rank>]:" prefix (tee).
  StdSpec redirects;
  StdSpec tee;
  // Local ranks whose output is shown on the console; empty: all.
  std::set<int> local_ranks_filter;
  // torchrun's --duplicate-stdout-filters / --duplicate-stderr-filters:
  // a tee'd line containing any of these strings also goes to
  // attempt_<n>/filtered_stdout.log (filtered_stderr.log), one file per
  // stream for all local ranks, with its console prefix. Empty: no file.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  // The console prefix of tee'd lines, torch's
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: ${role_name}, ${rank} and
  // ${local_rank} (or $role_name, ...) are replaced, $$ is a $, anything
  // else stays. Empty: "[<role><local_rank>]:".
  std::string log_line_prefix_template;
  // torchrun's --virtual-local-rank: every worker gets LOCAL_RANK=0 and a
  // CUDA_VISIBLE_DEVICES of its own device alone (its entry of the agent's
  // list, or its local rank when the agent has none).
  bool virtual_local_rank = false;
  // Base directory for logs and error files; empty: a new directory under
  // $TMPDIR named tide_<random>. The run goes in <log_dir>/<run_id>_<random>.
  std::string log_dir;
  // Overrides for MASTER_ADDR / MASTER_PORT (else the rendezvous' store).
  std::optional<std::string> master_addr;
  std::optional<uint16_t> master_port;
  // Extra environment for the workers, on top of the agent's own.
  std::map<std::string, std::string> env;
  // SIGTERM to SIGKILL grace when stopping workers (torch: 30 s,
  // TORCH_ELASTIC_SHUTDOWN_TIMEOUT).
  std::chrono::milliseconds shutdown_grace{30'000};
  // How long a worker that ignores SIGKILL (stuck in the kernel) is waited
  // for before the agent leaves it behind and goes on.
  std::chrono::milliseconds kill_wait{5'000};
  // How long a finished agent waits for the others (torch: 300 s, fixed).
  std::chrono::milliseconds exit_barrier_timeout{300'000};
  // Expiration timers for the workers (docs/timers.md). kFile: a
  // FileTimerServer on timer_file (empty: a new path), exported to the
  // workers as TORCHELASTIC_TIMER_FILE (torch's
  // TORCHELASTIC_ENABLE_FILE_TIMER=1). kLocal: a LocalTimerServer whose
  // socket is exported as TIDE_TIMER_SOCKET. The server signals only this
  // agent's workers.
  enum class Timer { kNone, kFile, kLocal };
  Timer timer = Timer::kNone;
  std::string timer_file;
  // The timer server's longest sleep (torch: 0.1 s for the agent's).
  std::chrono::milliseconds timer_max_interval{100};
  // Binds each worker to CPUs and memory nodes (torchrun's --numa-binding;
  // tide/agent/numa.h has the modes). Planned at each start of the group;
  // a topology that cannot be read, or cannot hold the workers, fails the
  // start before any worker runs.
  NumaBinding numa_binding = NumaBinding::kNone;
  // The sysfs root the topology is read from: "/sys", or a fake tree.
  std::string topology_root = "/sys";
  // Hang detection (docs/tiderun.md#hang-detection): when positive, a
  // worker that sent a heartbeat (tide/timer/heartbeat.h) and then none
  // for this long is hung: its stack is captured, it is killed, and the
  // group restarts as for any failure. 0: off (no socket, no variables).
  std::chrono::milliseconds heartbeat_timeout{0};
  // Checks run before each rendezvous (docs/tiderun.md#health-checks).
  HealthCheckPolicy health;
  // The job's status board (docs/observability.md#the-jobs-status): how
  // often the agent publishes its node's record to the rendezvous' job
  // store (RendezvousHandler::open_job_store; a backend without one gets
  // none), from a thread of its own. 0: no records. When on, the workers
  // also get the heartbeat socket, so they may report their step numbers
  // (tide/timer/heartbeat.h) without hang detection.
  std::chrono::milliseconds status_interval{5'000};
  // A rank whose straggler score (relative or individual, tide/status/
  // job_status.h) falls below this is flagged: an event and a metric,
  // nothing done to it. In (0, 1].
  double straggler_threshold = 0.7;
  // This node's health endpoint (host:port) for its record, so the live
  // page of another node can reach its logs. Empty: none.
  std::string health_endpoint;
  // Prestarted workers (docs/tiderun.md#prestarted-workers): for a Python
  // script's workers (`PYTHON -u script.py ...` or `-m module`), Python
  // interpreters are started before they are needed, with `imports`
  // imported, one per local rank plus `spares`; each attempt hands its
  // workers to them (started while the first rendezvous runs, refilled
  // at each start, the refills importing 5 s into the attempt). A worker whose
  // import-time environment or binding would differ starts cold, and the log
  // says why.
  struct Prestart {
    bool enabled = false;
    std::vector<std::string> imports = {"torch", "torch.distributed"};
    int spares = 0;
  };
  Prestart prestart;
  // Checkpoints held in memory (docs/checkpoints.md).
  struct Checkpoints {
    // Bytes of /dev/shm the agent reserves when its run begins, shared by
    // its local ranks (two snapshots each), where workers save their state
    // (tide.checkpoint) so that a restarted worker loads it from memory.
    // Reserved in full at once: a bound /dev/shm cannot hold fails the run
    // at start. 0: off.
    uint64_t memory = 0;
    // Where a writer process copies each rank's latest snapshot, behind the
    // training, as files torch.load reads (<dir>/rank-<R>/step-<N>.pt),
    // keeping the last `keep` per rank; the latest is written before the
    // agent exits. Empty: not written.
    std::string dir;
    int keep = 2;
    // The Python that writes them (with torch): the workers' own.
    std::string python = "python3";
    // Copy each local rank's newest snapshot to another node's agent (the
    // next node of the round), so that a node lost restores from there;
    // the memory is then shared as five slots per local rank (three of its
    // own, two for the peer's copies). tiderun turns it on when --nnodes
    // allows more than one node.
    bool peer = false;
    // The address other nodes reach this agent's copies at (empty: this
    // host's name).
    std::string host;
  };
  Checkpoints checkpoints;
  // Per-step fault tolerance (docs/fault_tolerance.md): this node's workers
  // are one replica group of a job whose groups agree on each step through
  // a store (tide.ft). Each attempt of the group is a new member
  // (TIDE_FT_INCARNATION); when one ends (a failure, a stop, the end) the
  // agent declares it out at once, before it stops the other workers, so
  // the other groups go on without waiting for its votes.
  struct ReplicaGroup {
    // Where the groups meet: "HOST:PORT" of a tide store, or
    // "etcd:HOST:PORT[,HOST:PORT...]". Empty: not a replica group.
    std::string store;
    // The group's id (REPLICA_GROUP_ID): letters, digits, '.', '_', '-'.
    std::string id;
    // The groups the job has (NUM_REPLICA_GROUPS): the first quorum waits
    // for them all.
    int groups = 1;
    // A step commits only with this many groups in its quorum.
    int min_size = 1;
  };
  ReplicaGroup replica_group;
  // A node-level store fan-in (docs/store-fan-in.md): the workers reach the
  // job's store through their agent, which forwards their requests over one
  // connection and asks identical reads and waits once for them all. Their
  // MASTER_ADDR:MASTER_PORT is then the agent's fan-in on 127.0.0.1, and
  // TORCHELASTIC_USE_AGENT_STORE=True (in a dynamic rendezvous, group rank
  // 0's agent serves the workers' store, as a tide store, instead of rank
  // 0's worker).
  bool store_fan_in = false;
  // The job's secret (docs/security.md): workers get it as TIDE_RPC_TOKEN,
  // so tide's rpc agents and its torch backend prove it to each other,
  // unless their environment sets TIDE_RPC_TOKEN itself. Give every node
  // the same one (tiderun: TIDE_JOB_SECRET or --rdzv-conf secret_file=).
  // Empty: one is made each round, here when the round has one node, or
  // agreed through the round's store when it has several (then anyone who
  // can read that store can learn it; the log says so once).
  std::string job_secret;
};

// Throws InvalidArgument when a spec cannot run (no handler, no workers, an
// empty command, an unknown function).
void validate(const WorkerSpec& spec);

// A human-readable name of the entrypoint: the script or function name.
std::string entrypoint_name(const Entrypoint& e);

}  // namespace tide::agent
