#pragma once

// Checkpoints held in memory (docs/checkpoints.md): when the spec gives
// checkpoint_memory, the agent creates its node's region in /dev/shm as its
// run begins (refusing at once, with the numbers, a bound that does not
// fit) and hands its name to every worker as TIDE_CHECKPOINT_REGION. The
// region lives as long as the agent, so a worker's snapshot outlives the
// worker: a restarted one (cold or prestarted) loads it in place of a disk
// read.
#include <map>
#include <memory>
#include <string>

#include "agent/component.h"

namespace tide::checkpoint {
class Region;
}

namespace tide::agent::detail {

class CheckpointMemory final : public Component {
 public:
  explicit CheckpointMemory(
      const AgentView& view, std::string dir = "/dev/shm");
  ~CheckpointMemory() override;

  // Creates the region (and removes those of agents that died).
  void start() override;
  void add_env(std::map<std::string, std::string>& env) const override;

 private:
  const AgentView& view_;
  std::string dir_;
  std::unique_ptr<checkpoint::Region> region_;
};

}  // namespace tide::agent::detail
