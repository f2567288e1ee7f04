#include "agent/worker_timers.h"

#include <unistd.h>

#include <cstdio>

#include "tide/common/logging.h"
#include "tide/metrics/metrics.h"
#include "tide/timer/file_timer.h"
#include "tide/timer/local_timer.h"

#include "agent/group_processes.h"
#include "agent/reporting.h"

namespace tide::agent::detail {

WorkerTimers::WorkerTimers(
    const AgentView& view,
    const GroupProcesses& processes,
    const Reporter& reporter)
    : view_(view), processes_(processes), reporter_(reporter) {}

WorkerTimers::~WorkerTimers() {
  std::unique_ptr<timer::TimerServer> server;
  {
    std::lock_guard lock(server_mutex_);
    server.swap(server_);
  }
  server.reset();  // joins its thread, outside server_mutex_
}

double WorkerTimers::last_progress() const {
  std::lock_guard lock(server_mutex_);
  return server_ ? server_->last_progress_time() : 0;
}

void WorkerTimers::start() {
  const WorkerSpec& spec = view_.spec;
  if (spec.timer == WorkerSpec::Timer::kNone || server_) {
    return;
  }
  timer::TimerServerOptions opts{
      .max_interval = spec.timer_max_interval,
      .run_id = spec.rdzv_handler->get_run_id(),
      .allow_pid = [this](pid_t pid) { return is_worker_or_descendant(pid); },
      .on_reap =
          [this](const timer::ExpiredTimer& e) {
            {
              std::lock_guard lock(mutex_);
              reaped_[e.worker_id] = e;
            }
            metrics::put_metric(reporter_.metric("timer_expired"), 1);
            reporter_.count(
                "tide_agent_timer_expirations_total",
                "Workers' expiration timers that fired (the worker was "
                "killed).");
            reporter_.agent_event(
                "timer_expired",
                {{"worker_id", std::to_string(e.worker_id)},
                 {"scope_id", e.scope_id},
                 {"expiration_time", e.expiration_time},
                 {"overrun_ms", static_cast<int64_t>(e.overrun_seconds * 1000)},
                 {"signal", int64_t{e.signal}}});
          },
  };
  std::string path = spec.timer_file;
  std::unique_ptr<timer::TimerServer> server;
  if (spec.timer == WorkerSpec::Timer::kFile) {
    path = path.empty() ? view_.run_log_dir + "/watchdog_timer" : path;
    server = std::make_unique<timer::FileTimerServer>(path, std::move(opts));
    env_name_ = "TORCHELASTIC_TIMER_FILE";
  } else {
    path = path.empty() ? view_.run_log_dir + "/timer.sock" : path;
    server = std::make_unique<timer::LocalTimerServer>(path, std::move(opts));
    env_name_ = "TIDE_TIMER_SOCKET";
  }
  server->start();
  {
    std::lock_guard lock(server_mutex_);
    server_ = std::move(server);
  }
  env_path_ = path;
  TIDE_LOG_INFO("[{}] expiration timer server on {}", spec.role, path);
}

void WorkerTimers::add_env(std::map<std::string, std::string>& env) const {
  if (!env_name_.empty()) {
    env[env_name_] = env_path_;
  }
}

void WorkerTimers::explain(ProcessFailure& f) const {
  std::optional<timer::ExpiredTimer> expired;
  {
    std::lock_guard lock(mutex_);
    if (auto it = reaped_.find(f.pid); it != reaped_.end()) {
      expired = it->second;
    }
  }
  if (!expired || f.exitcode != -expired->signal) {
    return;
  }
  char overrun[32];
  std::snprintf(overrun, sizeof overrun, "%.3f", expired->overrun_seconds);
  f.message = "expiration timer \"" + expired->scope_id +
              "\" expired: the worker was " + overrun +
              " s past its deadline and got " + f.signal_name() +
              " from the timer server";
}

void WorkerTimers::acted(const Transition& t) {
  if (t.event != GroupEvent::kStarted || env_name_.empty()) {
    return;
  }
  std::set<pid_t> old_pids;
  {
    std::lock_guard lock(mutex_);
    old_pids.swap(worker_pids_);
    for (size_t i = 0; i < processes_.size(); ++i) {
      worker_pids_.insert(processes_[i].pid());
    }
  }
  // Timers of the last group's workers die with them. (Outside mutex_: the
  // server calls allow_pid, which takes it, under its own lock.)
  server_->clear_timers(old_pids);
}

void WorkerTimers::exited(const std::set<pid_t>& pids) {
  if (env_name_.empty()) {
    return;
  }
  {
    std::lock_guard lock(mutex_);
    for (pid_t pid : pids) {
      worker_pids_.erase(pid);
    }
  }
  server_->clear_timers(pids);
}

bool WorkerTimers::is_worker_or_descendant(pid_t pid) const {
  std::lock_guard lock(mutex_);
  if (worker_pids_.count(pid) > 0) {
    return true;
  }
  pid_t session = ::getsid(pid);
  return session > 0 && worker_pids_.count(session) > 0;
}

}  // namespace tide::agent::detail
