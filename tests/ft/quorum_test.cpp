// The quorum and commit vote of replica groups (tide::ft::QuorumClient),
// over a real tide store server and, for the coordination that survives a
// host, a real etcd. Each group is one client here (one rank); the groups
// run their rounds on threads of their own, as their processes would.
#include "tide/ft/quorum.h"

#include <algorithm>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/etcd/etcd_store.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"

#include "support/etcd.h"
#include "support/eventually.h"
#include "support/torch_store_stand_in.h"

namespace tide::ft {
namespace {

using namespace std::chrono_literals;
using store::Store;
using ::testing::HasSubstr;

class QuorumTest : public ::testing::Test {
 protected:
  std::shared_ptr<Store> connect() {
    return std::make_shared<store::PrefixStore>(
        "ft/",
        std::make_shared<store::TcpStore>(store::TcpStoreOptions{
            .port = server_->port(),
            .dialect = store::Dialect::kModern,
            .timeout = 30s}));
  }

  static QuorumOptions options(
      const std::string& group, int expected, const std::string& inc = "0") {
    return QuorumOptions{
        .group = group,
        .incarnation = inc,
        .expected_groups = expected,
        .timeout = 30s,
        .heartbeat_interval = 20ms,
        .heartbeat_timeout = 30s};
  }

  std::unique_ptr<QuorumClient> client(
      const std::string& group,
      int expected,
      int64_t step = 0,
      const std::string& inc = "0") {
    return std::make_unique<QuorumClient>(
        [this] { return connect(); }, options(group, expected, inc), step);
  }

  using Clients = std::vector<QuorumClient*>;

  // Every client starts the round at once; their quorums, in order.
  static std::vector<Quorum> start(const Clients& cs) {
    std::vector<std::future<Quorum>> fs;
    for (auto* c : cs) {
      fs.push_back(
          std::async(std::launch::async, [c] { return c->start_quorum(); }));
    }
    std::vector<Quorum> qs;
    for (auto& f : fs) {
      qs.push_back(f.get());
    }
    return qs;
  }

  // Every client votes yes at once; whether each saw the round commit.
  static std::vector<bool> commit(const Clients& cs) {
    std::vector<std::future<bool>> fs;
    for (auto* c : cs) {
      fs.push_back(std::async(
          std::launch::async, [c] { return c->should_commit(true); }));
    }
    std::vector<bool> out;
    for (auto& f : fs) {
      out.push_back(f.get());
    }
    return out;
  }

  std::string value(const std::string& key) {
    auto s = connect();
    return s->check({key}) ? s->get(key) : "";
  }

  std::unique_ptr<store::TcpStoreServer> server_ =
      store::TcpStoreServer::start({});
};

TEST_F(QuorumTest, TheFirstQuorumHasEveryExpectedGroupAndLaterRoundsAreFast) {
  auto a = client("a", 3), b = client("b", 3), c = client("c", 3);
  auto qs = start({a.get(), b.get(), c.get()});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(qs[i].replica_world_size, 3);
    EXPECT_EQ(qs[i].replica_rank, i);  // members sorted by id
    EXPECT_EQ(qs[i].id, qs[0].id);
    EXPECT_FALSE(qs[i].heal());
  }
  EXPECT_EQ(commit({a.get(), b.get(), c.get()}), std::vector<bool>(3, true));
  EXPECT_EQ(a->step(), 1);
  // The same members: the same quorum, and no record written for it.
  for (int round = 1; round <= 3; ++round) {
    auto next = start({a.get(), b.get(), c.get()});
    EXPECT_EQ(next[0].id, qs[0].id);
    EXPECT_EQ(next[0].round, qs[0].round + round);
    EXPECT_EQ(value("round/" + std::to_string(next[0].round) + "/quorum"), "");
    EXPECT_EQ(commit({a.get(), b.get(), c.get()}), std::vector<bool>(3, true));
  }
  EXPECT_EQ(c->step(), 4);
}

TEST_F(QuorumTest, AGroupDeclaredOutAbortsItsRoundAndTheOthersGoOnWithoutIt) {
  auto a = client("a", 3), b = client("b", 3), c = client("c", 3);
  start({a.get(), b.get(), c.get()});
  commit({a.get(), b.get(), c.get()});
  auto q = start({a.get(), b.get(), c.get()});
  // a and b vote; c's agent sees it die before it does.
  auto votes = std::async(std::launch::async, [&] {
    return commit({a.get(), b.get()});
  });
  // The record's counter: the 3 votes of the round before, then a's and b's.
  ASSERT_TRUE(test::eventually([&] {
    return value("round/" + std::to_string(q[0].id) + "/votes") == "5";
  }));
  auto s = connect();
  QuorumClient::declare_dead(*s, "c:0", "its agent saw rank 0 exit with 9");
  EXPECT_EQ(votes.get(), std::vector<bool>(2, false));
  EXPECT_EQ(a->step(), 1);  // the aborted round does not count

  auto next = start({a.get(), b.get()});
  EXPECT_EQ(next[0].replica_world_size, 2);
  EXPECT_NE(next[0].id, q[0].id);
  EXPECT_EQ(next[1].replica_rank, 1);
  EXPECT_EQ(commit({a.get(), b.get()}), std::vector<bool>(2, true));
  EXPECT_EQ(b->step(), 2);
  // c's own process, were it alive, learns it is out.
  EXPECT_FALSE(c->should_commit(true));
  EXPECT_THAT(
      [&] { c->start_quorum(); },
      ::testing::ThrowsMessage<Error>(HasSubstr("rank 0 exit with 9")));
}

TEST_F(QuorumTest, MembersMeetBeforeAProcessGroupOrLearnTheRoundIsLost) {
  auto a = client("a", 3), b = client("b", 3), c = client("c", 3);
  start({a.get(), b.get(), c.get()});
  auto meet = [](const Clients& cs) {
    std::vector<std::future<bool>> fs;
    for (auto* x : cs) {
      fs.push_back(std::async(std::launch::async, [x] { return x->meet(); }));
    }
    return fs;
  };
  for (auto& f : meet({a.get(), b.get(), c.get()})) {
    EXPECT_TRUE(f.get());
  }
  commit({a.get(), b.get(), c.get()});
  auto q = start({a.get(), b.get(), c.get()});
  // a and b wait at the meeting for c, which dies before it comes.
  auto waiting = meet({a.get(), b.get()});
  ASSERT_TRUE(test::eventually([&] {
    return value("round/" + std::to_string(q[0].round) + "/arrived") == "2";
  }));
  QuorumClient::declare_dead(*connect(), "c:0", "killed");
  for (auto& f : waiting) {
    EXPECT_FALSE(f.get());
  }
  EXPECT_EQ(commit({a.get(), b.get()}), std::vector<bool>(2, false));
}

TEST_F(QuorumTest, ARestartedGroupIsAdmittedAtTheNextRoundAndHealsFirst) {
  auto a = client("a", 2), b = client("b", 2);
  start({a.get(), b.get()});
  commit({a.get(), b.get()});
  start({a.get(), b.get()});
  commit({a.get(), b.get()});  // both at step 2

  auto c = client("c", 2, 0, "restarted");
  auto joined =
      std::async(std::launch::async, [&] { return c->start_quorum(); });
  ASSERT_TRUE(test::eventually([&] {
    return value("pending").find("c:restarted") != std::string::npos;
  }));
  // The round that sees the join is the last without c.
  start({a.get(), b.get()});
  commit({a.get(), b.get()});
  auto q = start({a.get(), b.get()});
  Quorum qc = joined.get();
  EXPECT_EQ(q[0].replica_world_size, 3);
  EXPECT_EQ(qc.id, q[0].id);
  EXPECT_EQ(qc.round, q[0].round);
  EXPECT_TRUE(qc.heal());
  EXPECT_EQ(qc.max_step, 3);
  EXPECT_EQ(qc.step, 0);
  EXPECT_THAT(qc.heal_from, ::testing::AnyOf("a:0", "b:0"));
  ASSERT_THAT(qc.heal_from_rank, ::testing::AnyOf(0, 1));
  EXPECT_EQ(q[qc.heal_from_rank].heal_to, std::vector<int>{2});
  EXPECT_TRUE(q[1 - qc.heal_from_rank].heal_to.empty());
  EXPECT_FALSE(q[0].heal());
  c->healed(qc.max_step);
  EXPECT_EQ(commit({a.get(), b.get(), c.get()}), std::vector<bool>(3, true));
  EXPECT_EQ(c->step(), 4);
  EXPECT_EQ(a->step(), 4);
}

TEST_F(QuorumTest, AJoinerClaimingAStepAheadOfTheQuorumIsRefused) {
  auto a = client("a", 1);
  start({a.get()});
  commit({a.get()});
  auto liar = client("b", 1, 1000);
  auto joined = std::async(std::launch::async, [&] { liar->start_quorum(); });
  ASSERT_TRUE(test::eventually(
      [&] { return value("pending").find("b:0") != std::string::npos; }));
  start({a.get()});
  commit({a.get()});
  start({a.get()});
  EXPECT_THAT(
      [&] { joined.get(); },
      ::testing::ThrowsMessage<InvalidArgument>(
          HasSubstr("claims step 1000 but the quorum is at step 2")));
  EXPECT_EQ(commit({a.get()}), std::vector<bool>{true});
  EXPECT_EQ(a->step(), 3);
}

TEST_F(QuorumTest, AGroupWhoseHeartbeatStopsIsDeclaredOutByItsNeighbour) {
  auto hb = [&](const std::string& g) {
    auto o = options(g, 3);
    o.heartbeat_timeout = 3s;
    return std::make_unique<QuorumClient>([this] { return connect(); }, o, 0);
  };
  auto a = hb("a"), b = hb("b"), c = hb("c");
  start({a.get(), b.get(), c.get()});
  c.reset();  // hung: its heartbeat stops, it never votes
  EXPECT_EQ(commit({a.get(), b.get()}), std::vector<bool>(2, false));
  EXPECT_THAT(value("dead"), HasSubstr("c:0\tno heartbeat for 3000 ms"));
  auto next = start({a.get(), b.get()});
  EXPECT_EQ(next[0].replica_world_size, 2);
  EXPECT_EQ(commit({a.get(), b.get()}), std::vector<bool>(2, true));
}

TEST_F(QuorumTest, ARoundWithFewerGroupsThanTheMinimumNeverCommits) {
  auto o = options("a", 1);
  o.min_replica_size = 2;
  QuorumClient a([this] { return connect(); }, o, 5);
  Quorum q = a.start_quorum();
  EXPECT_EQ(q.replica_world_size, 1);
  EXPECT_FALSE(a.should_commit(true));
  EXPECT_EQ(a.step(), 5);
  EXPECT_THAT(value("round/0/done"), HasSubstr("only 1 groups of the 2"));
}

TEST_F(QuorumTest, ANoVoteAbortsTheRoundForEveryone) {
  auto a = client("a", 2), b = client("b", 2);
  start({a.get(), b.get()});
  auto yes =
      std::async(std::launch::async, [&] { return a->should_commit(true); });
  EXPECT_FALSE(b->should_commit(false));
  EXPECT_FALSE(yes.get());
  // An aborted round is followed by a new quorum of the same members.
  auto q = start({a.get(), b.get()});
  EXPECT_EQ(q[0].replica_world_size, 2);
  EXPECT_EQ(q[0].id, 1);
  EXPECT_EQ(commit({a.get(), b.get()}), std::vector<bool>(2, true));
}

TEST_F(QuorumTest, BadInputIsRefusedWithWhatWasExpected) {
  EXPECT_THAT(
      [&] { client("a:b", 1); },
      ::testing::ThrowsMessage<InvalidArgument>(HasSubstr("'a:b'")));
  auto o = options("a", 1);
  o.group_rank = 2;
  EXPECT_THAT(
      [&] { QuorumClient([this] { return connect(); }, o, 0); },
      ::testing::ThrowsMessage<InvalidArgument>(
          HasSubstr("group rank 2 is not in a group of 1")));
  // A record nobody could have written: a clear error, not a crash.
  connect()->set("round/0/quorum", "{not json");
  auto a = client("a", 1);
  EXPECT_THAT(
      [&] { a->start_quorum(); },
      ::testing::ThrowsMessage<ProtocolError>(
          HasSubstr("quorum record of round 0")));
}

TEST(QuorumTorchStoreTest, AStoreWithoutTheVotesCommandIsNamedAtOnce) {
  test::TorchStoreStandIn torch;
  auto connect = [&torch] {
    return std::make_shared<store::TcpStore>(store::TcpStoreOptions{
        .port = torch.port(),
        .dialect = store::Dialect::kModern,
        .timeout = 10s});
  };
  EXPECT_THAT(
      [&] {
        QuorumClient(
            connect, QuorumOptions{.group = "a", .incarnation = "0"}, 0);
      },
      ::testing::ThrowsMessage<NetworkError>(
          HasSubstr("a tide store's command")));
}

TEST(QuorumEtcdTest, TheRoundsLiveInEtcdAndGoOnWhenAMemberDies) {
  auto cluster = test::EtcdCluster::start(3);
  auto connect = [&] {
    return std::make_shared<etcd::EtcdStore>(
        cluster.endpoints(), "/tide/ft-test", 10s);
  };
  auto make = [&](const std::string& g) {
    return std::make_unique<QuorumClient>(
        connect,
        QuorumOptions{
            .group = g,
            .incarnation = "0",
            .expected_groups = 2,
            .timeout = 30s,
            .heartbeat_timeout = 30s},
        0);
  };
  auto a = make("a"), b = make("b");
  auto round = [&] {
    auto fa = std::async(std::launch::async, [&] { a->start_quorum(); });
    b->start_quorum();
    fa.get();
    auto va =
        std::async(std::launch::async, [&] { return a->should_commit(true); });
    EXPECT_TRUE(b->should_commit(true));
    EXPECT_TRUE(va.get());
  };
  round();
  cluster.kill(0);
  round();
  round();
  EXPECT_EQ(a->step(), 3);
}

}  // namespace
}  // namespace tide::ft
