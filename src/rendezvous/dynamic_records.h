#pragma once

// The records the dynamic rendezvous keeps in its backend, and their JSON:
// the job's state (which round forms, whether the job is over), a round's
// size and its master. Decoding refuses anything else with a
// RendezvousStateError that says what is wrong and what to do.
#include <cstdint>
#include <string>

#include "tide/rendezvous/dynamic_rendezvous.h"

namespace tide::rendezvous::detail {

// The job's record: which round forms now and whether the job is over.
struct JobState {
  int64_t round = 0;
  bool closed = false;
  // Closed because an agent failed for good (running agents stop), rather
  // than because one finished (running agents finish their work).
  bool failed = false;
};

std::string encode_state(const std::string& run_id, const JobState& s);
JobState decode_state(const std::string& run_id, const std::string& text);

// A round's size, written once by whoever closes the round.
std::string encode_size(int64_t size, const NodeDesc& by);
int64_t decode_size(int64_t round, const std::string& text);

// A round's master (the store its workers use), written once by rank 0.
std::string encode_master(const std::string& addr, uint16_t port);
BootstrapStoreInfo decode_master(int64_t round, const std::string& text);

}  // namespace tide::rendezvous::detail
