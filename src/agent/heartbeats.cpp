// Hang detection: the workers' heartbeats, and what the agent does with a
// worker whose heartbeats stopped (docs/tiderun.md#hang-detection).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "tide/agent/error_file.h"
#include "tide/common/logging.h"
#include "tide/metrics/metrics.h"
#include "tide/timer/heartbeat.h"

#include "agent/agent_impl.h"
#include "agent/command.h"

namespace tide::agent {

namespace {

// How long a stack dump may take before the agent kills the worker anyway.
constexpr milliseconds kStackTimeout{5'000};

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s);
  return buf;
}

// The process's scheduler state and where in the kernel it waits, from
// /proc ("S (sleeping) in do_epoll_wait").
std::string kernel_state(pid_t pid) {
  std::string proc = "/proc/" + std::to_string(pid);
  std::string state;
  std::ifstream status(proc + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("State:", 0) == 0) {
      state = line.substr(line.find_first_not_of(" \t", 6));
      break;
    }
  }
  std::string wchan = read_file(proc + "/wchan");
  if (!wchan.empty() && wchan != "0") {
    state += " in " + wchan;
  }
  return state;
}

// The stack of every thread of pid, by the first tool there is: eu-stack
// (elfutils, fast), else gdb.
std::string capture_stack(pid_t pid) {
  std::string p = std::to_string(pid);
  const std::vector<std::vector<std::string>> tools = {
      {"eu-stack", "-p", p},
      {"gdb",
       "-p",
       p,
       "-batch",
       "-nx",
       "-q",
       "-ex",
       "set debuginfod enabled off",
       "-ex",
       "thread apply all bt"},
  };
  std::string why;
  for (const auto& argv : tools) {
    auto out = detail::run_command(argv, kStackTimeout);
    if (out.exitcode == 0 && !out.output.empty()) {
      return argv[0] + " -p " + p + ":\n" + out.output;
    }
    why += (why.empty() ? "" : "; ") + argv[0] + ": " +
           (out.timed_out        ? "timed out"
            : out.output.empty() ? "no output"
                                 : out.output.substr(0, 200));
  }
  return "no stack captured (" + why +
         "); install elfutils (eu-stack) or gdb for one";
}

}  // namespace

void LocalElasticAgent::Impl::start_heartbeats() {
  const WorkerSpec& spec = self.spec_;
  // Open for hang detection, and for the step numbers of the job's status.
  if ((spec.heartbeat_timeout.count() <= 0 &&
       spec.status_interval.count() <= 0) ||
      heartbeats) {
    return;
  }
  if (spec.heartbeat_timeout.count() <= 0) {
    // For step numbers alone: a socket that cannot be bound (a log
    // directory too deep for a socket's path) costs the job only those.
    try {
      heartbeats = std::make_unique<timer::HeartbeatReceiver>(
          run_log_dir + "/heartbeat.sock");
    } catch (const Error& e) {
      TIDE_LOG_WARN(
          "[{}] no heartbeat socket, so no step times in the job's status: "
          "{}",
          spec.role,
          e.what());
    }
    return;
  }
  heartbeats = std::make_unique<timer::HeartbeatReceiver>(
      run_log_dir + "/heartbeat.sock");
  TIDE_LOG_INFO(
      "[{}] hang detection: a worker that sent a heartbeat and then none for "
      "{} ms is treated as hung (heartbeats on {})",
      spec.role,
      spec.heartbeat_timeout.count(),
      heartbeats->path());
}

void LocalElasticAgent::Impl::reset_heartbeats() {
  last_beat.assign(
      static_cast<size_t>(self.spec_.local_world_size), std::nullopt);
  if (heartbeats) {
    heartbeats->drain();  // the last group's
  }
}

void LocalElasticAgent::Impl::read_heartbeats() {
  if (!heartbeats) {
    return;
  }
  auto now = Clock::now();
  for (const timer::Beat& beat : heartbeats->drain()) {
    int i = local_rank_of(beat.pid);
    if (i < 0) {
      continue;  // a process gone by now, or not a worker's
    }
    if (beat.step) {
      note_step(static_cast<size_t>(i), *beat.step, now);
    }
    auto& last = last_beat[static_cast<size_t>(i)];
    if (!last && self.spec_.heartbeat_timeout.count() > 0) {
      TIDE_LOG_INFO(
          "[{}] local rank {} sent its first heartbeat: it is watched for "
          "hangs from now on",
          self.spec_.role,
          i);
    }
    last = now;
  }
}

int LocalElasticAgent::Impl::local_rank_of(pid_t pid) const {
  // The worker itself, or else a process in its session (its children):
  // getsid only for those.
  auto find = [&](pid_t candidate) {
    for (const auto& p : processes) {
      if (p->pid() == candidate) {
        return p->local_rank();
      }
    }
    return -1;
  };
  int rank = find(pid);
  return rank >= 0 ? rank : find(::getsid(pid));
}

Clock::time_point LocalElasticAgent::Impl::next_heartbeat_deadline() const {
  auto next = Clock::time_point::max();
  if (self.spec_.heartbeat_timeout.count() <= 0) {
    return next;  // heartbeats for the status only: no hang detection
  }
  for (size_t i = 0; i < last_beat.size(); ++i) {
    if (last_beat[i] && !processes[i]->exited()) {
      next = std::min(next, *last_beat[i] + self.spec_.heartbeat_timeout);
    }
  }
  return next;
}

void LocalElasticAgent::Impl::check_heartbeats() {
  const WorkerSpec& spec = self.spec_;
  if (spec.heartbeat_timeout.count() <= 0) {
    return;
  }
  auto now = Clock::now();
  for (size_t i = 0; i < last_beat.size(); ++i) {
    auto& p = *processes[i];
    if (!last_beat[i] || p.exited() || p.abandoned() ||
        now < *last_beat[i] + spec.heartbeat_timeout) {
      continue;
    }
    double age = std::chrono::duration<double>(now - *last_beat[i]).count();
    last_beat[i].reset();
    const Worker& w = group.workers[i];
    std::string message =
        "hung: rank " + std::to_string(w.global_rank) + " (local rank " +
        std::to_string(w.local_rank) + ", pid " + std::to_string(p.pid()) +
        ") sent no heartbeat for " + seconds_text(age) +
        " s (--heartbeat-timeout " +
        seconds_text(spec.heartbeat_timeout.count() / 1000.0) + " s); it was " +
        kernel_state(p.pid()) +
        "; killed with SIGKILL after its stack was captured";
    std::string stack = capture_stack(p.pid());
    TIDE_LOG_ERROR("[{}] {}\n{}", spec.role, message, stack);
    // The worker wrote no error file (it is hung): the agent writes it, so
    // the failure summary and tiderun's error.json carry the stack.
    write_error_file(error_files[i], message, stack);
    metrics::put_metric(metric("hung"), 1);
    count_agent_event("tide_agent_worker_hangs_total", "Workers found hung.");
    agent_event(
        "worker_hung",
        {{"rank", int64_t{w.global_rank}},
         {"local_rank", int64_t{w.local_rank}},
         {"pid", int64_t{p.pid()}},
         {"heartbeat_age_ms", static_cast<int64_t>(age * 1000)},
         {"stack", stack}});
    p.signal(SIGKILL);
    // Seen as failed by the caller at once.
    auto deadline = Clock::now() + spec.kill_wait;
    while (!p.exited() && Clock::now() < deadline) {
      wait_for_events(deadline);
    }
  }
}

}  // namespace tide::agent
