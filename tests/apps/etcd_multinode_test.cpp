// tiderun agents forming one job through the etcd backend, against real
// etcd: a single member, and a 3-member cluster that loses a member while
// the job runs and changes size.
#include <signal.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "support/cluster.h"
#include "support/etcd.h"
#include "support/temp_dir.h"

namespace tide {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::Cluster;
namespace fs = std::filesystem;

class EtcdMultiNodeTest : public ::testing::Test {
 protected:
  std::vector<std::string> agent_args(
      const std::string& endpoints,
      const std::string& nnodes,
      std::vector<std::string> extra = {}) {
    std::vector<std::string> a{
        "--nnodes=" + nnodes,
        "--rdzv-backend=etcd",
        "--rdzv-endpoint=" + endpoints,
        "--rdzv-id=job",
        // Leases of 3 s, and 1 s for each of the keep-alive's etcd calls:
        // a loaded machine's stalls are shorter.
        "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,"
        "keep_alive_max_attempt=3,join_timeout=60,read_timeout=5",
        "--monitor-interval=0.05",
        "--local-addr=127.0.0.1",
    };
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(worker_);
    return a;
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  std::string worker_;
};

TEST_F(EtcdMultiNodeTest, AFailedWorkerRestartsEveryNodeAndTheJobSucceeds) {
  auto etcd = test::EtcdCluster::start(1);
  worker_ = test::write_worker(dir_, /*fail_rank=*/1);
  Cluster c(dir_);
  c.start("a", agent_args(etcd.endpoints(), "2", {"--max-restarts=1"}));
  c.start("b", agent_args(etcd.endpoints(), "2", {"--max-restarts=1"}));
  ASSERT_EQ(c.wait_starts(0, 2, 2, 60s).size(), 2u) << c.log();
  auto again = c.wait_starts(2, 2, 2, 60s);
  ASSERT_EQ(again.size(), 2u) << c.log();
  test::expect_ranks(again, 2);
  c.stop_all({"a", "b"});
}

TEST_F(EtcdMultiNodeTest, AFinishedNodeLeavesTheExitBarrierWhenItsPeerFails) {
  // As with c10d: a's workers succeed, b's fail for good a little later; a
  // leaves its exit barrier within a keep-alive interval (1 s) plus a
  // second (and room for a loaded machine) instead of
  // --exit-barrier-timeout (300 s).
  auto etcd = test::EtcdCluster::start(1);
  Cluster c(dir_);
  test::expect_finished_node_leaves_when_peer_fails(
      c,
      dir_,
      [&](const std::string& name, const std::string& script) {
        worker_ = script;
        c.start(name, agent_args(etcd.endpoints(), "2", {"--max-restarts=0"}));
      },
      15s);
}

TEST_F(EtcdMultiNodeTest, JobSurvivesAKilledEtcdMemberAndAKilledFirstAgent) {
  auto etcd = test::EtcdCluster::start(3);
  worker_ = test::write_worker(dir_);
  Cluster c(dir_);
  c.start("a", agent_args(etcd.endpoints(), "1:3"));
  c.start("b", agent_args(etcd.endpoints(), "1:3"));
  auto two = c.wait_starts(0, 2, 2, 60s);
  ASSERT_EQ(two.size(), 2u) << c.log();
  test::expect_ranks(two, 2);

  // The first endpoint every agent uses goes away mid-job.
  etcd.kill(0);
  size_t before = c.starts();
  c.start("c", agent_args(etcd.endpoints(), "1:3"));
  auto three = c.wait_starts(before, 3, 3, 60s);
  ASSERT_EQ(three.size(), 3u) << c.log();
  test::expect_ranks(three, 3);

  // The first agent dies (with c10d it would have hosted the store): the
  // others form a round of two on the remaining etcd members.
  before = c.starts();
  auto killed = Clock::now();
  c.agent("a").signal(SIGKILL);
  auto survivors = c.wait_starts(before, 2, 2, 60s);
  ASSERT_EQ(survivors.size(), 2u) << c.log();
  test::expect_ranks(survivors, 2, "a");
  auto took = Clock::now() - killed;
  // Lease TTL ceil(1 s x 3) = 3 s, a keep-alive interval, last call 1 s,
  // and room for a loaded machine: far below the 60 s join_timeout.
  EXPECT_LT(took, 3s + 1s + 1s + 10s) << c.log();
  std::printf(
      "etcd: survivors running at world size 2 %.0f ms after the SIGKILL\n",
      std::chrono::duration<double, std::milli>(took).count());
  c.stop_all({"b", "c"});
}

}  // namespace
}  // namespace tide
