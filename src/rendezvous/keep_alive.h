#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "tide/rendezvous/dynamic_rendezvous.h"

namespace tide::rendezvous::detail {

// The keep-alive of a running round (docs/rendezvous.md): a thread that
// beats for this node every keep-alive interval and watches its neighbour
// in the ring of the round's members (in arrival order); a neighbour silent
// for lost_after is lost, nodes that wait to join are counted, and a closed
// job or a backend that is gone is noted, all for the handler to read
// (num_nodes_waiting(), is_closed()). Shared with its thread, so the
// thread may outlive the handler (it is detached at shutdown and ends by
// itself within one keep-alive interval).
struct Watch {
  DynamicRendezvousSettings settings;
  std::string node;
  int64_t round = 0;
  int64_t index = 0;  // arrival: the ring follows arrival order
  int64_t size = 0;
  int rank = 0;
  std::unique_ptr<RoundMonitor> monitor;

  std::mutex mutex;
  std::condition_variable cv;
  bool stop = false;

  std::chrono::steady_clock::time_point started =
      std::chrono::steady_clock::now();
  std::atomic<int64_t> waiting{0};
  std::atomic<int64_t> lost{0};  // arrival index of a lost neighbour
  std::atomic<bool> closed{false};
  std::mutex error_mutex;
  std::string unreachable;  // set once the backend is gone

  void run();
  // After the interval's tick saw peer (not) alive.
  void check_neighbour(int64_t& peer, bool peer_alive);
  int64_t next_peer(int64_t after) const {
    return after % size + 1;
  }
};

}  // namespace tide::rendezvous::detail
