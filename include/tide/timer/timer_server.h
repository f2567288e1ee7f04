#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tide/common/fd.h"
#include "tide/timer/timer.h"

namespace tide::timer {

// A timer that expired and what the server did about it.
struct ExpiredTimer {
  pid_t worker_id = 0;
  std::string scope_id;
  double expiration_time = 0;
  int signal = 0;
  // How far past its expiration the worker was when it was signalled.
  double overrun_seconds = 0;
};

struct TimerServerOptions {
  // Longest the watchdog sleeps. It also wakes at the next deadline, so this
  // only bounds how stale "last progress" may get (torch polls at it).
  std::chrono::milliseconds max_interval{100};
  std::string run_id;
  // Which pids the server may signal: the agent's workers. Null allows any
  // pid but the server's own (a server run by hand). Requests for pids it
  // refuses are dropped and logged; the server's own pid is always refused.
  std::function<bool(pid_t)> allow_pid;
  // torch's log_event(name, request): "watchdog started", "watchdog stopped",
  // "set timer", "clear timer", "timer expired", "kill worker process".
  std::function<void(const std::string& event, const TimerRequest& request)>
      log_event;
  // Called on the watchdog thread just before a worker is signalled.
  std::function<void(const ExpiredTimer&)> on_reap;
};

// The server side: holds the timers, wakes at the next deadline (or a new
// request), signals workers whose timers expired and forgets their timers.
// A subclass supplies the channel requests arrive on. Thread safety: every
// public member is thread safe; the watchdog runs on its own thread.
class TimerServer {
 public:
  virtual ~TimerServer();
  TimerServer(const TimerServer&) = delete;
  TimerServer& operator=(const TimerServer&) = delete;

  // Starts the watchdog thread. Idempotent.
  void start();
  // Stops it and waits for it. Idempotent; the destructor calls it.
  void stop();

  // Applies requests as if they had arrived on the channel (a release for
  // a negative expiration_time). Returns how many were accepted.
  size_t register_timers(const std::vector<TimerRequest>& requests);
  // Forgets every timer of these workers.
  void clear_timers(const std::set<pid_t>& worker_ids);
  // Timers that expire at or before `deadline`, by worker, earliest first.
  std::map<pid_t, std::vector<TimerRequest>> get_expired_timers(
      double deadline) const;
  // Timers held now.
  size_t size() const;
  // When the server last handled a request (seconds since the epoch).
  double last_progress_time() const;

 protected:
  explicit TimerServer(TimerServerOptions options);
  // The channel's descriptor, polled for readability.
  virtual int channel_fd() const = 0;
  // Reads what the channel holds without blocking and appends the requests
  // (with worker ids as the channel knows them). Malformed input is skipped
  // and logged by the channel.
  virtual void read_requests(std::vector<TimerRequest>& out) = 0;

  const TimerServerOptions options_;

 private:
  void watchdog();
  // Signals the workers whose timers expired by `now`. Watchdog thread only.
  void reap(double now);
  bool allowed(pid_t pid) const;
  size_t apply_locked(const TimerRequest& r);
  void event(const char* name, const TimerRequest& r) const;

  mutable std::mutex mutex_;
  // Guarded by mutex_: timers by (worker, scope), and the same ordered by
  // expiration for the next deadline.
  std::map<std::pair<pid_t, std::string>, TimerRequest> timers_;
  std::set<std::tuple<double, pid_t, std::string>> deadlines_;

  const pid_t self_pid_ = ::getpid();
  std::atomic<double> last_progress_{0};
  Fd wake_fd_;
  std::atomic<bool> stopping_{false};
  std::once_flag start_once_;
  std::thread thread_;
};

// Logs, as torch's server does, which timers of which workers expired.
void log_debug_info_for_expired_timers(
    const std::string& run_id,
    const std::map<pid_t, std::vector<TimerRequest>>& expired);

}  // namespace tide::timer
