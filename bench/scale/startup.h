#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tide/store/tcp_store.h"

#include "server_process.h"
#include "sim.h"

// The store's start-up pattern at scale: N clients each connect, publish an
// address, count themselves in and wait for the last one (the barrier of
// init_process_group); with fetch_all each then reads every peer's address
// in batches (gloo's full mesh since it batches with multi_get).
namespace tide::bench::scale {

struct StartupConfig {
  size_t clients = 1000;
  bool fetch_all = false;
  // Keys per multi_get when fetch_all.
  size_t batch = 1024;
  // Client threads, each an epoll loop over its share of the clients.
  size_t threads = 1;
  // Clients per 127.x source address.
  size_t per_address = 1000;
  // Connects in flight per thread.
  size_t connect_window = 1024;
  store::Dialect dialect = store::Dialect::kModern;
  // Bound on the whole cell (and on each client's connect and wait).
  int64_t timeout_ns = 60'000'000'000;
};

struct StartupResult {
  bool ok = false;
  // The first error, or why the cell did not complete.
  std::string error;
  size_t done = 0;
  // From the first connect to: the last client connected, the last one
  // through the barrier, the last one with every address (fetch_all).
  double connect_s = 0;
  double barrier_s = 0;
  double fetch_s = 0;
  double server_cpu_s = 0;
  uint64_t rss_before_kb = 0;
  // With every client connected and through (or stuck at) the barrier.
  uint64_t rss_after_kb = 0;
  // Bytes the clients sent and received.
  uint64_t bytes = 0;
};

// One client of init_process_group's start-up: publish its address, count
// itself in, the last one in says so, everyone waits for that; then, with
// fetch_all, read every peer's address in batches (gloo's full mesh). The
// times are mono_ns() when it connected, got through, fetched.
struct StartupClient {
  std::unique_ptr<sim::Conn> conn;
  int64_t connected_at = 0;
  int64_t barrier_at = 0;
  int64_t fetched_at = 0;
};
sim::Co<void> start_up(
    StartupClient& c, size_t rank, size_t n, const StartupConfig& cfg);

// Runs one cell against a running server (a fresh one per cell, so that its
// memory and CPU are this cell's).
StartupResult run_startup(const StartupConfig& cfg, ServerProcess& server);

}  // namespace tide::bench::scale
