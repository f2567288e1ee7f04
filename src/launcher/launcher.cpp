#include "tide/launcher/launcher.h"

#include <ctime>
#include <fstream>
#include <sstream>

#include "tide/agent/error_file.h"
#include "tide/common/logging.h"
#include "tide/rendezvous/registry.h"

namespace tide::launcher {

LaunchResult launch(
    const LaunchConfig& config,
    const agent::Entrypoint& entrypoint,
    const std::function<void(agent::LocalElasticAgent*)>& on_agent) {
  rendezvous::RendezvousParameters params{
      .backend = config.rdzv_backend,
      .endpoint = config.rdzv_endpoint,
      .run_id = config.run_id,
      .min_nodes = config.min_nodes,
      .max_nodes = config.max_nodes,
      .local_addr = config.local_addr,
      .config = config.rdzv_configs,
      .token = config.job_secret,
  };
  std::shared_ptr<rendezvous::RendezvousHandler> handler =
      rendezvous::handler_registry().create(params);

  agent::WorkerSpec spec{
      .role = config.role,
      .local_world_size = config.nproc_per_node,
      .entrypoint = entrypoint,
      .start_method = config.start_method,
      .rdzv_handler = handler,
      .max_restarts = config.max_restarts,
      .monitor_interval = config.monitor_interval,
      .redirects = config.redirects,
      .tee = config.tee,
      .local_ranks_filter = config.local_ranks_filter,
      .duplicate_stdout_filters = config.duplicate_stdout_filters,
      .duplicate_stderr_filters = config.duplicate_stderr_filters,
      .log_line_prefix_template = config.log_line_prefix_template,
      .virtual_local_rank = config.virtual_local_rank,
      .log_dir = config.log_dir,
      .shutdown_grace = config.shutdown_grace,
      .exit_barrier_timeout = config.exit_barrier_timeout,
      .timer = config.timer,
      .timer_file = config.timer_file,
      .numa_binding = config.numa_binding,
      .topology_root = config.topology_root,
      .heartbeat_timeout = config.heartbeat_timeout,
      .health = config.health,
      .status_interval = config.status_interval,
      .straggler_threshold = config.straggler_threshold,
      .health_endpoint = config.health_endpoint,
      .prestart = config.prestart,
      .checkpoints = config.checkpoints,
      .replica_group = config.replica_group,
      .store_fan_in = config.store_fan_in,
      .job_secret = config.job_secret,
  };
  // A job that may span nodes keeps a copy of each node's snapshots on
  // another node.
  spec.checkpoints.peer = spec.checkpoints.peer || config.max_nodes > 1;
  if (spec.checkpoints.host.empty()) {
    spec.checkpoints.host = config.local_addr;
  }
  agent::LocalElasticAgent agent(std::move(spec), {.adopt_orphans = true});
  // Whoever was shown the agent is told it is gone before it is destroyed,
  // on every path out of here (exceptions included).
  struct Unannounce {
    const std::function<void(agent::LocalElasticAgent*)>& on_agent;
    ~Unannounce() {
      if (on_agent) {
        on_agent(nullptr);
      }
    }
  } unannounce{on_agent};
  if (on_agent) {
    on_agent(&agent);
  }
  LaunchResult out;
  try {
    out.result = agent.run();
  } catch (const agent::SignalException& e) {
    out.stopped_by_signal = e.signal();
  } catch (const RendezvousError&) {
    // The job ended elsewhere or the backend is gone: leave (bounded), so
    // an agent hosting the store is not kept waiting for this one.
    handler->shutdown();
    throw;
  }
  if (out.stopped_by_signal == 0) {
    handler->shutdown();
  }
  return out;
}

namespace {

std::string format_time(double seconds) {
  std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

std::string indent_lines(const std::string& text) {
  std::string out;
  for (char c : text) {
    out.push_back(c);
    if (c == '\n') {
      out += "  ";
    }
  }
  return out;
}

std::string format_failure(
    size_t idx, int rank, const agent::ProcessFailure& f) {
  std::string message;
  if (!f.traceback.empty()) {
    message = indent_lines(f.traceback);
  } else if (!f.error_file_data.empty()) {
    message = indent_lines(f.message.empty() ? "<N/A>" : f.message);
  } else if (f.exitcode < 0) {
    message = f.message;
  } else {
    message =
        "To enable traceback see: "
        "https://pytorch.org/docs/stable/elastic/errors.html";
  }
  std::ostringstream s;
  s << "[" << idx << "]:\n"
    << "  time      : " << format_time(f.timestamp) << "\n"
    << "  host      : " << f.host << "\n"
    << "  rank      : " << rank << " (local_rank: " << f.local_rank << ")\n"
    << "  exitcode  : " << f.exitcode << " (pid: " << f.pid << ")\n"
    << "  error_file: " << (f.error_file_data.empty() ? "<N/A>" : f.error_file)
    << "\n"
    << "  traceback : " << message;
  return s.str();
}

size_t widest_line(const std::string& text) {
  size_t widest = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    size_t end = nl == std::string::npos ? text.size() : nl;
    widest = std::max(widest, end - start);
    if (nl == std::string::npos) {
      break;
    }
    start = nl + 1;
  }
  return widest;
}

}  // namespace

std::string format_failure_summary(
    const std::string& entrypoint_name, const agent::RunResult& result) {
  const agent::ProcessFailure* root = result.root_cause();
  std::string title = entrypoint_name + " FAILED";
  size_t width = title.size();
  std::string root_text;
  std::string others;
  size_t idx = 0;
  for (const auto& [rank, f] : result.failures) {
    std::string text = format_failure(idx++, rank, f);
    width = std::max(width, widest_line(text));
    if (&f == root) {
      root_text = text;
    } else {
      others += (others.empty() ? "" : "\n") + text;
    }
  }
  width = std::min<size_t>(width, 60);
  std::string border(width, '=');
  std::string section(width, '-');
  return "\n" + border + "\n" + title + "\n" + section + "\nFailures:\n" +
         (others.empty() ? std::string("  <NO_OTHER_FAILURES>") : others) +
         "\n" + section + "\nRoot Cause (first observed failure):\n" +
         root_text + "\n" + border + "\n";
}

void write_error_file_for_launcher(
    const std::string& path,
    const agent::RunResult& result,
    const std::string& summary) {
  const agent::ProcessFailure* root = result.root_cause();
  if (root != nullptr && !root->error_file_data.empty()) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << agent::with_error_code(root->error_file_data, root->exitcode);
    return;
  }
  agent::write_error_file(path, "ChildFailedError: " + summary, "");
}

}  // namespace tide::launcher
