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
  double timeout_s = 120;
  std::string tide_store = TIDE_BENCH_TIDE_STORE;
};

void add_rendezvous_options(CLI::App& app, RendezvousOptions& o);
int run_rendezvous_bench(const RendezvousOptions& o);

}  // namespace tide::bench::scale
