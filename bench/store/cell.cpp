#include "cell.h"

#include <sys/resource.h>

#include <algorithm>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "worker.h"

namespace tide::bench {

namespace detail {

std::string client_key(int index) {
  return "bench/" + std::to_string(index);
}

OpKind op_at(Workload w, uint64_t step) {
  switch (w) {
    case Workload::kMix:
      return step % 3 == 0   ? OpKind::kSet
             : step % 3 == 1 ? OpKind::kGet
                             : OpKind::kAdd;
    case Workload::kSet:
      return OpKind::kSet;
    case Workload::kGet:
      return OpKind::kGet;
    case Workload::kAdd:
      return OpKind::kAdd;
  }
  return OpKind::kAdd;
}

void CellState::set_phase(Phase p) {
  {
    // Under the mutex, so a worker cannot miss the wake-up between its
    // check and its wait.
    std::lock_guard lock(mutex_);
    phase_.store(p, std::memory_order_release);
  }
  cv_.notify_all();
}

void CellState::arrive() {
  {
    std::lock_guard lock(mutex_);
    ++arrived_;
  }
  cv_.notify_all();
}

bool CellState::await_start(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return phase() != kConnecting; });
  Phase p = phase();
  return p != kConnecting && p != kAbort;
}

void CellState::finish() {
  {
    std::lock_guard lock(mutex_);
    ++finished_;
  }
  cv_.notify_all();
}

bool CellState::await_arrived(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return cv_.wait_for(lock, timeout, [&] { return arrived_ == workers_; });
}

bool CellState::await_finished(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return cv_.wait_for(lock, timeout, [&] { return finished_ == workers_; });
}

}  // namespace detail

Workload parse_workload(const std::string& name) {
  if (name == "mix") {
    return Workload::kMix;
  }
  if (name == "set") {
    return Workload::kSet;
  }
  if (name == "get") {
    return Workload::kGet;
  }
  if (name == "add") {
    return Workload::kAdd;
  }
  throw std::invalid_argument(
      "unknown workload \"" + name + "\"; known: mix, set, get, add");
}

Driver parse_driver(const std::string& name) {
  if (name == "threads") {
    return Driver::kThreads;
  }
  if (name == "epoll") {
    return Driver::kEpoll;
  }
  throw std::invalid_argument(
      "unknown driver \"" + name + "\"; known: threads, epoll");
}

const char* describe(Workload w) {
  switch (w) {
    case Workload::kMix:
      return "set, get, add in rotation; set and get on the client's own key, "
             "add on a counter shared by all clients";
    case Workload::kSet:
      return "set on the client's own key (no reply in this protocol: the "
             "window is extended until every client's last set is "
             "acknowledged)";
    case Workload::kGet:
      return "get on the client's own key";
    case Workload::kAdd:
      return "add 1 to a counter shared by all clients";
  }
  return "";
}

const char* describe(Driver d) {
  switch (d) {
    case Driver::kThreads:
      return "one thread per client, each with its own tide TcpStore "
             "(blocking calls)";
    case Driver::kEpoll:
      return "the same requests, pre-encoded, on N connections multiplexed "
             "by epoll in few threads (one request outstanding per "
             "connection): the client side costs little, so the server's "
             "capacity shows";
  }
  return "";
}

namespace {

double self_cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) +
           static_cast<double>(tv.tv_usec) / 1e6;
  };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// Sleeps for d, or until interrupted.
void sleep_for(Seconds d, const std::atomic<bool>& interrupted) {
  auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(d);
  while (!interrupted.load() && Clock::now() < until) {
    std::this_thread::sleep_for(std::min<Clock::duration>(
        until - Clock::now(), std::chrono::milliseconds(50)));
  }
}

}  // namespace

CellResult run_cell(
    const CellConfig& cfg,
    ServerProcess& server,
    const std::atomic<bool>& interrupted) {
  using detail::Phase;
  const bool threads = cfg.driver == Driver::kThreads;
  const int workers =
      threads ? cfg.clients : std::clamp(cfg.epoll_threads, 1, cfg.clients);
  detail::CellState state(workers);
  std::vector<detail::WorkerSlot> slots(static_cast<size_t>(workers));
  std::vector<std::thread> pool;
  pool.reserve(slots.size());
  auto join_all = [&] {
    for (auto& t : pool) {
      if (t.joinable()) {
        t.join();
      }
    }
  };
  try {
    for (int w = 0; w < workers; ++w) {
      auto& slot = slots[static_cast<size_t>(w)];
      if (threads) {
        pool.emplace_back(
            detail::run_thread_client,
            std::cref(cfg),
            server.port(),
            w,
            std::ref(state),
            std::ref(slot));
      } else {
        // Client ranges of nearly equal size.
        int first = cfg.clients * w / workers;
        int last = cfg.clients * (w + 1) / workers;
        pool.emplace_back(
            detail::run_epoll_worker,
            std::cref(cfg),
            server.port(),
            first,
            last - first,
            std::ref(state),
            std::ref(slot));
      }
    }
  } catch (...) {
    // Out of threads: release the ones started, then report.
    state.set_phase(detail::kAbort);
    join_all();
    throw;
  }

  // Every client call is bounded by op_timeout; 256 connects may queue.
  const auto bound = cfg.op_timeout + std::chrono::seconds(5);
  CellResult res;
  Clock::time_point t0;
  Clock::time_point t1;
  // CPU seconds used by the server and by this process, at t0 and t1.
  double server_cpu[2] = {0, 0};
  double client_cpu[2] = {0, 0};
  bool all_arrived = state.await_arrived(bound);
  if (all_arrived) {
    state.set_phase(detail::kWarmup);
    sleep_for(cfg.warmup, interrupted);
    server_cpu[0] = server.cpu_seconds();
    client_cpu[0] = self_cpu_seconds();
    t0 = Clock::now();
    state.set_phase(detail::kMeasure);
    sleep_for(cfg.measure, interrupted);
    state.set_phase(detail::kStop);
    t1 = Clock::now();
    server_cpu[1] = server.cpu_seconds();
    client_cpu[1] = self_cpu_seconds();
  } else {
    state.set_phase(detail::kAbort);
  }
  if (!all_arrived || !state.await_finished(bound)) {
    // Stopping the server fails every pending call at once, so the joins
    // are bounded.
    server.stop();
    join_all();
    throw std::runtime_error(fmt::format(
        "{} clients against {} did not {} within {} s; server stopped",
        cfg.clients,
        server.name(),
        all_arrived ? "finish" : "connect",
        std::chrono::duration_cast<std::chrono::seconds>(bound).count()));
  }
  join_all();
  const bool set_only = cfg.workload == Workload::kSet;
  if (set_only) {
    // The window extends to the last sync (below): so does the CPU time.
    server_cpu[1] = server.cpu_seconds();
    client_cpu[1] = self_cpu_seconds();
  }

  Clock::time_point end = t1;
  for (const auto& s : slots) {
    if (s.failed_clients > 0 && res.failed_clients == 0) {
      res.first_error = s.error;
    }
    res.failed_clients += s.failed_clients;
    res.ops += s.ops;
    if (set_only) {
      end = std::max(end, s.synced);
    }
  }
  double window = Seconds(end - t0).count();
  res.ops_per_s = static_cast<double>(res.ops) / window;
  res.server_cores = (server_cpu[1] - server_cpu[0]) / window;
  res.client_cores = (client_cpu[1] - client_cpu[0]) / window;
  if (!server.alive()) {
    throw std::runtime_error(server.name() + " exited during the run");
  }
  return res;
}

}  // namespace tide::bench
