// Your own metric and event handlers: every metric and event the agent
// emits while it runs a small job reaches them. This one keeps the latest
// value of each metric and counts events by name, then prints both.
//
//   custom_handlers
#include <cstdio>
#include <map>
#include <mutex>

#include "tide/agent/local_elastic_agent.h"
#include "tide/events/events.h"
#include "tide/metrics/metrics.h"
#include "tide/rendezvous/registry.h"

namespace {

class LatestValues : public tide::metrics::MetricHandler {
 public:
  void emit(const tide::metrics::MetricData& d) override {
    std::lock_guard lock(mutex_);
    latest_[d.group_name + "/" + d.name] = d.value;
  }
  void print() {
    std::lock_guard lock(mutex_);
    for (const auto& [name, value] : latest_) {
      std::printf(
          "  metric %s = %lld\n", name.c_str(), static_cast<long long>(value));
    }
  }

 private:
  std::mutex mutex_;
  std::map<std::string, int64_t> latest_;
};

class CountByName : public tide::events::EventHandler {
 public:
  void handle(const tide::events::Event& e) override {
    std::lock_guard lock(mutex_);
    ++counts_[e.name];
  }
  void handle(const tide::events::RdzvEvent& e) override {
    std::lock_guard lock(mutex_);
    ++counts_["rdzv: " + e.message.substr(0, e.message.find(':'))];
  }
  void print() {
    std::lock_guard lock(mutex_);
    for (const auto& [name, n] : counts_) {
      std::printf("  event %s x%d\n", name.c_str(), n);
    }
  }

 private:
  std::mutex mutex_;
  std::map<std::string, int> counts_;
};

}  // namespace

int main() {
  auto metrics = std::make_shared<LatestValues>();
  auto events = std::make_shared<CountByName>();
  tide::metrics::configure(metrics);
  tide::events::configure(events);

  std::shared_ptr<tide::rendezvous::RendezvousHandler> handler =
      tide::rendezvous::handler_registry().create(
          {.backend = "static",
           .endpoint = "127.0.0.1:0",
           .run_id = "handlers"});
  // Two workers; local rank 1 fails once, so the run restarts.
  tide::agent::LocalElasticAgent agent({
      .local_world_size = 2,
      .entrypoint =
          tide::agent::Command{
              {"/bin/sh",
               "-c",
               "[ $TORCHELASTIC_RESTART_COUNT = 0 ] && "
               "[ $LOCAL_RANK = 1 ] && exit 1; exit 0"}},
      .rdzv_handler = handler,
      .max_restarts = 1,
  });
  auto result = agent.run();
  handler->shutdown();
  std::printf(
      "run %s; what the handlers saw:\n", tide::agent::to_string(result.state));
  metrics->print();
  events->print();
  return result.is_failed() ? 1 : 0;
}
