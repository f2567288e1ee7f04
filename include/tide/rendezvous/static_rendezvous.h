#pragma once

#include <memory>

#include "tide/rendezvous/rendezvous_handler.h"
#include "tide/store/tcp_store.h"

namespace tide::rendezvous {

// The static backend (torch's static_tcp_rendezvous): a fixed number of
// nodes, each told its rank. Node 0 hosts the store at the endpoint
// (MASTER_ADDR:MASTER_PORT; port 0 picks a free one, for single-node jobs);
// the others connect to it. No elasticity: num_nodes_waiting() is 0.
//
// Parameters: endpoint "host[:port]" (default port 29500), max_nodes = the
// node count, config "rank" (this node's rank, default 0), "timeout"
// (seconds, the store timeout, default 600) and "agent_store" (default 1:
// the workers use the agents' store, TORCHELASTIC_USE_AGENT_STORE; 0: global
// rank 0's worker hosts theirs, anew each round, as for a torch that cannot
// reach the agent's store: on one node at the endpoint's port, the agents'
// store moving to a free one, or at a new free port each round for port 0;
// on several, at one port node 0 picks for the job).
//
// The constructor checks the parameters (InvalidArgument: a count that is
// not fixed, a rank outside it, port 0 for several nodes) and connects to
// nothing. next_rendezvous() blocks: node 0 starts the store (NetworkError
// when it cannot listen), the others connect to it, waiting up to
// "timeout" for it to come up (TimeoutError). Every round returns the same
// store and ranks; on one node, a round after the first erases what the
// previous attempt's workers wrote there (every key outside the run id's),
// so that a restarted group never reads a stale address. is_closed() and
// set_closed() are this node's only (no other node learns of it: a node that
// fails for good tells the others through the exit barrier instead). Called
// from the agent's thread only, but interrupt().
class StaticRendezvousHandler final : public RendezvousHandler {
 public:
  explicit StaticRendezvousHandler(const RendezvousParameters& params);

  std::string get_backend() const override {
    return "static";
  }
  RendezvousInfo next_rendezvous() override;
  bool is_closed() override;
  void set_closed() override;
  int num_nodes_waiting() override {
    return 0;
  }
  std::string get_run_id() const override {
    return run_id_;
  }
  bool shutdown() override;
  bool use_agent_store() const override {
    return agent_store_;
  }

 private:
  // Between two attempts: empties the workers' store of what the previous
  // attempt's workers wrote (one node), or warns once that it cannot (more).
  void forget_previous_attempt();
  // agent_store=0: where rank 0's worker hosts the workers' store this round.
  uint16_t workers_store_port();

  std::string run_id_;
  std::string host_;
  uint16_t port_ = 0;
  // agent_store=0 on one node: the endpoint's port, for the workers' store.
  uint16_t workers_port_ = 0;
  int rank_ = 0;
  int world_size_ = 1;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<store::TcpStore> store_;
  bool agent_store_ = true;
  bool closed_ = false;
  int round_ = 0;
};

}  // namespace tide::rendezvous
