#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "cell.h"

// What run_cell shares with the drivers' worker threads. A worker is one
// client thread (Driver::kThreads) or one epoll thread serving a slice of the
// clients (Driver::kEpoll).
namespace tide::bench::detail {

// Bytes of the value every set writes.
constexpr size_t kValueBytes = 32;
// The key all clients add to.
constexpr const char* kCounterKey = "counter";

// The key of client i (its own: set and get).
std::string client_key(int index);

enum class OpKind : uint8_t { kSet, kGet, kAdd };
// The op a client runs at its step-th operation.
OpKind op_at(Workload w, uint64_t step);

enum Phase : int { kConnecting, kWarmup, kMeasure, kStop, kAbort };

// The cell's phase and rendezvous. Thread safe.
class CellState {
 public:
  explicit CellState(int workers) : workers_(workers) {}

  Phase phase() const {
    return static_cast<Phase>(phase_.load(std::memory_order_acquire));
  }
  // Main thread: moves to p and wakes workers waiting in await_start.
  void set_phase(Phase p);

  // Worker: its clients are connected (or it failed). Once per worker.
  void arrive();
  // Worker: waits up to timeout for the phase to leave kConnecting; false
  // when the cell is aborted or the wait timed out.
  bool await_start(std::chrono::milliseconds timeout);
  // Worker: done, results written. Once per worker, last.
  void finish();

  // Main thread: waits up to timeout for every worker to arrive / finish.
  bool await_arrived(std::chrono::milliseconds timeout);
  bool await_finished(std::chrono::milliseconds timeout);

 private:
  const int workers_;
  std::atomic<int> phase_{kConnecting};
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;   // Guarded by mutex_.
  int finished_ = 0;  // Guarded by mutex_.
};

// One worker's results; padded so workers do not share cache lines.
struct alignas(64) WorkerSlot {
  // Ops completed while the phase was kMeasure.
  uint64_t ops = 0;
  // When the worker's final sync round trip completed.
  Clock::time_point synced{};
  // Clients of this worker that failed, and the first error.
  int failed_clients = 0;
  std::string error;
};

// The workers. Each calls state.arrive() once its clients are connected,
// runs ops until the phase is kStop (or kAbort), syncs, fills slot and
// calls state.finish(); it catches everything. Clients are numbered
// [first, first + count).
void run_thread_client(
    const CellConfig& cfg,
    uint16_t port,
    int index,
    CellState& state,
    WorkerSlot& slot);
void run_epoll_worker(
    const CellConfig& cfg,
    uint16_t port,
    int first,
    int count,
    CellState& state,
    WorkerSlot& slot);

}  // namespace tide::bench::detail
