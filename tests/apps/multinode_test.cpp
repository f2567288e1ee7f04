// Several tiderun agents on this machine forming one job through a dynamic
// rendezvous: fault tolerance, elastic shrink and growth, the store host's
// death. Each agent is a real tiderun process; the workers are shell
// scripts that print their environment and run until told to stop.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/cluster.h"
#include "support/process_checks.h"
#include "support/temp_dir.h"

namespace tide {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::Cluster;
using test::exit_code;
using test::expect_ranks;
using test::free_port;
namespace fs = std::filesystem;

class MultiNodeTest : public ::testing::Test {
 protected:
  std::string worker(int fail_rank = -1) {
    return test::write_worker(dir_, fail_rank);
  }

  std::string stop_file() const {
    return (dir_ / "stop").string();
  }

  std::vector<std::string> agent_args(
      const std::string& nnodes,
      const std::string& script,
      std::vector<std::string> extra = {}) {
    std::vector<std::string> a{
        "--nnodes=" + nnodes,
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:" + std::to_string(port_),
        "--rdzv-id=job",
        // A node is lost after 3 s silent (also the store calls' timeout):
        // a loaded machine's stalls are shorter.
        "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,"
        "keep_alive_max_attempt=3,join_timeout=60",
        "--monitor-interval=0.05",
        "--local-addr=127.0.0.1",
    };
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(script);
    return a;
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  const uint16_t port_ = free_port();
};

TEST_F(MultiNodeTest, AFailedWorkerRestartsEveryNodeAndTheJobSucceeds) {
  Cluster c(dir_);
  auto w = worker(/*fail_rank=*/1);
  c.start("a", agent_args("2", w, {"--max-restarts=1"}));
  c.start("b", agent_args("2", w, {"--max-restarts=1"}));
  // The first round, then rank 1 fails once and both nodes start again.
  auto first = c.wait_starts(0, 2, 2, 60s);
  ASSERT_EQ(first.size(), 2u) << c.log();
  auto again = c.wait_starts(2, 2, 2, 60s);
  ASSERT_EQ(again.size(), 2u) << c.log();
  expect_ranks(again, 2);
  c.stop_all({"a", "b"});
}

TEST_F(MultiNodeTest, ElasticJobShrinksWhenANodeIsKilledAndGrowsBack) {
  Cluster c(dir_);
  auto w = worker();
  // Membership changes cost no restarts: --max-restarts=0 throughout.
  c.start("a", agent_args("2:4", w, {"--max-restarts=0"}));
  ASSERT_TRUE(c.wait_line("hosts the c10d store", 30s)) << c.log();
  c.start("b", agent_args("2:4", w, {"--max-restarts=0"}));
  c.start("c", agent_args("2:4", w, {"--max-restarts=0"}));
  auto three = c.wait_starts(0, 3, 3, 60s);
  ASSERT_EQ(three.size(), 3u) << c.log();
  expect_ranks(three, 3);

  // SIGKILL node c's agent: its worker dies with it, no goodbye.
  size_t before = c.starts();
  auto killed = Clock::now();
  c.agent("c").signal(SIGKILL);
  auto two = c.wait_starts(before, 2, 2, 60s);
  auto running_again = Clock::now() - killed;
  ASSERT_EQ(two.size(), 2u) << c.log();
  expect_ranks(two, 2, "c");
  // Detection (keep_alive_interval 1 s x 3 attempts) plus the new round's
  // last call (1 s), with room for a loaded machine: far below the 60 s
  // join_timeout.
  EXPECT_LT(running_again, 3s + 1s + 10s) << c.log();
  std::printf(
      "survivors running at world size 2 %.0f ms after the SIGKILL\n",
      std::chrono::duration<double, std::milli>(running_again).count());

  // A new node joins: everyone restarts into a round of three.
  before = c.starts();
  c.start("d", agent_args("2:4", w, {"--max-restarts=0"}));
  auto back = c.wait_starts(before, 3, 3, 60s);
  ASSERT_EQ(back.size(), 3u) << c.log();
  expect_ranks(back, 3);
  c.stop_all({"a", "b", "d"});
}

TEST_F(MultiNodeTest, TheStoreHostsDeathIsAFastReportedFailureElsewhere) {
  Cluster c(dir_);
  auto w = worker();
  c.start("host", agent_args("2", w));
  ASSERT_TRUE(c.wait_line("hosts the c10d store", 30s)) << c.log();
  c.start("b", agent_args("2", w));
  ASSERT_EQ(c.wait_starts(0, 2, 2, 60s).size(), 2u) << c.log();
  auto killed = Clock::now();
  c.agent("host").signal(SIGKILL);
  auto status = c.agent("b").wait(30s);
  auto took = Clock::now() - killed;
  ASSERT_TRUE(status.has_value()) << c.log();
  EXPECT_EQ(exit_code(*status), 1) << c.log();
  // Within the store calls' timeout (3 s) and room for a loaded machine:
  // far below the 60 s read_timeout.
  EXPECT_LT(took, 3s + 10s) << c.log();
  EXPECT_TRUE(c.wait_line("b| tiderun: lost the rendezvous backend", 30s))
      << c.log();
}

TEST_F(MultiNodeTest, ANodeFailingForGoodEndsTheJobOnEveryNode) {
  Cluster c(dir_);
  auto w = worker(/*fail_rank=*/0);
  c.start("a", agent_args("2", w, {"--max-restarts=0"}));
  c.start("b", agent_args("2", w, {"--max-restarts=0"}));
  for (const char* n : {"a", "b"}) {
    auto status = c.agent(n).wait(30s);
    ASSERT_TRUE(status.has_value()) << n << "\n" << c.log();
    EXPECT_EQ(exit_code(*status), 1) << n << "\n" << c.log();
  }
  // Printed before the agents exited; a reader may still be behind.
  EXPECT_TRUE(c.wait_line("closed the rendezvous", 30s)) << c.log();
}

TEST_F(MultiNodeTest, AFinishedNodeLeavesTheExitBarrierWhenItsPeerFails) {
  // torch's FileTimer/launcher tests' shape: node a's workers succeed at
  // once, node b's fail for good a second later. a hosts the store and
  // used to sit out --exit-barrier-timeout (300 s); it must leave within a
  // keep-alive interval (1 s) plus a second, and room for a loaded machine.
  Cluster c(dir_);
  test::expect_finished_node_leaves_when_peer_fails(
      c,
      dir_,
      [&](const std::string& name, const std::string& script) {
        c.start(name, agent_args("2", script, {"--max-restarts=0"}));
        if (name == "a") {
          ASSERT_TRUE(c.wait_line("hosts the c10d store", 30s)) << c.log();
        }
      },
      15s);
}

TEST_F(MultiNodeTest, TheStaticBackendsExitBarrierEndsWhenAPeerFails) {
  // No keep-alive and no shared closed flag here: the failed node counting
  // in is what ends the wait.
  Cluster c(dir_);
  uint16_t port = free_port();
  test::expect_finished_node_leaves_when_peer_fails(
      c,
      dir_,
      [&](const std::string& name, const std::string& script) {
        c.start(
            name,
            {"--nnodes=2",
             "--nproc-per-node=1",
             "--node-rank=" + std::string(name == "a" ? "0" : "1"),
             "--master-addr=127.0.0.1",
             "--master-port=" + std::to_string(port),
             "--monitor-interval=0.05",
             "--max-restarts=0",
             script});
      },
      // Far below the 300 s --exit-barrier-timeout, with room for a loaded
      // machine.
      15s);
}

TEST_F(MultiNodeTest, ASignalDuringTheExitBarrierEndsItWithTheNodesOutcome) {
  // a finished and waits for b, whose workers run on. SIGTERM ends a's wait
  // at once with its own outcome (0); a hosts the store and stops it
  // without waiting close_timeout (30 s) for b to leave, so b loses it.
  Cluster c(dir_);
  c.start(
      "a",
      agent_args(
          "2", test::write_ending_worker(dir_, "ok.sh"), {"--max-restarts=0"}));
  ASSERT_TRUE(c.wait_line("hosts the c10d store", 30s)) << c.log();
  c.start("b", agent_args("2", worker(), {"--max-restarts=0"}));
  ASSERT_TRUE(c.wait_line("all workers succeeded", 60s)) << c.log();
  ASSERT_TRUE(c.wait_line("b| start RANK=", 60s)) << c.log();
  auto signalled = Clock::now();
  c.agent("a").signal(SIGTERM);
  auto a = c.agent("a").wait(30s);
  auto took = Clock::now() - signalled;
  ASSERT_TRUE(a.has_value()) << c.log();
  EXPECT_EQ(exit_code(*a), 0) << c.log();
  // Seen at the end of the barrier's 1 s slice; the bound leaves a loaded
  // machine room and stays below close_timeout (30 s).
  EXPECT_LT(took, 10s) << c.log();
  EXPECT_TRUE(c.wait_line("exit barrier: received SIGTERM", 30s)) << c.log();
  auto b = c.agent("b").wait(30s);
  ASSERT_TRUE(b.has_value()) << c.log();
  EXPECT_EQ(exit_code(*b), 1) << c.log();
  std::printf(
      "SIGTERM to tiderun exit in the exit barrier: %.0f ms\n",
      std::chrono::duration<double, std::milli>(took).count());
}

TEST_F(MultiNodeTest, ASignalStopsAnAgentWaitingForItsRound) {
  // Alone in a 2-node job, the agent waits in the rendezvous; SIGTERM ends
  // that wait within a keep-alive interval (1 s here), not join_timeout
  // (60 s).
  Cluster c(dir_);
  c.start("a", agent_args("2", worker()));
  ASSERT_TRUE(c.wait_line("joined round 0", 30s)) << c.log();
  c.agent("a").signal(SIGTERM);
  auto status = c.agent("a").wait(30s);
  ASSERT_TRUE(status.has_value()) << c.log();
  EXPECT_EQ(exit_code(*status), 1) << c.log();
  EXPECT_TRUE(c.wait_line("stopped by SIGTERM", 30s)) << c.log();
}

TEST_F(MultiNodeTest, AUserPluginBackendIsSelectedByName) {
  // examples/hostlist_rendezvous.cpp, loaded through TIDE_RDZV_PLUGINS on
  // one node and --rdzv-plugin on the other.
  Cluster c(dir_);
  auto w = worker();
  std::ofstream(stop_file()) << "";
  for (const char* addr : {"127.0.0.1", "127.0.0.2"}) {
    std::vector<std::string> args{
        "--rdzv-backend=hostlist",
        "--rdzv-endpoint=127.0.0.1,127.0.0.2",
        "--rdzv-conf=port=" + std::to_string(port_),
        "--nnodes=2",
        std::string("--local-addr=") + addr,
        w};
    if (addr == std::string("127.0.0.1")) {
      args.insert(args.begin(), "--rdzv-plugin=" HOSTLIST_PLUGIN);
      c.start(addr, args);
    } else {
      ::setenv("TIDE_RDZV_PLUGINS", HOSTLIST_PLUGIN, 1);
      c.start(addr, args);
      ::unsetenv("TIDE_RDZV_PLUGINS");
    }
  }
  auto starts = c.wait_starts(0, 2, 2, 60s);
  ASSERT_EQ(starts.size(), 2u) << c.log();
  expect_ranks(starts, 2);
  for (const char* addr : {"127.0.0.1", "127.0.0.2"}) {
    auto status = c.agent(addr).wait(30s);
    ASSERT_TRUE(status.has_value()) << c.log();
    EXPECT_EQ(exit_code(*status), 0) << c.log();
  }
}

TEST_F(MultiNodeTest, AnUnknownBackendNamesTheKnownOnesAndABadPluginIsClear) {
  Cluster c(dir_);
  c.start("x", {"--rdzv-backend=nope", "--rdzv-endpoint=127.0.0.1", "w"});
  c.start("y", {"--rdzv-plugin=/nonexistent/lib.so", "w"});
  for (const char* n : {"x", "y"}) {
    auto status = c.agent(n).wait(30s);
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(exit_code(*status), 2) << c.log();
  }
  EXPECT_TRUE(c.wait_line("known: static, c10d", 30s)) << c.log();
  EXPECT_TRUE(c.wait_line("cannot load rendezvous plugin /nonexistent", 30s))
      << c.log();
}

}  // namespace
}  // namespace tide
