#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "timeline/model.h"

// A node (host) of the run as the picture groups it: its agent's lane heads
// the lanes of its workers, and one summary lane can stand for all of them,
// so that a node of many ranks can be drawn at the height of one.
namespace tide::timeline {

// A node with more workers than this starts collapsed into its summary lane.
inline constexpr size_t kCollapseAbove = 16;

// One attempt on one node: the span of its workers in that attempt, and how
// they ended.
struct AttemptSummary {
  int64_t attempt = 0;
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  bool start_seen = true;  // false: some worker started before the file
  Outcome worst = Outcome::kSucceeded;
  std::map<Outcome, size_t> outcomes;  // how many workers ended each way
};

struct Node {
  std::string host;
  std::optional<int64_t> group_rank;
  std::optional<int64_t> order;  // Timeline::host_order's
  // From a job view: the node's attempts, drawn in place of its workers
  // (which a view does not hold one by one). Null for an events file.
  const NodeRecord* record = nullptr;
  std::vector<Note> agent_notes;
  std::vector<const WorkerLane*> workers;  // by global rank
  std::vector<AttemptSummary> attempts;    // by attempt
  // The workers' notes folded per attempt and kind: the first worker's, with
  // how many more there were.
  std::vector<Note> summary_notes;
};

// The run's nodes, by group rank, then host name; each holds pointers into
// tl, which must outlive them.
std::vector<Node> group_by_node(const Timeline& tl);

// The global ranks of a node's workers: its workers' lanes', or its
// record's.
std::set<int64_t> ranks_of(const Node& node);

// Ranks as ranges: "rank 5", "ranks 0–63, 128".
std::string rank_ranges(const std::set<int64_t>& ranks);

// How the workers of an attempt ended, worst first: "1 failed, 63
// terminated".
std::string outcome_counts(const AttemptSummary& a);

}  // namespace tide::timeline
