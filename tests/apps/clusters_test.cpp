// tiderun on today's clusters: under srun, the settings torchrun users spell
// out come from Slurm's variables (flags still win). Each node is a real
// tiderun process on this machine with the variables srun would give it;
// the job's nodes are 127.0.0.1 and 127.0.0.2, both this machine.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/cluster.h"
#include "support/temp_dir.h"

namespace tide {
namespace {

using namespace std::chrono_literals;
using test::Cluster;
using test::exit_code;
using test::free_port;
namespace fs = std::filesystem;

class SlurmTest : public ::testing::Test {
 protected:
  // A worker that prints where it landed and exits 0.
  std::string worker() {
    auto p = dir_ / "worker.sh";
    std::ofstream(p) << "#!/bin/sh\n"
                     << "echo \"start RANK=$RANK WORLD_SIZE=$WORLD_SIZE "
                        "MASTER_ADDR=$MASTER_ADDR\"\n"
                     << "echo \"placed RANK=$RANK GROUP_RANK=$GROUP_RANK "
                        "RUN=$TORCHELASTIC_RUN_ID\"\n";
    fs::permissions(p, fs::perms::owner_all);
    return p.string();
  }

  // `env` with srun's variables for node `node_id` of a 2-node job, which
  // execs tiderun.
  static std::vector<std::string> srun(int node_id, int nodes = 2) {
    return {
        "/usr/bin/env",
        "SLURM_JOB_ID=9001",
        "SLURM_STEP_ID=0",
        "SLURM_NODEID=" + std::to_string(node_id),
        "SLURM_PROCID=" + std::to_string(node_id),
        "SLURM_LOCALID=0",
        "SLURM_JOB_NODELIST=127.0.0.[1-2]",
        "SLURM_JOB_NUM_NODES=" + std::to_string(nodes),
        "SLURM_TASKS_PER_NODE=1(x" + std::to_string(nodes) + ")",
    };
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  const uint16_t port_ = free_port();
};

// Only --nproc-per-node and the port: nodes, node rank, backend, endpoint
// (the first node of the list) and run id (the job id) come from srun's
// variables, and node 1 of the job holds the second group's ranks.
TEST_F(SlurmTest, UnderSrunTheJobIsDerivedFromSlurmsVariables) {
  Cluster c(dir_);
  auto w = worker();
  std::vector<std::string> args = {
      "--nproc-per-node=2",
      "--master-port=" + std::to_string(port_),
      "--local-addr=127.0.0.1",
      w};
  // Node 1 first: arrival order must not decide its ranks.
  c.start("n1", args, srun(1));
  c.start("n0", args, srun(0));
  for (const char* n : {"n0", "n1"}) {
    auto status = c.agent(n).wait(60s);
    ASSERT_TRUE(status.has_value()) << c.log();
    EXPECT_EQ(exit_code(*status), 0) << c.log();
  }
  auto starts = c.wait_starts(0, 4, 4, 30s);
  ASSERT_EQ(starts.size(), 4u) << c.log();
  for (const auto& s : starts) {
    int group = s.agent == "n1" ? 1 : 0;  // SLURM_NODEID
    EXPECT_EQ(s.rank / 2, group) << s.agent << " rank " << s.rank << "\n"
                                 << c.log();
  }
  EXPECT_TRUE(c.wait_line("n1| placed RANK=3 GROUP_RANK=1 RUN=9001", 30s))
      << c.log();
  EXPECT_TRUE(c.wait_line("n0| placed RANK=0 GROUP_RANK=0 RUN=9001", 30s))
      << c.log();
  EXPECT_TRUE(c.wait_line(
      "Slurm job 9001, node 1 of 2: derived --nnodes=2 --rdzv-backend=c10d "
      "--node-rank=1 --rdzv-endpoint=127.0.0.1:" +
          std::to_string(port_) +
          " --rdzv-conf is_host=false --rank-order=node-rank --rdzv-id=9001",
      30s))
      << c.log();
}

// Flags and PET_* variables win over what Slurm says: one node of a job
// srun calls two-node runs alone under its own run id.
TEST_F(SlurmTest, FlagsAndPetVariablesWin) {
  Cluster c(dir_);
  auto prefix = srun(0);
  prefix.push_back("PET_RDZV_ID=mine");
  c.start(
      "n0",
      {"--nnodes=1",
       "--nproc-per-node=1",
       "--master-port=" + std::to_string(port_),
       worker()},
      prefix);
  auto status = c.agent("n0").wait(60s);
  ASSERT_TRUE(status.has_value()) << c.log();
  EXPECT_EQ(exit_code(*status), 0) << c.log();
  EXPECT_TRUE(c.wait_line("placed RANK=0 GROUP_RANK=0 RUN=mine", 30s))
      << c.log();
  EXPECT_TRUE(c.wait_line("derived --rdzv-backend=c10d --node-rank=0", 30s))
      << c.log();
}

// Several srun tasks on one node would start several agents there: refused
// with what to do instead. TIDE_SLURM=0 ignores Slurm altogether.
TEST_F(SlurmTest, ManyTasksPerNodeAreRefusedAndTideSlurmZeroIgnoresSlurm) {
  Cluster c(dir_);
  auto many = srun(0);
  many.push_back("SLURM_TASKS_PER_NODE=4(x2)");
  c.start("many", {"--nproc-per-node=1", worker()}, many);
  auto status = c.agent("many").wait(30s);
  ASSERT_TRUE(status.has_value()) << c.log();
  EXPECT_EQ(exit_code(*status), 2) << c.log();
  EXPECT_TRUE(c.wait_line("srun started 4 tasks on this node", 30s)) << c.log();

  auto off = srun(0);
  off.push_back("TIDE_SLURM=0");
  c.start(
      "off",
      {"--nproc-per-node=1",
       "--master-port=" + std::to_string(port_),
       worker()},
      off);
  status = c.agent("off").wait(30s);
  ASSERT_TRUE(status.has_value()) << c.log();
  EXPECT_EQ(exit_code(*status), 0) << c.log();
  EXPECT_TRUE(c.wait_line("off| placed RANK=0 GROUP_RANK=0 RUN=none", 30s))
      << c.log();
}

// TORCH_ELASTIC_WORKER_IDENTICAL=1: ranks from the node rank alone, no
// store round trip; the same ranks as torch's store scheme gives.
TEST_F(SlurmTest, IdenticalWorkersTakeTheirRanksFromTheNodeRank) {
  Cluster c(dir_);
  auto w = worker();
  for (const char* n : {"a", "b"}) {
    c.start(
        n,
        {"--nnodes=2",
         "--nproc-per-node=2",
         "--rdzv-backend=c10d",
         "--rdzv-endpoint=127.0.0.1:" + std::to_string(port_),
         "--rdzv-id=same",
         "--local-addr=127.0.0.1",
         w},
        {"/usr/bin/env", "TORCH_ELASTIC_WORKER_IDENTICAL=1"});
  }
  for (const char* n : {"a", "b"}) {
    auto status = c.agent(n).wait(60s);
    ASSERT_TRUE(status.has_value()) << c.log();
    EXPECT_EQ(exit_code(*status), 0) << c.log();
  }
  auto starts = c.wait_starts(0, 4, 4, 30s);
  test::expect_ranks(starts, 4);
  // Each node holds two neighbouring ranks, from an even one.
  std::map<std::string, std::set<int>> by_node;
  for (const auto& s : starts) {
    by_node[s.agent].insert(s.rank);
  }
  for (const auto& [node, ranks] : by_node) {
    ASSERT_EQ(ranks.size(), 2u) << node << "\n" << c.log();
    EXPECT_EQ(*ranks.begin() % 2, 0) << node;
    EXPECT_EQ(*ranks.rbegin(), *ranks.begin() + 1) << node;
  }
}

}  // namespace
}  // namespace tide
