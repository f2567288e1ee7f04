#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "tide/store/tcp_store.h"

#include "server_process.h"

// One measurement of store_bench, a cell: a workload run by N concurrent
// clients against one server for a fixed window, counting completed ops.
namespace tide::bench {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

// What every client does, in a loop. Each client has its own key; the
// counter is shared by all. get is WAIT + GET, as torch's client does it.
enum class Workload : uint8_t {
  kMix,  // set, get, add in rotation
  kSet,
  kGet,
  kAdd,
};

// How the clients are run. Both send the same requests in the same order,
// one outstanding request per connection, as N TcpStore clients do.
enum class Driver : uint8_t {
  // One thread per client, each with a tide TcpStore (blocking calls): what
  // an application sees, client costs included.
  kThreads,
  // A few threads multiplexing the N connections with epoll and pre-encoded
  // requests: little client CPU, so the server's own capacity shows.
  kEpoll,
};

// Throw std::invalid_argument for an unknown name, listing the known ones.
Workload parse_workload(const std::string& name);
Driver parse_driver(const std::string& name);
// One line for the report.
const char* describe(Workload w);
const char* describe(Driver d);

struct CellConfig {
  Driver driver = Driver::kThreads;
  Workload workload = Workload::kMix;
  // What the clients speak: torch 1.13's, or torch >= 2.2's (a VALIDATE
  // first, shifted codes). tide's server takes both; torch's its own.
  store::Dialect dialect = store::Dialect::kLegacy;
  int clients = 1;
  // Threads of the epoll driver (at most `clients`).
  int epoll_threads = 1;
  // Unmeasured time after every client has connected.
  Seconds warmup{0.5};
  Seconds measure{2};
  // Bound on any one client call (connect included): past it the cell fails.
  std::chrono::milliseconds op_timeout{30'000};
};

struct CellResult {
  double ops_per_s = 0;
  uint64_t ops = 0;
  // Cores the server and this process (the clients) used during the window.
  double server_cores = 0;
  double client_cores = 0;
  // Clients that failed (their ops are not counted); the first error.
  int failed_clients = 0;
  std::string first_error;
};

// Runs one cell against server: connects every client, warms up, measures,
// then syncs every client with one round trip (so every set it sent has been
// applied: for the set workload the window is extended to that point).
// Blocks about warmup + measure. Returns early (a result to discard) once
// `interrupted` is set. Throws std::runtime_error when the server exits or
// the clients hang past op_timeout; the server has then been stopped.
CellResult run_cell(
    const CellConfig& cfg,
    ServerProcess& server,
    const std::atomic<bool>& interrupted);

}  // namespace tide::bench
