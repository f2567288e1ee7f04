#pragma once

// Hang detection (docs/tiderun.md#hang-detection): the workers' heartbeats
// arrive on a datagram socket the agent's poll loop watches; a worker that
// sent one and then none for --heartbeat-timeout is hung: its stack is
// captured, its error file written, and it is killed (the group then fails
// as for any failed worker). With a status interval but no timeout, the
// socket is open for the step numbers alone.
//
// Thread safety: the agent's thread.
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "tide/timer/heartbeat.h"

#include "agent/component.h"
#include "common/clock.h"

namespace tide::agent::detail {

class GroupProcesses;
class Reporter;

class HangDetector final : public Component {
 public:
  // Each heartbeat of a worker: its local rank, its step number if it sent
  // one, when it arrived.
  using BeatSink = std::function<void(
      size_t local_rank, std::optional<int64_t> step, Clock::time_point at)>;
  HangDetector(
      const AgentView& view,
      GroupProcesses& processes,
      const Reporter& reporter,
      BeatSink on_beat);

  // Opens the socket.
  void start() override;
  // The socket's path, and the timeout the workers' senders pace to.
  void add_env(std::map<std::string, std::string>& env) const override;
  // kStarted: forgets the last group's heartbeats.
  void entered(const Transition& t) override;
  int fd() const override;
  void readable() override;
  // When the first watched worker times out, and judging it then.
  Clock::time_point deadline() const override;
  void due() override;

 private:
  const AgentView& view_;
  GroupProcesses& processes_;
  const Reporter& reporter_;
  BeatSink on_beat_;
  std::unique_ptr<timer::HeartbeatReceiver> receiver_;
  // By local rank: the last heartbeat of the workers watched (those that
  // sent one).
  std::vector<std::optional<Clock::time_point>> last_beat_;
};

}  // namespace tide::agent::detail
