#pragma once

// tiderun's command line: its flags (torchrun's, with their PET_*
// variables, and tiderun's own) and what they make: the launcher's
// configuration and the workers' entrypoint.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tide/agent/worker_spec.h"
#include "tide/launcher/launcher.h"
#include "tide/store/tcp_store.h"

namespace tiderun {

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
  std::string duplicate_stdout_filters;  // torch's comma list, ",," a comma
  std::string duplicate_stderr_filters;
  bool virtual_local_rank = false;
  std::string event_log_handler = "null";
  std::string logs_specs;
  bool master_port_given = false;  // flag or PET_MASTER_PORT
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
  double status_interval = 5;
  double straggler_threshold = 0.7;
  bool prestart = false;
  bool store_fan_in = false;
  int prestart_spares = 0;
  std::string prestart_imports = "torch,torch.distributed";
  std::string checkpoint_memory;
  std::string checkpoint_dir;
  int checkpoint_keep = 2;
  int replica_groups = 1;
  std::string ft_store;
  std::string replica_group_id;
  int num_replica_groups = 1;
  int min_replica_size = 1;
  std::string health_check;
  double health_check_timeout = 60;
  int health_check_retries = 0;
  double health_check_backoff = 5;
  std::string health_check_min_free_disk;
  bool health_check_endpoint = false;
};

// The job secret: TIDE_JOB_SECRET, or the first line of the file the
// secret_file key of `conf` (--rdzv-conf) names, which is taken out of
// `conf`. Throws tide::InvalidArgument when both are given or the file has
// no secret.
std::string take_job_secret(std::map<std::string, std::string>& conf);

// Declares every flag on `app`, stored in `f`.
void add_flags(CLI::App& app, Flags& f);

// The workers' command: the script with python, as a module, or exec'd.
tide::agent::Entrypoint make_entrypoint(
    const Flags& f, const std::vector<std::string>& rest);

// The launcher's configuration. Throws tide::InvalidArgument, naming the
// flag, for a bad value.
tide::launcher::LaunchConfig make_config(const Flags& f);

// The variables torchrun 2.x reads besides PET_*, where no flag (or its
// PET_* variable) gave the setting: TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
// TORCHELASTIC_HEALTH_CHECK_PORT (a bad value is warned about and
// ignored, as torch does). Throws InvalidArgument for a malformed value.
void apply_environment(const CLI::App& app, Flags& f);

// Under srun (docs/clusters.md): what torchrun users spell out, derived from
// Slurm's variables where neither a flag nor its PET_* variable gives it
// (nodes, node rank, the c10d endpoint on the first node, the run id from
// the job id), and logged. TIDE_SLURM=0 turns it off. Throws
// InvalidArgument when srun started several tasks on this node.
void apply_slurm(const CLI::App& app, Flags& f);

// "SIGTERM" or "TERM" -> its number; InvalidArgument otherwise.
int signal_number(const std::string& name);

}  // namespace tiderun
