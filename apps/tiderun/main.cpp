// tiderun: torchrun's command line, flags, worker environment, exit codes and
// failure summary, without a Python interpreter in the control path.
//
//   tiderun [options] TRAINING_SCRIPT [script args...]
//
// The flags are in flags.h; this file runs the launcher with them, forwards
// signals to the agent and turns the outcome into torchrun's exit codes.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

#include <CLI/CLI.hpp>

#include "tide/common/error.h"
#include "tide/common/host.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"
#include "tide/events/events.h"
#include "tide/launcher/health_server.h"
#include "tide/launcher/launcher.h"
#include "tide/metrics/metrics.h"
#include "tide/rendezvous/registry.h"
#include "tide/status/job_status.h"

#include "cli.h"
#include "common/clock.h"
#include "flags.h"
#include "replica_groups.h"
#include "status.h"
#include "torch_probe.h"

namespace {

using tide::InvalidArgument;
using tide::launcher::LaunchConfig;
using tiderun::Flags;

std::atomic<tide::agent::LocalElasticAgent*> g_agent{nullptr};
std::atomic<int> g_pending_signal{0};
// The agent the health endpoint reads; the mutex keeps it alive while read.
std::mutex g_health_mutex;
tide::agent::LocalElasticAgent* g_health_agent = nullptr;

// Async-signal-safe. The first signal asks the agent to stop its workers
// (recorded first, so an agent announced at the same moment still sees it);
// a second one, for an agent busy elsewhere (a long rendezvous), ends tiderun
// with the signal's default action: its workers die with it (parent-death
// signal, janitor).
extern "C" void on_signal(int sig) {
  int expected = 0;
  if (!g_pending_signal.compare_exchange_strong(expected, sig)) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  if (auto* agent = g_agent.load()) {
    agent->request_stop(sig);
  }
}

// Installs the metric and event sinks the flags ask for.
void configure_sinks(const Flags& f) {
  if (f.metrics == "console") {
    tide::metrics::configure(
        std::make_shared<tide::metrics::ConsoleMetricHandler>());
  } else if (f.metrics.rfind("prometheus:", 0) == 0) {
    std::string address = f.metrics.substr(11);
    if (address.find(':') == std::string::npos) {
      address = "0.0.0.0:" + address;
    }
    auto handler =
        std::make_shared<tide::metrics::PrometheusMetricHandler>(address);
    TIDE_LOG_INFO("Prometheus metrics on port {} (/metrics)", handler->port());
    tide::metrics::configure(handler);
  } else if (!f.metrics.empty()) {
    throw InvalidArgument(
        "--metrics=" + f.metrics +
        ": expected console or prometheus:[HOST:]PORT");
  }
  if (f.events == "log") {
    tide::events::configure(std::make_shared<tide::events::LogEventHandler>());
  } else if (f.events.rfind("jsonl:", 0) == 0 && f.events.size() > 6) {
    tide::events::configure(
        std::make_shared<tide::events::JsonLinesEventHandler>(
            f.events.substr(6)));
  } else if (!f.events.empty()) {
    throw InvalidArgument(
        "--events=" + f.events + ": expected log or jsonl:PATH");
  }
  // torch's --event-log-handler names its Python handlers: "console"
  // prints each event's JSON on stderr, the other two drop them.
  if (f.event_log_handler == "console") {
    if (!f.events.empty()) {
      throw InvalidArgument(
          "--event-log-handler=console and --events=" + f.events +
          " both say where events go; give one");
    }
    tide::events::configure(
        std::make_shared<tide::events::JsonLinesEventHandler>("/dev/stderr"));
  } else if (
      f.event_log_handler != "null" &&
      f.event_log_handler != "dynamic_rendezvous") {
    throw InvalidArgument(
        "--event-log-handler=" + f.event_log_handler +
        ": torch's event handlers are Python plugins; tiderun has null, "
        "console and dynamic_rendezvous, and --events log|jsonl:PATH");
  }
}

void write_own_error_file(
    const tide::agent::RunResult& result, const std::string& summary) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') {
    return;
  }
  tide::launcher::write_error_file_for_launcher(path, result, summary);
}

// The job's view for the live page (/api/job): from the job store, on a
// connection of the page's own opened at the first request, or this node's
// record alone when the backend keeps no job store (static).
std::string job_view_json() {
  static std::mutex mutex;
  static std::shared_ptr<tide::store::Store> store;  // Guarded by mutex.
  std::shared_ptr<tide::rendezvous::RendezvousHandler> handler;
  tide::status::NodeStatus own;
  double threshold = 0;
  {
    std::lock_guard lock(g_health_mutex);
    if (g_health_agent == nullptr) {
      throw tide::Error("the agent has not started yet");
    }
    handler = g_health_agent->spec().rdzv_handler;
    threshold = g_health_agent->spec().straggler_threshold;
    own = g_health_agent->node_status();
  }
  std::lock_guard lock(mutex);
  try {
    if (!store) {
      store = handler->open_job_store();
    }
    if (store) {
      return tide::status::to_json(tide::status::read_job_view(
          *store, handler->get_run_id(), threshold));
    }
  } catch (const std::exception&) {
    store.reset();  // connect again at the next request
    throw;
  }
  std::vector<tide::status::NodeStatus> records;
  if (own.updated_at > 0) {
    own.slot = 0;
    records.push_back(own);
  }
  return tide::status::to_json(tide::status::make_job_view(
      handler->get_run_id(), records, tide::now_seconds(), threshold));
}

// Where other hosts reach this node's health endpoint: the host it was
// given, else --local-addr, else this host's name.
std::string health_endpoint(
    const std::string& flag, uint16_t port, const LaunchConfig& config) {
  std::string host;
  if (auto colon = flag.rfind(':'); colon != std::string::npos) {
    host = flag.substr(0, colon);
  }
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") {
    host = config.local_addr.empty() ? tide::fqdn() : config.local_addr;
  }
  return host + ":" + std::to_string(port);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "status") {
    return tiderun::status_main(argc - 1, argv + 1);
  }
  CLI::App app{
      "tiderun: launch a fault-tolerant, elastic group of workers, as torchrun "
      "does.\n"
      "Usage: tiderun [OPTIONS] TRAINING_SCRIPT [SCRIPT ARGS...]",
      "tiderun"};
  app.prefix_command();
  app.set_version_flag("--version", std::string("tiderun ") + TIDE_VERSION);
  Flags flags;
  tiderun::add_flags(app, flags);
  if (auto done = tide::apps::parse_command_line(app, argc, argv)) {
    return *done;
  }

  if (flags.replica_groups > 1) {
    if (!flags.ft_store.empty() || !flags.replica_group_id.empty()) {
      std::fprintf(
          stderr,
          "tiderun: error: --replica-groups runs the groups and serves their "
          "store: give it without --ft-store and --replica-group-id\n");
      return 2;
    }
    int script_at = argc - static_cast<int>(app.remaining().size());
    return tiderun::run_replica_groups(
        argc, argv, script_at, flags.replica_groups);
  }

  tide::agent::Entrypoint entrypoint;
  LaunchConfig config;
  std::vector<int> signals;
  try {
    entrypoint = tiderun::make_entrypoint(flags, app.remaining());
    tiderun::apply_environment(app, flags);
    tiderun::apply_slurm(app, flags);
    config = tiderun::make_config(flags);
    tiderun::fit_to_torch(entrypoint, flags.no_python, config);
    TIDE_LOG_DEBUG(
        "configuration: --nnodes={}:{} --nproc-per-node={} --rdzv-backend={} "
        "--rdzv-endpoint={} --rdzv-id={} --max-restarts={} "
        "--shutdown-timeout={:g} --signals-to-handle={}",
        config.min_nodes,
        config.max_nodes,
        config.nproc_per_node,
        config.rdzv_backend,
        config.rdzv_endpoint,
        config.run_id,
        config.max_restarts,
        static_cast<double>(config.shutdown_grace.count()) / 1000,
        flags.signals_to_handle);
    for (std::string_view plugin : tide::split(flags.rdzv_plugins, ':')) {
      tide::rendezvous::load_handler_plugin(std::string(plugin));
    }
    for (std::string_view name : tide::split(flags.signals_to_handle, ',')) {
      signals.push_back(tiderun::signal_number(std::string(name)));
    }
  } catch (const tide::Error& e) {
    std::fprintf(
        stderr,
        "tiderun: error: %s\nRun tiderun --help for usage.\n",
        e.what());
    return 2;
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : signals) {
    sigaction(sig, &sa, nullptr);
  }
  // As torchrun does: the workers learn which signals their agent handles.
  ::setenv(
      "TORCHELASTIC_SIGNALS_TO_HANDLE", flags.signals_to_handle.c_str(), 1);
  ::signal(SIGPIPE, SIG_IGN);

  // Never destroyed: stopping civetweb's threads takes up to its 2 s poll
  // period, and the process is about to exit anyway. Static, so that it is
  // still reachable at exit (no leak for LeakSanitizer to report).
  static tide::launcher::HealthServer* health = nullptr;
  try {
    configure_sinks(flags);
    if (!flags.health_port.empty()) {
      health = new tide::launcher::HealthServer(
          flags.health_port,
          {.status = []() -> std::optional<tide::agent::AgentStatus> {
             std::lock_guard lock(g_health_mutex);
             if (g_health_agent == nullptr) {
               return std::nullopt;
             }
             return g_health_agent->status();
           },
           .job = job_view_json,
           .log_dir = [](int local_rank) -> std::string {
             std::lock_guard lock(g_health_mutex);
             return g_health_agent == nullptr
                        ? ""
                        : g_health_agent->worker_log_dir(local_rank);
           }});
      config.health_endpoint =
          health_endpoint(flags.health_port, health->port(), config);
      TIDE_LOG_INFO(
          "health checks on port {} (/health; the job's page at http://{}/)",
          health->port(),
          config.health_endpoint);
    }
  } catch (const tide::Error& e) {
    std::fprintf(stderr, "tiderun: error: %s\n", e.what());
    return 2;
  }

  std::string name = tide::agent::entrypoint_name(entrypoint);
  if (auto* cmd = std::get_if<tide::agent::Command>(&entrypoint);
      cmd && !flags.no_python && cmd->argv.size() > 2 && cmd->argv[1] == "-u") {
    name = cmd->argv[cmd->argv[2] == "-m" ? 3 : 2];
  }
  try {
    auto outcome = tide::launcher::launch(
        config, entrypoint, [](tide::agent::LocalElasticAgent* agent) {
          {
            std::lock_guard lock(g_health_mutex);
            g_health_agent = agent;
          }
          g_agent.store(agent);
          if (int sig = g_pending_signal.load(); agent != nullptr && sig != 0) {
            agent->request_stop(sig);
          }
        });
    if (outcome.stopped_by_signal != 0) {
      const char* abbrev = sigabbrev_np(outcome.stopped_by_signal);
      std::fprintf(
          stderr,
          "tiderun: stopped by SIG%s; workers were stopped\n",
          abbrev ? abbrev : "?");
      return 1;
    }
    if (outcome.result.is_failed()) {
      std::string summary =
          tide::launcher::format_failure_summary(name, outcome.result);
      std::fprintf(stderr, "tiderun: worker group failed:%s", summary.c_str());
      write_own_error_file(outcome.result, summary);
      return 1;
    }
    return 0;
  } catch (const tide::InvalidArgument& e) {
    std::fprintf(stderr, "tiderun: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tiderun: %s\n", e.what());
    return 1;
  }
}
