// The job's status seen from outside: `tiderun status` against real tiderun
// agents forming one c10d job on this machine (a restarted node, a killed
// one, a straggling rank), and its exit statuses for scripts.
#include "tide/status/job_status.h"

#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tide/common/error.h"
#include "tide/rendezvous/registry.h"
#include "tide/store/tcp_store.h"

#include "support/cluster.h"
#include "support/temp_dir.h"

namespace tide {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;
using test::Cluster;
using test::free_port;
namespace fs = std::filesystem;

// What one `tiderun status` printed, and how it exited.
struct StatusRun {
  int code = -1;
  std::string out;
  json view;  // with --json, when it parsed
};

class JobStatusTest : public ::testing::Test {
 protected:
  std::vector<std::string> agent_args(
      const std::string& nnodes,
      const std::string& script,
      std::vector<std::string> extra = {}) {
    std::vector<std::string> a{
        "--nnodes=" + nnodes,
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=" + endpoint_,
        "--rdzv-id=job",
        "--rdzv-conf=last_call_timeout=1,keep_alive_interval=0.2,"
        "keep_alive_max_attempt=3,join_timeout=60",
        "--monitor-interval=0.05",
        "--local-addr=127.0.0.1",
        "--status-interval=0.2",
    };
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(script);
    return a;
  }

  StatusRun status(
      std::vector<std::string> extra = {}, const std::string& timeout = "5") {
    std::vector<std::string> args{
        TIDERUN_BIN,
        "status",
        "--rdzv-endpoint=" + endpoint_,
        "--rdzv-id=job",
        "--timeout=" + timeout};
    args.insert(args.end(), extra.begin(), extra.end());
    test::Subprocess p(args, test::SubprocessOptions{.merge_stderr = true});
    StatusRun r;
    r.out = p.read_all(20s);
    auto st = p.wait(20s);
    r.code = st && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
    if (std::find(extra.begin(), extra.end(), "--json") != extra.end()) {
      r.view = json::parse(r.out, nullptr, false);
    }
    return r;
  }

  // Runs `tiderun status --json` until `ok` holds for its view, for up to
  // `limit`; the last run either way.
  StatusRun status_until(
      const std::function<bool(const StatusRun&)>& ok,
      std::chrono::seconds limit = 30s) {
    auto deadline = Clock::now() + limit;
    StatusRun r;
    do {
      r = status({"--json"});
      if (!r.view.is_discarded() && ok(r)) {
        return r;
      }
      // Records change every status interval (0.2 s): asking faster than
      // that would only read the same ones again.
      std::this_thread::sleep_for(200ms);
    } while (Clock::now() < deadline);
    return r;
  }

  // The node record of the agent whose pid is `pid`, or null.
  static const json* node_of(const json& view, pid_t pid) {
    for (const auto& n : view["nodes"]) {
      if (n["pid"] == pid) {
        return &n;
      }
    }
    return nullptr;
  }

  // Nodes of the current round whose group runs, heard from lately.
  static int healthy_nodes(const json& view) {
    int n = 0;
    for (const auto& node : view["nodes"]) {
      n += node["state"] == "HEALTHY" && node["member"].get<bool>() &&
                   !node["stale"].get<bool>()
               ? 1
               : 0;
    }
    return n;
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  const uint16_t port_ = free_port();
  const std::string endpoint_ = "127.0.0.1:" + std::to_string(port_);
};

TEST_F(JobStatusTest, TwoAgentsOneRestartedShowTheRestartAndItsReason) {
  Cluster c(dir_);
  auto w = test::write_worker(dir_, /*fail_rank=*/1);
  c.start("a", agent_args("2", w, {"--max-restarts=1"}));
  c.start("b", agent_args("2", w, {"--max-restarts=1"}));
  // Rank 1 fails once; both nodes start again.
  ASSERT_EQ(c.wait_starts(0, 2, 2, 60s).size(), 2u) << c.log();
  ASSERT_EQ(c.wait_starts(2, 2, 2, 60s).size(), 2u) << c.log();

  auto r = status_until([](const StatusRun& r) {
    return r.view["state"] == "HEALTHY" && r.view["restarts"] == 1 &&
           healthy_nodes(r.view) == 2;
  });
  ASSERT_EQ(r.code, 0) << r.out << c.log();
  ASSERT_EQ(r.view["nodes"].size(), 2u) << r.out;
  EXPECT_EQ(r.view["ranks"], 2) << r.out;
  // The node of the failed rank used its restart, and says why; the other
  // restarted for the new round without using one.
  int restarted = 0;
  for (const auto& n : r.view["nodes"]) {
    ASSERT_EQ(n["ranks"].size(), 1u) << r.out;
    EXPECT_EQ(n["ranks"][0]["state"], "HEALTHY") << r.out;
    EXPECT_GT(n["ranks"][0]["pid"].get<int>(), 0) << r.out;
    ASSERT_FALSE(n["last_restart"].is_null()) << r.out;
    std::string reason = n["last_restart"]["reason"];
    if (n["restarts"] == 1) {
      ++restarted;
      EXPECT_NE(reason.find("worker failure: rank 1"), std::string::npos)
          << reason;
      // Its attempts: the failed one, then the running one.
      ASSERT_EQ(n["attempts"].size(), 2u) << r.out;
      EXPECT_EQ(n["attempts"][0]["outcome"], "FAILED") << r.out;
      EXPECT_EQ(n["attempts"][1]["outcome"], "RUNNING") << r.out;
    } else {
      EXPECT_NE(reason.find("membership changed"), std::string::npos) << reason;
    }
  }
  EXPECT_EQ(restarted, 1) << r.out;

  // The table for people says the same.
  auto text = status();
  EXPECT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("job job: HEALTHY"), std::string::npos) << text.out;
  EXPECT_NE(
      text.out.find("restarts 1/1 (last: worker failure"), std::string::npos)
      << text.out;
  c.stop_all({"a", "b"});
}

TEST_F(JobStatusTest, ThreeAgentsOneKilledShowItSilentAndOutOfTheNewRound) {
  Cluster c(dir_);
  auto w = test::write_worker(dir_);
  c.start("a", agent_args("2:3", w));
  ASSERT_TRUE(c.wait_line("hosts the c10d store", 30s)) << c.log();
  c.start("b", agent_args("2:3", w));
  c.start("c", agent_args("2:3", w));
  ASSERT_EQ(c.wait_starts(0, 3, 3, 60s).size(), 3u) << c.log();
  auto r = status_until(
      [](const StatusRun& r) { return healthy_nodes(r.view) == 3; });
  ASSERT_EQ(r.code, 0) << r.out << c.log();
  EXPECT_EQ(r.view["state"], "HEALTHY");
  EXPECT_EQ(r.view["ranks"], 3);

  // SIGKILL node c's agent: its record stops, the others go on at two.
  pid_t killed = c.agent("c").pid();
  size_t before = c.starts();
  c.agent("c").signal(SIGKILL);
  ASSERT_EQ(c.wait_starts(before, 2, 2, 60s).size(), 2u) << c.log();
  int64_t round_of_three = r.view["round"];
  // The survivors go on in a new round, of two; node c's record, silent,
  // is shown as not in it and counts for nothing.
  r = status_until([&](const StatusRun& r) {
    const json* n = node_of(r.view, killed);
    return n != nullptr && (*n)["stale"].get<bool>() &&
           r.view["round"] > round_of_three && healthy_nodes(r.view) == 2;
  });
  ASSERT_EQ(r.code, 0) << r.out << c.log();
  EXPECT_EQ(r.view["state"], "HEALTHY") << r.out;
  EXPECT_EQ(r.view["ranks"], 2) << r.out;
  for (const auto& n : r.view["nodes"]) {
    if (n["pid"] == killed) {
      EXPECT_FALSE(n["member"].get<bool>()) << r.out;
      EXPECT_EQ(n["group_world_size"], 3) << r.out;
    } else {
      EXPECT_TRUE(n["member"].get<bool>()) << r.out;
      EXPECT_EQ(n["group_world_size"], 2) << r.out;
    }
  }
  auto text = status();
  EXPECT_EQ(text.code, 0) << text.out;
  EXPECT_NE(
      text.out.find("(SILENT) (not in the current round)"), std::string::npos)
      << text.out;
  EXPECT_NE(
      text.out.find("1 other node(s) not in the round"), std::string::npos)
      << text.out;
  c.stop_all({"a", "b"});
}

TEST_F(JobStatusTest, ANodeWhoseRankFailedIsNeverPublishedHealthy) {
  // Local rank 0 fails in every attempt; local rank 1 takes a moment to
  // stop (it traps SIGTERM), so each restart spends a while stopping. A
  // reader reads the records as fast as it can from the first attempt to
  // the last: no record may show a running group with an ended rank, or a
  // group being stopped with a running rank, and the job may never be
  // HEALTHY while a member has a rank that is not running.
  constexpr int kRestarts = 6;
  auto script = dir_ / "fails.sh";
  std::ofstream(script) << "#!/bin/sh\n"
                           "echo \"start RANK=$RANK WORLD_SIZE=$WORLD_SIZE\"\n"
                           "if [ \"$LOCAL_RANK\" = 0 ]; then exit 3; fi\n"
                           "trap 'sleep 0.3; exit 7' TERM\n"
                           "while :; do sleep 0.05; done\n";
  fs::permissions(script, fs::perms::owner_all);
  // The store outlives the agent, so that its last record can be read.
  auto server = store::TcpStoreServer::start({.port = port_});
  auto args = agent_args(
      "1",
      script.string(),
      {"--nproc-per-node=2", "--max-restarts=" + std::to_string(kRestarts)});
  for (auto& a : args) {
    if (a.starts_with("--rdzv-conf=")) {
      a += ",is_host=false";
    }
  }
  Cluster c(dir_);
  c.start("a", args);
  auto store = rendezvous::open_job_store(
      rendezvous::RendezvousParameters{
          .backend = "c10d", .endpoint = endpoint_, .run_id = "job"},
      10s);
  std::map<std::string, int> seen;  // node states read
  std::vector<std::string> contradictions;
  auto check = [&](const status::JobView& v) {
    for (const auto& n : v.nodes) {
      const auto& s = n.status;
      ++seen[s.state];
      for (const auto& r : s.ranks) {
        bool running = r.state == "HEALTHY" || r.state == "STOPPING";
        bool ok = s.state == "HEALTHY"
                      ? r.state == "HEALTHY" || r.state == "SUCCEEDED"
                  : s.state == "SUCCEEDED" ? r.state == "SUCCEEDED"
                                           : r.state != "HEALTHY";
        if (!ok || (running && r.pid <= 0)) {
          contradictions.push_back(status::to_json(v));
        }
      }
      if (v.state == "HEALTHY" && n.member && s.state != "HEALTHY" &&
          s.state != "SUCCEEDED") {
        contradictions.push_back(status::to_json(v));
      }
    }
  };
  status::JobView last;
  for (;;) {
    bool over = c.agent("a").wait(0ms).has_value();
    last = status::read_job_view(*store, "job", 0.7);
    check(last);
    if (over) {
      break;
    }
  }
  EXPECT_TRUE(contradictions.empty())
      << contradictions.size() << " contradicting views, the first:\n"
      << contradictions.front();
  // It read every kind of record: running, being restarted, failed.
  EXPECT_GT(seen["HEALTHY"], 0) << c.log();
  EXPECT_GT(seen["RESTARTING"], 0) << c.log();
  ASSERT_EQ(last.nodes.size(), 1u) << status::to_json(last);
  const auto& node = last.nodes[0].status;
  EXPECT_EQ(last.state, "FAILED") << status::to_json(last);
  EXPECT_EQ(node.state, "FAILED");
  EXPECT_EQ(node.restarts, kRestarts);
  ASSERT_EQ(node.ranks.size(), 2u);
  EXPECT_EQ(node.ranks[0].state, "FAILED");
  EXPECT_EQ(node.ranks[1].state, "STOPPED");
  ASSERT_EQ(node.attempts.size(), static_cast<size_t>(kRestarts + 1));
  for (const auto& a : node.attempts) {
    EXPECT_EQ(a.outcome, "FAILED");
    EXPECT_NE(a.reason.find("rank 0 (local 0)"), std::string::npos) << a.reason;
  }
}

TEST_F(JobStatusTest, ExitStatusesSayWhatIsWrongForScripts) {
  // Bad flags: 2.
  auto no_id = test::Subprocess(
      {TIDERUN_BIN, "status", "--rdzv-endpoint=" + endpoint_},
      test::SubprocessOptions{.merge_stderr = true});
  no_id.read_all(10s);
  auto no_id_status = no_id.wait(10s);
  ASSERT_TRUE(no_id_status.has_value());
  EXPECT_EQ(test::exit_code(*no_id_status), 2);
  auto r = status({"--rdzv-backend=static"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("only c10d and etcd"), std::string::npos) << r.out;
  // No store there: 5, saying where it looked.
  r = status({}, "0.5");
  EXPECT_EQ(r.code, 5) << r.out;
  EXPECT_NE(
      r.out.find("cannot read job job's status from " + endpoint_),
      std::string::npos)
      << r.out;

  // A store, but no such job: 4.
  Cluster c(dir_);
  auto w = test::write_worker(dir_);
  c.start("a", agent_args("1", w));
  ASSERT_EQ(c.wait_starts(0, 1, 1, 60s).size(), 1u) << c.log();
  test::Subprocess other(
      {TIDERUN_BIN,
       "status",
       "--rdzv-endpoint=" + endpoint_,
       "--rdzv-id=another"},
      test::SubprocessOptions{.merge_stderr = true});
  std::string out = other.read_all(20s);
  auto other_status = other.wait(20s);
  ASSERT_TRUE(other_status.has_value()) << out;
  EXPECT_EQ(test::exit_code(*other_status), 4) << out;
  EXPECT_NE(out.find("no status records"), std::string::npos) << out;
  c.stop_all({"a"});
}

TEST_F(JobStatusTest, ARankSleepingInItsStepsIsFlaggedAndTheOthersAreNot) {
  // Three ranks report each step with tide.heartbeat(step) (Python's
  // helper); rank 2 takes ten times as long a step.
  auto script = dir_ / "steps.py";
  std::ofstream(script) << R"(
import os, sys, time
sys.path.insert(0, os.environ["TIDE_PYTHON_DIR"])
import tide
pause = 0.2 if os.environ["RANK"] == "2" else 0.02
step = 0
while not os.path.exists(os.environ["STOP_FILE"]):
    time.sleep(pause)
    step += 1
    assert tide.heartbeat(step)
)";
  auto events = dir_ / "events.jsonl";
  Cluster c(dir_);
  ::setenv("STOP_FILE", (dir_ / "stop").c_str(), 1);
  ::setenv("TIDE_PYTHON_DIR", TIDE_SOURCE_DIR "/python", 1);
  c.start(
      "a",
      {"--standalone",
       "--nproc-per-node=3",
       // Paces are measured over an interval: one of about 50 fast steps
       // averages out a loaded machine's jitter (over 10, a fast rank's
       // pace can swing by a third, and the rank look like a straggler).
       "--status-interval=1",
       "--events=jsonl:" + events.string(),
       "--no-python",
       "/usr/bin/python3",
       script.string()});
  ::unsetenv("STOP_FILE");
  ::unsetenv("TIDE_PYTHON_DIR");
  ASSERT_TRUE(c.wait_line("rank 2 (local 2) is a straggler", 60s)) << c.log();
  std::ofstream(dir_ / "stop") << "";
  auto st = c.agent("a").wait(30s);
  ASSERT_TRUE(st.has_value()) << c.log();
  EXPECT_EQ(test::exit_code(*st), 0) << c.log();

  // The event names rank 2 alone, with its scores under the threshold.
  std::ifstream in(events);
  int flagged = 0;
  for (std::string line; std::getline(in, line);) {
    json e = json::parse(line, nullptr, false);
    if (e.is_discarded() || e["name"] != "torchelastic.agent.straggler") {
      continue;
    }
    ++flagged;
    const json& md = e["metadata"];
    EXPECT_EQ(md["rank"], 2) << line;
    EXPECT_LT(md["relative_score"].get<double>(), 0.7) << line;
    EXPECT_EQ(md["threshold"], 0.7) << line;
  }
  EXPECT_GE(flagged, 1) << c.log();
  EXPECT_EQ(c.log().find("rank 0 (local 0) is a straggler"), std::string::npos)
      << c.log();
  EXPECT_EQ(c.log().find("rank 1 (local 1) is a straggler"), std::string::npos)
      << c.log();
}

}  // namespace
}  // namespace tide
