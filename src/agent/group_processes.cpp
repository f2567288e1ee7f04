// The processes of one worker group: start, watch, reap, stop, and what
// they left. How one worker is launched is in worker_launch.cpp.
#include "agent/group_processes.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "tide/agent/error_file.h"
#include "tide/common/logging.h"
#include "tide/metrics/metrics.h"

#include "common/random.h"

extern char** environ;

namespace tide::agent::detail {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

// The parts of the agent's environment a worker inherits, as a map.
std::map<std::string, std::string> inherited_env() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos) {
      env.emplace(
          std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
    }
  }
  return env;
}

}  // namespace

GroupProcesses::GroupProcesses(const AgentView& view, Options options)
    : view_(view), options_(std::move(options)) {}

GroupProcesses::~GroupProcesses() {
  processes_.clear();  // before the janitor and the pool they may use
  prestart_.reset();
}

void GroupProcesses::open() {
  const WorkerSpec& spec = view_.spec;
  base_env_ = inherited_env();
  if (!base_env_.count("OMP_NUM_THREADS") && spec.local_world_size > 1) {
    base_env_["OMP_NUM_THREADS"] = "1";
    if (!warned_omp_) {
      warned_omp_ = true;
      TIDE_LOG_WARN(
          "Setting OMP_NUM_THREADS to 1 for each worker so {} workers do not "
          "overload this machine; set it yourself to tune performance",
          spec.local_world_size);
    }
  }
  if (options_.adopt_orphans) {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }
  janitor_ = std::make_unique<Janitor>();
}

void GroupProcesses::close() {
  prestart_.reset();
}

std::string GroupProcesses::attempt_dir() const {
  // torch's layout, attempt_<restart count>; a membership change keeps the
  // count, and gets attempt_<n>.<k> rather than wiping the last logs.
  std::string dir =
      view_.run_log_dir + "/attempt_" + std::to_string(view_.restarts.used);
  std::string candidate = dir;
  for (int k = 1; fs::exists(candidate); ++k) {
    candidate = dir + "." + std::to_string(k);
  }
  return candidate;
}

std::string GroupProcesses::attempt_log_dir() const {
  std::lock_guard lock(dir_mutex_);
  return attempt_log_dir_;
}

void GroupProcesses::choose_rpc_secret() {
  const WorkerSpec& spec = view_.spec;
  const auto& rdzv = view_.rdzv;
  if (!spec.job_secret.empty()) {
    rpc_secret_ = spec.job_secret;
    return;
  }
  std::string mine = random_id(43);  // about 222 bits
  if (rdzv.world_size <= 1) {
    rpc_secret_ = mine;  // never leaves this node
    return;
  }
  // The first agent's wins; the others read it back.
  rpc_secret_ = rdzv.store->compare_set(
      "torchelastic/round" + std::to_string(rdzv.round) + "/rpc_secret",
      "",
      mine);
  if (!warned_shared_secret_) {
    warned_shared_secret_ = true;
    TIDE_LOG_WARN(
        "[{}] no job secret was given: the workers' rpc secret is agreed "
        "through the rendezvous store, so whoever can read that store can "
        "learn it; give every node the same TIDE_JOB_SECRET (or "
        "--rdzv-conf secret_file=PATH) to keep it off the network",
        spec.role);
  }
}

void GroupProcesses::prepare() {
  const WorkerSpec& spec = view_.spec;
  std::string dir = attempt_dir();
  {
    std::lock_guard lock(dir_mutex_);
    attempt_log_dir_ = dir;
  }
  auto ranks = static_cast<size_t>(spec.local_world_size);
  result_files_.assign(ranks, "");
  error_files_.assign(ranks, "");
  for (size_t i = 0; i < ranks; ++i) {
    std::string rank_dir = dir + "/" + std::to_string(i);
    fs::create_directories(rank_dir);
    result_files_[i] = rank_dir + "/return_value";
    error_files_[i] = rank_dir + "/error.json";
  }
  auto sink = [&](const std::vector<std::string>& filters, const char* file) {
    std::shared_ptr<DuplicateSink> s;
    if (!filters.empty()) {
      s = std::make_shared<DuplicateSink>(
          DuplicateSink{.fd = open_log(dir + "/" + file), .filters = filters});
    }
    return s;
  };
  duplicate_out_ = sink(spec.duplicate_stdout_filters, "filtered_stdout.log");
  duplicate_err_ = sink(spec.duplicate_stderr_filters, "filtered_stderr.log");
  exe_ = resolve_exe();
  numa_ = plan_numa(spec);
  processes_.clear();
}

void GroupProcesses::start(WorkerGroup& group) {
  const WorkerSpec& spec = view_.spec;
  auto prof = metrics::profile("LocalElasticAgent._start_workers");
  std::string dir = attempt_log_dir();
  for (Worker& w : group.workers) {
    if (!numa_.empty()) {
      TIDE_LOG_INFO(
          "[{}] local rank {}: --numa-binding={}: {}",
          spec.role,
          w.local_rank,
          to_string(spec.numa_binding),
          describe(numa_[static_cast<size_t>(w.local_rank)]));
    }
    processes_.push_back(start_process(launch_spec(w, exe_, numa_, dir)));
    w.pid = processes_.back()->pid();
  }
  // The pool's new interpreters start now, but import only once the
  // workers are past their own start, which they would slow down.
  fill_prestart(exe_, numa_, /*gated=*/true);
  if (prestart_) {
    release_at_ = Clock::now() + kPrestartRelease;
  }
}

void GroupProcesses::due() {
  release_at_ = Clock::time_point::max();
  if (prestart_) {
    TIDE_LOG_DEBUG("[{}] prestarted interpreters: importing", view_.spec.role);
    prestart_->release();
  }
}

void GroupProcesses::add_fds(std::vector<pollfd>& fds) const {
  for (const auto& p : processes_) {
    if (!p->exited() && !p->abandoned()) {
      fds.push_back({.fd = p->pidfd(), .events = POLLIN, .revents = 0});
    }
    for (auto& pump : p->pumps()) {
      if (pump.fd() >= 0) {
        fds.push_back({.fd = pump.fd(), .events = POLLIN, .revents = 0});
      }
    }
  }
}

void GroupProcesses::on_wake() {
  for (auto& p : processes_) {
    for (auto& pump : p->pumps()) {
      pump.pump();
    }
  }
  reap();
}

void GroupProcesses::reap() {
  if (options_.adopt_orphans) {
    // Orphans of workers are our children too; reap whatever has exited.
    int st = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &st, WNOHANG)) > 0) {
      bool ours = false;
      for (auto& p : processes_) {
        if (p->pid() == pid) {
          ::kill(-pid, SIGKILL);
          p->set_status(st);
          ours = true;
        }
      }
      if (!ours && prestart_) {
        ours = prestart_->reaped(pid, st);
      }
      if (!ours && janitor_) {
        janitor_->forget(pid);  // An earlier group's worker, left behind once.
      }
    }
  }
  std::set<pid_t> ended;
  for (auto& p : processes_) {
    if (p->poll_exit()) {
      ended.insert(p->pid());
    }
  }
  if (!ended.empty() && options_.exited) {
    options_.exited(ended);
  }
}

void GroupProcesses::wait(Clock::time_point deadline) {
  std::vector<pollfd> fds;
  add_fds(fds);
  // Rounded up: waking before a deadline would only spin until it.
  auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
  int r = ::poll(
      fds.data(),
      fds.size(),
      static_cast<int>(std::max<int64_t>(0, left.count())));
  if (r < 0 && errno != EINTR) {
    throw Error(std::string("poll failed: ") + std::strerror(errno));
  }
  on_wake();
}

int GroupProcesses::running() const {
  int n = 0;
  for (const auto& p : processes_) {
    n += (!p->exited() && !p->abandoned()) ? 1 : 0;
  }
  return n;
}

void GroupProcesses::stop(int sig, milliseconds grace) {
  const WorkerSpec& spec = view_.spec;
  auto prof = metrics::profile("LocalElasticAgent._stop_workers");
  auto wait_all = [&](Clock::time_point deadline) {
    while (running() > 0 && Clock::now() < deadline) {
      wait(deadline);
    }
  };
  if (running() > 0) {
    for (auto& p : processes_) {
      p->signal(sig);
    }
    wait_all(Clock::now() + grace);
  }
  if (running() > 0) {
    TIDE_LOG_WARN(
        "[{}] {} workers still running {} ms after {}; sending SIGKILL",
        spec.role,
        running(),
        grace.count(),
        sigabbrev_np(sig) ? sigabbrev_np(sig) : "the signal");
    for (auto& p : processes_) {
      p->signal(SIGKILL);
    }
    wait_all(Clock::now() + spec.kill_wait);
  }
  for (auto& p : processes_) {
    if (!p->exited() && !p->abandoned()) {
      TIDE_LOG_ERROR(
          "[{}] worker pid {} survived SIGKILL for {} ms (stuck in the "
          "kernel?); leaving it behind",
          spec.role,
          p->pid(),
          spec.kill_wait.count());
      p->abandon();
    }
  }
  for (auto& p : processes_) {
    for (auto& pump : p->pumps()) {
      pump.finish();
    }
  }
}

void GroupProcesses::kill(size_t local_rank) {
  WorkerProcess& p = *processes_[local_rank];
  p.signal(SIGKILL);
  auto deadline = Clock::now() + view_.spec.kill_wait;
  while (!p.exited() && Clock::now() < deadline) {
    wait(deadline);
  }
}

WorkerState GroupProcesses::state() const {
  bool all_done = true;
  for (const auto& p : processes_) {
    if (!p->exited()) {
      all_done = false;
      continue;
    }
    if (p->exitcode() != 0) {
      return WorkerState::kFailed;
    }
  }
  return all_done ? WorkerState::kSucceeded : WorkerState::kHealthy;
}

std::map<int, ProcessFailure> GroupProcesses::failures(
    const std::function<void(ProcessFailure&)>& explain) const {
  std::map<int, ProcessFailure> out;
  for (const auto& p : processes_) {
    if (!p->exited() || p->exitcode() == 0) {
      continue;
    }
    const Worker& w = view_.group.workers[static_cast<size_t>(p->local_rank())];
    ProcessFailure f;
    f.local_rank = w.local_rank;
    f.global_rank = w.global_rank;
    f.pid = p->pid();
    f.exitcode = p->exitcode();
    f.host = view_.host;
    f.timestamp = p->exit_time();
    f.error_file = error_files_[static_cast<size_t>(w.local_rank)];
    f.error_file_data = read_file(f.error_file);
    if (!f.error_file_data.empty()) {
      auto parsed = parse_error_file(f.error_file_data);
      f.message = parsed.message;
      f.traceback = parsed.traceback;
      if (parsed.timestamp > 0) {
        f.timestamp = parsed.timestamp;
      }
    } else if (f.exitcode < 0) {
      f.message = "Signal " + std::to_string(-f.exitcode) + " (" +
                  f.signal_name() + ") received by PID " +
                  std::to_string(f.pid);
    } else {
      f.message = "exited with code " + std::to_string(f.exitcode) +
                  "; to see the worker's error here, have it write "
                  "TORCHELASTIC_ERROR_FILE "
                  "(torch: @record)";
    }
    explain(f);
    out.emplace(w.global_rank, std::move(f));
  }
  return out;
}

std::map<int, std::string> GroupProcesses::return_values() const {
  std::map<int, std::string> out;
  if (!std::holds_alternative<FunctionCall>(view_.spec.entrypoint)) {
    return out;
  }
  for (const Worker& w : view_.group.workers) {
    out.emplace(
        w.global_rank,
        read_file(result_files_[static_cast<size_t>(w.local_rank)]));
  }
  return out;
}

int GroupProcesses::local_rank_of(pid_t pid) const {
  // The worker itself, or else a process in its session (its children):
  // getsid only for those.
  auto find = [&](pid_t candidate) {
    for (const auto& p : processes_) {
      if (p->pid() == candidate) {
        return p->local_rank();
      }
    }
    return -1;
  };
  int rank = find(pid);
  return rank >= 0 ? rank : find(::getsid(pid));
}

}  // namespace tide::agent::detail
