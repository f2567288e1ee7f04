// tide._elastic's agent: tide's LocalElasticAgent configured from the spec
// tide.elastic's LocalElasticAgent builds, run without the GIL, its result as
// Python values.
#include <signal.h>

#include <atomic>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "tide/agent/health_check.h"
#include "tide/agent/local_elastic_agent.h"
#include "tide/common/error.h"

#include "pyelastic/py_common.h"

namespace tide::pyelastic {

using std::chrono::milliseconds;

namespace {

// The agent run() is running, for the signal handler.
std::atomic<agent::LocalElasticAgent*> g_running{nullptr};

// As tiderun: the first signal stops the workers and run() reports it; a
// second ends the process with the signal's default action (the workers die
// with it).
extern "C" void on_signal(int sig) {
  if (auto* a = g_running.exchange(nullptr)) {
    a->request_stop(sig);
    return;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

agent::StdSpec to_std_spec(const py::object& o) {
  agent::StdSpec spec;
  if (py::isinstance<py::dict>(o)) {
    for (auto [k, v] : o.cast<py::dict>()) {
      spec.by_rank[k.cast<int>()] = static_cast<agent::Std>(v.cast<int>());
    }
  } else {
    spec.all = static_cast<agent::Std>(o.cast<int>());
  }
  return spec;
}

py::dict to_dict(const agent::Worker& w) {
  py::dict d;
  d["local_rank"] = w.local_rank;
  d["global_rank"] = w.global_rank;
  d["role_rank"] = w.role_rank;
  d["world_size"] = w.world_size;
  d["role_world_size"] = w.role_world_size;
  d["pid"] = w.pid;
  return d;
}

py::dict to_dict(const agent::ProcessFailure& f) {
  py::dict d;
  d["local_rank"] = f.local_rank;
  d["global_rank"] = f.global_rank;
  d["pid"] = f.pid;
  d["exitcode"] = f.exitcode;
  d["host"] = f.host;
  d["timestamp"] = f.timestamp;
  d["error_file"] = f.error_file;
  d["error_file_data"] = f.error_file_data;
  d["message"] = f.message;
  d["traceback"] = f.traceback;
  d["signal_name"] = f.signal_name();
  return d;
}

// The C++ agent, configured from Python (tide.elastic's LocalElasticAgent
// builds the spec from torch's WorkerSpec).
class Agent {
 public:
  explicit Agent(const py::dict& s) {
    agent::WorkerSpec spec;
    spec.role = s["role"].cast<std::string>();
    spec.local_world_size = s["local_world_size"].cast<int>();
    spec.entrypoint =
        agent::Command{s["argv"].cast<std::vector<std::string>>()};
    spec.rdzv_handler = to_handler(s["rdzv_handler"]);
    spec.max_restarts = s["max_restarts"].cast<int>();
    spec.monitor_interval = milliseconds(
        static_cast<int64_t>(s["monitor_interval"].cast<double>() * 1e3));
    spec.redirects = to_std_spec(s["redirects"]);
    spec.tee = to_std_spec(s["tee"]);
    for (int rank : s["local_ranks_filter"].cast<std::vector<int>>()) {
      spec.local_ranks_filter.insert(rank);
    }
    spec.log_line_prefix_template =
        s["log_line_prefix_template"].cast<std::string>();
    spec.log_dir = s["log_dir"].cast<std::string>();
    if (!s["master_addr"].is_none()) {
      spec.master_addr = s["master_addr"].cast<std::string>();
    }
    if (!s["master_port"].is_none()) {
      spec.master_port = s["master_port"].cast<uint16_t>();
    }
    spec.env = s["env"].cast<std::map<std::string, std::string>>();
    spec.exit_barrier_timeout = milliseconds(
        static_cast<int64_t>(s["exit_barrier_timeout"].cast<double>() * 1e3));
    if (!s["timer_file"].is_none()) {  // TORCHELASTIC_ENABLE_FILE_TIMER=1
      spec.timer = agent::WorkerSpec::Timer::kFile;
      spec.timer_file = s["timer_file"].cast<std::string>();
    }
    if (s.contains("checkpoint_memory")) {
      auto memory = s["checkpoint_memory"].cast<std::string>();
      if (!memory.empty()) {
        spec.checkpoints.memory =
            agent::parse_size(memory, "PET_CHECKPOINT_MEMORY");
      }
      spec.checkpoints.dir = s["checkpoint_dir"].cast<std::string>();
      spec.checkpoints.keep = s["checkpoint_keep"].cast<int>();
      spec.checkpoints.python = s["python"].cast<std::string>();
      if (!spec.checkpoints.dir.empty() && spec.checkpoints.memory == 0) {
        throw InvalidArgument(
            "PET_CHECKPOINT_DIR writes the snapshots held in memory: set "
            "PET_CHECKPOINT_MEMORY too");
      }
    }
    agent::validate(spec);
    agent_ = std::make_unique<agent::LocalElasticAgent>(std::move(spec));
  }

  // Runs the agent without the GIL. With handle_signals (the main thread),
  // SIGINT, SIGTERM, SIGHUP and SIGQUIT stop the workers meanwhile, as in
  // torch; the result then says which signal.
  py::dict run(bool handle_signals) {
    agent::RunResult result;
    int stopped_by = 0;
    {
      py::gil_scoped_release release;
      struct sigaction before[std::size(kStopSignals)];
      if (handle_signals) {
        g_running.store(agent_.get());
        struct sigaction sa {};
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        for (size_t i = 0; i < std::size(kStopSignals); ++i) {
          ::sigaction(kStopSignals[i], &sa, &before[i]);
        }
      }
      try {
        result = agent_->run();
      } catch (const agent::SignalException& e) {
        stopped_by = e.signal();
      } catch (...) {
        restore(handle_signals, before);
        throw;
      }
      restore(handle_signals, before);
    }
    py::dict out;
    out["state"] = agent::to_string(result.state);
    out["stopped_by_signal"] = stopped_by;
    py::dict failures;
    for (const auto& [rank, f] : result.failures) {
      failures[py::int_(rank)] = to_dict(f);
    }
    out["failures"] = failures;
    out["group"] = group();
    return out;
  }

  // Without the GIL: the agent's threads, which it joins, may be waiting
  // for it to call a Python handler.
  ~Agent() {
    py::gil_scoped_release release;
    agent_.reset();
  }
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  void request_stop(int sig) {
    agent_->request_stop(sig);
  }

  // The group of the current or last attempt.
  py::dict group() const {
    const agent::WorkerGroup& g = agent_->worker_group();
    py::dict d;
    py::list workers;
    for (const auto& w : g.workers) {
      workers.append(to_dict(w));
    }
    d["workers"] = workers;
    d["group_rank"] = g.group_rank;
    d["group_world_size"] = g.group_world_size;
    d["state"] = agent::to_string(g.state);
    d["store"] = g.store ? py::cast(g.store) : py::none();
    return d;
  }

  std::string run_log_dir() const {
    return agent_->run_log_dir();
  }
  int remaining_restarts() const {
    return agent_->remaining_restarts();
  }

 private:
  static void restore(bool handle_signals, const struct sigaction* before) {
    if (!handle_signals) {
      return;
    }
    g_running.store(nullptr);
    for (size_t i = 0; i < std::size(kStopSignals); ++i) {
      ::sigaction(kStopSignals[i], &before[i], nullptr);
    }
  }

  std::unique_ptr<agent::LocalElasticAgent> agent_;
};

}  // namespace

void bind_agent(py::module_& m) {
  py::class_<Agent>(m, "Agent")
      .def(py::init<const py::dict&>(), py::arg("spec"))
      .def("run", &Agent::run, py::arg("handle_signals"))
      .def("request_stop", &Agent::request_stop, py::arg("signal"))
      .def("group", &Agent::group)
      .def("run_log_dir", &Agent::run_log_dir)
      .def("remaining_restarts", &Agent::remaining_restarts);
}

}  // namespace tide::pyelastic
