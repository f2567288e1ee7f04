#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tide/rendezvous/dynamic_rendezvous.h"

// The ranks of a round's participants in a chosen RankOrder: a pure
// function of the participants' descriptors, so every node that reads the
// same descriptors computes the same ranks without talking to the others.
namespace tide::rendezvous {

// "arrival", "natural", "node-rank", "lexicographic" (--rank-order's
// values); parse_rank_order throws InvalidArgument naming them.
RankOrder parse_rank_order(std::string_view text);
std::string_view rank_order_name(RankOrder order);

// One participant of a round, as the descriptor it joined with says.
struct Participant {
  int64_t arrival = 0;  // from 1
  std::string host;     // empty when the node did not say
  std::string addr;
  int64_t pid = 0;
  int64_t local_id = 0;
  std::optional<int64_t> node_rank;

  // For people: "node66 (10.1.0.2_4120_0)", or the descriptor alone.
  std::string name() const;
};

// Compares host names as people read them: runs of digits compare as
// numbers (node7 < node66 < node100; node7.rack1 < node66.rack1), the rest
// byte by byte. Names equal as numbers ("node07", "node7") fall back to
// plain byte order, so the result is 0 only for equal strings. Returns <0,
// 0 or >0.
int natural_compare(std::string_view a, std::string_view b);

struct RankAssignment {
  // arrivals[r]: the arrival index of the participant with rank r.
  std::vector<int64_t> arrivals;
  // The order applied: the one asked for, or kArrival when kNodeRank could
  // not be (then `fallback` says why, naming the nodes).
  RankOrder order = RankOrder::kArrival;
  std::string fallback;

  // The rank of an arrival; InternalError when it is not a participant.
  int64_t rank_of(int64_t arrival) const;
};

// A node's descriptor, the JSON it joins a round with: torch's _NodeDesc
// fields, its host name, its node rank when given, and the rank order it
// uses (so nodes told different orders notice instead of taking the same
// rank).
std::string encode_descriptor(
    const NodeDesc& self, const DynamicRendezvousSettings& s);

// Ranks 0..size-1 for the participants (any order of input, distinct
// arrivals). kNodeRank needs a node rank from every participant, all
// distinct; otherwise the ranks follow arrival.
RankAssignment assign_ranks(
    RankOrder order, std::vector<Participant> participants);

// A round's ranks from its participants' descriptors (arrival i's at
// texts[i - 1]) in `order`. When some participants were told another order,
// `mixed` names them ("node66 (10.1.0.2_4120_0) uses natural, ...") and the
// ranks are left empty. Throws RendezvousStateError for a malformed
// descriptor.
struct RoundRanks {
  RankAssignment ranks;
  std::string mixed;
};
RoundRanks rank_round(
    int64_t round, const std::vector<std::string>& texts, RankOrder order);

}  // namespace tide::rendezvous
