#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tide/rendezvous/rendezvous_handler.h"
#include "tide/store/store.h"
#include "tide/store/tcp_store.h"

// The dynamic rendezvous (torch's DynamicRendezvousHandler): nodes join and
// leave between rounds, a round completes once enough nodes are in, and
// survivors notice a dead node by its missing heartbeats. The state machine
// is here; where the shared state lives is a RendezvousBackend (tide's
// store for "c10d", etcd for "etcd", or a user's own).
//
// How a round forms (docs/rendezvous.md has the details):
//  - a node reads the job's state record (round number, closed flag) and
//    joins that round: it gets the next arrival index, 1, 2, 3 ...
//  - the arrival that brings the count to min_nodes opens the last call;
//    every waiting node then closes the round after last_call_timeout, or
//    the arrival that reaches max_nodes closes it at once. The first close
//    fixes the round's size K (first writer wins); arrivals 1..K are in.
//    Their ranks follow the settings' rank_order: arrival - 1 by default,
//    else every participant reads the K node descriptors and sorts them the
//    same way (host names in natural order, torch's order, or the nodes'
//    own node ranks). The node with rank 0 publishes the workers' master
//    address.
//  - an arrival past K joins the next round, which makes every running
//    node's num_nodes_waiting() > 0, so their agents restart and join it
//    too. When the round was full (K == max_nodes) the node instead waits
//    as a hot spare until the next round opens, and triggers nothing.
//  - every participant heartbeats and watches the next participant in
//    arrival order (whatever the rank order); one silent for
//    keep_alive_interval x keep_alive_max_attempt counts as lost, and
//    num_nodes_waiting() > 0 makes the agent restart into a round without it.
namespace tide::rendezvous {

using std::chrono::milliseconds;

// Who a node is (torch's _NodeDesc): address, process and a per-process
// counter, so one process may hold several handlers. Printed addr_pid_id.
struct NodeDesc {
  std::string addr;
  int64_t pid = 0;
  int64_t local_id = 0;
  // The host's name as gethostname() gives it (the UTS name, not the FQDN);
  // tide's addition, for RankOrder::kNatural.
  std::string host;

  std::string to_string() const;
  // This process's next descriptor (local_id counts up), with this host's
  // name.
  static NodeDesc make(const std::string& addr);
};

// How the participants of a round are given their ranks 0..K-1
// (--rank-order). Whatever the order, ranks are unique and contiguous, and
// every node computes the same ones.
enum class RankOrder {
  // By arrival: rank = arrival index - 1 (tide's default).
  kArrival,
  // By host name, runs of digits compared as numbers (node7 < node66 <
  // node100), then address, then arrival (pytorch#191190).
  kNatural,
  // By each node's own node rank (--node-rank), when every participant gave
  // a distinct one; else by arrival, which the nodes log (pytorch#182223).
  kNodeRank,
  // torch's order: (addr, pid, local_id) compared as plain strings and
  // integers, so node66 < node7.
  kLexicographic,
};

// --rdzv-conf keys of the dynamic rendezvous, with torch's defaults.
struct DynamicRendezvousSettings {
  std::string run_id;
  int min_nodes = 1;
  int max_nodes = 1;
  milliseconds join_timeout{600'000};
  milliseconds last_call_timeout{30'000};
  milliseconds close_timeout{30'000};
  milliseconds keep_alive_interval{5'000};
  int keep_alive_max_attempt = 3;
  RankOrder rank_order = RankOrder::kArrival;
  // This node's --node-rank, for RankOrder::kNodeRank (>= 0).
  std::optional<int> node_rank;

  // join_timeout, last_call_timeout, close_timeout, keep_alive_interval,
  // keep_alive_max_attempt, rank_order ("arrival", "natural", "node-rank",
  // "lexicographic"), node_rank; InvalidArgument names a bad value.
  static DynamicRendezvousSettings from(const RendezvousParameters& params);
  // How long a silent node is given before it counts as lost.
  milliseconds lost_after() const {
    return keep_alive_interval * keep_alive_max_attempt;
  }
};

// One participant's background view of a round: its own heartbeat, its
// neighbour's, the job's state record and the next round's arrivals. Runs
// on its own connection, on the keep-alive thread only.
class RoundMonitor {
 public:
  virtual ~RoundMonitor() = default;
  // Shows this node alive. Throws (NetworkError, TimeoutError) when the
  // backend cannot be reached.
  virtual void beat() = 0;
  // Whether the participant with this arrival index shows signs of life
  // (a store heartbeat seen to move within lost_after, an etcd lease that
  // has not expired). Called once per keep_alive_interval per neighbour.
  virtual bool alive(int64_t index) = 0;
  // Whether that participant left for good (it finished).
  virtual bool has_left(int64_t index) = 0;
  // The job's state record, or nullopt when absent.
  virtual std::optional<std::string> state() = 0;
  // Waits up to timeout for the next round's first arrival; returns the
  // number of arrivals then (0 at timeout).
  virtual int64_t wait_next_round(milliseconds timeout) = 0;

  // One keep-alive interval: beat(), state() and, when peer > 0,
  // alive(peer). A backend that can sends them together (one round trip).
  struct Tick {
    std::optional<std::string> state;
    bool peer_alive = true;
  };
  virtual Tick tick(int64_t peer) {
    beat();
    Tick t{.state = state()};
    if (peer > 0) {
      t.peer_alive = alive(peer);
    }
    return t;
  }
};

// Where the shared state lives. The handler calls it from the agent's
// thread; monitor() connections are used from the keep-alive thread.
//
// Every value the handler writes is JSON with a schema field; the backend
// only stores and compares strings.
class RendezvousBackend {
 public:
  virtual ~RendezvousBackend() = default;

  // The job's state record, nullopt when absent.
  virtual std::optional<std::string> get_state() = 0;
  // Sets the record to desired when it holds expected (nullopt: absent).
  // Returns the record after the call (desired when it won).
  virtual std::string compare_set_state(
      const std::optional<std::string>& expected,
      const std::string& desired) = 0;

  // Adds node (its JSON) to round's arrivals; returns its arrival index,
  // from 1, unique and without gaps, in the order of arrival.
  virtual int64_t join(int64_t round, const std::string& node) = 0;
  // The JSON that arrivals 1..count of round joined with, in arrival order,
  // waiting up to timeout for each to be written (an arrival is counted
  // before its JSON is stored); nullopt at timeout, when an arrival died in
  // between. Needed for every rank order but arrival; this default throws
  // InvalidArgument saying so.
  virtual std::optional<std::vector<std::string>> participants(
      int64_t round, int64_t count, milliseconds timeout);
  // The number of arrivals in round so far.
  virtual int64_t arrivals(int64_t round) = 0;
  // A round's write-once values ("last_call", "size", "master"): sets name
  // unless it is set; returns the value it holds after the call.
  virtual std::string set_once(
      int64_t round, const std::string& name, const std::string& value) = 0;
  // A write-once value, or nullopt when it is not set.
  virtual std::optional<std::string> get_value(
      int64_t round, const std::string& name) = 0;
  // Waits up to timeout for a write-once value; nullopt at timeout.
  virtual std::optional<std::string> wait_value(
      int64_t round, const std::string& name, milliseconds timeout) = 0;
  // Bounds each later call (connecting included); the handler lowers it
  // as it shuts down, so a backend that is gone costs little to leave.
  virtual void set_timeout(milliseconds timeout) = 0;
  // Marks arrival index of round (of size participants) as gone for good,
  // at the end of the job. A backend whose server lives in this process keeps
  // it up until every participant left, for at most close_timeout (0: not
  // at all), so the others can finish their exit barrier.
  virtual void leave(
      int64_t round,
      int64_t index,
      int64_t size,
      const DynamicRendezvousSettings& s) = 0;

  // A new connection watching round as participant index.
  virtual std::unique_ptr<RoundMonitor> monitor(
      int64_t round, int64_t index, const DynamicRendezvousSettings& s) = 0;
  // The store the round's agents share (rank assignment, exit barrier).
  virtual std::shared_ptr<store::Store> round_store(int64_t round) = 0;
  // RendezvousHandler::open_job_store(); null by default.
  virtual std::shared_ptr<store::Store> open_job_store() {
    return nullptr;
  }
};

// The dynamic handler over any backend. Thread safe: num_nodes_waiting()
// and is_closed() may be called while another thread is in
// next_rendezvous().
class DynamicRendezvousHandler final : public RendezvousHandler {
 public:
  DynamicRendezvousHandler(
      std::string backend_name,
      std::unique_ptr<RendezvousBackend> backend,
      DynamicRendezvousSettings settings,
      NodeDesc self);
  ~DynamicRendezvousHandler() override;

  std::string get_backend() const override {
    return backend_name_;
  }
  // Throws RendezvousClosedError (job closed), RendezvousTimeoutError (no
  // round within join_timeout), RendezvousConnectionError (backend gone),
  // RendezvousStateError (a malformed record).
  RendezvousInfo next_rendezvous() override;
  bool is_closed() override;
  void set_closed() override;
  // Nodes waiting in the next round plus neighbours lost from this one
  // (0 or 1). Never blocks on the network: the keep-alive thread keeps
  // both current. Throws RendezvousConnectionError when that thread lost
  // the backend, RendezvousClosedError when another node closed the job.
  int num_nodes_waiting() override;
  std::string get_run_id() const override {
    return settings_.run_id;
  }
  // Leaves the round for good and closes the job (torch's rule: an agent
  // that finishes, or fails for good, ends the rendezvous for everyone).
  // After interrupt(), a store served from this process stops at once
  // instead of waiting for the others to leave.
  bool shutdown() override;
  // Workers host their own store at the address rank 0's agent published
  // (torch 1.13's rule for c10d and etcd).
  bool use_agent_store() const override {
    return false;
  }
  // next_rendezvous() gives up within one keep-alive interval.
  void interrupt() noexcept override;
  // The backend's; thread safe.
  std::shared_ptr<store::Store> open_job_store() override;

  const NodeDesc& node() const {
    return self_;
  }

 private:
  struct Impl;
  std::string backend_name_;
  DynamicRendezvousSettings settings_;
  NodeDesc self_;
  std::unique_ptr<Impl> impl_;
};

// The c10d backend over any tide Store (HashStore in one process, a
// MuxStore or TcpStore across hosts). connect() gives the keep-alive
// thread and the job's status records a client of the same store that may
// be used from another thread (tiderun's: a handle on the agent's one
// shared connection). Keys live under "tide.rdzv/<run_id>/". hosted: the
// store's server when it lives in this process, kept with the backend (see
// leave()).
std::unique_ptr<RendezvousBackend> make_store_backend(
    std::shared_ptr<store::Store> store,
    std::function<std::shared_ptr<store::Store>()> connect,
    const std::string& run_id,
    std::shared_ptr<store::TcpStoreServer> hosted = nullptr);

// The backends the registry knows as "c10d" and "etcd" (made from tiderun's
// flags: --rdzv-endpoint, --rdzv-id, --nnodes, --rdzv-conf).
std::unique_ptr<RendezvousHandler> make_c10d_handler(
    const RendezvousParameters& params);
std::unique_ptr<RendezvousHandler> make_etcd_handler(
    const RendezvousParameters& params);
// Their job stores seen from outside the job (open_job_store in registry.h).
std::shared_ptr<store::Store> open_c10d_job_store(
    const RendezvousParameters& params, milliseconds timeout);
std::shared_ptr<store::Store> open_etcd_job_store(
    const RendezvousParameters& params, milliseconds timeout);

}  // namespace tide::rendezvous
