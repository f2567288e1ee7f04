#include "agent/exit_barrier.h"

#include <signal.h>

#include <string>

#include "tide/common/logging.h"

#include "common/clock.h"

namespace tide::agent::detail {

using std::chrono::milliseconds;

namespace {

// The exit barrier's keys in the round's store (torch's terminal_state).
const std::string kBarrier = "torchelastic/agent/terminal_state/";

void count_in(const rendezvous::RendezvousInfo& rdzv, bool failed) {
  // Every node counts in once its part of the job is over, failed or not,
  // so the nodes waiting for it learn at once that it will not come back.
  if (rdzv.world_size <= 1 || !rdzv.store) {
    return;
  }
  store::Store& st = *rdzv.store;
  if (failed) {
    st.set(kBarrier + "failed", std::to_string(rdzv.rank));
  }
  if (st.add(kBarrier + "num_members", 1) >= rdzv.world_size) {
    st.set(kBarrier + "last_member", "1");
  }
}

}  // namespace

void count_in_failed(
    const rendezvous::RendezvousInfo& rdzv, const WorkerSpec& spec) {
  try {
    count_in(rdzv, /*failed=*/true);
  } catch (const Error& e) {
    TIDE_LOG_WARN(
        "[{}] exit barrier: could not count this node in: {}",
        spec.role,
        e.what());
  }
}

void exit_barrier(
    const rendezvous::RendezvousInfo& rdzv,
    const WorkerSpec& spec,
    const std::atomic<int>& stop_signal) {
  // A node whose workers succeeded waits for the others to count in (its
  // store may serve them until then), but not for a job that is over: a
  // closed rendezvous (a node failed for good) or a stop request ends the
  // wait too. The wait goes in slices of at most a second so both are seen
  // within one; a timeout is only logged, as in torch.
  if (rdzv.world_size <= 1) {
    return;
  }
  auto started = Clock::now();
  auto deadline = started + spec.exit_barrier_timeout;
  auto waited = [&] { return elapsed_ms(started); };
  try {
    store::Store& st = *rdzv.store;
    count_in(rdzv, /*failed=*/false);
    for (;;) {
      if (int sig = stop_signal.load(); sig != 0) {
        const char* name = sigabbrev_np(sig);
        TIDE_LOG_WARN(
            "[{}] exit barrier: received SIG{} after {} ms; leaving it "
            "without waiting for the other nodes (this node's workers "
            "succeeded)",
            spec.role,
            name ? name : "?",
            waited());
        return;
      }
      auto now = Clock::now();
      if (now >= deadline) {
        TIDE_LOG_WARN(
            "[{}] exit barrier: not every node finished within {} ms "
            "(--exit-barrier-timeout); {} of {} counted in; leaving it",
            spec.role,
            spec.exit_barrier_timeout.count(),
            st.add(kBarrier + "num_members", 0),
            rdzv.world_size);
        return;
      }
      auto slice = std::min<milliseconds>(
          milliseconds(1000),
          std::chrono::duration_cast<milliseconds>(deadline - now) +
              milliseconds(1));
      try {
        st.wait({kBarrier + "last_member"}, slice);
        break;
      } catch (const TimeoutError&) {
      }
      if (spec.rdzv_handler->is_closed()) {
        TIDE_LOG_WARN(
            "[{}] exit barrier: the rendezvous is closed (a node failed for "
            "good, or the job ended elsewhere); leaving it after {} ms "
            "without waiting for the other nodes",
            spec.role,
            waited());
        return;
      }
    }
    if (st.check({kBarrier + "failed"})) {
      TIDE_LOG_WARN(
          "[{}] exit barrier: every node has ended, node {} (at least) "
          "failed; leaving it after {} ms",
          spec.role,
          st.get(kBarrier + "failed"),
          waited());
    } else {
      TIDE_LOG_INFO(
          "[{}] exit barrier: all {} nodes finished ({} ms)",
          spec.role,
          rdzv.world_size,
          waited());
    }
  } catch (const Error& e) {
    TIDE_LOG_WARN("[{}] exit barrier: {}", spec.role, e.what());
  }
}

}  // namespace tide::agent::detail
