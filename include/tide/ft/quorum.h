#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tide/store/store.h"

// Per-step fault tolerance across replica groups (docs/fault_tolerance.md):
// each step, the groups agree on who takes part (a quorum), do the step,
// and vote on it (a commit). A group that fails is out of the next quorum;
// the others go on without it; a group that comes back joins at the step
// the others have reached, taking their state first (healing).
//
// Every decision lives in a Store, taken with compare_set (the first
// writer wins, everyone reads the same answer): tide's TCP store on one
// host, etcd (etcd::EtcdStore) where the coordination must outlive any one
// machine. There is no coordinator process to lose. The keys, under the
// prefix the store was given:
//
//   pending             members that asked to join: "member\tranks\tstep\n"
//   dead                members that are out for good: "member\twhy\n"
//   changes, change/N   a counter bumped by every join and death, and a
//                       key set for each value (what a joiner waits on)
//   current             the round of the newest quorum record
//   round/R/quorum      the members of round R and its step (JSON), written
//                       when the members change (a round with none keeps
//                       the previous round's quorum)
//   round/R/votes       the votes of the rounds of record R, counted on
//                       (each an add_wait, answered with round/N/done)
//   round/R/done        "commit C" or "abort C why": the round's outcome,
//                       C the changes counter its decider read
//   admit/MEMBER        the round a joiner is admitted at (or why not)
//   hb/MEMBER           the member's heartbeat counter
//
// A member is "GROUP:INCARNATION": a restarted group is a new member.
namespace tide::ft {

using std::chrono::milliseconds;

struct QuorumOptions {
  // The replica group's id: letters, digits, '.', '_' or '-'.
  std::string group;
  // What tells this run of the group from the others: a restarted group is a
  // new member, never taken for the one that died. Same characters.
  std::string incarnation;
  // This process's rank in its group, and the group's size.
  int group_rank = 0;
  int group_world_size = 1;
  // A step commits only with at least this many groups in its quorum.
  int min_replica_size = 1;
  // The first quorum waits for this many groups (or join_timeout).
  int expected_groups = 1;
  milliseconds join_timeout{60'000};
  // How long a vote or a quorum may take before TimeoutError.
  milliseconds timeout{60'000};
  // Group rank 0 beats this often, and declares the next member of the
  // quorum dead when its beat has not moved for heartbeat_timeout.
  milliseconds heartbeat_interval{100};
  milliseconds heartbeat_timeout{5'000};
};

struct QuorumMember {
  std::string id;  // GROUP:INCARNATION
  int ranks = 1;
  int64_t step = 0;

  bool operator==(const QuorumMember&) const = default;
};

// One round's quorum, as this process sees it.
struct Quorum {
  // Changes only when the members change (or a round aborted): a process
  // group formed for one quorum id serves every round with that id.
  int64_t id = 0;
  int64_t round = 0;
  std::vector<QuorumMember> members;  // sorted by id
  // This group's index in members, and how many there are.
  int replica_rank = 0;
  int replica_world_size = 0;
  // The step the up-to-date members are at; this group's own step before
  // the round (below max_step: it must heal first).
  int64_t max_step = 0;
  int64_t step = 0;
  // Where to heal from: an up-to-date member (empty when up to date), and
  // its replica rank (-1).
  std::string heal_from;
  int heal_from_rank = -1;
  // The replica ranks of the members that heal from this one.
  std::vector<int> heal_to;
  // The store prefix for this quorum's process groups.
  std::string store_prefix;

  bool heal() const {
    return step < max_step;
  }
};

// One process of one replica group taking part in the quorum.
//
// Thread safety: start_quorum() and should_commit() are called in turn by
// one thread (the training loop); the heartbeat runs on a thread of its
// own. Errors: TimeoutError (a quorum or vote past options.timeout),
// InvalidArgument (bad options, or the quorum refused this group: it
// claims a step the others have not reached), Error (this group was voted
// out: it must restart as a new incarnation).
class QuorumClient {
 public:
  // A new connection to the store each call: the training loop's, and the
  // heartbeat's, which must not queue behind the loop's waits. Their
  // timeout() becomes options.timeout.
  using Connect = std::function<std::shared_ptr<store::Store>()>;

  // step: the step this process's state is at (0 for a fresh start).
  QuorumClient(const Connect& connect, QuorumOptions options, int64_t step);
  // Stops the heartbeat; does not leave (see leave()).
  ~QuorumClient();

  QuorumClient(const QuorumClient&) = delete;
  QuorumClient& operator=(const QuorumClient&) = delete;

  // The next round's quorum: at once when its members are those of the
  // round before (a fast quorum, no store request); otherwise read from, or
  // decided in, the store. The first call joins, and waits to be admitted.
  Quorum start_quorum();

  // Waits until every rank of every member of this round's quorum has
  // called meet() (true), or the round is aborted first (false: a member is
  // out; vote no). Call it before forming a process group for a new quorum
  // id: no one then waits for a peer that will never come.
  bool meet();

  // This process's vote on the round: true when its part of the step
  // succeeded. Returns whether the round committed (every rank of every
  // member voted true, and the quorum held min_replica_size groups); this
  // process's step moves on only then.
  bool should_commit(bool ok);

  // The step this process's state is at (committed steps, or healed to).
  int64_t step() const;
  // Says this process healed to `step` (Quorum::max_step).
  void healed(int64_t step);

  // This group leaves for good (a finished group): it is out of the next
  // quorum, and the others are not held up by it.
  void leave(const std::string& why);

  // Declares `member` out for good (its agent saw it fail, or its heartbeat
  // stopped), and aborts the round its quorum is in, if it is in one, so
  // nobody waits for its votes.
  static void declare_dead(
      store::Store& store, const std::string& member, const std::string& why);

  // "GROUP:INCARNATION", checked.
  static std::string member_id(
      const std::string& group, const std::string& incarnation);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A new connection to the quorum's store named by `address`:
// "HOST:PORT[/JOB]" (a tide store server: tide-store, or a tiderun's) or
// "etcd:HOST:PORT[,HOST:PORT...][/JOB]". Keys live under "tide_ft/JOB/"
// (JOB "default" when none is named), so one store serves many jobs.
// Throws InvalidArgument for an address of another shape, and what
// connecting throws.
std::shared_ptr<store::Store> connect_quorum_store(
    const std::string& address, milliseconds timeout);

}  // namespace tide::ft
