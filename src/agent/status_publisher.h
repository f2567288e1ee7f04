#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "tide/agent/job_status.h"
#include "tide/store/store.h"

namespace tide::agent::detail {

// Writes one agent's status record to the job's status board from a thread
// of its own, so that a slow or lost store never delays the agent: the
// agent posts snapshots (the latest wins) and reads back the job's fastest
// step time. The publisher writes the latest snapshot once per interval
// (the snapshot's, NodeStatus::interval),
// and sooner for one posted as urgent (a state change), but never twice
// within 1/kUrgentFraction of an interval: the store sees at most
// kUrgentFraction writes per interval from one agent, one in the steady
// state. As the leader (the agent of group rank 0) it also reads every
// record, writes the job's fastest step time and retires the records of
// nodes gone for good, at one write in kFigureEvery.
//
// Thread safety: post() and fastest_step_time() from any thread.
class StatusPublisher {
 public:
  static constexpr int kUrgentFraction = 5;
  // The leader reads every record and writes the job's fastest step time,
  // and a follower reads that, at one write in this many.
  static constexpr uint64_t kFigureEvery = 4;

  // `open` connects to the job store (on the publisher's thread; retried
  // each interval while it throws; null: the backend has none, and the
  // publisher stops).
  explicit StatusPublisher(std::function<std::shared_ptr<store::Store>()> open);
  // Writes the last snapshot posted (bounded by the store's timeout), then
  // stops.
  ~StatusPublisher();
  StatusPublisher(const StatusPublisher&) = delete;
  StatusPublisher& operator=(const StatusPublisher&) = delete;

  // The record to write next (its slot is filled in). `leader`: this agent
  // is the round's group rank 0.
  void post(NodeStatus snapshot, bool urgent, bool leader);
  // The job's fastest step time, as the leader last wrote it.
  std::optional<double> fastest_step_time() const;

 private:
  void run(std::stop_token stop);
  // One pass: connect if needed, write the record, lead. Logs what fails.
  void publish_once(NodeStatus s, bool leader);

  const std::function<std::shared_ptr<store::Store>()> open_;

  mutable std::mutex mutex_;
  std::condition_variable_any changed_;
  // Guarded by mutex_.
  std::optional<NodeStatus> latest_;
  bool fresh_ = false;  // posted since last written
  bool urgent_ = false;
  bool leader_ = false;
  uint64_t generation_ = 0;  // counts posts, to wake the thread
  std::optional<double> fastest_;

  // The publisher thread's own.
  std::shared_ptr<store::Store> store_;
  std::unique_ptr<StatusBoard> board_;
  int64_t slot_ = -1;
  uint64_t writes_ = 0;
  std::string last_attempts_;
  std::string last_error_;
  bool stopped_ = false;

  std::jthread thread_;  // last: stops before the members it uses go
};

}  // namespace tide::agent::detail
