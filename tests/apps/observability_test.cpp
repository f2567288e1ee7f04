// tiderun's metrics, events and health endpoint, seen from outside: a run
// with one injected failure and one restart.
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/http.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace tide {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using test::Subprocess;

class ObservabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fifo_ = dir_ / "go";
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(
          ::mkfifo((fifo_.string() + "." + std::to_string(r)).c_str(), 0600),
          0);
    }
    // Attempt 0: rank 1 fails at once, rank 0 waits (and is stopped).
    // Attempt 1: both say "ready" and wait for the test to let them finish.
    script_ = dir_ / "w.sh";
    std::ofstream(script_)
        << "#!/bin/sh\n"
        << "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then\n"
        << "  [ \"$LOCAL_RANK\" = 1 ] && exit 1\n"
        << "  exec sleep 100\n"
        << "fi\n"
        << "echo ready\n"
        << "read line < " << fifo_.string() << ".$LOCAL_RANK\n";
    fs::permissions(script_, fs::perms::owner_all);
  }

  // Reads output lines until one matches; returns its first capture.
  static std::string wait_for(
      Subprocess& p, const std::regex& re, std::string& seen) {
    while (auto line = p.read_line(20s)) {
      seen += *line + "\n";
      std::smatch m;
      if (std::regex_search(*line, m, re)) {
        return m.size() > 1 ? m[1].str() : m[0].str();
      }
    }
    ADD_FAILURE() << "no line matching the pattern in:\n" << seen;
    return "";
  }

  static void wait_ready(Subprocess& p, std::string& seen) {
    for (int i = 0; i < 2; ++i) {
      wait_for(p, std::regex("^ready$"), seen);
    }
  }

  // Lets the waiting workers finish: one line to each worker's FIFO (the
  // open waits for the worker to open its end).
  void release_workers() {
    for (int r = 0; r < 2; ++r) {
      std::ofstream(fifo_.string() + "." + std::to_string(r)) << "go\n";
    }
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  fs::path fifo_;
  fs::path script_;
};

TEST_F(ObservabilityTest, PrometheusEndpointShowsRestartAndRendezvousMetrics) {
  Subprocess p(
      {TIDERUN_BIN,
       "--standalone",
       "--nproc-per-node=2",
       "--max-restarts=1",
       "--metrics=prometheus:127.0.0.1:0",
       script_.string()},
      {.merge_stderr = true});
  std::string seen;
  auto port = static_cast<uint16_t>(std::stoi(
      wait_for(p, std::regex("Prometheus metrics on port (\\d+)"), seen)));
  wait_ready(p, seen);
  auto r = test::http_get(port, "/metrics");
  release_workers();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  auto has = [&](const std::string& family,
                 const std::string& metric,
                 const std::string& value) {
    std::string line = family + "{group=\"torchelastic\",metric=\"" + metric +
                       "\"} " + value + "\n";
    EXPECT_NE(r->body.find(line), std::string::npos) << line << "\n" << r->body;
  };
  has("tide_torchelastic_workers_default_remaining_restarts",
      "workers.default.remaining_restarts",
      "0");
  has("tide_torchelastic_SimpleElasticAgent__rendezvous_success_sum",
      "SimpleElasticAgent._rendezvous.success",
      "2");
  has("tide_torchelastic_workers_default_healthy_sum",
      "workers.default.healthy",
      "2");
  auto status = p.wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 0) << seen;
}

TEST_F(ObservabilityTest, HealthEndpointAnswersTheAgentsState) {
  Subprocess p(
      {TIDERUN_BIN,
       "--standalone",
       "--nproc-per-node=2",
       "--max-restarts=1",
       "--health-port=127.0.0.1:0",
       script_.string()},
      {.merge_stderr = true});
  std::string seen;
  auto port = static_cast<uint16_t>(
      std::stoi(wait_for(p, std::regex("health checks on port (\\d+)"), seen)));
  wait_ready(p, seen);
  auto r = test::http_get(port, "/health");
  release_workers();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  auto j = nlohmann::json::parse(r->body);
  EXPECT_EQ(j["state"], "HEALTHY");
  EXPECT_EQ(j["restart_count"], 1);
  EXPECT_EQ(j["remaining_restarts"], 0);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["workers"].size(), 2u);
  EXPECT_GT(j["last_progress"].get<double>(), 1.6e9);
  ASSERT_TRUE(p.wait(20s).has_value());
}

TEST_F(ObservabilityTest, EventsFileHoldsEveryStepInOrder) {
  fs::path events = dir_ / "events.jsonl";
  Subprocess p(
      {TIDERUN_BIN,
       "--standalone",
       "--nproc-per-node=2",
       "--max-restarts=1",
       "--events=jsonl:" + events.string(),
       script_.string()},
      {.merge_stderr = true});
  std::string seen;
  wait_ready(p, seen);
  release_workers();
  auto status = p.wait(20s);
  ASSERT_TRUE(status.has_value());
  ASSERT_EQ(WEXITSTATUS(*status), 0) << seen;

  // One line per event: "<name> <global rank or node state>".
  std::vector<std::string> got;
  std::ifstream in(events);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    std::string name = j["name"];
    if (j.contains("event_type")) {
      got.push_back("rdzv " + j["node_state"].get<std::string>());
    } else if (j["metadata"].contains("global_rank")) {
      got.push_back(
          name + " " + std::to_string(j["metadata"]["global_rank"].get<int>()));
    } else {
      got.push_back(name);
    }
  }
  // Within a group the order of workers is not fixed; compare sorted runs.
  auto sorted = [](std::vector<std::string> v, size_t from, size_t n) {
    std::sort(
        v.begin() + static_cast<ptrdiff_t>(from),
        v.begin() + static_cast<ptrdiff_t>(from + n));
    return v;
  };
  std::vector<std::string> want = {
      "rdzv INIT",
      "rdzv RUNNING",
      "torchelastic.agent.rendezvous",
      "torchelastic.worker.status.HEALTHY 0",
      "torchelastic.worker.status.HEALTHY 1",
      "torchelastic.worker.status.FAILED 1",
      "torchelastic.worker.status.TERMINATED 0",
      "torchelastic.agent.restart",
      "rdzv INIT",
      "rdzv RUNNING",
      "torchelastic.agent.rendezvous",
      "torchelastic.worker.status.HEALTHY 0",
      "torchelastic.worker.status.HEALTHY 1",
      "torchelastic.worker.status.SUCCEEDED 0",
      "torchelastic.worker.status.SUCCEEDED 1",
  };
  ASSERT_EQ(got.size(), want.size()) << seen;
  got = sorted(sorted(sorted(sorted(got, 3, 2), 5, 2), 11, 2), 13, 2);
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace tide
