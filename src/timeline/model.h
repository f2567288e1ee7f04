#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "timeline/events.h"

// What the picture shows, built from a run's records: a lane per worker
// with its processes' lifetimes and notes, the agents' notes per host, and
// the boundaries between attempts.
namespace tide::timeline {

enum class Outcome { kSucceeded, kFailed, kTerminated, kRunning };

// The CSS class a bar of this outcome is drawn with.
const char* css_class(Outcome o);
// Its name as tide's records write it: SUCCEEDED, FAILED, TERMINATED,
// RUNNING.
const char* outcome_name(Outcome o);

// Worse outcomes compare greater: a node's attempt is as bad as its worst
// worker's.
int severity(Outcome o);

// One worker process, from its HEALTHY event to its end.
struct Bar {
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  bool start_seen = true;  // false: the file begins after the worker started
  Outcome outcome = Outcome::kRunning;
  std::string pid;
  int64_t attempt = 0;
  std::string error;  // raw_error, for FAILED
};

enum class Mark {
  kRendezvous,
  kRestart,
  kTimer,
  kFailure,
  kRdzvPending,
  kHang,
};

// Its name in the picture's markup: rendezvous, restart, timer, failure,
// pending, hang.
const char* mark_name(Mark m);

// A point (or, for a rendezvous, the span it waited) with a label.
struct Note {
  Mark mark;
  int64_t t_ms = 0;
  int64_t from_ms = 0;  // where a rendezvous began waiting
  std::string label;    // in full: the picture shortens it to fit
  std::string tooltip;  // starts with the label
  json args;            // the event's fields, for a trace viewer
};

struct WorkerLane {
  std::string host;
  int64_t rank = 0;
  std::optional<int64_t> local_rank;
  std::string role;
  std::vector<Bar> bars;
  std::vector<Note> notes;
};

struct Boundary {
  int64_t t_ms = 0;
  std::string label;
};

// An attempt of a node as its agent recorded it (a job view's attempts:
// tide/status/job_status.h), where the source knows the node's group but
// not each worker's process.
struct RecordedAttempt {
  int64_t attempt = 0;
  int64_t round = 0;
  int64_t start_ms = 0;
  int64_t end_ms = 0;  // the timeline's end while it runs
  Outcome outcome = Outcome::kRunning;
  std::string reason;  // why it ended, when it did not succeed
};

// A node as a job view shows it; in a big job, alike nodes folded into one
// (job_view.h).
struct NodeRecord {
  size_t nodes = 1;                   // how many nodes it stands for
  std::optional<int64_t> group_rank;  // unset outside the current round
  std::vector<int64_t> ranks;         // its workers' global ranks, now
  bool silent = false;                // no update for a while
  double age = 0;                     // seconds since its last update
  std::vector<RecordedAttempt> attempts;
};

struct Timeline {
  std::string run_id;
  int64_t t0 = 0;
  int64_t t1 = 0;
  std::map<std::string, std::vector<Note>> agent_notes;  // by host
  std::map<std::pair<std::string, int64_t>, WorkerLane> workers;
  // Nodes top to bottom: host -> its group rank (events) or its slot on the
  // status board (a job view).
  std::map<std::string, int64_t> host_order;
  std::vector<Boundary> boundaries;
  std::set<std::string> roles;
  int64_t attempts = 1;
  // From a job view (job_view.h): its nodes by name, drawn one lane each in
  // place of workers' lanes; the job's state; and live, since the view's
  // end is its "now", not the end of a file.
  std::map<std::string, NodeRecord> records;
  std::string state;
  bool live = false;
};

// The timeline of `records` (one run's, time-ordered, at least one).
Timeline build_timeline(const std::vector<Record>& records, Warnings& warnings);

}  // namespace tide::timeline
