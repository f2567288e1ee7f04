#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tide/store/store.h"

// The job's status board: every agent publishes a small record of its node
// (workers, ranks, state, restarts, heartbeat ages, step times) to the job
// store of the rendezvous (RendezvousHandler::open_job_store) at a bounded
// rate; anyone who reaches that store reads the records back as one view of
// the job: `tiderun status`, the live page on the health port. The records
// and the straggler scores are described in docs/observability.md.
namespace tide::status {

// A node's state in its record: where its worker group is in its life, as
// its agent decided it (docs/observability.md, "States"). An agent moves
//   STARTING -> HEALTHY -> (RESTARTING -> HEALTHY)* -> SUCCEEDED | FAILED |
//   STOPPED
// and writes a record at each move, before it acts on it.
enum class NodeState {
  kStarting,    // before its first group runs: rendezvous, starting
  kHealthy,     // its group's workers run
  kRestarting,  // a worker failed (restarts left) or the membership
                // changed: the group is stopped, and started again after
                // a new rendezvous
  kSucceeded,   // every worker succeeded
  kFailed,      // a worker failed with no restarts left, or the job's
                // rendezvous closed or was lost
  kStopped,     // the agent was stopped by a signal
};
const char* to_string(NodeState s);
// SUCCEEDED, FAILED or STOPPED: the agent's run is over.
bool is_final(NodeState s);

// A rank's state in its node's record, from what its process did read
// against its node's state, so that the two never contradict each other:
//   HEALTHY    running in a HEALTHY group
//   STOPPING   still running in a group that is being stopped
//   SUCCEEDED  exited 0
//   FAILED     exited non-zero or by a signal on its own: the failure that
//              ended its attempt
//   STOPPED    exited once its agent stopped the group
// `exitcode` is unset while the process runs; `failed`: the agent counted
// this exit as one of the attempt's failures.
const char* rank_state(
    NodeState node, std::optional<int> exitcode, bool failed);

// One rank as its node's record shows it.
struct RankStatus {
  int local_rank = 0;
  int rank = 0;
  int64_t pid = 0;
  std::string state;  // rank_state(): HEALTHY, STOPPING, SUCCEEDED...
  // Seconds since its last heartbeat; unset when it sends none.
  std::optional<double> beat_age;
  // The last step number its heartbeats carried, its seconds per step over
  // the last publishing interval, and its fastest interval so far; unset
  // when it reports no steps.
  std::optional<int64_t> step;
  std::optional<double> step_time;
  std::optional<double> best_step_time;
};

// One start of a node's worker group, and how it ended.
struct AttemptStatus {
  int attempt = 0;  // the restart count when it started
  int64_t round = 0;
  double start = 0;  // seconds since the epoch
  std::optional<double> end;
  std::string outcome;  // RUNNING, SUCCEEDED, FAILED, TERMINATED
  std::string reason;   // why it ended, when it did not succeed
};

// One node's record.
struct NodeStatus {
  std::string node;    // the agent's host name
  int64_t slot = -1;   // its place on the board, for its life
  std::string health;  // host:port of its health endpoint ("" when none)
  int64_t pid = 0;     // the agent's
  std::string role;
  std::string state;  // to_string(NodeState); a reader never trusts it
  int64_t round = 0;  // its last completed rendezvous round (0: none yet)
  int group_rank = -1;
  int group_world_size = -1;
  int restarts = 0;
  int max_restarts = 0;
  double last_restart_at = 0;  // 0: none yet
  std::string last_restart_reason;
  double started_at = 0;
  double updated_at = 0;
  // How often the node publishes, in seconds: readers call it silent after
  // a few intervals without an update.
  double interval = 0;
  std::vector<RankStatus> ranks;
  // Kept under a key of its own, written only when it changes.
  std::vector<AttemptStatus> attempts;
};

// The record's JSON (without the attempts), and back. Parsing throws
// ProtocolError, naming what is wrong, for a value that is not a record
// (the store is shared: a reader never trusts it).
std::string to_json(const NodeStatus& s);
NodeStatus node_status_from_json(std::string_view text);
std::string attempts_to_json(const std::vector<AttemptStatus>& attempts);
std::vector<AttemptStatus> attempts_from_json(std::string_view text);

// The straggler scores of a rank (as NVIDIA's straggler detection defines
// them): relative = the job's fastest step time / the rank's; individual =
// the rank's own best / its current. 1 is as fast as the reference; below
// the threshold the rank is a straggler. Unset without step times.
struct Scores {
  std::optional<double> relative;
  std::optional<double> individual;
  // Whether either score is below `threshold`.
  bool below(double threshold) const;
};
Scores score(const RankStatus& r, std::optional<double> fastest_step_time);

// The fastest current step time among the ranks of `nodes`, if any reports.
std::optional<double> fastest_step_time(const std::vector<NodeStatus>& nodes);

// How often an agent of a job of `nodes` nodes writes its record: every
// `base` (WorkerSpec::status_interval), but never so often that the job's
// agents together write more than kBoardWritesPerSecond records a second
// (the store's cost stays flat as the job grows: 8192 nodes write every
// 82 s; docs/benchmarks.md has the cost).
constexpr double kBoardWritesPerSecond = 100;
double effective_status_interval(double base_seconds, int nodes);

// When a node's record is old enough to call the node silent, and to drop
// it from the board.
double silent_after(const NodeStatus& s);
double expires_after(const NodeStatus& s);

// The records of a job in a store (the job store: keys "slots", "node/<i>",
// "attempts/<i>" and "job"). Not thread safe: one thread uses one board.
// Every call throws what the store throws (TimeoutError, NetworkError).
class StatusBoard {
 public:
  explicit StatusBoard(store::Store& store);

  // A new slot for an agent, its place for its life.
  int64_t claim_slot();
  // Writes s's record (at s.slot), and its attempts when `with_attempts`.
  void publish(const NodeStatus& s, bool with_attempts);
  // Drops the record at slot (a departed node's, once expired).
  void retire(int64_t slot);
  // Every record on the board, with its attempts; records that cannot be
  // read are skipped and named in `unreadable` when given.
  std::vector<NodeStatus> read(std::vector<std::string>* unreadable = nullptr);
  // The job-wide figure every agent scores its ranks against, written by
  // the agent of group rank 0 from all records (one request each).
  void set_fastest_step_time(std::optional<double> seconds);
  std::optional<double> fastest_step_time();

 private:
  store::Store* store_;
};

// What a reader makes of the records: every node not yet expired, with its
// age, whether it fell silent and whether it is a member of the current
// round, each rank's scores, and the job's state.
struct JobView {
  struct Rank {
    Scores scores;
    bool straggler = false;
  };
  struct Node {
    NodeStatus status;
    double age = 0;  // seconds since its last update
    bool silent = false;
    // In the job's current round (the newest round any record shows).
    // Nodes that left it, or wait to join the next, are shown but never
    // counted in the job's state, ranks or restarts.
    bool member = false;
    std::vector<Rank> ranks;  // parallel to status.ranks
  };
  std::string run_id;
  double now = 0;
  // From the members of the current round only, the first that applies:
  // UNKNOWN (no records), FAILED (a member failed for good), SUCCEEDED
  // (every member did), STOPPED (every member is done, one stopped),
  // DEGRADED (a member silent or stopped, or a straggler), RESTARTING (a
  // member restarting its group), STARTING (a member not yet running),
  // HEALTHY (every member running or done).
  std::string state;
  int64_t round = 0;  // the current round
  double threshold = 0;
  int restarts = 0;         // the members'
  int ranks = 0;            // the members'
  std::vector<Node> nodes;  // by slot
  std::vector<std::string> unreadable;
};
JobView make_job_view(
    std::string run_id,
    std::vector<NodeStatus> records,
    double now,
    double threshold);

// The view of the job whose status store is `store`, now: every record read
// (StatusBoard::read) and viewed. Throws what the store throws.
JobView read_job_view(
    store::Store& store, std::string run_id, double threshold);

// The view as JSON (tiderun status --json, the page's /api/job); tiderun
// status prints it as a table (apps/tiderun/status_table.h).
std::string to_json(const JobView& v);

}  // namespace tide::status
