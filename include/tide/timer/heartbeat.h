#pragma once

#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tide/common/fd.h"

// Heartbeats: a worker says "I am making progress" cheaply and often, and an
// agent run with a heartbeat timeout (tiderun --heartbeat-timeout) treats a
// worker whose heartbeats stop as hung: it captures the worker's stack,
// kills it and restarts the group. A worker that never sends one is never
// judged by them.
//
// A beat may carry the worker's training step number (its decimal digits
// are the datagram). The agent then knows each rank's step time, publishes
// it in the job's status and scores the ranks for stragglers
// (docs/observability.md#stragglers). A beat without a number (".") only
// says "alive".
//
// The channel is the local timers' kind: a Unix datagram socket the agent
// binds in its log directory and advertises as TIDE_HEARTBEAT_SOCKET. The
// kernel tells the agent each sender's pid, so the datagram's bytes do not
// matter and a worker cannot beat for another. From Python, with the
// standard library alone:
//
//   import os, socket
//   beat = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
//   beat.connect(os.environ["TIDE_HEARTBEAT_SOCKET"])
//   ...
//   beat.send(str(step).encode())   # once per step (or b"." for none)
//
// (tide.heartbeat(step) does the same.) From C++:
//
//   tide::timer::heartbeat(step);  // a no-op outside such an agent
namespace tide::timer {

// The variable holding the socket's path, and the one holding the agent's
// timeout in seconds (so a worker can pick its own pace).
inline constexpr const char* kHeartbeatSocketEnv = "TIDE_HEARTBEAT_SOCKET";
inline constexpr const char* kHeartbeatTimeoutEnv = "TIDE_HEARTBEAT_TIMEOUT";

// A worker's side. Thread safe. A beat never blocks: when the agent's queue
// is full the beat is dropped (the agent has fresh ones queued).
class HeartbeatClient {
 public:
  // Connects on the first beat. Throws InvalidArgument for a path over
  // 107 bytes.
  explicit HeartbeatClient(std::string path);
  // Sends a beat, with the step number when given (>= 0). Throws Error
  // when no agent listens at the path.
  void beat(std::optional<int64_t> step = std::nullopt);

 private:
  const std::string path_;
  std::mutex mutex_;
  Fd fd_;  // Guarded by mutex_.
};

// One beat through a process-wide client on $TIDE_HEARTBEAT_SOCKET, with
// the step number when given. Returns false, doing nothing, when the
// variable is unset (not run under an agent that takes heartbeats). Throws
// Error when the agent cannot be reached.
bool heartbeat(std::optional<int64_t> step = std::nullopt);

// One beat as the receiver sees it: its sender, and the step it carried.
struct Beat {
  pid_t pid = 0;
  std::optional<int64_t> step;
  bool operator==(const Beat&) const = default;
};

// The agent's side: the bound socket, polled by the agent's own loop.
class HeartbeatReceiver {
 public:
  // Binds at `path` (replacing a stale socket; the destructor removes it).
  // Throws InvalidArgument for a path over 107 bytes, Error when the socket
  // cannot be bound.
  explicit HeartbeatReceiver(std::string path);
  ~HeartbeatReceiver();
  HeartbeatReceiver(const HeartbeatReceiver&) = delete;
  HeartbeatReceiver& operator=(const HeartbeatReceiver&) = delete;

  const std::string& path() const {
    return path_;
  }
  // Readable when beats are queued.
  int fd() const {
    return fd_.get();
  }
  // Every beat queued now, in order, without blocking. A datagram that is
  // not a step number (".", or anything else) is a beat without one.
  std::vector<Beat> drain();

 private:
  std::string path_;
  Fd fd_;
};

}  // namespace tide::timer
