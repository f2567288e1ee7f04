#include "status.h"

#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "tide/common/error.h"
#include "tide/common/strings.h"
#include "tide/rendezvous/registry.h"
#include "tide/status/job_status.h"

#include "cli.h"
#include "flags.h"
#include "status_table.h"

namespace tiderun {

namespace {

struct StatusFlags {
  std::string rdzv_backend = "c10d";
  std::string rdzv_endpoint;
  std::string rdzv_id;
  std::string rdzv_conf;
  bool json = false;
  double timeout = 10;
  double straggler_threshold = 0.7;
};

int exit_code(const std::string& state) {
  if (state == "HEALTHY" || state == "SUCCEEDED") {
    return kStatusHealthy;
  }
  if (state == "FAILED" || state == "STOPPED") {
    return kStatusFailed;  // over, and not a success
  }
  if (state == "UNKNOWN") {
    return kStatusNoRecords;
  }
  return kStatusDegraded;  // DEGRADED, RESTARTING, STARTING
}

}  // namespace

int status_main(int argc, char** argv) {
  CLI::App app{
      "tiderun status: print a running job as its agents' status records in "
      "the rendezvous store show it (nodes, ranks, restarts, heartbeats, "
      "step times, stragglers).\n"
      "Exit status: 0 healthy or succeeded, 1 degraded, restarting or "
      "starting (a node silent, a straggler, a group restarting), 2 bad "
      "flags, 3 failed or stopped, 4 no records (no such job, or not "
      "started), 5 the store cannot be read. Only the nodes of the current "
      "round count.",
      "tiderun status"};
  StatusFlags f;
  app.add_option(
         "--rdzv-endpoint,--rdzv_endpoint",
         f.rdzv_endpoint,
         "the job's --rdzv-endpoint: HOST[:PORT] of its c10d store, or etcd's "
         "HOST:PORT[,...]")
      ->required();
  app.add_option("--rdzv-id,--rdzv_id", f.rdzv_id, "the job's --rdzv-id")
      ->required();
  app.add_option(
         "--rdzv-backend,--rdzv_backend", f.rdzv_backend, "c10d or etcd")
      ->default_val("c10d");
  app.add_option(
      "--rdzv-conf,--rdzv_conf",
      f.rdzv_conf,
      "the job's --rdzv-conf (etcd_prefix=, secret_file=)");
  app.add_flag("--json", f.json, "print the view as JSON");
  app.add_option(
         "--timeout", f.timeout, "seconds to reach the store and read it")
      ->default_val(10);
  app.add_option(
         "--straggler-threshold,--straggler_threshold",
         f.straggler_threshold,
         "flag ranks whose step-time score is below this (0 to 1)")
      ->default_val(0.7);
  if (auto done = tide::apps::parse_command_line(app, argc, argv)) {
    return *done == 0 ? 0 : kStatusUsage;
  }

  tide::rendezvous::RendezvousParameters params{
      .backend = f.rdzv_backend,
      .endpoint = f.rdzv_endpoint,
      .run_id = f.rdzv_id,
  };
  try {
    if (!(f.timeout > 0)) {
      throw tide::InvalidArgument("--timeout must be a positive number");
    }
    if (!(f.straggler_threshold > 0 && f.straggler_threshold <= 1)) {
      throw tide::InvalidArgument("--straggler-threshold must be in (0, 1]");
    }
    for (std::string_view kv : tide::split(f.rdzv_conf, ',')) {
      if (kv.empty()) {
        continue;
      }
      auto eq = kv.find('=');
      if (eq == std::string_view::npos) {
        throw tide::InvalidArgument(
            "--rdzv-conf: expected key=value, got \"" + std::string(kv) + "\"");
      }
      params.config[std::string(kv.substr(0, eq))] =
          std::string(kv.substr(eq + 1));
    }
    // As the job's own agents read it.
    params.token = take_job_secret(params.config);
    if (f.rdzv_backend != "c10d" && f.rdzv_backend != "etcd") {
      throw tide::InvalidArgument(
          "--rdzv-backend=" + f.rdzv_backend +
          ": only c10d and etcd jobs keep status records");
    }
  } catch (const tide::InvalidArgument& e) {
    std::fprintf(stderr, "tiderun status: error: %s\n", e.what());
    return kStatusUsage;
  }

  tide::status::JobView view;
  try {
    auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(f.timeout * 1000));
    auto store = tide::rendezvous::open_job_store(params, timeout);
    view =
        tide::status::read_job_view(*store, f.rdzv_id, f.straggler_threshold);
  } catch (const std::exception& e) {
    std::fprintf(
        stderr,
        "tiderun status: cannot read job %s's status from %s: %s\n",
        f.rdzv_id.c_str(),
        f.rdzv_endpoint.c_str(),
        e.what());
    return kStatusUnreachable;
  }
  if (f.json) {
    std::printf("%s\n", tide::status::to_json(view).c_str());
  } else if (view.nodes.empty()) {
    std::printf(
        "job %s: no status records at %s (no such --rdzv-id, not started "
        "yet, or its agents run with --status-interval 0)\n",
        f.rdzv_id.c_str(),
        f.rdzv_endpoint.c_str());
  } else {
    std::printf("%s", format_job_view(view).c_str());
  }
  return exit_code(view.state);
}

}  // namespace tiderun
