#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "tide/common/error.h"
#include "tide/store/store.h"

// Rendezvous: how the agents of a job agree, each round, on who is in it and
// in which order. A handler is one agent's view of it; backends (static,
// c10d, etcd, or a user's own) register by name.
namespace tide::rendezvous {

// Where workers find the store they may share with their agent (torch's
// RendezvousStoreInfo): MASTER_ADDR and MASTER_PORT.
struct BootstrapStoreInfo {
  std::string master_addr;
  uint16_t master_port = 0;
};

// The outcome of one round, for this agent.
struct RendezvousInfo {
  // The round's store, shared by all agents of the round (torch hands out a
  // PrefixStore of the rendezvous store).
  std::shared_ptr<store::Store> store;
  // This agent's rank among the round's agents, and their number.
  int rank = 0;
  int world_size = 0;
  // Where workers find their store: the agent's own when
  // use_agent_store(), else the address rank 0's agent picked.
  BootstrapStoreInfo bootstrap;
  // Names the round; the same on every agent of it, so the agents' keys in
  // `store` (rank assignment) never mix with another round's.
  int64_t round = 0;
};

// The configuration a backend is made from (torch's RendezvousParameters):
// --rdzv-backend, --rdzv-endpoint, --rdzv-id, --nnodes=MIN:MAX and the
// --rdzv-conf key=value pairs.
struct RendezvousParameters {
  std::string backend;
  std::string endpoint;
  std::string run_id;
  int min_nodes = 1;
  int max_nodes = 1;
  std::string local_addr;
  std::map<std::string, std::string> config;
  // The job secret, as the token of the tide store a backend hosts or
  // joins (c10d; TcpStoreOptions::token): torch's clients cannot present
  // one, so a job whose nodes include torch agents leaves it empty.
  std::string token;

  // A config value, or `fallback` when absent.
  std::string get(
      const std::string& key, const std::string& fallback = "") const;
  // Integers and booleans (1,true,t,yes,y / 0,false,f,no,n, any case);
  // InvalidArgument names the key when the value does not parse.
  int64_t get_as_int(const std::string& key, int64_t fallback) const;
  bool get_as_bool(const std::string& key, bool fallback) const;
  std::chrono::milliseconds get_as_seconds(
      const std::string& key, std::chrono::milliseconds fallback) const;
};

// One agent's handle on the rendezvous. Called from the agent's thread only
// unless a backend says otherwise.
class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;

  // The backend's name ("static", "c10d", ...).
  virtual std::string get_backend() const = 0;

  // Joins the next round and blocks until it completes. Throws
  // RendezvousClosedError when the job is over, RendezvousError (or
  // TimeoutError) when the round fails.
  virtual RendezvousInfo next_rendezvous() = 0;

  // Whether the job's rendezvous is closed (no more rounds).
  virtual bool is_closed() = 0;
  // Closes it: agents still running see is_closed() and stop.
  virtual void set_closed() = 0;

  // Agents waiting to join a later round; > 0 makes a healthy group restart
  // to admit them. Cheap enough to call every monitor interval.
  virtual int num_nodes_waiting() = 0;

  virtual std::string get_run_id() const = 0;

  // Releases this agent's resources (leaves the rendezvous for good).
  // Returns whether the shutdown completed.
  virtual bool shutdown() = 0;

  // Whether workers should attach to the agent's store
  // (TORCHELASTIC_USE_AGENT_STORE) instead of hosting their own.
  virtual bool use_agent_store() const {
    return true;
  }

  // A new client of the job's store for what agents publish beside the
  // rounds (their status records, docs/observability.md): the backend's
  // store, under this job's status prefix, usable from another thread and
  // never delaying the rendezvous (c10d: a handle on the agent's one shared
  // connection; etcd: a client of its own). Null
  // when the backend keeps no such store (this default). Throws what
  // connecting throws.
  virtual std::shared_ptr<store::Store> open_job_store() {
    return nullptr;
  }
  // Asks a next_rendezvous() blocked in another thread to give up soon
  // (it throws RendezvousError); the agent calls it when asked to stop.
  // Must be async-signal-safe: set a flag, nothing more.
  virtual void interrupt() noexcept {}
};

}  // namespace tide::rendezvous
