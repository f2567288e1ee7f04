#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "tide/rendezvous/registry.h"

// One rendezvous round of N simulated agents in this process: each agent is
// a thread holding one RendezvousHandler (from tide's registry unless a
// factory is given), so its own backend connection (and, once the round
// completes, one more for its keep-alive thread).
namespace tide::bench {

struct RoundOptions {
  // The registry's name: "c10d", "etcd".
  std::string backend;
  // HOST:PORT of the store or of etcd.
  std::string endpoint;
  // Fresh for every round: a run id names one job's rendezvous.
  std::string run_id;
  // Agents; the round is min_nodes = max_nodes = n.
  int n = 0;
  // --rdzv-conf of every handler.
  std::map<std::string, std::string> config;
  // Makes each agent's handler; empty: tide's registry.
  rendezvous::HandlerFactory factory;
  // Bound on each phase (making the handlers, the round); the handlers'
  // join_timeout and read_timeout should not exceed it.
  double timeout_s = 60;
  // Ending a round: shutdown() then destruction, or destruction only.
  bool shutdown = false;
  // How long the keep-alive threads may take to end after their handlers
  // are gone (they are detached and end within one keep-alive interval).
  double drain_timeout_s = 10;
  // Diagnostics: record when the agents joined and when the round closed,
  // through tide's rendezvous events (which then cost a little more).
  bool phases = false;
  // CPU seconds the backend's server has used so far, if known.
  std::function<double()> server_cpu;
  // Called on the main thread when the round is abandoned on an interrupt,
  // before the agents are joined: it must make their backend calls fail
  // (stop the server), or joining waits for their timeouts.
  std::function<void()> abort;
};

struct RoundResult {
  bool ok = false;
  // Why not ok; the first agent error, with how many agents had one.
  std::string error;
  // Making a handler failed with "unknown rendezvous backend".
  bool unknown_backend = false;
  // First agent thread started -> every handler made (connected).
  double connect_s = NAN;
  // "go" -> the first, median and last next_rendezvous() return.
  double first_s = NAN;
  double median_s = NAN;
  double round_s = NAN;
  // With phases: "go" -> the last agent joined (its arrival index taken),
  // and -> the round's size written (the round closed).
  double joined_s = NAN;
  double closed_s = NAN;
  // "go" -> the last return: CPU seconds of this process (agents and their
  // keep-alive threads) and of the server (NaN unless server_cpu), and this
  // process's context switches (voluntary + involuntary).
  double cpu_s = NAN;
  double server_cpu_s = NAN;
  int64_t switches = 0;
  // Teardown signal -> every agent thread ended (handlers destroyed,
  // after shutdown() if asked).
  double teardown_s = NAN;
  // Teardown signal -> this process's thread count back to where it was
  // before the round (the detached keep-alive threads ended); NaN if that
  // did not happen within drain_timeout_s.
  double drain_s = NAN;
  // The round every agent reported (RendezvousInfo::round).
  int64_t round = -1;
};

// Runs one round: starts n agent threads, each makes its handler; once all
// exist, one "go" releases them into next_rendezvous(); then each ends its
// handler. The round is ok only if every agent returned, the ranks are
// exactly 0..n-1, every world_size is n and every round is the same.
// Failures are results; throws Interrupted (after o.abort and joining the
// agents).
RoundResult run_round(const RoundOptions& o);

// This process's thread count (/proc/self/status); -1 if unknown.
int thread_count();

}  // namespace tide::bench
