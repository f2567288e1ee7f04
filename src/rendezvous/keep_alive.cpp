#include "rendezvous/keep_alive.h"

#include <algorithm>

#include "tide/common/logging.h"

namespace tide::rendezvous::detail {

namespace {

using Clock = std::chrono::steady_clock;

int64_t ms(milliseconds d) {
  return d.count();
}

}  // namespace

void Watch::check_neighbour(int64_t& peer, bool peer_alive) {
  // Walks the ring past neighbours that finished; a silent one that did not
  // finish is lost, once it had lost_after since this round began to show
  // up at all (an etcd lease is granted as its keep-alive thread starts).
  if (peer_alive || Clock::now() < started + settings.lost_after()) {
    return;
  }
  for (int64_t seen = 0; peer != index && seen < size; ++seen) {
    if (seen > 0 && monitor->alive(peer)) {
      return;
    }
    if (!monitor->has_left(peer)) {
      if (lost.exchange(peer) == 0) {
        TIDE_LOG_WARN(
            "[rendezvous {}] round {}: node at arrival {} sent no heartbeat "
            "for "
            "{} ms; it is lost, restarting into a round without it",
            settings.run_id,
            round,
            peer,
            ms(settings.lost_after()));
        if (events::enabled()) {
          events::record_rdzv_event(events::RdzvEvent{
              .name = "DynamicRendezvousHandler.node_evicted",
              .run_id = settings.run_id,
              .message = "arrival " + std::to_string(peer) + " of round " +
                         std::to_string(round) + " lost (no heartbeat for " +
                         std::to_string(ms(settings.lost_after())) + " ms)",
              .hostname = fqdn(),
              .pid = ::getpid(),
              .node_state = events::NodeState::kRunning,
              .rank = rank,
              .local_id = node,
          });
        }
      }
      return;
    }
    peer = next_peer(peer);
  }
}

void Watch::run() {
  int failures = 0;
  int64_t peer = size > 1 ? next_peer(index) : index;
  // The first check only notes the neighbour's heartbeat; from then on it
  // has lost_after to show it moves.
  auto next_beat = Clock::now();
  for (;;) {
    {
      std::lock_guard lock(mutex);
      if (stop) {
        return;
      }
    }
    try {
      if (Clock::now() >= next_beat) {
        next_beat = Clock::now() + settings.keep_alive_interval;
        bool check = lost == 0 && waiting == 0 && peer != index;
        // The heartbeat, the job record and the neighbour's heartbeat in
        // one round trip.
        RoundMonitor::Tick t = monitor->tick(check ? peer : 0);
        if (t.state) {
          // A job closed because an agent finished lets the others finish
          // too; one closed by a failure stops them.
          JobState s = decode_state(settings.run_id, *t.state);
          if (s.closed && s.failed) {
            closed = true;
          }
        }
        if (check) {
          check_neighbour(peer, t.peer_alive);
        }
        failures = 0;
      }
      if (waiting == 0) {
        auto wait =
            std::chrono::duration_cast<milliseconds>(next_beat - Clock::now());
        if (int64_t n =
                monitor->wait_next_round(std::max(wait, milliseconds(1)));
            n > 0) {
          waiting = n;
          TIDE_LOG_INFO(
              "[rendezvous {}] {} node(s) wait in round {}; this round ({}) "
              "ends",
              settings.run_id,
              n,
              round + 1,
              round);
        }
        continue;
      }
    } catch (const std::exception& e) {
      if (++failures >= settings.keep_alive_max_attempt) {
        std::lock_guard lock(error_mutex);
        if (unreachable.empty()) {
          unreachable = e.what();
          TIDE_LOG_ERROR(
              "[rendezvous {}] the rendezvous backend is unreachable ({} "
              "keep-alive attempts failed): {}",
              settings.run_id,
              failures,
              e.what());
        }
      }
    }
    std::unique_lock lock(mutex);
    cv.wait_until(lock, next_beat, [&] { return stop; });
  }
}

}  // namespace tide::rendezvous::detail
