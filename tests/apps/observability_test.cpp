// tiderun's metrics, events and health endpoint, seen from outside: a run
// with one injected failure and one restart; and Debian's Prometheus
// scraping it, with tide's alert rules and dashboard queries.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "net/socket.h"
#include "support/eventually.h"
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
      std::string path = fifo_.string() + "." + std::to_string(r);
      ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
      // Held open for reading and writing (which never blocks) for the
      // whole test: a worker's open never waits, and what the test writes
      // waits in the pipe for the worker, even one that opens it later.
      go_[r] = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      ASSERT_GE(go_[r], 0);
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

  // tiderun on the failing script (one restart), with `flag`.
  std::vector<std::string> job(const std::string& flag) const {
    return {
        TIDERUN_BIN,
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=1",
        flag,
        script_.string()};
  }

  // The port tiderun logs as "<what> on port N".
  static uint16_t port_from(
      Subprocess& p, const std::string& what, std::string& seen) {
    return static_cast<uint16_t>(
        std::stoi(wait_for(p, std::regex(what + " on port (\\d+)"), seen)));
  }

  static void wait_ready(Subprocess& p, std::string& seen) {
    for (int i = 0; i < 2; ++i) {
      wait_for(p, std::regex("^ready$"), seen);
    }
  }

  void TearDown() override {
    for (int fd : go_) {
      if (fd >= 0) {
        ::close(fd);
      }
    }
  }

  // Lets the waiting workers finish: one line to each worker's FIFO.
  void release_workers() {
    for (int fd : go_) {
      ASSERT_EQ(::write(fd, "go\n", 3), 3);
    }
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  fs::path fifo_;
  int go_[2] = {-1, -1};
  fs::path script_;
};

// The pattern of one sample line of an exposition, `name{labels} value`:
// label values are literal, but "*" matches any (node and run, which the
// test cannot know); `value` is a regex.
std::string sample(
    const std::string& name,
    const std::map<std::string, std::string>& labels,
    const std::string& value) {
  auto literal = [](const std::string& s) {
    return std::regex_replace(
        s, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
  };
  std::string p = literal(name);
  const char* sep = "\\{";
  for (const auto& [k, v] : labels) {  // sorted, as exposed
    p += sep + k + "=\"" + (v == "*" ? "[^\"]+" : literal(v)) + "\"";
    sep = ",";
  }
  return p + (labels.empty() ? "" : "\\}") + " " + value;
}

bool has_line(const std::string& text, const std::string& pattern) {
  return std::regex_search(text, std::regex("(^|\n)" + pattern + "\n"));
}

TEST_F(ObservabilityTest, PrometheusEndpointShowsRestartAndRendezvousMetrics) {
  Subprocess p(job("--metrics=prometheus:127.0.0.1:0"), {.merge_stderr = true});
  std::string seen;
  uint16_t port = port_from(p, "Prometheus metrics", seen);
  wait_ready(p, seen);
  auto r = test::http_get(port, "/metrics");
  release_workers();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  // torch's metrics by Prometheus' conventions: the role a label, the sum
  // of the values a counter (_total), torch's name in `metric`; and the
  // process's native metrics beside them.
  for (const std::string& line : {
           sample(
               "tide_torchelastic_workers_remaining_restarts",
               {{"metric", "workers.default.remaining_restarts"},
                {"role", "default"}},
               "0"),
           sample(
               "tide_torchelastic_simple_elastic_agent_rendezvous_success_"
               "total",
               {{"metric", "SimpleElasticAgent._rendezvous.success"}},
               "2"),
           sample(
               "tide_torchelastic_workers_healthy_total",
               {{"metric", "workers.default.healthy"}, {"role", "default"}},
               "2"),
           sample(
               "tide_agent_restarts_total",
               {{"node", "*"},
                {"reason", "worker_failure"},
                {"role", "default"},
                {"run", "*"}},
               "1"),
       }) {
    EXPECT_TRUE(has_line(r->body, line)) << line << "\n" << r->body;
  }
  auto status = p.wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 0) << seen;
}

TEST_F(ObservabilityTest, HealthPortServesTheNativeMetrics) {
  Subprocess p(job("--health-port=127.0.0.1:0"), {.merge_stderr = true});
  std::string seen;
  uint16_t port = port_from(p, "health checks", seen);
  wait_ready(p, seen);
  using Labels = std::map<std::string, std::string>;
  const Labels agent = {{"node", "*"}, {"role", "default"}, {"run", "*"}};
  auto with = [](Labels labels, const std::string& k, const std::string& v) {
    labels[k] = v;
    return labels;
  };
  const Labels rdzv = {{"backend", "*"}, {"node", "*"}, {"run", "*"}};
  const std::vector<std::string> lines = {
      sample(
          "tide_agent_restarts_total",
          with(agent, "reason", "worker_failure"),
          "1"),
      sample(
          "tide_agent_restart_seconds_count",
          with(agent, "reason", "worker_failure"),
          "1"),
      sample("tide_agent_worker_failures_total", agent, "1"),
      sample("tide_agent_remaining_restarts", agent, "0"),
      sample("tide_agent_workers", agent, "2"),
      sample("tide_agent_state", with(agent, "state", "healthy"), "1"),
      sample("tide_agent_state", with(agent, "state", "failed"), "0"),
      sample("tide_rendezvous_rounds_total", rdzv, "2"),
      sample("tide_rendezvous_round_seconds_count", rdzv, "2"),
      sample("tide_rendezvous_nodes", rdzv, "1"),
      // --standalone: the store's server runs in tiderun (a group of
      // one node asks it nothing).
      sample("tide_store_clients", {}, "[1-9][0-9]*"),
      sample("tide_store_requests_total", {{"op", "get"}}, "[0-9]+"),
  };
  // The restart's time is observed just after the new workers started, so
  // it may come a moment after they said "ready": read until every line is
  // there, for a bounded time.
  auto missing = [&](const std::string& body) {
    std::vector<std::string> out;
    for (const auto& line : lines) {
      if (!has_line(body, line)) {
        out.push_back(line);
      }
    }
    return out;
  };
  std::optional<test::HttpResponse> r;
  test::eventually(
      [&] {
        r = test::http_get(port, "/metrics");
        return !r || r->status != 200 || missing(r->body).empty();
      },
      10s,
      20ms);
  release_workers();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  for (const auto& line : missing(r->body)) {
    ADD_FAILURE() << line << "\n" << r->body;
  }
  auto status = p.wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 0) << seen;
}

TEST_F(
    ObservabilityTest, HealthEndpointAnswersTheAgentsStateAndDrawsTheTimeline) {
  Subprocess p(job("--health-port=127.0.0.1:0"), {.merge_stderr = true});
  std::string seen;
  uint16_t port = port_from(p, "health checks", seen);
  wait_ready(p, seen);
  auto r = test::http_get(port, "/health");
  // The job's timeline, drawn from its view (src/timeline): the attempt
  // that failed, the one running, and the restart between them, once the
  // node's record says so.
  std::optional<test::HttpResponse> svg;
  bool drawn = test::eventually([&] {
    svg = test::http_get(port, "/api/timeline.svg");
    return svg && svg->status == 200 &&
           svg->body.find(R"(data-attempt="1" data-outcome="RUNNING")") !=
               std::string::npos;
  });
  release_workers();
  ASSERT_TRUE(drawn) << (svg ? svg->body : "no answer");
  EXPECT_EQ(svg->body.rfind("<svg", 0), 0u) << svg->body;
  EXPECT_NE(
      svg->body.find(R"(data-attempt="0" data-outcome="FAILED")"),
      std::string::npos)
      << svg->body;
  EXPECT_NE(svg->body.find(R"(class="marker restart")"), std::string::npos);
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
      job("--events=jsonl:" + events.string()), {.merge_stderr = true});
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

// ---- Debian's Prometheus (scripts/setup.sh installs it) ----

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr const char* kPromtool = "/usr/bin/promtool";
const fs::path kContrib = fs::path(TIDE_SOURCE_DIR) / "contrib";

// `s` percent-encoded for a URL's query.
std::string url_encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

// Every "expr" of a Grafana dashboard, wherever it sits.
void collect_exprs(const nlohmann::json& j, std::vector<std::string>& out) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      if (key == "expr" && value.is_string()) {
        out.push_back(value.get<std::string>());
      } else {
        collect_exprs(value, out);
      }
    }
  } else if (j.is_array()) {
    for (const auto& value : j) {
      collect_exprs(value, out);
    }
  }
}

// `expr` as Grafana sends it: its interval macros an interval, its
// variables "All" (the dashboard's allValue, .*).
std::string as_grafana_sends(std::string expr) {
  expr = std::regex_replace(
      expr, std::regex(R"(\$__(rate_interval|interval|range))"), "1m");
  return std::regex_replace(expr, std::regex(R"(\$(job|run|node)\b)"), ".*");
}

TEST(PrometheusTest, AlertRulesPassPromtool) {
  if (!fs::exists(kPromtool)) {
    GTEST_SKIP() << kPromtool << " is missing (Debian's prometheus package, "
                 << "scripts/setup.sh all)";
  }
  Subprocess check(
      {kPromtool,
       "check",
       "rules",
       (kContrib / "prometheus" / "tide-alerts.yml").string()},
      {.merge_stderr = true});
  std::string out;
  while (auto line = check.read_line(30s)) {
    out += *line + "\n";
  }
  auto status = check.wait(30s);
  ASSERT_TRUE(status.has_value()) << out;
  EXPECT_EQ(WEXITSTATUS(*status), 0) << out;
  EXPECT_NE(out.find("SUCCESS"), std::string::npos) << out;
}

// Prometheus scrapes a real job's health port (one failure, one restart),
// with tide's alert rules loaded; then every query of the dashboard runs
// through its API.
TEST_F(ObservabilityTest, PrometheusScrapesTheHealthPortAndRunsTheDashboard) {
  if (!fs::exists(kPrometheus)) {
    GTEST_SKIP() << kPrometheus << " is missing (Debian's prometheus package, "
                 << "scripts/setup.sh all)";
  }
  Subprocess job(
      {TIDERUN_BIN,
       "--standalone",
       "--nproc-per-node=2",
       "--max-restarts=1",
       "--health-port=127.0.0.1:0",
       script_.string()},
      {.merge_stderr = true});
  std::string seen;
  auto health_port = std::stoi(
      wait_for(job, std::regex("health checks on port (\\d+)"), seen));

  uint16_t web_port = net::free_port("127.0.0.1");
  fs::path config = dir_ / "prometheus.yml";
  std::ofstream(config)
      << "global:\n"
      << "  scrape_interval: 1s\n"
      << "  evaluation_interval: 1s\n"
      << "rule_files:\n"
      << "  - " << (kContrib / "prometheus" / "tide-alerts.yml").string()
      << "\n"
      << "scrape_configs:\n"
      << "  - job_name: tide\n"
      << "    static_configs:\n"
      << "      - targets: ['127.0.0.1:" << health_port << "']\n";
  // Its log goes to the test's stderr.
  Subprocess prometheus(
      {kPrometheus,
       "--config.file=" + config.string(),
       "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
       "--web.listen-address=127.0.0.1:" + std::to_string(web_port),
       "--log.level=warn"});

  // GET /api/v1/query; nullopt while Prometheus does not answer yet.
  auto query = [&](const std::string& promql) -> std::optional<nlohmann::json> {
    // Long enough for a Prometheus on a loaded machine; one that is not up
    // yet refuses the connection at once, and one whose storage is not open
    // yet answers 503 (what its /-/ready says too).
    auto r = test::http_get(
        web_port, "/api/v1/query?query=" + url_encode(promql), 30s);
    if (!r || r->status == 503) {
      return std::nullopt;
    }
    auto j =
        nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      ADD_FAILURE() << "not JSON from Prometheus (" << r->status
                    << "): " << r->body;
      return std::nullopt;
    }
    return j;
  };

  // The restart is counted before the second attempt's workers start.
  wait_ready(job, seen);
  std::string last;
  bool restarted = test::eventually(
      [&] {
        auto j = query("tide_agent_restarts_total");
        if (!j) {
          return false;
        }
        last = j->dump();
        for (const auto& series : (*j)["data"]["result"]) {
          if (series["metric"]["reason"] == "worker_failure" &&
              series["value"][1] == "1") {
            return true;
          }
        }
        return false;
      },
      60s,
      200ms);
  EXPECT_TRUE(restarted) << "Prometheus never saw tide_agent_restarts_total "
                            "= 1; last answer: "
                         << last;

  // Every query of the dashboard parses and runs.
  std::ifstream in(kContrib / "grafana" / "tide-dashboard.json");
  auto dashboard = nlohmann::json::parse(in);
  std::vector<std::string> exprs;
  collect_exprs(dashboard, exprs);
  EXPECT_GE(exprs.size(), 20u);
  for (const auto& expr : exprs) {
    auto j = query(as_grafana_sends(expr));
    ASSERT_TRUE(j.has_value()) << "no answer from Prometheus to " << expr;
    EXPECT_EQ((*j)["status"], "success")
        << expr << "\n  sent as " << as_grafana_sends(expr) << "\n  "
        << j->dump();
  }
  release_workers();
  auto status = job.wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 0) << seen;
}

}  // namespace
}  // namespace tide
