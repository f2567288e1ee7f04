// The process's native metrics (tide/metrics/registry.h): naming rules,
// one series per name and labels, and what the exposition says. The
// registry is process-wide, so each test names metrics of its own.
#include "tide/metrics/registry.h"

#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tide/common/error.h"

#include "metrics/torch_names.h"

namespace tide::metrics {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos ||
         text.starts_with(line + "\n");
}

TEST(RegistryTest, CounterShowsItsTypeHelpLabelsAndValue) {
  auto c =
      counter("tide_test_requests_total", "Requests served.", {{"op", "get"}});
  c.inc();
  c.inc(2);
  EXPECT_EQ(c.value(), 3);
  std::string text = exposition();
  EXPECT_TRUE(
      has_line(text, "# HELP tide_test_requests_total Requests served."))
      << text;
  EXPECT_TRUE(has_line(text, "# TYPE tide_test_requests_total counter"))
      << text;
  EXPECT_TRUE(has_line(text, "tide_test_requests_total{op=\"get\"} 3")) << text;
}

TEST(RegistryTest, TheSameNameAndLabelsAreTheSameSeries) {
  Labels labels{{"role", "trainer"}, {"run", "r1"}};
  counter("tide_test_same_total", "x", labels).inc();
  counter("tide_test_same_total", "another help is ignored", labels).inc(4);
  EXPECT_EQ(counter("tide_test_same_total", "x", labels).value(), 5);
  // Other labels: another series of the same family.
  EXPECT_EQ(
      counter("tide_test_same_total", "x", {{"role", "trainer"}}).value(), 0);
  auto g = gauge("tide_test_same_gauge", "x", labels);
  g.set(7);
  gauge("tide_test_same_gauge", "x", labels).dec(2);
  gauge("tide_test_same_gauge", "x", labels).inc();
  EXPECT_EQ(g.value(), 6);
  std::string text = exposition();
  EXPECT_TRUE(
      has_line(text, "tide_test_same_total{role=\"trainer\",run=\"r1\"} 5"))
      << text;
  EXPECT_TRUE(has_line(text, "tide_test_same_total{role=\"trainer\"} 0"))
      << text;
  EXPECT_TRUE(has_line(text, "# TYPE tide_test_same_gauge gauge")) << text;
  EXPECT_TRUE(
      has_line(text, "tide_test_same_gauge{role=\"trainer\",run=\"r1\"} 6"))
      << text;
}

TEST(RegistryTest, HistogramShowsCumulativeBucketsCountAndSum) {
  auto h = histogram(
      "tide_test_latency_seconds",
      "How long it took.",
      {{"op", "set"}},
      {0.01, 0.1, 1});
  // Powers of two: the sum is exact.
  h.observe(0.0078125);
  h.observe(0.0625);
  h.observe(0.0625);
  h.observe(4);
  std::string text = exposition();
  EXPECT_TRUE(has_line(text, "# TYPE tide_test_latency_seconds histogram"))
      << text;
  for (const char* line : {
           "tide_test_latency_seconds_bucket{op=\"set\",le=\"0.01\"} 1",
           "tide_test_latency_seconds_bucket{op=\"set\",le=\"0.1\"} 3",
           "tide_test_latency_seconds_bucket{op=\"set\",le=\"1\"} 3",
           "tide_test_latency_seconds_bucket{op=\"set\",le=\"+Inf\"} 4",
           "tide_test_latency_seconds_count{op=\"set\"} 4",
           "tide_test_latency_seconds_sum{op=\"set\"} 4.1328125",
       }) {
    EXPECT_TRUE(has_line(text, line)) << line << "\n" << text;
  }
}

TEST(RegistryTest, HistogramsGetDefaultSecondsBuckets) {
  histogram("tide_test_default_seconds", "x").observe(0.3);
  std::string text = exposition();
  for (double bound : default_seconds_buckets()) {
    std::ostringstream le;
    le << bound;
    EXPECT_NE(
        text.find("tide_test_default_seconds_bucket{le=\"" + le.str() + "\"}"),
        std::string::npos)
        << bound << "\n"
        << text;
  }
  EXPECT_TRUE(has_line(text, "tide_test_default_seconds_bucket{le=\"0.5\"} 1"))
      << text;
  EXPECT_TRUE(has_line(text, "tide_test_default_seconds_bucket{le=\"0.25\"} 0"))
      << text;
}

TEST(RegistryTest, FamiliesAreSortedByName) {
  gauge("tide_test_sorted_b", "x").set(1);
  gauge("tide_test_sorted_a", "x").set(1);
  std::string text = exposition();
  EXPECT_LT(
      text.find("# TYPE tide_test_sorted_a"),
      text.find("# TYPE tide_test_sorted_b"));
}

TEST(RegistryTest, NamesBreakingTheConventionsAreInvalidArguments) {
  // A counter's name ends in _total.
  EXPECT_THROW(counter("tide_test_requests", "x"), InvalidArgument);
  EXPECT_THROW(counter("tide-test_total", "x"), InvalidArgument);
  EXPECT_THROW(gauge("9lives", "x"), InvalidArgument);
  EXPECT_THROW(
      gauge("tide_test_bad_label", "x", {{"a-b", "1"}}), InvalidArgument);
  EXPECT_THROW(
      gauge("tide_test_bad_label", "x", {{"__x", "1"}}), InvalidArgument);
  EXPECT_THROW(
      histogram("tide_test_le_seconds", "x", {{"le", "1"}}), InvalidArgument);
  EXPECT_THROW(
      histogram("tide_test_order_seconds", "x", {}, {1, 0.5}), InvalidArgument);
  // A name is one kind of metric.
  gauge("tide_test_kind", "x");
  EXPECT_THROW(histogram("tide_test_kind", "x"), InvalidArgument);
  try {
    counter("tide_test_kind_total", "x");
    gauge("tide_test_kind_total", "x");
    ADD_FAILURE() << "a gauge took a counter's name";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("already a counter"), std::string::npos)
        << e.what();
  }
  // A histogram's series share its buckets.
  histogram("tide_test_buckets_seconds", "x", {{"a", "1"}}, {1, 2});
  EXPECT_NO_THROW(
      histogram("tide_test_buckets_seconds", "x", {{"a", "2"}}, {1, 2}));
  EXPECT_THROW(
      histogram("tide_test_buckets_seconds", "x", {{"a", "3"}}, {1, 3}),
      InvalidArgument);
  // Counters only go up.
  EXPECT_THROW(counter("tide_test_up_total", "x").inc(-1), InvalidArgument);
  // Nothing half-made stays behind: the exposition still works.
  EXPECT_NE(exposition().find("tide_test_kind"), std::string::npos);
}

TEST(RegistryTest, SampleValueReadsOneLineOfTheExposition) {
  gauge("tide_test_sample", "x", {{"b", "2"}, {"a", "1"}}).set(2.5);
  histogram("tide_test_sample_seconds", "x", {}, {1}).observe(0.5);
  EXPECT_EQ(sample_value("tide_test_sample{a=\"1\",b=\"2\"}"), 2.5);
  EXPECT_EQ(sample_value("tide_test_sample_seconds_count"), 1);
  EXPECT_EQ(sample_value("tide_test_sample_seconds_bucket{le=\"1\"}"), 1);
  EXPECT_EQ(sample_value("tide_test_sample"), std::nullopt);
  EXPECT_EQ(sample_value("tide_test_no_such_metric"), std::nullopt);
}

TEST(RegistryTest, ExponentialBucketsGrowByTheFactor) {
  EXPECT_EQ(exponential_buckets(1e-3, 10, 3), (Buckets{1e-3, 1e-2, 1e-1}));
  EXPECT_THROW(exponential_buckets(0, 2, 3), InvalidArgument);
  EXPECT_THROW(exponential_buckets(1, 1, 3), InvalidArgument);
  EXPECT_THROW(exponential_buckets(1, 2, 0), InvalidArgument);
}

TEST(RegistryTest, ThreadsLookingUpAndCountingLoseNothing) {
  constexpr int kThreads = 4;
  constexpr int kEach = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      auto held = counter("tide_test_threads_total", "x", {{"k", "held"}});
      for (int i = 0; i < kEach; ++i) {
        held.inc();
        counter("tide_test_threads_total", "x", {{"k", "looked_up"}}).inc();
        gauge("tide_test_threads", "x", {{"t", std::to_string(t)}}).set(i);
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(
      counter("tide_test_threads_total", "x", {{"k", "held"}}).value(),
      kThreads * kEach);
  EXPECT_EQ(
      counter("tide_test_threads_total", "x", {{"k", "looked_up"}}).value(),
      kThreads * kEach);
  EXPECT_EQ(gauge("tide_test_threads", "x", {{"t", "0"}}).value(), kEach - 1);
}

TEST(RegistryTest, TorchNamesBecomeConventionalNamesWithLabels) {
  auto check = [](const std::string& group,
                  const std::string& name,
                  const std::string& base,
                  const Labels& labels) {
    auto p = detail::prometheus_name(group, name);
    EXPECT_EQ(p.base, base) << name;
    EXPECT_EQ(p.labels, labels) << name;
  };
  check(
      "torchelastic",
      "workers.default.remaining_restarts",
      "tide_torchelastic_workers_remaining_restarts",
      {{"metric", "workers.default.remaining_restarts"}, {"role", "default"}});
  check(
      "torchelastic",
      "workers.trainer.run_total",
      "tide_torchelastic_workers_run",
      {{"metric", "workers.trainer.run_total"}, {"role", "trainer"}});
  check(
      "torchelastic",
      "SimpleElasticAgent._rendezvous.success",
      "tide_torchelastic_simple_elastic_agent_rendezvous_success",
      {{"metric", "SimpleElasticAgent._rendezvous.success"}});
  check(
      "torchelastic",
      "LocalElasticAgent._start_workers.duration.ms",
      "tide_torchelastic_local_elastic_agent_start_workers_duration_ms",
      {{"metric", "LocalElasticAgent._start_workers.duration.ms"}});
  check(
      "torchelastic",
      "health_check.disk_space.duration_ms",
      "tide_torchelastic_health_check_duration_ms",
      {{"metric", "health_check.disk_space.duration_ms"},
       {"check", "disk_space"}});
  check("My Group", "a..b-c", "tide_my_group_a_b_c", {{"metric", "a..b-c"}});
}

}  // namespace
}  // namespace tide::metrics
