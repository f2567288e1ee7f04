#include "agent/hang_detector.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include <fmt/format.h>

#include "tide/agent/error_file.h"
#include "tide/common/logging.h"
#include "tide/metrics/metrics.h"
#include "tide/timer/heartbeat.h"

#include "agent/command.h"
#include "agent/group_processes.h"
#include "agent/reporting.h"

namespace tide::agent::detail {

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
    auto out = run_command(argv, kStackTimeout);
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

HangDetector::HangDetector(
    const AgentView& view,
    GroupProcesses& processes,
    const Reporter& reporter,
    BeatSink on_beat)
    : view_(view),
      processes_(processes),
      reporter_(reporter),
      on_beat_(std::move(on_beat)) {}

void HangDetector::start() {
  const WorkerSpec& spec = view_.spec;
  // Open for hang detection, and for the step numbers of the job's status.
  if ((spec.heartbeat_timeout.count() <= 0 &&
       spec.status_interval.count() <= 0) ||
      receiver_) {
    return;
  }
  std::string path = view_.run_log_dir + "/heartbeat.sock";
  if (spec.heartbeat_timeout.count() <= 0) {
    // For step numbers alone: a socket that cannot be bound (a log
    // directory too deep for a socket's path) costs the job only those.
    try {
      receiver_ = std::make_unique<timer::HeartbeatReceiver>(path);
    } catch (const Error& e) {
      TIDE_LOG_WARN(
          "[{}] no heartbeat socket, so no step times in the job's status: "
          "{}",
          spec.role,
          e.what());
    }
    return;
  }
  receiver_ = std::make_unique<timer::HeartbeatReceiver>(path);
  TIDE_LOG_INFO(
      "[{}] hang detection: a worker that sent a heartbeat and then none for "
      "{} ms is treated as hung (heartbeats on {})",
      spec.role,
      spec.heartbeat_timeout.count(),
      receiver_->path());
}

void HangDetector::add_env(std::map<std::string, std::string>& env) const {
  if (!receiver_) {
    return;
  }
  env[timer::kHeartbeatSocketEnv] = receiver_->path();
  if (view_.spec.heartbeat_timeout.count() > 0) {
    env[timer::kHeartbeatTimeoutEnv] = fmt::format(
        "{:g}",
        static_cast<double>(view_.spec.heartbeat_timeout.count()) / 1000);
  }
}

void HangDetector::entered(const Transition& t) {
  if (t.event != GroupEvent::kStarted) {
    return;
  }
  last_beat_.assign(
      static_cast<size_t>(view_.spec.local_world_size), std::nullopt);
  if (receiver_) {
    receiver_->drain();  // the last group's
  }
}

int HangDetector::fd() const {
  return receiver_ ? receiver_->fd() : -1;
}

void HangDetector::readable() {
  auto now = Clock::now();
  for (const timer::Beat& beat : receiver_->drain()) {
    int i = processes_.local_rank_of(beat.pid);
    if (i < 0 || static_cast<size_t>(i) >= last_beat_.size()) {
      continue;  // a process gone by now, or not a worker's
    }
    on_beat_(static_cast<size_t>(i), beat.step, now);
    auto& last = last_beat_[static_cast<size_t>(i)];
    if (!last && view_.spec.heartbeat_timeout.count() > 0) {
      TIDE_LOG_INFO(
          "[{}] local rank {} sent its first heartbeat: it is watched for "
          "hangs from now on",
          view_.spec.role,
          i);
    }
    last = now;
  }
}

Clock::time_point HangDetector::deadline() const {
  auto next = Clock::time_point::max();
  if (view_.spec.heartbeat_timeout.count() <= 0) {
    return next;  // heartbeats for the status only: no hang detection
  }
  for (size_t i = 0; i < last_beat_.size() && i < processes_.size(); ++i) {
    if (last_beat_[i] && !processes_[i].exited()) {
      next = std::min(next, *last_beat_[i] + view_.spec.heartbeat_timeout);
    }
  }
  return next;
}

void HangDetector::due() {
  const WorkerSpec& spec = view_.spec;
  auto now = Clock::now();
  for (size_t i = 0; i < last_beat_.size() && i < processes_.size(); ++i) {
    const WorkerProcess& p = processes_[i];
    if (!last_beat_[i] || p.exited() || p.abandoned() ||
        now < *last_beat_[i] + spec.heartbeat_timeout) {
      continue;
    }
    double age = std::chrono::duration<double>(now - *last_beat_[i]).count();
    last_beat_[i].reset();
    const Worker& w = view_.group.workers[i];
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
    write_error_file(processes_.error_file(i), message, stack);
    metrics::put_metric(reporter_.metric("hung"), 1);
    reporter_.count("tide_agent_worker_hangs_total", "Workers found hung.");
    reporter_.agent_event(
        "worker_hung",
        {{"rank", int64_t{w.global_rank}},
         {"local_rank", int64_t{w.local_rank}},
         {"pid", int64_t{p.pid()}},
         {"heartbeat_age_ms", static_cast<int64_t>(age * 1000)},
         {"stack", stack}});
    // Seen as failed by the agent's next look.
    processes_.kill(i);
  }
}

}  // namespace tide::agent::detail
