#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tide/store/tcp_store.h"

#include "server_process.h"

// init_process_group's start-up barrier (startup.h) through node-level store
// fan-ins: N simulated nodes of R ranks each; each node's ranks connect to
// their node's fan-in (tide's real fan-in code: a TcpStoreServer with an
// upstream, as a tide agent runs it), which forwards over one connection to
// the job's store. The nodes live in "node host" child processes of the
// bench (`scale_bench node-host`), nodes_per_host each, so that no process
// passes this machine's descriptor limit: a host's fan-ins share one loop
// thread, its ranks are coroutines on another (bench/scale/sim.h).
namespace tide::bench::scale {

struct FanInConfig {
  size_t nodes = 1024;
  size_t ranks_per_node = 8;
  size_t nodes_per_host = 1024;
  store::Dialect dialect = store::Dialect::kModern;
  // Rank connections per 127.x source address.
  size_t per_address = 1000;
  size_t connect_window = 1024;
  int64_t timeout_ns = 60'000'000'000;
  // This program (it runs itself as the node hosts).
  std::string self;
};

struct FanInResult {
  bool ok = false;
  std::string error;
  size_t done = 0;  // ranks through
  // From the start signal to the last rank connected, the last through.
  double connect_s = 0;
  double barrier_s = 0;
  // The job's store: its CPU, its memory before and with every rank in, and
  // its open descriptors then (its connections, plus a few).
  double root_cpu_s = 0;
  uint64_t root_rss_before_kb = 0;
  uint64_t root_rss_after_kb = 0;
  size_t root_fds = 0;
  // The node hosts' CPU (fan-ins and simulated ranks together).
  double hosts_cpu_s = 0;
  // Requests the ranks made, and the frames the fan-ins sent upstream.
  uint64_t requests = 0;
  uint64_t frames = 0;
};

// One cell against a running tide store (fresh per cell).
FanInResult run_fan_in_startup(const FanInConfig& cfg, ServerProcess& root);

// `scale_bench node-host ...`: one host's nodes (arguments from
// run_fan_in_startup). Prints READY once its fan-ins are connected, starts
// its ranks at the GO line on stdin, prints DONE with its figures, and exits
// when stdin closes.
int node_host_main(int argc, char** argv);

}  // namespace tide::bench::scale
