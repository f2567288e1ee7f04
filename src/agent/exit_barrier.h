#pragma once

// The exit barrier (torch's _exit_barrier, docs/tiderun.md#the-exit-barrier):
// every node counts in once its part of the job is over, failed or not, so
// the nodes waiting learn at once that it will not come back; a node whose
// workers succeeded waits for the others (its store may serve them until
// then).
#include <atomic>

#include "tide/agent/local_elastic_agent.h"
#include "tide/rendezvous/rendezvous_handler.h"

namespace tide::agent::detail {

// Counts a node that failed for good in (logs what fails: the job is over
// for this node either way).
void count_in_failed(
    const rendezvous::RendezvousInfo& rdzv, const WorkerSpec& spec);

// Counts a node whose workers succeeded in, and waits for the others: until
// every node counted in, the rendezvous is closed (a node failed for good),
// a stop is requested (`stop_signal` not 0) or exit_barrier_timeout passes.
// Only logs what fails, as torch.
void exit_barrier(
    const rendezvous::RendezvousInfo& rdzv,
    const WorkerSpec& spec,
    const std::atomic<int>& stop_signal);

}  // namespace tide::agent::detail
