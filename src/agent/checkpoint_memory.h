#pragma once

// Checkpoints held in memory (docs/checkpoints.md): when the spec gives
// checkpoints.memory, the agent creates its node's region in /dev/shm as its
// run begins (refusing at once, with the numbers, a bound that does not
// fit) and hands its name to every worker as TIDE_CHECKPOINT_REGION. The
// region lives as long as the agent, so a worker's snapshot outlives the
// worker: a restarted one (cold or prestarted) loads it in place of a disk
// read. With checkpoints.dir, a writer process (python -m tide.checkpoint
// --write-behind) copies each rank's newest snapshot there behind the
// training; when the agent ends, it is told to write the newest once more,
// and waited for. With checkpoints.peer, each round it copies its ranks'
// newest snapshots to the next node's agent (checkpoint/peer_copy.h) and,
// before its workers start, fetches from the other nodes the snapshots of
// ranks it does not hold (a replacement node, ranks moved by an elastic
// change).
#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "tide/common/fd.h"

#include "agent/component.h"

namespace tide::checkpoint {
class PeerCopy;
class Region;
}  // namespace tide::checkpoint

namespace tide::agent::detail {

class CheckpointMemory final : public Component {
 public:
  explicit CheckpointMemory(
      const AgentView& view, std::string shm_dir = "/dev/shm");
  // Lets the writer write the newest snapshots, then removes the region.
  ~CheckpointMemory() override;

  // Creates the region (and removes those of agents that died), and starts
  // the writer.
  void start() override;
  void add_env(std::map<std::string, std::string>& env) const override;
  // kStarted: meets the round's other agents, and fetches what it lacks.
  void entered(const Transition& t) override;
  // The writer ended on its own: said in the log.
  int fd() const override {
    return writer_pidfd_.get();
  }
  void readable() override;

 private:
  void start_writer();
  void stop_writer();
  void meet_peers();
  void fetch_missing();
  // Where this round's checkpoint peers meet in the round's store.
  std::string round_prefix() const;
  // How long a node that fetches waits for the others to take the round's
  // peers (they do so right after meeting; longer means one died).
  static constexpr std::chrono::milliseconds kPeersReadyTimeout{10'000};

  const AgentView& view_;
  std::string shm_dir_;
  std::unique_ptr<checkpoint::Region> region_;
  std::unique_ptr<checkpoint::PeerCopy> peers_;
  std::string token_;  // peers_'s
  pid_t writer_ = -1;
  Fd writer_pidfd_;
};

}  // namespace tide::agent::detail
