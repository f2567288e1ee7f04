// The multi-host twin of multinode_test.cpp: three tiderun agents, each on
// a "host" of its own (a network namespace with its own address and
// loopback, support/netns.h), form one elastic job through the c10d
// rendezvous over a virtual Ethernet segment. Then a host's agent is
// SIGKILLed, or a host is unplugged. Skipped where namespaces cannot be
// made; the loopback twin covers the same logic there.
#include "support/netns.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/cluster.h"
#include "support/temp_dir.h"

namespace tide {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::Cluster;
using test::exit_code;
using test::expect_ranks;
using test::NetnsHosts;
using test::Start;
namespace fs = std::filesystem;

constexpr int kHosts = 3;
// Any port does: nothing else listens in host 0's new namespace.
constexpr uint16_t kRdzvPort = 29400;
// Detection (keep_alive_interval 1 s x 3 attempts) plus the new round's
// last call (1 s), with room for a loaded machine: far below the 60 s
// join_timeout.
constexpr auto kReformBound = 3s + 1s + 10s;

double millis(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!NetnsHosts::available(&why)) {
      GTEST_SKIP() << "network namespaces are not available here (" << why
                   << "); apps/multinode_test.cpp covers the same logic "
                      "on loopback";
    }
    hosts_ = std::make_unique<NetnsHosts>(kHosts);
    test::write_worker(dir_);
  }

  // Starts agent `name` on `host`, in the elastic job of --nnodes=nnodes
  // whose c10d store host 0's agent hosts.
  void start_agent(
      Cluster& c,
      const std::string& name,
      int host,
      const std::string& nnodes) {
    host_of_[name] = host;
    c.start(
        name,
        {
            "--nnodes=" + nnodes,
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=" + hosts_->addr(0) + ":" +
                std::to_string(kRdzvPort),
            "--rdzv-id=job",
            // A node is lost after 3 s silent: a loaded machine's stalls
            // are shorter.
            "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,"
            "keep_alive_max_attempt=3,join_timeout=60",
            "--monitor-interval=0.05",
            "--local-addr=" + hosts_->addr(host),
            "--max-restarts=0",
            (dir_ / "worker.sh").string(),
        },
        hosts_->exec_prefix(host));
  }

  // Agents "h0", "h1", "h2" on hosts 0, 1, 2 (h0 first: it hosts the
  // store); the worker starts of their first round of three (fewer when
  // it did not form within the limit).
  std::vector<Start> form_three(Cluster& c) {
    start_agent(c, "h0", 0, "2:3");
    if (!c.wait_line("hosts the c10d store", 30s)) {
      ADD_FAILURE() << "h0 did not host the store\n" << c.log();
      return {};
    }
    start_agent(c, "h1", 1, "2:3");
    start_agent(c, "h2", 2, "2:3");
    return c.wait_starts(0, 3, 3, 60s);
  }

  // Every start names, as MASTER_ADDR, the address of the host whose
  // worker has rank 0.
  void expect_master_is_rank0s_host(const std::vector<Start>& starts) {
    std::string master;
    for (const auto& s : starts) {
      if (s.rank == 0) {
        master = hosts_->addr(host_of_.at(s.agent));
      }
    }
    ASSERT_FALSE(master.empty());
    for (const auto& s : starts) {
      EXPECT_EQ(s.master_addr, master) << s.agent << " rank " << s.rank;
    }
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  // Declared after the files, destroyed before them; a test's Cluster is
  // gone before the hosts are.
  std::unique_ptr<NetnsHosts> hosts_;
  std::map<std::string, int> host_of_;  // agent name -> host
};

TEST_F(NetnsTest, ThreeHostsFormOneRoundWithRankZerosAddressAsMaster) {
  Cluster c(dir_);
  auto three = form_three(c);
  ASSERT_EQ(three.size(), 3u) << c.log();
  expect_ranks(three, 3);
  std::set<std::string> agents;
  for (const auto& s : three) {
    agents.insert(s.agent);
    EXPECT_NE(s.master_addr, "127.0.0.1");
  }
  EXPECT_EQ(agents.size(), 3u) << c.log();
  expect_master_is_rank0s_host(three);
  c.stop_all({"h0", "h1", "h2"});
}

TEST_F(NetnsTest, AHostWhoseAgentIsKilledLeavesTheOthersRunningAtTwo) {
  Cluster c(dir_);
  auto three = form_three(c);
  ASSERT_EQ(three.size(), 3u) << c.log();

  // `ip netns exec` exec'd tiderun: this SIGKILLs the agent itself, and
  // its worker dies with it.
  size_t before = c.starts();
  auto killed = Clock::now();
  c.agent("h2").signal(SIGKILL);
  auto two = c.wait_starts(before, 2, 2, 60s);
  auto running_again = Clock::now() - killed;
  ASSERT_EQ(two.size(), 2u) << c.log();
  expect_ranks(two, 2, "h2");
  expect_master_is_rank0s_host(two);
  EXPECT_LT(running_again, kReformBound) << c.log();
  std::printf(
      "hosts 0 and 1 running at world size 2 %.0f ms after host 2's agent "
      "was SIGKILLed\n",
      millis(running_again));
  c.stop_all({"h0", "h1"});
}

TEST_F(NetnsTest, AnUnpluggedHostIsDroppedEndsItselfAndRejoinsOncePlugged) {
  Cluster c(dir_);
  auto three = form_three(c);
  ASSERT_EQ(three.size(), 3u) << c.log();

  // Host 1 goes off the network with its agent and worker still running.
  // It cannot reach the store: after 3 failed keep-alives (each bounded by
  // the 1 s interval) its agent stops its worker and fails. The others
  // see its heartbeat stand still for lost_after and re-form without it.
  size_t before = c.starts();
  auto cut = Clock::now();
  hosts_->isolate(1);
  auto status = c.agent("h1").wait(30s);
  auto ended = Clock::now() - cut;
  ASSERT_TRUE(status.has_value()) << c.log();
  EXPECT_EQ(exit_code(*status), 1) << c.log();
  EXPECT_LT(ended, 3 * (1s + 1s) + 10s) << c.log();
  EXPECT_TRUE(c.wait_line("h1| tiderun: lost the rendezvous backend", 30s))
      << c.log();
  auto two = c.wait_starts(before, 2, 2, 60s);
  auto running_again = Clock::now() - cut;
  ASSERT_EQ(two.size(), 2u) << c.log();
  expect_ranks(two, 2, "h1");
  expect_master_is_rank0s_host(two);
  EXPECT_LT(running_again, kReformBound) << c.log();
  std::printf(
      "after host 1 was unplugged: its agent failed in %.0f ms; hosts 0 and "
      "2 ran at world size 2 in %.0f ms\n",
      millis(ended),
      millis(running_again));

  // Plugged back in, host 1 runs a new agent: everyone restarts into a
  // round of three, closed at once (max_nodes).
  before = c.starts();
  hosts_->reconnect(1);
  auto plugged = Clock::now();
  start_agent(c, "h1-again", 1, "2:3");
  auto back = c.wait_starts(before, 3, 3, 60s);
  ASSERT_EQ(back.size(), 3u) << c.log();
  expect_ranks(back, 3);
  expect_master_is_rank0s_host(back);
  std::printf(
      "host 1 back in a round of three %.0f ms after it was plugged in\n",
      millis(Clock::now() - plugged));
  c.stop_all({"h0", "h2", "h1-again"});
}

}  // namespace
}  // namespace tide
