// tiderun: torchrun's command line, flags, worker environment, exit codes and
// failure summary, without a Python interpreter in the control path.
//
//   tiderun [options] TRAINING_SCRIPT [script args...]
//
// Every option also reads PET_<NAME> from the environment (PET_NNODES,
// PET_NPROC_PER_NODE, ...), as torchrun's do; the command line wins.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <CLI/CLI.hpp>

#include "tide/agent/numa.h"
#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/strings.h"
#include "tide/events/events.h"
#include "tide/launcher/health_server.h"
#include "tide/launcher/launcher.h"
#include "tide/metrics/metrics.h"
#include "tide/rendezvous/registry.h"
#include "tide/store/tcp_store.h"

#include "common/random.h"

namespace {

using tide::InvalidArgument;
using tide::launcher::LaunchConfig;

constexpr const char* kVersion = "0.1.0";

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

int parse_int(const std::string& text, const char* what) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    throw InvalidArgument(
        std::string(what) + ": \"" + text + "\" is not an integer");
  }
  return v;
}

std::pair<int, int> parse_nnodes(const std::string& text) {
  auto colon = text.find(':');
  int lo = parse_int(text.substr(0, colon), "--nnodes");
  int hi = colon == std::string::npos
               ? lo
               : parse_int(text.substr(colon + 1), "--nnodes");
  if (lo < 1 || hi < lo) {
    throw InvalidArgument(
        "--nnodes=" + text + ": need 0 < MIN <= MAX (N or MIN:MAX)");
  }
  return {lo, hi};
}

int count_gpus() {
  // Without CUDA libraries: what the NVIDIA driver lists, narrowed by
  // CUDA_VISIBLE_DEVICES when that is set.
  if (const char* vis = std::getenv("CUDA_VISIBLE_DEVICES"); vis != nullptr) {
    std::string v = vis;
    if (v.empty()) {
      return 0;
    }
    return static_cast<int>(std::count(v.begin(), v.end(), ',')) + 1;
  }
  int n = 0;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)e;
    ++n;
  }
  return n;
}

int parse_nproc(const std::string& text) {
  int cpus =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (text == "cpu") {
    return cpus;
  }
  if (text == "gpu") {
    int gpus = count_gpus();
    if (gpus == 0) {
      throw InvalidArgument("--nproc-per-node=gpu: no GPU found on this node");
    }
    return gpus;
  }
  if (text == "auto") {
    int gpus = count_gpus();
    return gpus > 0 ? gpus : cpus;
  }
  int n = parse_int(text, "--nproc-per-node");
  if (n < 1) {
    throw InvalidArgument("--nproc-per-node must be at least 1");
  }
  return n;
}

std::map<std::string, std::string> parse_rdzv_conf(const std::string& text) {
  std::map<std::string, std::string> out;
  for (std::string_view item : tide::split(text, ',')) {
    auto eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) {
      throw InvalidArgument(
          "--rdzv-conf \"" + text +
          "\": expected KEY=VALUE pairs separated by commas");
    }
    out[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
  }
  return out;
}

std::set<int> parse_ranks(const std::string& text) {
  std::set<int> out;
  for (std::string_view item : tide::split(text, ',')) {
    out.insert(parse_int(std::string(item), "--local-ranks-filter"));
  }
  return out;
}

std::chrono::milliseconds seconds_flag(double s, const char* flag) {
  if (!(s > 0)) {
    throw InvalidArgument(
        std::string(flag) + " must be a positive number of seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000 + 0.5));
}

int signal_number(const std::string& name) {
  std::string n = name.rfind("SIG", 0) == 0 ? name.substr(3) : name;
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = sigabbrev_np(sig);
    if (abbrev != nullptr && n == abbrev) {
      return sig;
    }
  }
  throw InvalidArgument("--signals-to-handle: unknown signal \"" + name + "\"");
}

struct Flags {
  std::string nnodes = "1:1";
  std::string nproc_per_node = "1";
  std::optional<int> node_rank;  // given (flag or PET_NODE_RANK)
  std::string rank_order;        // empty: not given
  std::string master_addr = "127.0.0.1";
  int master_port = tide::store::kDefaultPort;
  int max_restarts = 0;
  double monitor_interval = 0.1;
  std::string start_method = "spawn";
  std::string role = "default";
  bool module = false;
  bool no_python = false;
  bool run_path = false;
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::string local_ranks_filter;
  bool standalone = false;
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  std::string rdzv_conf;
  std::string local_addr;
  double shutdown_timeout = 30;
  double exit_barrier_timeout = 300;
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  bool file_timer = false;
  std::string timer_file;
  std::string metrics;
  std::string events;
  std::string health_port;
  std::string rdzv_plugins;
  std::string numa_binding = "none";
  double heartbeat_timeout = 0;
  bool prestart = false;
  int prestart_spares = 0;
  std::string prestart_imports = "torch,torch.distributed";
  std::string health_check;
  double health_check_timeout = 60;
  int health_check_retries = 0;
  double health_check_backoff = 5;
  std::string health_check_min_free_disk;
  bool health_check_endpoint = false;
};

void add_flags(CLI::App& app, Flags& f) {
  // name list, PET_ variable
  auto opt = [&](const std::string& names,
                 auto& var,
                 const std::string& pet,
                 const std::string& help) {
    return app.add_option(names, var, help)
        ->envname(pet)
        ->capture_default_str();
  };
  opt("--nnodes", f.nnodes, "PET_NNODES", "number of nodes, N or MIN:MAX");
  opt("--nproc-per-node,--nproc_per_node",
      f.nproc_per_node,
      "PET_NPROC_PER_NODE",
      "workers per node: a number, cpu, gpu or auto");
  // A function option, so that "not given" differs from 0.
  app.add_option_function<int>(
         "--node-rank,--node_rank",
         [&f](int rank) { f.node_rank = rank; },
         "this node's rank: the static backend's (default 0), or its place "
         "in an elastic job with --rank-order=node-rank")
      ->envname("PET_NODE_RANK");
  opt("--rank-order,--rank_order",
      f.rank_order,
      "PET_RANK_ORDER",
      "how an elastic job (c10d, etcd) ranks its nodes: arrival (the "
      "default), natural (host names, node7 < node66), node-rank (each "
      "node's --node-rank) or lexicographic (torch's: address, pid)")
      ->check(
          CLI::IsMember({"arrival", "natural", "node-rank", "lexicographic"}));
  opt("--master-addr,--master_addr",
      f.master_addr,
      "PET_MASTER_ADDR",
      "node 0's address (static backend)");
  opt("--master-port,--master_port",
      f.master_port,
      "PET_MASTER_PORT",
      "node 0's store port (static backend)")
      ->check(CLI::Range(0, 65535));
  opt("--max-restarts,--max_restarts",
      f.max_restarts,
      "PET_MAX_RESTARTS",
      "restarts of the worker group on failure")
      ->check(CLI::NonNegativeNumber);
  opt("--monitor-interval,--monitor_interval",
      f.monitor_interval,
      "PET_MONITOR_INTERVAL",
      "seconds between checks for nodes waiting to join (worker exits are seen "
      "at once)");
  opt("--start-method,--start_method",
      f.start_method,
      "PET_START_METHOD",
      "spawn, fork or forkserver (function entrypoints)")
      ->check(CLI::IsMember({"spawn", "fork", "forkserver"}));
  opt("--role", f.role, "PET_ROLE", "the workers' role name");
  app.add_flag(
         "-m,--module",
         f.module,
         "run the script as a Python module (python -m)")
      ->envname("PET_MODULE");
  app.add_flag(
         "--no-python,--no_python",
         f.no_python,
         "exec the script directly, without python")
      ->envname("PET_NO_PYTHON");
  app.add_flag(
         "--run-path,--run_path",
         f.run_path,
         "run the script with python (torchrun: runpy)")
      ->envname("PET_RUN_PATH");
  opt("--log-dir,--log_dir",
      f.log_dir,
      "PET_LOG_DIR",
      "base directory for logs (default: a new temporary directory)");
  opt("-r,--redirects",
      f.redirects,
      "PET_REDIRECTS",
      "streams to log files: 0-3, or LOCAL_RANK:VALUE,...");
  opt("-t,--tee",
      f.tee,
      "PET_TEE",
      "streams to log files and the console: 0-3, or LOCAL_RANK:VALUE,...");
  opt("--local-ranks-filter,--local_ranks_filter",
      f.local_ranks_filter,
      "PET_LOCAL_RANKS_FILTER",
      "comma-separated local ranks whose output the console shows");
  app.add_flag(
         "--standalone",
         f.standalone,
         "single node: a local store on a free port, a random run id")
      ->envname("PET_STANDALONE");
  opt("--rdzv-backend,--rdzv_backend",
      f.rdzv_backend,
      "PET_RDZV_BACKEND",
      "rendezvous backend");
  opt("--rdzv-endpoint,--rdzv_endpoint",
      f.rdzv_endpoint,
      "PET_RDZV_ENDPOINT",
      "rendezvous endpoint, host[:port]");
  opt("--rdzv-id,--rdzv_id",
      f.rdzv_id,
      "PET_RDZV_ID",
      "job id shared by all nodes");
  opt("--rdzv-conf,--rdzv_conf",
      f.rdzv_conf,
      "PET_RDZV_CONF",
      "rendezvous settings, KEY=VALUE,...");
  opt("--rdzv-plugin,--rdzv_plugin",
      f.rdzv_plugins,
      "TIDE_RDZV_PLUGINS",
      "shared libraries adding rendezvous backends, PATH[:PATH...] (each "
      "defines tide_register_rendezvous)");
  opt("--local-addr,--local_addr",
      f.local_addr,
      "PET_LOCAL_ADDR",
      "address this node advertises");
  opt("--numa-binding,--numa_binding",
      f.numa_binding,
      "PET_NUMA_BINDING",
      "bind each worker to CPUs and memory: none, node (a NUMA node's), "
      "socket (its socket's) or exclusive (its own share of a node's CPUs). "
      "The topology is read from the sysfs root in TIDE_TOPOLOGY_ROOT "
      "(default /sys; for tests and unusual machines)");
  opt("--shutdown-timeout,--shutdown_timeout",
      f.shutdown_timeout,
      "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
      "seconds between a stop signal to the workers and SIGKILL");
  opt("--exit-barrier-timeout,--exit_barrier_timeout",
      f.exit_barrier_timeout,
      "PET_EXIT_BARRIER_TIMEOUT",
      "seconds a finished node waits for the others");
  opt("--signals-to-handle,--signals_to_handle",
      f.signals_to_handle,
      "TORCHELASTIC_SIGNALS_TO_HANDLE",
      "signals forwarded to the workers");
  app.add_flag(
         "--file-timer,--file_timer",
         f.file_timer,
         "serve expiration timers to the workers on a FIFO "
         "(TORCHELASTIC_TIMER_FILE)")
      ->envname("TORCHELASTIC_ENABLE_FILE_TIMER");
  app.add_flag(
         "--prestart",
         f.prestart,
         "start the workers' Python interpreters before they are needed, "
         "with --prestart-imports imported, and hand each attempt's workers "
         "to them (a Python script's workers only)")
      ->envname("PET_PRESTART");
  opt("--prestart-spares,--prestart_spares",
      f.prestart_spares,
      "PET_PRESTART_SPARES",
      "prestarted interpreters kept beyond one per local rank")
      ->check(CLI::NonNegativeNumber);
  opt("--prestart-imports,--prestart_imports",
      f.prestart_imports,
      "PET_PRESTART_IMPORTS",
      "modules a prestarted interpreter imports before its hand-off, "
      "comma-separated (none: nothing)");
  opt("--metrics",
      f.metrics,
      "PET_METRICS",
      "where metrics go: console, or prometheus:[HOST:]PORT (default: "
      "nowhere)");
  opt("--events",
      f.events,
      "PET_EVENTS",
      "where events go: log, or jsonl:PATH (default: nowhere)");
  opt("--health-port,--health_port",
      f.health_port,
      "PET_HEALTH_PORT",
      "serve GET /health on [HOST:]PORT");
  opt("--heartbeat-timeout,--heartbeat_timeout",
      f.heartbeat_timeout,
      "TIDE_HEARTBEAT_TIMEOUT",
      "seconds without a heartbeat after which a worker that sent one is "
      "hung: its stack is captured and the group restarts (0: off)");
  opt("--health-check,--health_check",
      f.health_check,
      "TIDE_HEALTH_CHECK",
      "shell command run before each rendezvous; a node where it fails does "
      "not join");
  opt("--health-check-timeout,--health_check_timeout",
      f.health_check_timeout,
      "TIDE_HEALTH_CHECK_TIMEOUT",
      "seconds each health check may take");
  opt("--health-check-retries,--health_check_retries",
      f.health_check_retries,
      "TIDE_HEALTH_CHECK_RETRIES",
      "after a failed health check, check again this many times (-1: for "
      "ever) before giving up");
  opt("--health-check-backoff,--health_check_backoff",
      f.health_check_backoff,
      "TIDE_HEALTH_CHECK_BACKOFF",
      "seconds before checking again, doubled each time (at most 60)");
  opt("--health-check-min-free-disk,--health_check_min_free_disk",
      f.health_check_min_free_disk,
      "TIDE_HEALTH_CHECK_MIN_FREE_DISK",
      "a health check: at least this much free space in the log directory "
      "(e.g. 10G)");
  app.add_flag(
         "--health-check-endpoint,--health_check_endpoint",
         f.health_check_endpoint,
         "a health check: the rendezvous endpoint accepts a TCP connection")
      ->envname("TIDE_HEALTH_CHECK_ENDPOINT");
  opt("--timer-file,--timer_file",
      f.timer_file,
      "TORCHELASTIC_TIMER_FILE",
      "the timer FIFO's path (default: in the run's log directory)");
}

tide::agent::Entrypoint make_entrypoint(
    const Flags& f, const std::vector<std::string>& rest) {
  if (rest.empty()) {
    throw InvalidArgument(
        "the following arguments are required: training_script");
  }
  if (f.module && f.no_python) {
    throw InvalidArgument("--no-python cannot be used with --module (-m)");
  }
  const std::string& script = rest[0];
  if (script.size() > 1 && script[0] == '-') {
    // Options stop at the script; anything dash-led before it is a typo.
    throw InvalidArgument("unrecognized option: " + script);
  }
  std::vector<std::string> args(rest.begin() + 1, rest.end());
  std::vector<std::string> argv;
  const char* py = std::getenv("PYTHON_EXEC");
  std::string python = py && *py ? py : "python3";
  bool is_py =
      script.size() > 3 && script.compare(script.size() - 3, 3, ".py") == 0;
  bool direct = f.no_python || (!f.module && !f.run_path && !is_py &&
                                script.find('/') != std::string::npos &&
                                ::access(script.c_str(), X_OK) == 0);
  if (direct) {
    argv.push_back(script);
  } else if (f.module) {
    argv = {python, "-u", "-m", script};
  } else {
    argv = {python, "-u", script};
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return tide::agent::Command{std::move(argv)};
}

// --rank-order and an explicit --node-rank, for a dynamic backend: its
// rank_order and node_rank settings (--rdzv-conf may give them too, but not
// differently).
void put_rank_order(const Flags& f, LaunchConfig& c) {
  auto put = [&](const std::string& key,
                 const std::string& value,
                 const std::string& flag) {
    auto [it, added] = c.rdzv_configs.emplace(key, value);
    if (!added && it->second != value) {
      throw InvalidArgument(
          flag + "=" + value + " contradicts --rdzv-conf " + key + "=" +
          it->second);
    }
  };
  if (!f.rank_order.empty()) {
    put("rank_order", f.rank_order, "--rank-order");
  }
  if (f.node_rank) {
    put("node_rank", std::to_string(*f.node_rank), "--node-rank");
  }
  auto order = c.rdzv_configs.find("rank_order");
  if (order != c.rdzv_configs.end() && order->second == "node-rank" &&
      c.rdzv_configs.count("node_rank") == 0) {
    throw InvalidArgument(
        "--rank-order=node-rank needs this node's --node-rank (or "
        "PET_NODE_RANK)");
  }
}

// The job secret: TIDE_JOB_SECRET, or the first line of the file
// --rdzv-conf secret_file= names (kept off the command line, which `ps`
// shows); taken out of the backend's settings.
std::string job_secret(LaunchConfig& c) {
  auto file = c.rdzv_configs.find("secret_file");
  const char* env = std::getenv("TIDE_JOB_SECRET");
  if (file == c.rdzv_configs.end()) {
    return env != nullptr ? env : "";
  }
  std::string path = file->second;
  c.rdzv_configs.erase(file);
  if (env != nullptr && *env != '\0') {
    throw InvalidArgument(
        "the job secret is given twice: TIDE_JOB_SECRET and --rdzv-conf "
        "secret_file=" +
        path + "; give one");
  }
  std::ifstream in(path);
  std::string secret;
  if (!in || !std::getline(in, secret) || secret.empty()) {
    throw InvalidArgument(
        "--rdzv-conf secret_file=" + path +
        ": cannot read a secret from it (its first line, not empty)");
  }
  return secret;
}

LaunchConfig make_config(const Flags& f) {
  LaunchConfig c;
  std::tie(c.min_nodes, c.max_nodes) = parse_nnodes(f.nnodes);
  c.nproc_per_node = parse_nproc(f.nproc_per_node);
  c.role = f.role;
  c.max_restarts = f.max_restarts;
  c.monitor_interval = seconds_flag(f.monitor_interval, "--monitor-interval");
  c.start_method = f.start_method == "fork" ? tide::agent::StartMethod::kFork
                                            : tide::agent::StartMethod::kSpawn;
  c.log_dir = f.log_dir;
  c.redirects = tide::agent::parse_std_spec(f.redirects, "--redirects");
  c.tee = tide::agent::parse_std_spec(f.tee, "--tee");
  if (!f.local_ranks_filter.empty()) {
    c.local_ranks_filter = parse_ranks(f.local_ranks_filter);
  }
  c.rdzv_configs = parse_rdzv_conf(f.rdzv_conf);
  c.job_secret = job_secret(c);
  c.local_addr = f.local_addr;
  c.shutdown_grace = seconds_flag(f.shutdown_timeout, "--shutdown-timeout");
  c.exit_barrier_timeout =
      seconds_flag(f.exit_barrier_timeout, "--exit-barrier-timeout");
  if (f.file_timer) {
    c.timer = tide::agent::WorkerSpec::Timer::kFile;
    c.timer_file = f.timer_file;
  }
  c.numa_binding = tide::agent::parse_numa_binding(f.numa_binding);
  if (const char* root = std::getenv("TIDE_TOPOLOGY_ROOT"); root && *root) {
    c.topology_root = root;
  }
  if (f.heartbeat_timeout != 0) {
    c.heartbeat_timeout =
        seconds_flag(f.heartbeat_timeout, "--heartbeat-timeout");
  }
  c.prestart.enabled = f.prestart;
  c.prestart.spares = f.prestart_spares;
  c.prestart.imports.clear();
  for (std::string_view m : tide::split(f.prestart_imports, ',')) {
    if (!m.empty() && m != "none") {
      c.prestart.imports.emplace_back(m);
    }
  }
  c.health.timeout =
      seconds_flag(f.health_check_timeout, "--health-check-timeout");
  c.health.backoff =
      seconds_flag(f.health_check_backoff, "--health-check-backoff");
  c.health.max_backoff = std::max(c.health.backoff, c.health.max_backoff);
  if (f.health_check_retries < -1) {
    throw InvalidArgument(
        "--health-check-retries must be -1 (for ever), 0 or more");
  }
  c.health.retries = f.health_check_retries;
  if (!f.health_check.empty()) {
    c.health.checks.push_back(
        tide::agent::command_health_check(f.health_check));
  }
  if (!f.health_check_min_free_disk.empty()) {
    c.health.checks.push_back(
        tide::agent::disk_space_health_check(tide::agent::parse_size(
            f.health_check_min_free_disk, "--health-check-min-free-disk")));
  }
  if (f.standalone) {
    if (c.max_nodes != 1) {
      TIDE_LOG_WARN(
          "--standalone runs one node; ignoring --nnodes={}", f.nnodes);
    }
    c.min_nodes = c.max_nodes = 1;
    c.rdzv_backend = "static";
    c.rdzv_endpoint = "127.0.0.1:0";
    c.run_id = tide::uuid4();
    return c;
  }
  c.rdzv_backend = f.rdzv_backend;
  c.run_id = f.rdzv_id;
  c.rdzv_endpoint = f.rdzv_endpoint;
  if (c.rdzv_backend == "static") {
    if (c.rdzv_endpoint.empty()) {
      c.rdzv_endpoint = f.master_addr + ":" + std::to_string(f.master_port);
    }
    c.rdzv_configs.emplace("rank", std::to_string(f.node_rank.value_or(0)));
    c.rdzv_configs.emplace("timeout", "900");
    if (!f.rank_order.empty() && f.rank_order != "arrival") {
      throw InvalidArgument(
          "--rank-order=" + f.rank_order +
          " needs an elastic rendezvous backend (c10d, etcd): the static "
          "backend's ranks are the nodes' --node-rank");
    }
  } else {
    put_rank_order(f, c);
  }
  if (f.health_check_endpoint && c.rdzv_backend == "static" &&
      f.node_rank.value_or(0) == 0) {
    // Node 0 serves the static backend's store itself, from its rendezvous
    // on: there is nothing to reach before it.
    TIDE_LOG_INFO(
        "--health-check-endpoint: node 0 serves {}; not checked",
        c.rdzv_endpoint);
  } else if (f.health_check_endpoint) {
    if (c.rdzv_endpoint.empty()) {
      throw InvalidArgument("--health-check-endpoint needs --rdzv-endpoint");
    }
    // Without a port, the backend's default one: etcd's, else the store's.
    c.health.checks.push_back(tide::agent::endpoint_health_check(
        c.rdzv_endpoint.find(':') == std::string::npos
            ? c.rdzv_endpoint + (c.rdzv_backend == "etcd" ? ":2379" : ":29400")
            : c.rdzv_endpoint));
  }
  return c;
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
}

void write_own_error_file(
    const tide::agent::RunResult& result, const std::string& summary) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') {
    return;
  }
  tide::launcher::write_error_file_for_launcher(path, result, summary);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "tiderun: launch a fault-tolerant, elastic group of workers, as torchrun "
      "does.\n"
      "Usage: tiderun [OPTIONS] TRAINING_SCRIPT [SCRIPT ARGS...]",
      "tiderun"};
  app.prefix_command();
  app.set_version_flag("--version", std::string("tiderun ") + kVersion);
  Flags flags;
  add_flags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s\n", e.what());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(
        stderr, "%s\ntiderun: error: %s\n", app.help().c_str(), e.what());
    return 2;
  }

  tide::agent::Entrypoint entrypoint;
  LaunchConfig config;
  std::vector<int> signals;
  try {
    entrypoint = make_entrypoint(flags, app.remaining());
    config = make_config(flags);
    for (std::string_view plugin : tide::split(flags.rdzv_plugins, ':')) {
      tide::rendezvous::load_handler_plugin(std::string(plugin));
    }
    for (std::string_view name : tide::split(flags.signals_to_handle, ',')) {
      signals.push_back(signal_number(std::string(name)));
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
  ::signal(SIGPIPE, SIG_IGN);

  // Never destroyed: stopping civetweb's threads takes up to its 2 s poll
  // period, and the process is about to exit anyway.
  tide::launcher::HealthServer* health = nullptr;
  try {
    configure_sinks(flags);
    if (!flags.health_port.empty()) {
      health = new tide::launcher::HealthServer(
          flags.health_port, []() -> std::optional<tide::agent::AgentStatus> {
            std::lock_guard lock(g_health_mutex);
            if (g_health_agent == nullptr) {
              return std::nullopt;
            }
            return g_health_agent->status();
          });
      TIDE_LOG_INFO("health checks on port {} (/health)", health->port());
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
