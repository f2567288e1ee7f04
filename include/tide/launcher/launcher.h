#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "tide/agent/local_elastic_agent.h"
#include "tide/agent/worker_spec.h"

// The launcher behind tiderun (torch's torch.distributed.launcher.api):
// a LaunchConfig, the agent it runs, and torchrun's failure summary.
namespace tide::launcher {

struct LaunchConfig {
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  std::string run_id = "none";
  std::string role = "default";
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::map<std::string, std::string> rdzv_configs;
  std::string local_addr;
  int max_restarts = 0;
  std::chrono::milliseconds monitor_interval{100};
  agent::StartMethod start_method = agent::StartMethod::kSpawn;
  std::string log_dir;
  agent::StdSpec redirects;
  agent::StdSpec tee;
  std::set<int> local_ranks_filter;
  std::chrono::milliseconds shutdown_grace{30'000};
  std::chrono::milliseconds exit_barrier_timeout{300'000};
  agent::WorkerSpec::Timer timer = agent::WorkerSpec::Timer::kNone;
  std::string timer_file;
};

// The outcome of launch(): the agent's result, or the signal that stopped it.
struct LaunchResult {
  agent::RunResult result;
  int stopped_by_signal = 0;
};

// Runs one node's agent to the end: makes the rendezvous handler, runs the
// agent, shuts the rendezvous down (unless a signal stopped the agent, so
// other nodes may go on). `on_agent` sees the agent before it runs (to
// forward signals to it). Throws what the rendezvous throws.
LaunchResult launch(
    const LaunchConfig& config,
    const agent::Entrypoint& entrypoint,
    const std::function<void(agent::LocalElasticAgent*)>& on_agent = {});

// torchrun's ChildFailedError text for a failed result: root cause first,
// then the other failures, in torch's layout.
std::string format_failure_summary(
    const std::string& entrypoint_name, const agent::RunResult& result);

// Writes torchrun's own error file (its TORCHELASTIC_ERROR_FILE): the
// root-cause worker's error JSON with message.errorCode set to its exit
// code, or, when that worker wrote none, a record holding `summary`.
void write_error_file_for_launcher(
    const std::string& path,
    const agent::RunResult& result,
    const std::string& summary);

}  // namespace tide::launcher
