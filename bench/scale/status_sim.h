#pragma once

#include <string>

#include <CLI/CLI.hpp>

// The job's status board at scale (tide/status/job_status.h): N simulated
// agents, each publishing its node's record as StatusPublisher does (the
// same bytes, the same requests, at the interval effective_status_interval
// gives a job of N nodes), the leader reading every record, against a
// tide-store process; what that costs the server.
namespace tide::bench::scale {

struct StatusOptions {
  std::string nodes = "1k,8k";
  int reps = 3;
  // --status-interval of the agents (the effective one is longer for large
  // jobs).
  double interval_s = 5;
  int ranks_per_node = 8;
  // Measured for this many effective intervals (a multiple of
  // StatusPublisher::kFigureEvery: the leader reads once in that many),
  // after one to settle.
  double intervals = 4;
  // The server idle with every connection open, measured first.
  double idle_s = 5;
  double timeout_s = 60;
  size_t per_address = 1000;
  std::string tide_store = TIDE_BENCH_TIDE_STORE;
};

void add_status_options(CLI::App& app, StatusOptions& o);
int run_status_bench(const StatusOptions& o);

}  // namespace tide::bench::scale
