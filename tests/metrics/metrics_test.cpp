#include "tide/metrics/metrics.h"

#include <mutex>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "tide/metrics/registry.h"

#include "support/http.h"

namespace tide::metrics {
namespace {

struct Recorder : MetricHandler {
  std::mutex mutex;
  std::vector<MetricData> seen;
  void emit(const MetricData& d) override {
    std::lock_guard lock(mutex);
    seen.push_back(d);
  }
  std::optional<int64_t> value(const std::string& name) {
    std::lock_guard lock(mutex);
    for (auto it = seen.rbegin(); it != seen.rend(); ++it) {
      if (it->name == name) {
        return it->value;
      }
    }
    return std::nullopt;
  }
};

class MetricsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    configure(nullptr);
    configure(nullptr, "special");
  }
};

TEST_F(MetricsTest, PutMetricReachesTheHandlerOfItsGroup) {
  auto all = std::make_shared<Recorder>();
  auto special = std::make_shared<Recorder>();
  configure(all);
  configure(special, "special");
  put_metric("a", 3);
  put_metric("b", 4, "special");
  ASSERT_EQ(all->seen.size(), 1u);
  EXPECT_EQ(all->seen[0].group_name, "torchelastic");
  EXPECT_EQ(all->seen[0].name, "a");
  EXPECT_EQ(all->seen[0].value, 3);
  EXPECT_GT(all->seen[0].timestamp, 1.6e9);
  ASSERT_EQ(special->seen.size(), 1u);
  EXPECT_EQ(special->seen[0].name, "b");
}

TEST_F(MetricsTest, ProfileRecordsDurationAndSuccessOrFailure) {
  auto rec = std::make_shared<Recorder>();
  configure(rec);
  { auto p = profile("Agent.ok"); }
  try {
    auto p = profile("Agent.bad");
    throw std::runtime_error("x");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(rec->value("Agent.ok.success"), 1);
  EXPECT_TRUE(rec->value("Agent.ok.duration.ms").has_value());
  EXPECT_FALSE(rec->value("Agent.ok.failure").has_value());
  EXPECT_EQ(rec->value("Agent.bad.failure"), 1);
  EXPECT_FALSE(rec->value("Agent.bad.success").has_value());
}

TEST_F(MetricsTest, PrometheusHandlerServesConventionalNamesAndNativeMetrics) {
  // The registry is the process's: this test's role and names are its own.
  auto prom = std::make_shared<PrometheusMetricHandler>("127.0.0.1:0");
  configure(prom);
  put_metric("workers.metrics_test.remaining_restarts", 3);
  put_metric("workers.metrics_test.remaining_restarts", 2);
  put_metric("MetricsTestAgent._rendezvous.success", 1);
  put_metric("MetricsTestAgent._rendezvous.success", 1);
  counter("tide_metrics_test_native_total", "a native metric").inc();
  auto r = test::http_get(prom->port(), "/metrics");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  for (const char* line : {
           // The role is a label; the last value is a gauge.
           "tide_torchelastic_workers_remaining_restarts{metric=\"workers."
           "metrics_test.remaining_restarts\",role=\"metrics_test\"} 2\n",
           // The sum of the values is a counter, _total.
           "tide_torchelastic_workers_remaining_restarts_total{metric="
           "\"workers."
           "metrics_test.remaining_restarts\",role=\"metrics_test\"} 5\n",
           "tide_torchelastic_metrics_test_agent_rendezvous_success_total{"
           "metric=\"MetricsTestAgent._rendezvous.success\"} 2\n",
           "# TYPE tide_torchelastic_workers_remaining_restarts gauge\n",
           // The process's native metrics are served too.
           "tide_metrics_test_native_total 1\n",
       }) {
    EXPECT_NE(r->body.find(line), std::string::npos) << line << r->body;
  }
  // Not _sum, which Prometheus keeps for summaries and histograms.
  EXPECT_EQ(r->body.find("rendezvous_success_sum"), std::string::npos)
      << r->body;
}

TEST_F(MetricsTest, APrometheusPortInUseIsANetworkError) {
  PrometheusMetricHandler first("127.0.0.1:0");
  EXPECT_THROW(
      PrometheusMetricHandler("127.0.0.1:" + std::to_string(first.port())),
      NetworkError);
}

}  // namespace
}  // namespace tide::metrics
