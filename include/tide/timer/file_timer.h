#pragma once

#include <csignal>
#include <mutex>
#include <string>

#include "tide/common/fd.h"
#include "tide/timer/timer_server.h"

// Timers over a named pipe, in torch's FileTimerServer/FileTimerClient
// format, line for line: each request is one JSON line
//   {"version": 1, "pid": 123, "scope_id": "step", "expiration_time": 1.7e9,
//   "signal": 9}
// (a release has expiration_time -1 and signal 0). A Python worker using
// torch's FileTimerClient is served by tide's FileTimerServer, and tide's
// client works with torch's server.
namespace tide::timer {

class FileTimerServer final : public TimerServer {
 public:
  // Creates the FIFO at `path` (replacing a stale FIFO there; refusing any
  // other kind of file) and opens it. Call start() to serve. Throws Error
  // when the FIFO cannot be made.
  FileTimerServer(std::string path, TimerServerOptions options = {});
  // Stops the watchdog and removes the FIFO.
  ~FileTimerServer() override;

  const std::string& path() const {
    return path_;
  }
  // Lines skipped as malformed so far.
  size_t malformed_lines() const {
    return malformed_.load();
  }

 protected:
  int channel_fd() const override {
    return fd_.get();
  }
  void read_requests(std::vector<TimerRequest>& out) override;

 private:
  void parse_line(std::string_view line, std::vector<TimerRequest>& out);

  std::string path_;
  Fd fd_;
  // Watchdog thread only.
  std::string partial_;
  std::atomic<size_t> malformed_{0};
};

class FileTimerClient final : public TimerChannelClient {
 public:
  // `signal` reclaims the worker (torch's default: SIGKILL). A request
  // waits up to `timeout` for a server that is not up yet or whose pipe is
  // full, then throws Error.
  //
  // By default the FIFO is opened and closed for every request, as torch's
  // client does: torch's server blocks reading while any writer holds the
  // FIFO open, and only handles requests between writers. keep_open keeps
  // it open between requests, several times faster; only tide's server
  // (which tiderun runs) copes with that.
  explicit FileTimerClient(
      std::string path,
      int signal = SIGKILL,
      std::chrono::milliseconds timeout = std::chrono::seconds(10),
      bool keep_open = false);

 private:
  void send(
      const std::string& scope_id, double expiration_time, int signal) override;

  const std::string path_;
  const std::chrono::milliseconds timeout_;
  const bool keep_open_;
  std::mutex mutex_;
  Fd fd_;  // Guarded by mutex_.
};

}  // namespace tide::timer
