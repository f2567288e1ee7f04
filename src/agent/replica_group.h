#pragma once

// The agent's side of per-step fault tolerance (docs/fault_tolerance.md):
// when the spec names a replica group, every attempt of this node's workers
// is one member of the job's quorum (TIDE_FT_INCARNATION: a nonce of this
// agent and the attempt's number), and the moment the agent sees an attempt
// end (a worker failed, a stop, the end of the job) it declares that member
// out in the quorum's store, before it stops the other workers: the other
// groups' round is aborted at once and their next quorum is formed without
// it, instead of waiting for a heartbeat to time out.
#include <map>
#include <memory>
#include <string>

#include "agent/component.h"

namespace tide::store {
class Store;
}  // namespace tide::store

namespace tide::agent::detail {

class ReplicaGroup final : public Component {
 public:
  explicit ReplicaGroup(const AgentView& view);
  ~ReplicaGroup() override;

  void add_env(std::map<std::string, std::string>& env) const override;
  // kStarted: a new member; anything else ends the member that ran.
  void entered(const Transition& t) override;

 private:
  const AgentView& view_;
  const std::string nonce_;
  std::shared_ptr<store::Store> store_;
  std::string incarnation_;  // of the attempt running; "" when none
};

// The quorum's store named by "HOST:PORT" or "etcd:HOST:PORT[,...]", under
// tide.ft's prefix for the job `run_id` (python/tide/ft.py uses the same).
std::shared_ptr<store::Store> replica_store(
    const std::string& address, const std::string& run_id);

}  // namespace tide::agent::detail
