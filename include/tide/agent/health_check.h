#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tide/common/error.h"

// Node health checks: run by the agent before this node joins a rendezvous
// and before every re-rendezvous, so a node with a full disk, a dead link
// or a missing device stays out of the job instead of failing it minutes
// later (tiderun --health-check; docs/tiderun.md#health-checks).
//
//   spec.health.checks.push_back(tide::agent::command_health_check(
//       "nvidia-smi -L && test -w /scratch"));
//   spec.health.checks.push_back(
//       tide::agent::disk_space_health_check(10ull << 30));
namespace tide::agent {

struct HealthCheckResult {
  bool healthy = true;
  // Why not (a command's output, what was missing); may say why yes.
  std::string detail;
};

// What a check may want to know about the node's run.
struct HealthCheckContext {
  // The run's log directory (<log_dir>/<run_id>_<random>).
  std::string log_dir;
  // Each check must be done by then; a check past it counts as failed.
  std::chrono::milliseconds timeout{60'000};
};

// A check of this node. Implementations are called from the agent's
// thread, one at a time.
class HealthCheck {
 public:
  virtual ~HealthCheck() = default;
  // A short name for logs, events and metrics: "command", "disk_space".
  virtual std::string name() const = 0;
  virtual HealthCheckResult run(const HealthCheckContext& context) = 0;
};

// Healthy when `/bin/sh -c command` exits 0 within the timeout; the detail
// is its output (stdout and stderr, the last 4 KiB).
std::shared_ptr<HealthCheck> command_health_check(std::string command);
// Healthy when the file system of `dir` (empty: the run's log directory)
// has at least min_free_bytes available.
std::shared_ptr<HealthCheck> disk_space_health_check(
    uint64_t min_free_bytes, std::string dir = "");
// Healthy when a TCP connection to host:port opens within the timeout (the
// rendezvous endpoint: the store, or etcd).
std::shared_ptr<HealthCheck> endpoint_health_check(std::string host_port);

// When checks run and what a failure does.
struct HealthCheckPolicy {
  std::vector<std::shared_ptr<HealthCheck>> checks;
  // Per check.
  std::chrono::milliseconds timeout{60'000};
  // After a failed check: run them all again this many times (-1: for
  // ever), waiting `backoff` first, doubled each time up to max_backoff;
  // then the agent gives up (HealthCheckError).
  int retries = 0;
  std::chrono::milliseconds backoff{5'000};
  std::chrono::milliseconds max_backoff{60'000};
};

// This node failed its health checks and gave up: it did not join.
class HealthCheckError : public Error {
 public:
  using Error::Error;
};

// Parses a size such as "512M", "10G", "1.5T" or a plain byte count
// (powers of 1024). Throws InvalidArgument naming `what`.
uint64_t parse_size(const std::string& text, const char* what);

}  // namespace tide::agent
