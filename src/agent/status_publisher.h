#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "tide/status/job_status.h"
#include "tide/store/store.h"

namespace tide::agent::detail {

// Writes one agent's status record to the job's status board from a thread
// of its own, so that a slow or lost store never delays the agent: the
// agent posts snapshots and reads back the job's fastest step time. Every
// state the node enters is written, in order and at once: a snapshot of a
// new state never replaces an unwritten one of the state before (up to
// kMaxQueued of them). Within a state the latest snapshot wins: it is
// written once per interval (the snapshot's, NodeStatus::interval), and
// sooner when posted as urgent, but never twice within 1/kUrgentFraction
// of an interval: the store sees one write per interval from one agent in
// the steady state, and one more per state change. As the leader (the agent of
// group rank 0) it also reads every record, writes the job's fastest step time
// and retires the records of nodes gone for good, at one write in kFigureEvery.
//
// Thread safety: post() and fastest_step_time() from any thread.
class StatusPublisher {
 public:
  static constexpr int kUrgentFraction = 5;
  // Unwritten snapshots of earlier states kept while the store is slow
  // (beyond that, the oldest go).
  static constexpr size_t kMaxQueued = 16;
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
  void post(status::NodeStatus snapshot, bool urgent, bool leader);
  // The job's fastest step time, as the leader last wrote it.
  std::optional<double> fastest_step_time() const;

 private:
  void run(std::stop_token stop);
  // One pass: connect if needed, write the record, lead. Logs what fails.
  void publish_once(status::NodeStatus s, bool leader);

  const std::function<std::shared_ptr<store::Store>()> open_;

  mutable std::mutex mutex_;
  std::condition_variable_any changed_;
  // Guarded by mutex_.
  std::optional<status::NodeStatus> latest_;
  bool fresh_ = false;  // posted since last written
  std::deque<status::NodeStatus>
      queued_;  // earlier states, unwritten, oldest first
  bool urgent_ = false;
  bool leader_ = false;
  uint64_t generation_ = 0;  // counts posts, to wake the thread
  std::optional<double> fastest_;

  // The publisher thread's own.
  std::string written_state_;  // the state of the last snapshot written
  std::shared_ptr<store::Store> store_;
  std::unique_ptr<status::StatusBoard> board_;
  int64_t slot_ = -1;
  uint64_t writes_ = 0;
  std::string last_attempts_;
  std::string last_error_;
  bool stopped_ = false;

  std::jthread thread_;  // last: stops before the members it uses go
};

}  // namespace tide::agent::detail
