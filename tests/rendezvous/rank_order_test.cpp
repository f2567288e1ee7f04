// --rank-order: the pure ordering (natural, lexicographic, node-rank), then
// DynamicRendezvousHandlers of one process arriving in a chosen order over a
// HashStore, a TcpStore and etcd, each checking its rank and that the
// workers' master is rank 0's address.
#include "rendezvous/rank_order.h"

#include <algorithm>
#include <future>
#include <map>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/rendezvous/dynamic_rendezvous.h"
#include "tide/store/hash_store.h"
#include "tide/store/tcp_store.h"

#include "etcd/etcd_client.h"
#include "support/etcd.h"

namespace tide::rendezvous {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// The ordering alone.

Participant node(
    int64_t arrival,
    std::string host,
    std::string addr = "10.0.0.1",
    std::optional<int64_t> node_rank = std::nullopt) {
  return Participant{
      .arrival = arrival,
      .host = std::move(host),
      .addr = std::move(addr),
      .pid = 100 + arrival,
      .local_id = 0,
      .node_rank = node_rank};
}

std::vector<std::string> natural_sorted(std::vector<std::string> names) {
  std::sort(names.begin(), names.end(), [](const auto& a, const auto& b) {
    return natural_compare(a, b) < 0;
  });
  return names;
}

// The ranks the arrivals 1..n get, by arrival.
std::vector<int64_t> ranks_by_arrival(const RankAssignment& a) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i <= static_cast<int64_t>(a.arrivals.size()); ++i) {
    out.push_back(a.rank_of(i));
  }
  return out;
}

TEST(RankOrder, NaturalCompareReadsDigitRunsAsNumbers) {
  EXPECT_LT(natural_compare("node7", "node66"), 0);
  EXPECT_LT(natural_compare("node66", "node100"), 0);
  EXPECT_GT(natural_compare("node100", "node7"), 0);
  EXPECT_EQ(natural_compare("node7", "node7"), 0);
  EXPECT_EQ(
      natural_sorted({"node100", "node7", "node66", "node8"}),
      (std::vector<std::string>{"node7", "node8", "node66", "node100"}));
  // Longer than any integer type: compared by length, then digits.
  EXPECT_LT(
      natural_compare("n99999999999999999999999", "n100000000000000000000000"),
      0);
}

TEST(RankOrder, NaturalCompareBreaksTiesOfEqualNumbersByPlainOrder) {
  // Equal as numbers, so the leading zeros decide, the same way each time:
  // never 0 for different names (two hosts never tie).
  EXPECT_LT(natural_compare("node07", "node7"), 0);
  EXPECT_GT(natural_compare("node7", "node07"), 0);
  EXPECT_LT(natural_compare("node007", "node07"), 0);
  // A larger number wins over fewer leading zeros.
  EXPECT_LT(natural_compare("node7", "node08"), 0);
  EXPECT_LT(natural_compare("node07a", "node7b"), 0);
  EXPECT_LT(natural_compare("node7a", "node07b"), 0);
  EXPECT_LT(natural_compare("n0", "n00"), 0);
  EXPECT_GT(natural_compare("n00", "n0"), 0);
}

TEST(RankOrder, NaturalCompareHandlesNamesWithoutDigitsAndFqdns) {
  EXPECT_LT(natural_compare("alpha", "beta"), 0);
  EXPECT_LT(natural_compare("gpu", "gpu1"), 0);  // a prefix first
  EXPECT_LT(natural_compare("", "a"), 0);
  EXPECT_LT(natural_compare("node7.rack1", "node66.rack1"), 0);
  EXPECT_LT(natural_compare("node7.rack2", "node7.rack10"), 0);
  EXPECT_LT(natural_compare("rack2-node9", "rack10-node1"), 0);
  EXPECT_EQ(
      natural_sorted({"node66.rack1", "node100.rack1", "node7.rack1"}),
      (std::vector<std::string>{
          "node7.rack1", "node66.rack1", "node100.rack1"}));
}

TEST(RankOrder, NaturalOrderRanksByHostThenAddrThenArrival) {
  auto a = assign_ranks(
      RankOrder::kNatural,
      {node(1, "node100"),
       node(2, "node66"),
       node(3, "node7", "10.0.0.9"),
       node(4, "node7", "10.0.0.2"),
       node(5, "node7", "10.0.0.2")});
  EXPECT_EQ(a.order, RankOrder::kNatural);
  EXPECT_EQ(a.arrivals, (std::vector<int64_t>{4, 5, 3, 2, 1}));
  EXPECT_TRUE(a.fallback.empty());
}

TEST(RankOrder, LexicographicIsTorchsOrderOfAddrPidLocalId) {
  auto p = [](int64_t arrival, std::string addr, int64_t pid, int64_t id) {
    Participant x = node(arrival, "h", std::move(addr));
    x.pid = pid;
    x.local_id = id;
    return x;
  };
  auto a = assign_ranks(
      RankOrder::kLexicographic,
      {p(1, "node7", 5, 0),
       p(2, "node66", 5, 0),
       p(3, "node100", 5, 0),
       p(4, "node66", 10, 0),
       p(5, "node66", 5, 1)});
  // node100 < node66 < node7 as strings; pids and ids as integers.
  EXPECT_EQ(a.arrivals, (std::vector<int64_t>{3, 2, 5, 4, 1}));
}

TEST(RankOrder, NodeRankGivesContiguousRanksWhateverTheNodeRanks) {
  auto a = assign_ranks(
      RankOrder::kNodeRank,
      {node(1, "a", "x", 3), node(2, "b", "x", 0), node(3, "c", "x", 7)});
  EXPECT_EQ(a.order, RankOrder::kNodeRank);
  EXPECT_TRUE(a.fallback.empty());
  EXPECT_EQ(ranks_by_arrival(a), (std::vector<int64_t>{1, 0, 2}));
}

TEST(RankOrder, NodeRankWithOneMissingFallsBackToArrivalNamingIt) {
  auto a = assign_ranks(
      RankOrder::kNodeRank,
      {node(1, "a", "x", 2),
       node(2, "nodeB", "10.0.0.5"),
       node(3, "c", "x", 0)});
  EXPECT_EQ(a.order, RankOrder::kArrival);
  EXPECT_EQ(ranks_by_arrival(a), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_NE(
      a.fallback.find("no node rank from nodeB (10.0.0.5_102_0)"),
      std::string::npos)
      << a.fallback;
}

TEST(RankOrder, NodeRankWithDuplicatesFallsBackToArrivalNamingThem) {
  auto a = assign_ranks(
      RankOrder::kNodeRank,
      {node(1, "a", "x", 1), node(2, "b", "x", 1), node(3, "c", "x", 0)});
  EXPECT_EQ(a.order, RankOrder::kArrival);
  EXPECT_EQ(ranks_by_arrival(a), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_NE(
      a.fallback.find("node rank 1 from each of a (x_101_0), b (x_102_0)"),
      std::string::npos)
      << a.fallback;
}

TEST(RankOrder, EveryOrderGivesUniqueContiguousRanksForAnyInput) {
  std::vector<Participant> ps;
  for (int64_t i = 1; i <= 40; ++i) {
    // Hosts that collide, addresses that collide, node ranks with gaps,
    // given in a shuffled order.
    ps.push_back(node(
        i,
        "node" + std::to_string((i * 7) % 13),
        "10.0.0." + std::to_string(i % 5),
        (i * 17) % 101));
  }
  std::reverse(ps.begin(), ps.end());
  for (RankOrder order :
       {RankOrder::kArrival,
        RankOrder::kNatural,
        RankOrder::kNodeRank,
        RankOrder::kLexicographic}) {
    auto a = assign_ranks(order, ps);
    EXPECT_EQ(a.order, order);
    std::set<int64_t> arrivals(a.arrivals.begin(), a.arrivals.end());
    ASSERT_EQ(a.arrivals.size(), 40u) << rank_order_name(order);
    EXPECT_EQ(arrivals.size(), 40u) << rank_order_name(order);
    EXPECT_EQ(*arrivals.begin(), 1);
    EXPECT_EQ(*arrivals.rbegin(), 40);
    // The same on every node: the input's order does not matter.
    std::vector<Participant> other(ps.rbegin(), ps.rend());
    EXPECT_EQ(assign_ranks(order, other).arrivals, a.arrivals);
  }
}

TEST(RankOrder, NamesParseAndABadOneNamesTheAllowedOnes) {
  for (RankOrder order :
       {RankOrder::kArrival,
        RankOrder::kNatural,
        RankOrder::kNodeRank,
        RankOrder::kLexicographic}) {
    EXPECT_EQ(parse_rank_order(rank_order_name(order)), order);
  }
  EXPECT_EQ(rank_order_name(RankOrder::kNodeRank), "node-rank");
  try {
    parse_rank_order("alphabetical");
    FAIL() << "accepted a bad rank order";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "expected arrival, natural, node-rank or lexicographic"),
        std::string::npos)
        << e.what();
  }
}

TEST(RankOrder, SettingsReadRankOrderAndNodeRank) {
  RendezvousParameters p{
      .backend = "c10d", .run_id = "r", .min_nodes = 1, .max_nodes = 3};
  auto s = DynamicRendezvousSettings::from(p);
  EXPECT_EQ(s.rank_order, RankOrder::kArrival);
  EXPECT_FALSE(s.node_rank.has_value());
  p.config = {{"rank_order", "node-rank"}, {"node_rank", "7"}};
  s = DynamicRendezvousSettings::from(p);
  EXPECT_EQ(s.rank_order, RankOrder::kNodeRank);
  EXPECT_EQ(s.node_rank, 7);
  p.config = {{"rank_order", "natural"}};
  EXPECT_EQ(DynamicRendezvousSettings::from(p).rank_order, RankOrder::kNatural);
  for (const char* bad : {"-1", "x", "99999999999"}) {
    p.config = {{"node_rank", bad}};
    EXPECT_THROW(DynamicRendezvousSettings::from(p), InvalidArgument) << bad;
  }
  p.config = {{"rank_order", "sorted"}};
  EXPECT_THROW(DynamicRendezvousSettings::from(p), InvalidArgument);
}

// ---------------------------------------------------------------------------
// Handlers of one process, over one store.

// A node to make: its host name, address and node rank.
struct NodeSpec {
  std::string host;
  std::string addr;
  std::optional<int> node_rank;
};

DynamicRendezvousSettings settings_for(
    int min_nodes, int max_nodes, RankOrder order) {
  DynamicRendezvousSettings s;
  s.run_id = "job";
  s.min_nodes = min_nodes;
  s.max_nodes = max_nodes;
  s.join_timeout = 20s;
  // Short for quick tests, yet long enough that a stall of a loaded
  // machine neither closes a round before all its nodes are in nor looks
  // like a lost node (lost after 1 s, also the store calls' timeout).
  s.last_call_timeout = 1s;
  s.keep_alive_interval = 200ms;
  s.keep_alive_max_attempt = 5;
  s.rank_order = order;
  return s;
}

struct StoreJob {
  std::shared_ptr<store::Store> store;
  DynamicRendezvousSettings settings;

  std::unique_ptr<DynamicRendezvousHandler> make(const NodeSpec& n) {
    return make(
        n,
        make_store_backend(
            store, [s = store] { return s; }, "job"));
  }
  std::unique_ptr<DynamicRendezvousHandler> make(
      const NodeSpec& n, std::unique_ptr<RendezvousBackend> backend) {
    DynamicRendezvousSettings s = settings;
    s.node_rank = n.node_rank;
    NodeDesc desc = NodeDesc::make(n.addr);
    desc.host = n.host;
    return std::make_unique<DynamicRendezvousHandler>(
        "c10d", std::move(backend), s, desc);
  }
};

using Handlers = std::vector<std::unique_ptr<DynamicRendezvousHandler>>;

// Starts each handler's next_rendezvous in turn, the next once the one
// before has joined round `round` (its descriptor is in the store): arrival
// i is handlers[i-1].
std::vector<std::future<RendezvousInfo>> arrive_in_order(
    const Handlers& nodes, store::Store& st, int64_t round = 0) {
  std::vector<std::future<RendezvousInfo>> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto* h = nodes[i].get();
    out.push_back(
        std::async(std::launch::async, [h] { return h->next_rendezvous(); }));
    if (i + 1 < nodes.size()) {
      // Throws TimeoutError (failing the test) if it never joins.
      st.wait(
          {"tide.rdzv/job/r" + std::to_string(round) + "/node/" +
           std::to_string(i + 1)},
          10s);
    }
  }
  return out;
}

std::vector<RendezvousInfo> get_all(
    std::vector<std::future<RendezvousInfo>> f) {
  std::vector<RendezvousInfo> out;
  for (auto& x : f) {
    out.push_back(x.get());
  }
  return out;
}

// infos[i] is specs[i]'s: their ranks are `ranks`, and every node's master
// is the address of the node with rank 0.
void expect_ranks_and_master(
    const std::vector<RendezvousInfo>& infos,
    const std::vector<NodeSpec>& specs,
    const std::vector<int>& ranks) {
  ASSERT_EQ(infos.size(), ranks.size());
  std::string rank0_addr;
  for (size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ(infos[i].rank, ranks[i]) << specs[i].host << " " << specs[i].addr;
    EXPECT_EQ(infos[i].world_size, static_cast<int>(infos.size()));
    if (ranks[i] == 0) {
      rank0_addr = specs[i].addr;
    }
  }
  for (const auto& info : infos) {
    EXPECT_EQ(info.bootstrap.master_addr, rank0_addr);
    EXPECT_EQ(info.bootstrap.master_port, infos[0].bootstrap.master_port);
    EXPECT_NE(info.bootstrap.master_port, 0);
    EXPECT_EQ(info.round, infos[0].round);
  }
}

class RankOrderHandlerTest : public ::testing::Test {
 protected:
  std::vector<RendezvousInfo> run_round(
      RankOrder order, const std::vector<NodeSpec>& specs) {
    job_.settings = settings_for(
        static_cast<int>(specs.size()), static_cast<int>(specs.size()), order);
    for (const auto& s : specs) {
      nodes_.push_back(job_.make(s));
    }
    return get_all(arrive_in_order(nodes_, *job_.store));
  }

  StoreJob job_{.store = store::make_hash_store()};
  Handlers nodes_;
};

// Arrive as node100, node66, node7: the reverse of natural order, and the
// plain string order of the names.
const std::vector<NodeSpec> kHosts = {
    {"node100", "10.0.0.1", std::nullopt},
    {"node66", "10.0.0.2", std::nullopt},
    {"node7", "10.0.0.3", std::nullopt}};

TEST_F(RankOrderHandlerTest, ArrivalOrderIsTheDefaultAndUnchanged) {
  auto infos = run_round(RankOrder::kArrival, kHosts);
  expect_ranks_and_master(infos, kHosts, {0, 1, 2});
}

TEST_F(RankOrderHandlerTest, NaturalOrderRanksHostsByNameNotArrival) {
  auto infos = run_round(RankOrder::kNatural, kHosts);
  expect_ranks_and_master(infos, kHosts, {2, 1, 0});
}

TEST_F(RankOrderHandlerTest, LexicographicOrderIsTorchsByAddress) {
  // Addresses node7, node66, node100 as torch would see host names.
  std::vector<NodeSpec> specs = {
      {"h", "node7", std::nullopt},
      {"h", "node66", std::nullopt},
      {"h", "node100", std::nullopt}};
  auto infos = run_round(RankOrder::kLexicographic, specs);
  expect_ranks_and_master(infos, specs, {2, 1, 0});
}

TEST_F(RankOrderHandlerTest, NodeRankOrderFollowsTheGivenNodeRanks) {
  std::vector<NodeSpec> specs = {
      {"a", "10.0.0.1", 3}, {"b", "10.0.0.2", 0}, {"c", "10.0.0.3", 7}};
  auto infos = run_round(RankOrder::kNodeRank, specs);
  expect_ranks_and_master(infos, specs, {1, 0, 2});
}

TEST_F(RankOrderHandlerTest, NodeRankOrderWithADuplicateFallsBackToArrival) {
  std::vector<NodeSpec> specs = {
      {"a", "10.0.0.1", 2}, {"b", "10.0.0.2", 2}, {"c", "10.0.0.3", 0}};
  auto infos = run_round(RankOrder::kNodeRank, specs);
  expect_ranks_and_master(infos, specs, {0, 1, 2});
}

TEST_F(RankOrderHandlerTest, AParticipantThatDiedBeforeDescribingItselfIsLeft) {
  // Arrival 1 of round 0 was counted and died before writing its
  // descriptor: the others cannot order round 0 and form round 1.
  job_.settings = settings_for(2, 3, RankOrder::kNatural);
  job_.store->add("tide.rdzv/job/r0/count", 1);
  std::vector<NodeSpec> specs = {kHosts[0], kHosts[2]};
  for (const auto& s : specs) {
    nodes_.push_back(job_.make(s));
  }
  std::vector<std::future<RendezvousInfo>> f;
  for (auto& n : nodes_) {
    f.push_back(
        std::async(std::launch::async, [&n] { return n->next_rendezvous(); }));
  }
  auto infos = get_all(std::move(f));
  EXPECT_EQ(infos[0].round, 1);
  expect_ranks_and_master(infos, specs, {1, 0});
}

TEST_F(RankOrderHandlerTest, SurvivorsReRankWhenTheRankZeroNodeIsLost) {
  // The keep-alive ring follows arrival, whatever the ranks: losing node7
  // (rank 0, arrival 3) is noticed, and the next round's rank 0 (node66)
  // publishes the master. 2:3 nodes; the round of three closes at its
  // third arrival, the round of two after the last call.
  job_.settings = settings_for(2, 3, RankOrder::kNatural);
  job_.settings.last_call_timeout = 2s;
  for (const auto& s : kHosts) {
    nodes_.push_back(job_.make(s));
  }
  auto first = get_all(arrive_in_order(nodes_, *job_.store));
  expect_ranks_and_master(first, kHosts, {2, 1, 0});
  nodes_.pop_back();  // node7 dies: no heartbeat, no goodbye
  std::vector<std::future<RendezvousInfo>> again;
  for (auto& n : nodes_) {
    again.push_back(std::async(std::launch::async, [&n] {
      for (auto until = Clock::now() + 10s; Clock::now() < until;) {
        if (n->num_nodes_waiting() > 0) {
          break;
        }
        std::this_thread::sleep_for(5ms);
      }
      return n->next_rendezvous();
    }));
  }
  auto second = get_all(std::move(again));
  std::vector<NodeSpec> survivors(kHosts.begin(), kHosts.begin() + 2);
  expect_ranks_and_master(second, survivors, {1, 0});
  EXPECT_GT(second[0].round, first[0].round);
}

TEST_F(RankOrderHandlerTest, NodesToldDifferentOrdersEndTheJobWithAClearError) {
  job_.settings = settings_for(2, 2, RankOrder::kNatural);
  nodes_.push_back(job_.make(kHosts[0]));
  job_.settings.rank_order = RankOrder::kLexicographic;
  nodes_.push_back(job_.make(kHosts[1]));
  auto f = arrive_in_order(nodes_, *job_.store);
  for (auto& x : f) {
    try {
      x.get();
      FAIL() << "a node ranked a round of mixed orders";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(
          std::string(e.what()).find("use different rank orders"),
          std::string::npos)
          << e.what();
    }
  }
  auto newcomer = job_.make(kHosts[2]);
  EXPECT_THROW(newcomer->next_rendezvous(), RendezvousClosedError);
}

// A backend that forwards everything but participants(), as a user's own
// backend written before --rank-order would.
class NoParticipantsBackend final : public RendezvousBackend {
 public:
  explicit NoParticipantsBackend(std::unique_ptr<RendezvousBackend> inner)
      : inner_(std::move(inner)) {}
  std::optional<std::string> get_state() override {
    return inner_->get_state();
  }
  std::string compare_set_state(
      const std::optional<std::string>& expected,
      const std::string& desired) override {
    return inner_->compare_set_state(expected, desired);
  }
  int64_t join(int64_t round, const std::string& node) override {
    return inner_->join(round, node);
  }
  int64_t arrivals(int64_t round) override {
    return inner_->arrivals(round);
  }
  std::string set_once(
      int64_t round,
      const std::string& name,
      const std::string& value) override {
    return inner_->set_once(round, name, value);
  }
  std::optional<std::string> get_value(
      int64_t round, const std::string& name) override {
    return inner_->get_value(round, name);
  }
  std::optional<std::string> wait_value(
      int64_t round, const std::string& name, milliseconds timeout) override {
    return inner_->wait_value(round, name, timeout);
  }
  void set_timeout(milliseconds timeout) override {
    inner_->set_timeout(timeout);
  }
  void leave(
      int64_t round,
      int64_t index,
      int64_t size,
      const DynamicRendezvousSettings& s) override {
    inner_->leave(round, index, size, s);
  }
  std::unique_ptr<RoundMonitor> monitor(
      int64_t round,
      int64_t index,
      const DynamicRendezvousSettings& s) override {
    return inner_->monitor(round, index, s);
  }
  std::shared_ptr<store::Store> round_store(int64_t round) override {
    return inner_->round_store(round);
  }

 private:
  std::unique_ptr<RendezvousBackend> inner_;
};

TEST_F(RankOrderHandlerTest, ABackendThatCannotListParticipantsIsAClearError) {
  job_.settings = settings_for(1, 1, RankOrder::kNatural);
  auto h = job_.make(
      kHosts[0],
      std::make_unique<NoParticipantsBackend>(make_store_backend(
          job_.store, [s = job_.store] { return s; }, "job")));
  try {
    h->next_rendezvous();
    FAIL() << "ranked without the participants";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("cannot list a round's participants"),
        std::string::npos)
        << e.what();
  }
}

TEST(RankOrderTcpStore, NaturalOrderOverATcpStore) {
  auto server = std::make_shared<store::TcpStore>(
      store::TcpStoreOptions{.port = 0, .is_server = true, .timeout = 10s});
  auto connect = [port = server->port()] {
    return std::make_shared<store::TcpStore>(
        store::TcpStoreOptions{.port = port, .timeout = 10s});
  };
  StoreJob job{
      .store = server, .settings = settings_for(3, 3, RankOrder::kNatural)};
  Handlers nodes;
  for (const auto& s : kHosts) {
    // Each node its own connection, as across hosts.
    nodes.push_back(job.make(s, make_store_backend(connect(), connect, "job")));
  }
  auto infos = get_all(arrive_in_order(nodes, *server));
  expect_ranks_and_master(infos, kHosts, {2, 1, 0});
  for (auto& n : nodes) {
    n->shutdown();
  }
}

// ---------------------------------------------------------------------------
// The etcd backend, through make_etcd_handler as tiderun makes it.

// Waits up to 20 s for key to exist in etcd.
bool etcd_key_appears(const std::string& endpoints, const std::string& key) {
  etcd::EtcdClient c(endpoints, 5s);
  auto until = Clock::now() + 20s;
  for (;;) {
    auto res = c.range(key);
    if (!res.kvs.empty()) {
      return true;
    }
    auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
    if (left <= 0ms) {
      return false;
    }
    c.watch(key, res.revision + 1, left);
  }
}

// Waits up to 20 s for no key to start with prefix in etcd.
bool etcd_prefix_empties(
    const std::string& endpoints, const std::string& prefix) {
  etcd::EtcdClient c(endpoints, 5s);
  auto until = Clock::now() + 20s;
  for (;;) {
    auto res = c.range(prefix, etcd::RangeOptions{.prefix = true});
    if (res.kvs.empty()) {
      return true;
    }
    auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
    if (left <= 0ms) {
      return false;
    }
    c.watch(prefix, res.revision + 1, left, /*prefix=*/true);
  }
}

TEST(RankOrderEtcd, NodeRankAndNaturalOrdersOverEtcd) {
  auto etcd = test::EtcdCluster::start(1);
  struct Case {
    std::string run_id;
    std::string order;
    std::vector<std::string> node_ranks;  // per node, "" for none
    std::vector<int> ranks;
  };
  // Natural order needs distinct host names, which one process does not
  // have: all three share it, so the address decides (10.0.0.1 < 2 < 3),
  // and that is the arrival order reversed below.
  for (const Case& c :
       {Case{"noderank", "node-rank", {"7", "0", "3"}, {2, 0, 1}},
        Case{"natural", "natural", {"", "", ""}, {2, 1, 0}}}) {
    SCOPED_TRACE(c.order);
    std::vector<std::unique_ptr<RendezvousHandler>> nodes;
    std::vector<std::future<RendezvousInfo>> f;
    std::vector<NodeSpec> specs;
    for (size_t i = 0; i < 3; ++i) {
      RendezvousParameters p{
          .backend = "etcd",
          .endpoint = etcd.endpoints(),
          .run_id = c.run_id,
          .min_nodes = 3,
          .max_nodes = 3,
          .local_addr = "10.0.0." + std::to_string(3 - i),
          .config = {
              {"rank_order", c.order},
              // Leases of 3 s: a loaded machine's stall loses no node.
              {"keep_alive_interval", "1"},
              {"join_timeout", "30"},
              {"read_timeout", "5"}}};
      if (!c.node_ranks[i].empty()) {
        p.config["node_rank"] = c.node_ranks[i];
      }
      specs.push_back(NodeSpec{"", p.local_addr, std::nullopt});
      auto h = make_etcd_handler(p);
      auto* raw = h.get();
      f.push_back(std::async(
          std::launch::async, [raw] { return raw->next_rendezvous(); }));
      nodes.push_back(std::move(h));
      ASSERT_TRUE(etcd_key_appears(
          etcd.endpoints(),
          "/tide/rdzv/" + c.run_id + "/r0/join/" + std::to_string(i + 1)));
    }
    auto infos = get_all(std::move(f));
    expect_ranks_and_master(infos, specs, c.ranks);
    for (auto& n : nodes) {
      n->shutdown();
    }
    // Each keep-alive thread revokes its lease as it ends: wait for that
    // while etcd is up, so none is left calling it after the test.
    EXPECT_TRUE(etcd_prefix_empties(
        etcd.endpoints(), "/tide/rdzv/" + c.run_id + "/r0/alive/"));
  }
}

}  // namespace
}  // namespace tide::rendezvous
