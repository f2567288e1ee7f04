// --rank-order with real tiderun agents: natural order across three
// network-namespace hosts named node100, node66 and node7 (each a UTS
// namespace of its own), which arrive in the reverse of natural order; and
// node-rank order on loopback. The workers do what torch's do with
// MASTER_ADDR:MASTER_PORT: rank 0's hosts a store there and every worker
// connects to it, so a master that is not rank 0's node fails the job.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/cluster.h"
#include "support/netns.h"
#include "support/temp_dir.h"

#ifndef TIDE_STORE_BIN
#error "rank_order_multinode_test.cpp needs TIDE_STORE_BIN"
#endif

namespace tide {
namespace {

using namespace std::chrono_literals;
using test::Cluster;
using test::exit_code;
using test::free_port;
using test::NetnsHosts;
namespace fs = std::filesystem;

// Writes dir/rank_worker.sh: prints "start RANK=r WORLD_SIZE=w
// MASTER_ADDR=a GROUP_RANK=g HOST=h"; rank 0 serves a tide-store at
// MASTER_ADDR:MASTER_PORT; every worker then connects there (for at most
// 30 s) and prints "reached the master GROUP_RANK=g HOST=h"; all run until
// dir/stop exists.
std::string write_rank_worker(const fs::path& dir) {
  auto p = dir / "rank_worker.sh";
  std::ofstream(p)
      << "#!/bin/bash\n"
      << "host=$(hostname)\n"
      << "echo \"start RANK=$RANK WORLD_SIZE=$WORLD_SIZE "
         "MASTER_ADDR=$MASTER_ADDR GROUP_RANK=$GROUP_RANK HOST=$host\"\n"
      << "if [ \"$RANK\" = 0 ]; then\n"
      << "  " << TIDE_STORE_BIN
      << " --host \"$MASTER_ADDR\" --port \"$MASTER_PORT\" &\n"
      << "  store=$!\n"
      << "  trap 'kill $store 2>/dev/null' EXIT\n"
      << "fi\n"
      << "for i in $(seq 600); do\n"
      << "  if (exec 3<>\"/dev/tcp/$MASTER_ADDR/$MASTER_PORT\") 2>/dev/null; "
         "then\n"
      << "    echo \"reached the master GROUP_RANK=$GROUP_RANK HOST=$host\"\n"
      << "    break\n"
      << "  fi\n"
      << "  sleep 0.05\n"
      << "done\n"
      << "while [ ! -e " << (dir / "stop") << " ]; do sleep 0.05; done\n";
  fs::permissions(p, fs::perms::owner_all);
  return p.string();
}

// The agents' flags common to both tests.
std::vector<std::string> agent_args(
    const std::string& endpoint,
    const std::string& local_addr,
    std::vector<std::string> extra,
    const std::string& script) {
  std::vector<std::string> a{
      "--nnodes=3",
      "--nproc-per-node=1",
      "--rdzv-backend=c10d",
      "--rdzv-endpoint=" + endpoint,
      "--rdzv-id=job",
      // A node is lost after 3 s silent: a loaded machine's stalls are
      // shorter.
      "--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=3,"
      "join_timeout=60",
      "--monitor-interval=0.05",
      "--local-addr=" + local_addr,
      "--max-restarts=0",
  };
  a.insert(a.end(), extra.begin(), extra.end());
  a.push_back(script);
  return a;
}

// Each agent's worker printed the expected group rank (== RANK, one worker
// a node), named rank 0's address as MASTER_ADDR, and reached the store
// served there.
void expect_ranks_and_running_job(
    Cluster& c,
    const std::map<std::string, int>& rank_of,          // agent -> group rank
    const std::map<std::string, std::string>& host_of,  // agent -> hostname
    const std::string& master) {
  auto starts = c.wait_starts(0, 3, 3, 60s);
  ASSERT_EQ(starts.size(), 3u) << c.log();
  std::map<std::string, int> got;
  for (const auto& s : starts) {
    got[s.agent] = s.rank;
    EXPECT_EQ(s.master_addr, master) << s.agent << "\n" << c.log();
  }
  EXPECT_EQ(got, rank_of) << c.log();
  for (const auto& [agent, rank] : rank_of) {
    std::string g = std::to_string(rank);
    EXPECT_TRUE(c.wait_line(
        "start RANK=" + g + " WORLD_SIZE=3 MASTER_ADDR=" + master +
            " GROUP_RANK=" + g + " HOST=" + host_of.at(agent),
        5s))
        << agent << "\n"
        << c.log();
    EXPECT_TRUE(c.wait_line(
        "reached the master GROUP_RANK=" + g + " HOST=" + host_of.at(agent),
        40s))
        << agent << "\n"
        << c.log();
  }
}

class RankOrderNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!NetnsHosts::available(&why)) {
      GTEST_SKIP() << "network namespaces are not available here (" << why
                   << "); RankOrderMultiNodeTest covers node-rank order on "
                      "loopback";
    }
    hosts_ = std::make_unique<NetnsHosts>(3);
  }

  // Starts agent `name` on `host` with host name `name` (a UTS namespace
  // of its own; unshare and sh exec, so the agent is tiderun itself).
  void start_agent(Cluster& c, const std::string& name, int host) {
    std::vector<std::string> prefix = hosts_->exec_prefix(host);
    prefix.insert(
        prefix.end(),
        {"unshare",
         "--uts",
         "sh",
         "-c",
         "hostname \"$0\" && exec \"$@\"",
         name});
    c.start(
        name,
        agent_args(
            hosts_->addr(0) + ":29400",
            hosts_->addr(host),
            {"--rank-order=natural"},
            worker_),
        prefix);
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  const std::string worker_ = write_rank_worker(dir_);
  std::unique_ptr<NetnsHosts> hosts_;
};

TEST_F(RankOrderNetnsTest, NaturalOrderRanksNode7Node66Node100AcrossHosts) {
  Cluster c(dir_);
  // Arrivals node100 (host 0, which hosts the store), node66, node7: the
  // reverse of natural order, and the plain string order of the names.
  start_agent(c, "node100", 0);
  ASSERT_TRUE(c.wait_line("joined round 0 as arrival 1", 30s)) << c.log();
  start_agent(c, "node66", 1);
  ASSERT_TRUE(c.wait_line("joined round 0 as arrival 2", 30s)) << c.log();
  start_agent(c, "node7", 2);
  expect_ranks_and_running_job(
      c,
      {{"node7", 0}, {"node66", 1}, {"node100", 2}},
      {{"node7", "node7"}, {"node66", "node66"}, {"node100", "node100"}},
      hosts_->addr(2));
  EXPECT_TRUE(c.wait_line("complete: rank 0 of 3 (natural order)", 5s))
      << c.log();
  c.stop_all({"node100", "node66", "node7"});
}

class RankOrderMultiNodeTest : public ::testing::Test {
 protected:
  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  const std::string worker_ = write_rank_worker(dir_);
  const std::string endpoint_ = "127.0.0.1:" + std::to_string(free_port());
};

TEST_F(RankOrderMultiNodeTest, NodeRankOrderFollowsEachNodesNodeRank) {
  // Arrivals a, b, c with node ranks 7, 3, 0: ranks 2, 1, 0, and c's
  // address (127.0.0.3) is the master. b takes both from the environment.
  Cluster c(dir_);
  c.start(
      "a",
      agent_args(
          endpoint_,
          "127.0.0.1",
          {"--rank-order=node-rank", "--node-rank=7"},
          worker_));
  ASSERT_TRUE(c.wait_line("joined round 0 as arrival 1", 30s)) << c.log();
  ::setenv("PET_RANK_ORDER", "node-rank", 1);
  ::setenv("PET_NODE_RANK", "3", 1);
  c.start("b", agent_args(endpoint_, "127.0.0.2", {}, worker_));
  ::unsetenv("PET_RANK_ORDER");
  ::unsetenv("PET_NODE_RANK");
  ASSERT_TRUE(c.wait_line("joined round 0 as arrival 2", 30s)) << c.log();
  c.start(
      "c",
      agent_args(
          endpoint_,
          "127.0.0.3",
          {"--rank_order=node-rank", "--node_rank=0"},
          worker_));
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  expect_ranks_and_running_job(
      c,
      {{"a", 2}, {"b", 1}, {"c", 0}},
      {{"a", name}, {"b", name}, {"c", name}},
      "127.0.0.3");
  EXPECT_TRUE(c.wait_line("complete: rank 1 of 3 (node-rank order)", 5s))
      << c.log();
  c.stop_all({"a", "b", "c"});
}

TEST_F(RankOrderMultiNodeTest, BadRankOrderFlagsAreUsageErrors) {
  Cluster c(dir_);
  const std::string rdzv = "--rdzv-endpoint=" + endpoint_;
  const std::map<std::string, std::vector<std::string>> cases = {
      {"no-node-rank",
       {"--rdzv-backend=c10d", rdzv, "--rank-order=node-rank", worker_}},
      {"static",
       {"--nnodes=2", "--node-rank=1", "--rank-order=natural", worker_}},
      {"bad-value", {"--rdzv-backend=c10d", rdzv, "--rank-order=abc", worker_}},
      {"contradiction",
       {"--rdzv-backend=c10d",
        rdzv,
        "--rank-order=natural",
        "--rdzv-conf=rank_order=arrival",
        worker_}},
  };
  for (const auto& [name, args] : cases) {
    c.start(name, args);
  }
  for (const auto& [name, args] : cases) {
    auto status = c.agent(name).wait(30s);
    ASSERT_TRUE(status.has_value()) << name << "\n" << c.log();
    EXPECT_EQ(exit_code(*status), 2) << name << "\n" << c.log();
  }
  for (const char* message :
       {"no-node-rank| tiderun: error: --rank-order=node-rank needs this "
        "node's --node-rank",
        "static| tiderun: error: --rank-order=natural needs an elastic "
        "rendezvous backend",
        "contradiction| tiderun: error: --rank-order=natural contradicts "
        "--rdzv-conf rank_order=arrival"}) {
    EXPECT_TRUE(c.wait_line(message, 5s)) << c.log();
  }
  EXPECT_TRUE(
      c.wait_line("abc not in {arrival,natural,node-rank", 5s) ||
      c.wait_line("--rank-order: abc", 1s))
      << c.log();
}

}  // namespace
}  // namespace tide
