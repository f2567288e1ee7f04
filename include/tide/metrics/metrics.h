#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "tide/common/error.h"

// Metrics (torch.distributed.elastic.metrics): named integer values the
// agent, the rendezvous and the timers put, sent to a pluggable handler per
// group. Nothing is kept by default (the null handler), as in torch.
//
//   tide::metrics::configure(std::make_shared<tide::metrics::ConsoleMetricHandler>());
//   tide::metrics::put_metric("workers.default.remaining_restarts", 3);
//   {
//     auto p = tide::metrics::profile("MyAgent.rendezvous");  // .duration.ms,
//     do_rendezvous();                                        // .success /
//     .failure
//   }
namespace tide::metrics {

constexpr const char* kDefaultGroup = "torchelastic";

struct MetricData {
  double timestamp = 0;  // seconds since the epoch
  std::string group_name;
  std::string name;
  int64_t value = 0;
};

// Receives every metric of the groups it is configured for. emit() may be
// called from any thread; implementations are thread safe.
class MetricHandler {
 public:
  virtual ~MetricHandler() = default;
  virtual void emit(const MetricData& data) = 0;
};

class NullMetricHandler final : public MetricHandler {
 public:
  void emit(const MetricData&) override {}
};

// Prints "[<timestamp>][<group>]: <name>=<value>" to stdout, as torch's does.
class ConsoleMetricHandler final : public MetricHandler {
 public:
  void emit(const MetricData& data) override;
};

// Serves the process's metrics in Prometheus' text format over HTTP
// (prometheus-cpp) at http://<address>/metrics: the native ones
// (registry.h) and the ones put here. Each metric put becomes a gauge of its
// last value and a counter of the positive values put (_total), named by
// Prometheus' conventions with torch's name in a label:
// workers.<role>.<what> -> tide_<group>_workers_<what>{role="<role>",
// metric="workers.<role>.<what>"} and tide_<group>_workers_<what>_total.
// Words become snake_case ("SimpleElasticAgent._rendezvous.success" ->
// tide_torchelastic_simple_elastic_agent_rendezvous_success), and
// health_check.<check>.<what> gets a check label.
class PrometheusMetricHandler final : public MetricHandler {
 public:
  // `address` is "host:port" ("127.0.0.1:9090"; port 0 picks one). Throws
  // NetworkError when it cannot listen.
  explicit PrometheusMetricHandler(const std::string& address);
  ~PrometheusMetricHandler() override;
  void emit(const MetricData& data) override;
  // The port it listens on.
  uint16_t port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Sets the handler of `group`, or the default handler of all groups without
// one when group is empty. Thread safe.
void configure(
    std::shared_ptr<MetricHandler> handler, const std::string& group = "");

// Emits a metric now. Thread safe; cheap with the null handler.
void put_metric(
    const std::string& name,
    int64_t value,
    const std::string& group = kDefaultGroup);

// Records how long a scope took and whether it ended by an exception:
// <key>.duration.ms, and <key>.success=1 or <key>.failure=1 (torch's @prof).
class Profile {
 public:
  explicit Profile(std::string key, std::string group = kDefaultGroup);
  ~Profile();
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;

 private:
  std::string key_;
  std::string group_;
  double start_;
  int exceptions_;
};

[[nodiscard]] inline Profile profile(
    std::string key, std::string group = kDefaultGroup) {
  return Profile(std::move(key), std::move(group));
}

}  // namespace tide::metrics
