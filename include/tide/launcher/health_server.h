#pragma once

#include <functional>
#include <memory>
#include <string>

#include "tide/agent/local_elastic_agent.h"

namespace tide::launcher {

// A small HTTP server for health probes (torch's health check server is a
// stub): GET /health answers the agent's status as JSON, with 200 while the
// agent is starting, running or done well, and 503 once it failed or was
// stopped. Runs on its own threads (civetweb).
class HealthServer {
 public:
  // `address` is "[host:]port" (a bare port listens on every interface, for
  // probes from other hosts). `status` returns the current snapshot, or
  // nullopt before the agent exists. Throws NetworkError when it cannot
  // listen.
  HealthServer(
      const std::string& address,
      std::function<std::optional<agent::AgentStatus>()> status);
  ~HealthServer();
  uint16_t port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The JSON the endpoint serves for a snapshot.
std::string status_json(const agent::AgentStatus& s);

}  // namespace tide::launcher
