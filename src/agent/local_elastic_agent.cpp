// The agent's core (torch's SimpleElasticAgent._invoke_run): a worker
// group's life as transitions (agent/transition.h). The run loop waits,
// observes, asks decide() what the observation means, and acts; its
// components (agent/component.h) own every feature's state and report each
// transition. Event driven: one poll() over a wake-up eventfd, the
// components' descriptors and the workers' pidfds and tee pipes. Worker
// exits are seen when they happen; monitor_interval only paces the question
// "are nodes waiting to join?".
#include "tide/agent/local_elastic_agent.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>
#include <vector>

#include "tide/common/fd.h"
#include "tide/common/host.h"
#include "tide/common/logging.h"
#include "tide/metrics/metrics.h"
#include "tide/rendezvous/rendezvous_handler.h"

#include "agent/checkpoint_memory.h"
#include "agent/component.h"
#include "agent/exit_barrier.h"
#include "agent/group_processes.h"
#include "agent/hang_detector.h"
#include "agent/health_checks.h"
#include "agent/replica_group.h"
#include "agent/reporting.h"
#include "agent/status_records.h"
#include "agent/store_fan_in.h"
#include "agent/transition.h"
#include "agent/worker_timers.h"
#include "common/clock.h"
#include "common/random.h"

namespace tide::agent {

using detail::Action;
using detail::GroupEvent;
using detail::Observation;
using detail::Transition;
using status::NodeState;
using std::chrono::milliseconds;

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

}  // namespace

// The core: the group's life and nothing else. Every feature is a
// component; the core knows by type only those the public API reads
// (reporter: status(); records: node_status(); timers: last progress).
struct LocalElasticAgent::Impl {
  Impl(LocalElasticAgent& agent, AgentOptions opts);
  ~Impl();

  RunResult run();
  // run()'s loop: groups started, watched and restarted until one succeeds
  // or fails for good.
  RunResult run_groups();
  // A round (health checks first), the ranks, and a new group started;
  // `restart_of`: the transition it restarts for, seen at `seen`.
  void start_group(
      std::optional<GroupEvent> restart_of, Clock::time_point seen);
  void rendezvous();
  void assign_ranks();
  // What the workers and the rendezvous say now, if anything changed.
  std::optional<Observation> observe(Clock::time_point& next_membership_check);
  // Announces t to the components (entered), acts on it (starts or stops
  // the workers), counts the restarts, and announces that it acted.
  void act(const Transition& t);
  // Once a stop was requested: the STOPPED transition, then SignalException.
  void check_stop();
  // Waits until `deadline`; throws SignalException once a stop is requested.
  void pause(Clock::time_point deadline);
  // Waits for an event (a worker's, a component's, a wake-up) until
  // `deadline`.
  void wait_for_events(Clock::time_point deadline);
  // Runs the components whose deadline passed; whether any did.
  bool run_due();

  LocalElasticAgent& self;
  const AgentOptions options;
  Fd wake_fd;
  std::atomic<int> stop_signal{0};
  std::string run_log_dir;
  const std::string host = tide::fqdn();
  const double started_at = now_seconds();
  WorkerGroup group;
  rendezvous::RendezvousInfo rdzv;
  detail::Restarts restarts;
  NodeState node_state = NodeState::kStarting;
  const detail::AgentView view{
      .spec = self.spec_,
      .host = host,
      .run_log_dir = run_log_dir,
      .group = group,
      .rdzv = rdzv,
      .restarts = restarts,
      .started_at = started_at,
  };
  detail::GroupProcesses processes;
  // In the order they hear of each transition; destroyed in reverse.
  std::vector<std::unique_ptr<detail::Component>> components;
  detail::Reporter* reporter = nullptr;
  detail::StatusRecords* records = nullptr;
  detail::WorkerTimers* timers = nullptr;
};

LocalElasticAgent::Impl::Impl(LocalElasticAgent& agent, AgentOptions opts)
    : self(agent),
      options(opts),
      processes(
          view,
          {.adopt_orphans = opts.adopt_orphans,
           .component_env =
               [this](std::map<std::string, std::string>& env) {
                 for (const auto& c : components) {
                   c->add_env(env);
                 }
               },
           .exited =
               [this](const std::set<pid_t>& pids) {
                 for (const auto& c : components) {
                   c->exited(pids);
                 }
               }}) {
  wake_fd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd) {
    throw Error(std::string("eventfd failed: ") + std::strerror(errno));
  }
  auto add = [&]<typename C>(std::unique_ptr<C> c) {
    C* raw = c.get();
    components.push_back(std::move(c));
    return raw;
  };
  reporter = add(std::make_unique<detail::Reporter>(view, processes));
  records =
      add(std::make_unique<detail::StatusRecords>(view, processes, *reporter));
  add(std::make_unique<detail::HangDetector>(
      view,
      processes,
      *reporter,
      [records = records](
          size_t rank, std::optional<int64_t> step, Clock::time_point at) {
        records->beat(rank, step, at);
      }));
  timers =
      add(std::make_unique<detail::WorkerTimers>(view, processes, *reporter));
  add(std::make_unique<detail::HealthChecks>(
      view, *reporter, [this](Clock::time_point until) { pause(until); }));
  add(std::make_unique<detail::CheckpointMemory>(view));
  add(std::make_unique<detail::ReplicaGroup>(view));
  add(std::make_unique<detail::StoreFanIn>(view));
}

LocalElasticAgent::Impl::~Impl() {
  while (!components.empty()) {
    components.pop_back();
  }
}

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

AgentStatus LocalElasticAgent::status() const {
  AgentStatus s = impl_->reporter->snapshot();
  s.last_progress = std::max(s.last_progress, impl_->timers->last_progress());
  return s;
}

status::NodeStatus LocalElasticAgent::node_status() const {
  return impl_->records->last_record();
}

std::string LocalElasticAgent::worker_log_dir(int local_rank) const {
  std::string dir = impl_->processes.attempt_log_dir();
  if (dir.empty() || local_rank < 0 || local_rank >= spec_.local_world_size) {
    return "";
  }
  return dir + "/" + std::to_string(local_rank);
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
  processes.open();
  for (const auto& c : components) {
    c->start();
  }
  TIDE_LOG_INFO(
      "[{}] starting: {} workers per node, {} restarts allowed, logs in {}",
      spec.role,
      spec.local_world_size,
      spec.max_restarts,
      run_log_dir);
  if (spec.prestart.enabled) {
    processes.open_prestart();
  }
  // The waiting interpreters go with run(), however it ends.
  struct Close {
    detail::GroupProcesses& processes;
    ~Close() {
      processes.close();
    }
  } close{processes};

  auto run_prof = metrics::profile("SimpleElasticAgent.run");
  try {
    return run_groups();
  } catch (const std::exception& e) {
    // However run() ends, the node's last record says it is over.
    if (!status::is_final(node_state)) {
      act(decide({.event = GroupEvent::kAborted, .error = e.what()}, restarts));
    }
    throw;
  }
}

RunResult LocalElasticAgent::Impl::run_groups() {
  const WorkerSpec& spec = self.spec_;
  check_stop();
  start_group(std::nullopt, Clock::now());
  auto next_membership_check = Clock::now() + spec.monitor_interval;
  for (;;) {
    check_stop();
    std::optional<Observation> seen = observe(next_membership_check);
    if (!seen) {
      // Components act after the group was looked at, so that a record
      // never shows an exit the agent has seen but not yet acted on; and
      // the group is looked at again before waiting (a hung worker killed
      // is a failure at once).
      if (!run_due()) {
        wait_for_events(next_membership_check);
      }
      continue;
    }
    Transition t = decide(std::move(*seen), restarts);
    act(t);
    switch (t.action) {
      case Action::kRestart:
        check_stop();
        start_group(t.event, t.seen);
        next_membership_check = Clock::now() + spec.monitor_interval;
        continue;
      case Action::kFinish:
        detail::exit_barrier(rdzv, spec, stop_signal);
        return RunResult{
            .state = WorkerState::kSucceeded,
            .return_values = processes.return_values()};
      case Action::kGiveUp:
        // A node failing for good ends the job: the other nodes stop rather
        // than wait in a collective for this one, and those already in the
        // exit barrier leave it.
        detail::count_in_failed(rdzv, spec);
        try {
          spec.rdzv_handler->set_closed();
        } catch (const Error& e) {
          TIDE_LOG_WARN("[{}] closing the rendezvous: {}", spec.role, e.what());
        }
        return RunResult{
            .state = WorkerState::kFailed, .failures = std::move(t.failures)};
      case Action::kStop:
        if (t.cause) {
          try {
            std::rethrow_exception(t.cause);
          } catch (const RendezvousClosedError&) {
            detail::count_in_failed(rdzv, spec);  // a gone backend has none
            throw;
          }
        }
        throw SignalException(
            t.signal, "agent stopped by " + detail::signal_text(t.signal));
      case Action::kWatch:
      case Action::kNothing:
        continue;
    }
  }
}

void LocalElasticAgent::Impl::start_group(
    std::optional<GroupEvent> restart_of, Clock::time_point seen) {
  auto prof = metrics::profile("SimpleElasticAgent._initialize_workers");
  rendezvous();
  assign_ranks();
  processes.choose_rpc_secret();
  processes.prepare();
  act(decide(
      {.event = GroupEvent::kStarted, .restart_of = restart_of, .seen = seen},
      restarts));
}

void LocalElasticAgent::Impl::rendezvous() {
  const WorkerSpec& spec = self.spec_;
  auto prof = metrics::profile("SimpleElasticAgent._rendezvous");
  for (const auto& c : components) {
    c->before_rendezvous();
  }
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
    reporter->round(start, /*completed=*/false);
    throw;
  }
  group.store = rdzv.store;
  group.group_rank = rdzv.rank;
  group.group_world_size = rdzv.world_size;
  reporter->round(start, /*completed=*/true);
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

std::optional<Observation> LocalElasticAgent::Impl::observe(
    Clock::time_point& next_membership_check) {
  const WorkerSpec& spec = self.spec_;
  switch (processes.state()) {
    case WorkerState::kSucceeded:
      return Observation{.event = GroupEvent::kSucceeded};
    case WorkerState::kFailed:
      return Observation{
          .event = GroupEvent::kFailed,
          .failures = processes.failures([&](ProcessFailure& f) {
            for (const auto& c : components) {
              c->explain(f);
            }
          }),
          .stop_signal = stop_signal.load()};
    default:
      break;
  }
  if (Clock::now() < next_membership_check) {
    return std::nullopt;
  }
  next_membership_check = Clock::now() + spec.monitor_interval;
  int waiting = 0;
  try {
    waiting = spec.rdzv_handler->num_nodes_waiting();
  } catch (const RendezvousError& e) {
    // The backend is gone or another node ended the job: this node's
    // workers cannot go on.
    return Observation{
        .event = GroupEvent::kRendezvousLost,
        .error = e.what(),
        .cause = std::current_exception()};
  }
  if (waiting == 0) {
    return std::nullopt;
  }
  return Observation{
      .event = GroupEvent::kMembershipChanged, .nodes_waiting = waiting};
}

void LocalElasticAgent::Impl::act(const Transition& t) {
  const WorkerSpec& spec = self.spec_;
  node_state = t.to;
  group.state = detail::worker_state(t.to);
  for (const auto& c : components) {
    c->entered(t);
  }
  switch (t.action) {
    case Action::kWatch:
      processes.start(group);
      break;
    case Action::kNothing:
      break;
    default:
      processes.stop(
          t.event == GroupEvent::kStopRequested ? t.signal : SIGTERM,
          spec.shutdown_grace);
      break;
  }
  restarts = t.restarts;
  for (const auto& c : components) {
    c->acted(t);
  }
}

void LocalElasticAgent::Impl::check_stop() {
  if (int sig = stop_signal.load(); sig != 0) {
    act(decide(
        {.event = GroupEvent::kStopRequested, .stop_signal = sig}, restarts));
    throw SignalException(sig, "agent stopped by " + detail::signal_text(sig));
  }
}

void LocalElasticAgent::Impl::pause(Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    check_stop();
    auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
    pollfd p{.fd = wake_fd.get(), .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) >
        0) {
      uint64_t drained;
      [[maybe_unused]] ssize_t n =
          ::read(wake_fd.get(), &drained, sizeof drained);
    }
  }
  check_stop();
}

void LocalElasticAgent::Impl::wait_for_events(Clock::time_point deadline) {
  std::vector<pollfd> fds;
  fds.push_back({.fd = wake_fd.get(), .events = POLLIN, .revents = 0});
  std::vector<detail::Component*> polled;
  for (const auto& c : components) {
    deadline = std::min(deadline, c->deadline());
    if (int fd = c->fd(); fd >= 0) {
      fds.push_back({.fd = fd, .events = POLLIN, .revents = 0});
      polled.push_back(c.get());
    }
  }
  processes.add_fds(fds);
  deadline = std::min(deadline, processes.deadline());
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
  for (size_t i = 0; r > 0 && i < polled.size(); ++i) {
    if (fds[i + 1].revents != 0) {
      polled[i]->readable();
    }
  }
  processes.on_wake();
}

bool LocalElasticAgent::Impl::run_due() {
  bool any = false;
  if (Clock::now() >= processes.deadline()) {
    processes.due();
    any = true;
  }
  for (const auto& c : components) {
    if (Clock::now() >= c->deadline()) {
      c->due();
      any = true;
    }
  }
  return any;
}

}  // namespace tide::agent
