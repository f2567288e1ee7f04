#pragma once

// Status records: the agent's part of the job's status board
// (tide/status/job_status.h). It keeps its node's record (the state, the
// group's attempts, each rank's state, last heartbeat and pace) and posts it
// to a publisher thread at each transition and every status interval; from
// the step numbers in the ranks' heartbeats it measures their step times
// each interval and flags stragglers.
//
// A record is posted only once the transition it shows is decided and the
// attempt's outcome recorded, so it never shows a group doing what its state
// denies (a HEALTHY node with a FAILED rank).
//
// Thread safety: last_record() from any thread; the rest from the agent's.
#include <sys/types.h>

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tide/status/job_status.h"

#include "agent/component.h"
#include "agent/status_publisher.h"
#include "common/clock.h"

namespace tide::agent::detail {

class GroupProcesses;
class Reporter;

class StatusRecords final : public Component {
 public:
  StatusRecords(
      const AgentView& view,
      const GroupProcesses& processes,
      const Reporter& reporter);

  // The last record made (LocalElasticAgent::node_status()).
  status::NodeStatus last_record() const;
  // A heartbeat of local rank i at `at`, with its step number if it sent
  // one.
  void beat(
      size_t local_rank, std::optional<int64_t> step, Clock::time_point at);

  // The publisher (with --status-interval), and the first record: STARTING.
  void start() override;
  void entered(const Transition& t) override;
  void acted(const Transition& t) override;
  // Each status interval: the ranks' step times, the stragglers, a record.
  Clock::time_point deadline() const override {
    return next_;
  }
  void due() override;

 private:
  // A rank's pace: its last beat and step, the start of the interval being
  // measured, its step time over the last interval and its best.
  struct StepClock {
    struct Mark {
      int64_t step = 0;
      Clock::time_point at;
    };
    std::optional<Clock::time_point> beat;
    std::optional<int64_t> step;
    Clock::time_point at;
    std::optional<Mark> mark;
    std::optional<double> step_time;
    std::optional<double> best;
    bool flagged = false;  // a straggler now
  };
  void post(bool urgent);
  // Whether local rank i's worker has exited (no more steps to come).
  bool ended(size_t i) const;
  void measure_steps();
  void flag_stragglers();

  const AgentView& view_;
  const GroupProcesses& processes_;
  const Reporter& reporter_;
  std::unique_ptr<StatusPublisher> publisher_;
  Clock::time_point next_ = Clock::time_point::max();
  status::NodeState state_ = status::NodeState::kStarting;
  std::vector<status::AttemptStatus> attempts_;
  // Local ranks whose exit ended the running attempt.
  std::set<int> attempt_failures_;
  struct LastRestart {
    double at = 0;
    std::string reason;
  } last_restart_;
  std::vector<StepClock> steps_;  // by local rank
  mutable std::mutex mutex_;
  status::NodeStatus last_record_;  // Guarded by mutex_.
};

}  // namespace tide::agent::detail
