#pragma once

#include <functional>
#include <memory>
#include <string>

#include "tide/agent/local_elastic_agent.h"

namespace tide::launcher {

// What a HealthServer shows, each from the caller.
struct HealthSources {
  // The agent's current snapshot (GET /health), nullopt before the agent
  // exists.
  std::function<std::optional<agent::AgentStatus>()> status;
  // The job's view as JSON (GET /api/job, tide/status/job_status.h's
  // to_json(JobView)); may throw, which answers 503 with the error. Null:
  // no job view.
  std::function<std::string()> job;
  // The directory of local rank's output files in the current attempt
  // (LocalElasticAgent::worker_log_dir; GET /api/log), "" when none.
  std::function<std::string(int local_rank)> log_dir;
};

// A small HTTP server, read-only, on the agent's health port (torch's health
// check server is a stub), running on its own threads (civetweb):
//   GET /          the live job page (src/launcher/page/job.html)
//   GET /api/job   the job's view, JSON
//   GET /api/timeline.svg  the job view's timeline, drawn (src/timeline)
//   GET /api/log?rank=L&lines=N  the tail of local rank L's output files
//   GET /health    the agent's status as JSON: 200 while it is starting,
//                  running or done well, 503 once it failed or was stopped
class HealthServer {
 public:
  // `address` is "[host:]port" (a bare port listens on every interface, for
  // probes from other hosts). Throws NetworkError when it cannot listen.
  HealthServer(const std::string& address, HealthSources sources);
  ~HealthServer();
  uint16_t port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The JSON the endpoint serves for a snapshot.
std::string status_json(const agent::AgentStatus& s);

}  // namespace tide::launcher
