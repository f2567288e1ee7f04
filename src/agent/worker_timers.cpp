// Expiration timers for the workers: the server the agent runs, and which
// processes it may signal.
#include <unistd.h>

#include "tide/common/logging.h"
#include "tide/metrics/metrics.h"
#include "tide/timer/file_timer.h"
#include "tide/timer/local_timer.h"

#include "agent/agent_impl.h"

namespace tide::agent {

void LocalElasticAgent::Impl::start_timer_server() {
  const WorkerSpec& spec = self.spec_;
  if (spec.timer == WorkerSpec::Timer::kNone || timer_server) {
    return;
  }
  timer::TimerServerOptions opts{
      .max_interval = spec.timer_max_interval,
      .run_id = spec.rdzv_handler->get_run_id(),
      .allow_pid = [this](pid_t pid) { return is_worker_or_descendant(pid); },
      .on_reap =
          [this](const timer::ExpiredTimer& e) {
            {
              std::lock_guard lock(timer_mutex);
              reaped[e.worker_id] = e;
            }
            metrics::put_metric(metric("timer_expired"), 1);
            count_agent_event(
                "tide_agent_timer_expirations_total",
                "Workers' expiration timers that fired (the worker was "
                "killed).");
            agent_event(
                "timer_expired",
                {{"worker_id", std::to_string(e.worker_id)},
                 {"scope_id", e.scope_id},
                 {"expiration_time", e.expiration_time},
                 {"overrun_ms", static_cast<int64_t>(e.overrun_seconds * 1000)},
                 {"signal", int64_t{e.signal}}});
          },
  };
  std::string path = spec.timer_file;
  if (spec.timer == WorkerSpec::Timer::kFile) {
    if (path.empty()) {
      path = run_log_dir + "/watchdog_timer";
    }
    auto server =
        std::make_unique<timer::FileTimerServer>(path, std::move(opts));
    std::lock_guard lock(status_mutex);
    timer_server = std::move(server);
  } else {
    if (path.empty()) {
      path = run_log_dir + "/timer.sock";
    }
    auto server =
        std::make_unique<timer::LocalTimerServer>(path, std::move(opts));
    std::lock_guard lock(status_mutex);
    timer_server = std::move(server);
  }
  timer_server->start();
  TIDE_LOG_INFO("[{}] expiration timer server on {}", spec.role, path);
}

bool LocalElasticAgent::Impl::is_worker_or_descendant(pid_t pid) const {
  std::lock_guard lock(timer_mutex);
  if (worker_pids.count(pid) > 0) {
    return true;
  }
  pid_t session = ::getsid(pid);
  return session > 0 && worker_pids.count(session) > 0;
}

}  // namespace tide::agent
