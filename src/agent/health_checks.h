#pragma once

// Health checks before each rendezvous (docs/tiderun.md#health-checks): the
// node runs WorkerSpec::health's checks and joins only when all pass;
// otherwise it retries with backoff, and gives up (HealthCheckError) after
// the policy's retries.
//
// Thread safety: the agent's thread.
#include <functional>

#include "agent/component.h"
#include "common/clock.h"

namespace tide::agent::detail {

class Reporter;

class HealthChecks final : public Component {
 public:
  // `pause` waits until a time, and throws once a stop is requested.
  HealthChecks(
      const AgentView& view,
      const Reporter& reporter,
      std::function<void(Clock::time_point)> pause);

  // Throws HealthCheckError when the node gives up.
  void before_rendezvous() override;

 private:
  const AgentView& view_;
  const Reporter& reporter_;
  std::function<void(Clock::time_point)> pause_;
};

}  // namespace tide::agent::detail
