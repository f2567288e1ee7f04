#pragma once

#include <csignal>
#include <mutex>
#include <string>

#include "tide/common/fd.h"
#include "tide/timer/timer_server.h"

// Timers for workers on the agent's host over a Unix datagram socket the
// agent creates. The kernel tells the server each sender's pid
// (SCM_CREDENTIALS), so a worker can only arm timers for itself.
namespace tide::timer {

class LocalTimerServer final : public TimerServer {
 public:
  // Binds a datagram socket at `path` (a filesystem path; a stale socket
  // there is replaced, and the destructor removes it). Throws
  // InvalidArgument for a path over 107 bytes, Error when the socket cannot
  // be made or bound. Call start()
  // to serve; thread safety as TimerServer's.
  LocalTimerServer(std::string path, TimerServerOptions options = {});
  // Stops the watchdog (joins it) and removes the socket.
  ~LocalTimerServer() override;

  const std::string& path() const {
    return path_;
  }

 protected:
  int channel_fd() const override {
    return fd_.get();
  }
  void read_requests(std::vector<TimerRequest>& out) override;

 private:
  std::string path_;
  Fd fd_;
};

// Thread safe: one request at a time goes out on one connected socket.
// acquire() and release() block while the server's queue is full (a request
// is never dropped); they throw Error when no server listens at `path`
// (after one reconnect, for a server that was replaced) and
// InvalidArgument for a scope over 4 KiB.
class LocalTimerClient final : public TimerChannelClient {
 public:
  // Connects on first use.
  explicit LocalTimerClient(std::string path, int signal = SIGKILL);

 private:
  void send(
      const std::string& scope_id, double expiration_time, int signal) override;

  const std::string path_;
  std::mutex mutex_;
  Fd fd_;  // Guarded by mutex_.
};

}  // namespace tide::timer
