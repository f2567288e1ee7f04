#include "flags.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tide/agent/numa.h"
#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/common/numbers.h"
#include "tide/common/strings.h"
#include "tide/launcher/slurm.h"

#include "common/random.h"

namespace tiderun {

using tide::InvalidArgument;
using tide::launcher::LaunchConfig;

namespace {

int parse_int(const std::string& text, const char* what) {
  auto v = tide::to_integer<int>(text);
  if (!v) {
    throw InvalidArgument(
        std::string(what) + ": \"" + text + "\" is not an integer");
  }
  return *v;
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

// The devices `dir` lists that `is_device` accepts, without the device
// libraries; as many as the comma-separated `mask` variable names when it
// is set (it narrows what the libraries would show).
int count_devices(
    const char* mask,
    const char* dir,
    const std::function<bool(const std::filesystem::directory_entry&)>&
        is_device) {
  if (const char* m = std::getenv(mask); m != nullptr) {
    return static_cast<int>(tide::split(m, ',').size());
  }
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    n += is_device(e) ? 1 : 0;
  }
  return n;
}

// NVIDIA GPUs: what the driver lists.
int count_gpus() {
  return count_devices(
      "CUDA_VISIBLE_DEVICES", "/proc/driver/nvidia/gpus", [](const auto&) {
        return true;
      });
}

// Intel GPUs (torch's xpu): render nodes of vendor 0x8086.
int count_xpus() {
  return count_devices("ZE_AFFINITY_MASK", "/sys/class/drm", [](const auto& e) {
    std::string vendor;
    return e.path().filename().string().rfind("renderD", 0) == 0 &&
           std::ifstream(e.path() / "device/vendor") >> vendor &&
           vendor == "0x8086";
  });
}

// torch's determine_local_world_size, with its error texts.
int parse_nproc(const std::string& text) {
  int cpus =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (text == "cpu") {
    return cpus;
  }
  if (text == "gpu" || text == "xpu") {
    int n = text == "gpu" ? count_gpus() : count_xpus();
    if (n == 0) {
      throw InvalidArgument(
          std::string(text == "gpu" ? "Cuda" : "Xpu") + " is not available.");
    }
    return n;
  }
  if (text == "auto") {
    int gpus = count_gpus();
    int xpus = gpus > 0 ? 0 : count_xpus();
    return gpus > 0 ? gpus : xpus > 0 ? xpus : cpus;
  }
  auto n = tide::to_integer<int>(text);
  if (!n) {
    // Another device backend's name (torch: a PrivateUse1 plugin) needs that
    // plugin's device count, which only torch can ask.
    throw InvalidArgument(
        "Unsupported nproc_per_node value: " + text +
        " (tiderun counts cpu, gpu and xpu devices itself, or takes a number)");
  }
  if (*n < 1) {
    throw InvalidArgument("--nproc-per-node must be at least 1");
  }
  return *n;
}

// torch's comma_separated_list: ",," is a comma inside an item; items are
// kept as given (an empty one matches every line).
std::vector<std::string> parse_filters(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) {
    return out;
  }
  std::string item;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ',' && i + 1 < text.size() && text[i + 1] == ',') {
      item += ',';
      ++i;
    } else if (text[i] == ',') {
      out.push_back(std::move(item));
      item.clear();
    } else {
      item += text[i];
    }
  }
  out.push_back(std::move(item));
  return out;
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
    auto rank = tide::to_integer<int>(tide::trim(item));
    if (!rank) {
      throw InvalidArgument(
          "--local_ranks_filter must be a comma-separated list of integers "
          "e.g. --local_ranks_filter=0,1,2");
    }
    out.insert(*rank);
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

// The interpreter of a script when PYTHON_EXEC is not set: the virtual
// environment's when tiderun is installed in one (venv/bin/tiderun beside
// venv/pyvenv.cfg, as pip install puts it), as torchrun runs its workers
// with its own interpreter; python3 from PATH otherwise.
std::string default_python() {
  std::error_code ec;
  auto bin = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  if (!ec && std::filesystem::exists(bin.parent_path() / "pyvenv.cfg", ec) &&
      ::access((bin / "python3").c_str(), X_OK) == 0) {
    return (bin / "python3").string();
  }
  return "python3";
}

}  // namespace

// The job secret: TIDE_JOB_SECRET, or the first line of the file
// --rdzv-conf secret_file= names (kept off the command line, which `ps`
// shows); taken out of the backend's settings.
std::string take_job_secret(std::map<std::string, std::string>& conf) {
  auto file = conf.find("secret_file");
  const char* env = std::getenv("TIDE_JOB_SECRET");
  if (file == conf.end()) {
    return env != nullptr ? env : "";
  }
  std::string path = file->second;
  conf.erase(file);
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
      "workers per node: a number, cpu, gpu, xpu or auto");
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
  // A function option, so that "not given" is known (torch's None).
  app.add_option_function<int>(
         "--master-port,--master_port",
         [&f](int port) {
           f.master_port = port;
           f.master_port_given = true;
         },
         "node 0's store port (static backend; default 29500, and a free "
         "port of this machine for a one-node job without an endpoint)")
      ->envname("PET_MASTER_PORT")
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
      "socket (its socket's), exclusive (its own share of a node's CPUs) or "
      "core-complex (one of a node's last-level-cache groups). "
      "The topology is read from the sysfs root in TIDE_TOPOLOGY_ROOT "
      "(default /sys; for tests and unusual machines)");
  opt("--shutdown-timeout,--shutdown_timeout",
      f.shutdown_timeout,
      "PET_SHUTDOWN_TIMEOUT",
      "seconds between a stop signal to the workers and SIGKILL (else "
      "TORCH_ELASTIC_SHUTDOWN_TIMEOUT)");
  opt("--exit-barrier-timeout,--exit_barrier_timeout",
      f.exit_barrier_timeout,
      "PET_EXIT_BARRIER_TIMEOUT",
      "seconds a finished node waits for the others");
  opt("--signals-to-handle,--signals_to_handle",
      f.signals_to_handle,
      "PET_SIGNALS_TO_HANDLE",
      "signals forwarded to the workers (which get the list as "
      "TORCHELASTIC_SIGNALS_TO_HANDLE)");
  opt("--duplicate-stdout-filters,--duplicate_stdout_filters",
      f.duplicate_stdout_filters,
      "PET_DUPLICATE_STDOUT_FILTERS",
      "tee'd stdout lines containing any of these comma-separated strings "
      "(,, for a comma) also go to attempt_<n>/filtered_stdout.log");
  opt("--duplicate-stderr-filters,--duplicate_stderr_filters",
      f.duplicate_stderr_filters,
      "PET_DUPLICATE_STDERR_FILTERS",
      "the same for stderr, to filtered_stderr.log");
  app.add_flag(
         "--virtual-local-rank,--virtual_local_rank",
         f.virtual_local_rank,
         "LOCAL_RANK=0 for every worker, each with CUDA_VISIBLE_DEVICES of its "
         "own device")
      ->envname("PET_VIRTUAL_LOCAL_RANK");
  opt("--event-log-handler,--event_log_handler",
      f.event_log_handler,
      "PET_EVENT_LOG_HANDLER",
      "torch's event handler: null, console (events as JSON lines on "
      "stderr) or dynamic_rendezvous (nothing); see also --events");
  app.add_option(
      "--logs-specs,--logs_specs",
      f.logs_specs,
      "torch's logs specs plugin: only its built-in default (tiderun's "
      "logs are that layout: --log-dir, -r, -t, --local-ranks-filter)");
  app.add_flag(
         "--file-timer,--file_timer",
         f.file_timer,
         "serve expiration timers to the workers on a FIFO "
         "(TORCHELASTIC_TIMER_FILE)")
      ->envname("TORCHELASTIC_ENABLE_FILE_TIMER");
  app.add_flag(
         "--store-fan-in,--store_fan_in",
         f.store_fan_in,
         "the workers reach the job's store through this node's agent, "
         "which forwards their requests over one connection and asks "
         "identical reads and waits once for them all "
         "(docs/store-fan-in.md); MASTER_ADDR:MASTER_PORT is then the "
         "agent's fan-in on 127.0.0.1")
      ->envname("PET_STORE_FAN_IN");
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
  opt("--checkpoint-memory,--checkpoint_memory",
      f.checkpoint_memory,
      "PET_CHECKPOINT_MEMORY",
      "memory of /dev/shm this node reserves for its workers' in-memory "
      "checkpoints (tide.checkpoint), e.g. 4G; two snapshots per local rank, "
      "or with --nnodes above 1 three and two copies of a peer node's "
      "(default: none)");
  opt("--checkpoint-dir,--checkpoint_dir",
      f.checkpoint_dir,
      "PET_CHECKPOINT_DIR",
      "where each rank's latest in-memory snapshot is also written, behind "
      "the training, as files torch.load reads "
      "(DIR/rank-R/step-N.pt); the latest is written before tiderun exits");
  opt("--checkpoint-keep,--checkpoint_keep",
      f.checkpoint_keep,
      "PET_CHECKPOINT_KEEP",
      "snapshots kept per rank in --checkpoint-dir")
      ->check(CLI::PositiveNumber);
  opt("--replica-groups,--replica_groups",
      f.replica_groups,
      "PET_REPLICA_GROUPS",
      "run this many replica groups of the job on this host, each a tiderun "
      "of --nproc-per-node workers, agreeing on every step through a store "
      "this tiderun serves (tide.ft; one group's failure restarts that group "
      "alone)")
      ->check(CLI::PositiveNumber);
  opt("--ft-store,--ft_store",
      f.ft_store,
      "PET_FT_STORE",
      "per-step fault tolerance (tide.ft): the store where this job's replica "
      "groups agree on each step, HOST:PORT[/JOB] of a tide store or "
      "etcd:HOST:PORT[,...][/JOB]; this node's workers are one group, and "
      "the agent declares an attempt out the moment it ends");
  opt("--replica-group-id,--replica_group_id",
      f.replica_group_id,
      "PET_REPLICA_GROUP_ID",
      "this replica group's id (REPLICA_GROUP_ID), with --ft-store");
  opt("--num-replica-groups,--num_replica_groups",
      f.num_replica_groups,
      "PET_NUM_REPLICA_GROUPS",
      "the job's replica groups (NUM_REPLICA_GROUPS): the first quorum waits "
      "for them all")
      ->check(CLI::PositiveNumber);
  opt("--min-replica-size,--min_replica_size",
      f.min_replica_size,
      "PET_MIN_REPLICA_SIZE",
      "a step commits only with this many replica groups in its quorum")
      ->check(CLI::PositiveNumber);
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
      "serve the live job page (/), its JSON (/api/job), GET /health and "
      "/metrics on [HOST:]PORT");
  opt("--status-interval,--status_interval",
      f.status_interval,
      "TIDE_STATUS_INTERVAL",
      "seconds between this node's status records in the rendezvous store "
      "(tiderun status, the live page; 0: none)");
  opt("--straggler-threshold,--straggler_threshold",
      f.straggler_threshold,
      "TIDE_STRAGGLER_THRESHOLD",
      "a rank whose step-time score falls below this (0 to 1) is flagged as "
      "a straggler: an event and a metric");
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
  bool is_py =
      script.size() > 3 && script.compare(script.size() - 3, 3, ".py") == 0;
  bool direct = f.no_python || (!f.module && !f.run_path && !is_py &&
                                script.find('/') != std::string::npos &&
                                ::access(script.c_str(), X_OK) == 0);
  if (direct) {
    argv.push_back(script);
  } else {
    const char* py = std::getenv("PYTHON_EXEC");
    std::string python = py && *py ? py : default_python();
    if (f.module) {
      argv = {python, "-u", "-m", script};
    } else {
      argv = {python, "-u", script};
    }
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return tide::agent::Command{std::move(argv)};
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
  c.duplicate_stdout_filters = parse_filters(f.duplicate_stdout_filters);
  c.duplicate_stderr_filters = parse_filters(f.duplicate_stderr_filters);
  c.virtual_local_rank = f.virtual_local_rank;
  if (const char* t = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")) {
    c.log_line_prefix_template = t;
  }
  if (!f.logs_specs.empty() && f.logs_specs != "default") {
    throw InvalidArgument(
        "Could not find entrypoint under 'torchrun.logs_specs[" + f.logs_specs +
        "]' key: torch's logs specs are Python plugins; tiderun writes "
        "torch's default layout (--log-dir, -r, -t, --local-ranks-filter, "
        "--duplicate-stdout-filters)");
  }
  c.rdzv_configs = parse_rdzv_conf(f.rdzv_conf);
  c.job_secret = take_job_secret(c.rdzv_configs);
  c.local_addr = f.local_addr;
  if (f.shutdown_timeout < 0) {
    throw InvalidArgument(fmt::format(
        "shutdown_timeout must be non-negative, got {}", f.shutdown_timeout));
  }
  c.shutdown_grace = std::chrono::milliseconds(
      static_cast<int64_t>(f.shutdown_timeout * 1000 + 0.5));
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
  c.status_interval =
      f.status_interval == 0
          ? std::chrono::milliseconds(0)
          : seconds_flag(f.status_interval, "--status-interval");
  if (!(f.straggler_threshold > 0 && f.straggler_threshold <= 1)) {
    throw InvalidArgument(
        "--straggler-threshold must be in (0, 1], not " +
        std::to_string(f.straggler_threshold));
  }
  c.straggler_threshold = f.straggler_threshold;
  if (!f.checkpoint_memory.empty()) {
    c.checkpoints.memory =
        tide::agent::parse_size(f.checkpoint_memory, "--checkpoint-memory");
  }
  if (!f.checkpoint_dir.empty() && c.checkpoints.memory == 0) {
    throw InvalidArgument(
        "--checkpoint-dir writes the snapshots held in memory: give "
        "--checkpoint-memory too");
  }
  c.checkpoints.dir = f.checkpoint_dir;
  if (f.ft_store.empty() != f.replica_group_id.empty()) {
    throw InvalidArgument(
        "--ft-store and --replica-group-id go together: the store where the "
        "replica groups meet, and which one this node's workers are");
  }
  c.replica_group = {
      .store = f.ft_store,
      .id = f.replica_group_id,
      .groups = f.num_replica_groups,
      .min_size = f.min_replica_size};
  c.checkpoints.keep = f.checkpoint_keep;
  const char* py = std::getenv("PYTHON_EXEC");
  c.checkpoints.python = py && *py ? py : default_python();
  c.prestart.enabled = f.prestart;
  c.store_fan_in = f.store_fan_in;
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
  // torchrun 2.x: a one-node static job given no port and no endpoint runs
  // as --standalone does, on a free port, instead of taking 29500 from
  // another job on this machine (keeping a run id it was given).
  bool implicit_standalone = f.rdzv_backend == "static" &&
                             f.rdzv_endpoint.empty() && !f.master_port_given &&
                             c.max_nodes == 1;
  if (f.standalone || implicit_standalone) {
    if (c.max_nodes != 1) {
      TIDE_LOG_WARN(
          "--standalone runs one node; ignoring --nnodes={}", f.nnodes);
    }
    c.min_nodes = c.max_nodes = 1;
    c.rdzv_backend = "static";
    c.rdzv_endpoint = "127.0.0.1:0";
    c.run_id = f.standalone || f.rdzv_id == "none" ? tide::uuid4() : f.rdzv_id;
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

void apply_slurm(const CLI::App& app, Flags& f) {
  const char* setting = std::getenv("TIDE_SLURM");
  if (f.standalone || (setting != nullptr && std::string(setting) == "0")) {
    return;
  }
  auto step = tide::launcher::slurm_step();
  if (!step) {
    return;
  }
  auto given = [&](const char* flag) { return app.count(flag) > 0; };
  if (step->tasks_on_node > 1) {
    throw InvalidArgument(
        "srun started " + std::to_string(step->tasks_on_node) +
        " tasks on this node (SLURM_TASKS_PER_NODE); tiderun starts the "
        "workers itself: run one tiderun per node (srun --ntasks-per-node=1) "
        "and give --nproc-per-node");
  }
  std::vector<std::string> derived;
  auto derive = [&](const char* flag, std::string& var, std::string value) {
    if (!given(flag)) {
      var = std::move(value);
      derived.push_back(std::string(flag) + "=" + var);
    }
  };
  derive("--nnodes", f.nnodes, std::to_string(step->num_nodes));
  derive("--rdzv-backend", f.rdzv_backend, "c10d");
  if (!given("--node-rank")) {
    f.node_rank = step->node_id;
    derived.push_back("--node-rank=" + std::to_string(step->node_id));
  }
  std::string head = step->nodes.empty() ? "" : step->nodes.front();
  if (f.rdzv_backend == "static") {
    if (!given("--master-addr") && !head.empty()) {
      derive("--master-addr", f.master_addr, head);
    }
  } else if (f.rdzv_backend == "c10d") {
    // The store on the job's first node, whose node id is 0.
    if (!given("--rdzv-endpoint")) {
      if (head.empty()) {
        throw InvalidArgument(
            "under srun without SLURM_JOB_NODELIST: give --rdzv-endpoint");
      }
      derive(
          "--rdzv-endpoint",
          f.rdzv_endpoint,
          head + ":" +
              std::to_string(given("--master-port") ? f.master_port : 29400));
      if (f.rdzv_conf.find("is_host=") == std::string::npos) {
        std::string is_host =
            std::string("is_host=") + (step->node_id == 0 ? "true" : "false");
        f.rdzv_conf += (f.rdzv_conf.empty() ? "" : ",") + is_host;
        derived.push_back("--rdzv-conf " + is_host);
      }
    }
    derive("--rank-order", f.rank_order, "node-rank");
  }
  if (f.rdzv_backend != "static") {
    derive("--rdzv-id", f.rdzv_id, step->job_id);
  }
  TIDE_LOG_INFO(
      "Slurm job {}, node {} of {}: {} (flags and PET_* variables win; "
      "TIDE_SLURM=0 turns this off)",
      step->job_id,
      step->node_id,
      step->num_nodes,
      derived.empty() ? std::string("nothing derived, every flag given")
                      : fmt::format("derived {}", fmt::join(derived, " ")));
}

void apply_environment(const CLI::App& app, Flags& f) {
  auto given = [&](const char* flag) { return app.count(flag) > 0; };
  // torch's LaunchConfig: --shutdown-timeout, PET_SHUTDOWN_TIMEOUT, then
  // this legacy variable, then 30 s.
  const char* legacy = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  if (!given("--shutdown-timeout") && legacy != nullptr && *legacy != '\0') {
    char* end = nullptr;
    double s = std::strtod(legacy, &end);
    if (end == legacy || *end != '\0') {
      throw InvalidArgument(
          std::string("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=") + legacy +
          " is not a number of seconds");
    }
    f.shutdown_timeout = s;
  }
  // torch reads TORCHELASTIC_HEALTH_CHECK_PORT for a health server that
  // does nothing in its open-source build; tiderun serves /health there
  // unless --health-port (PET_HEALTH_PORT) says where.
  const char* port = std::getenv("TORCHELASTIC_HEALTH_CHECK_PORT");
  if (!given("--health-port") && port != nullptr && *port != '\0') {
    auto p = tide::to_integer<int>(port);
    if (!p || *p < 0 || *p > 65535) {
      TIDE_LOG_WARN(
          "Invalid healthcheck port value: '{}', expecting integer. Not "
          "starting healthcheck server.",
          port);
    } else {
      f.health_port = port;
    }
  }
}

}  // namespace tiderun
