#pragma once

#include <string>

#include <CLI/CLI.hpp>

// tide's c10d rendezvous with N simulated agents (bench/scale/sim.h), each a
// coroutine that sends the store requests DynamicRendezvousHandler and its
// keep-alive thread send, in their order, against a tide-store process.
namespace tide::bench::scale {

struct RendezvousOptions {
  std::string nodes = "4k,8k,16k";
  int reps = 3;
  // Bound on each phase (connecting, the round, the re-rendezvous).
  double timeout_s = 60;
  bool kill = true;
  double idle_s = 5;
  // The documented settings for large jobs (docs/rendezvous.md).
  double keep_alive_s = 1;
  int keep_alive_max_attempt = 3;
  double last_call_s = 1;
  int64_t spare_nodes = 1;
  int real_agents = 0;
  size_t per_address = 1000;
  std::string tide_store = TIDE_BENCH_TIDE_STORE;
};

void add_rendezvous_options(CLI::App& app, RendezvousOptions& o);
int run_rendezvous_bench(const RendezvousOptions& o);

}  // namespace tide::bench::scale
