// Driver::kThreads: one thread per client, each with its own tide TcpStore.
#include <exception>

#include "tide/store/tcp_store.h"

#include "worker.h"

namespace tide::bench::detail {

void run_thread_client(
    const CellConfig& cfg,
    uint16_t port,
    int index,
    CellState& state,
    WorkerSlot& slot) {
  bool arrived = false;
  try {
    store::TcpStore s(store::TcpStoreOptions{
        .host = "127.0.0.1",
        .port = port,
        .dialect = cfg.dialect,
        .timeout = cfg.op_timeout});
    const std::string key = client_key(index);
    const std::string value(kValueBytes, 'v');
    s.set(key, value);  // So that get never waits for a missing key.
    arrived = true;
    state.arrive();
    if (state.await_start(cfg.op_timeout)) {
      uint64_t ops = 0;
      for (uint64_t step = 0; state.phase() < kStop; ++step) {
        switch (op_at(cfg.workload, step)) {
          case OpKind::kSet:
            s.set(key, value);
            break;
          case OpKind::kGet:
            s.get(key);
            break;
          case OpKind::kAdd:
            s.add(kCounterKey, 1);
            break;
        }
        // Counted when it completes inside the window.
        if (state.phase() == kMeasure) {
          ++ops;
        }
      }
      if (state.phase() == kStop) {
        // A round trip: every set sent before has been applied.
        s.check({key});
        slot.synced = Clock::now();
        slot.ops = ops;
      }
    }
  } catch (const std::exception& e) {
    slot.failed_clients = 1;
    slot.error = e.what();
  }
  if (!arrived) {
    state.arrive();
  }
  state.finish();
}

}  // namespace tide::bench::detail
