// The agent's run loop (torch's SimpleElasticAgent._invoke_run), event
// driven: one poll() over the workers' pidfds, their tee pipes and a wake-up
// eventfd. Worker exits are seen when they happen; monitor_interval only
// paces the question "are nodes waiting to join?".
#include "tide/agent/local_elastic_agent.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tide/agent/error_file.h"
#include "tide/common/fd.h"
#include "tide/common/host.h"
#include "tide/common/logging.h"
#include "tide/events/events.h"
#include "tide/metrics/metrics.h"
#include "tide/rendezvous/rendezvous_handler.h"

#include "agent/agent_impl.h"
#include "agent/janitor.h"
#include "agent/worker_process.h"
#include "common/clock.h"
#include "common/random.h"

extern char** environ;

namespace tide::agent {

using status::NodeState;

namespace fs = std::filesystem;

namespace {

std::string make_temp_dir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    throw Error(
        "cannot create a log directory " + templ + ": " + std::strerror(errno));
  }
  return templ;
}

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

LocalElasticAgent::LocalElasticAgent(WorkerSpec spec, AgentOptions options)
    : spec_(std::move(spec)) {
  validate(spec_);
  impl_ = std::make_unique<Impl>(*this, options);
  impl_->restarts.left = spec_.max_restarts;
}

LocalElasticAgent::~LocalElasticAgent() = default;

int LocalElasticAgent::remaining_restarts() const {
  return impl_->restarts.left;
}

const WorkerGroup& LocalElasticAgent::worker_group() const {
  return impl_->group;
}

const std::string& LocalElasticAgent::run_log_dir() const {
  return impl_->run_log_dir;
}

void LocalElasticAgent::request_stop(int sig) noexcept {
  int expected = 0;
  impl_->stop_signal.compare_exchange_strong(expected, sig);
  spec_.rdzv_handler->interrupt();
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(impl_->wake_fd.get(), &one, sizeof one);
}

RunResult LocalElasticAgent::run() {
  return impl_->run();
}

std::string LocalElasticAgent::Impl::attempt_dir() const {
  // torch's layout, attempt_<restart count>; a membership change keeps the
  // count, and gets attempt_<n>.<k> rather than wiping the last logs.
  std::string dir = run_log_dir + "/attempt_" + std::to_string(restarts.used);
  std::string candidate = dir;
  for (int k = 1; fs::exists(candidate); ++k) {
    candidate = dir + "." + std::to_string(k);
  }
  return candidate;
}

void LocalElasticAgent::Impl::rendezvous() {
  const WorkerSpec& spec = self.spec_;
  auto prof = metrics::profile("SimpleElasticAgent._rendezvous");
  check_health();
  TIDE_LOG_DEBUG(
      "[{}] rendezvous through {} (run {})",
      spec.role,
      spec.rdzv_handler->get_backend(),
      spec.rdzv_handler->get_run_id());
  auto start = Clock::now();
  try {
    rdzv = spec.rdzv_handler->next_rendezvous();
  } catch (const RendezvousError&) {
    check_stop();  // interrupted by a stop request: report the signal
    count_round(start, /*completed=*/false);
    throw;
  }
  count_round(start, /*completed=*/true);
  agent_event(
      "rendezvous",
      {{"group_rank", int64_t{rdzv.rank}},
       {"group_world_size", int64_t{rdzv.world_size}},
       {"duration_ms",
        static_cast<int64_t>(
            std::chrono::duration_cast<milliseconds>(Clock::now() - start)
                .count())},
       {"master_endpoint",
        rdzv.bootstrap.master_addr + ":" +
            std::to_string(rdzv.bootstrap.master_port)}});
  group.store = rdzv.store;
  group.group_rank = rdzv.rank;
  group.group_world_size = rdzv.world_size;
  TIDE_LOG_INFO(
      "[{}] rendezvous complete in {} ms: this node is {} of {} (run {})",
      spec.role,
      std::chrono::duration_cast<milliseconds>(Clock::now() - start).count(),
      rdzv.rank,
      rdzv.world_size,
      spec.rdzv_handler->get_run_id());
}

void LocalElasticAgent::Impl::choose_rpc_secret() {
  const WorkerSpec& spec = self.spec_;
  if (!spec.job_secret.empty()) {
    rpc_secret = spec.job_secret;
    return;
  }
  std::string mine = random_id(43);  // about 222 bits
  if (rdzv.world_size <= 1) {
    rpc_secret = mine;  // never leaves this node
    return;
  }
  // The first agent's wins; the others read it back.
  rpc_secret = rdzv.store->compare_set(
      "torchelastic/round" + std::to_string(rdzv.round) + "/rpc_secret",
      "",
      mine);
  if (!warned_shared_secret) {
    warned_shared_secret = true;
    TIDE_LOG_WARN(
        "[{}] no job secret was given: the workers' rpc secret is agreed "
        "through the rendezvous store, so whoever can read that store can "
        "learn it; give every node the same TIDE_JOB_SECRET (or "
        "--rdzv-conf secret_file=PATH) to keep it off the network",
        spec.role);
  }
}

void LocalElasticAgent::Impl::assign_ranks() {
  auto prof = metrics::profile("SimpleElasticAgent._assign_worker_ranks");
  // torch's scheme: each node publishes (role, local_world_size); node 0
  // computes every node's first global rank and publishes them. Keys are
  // per round: a new membership never reads an old round's answer, and a
  // backend whose membership never changes (static) may keep round 0.
  const WorkerSpec& spec = self.spec_;
  store::Store& st = *rdzv.store;
  std::string base = "torchelastic/round" + std::to_string(rdzv.round) + "/";
  int n = rdzv.world_size;
  int first_rank = 0;
  int world = spec.local_world_size;
  // torch's TORCH_ELASTIC_WORKER_IDENTICAL=1: every node runs as many
  // workers of the one role, so the ranks follow from the node's rank
  // alone, without the store's round trips.
  const char* identical = std::getenv("TORCH_ELASTIC_WORKER_IDENTICAL");
  if (n > 1 && identical != nullptr && std::string_view(identical) == "1") {
    first_rank = rdzv.rank * spec.local_world_size;
    world = n * spec.local_world_size;
  } else if (n > 1) {
    st.set(
        base + "role_info/" + std::to_string(rdzv.rank),
        std::to_string(spec.local_world_size));
    if (rdzv.rank == 0) {
      std::vector<std::string> keys;
      for (int i = 0; i < n; ++i) {
        keys.push_back(base + "role_info/" + std::to_string(i));
      }
      auto sizes = st.multi_get(keys);
      std::vector<std::string> out_keys;
      std::vector<std::string> out_values;
      int64_t total = 0;
      for (const auto& s : sizes) {
        total += std::stoll(s);
      }
      int64_t prefix = 0;
      for (int i = 0; i < n; ++i) {
        out_keys.push_back(base + "assigned_ranks/" + std::to_string(i));
        out_values.push_back(
            std::to_string(prefix) + "," + std::to_string(total));
        prefix += std::stoll(sizes[static_cast<size_t>(i)]);
      }
      st.multi_set(out_keys, out_values);
    }
    std::string mine =
        st.get(base + "assigned_ranks/" + std::to_string(rdzv.rank));
    auto comma = mine.find(',');
    first_rank = std::stoi(mine.substr(0, comma));
    world = std::stoi(mine.substr(comma + 1));
  }
  group.workers.clear();
  for (int i = 0; i < spec.local_world_size; ++i) {
    group.workers.push_back(Worker{
        .local_rank = i,
        .global_rank = first_rank + i,
        .role_rank = first_rank + i,
        .world_size = world,
        .role_world_size = world,
    });
  }
}

void LocalElasticAgent::Impl::start_workers() {
  const WorkerSpec& spec = self.spec_;
  auto prof = metrics::profile("LocalElasticAgent._start_workers");
  std::string dir = attempt_dir();
  {
    std::lock_guard lock(status_mutex);
    attempt_log_dir = dir;
  }
  result_files.assign(static_cast<size_t>(spec.local_world_size), "");
  error_files.assign(static_cast<size_t>(spec.local_world_size), "");
  for (int i = 0; i < spec.local_world_size; ++i) {
    std::string rank_dir = dir + "/" + std::to_string(i);
    fs::create_directories(rank_dir);
    result_files[static_cast<size_t>(i)] = rank_dir + "/return_value";
    error_files[static_cast<size_t>(i)] = rank_dir + "/error.json";
  }

  auto sink = [&](const std::vector<std::string>& filters, const char* file) {
    std::shared_ptr<detail::DuplicateSink> s;
    if (!filters.empty()) {
      s = std::make_shared<detail::DuplicateSink>(detail::DuplicateSink{
          .fd = detail::open_log(dir + "/" + file), .filters = filters});
    }
    return s;
  };
  duplicate_out = sink(spec.duplicate_stdout_filters, "filtered_stdout.log");
  duplicate_err = sink(spec.duplicate_stderr_filters, "filtered_stderr.log");

  std::string exe = resolve_exe();
  std::vector<RankBinding> numa = plan_numa();

  processes.clear();
  // Recorded before the first worker runs: anything a worker makes visible
  // (a line of output, a store key) happens after the agent's state says
  // this group is running.
  metrics::put_metric(metric("remaining_restarts"), restarts.left);
  begin_attempt();
  enter(NodeState::kHealthy);
  for (const Worker& w : group.workers) {
    if (!numa.empty()) {
      TIDE_LOG_INFO(
          "[{}] local rank {}: --numa-binding={}: {}",
          spec.role,
          w.local_rank,
          to_string(spec.numa_binding),
          describe(numa[static_cast<size_t>(w.local_rank)]));
    }
    processes.push_back(start_process(launch_spec(w, exe, numa, dir)));
    group.workers[static_cast<size_t>(w.local_rank)].pid =
        processes.back()->pid();
  }
  post_status(/*urgent=*/true);  // with the workers' pids
  fill_prestart(exe, numa);
  std::set<pid_t> old_pids;
  {
    std::lock_guard lock(timer_mutex);
    old_pids.swap(worker_pids);
    for (const auto& p : processes) {
      worker_pids.insert(p->pid());
    }
  }
  // Timers of the last group's workers die with them. (Outside timer_mutex:
  // the server calls allow_pid, which takes it, under its own lock.)
  if (timer_server) {
    timer_server->clear_timers(old_pids);
  }
  {
    std::lock_guard lock(status_mutex);
    status.workers = group.workers;  // now with their pids
  }
  for (const Worker& w : group.workers) {
    worker_event(w, "HEALTHY");
  }
  TIDE_LOG_INFO(
      "[{}] started {} workers (attempt {}, ranks {}-{} of {}, {} restarts "
      "left)",
      spec.role,
      spec.local_world_size,
      restarts.used,
      group.workers.front().global_rank,
      group.workers.back().global_rank,
      group.workers.front().world_size,
      restarts.left);
}

void LocalElasticAgent::Impl::check_stop() {
  const WorkerSpec& spec = self.spec_;
  if (int sig = stop_signal.load(); sig != 0) {
    const char* name = sigabbrev_np(sig);
    TIDE_LOG_WARN(
        "[{}] received SIG{}; stopping workers", spec.role, name ? name : "?");
    end_attempt(
        "TERMINATED", std::string("stopped by SIG") + (name ? name : "?"));
    enter(NodeState::kStopped);
    stop_workers(sig, spec.shutdown_grace);
    for (const Worker& w : group.workers) {
      worker_event(w, "TERMINATED");
    }
    throw SignalException(
        sig, std::string("agent stopped by SIG") + (name ? name : "?"));
  }
}

void LocalElasticAgent::Impl::initialize_workers() {
  auto prof = metrics::profile("SimpleElasticAgent._initialize_workers");
  rendezvous();
  assign_ranks();
  choose_rpc_secret();
  reset_heartbeats();
  start_workers();
}

void LocalElasticAgent::Impl::pump_output() {
  for (auto& p : processes) {
    for (auto& pump : p->pumps()) {
      pump.pump();
    }
  }
}

void LocalElasticAgent::Impl::reap() {
  if (options.adopt_orphans) {
    // Orphans of workers are our children too; reap whatever has exited.
    int st = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &st, WNOHANG)) > 0) {
      bool ours = false;
      for (auto& p : processes) {
        if (p->pid() == pid) {
          ::kill(-pid, SIGKILL);
          p->set_status(st);
          ours = true;
        }
      }
      if (!ours && prestart) {
        ours = prestart->reaped(pid, st);
      }
      if (!ours && janitor) {
        janitor->forget(pid);  // An earlier group's worker, left behind once.
      }
    }
  }
  std::set<pid_t> ended;
  for (auto& p : processes) {
    if (p->poll_exit()) {
      ended.insert(p->pid());
    }
  }
  // A reaped worker's pid may be reused: the timer server must not signal
  // it any more.
  if (!ended.empty() && timer_server) {
    {
      std::lock_guard lock(timer_mutex);
      for (pid_t pid : ended) {
        worker_pids.erase(pid);
      }
    }
    timer_server->clear_timers(ended);
  }
}

bool LocalElasticAgent::Impl::wait_for_events(Clock::time_point deadline) {
  std::vector<pollfd> fds;
  fds.push_back({.fd = wake_fd.get(), .events = POLLIN, .revents = 0});
  if (heartbeats) {
    fds.push_back({.fd = heartbeats->fd(), .events = POLLIN, .revents = 0});
  }
  for (auto& p : processes) {
    if (!p->exited() && !p->abandoned()) {
      fds.push_back({.fd = p->pidfd(), .events = POLLIN, .revents = 0});
    }
    for (auto& pump : p->pumps()) {
      if (pump.fd() >= 0) {
        fds.push_back({.fd = pump.fd(), .events = POLLIN, .revents = 0});
      }
    }
  }
  // Rounded up: waking before a deadline would only spin until it.
  auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
  int timeout = static_cast<int>(std::max<int64_t>(0, left.count()));
  int r = ::poll(fds.data(), fds.size(), timeout);
  if (r < 0 && errno != EINTR) {
    throw Error(std::string("poll failed: ") + std::strerror(errno));
  }
  if (r > 0 && (fds[0].revents & POLLIN)) {
    uint64_t drained;
    [[maybe_unused]] ssize_t n =
        ::read(wake_fd.get(), &drained, sizeof drained);
  }
  read_heartbeats();
  pump_output();
  reap();
  return r > 0;
}

WorkerState LocalElasticAgent::Impl::group_state() const {
  bool all_done = true;
  for (const auto& p : processes) {
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

std::map<int, ProcessFailure> LocalElasticAgent::Impl::failures() const {
  std::map<int, ProcessFailure> out;
  for (const auto& p : processes) {
    if (!p->exited() || p->exitcode() == 0) {
      continue;
    }
    const Worker& w = group.workers[static_cast<size_t>(p->local_rank())];
    ProcessFailure f;
    f.local_rank = w.local_rank;
    f.global_rank = w.global_rank;
    f.pid = p->pid();
    f.exitcode = p->exitcode();
    f.host = host;
    f.timestamp = p->exit_time();
    f.error_file = error_files[static_cast<size_t>(w.local_rank)];
    f.error_file_data = read_file(f.error_file);
    std::optional<timer::ExpiredTimer> expired;
    {
      std::lock_guard lock(timer_mutex);
      if (auto it = reaped.find(f.pid); it != reaped.end()) {
        expired = it->second;
      }
    }
    if (expired && f.exitcode == -expired->signal) {
      char overrun[32];
      std::snprintf(overrun, sizeof overrun, "%.3f", expired->overrun_seconds);
      f.message = "expiration timer \"" + expired->scope_id +
                  "\" expired: the worker was " + overrun +
                  " s past its deadline and got " + f.signal_name() +
                  " from the timer server";
    } else if (!f.error_file_data.empty()) {
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
    out.emplace(w.global_rank, std::move(f));
  }
  return out;
}

std::map<int, std::string> LocalElasticAgent::Impl::return_values() const {
  std::map<int, std::string> out;
  if (!std::holds_alternative<FunctionCall>(self.spec_.entrypoint)) {
    return out;
  }
  for (const Worker& w : group.workers) {
    out.emplace(
        w.global_rank,
        read_file(result_files[static_cast<size_t>(w.local_rank)]));
  }
  return out;
}

void LocalElasticAgent::Impl::stop_workers(int sig, milliseconds grace) {
  auto prof = metrics::profile("LocalElasticAgent._stop_workers");
  auto running = [&] {
    int n = 0;
    for (auto& p : processes) {
      n += (!p->exited() && !p->abandoned()) ? 1 : 0;
    }
    return n;
  };
  auto wait_all = [&](Clock::time_point deadline) {
    while (running() > 0 && Clock::now() < deadline) {
      wait_for_events(deadline);
    }
  };
  if (running() > 0) {
    for (auto& p : processes) {
      p->signal(sig);
    }
    wait_all(Clock::now() + grace);
  }
  if (running() > 0) {
    TIDE_LOG_WARN(
        "[{}] {} workers still running {} ms after {}; sending SIGKILL",
        self.spec_.role,
        running(),
        grace.count(),
        sigabbrev_np(sig) ? sigabbrev_np(sig) : "the signal");
    for (auto& p : processes) {
      p->signal(SIGKILL);
    }
    wait_all(Clock::now() + self.spec_.kill_wait);
  }
  for (auto& p : processes) {
    if (!p->exited() && !p->abandoned()) {
      TIDE_LOG_ERROR(
          "[{}] worker pid {} survived SIGKILL for {} ms (stuck in the "
          "kernel?); "
          "leaving it behind",
          self.spec_.role,
          p->pid(),
          self.spec_.kill_wait.count());
      p->abandon();
    }
  }
  for (auto& p : processes) {
    for (auto& pump : p->pumps()) {
      pump.finish();
    }
  }
  post_status(/*urgent=*/true);  // the ranks, STOPPING no more
}

RunResult LocalElasticAgent::Impl::run() {
  const WorkerSpec& spec = self.spec_;
  if (run_log_dir.empty()) {
    std::string base =
        spec.log_dir.empty() ? make_temp_dir("tide_") : spec.log_dir;
    fs::create_directories(base);
    run_log_dir =
        base + "/" + spec.rdzv_handler->get_run_id() + "_" + random_id(8);
    fs::create_directories(run_log_dir);
  }
  base_env = inherited_env();
  if (!base_env.count("OMP_NUM_THREADS") && spec.local_world_size > 1) {
    base_env["OMP_NUM_THREADS"] = "1";
    if (!warned_omp) {
      warned_omp = true;
      TIDE_LOG_WARN(
          "Setting OMP_NUM_THREADS to 1 for each worker so {} workers do not "
          "overload this machine; set it yourself to tune performance",
          spec.local_world_size);
    }
  }
  if (options.adopt_orphans) {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }
  janitor = std::make_unique<detail::Janitor>();
  start_timer_server();
  start_heartbeats();
  start_status();
  TIDE_LOG_INFO(
      "[{}] starting: {} workers per node, {} restarts allowed, logs in {}",
      spec.role,
      spec.local_world_size,
      spec.max_restarts,
      run_log_dir);

  if (spec.prestart.enabled) {
    start_prestart();
  }
  // The waiting interpreters go with run(), however it ends.
  struct DrainPool {
    Impl& impl;
    ~DrainPool() {
      impl.prestart.reset();
    }
  } drain_pool{*this};

  auto run_prof = metrics::profile("SimpleElasticAgent.run");
  try {
    return run_groups();
  } catch (const std::exception& e) {
    // However run() ends, the node's last record says it is over.
    if (!status::is_final(node_state)) {
      end_attempt("TERMINATED", e.what());
      enter(NodeState::kFailed);
    }
    throw;
  }
}

RunResult LocalElasticAgent::Impl::run_groups() {
  const WorkerSpec& spec = self.spec_;
  enter(NodeState::kStarting);
  check_stop();
  initialize_workers();
  auto next_membership_check = Clock::now() + spec.monitor_interval;
  for (;;) {
    wait_for_events(std::min(
        {next_membership_check, next_heartbeat_deadline(), next_status}));
    check_stop();
    check_heartbeats();
    // Decided before any record is posted: a record never shows an exit
    // the agent has seen but not yet acted on.
    WorkerState state = group_state();
    if (state == WorkerState::kSucceeded) {
      end_attempt("SUCCEEDED", "");
      enter(NodeState::kSucceeded);
      for (const Worker& w : group.workers) {
        worker_event(w, "SUCCEEDED");
      }
      record_run_metrics(true);
      TIDE_LOG_INFO("[{}] all workers succeeded", spec.role);
      stop_workers(SIGTERM, spec.shutdown_grace);  // drains the tee pipes
      exit_barrier();
      return RunResult{.state = state, .return_values = return_values()};
    }
    if (state == WorkerState::kFailed) {
      auto failure_seen = Clock::now();
      auto fails = failures();
      count_agent_event(
          "tide_agent_worker_failures_total",
          "Workers that failed (exited non-zero or by a signal).",
          static_cast<double>(fails.size()));
      for (const auto& [rank, f] : fails) {
        TIDE_LOG_WARN(
            "[{}] worker rank {} (local {}, pid {}) failed: {}",
            spec.role,
            rank,
            f.local_rank,
            f.pid,
            f.message);
      }
      for (const auto& [rank, f] : fails) {
        attempt_failures.insert(f.local_rank);
      }
      {
        const ProcessFailure& first = fails.begin()->second;
        end_attempt(
            "FAILED",
            "rank " + std::to_string(first.global_rank) + " (local " +
                std::to_string(first.local_rank) + "): " + first.message);
      }
      bool restart = restarts.left > 0;
      if (restart) {
        note_restart("worker failure: " + attempts.back().reason);
      }
      enter(
          stop_signal.load() != 0 ? NodeState::kStopped
          : restart               ? NodeState::kRestarting
                                  : NodeState::kFailed);
      stop_workers(SIGTERM, spec.shutdown_grace);
      for (const Worker& w : group.workers) {
        auto f = fails.find(w.global_rank);
        if (f != fails.end()) {
          worker_event(
              w,
              "FAILED",
              f->second.error_file_data.empty() ? f->second.message
                                                : f->second.error_file_data);
        } else {
          worker_event(w, "TERMINATED");
        }
      }
      check_stop();
      if (restart) {
        --restarts.left;
        ++restarts.used;
        TIDE_LOG_INFO(
            "[{}] restarting the worker group ({} of {} restarts used)",
            spec.role,
            restarts.used,
            spec.max_restarts);
        agent_event(
            "restart",
            {{"reason", std::string("worker failure")},
             {"remaining_restarts", int64_t{restarts.left}}});
        post_status(/*urgent=*/true);  // with the restart counted
        count_restart("worker_failure");
        initialize_workers();
        time_restart("worker_failure", failure_seen);
        next_membership_check = Clock::now() + spec.monitor_interval;
        continue;
      }
      record_run_metrics(false);
      TIDE_LOG_ERROR(
          "[{}] worker group failed and no restarts are left ({} allowed)",
          spec.role,
          spec.max_restarts);
      // A node failing for good ends the job: the other nodes stop rather
      // than wait in a collective for this one, and those already in the
      // exit barrier leave it.
      count_in_failed();
      try {
        spec.rdzv_handler->set_closed();
      } catch (const Error& e) {
        TIDE_LOG_WARN("[{}] closing the rendezvous: {}", spec.role, e.what());
      }
      return RunResult{
          .state = WorkerState::kFailed, .failures = std::move(fails)};
    }
    if (Clock::now() >= next_membership_check) {
      next_membership_check = Clock::now() + spec.monitor_interval;
      int waiting = 0;
      try {
        waiting = spec.rdzv_handler->num_nodes_waiting();
      } catch (const RendezvousError& e) {
        // The backend is gone or another node ended the job: this node's
        // workers cannot go on.
        TIDE_LOG_ERROR(
            "[{}] rendezvous: {}; stopping workers", spec.role, e.what());
        end_attempt("TERMINATED", std::string("rendezvous: ") + e.what());
        enter(NodeState::kFailed);
        stop_workers(SIGTERM, spec.shutdown_grace);
        for (const Worker& w : group.workers) {
          worker_event(w, "TERMINATED");
        }
        if (dynamic_cast<const RendezvousClosedError*>(&e) != nullptr) {
          count_in_failed();  // a backend that is gone has no barrier
        }
        throw;
      }
      if (waiting > 0) {
        auto change_seen = Clock::now();
        TIDE_LOG_INFO(
            "[{}] membership changed ({} node(s) waiting or lost); restarting "
            "the group (not counted as a restart)",
            spec.role,
            waiting);
        std::string why = "membership changed: " + std::to_string(waiting) +
                          " node(s) waiting or lost";
        end_attempt("TERMINATED", why);
        note_restart(why);
        enter(NodeState::kRestarting);
        stop_workers(SIGTERM, spec.shutdown_grace);
        for (const Worker& w : group.workers) {
          worker_event(w, "TERMINATED");
        }
        agent_event(
            "restart",
            {{"reason", std::string("membership changed")},
             {"nodes_waiting", int64_t{waiting}}});
        check_stop();
        count_restart("membership_change");
        initialize_workers();
        time_restart("membership_change", change_seen);
        continue;
      }
    }
    if (Clock::now() >= next_status) {
      next_status = Clock::now() + spec.status_interval;
      measure_steps();
      post_status(/*urgent=*/false);
    }
  }
}

}  // namespace tide::agent
