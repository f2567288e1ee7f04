#pragma once

// The node's store fan-in (WorkerSpec::store_fan_in, docs/store-fan-in.md):
// at each start the workers get a fan-in on 127.0.0.1 that forwards their
// store requests to the job's store over one connection. The job's store is
// the agent store of the rendezvous (static, standalone: a tide store
// already) or, in a dynamic rendezvous, a tide store that group rank 0's
// agent serves for the attempt at the address the round published, where
// torch would have rank 0's worker serve one.
#include <map>
#include <memory>
#include <string>

#include "agent/component.h"

namespace tide::store {
class TcpStoreServer;
}  // namespace tide::store

namespace tide::agent::detail {

class StoreFanIn final : public Component {
 public:
  explicit StoreFanIn(const AgentView& view);
  ~StoreFanIn() override;

  void add_env(std::map<std::string, std::string>& env) const override;
  // kStarted: the attempt's store (rank 0, dynamic rendezvous) and fan-in.
  void entered(const Transition& t) override;

 private:
  const AgentView& view_;
  std::unique_ptr<store::TcpStoreServer> store_;
  std::unique_ptr<store::TcpStoreServer> fan_in_;
};

}  // namespace tide::agent::detail
