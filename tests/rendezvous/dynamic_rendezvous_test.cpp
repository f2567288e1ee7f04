// The dynamic rendezvous' state machine, with every node a thread of this
// process and the state in one HashStore (the c10d backend's logic without
// the network; tests/apps covers it across processes).
#include "tide/rendezvous/dynamic_rendezvous.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/store/hash_store.h"

#include "support/eventually.h"

namespace tide::rendezvous {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Job {
  std::shared_ptr<store::Store> store = store::make_hash_store();
  DynamicRendezvousSettings settings;

  explicit Job(int min_nodes, int max_nodes, std::string run_id = "job") {
    settings.run_id = std::move(run_id);
    settings.min_nodes = min_nodes;
    settings.max_nodes = max_nodes;
    settings.join_timeout = 20s;
    // Short for quick tests, yet long enough that a stall of a loaded
    // machine neither closes a round before all its nodes are in nor looks
    // like a lost node (lost after 1 s).
    settings.last_call_timeout = 1s;
    settings.keep_alive_interval = 200ms;
    settings.keep_alive_max_attempt = 5;
  }

  // connects: counts the keep-alive connections the node makes.
  std::unique_ptr<DynamicRendezvousHandler> node(
      std::shared_ptr<std::atomic<int>> connects = nullptr) {
    auto s = store;
    return std::make_unique<DynamicRendezvousHandler>(
        "c10d",
        make_store_backend(
            s,
            [s, connects] {
              if (connects) {
                ++*connects;
              }
              return s;
            },
            settings.run_id),
        settings,
        NodeDesc::make("127.0.0.1"));
  }
};

using Handlers = std::vector<std::unique_ptr<DynamicRendezvousHandler>>;

// Every handler's next_rendezvous, at once.
std::vector<RendezvousInfo> all_next(const Handlers& nodes) {
  std::vector<std::future<RendezvousInfo>> f;
  for (const auto& n : nodes) {
    f.push_back(
        std::async(std::launch::async, [&n] { return n->next_rendezvous(); }));
  }
  std::vector<RendezvousInfo> out;
  for (auto& x : f) {
    out.push_back(x.get());
  }
  return out;
}

void expect_one_round(const std::vector<RendezvousInfo>& infos, int size) {
  std::set<int> ranks;
  for (const auto& i : infos) {
    EXPECT_EQ(i.world_size, size);
    EXPECT_EQ(i.round, infos[0].round);
    EXPECT_EQ(i.bootstrap.master_port, infos[0].bootstrap.master_port);
    EXPECT_NE(i.bootstrap.master_port, 0);
    ranks.insert(i.rank);
  }
  ASSERT_EQ(ranks.size(), static_cast<size_t>(size));
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), size - 1);
}

// Polls a handler until it reports waiting or lost nodes.
bool becomes_waiting(DynamicRendezvousHandler& h, std::chrono::seconds limit) {
  auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    if (h.num_nodes_waiting() > 0) {
      return true;
    }
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

TEST(DynamicRendezvous, FixedSizeRoundGivesContiguousUniqueRanks) {
  Job job(6, 6);
  Handlers nodes;
  for (int i = 0; i < 6; ++i) {
    nodes.push_back(job.node());
  }
  auto infos = all_next(nodes);
  expect_one_round(infos, 6);
  // The agents' store is shared within the round.
  infos[0].store->set("k", "v");
  EXPECT_EQ(infos[5].store->get("k"), "v");
}

TEST(DynamicRendezvous, ElasticRoundClosesAfterLastCall) {
  Job job(2, 4);
  Handlers nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(job.node());
  }
  expect_one_round(all_next(nodes), 3);
}

TEST(DynamicRendezvous, LateNodeMakesTheRoundRestartAndIsAdmitted) {
  Job job(2, 4);
  Handlers nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(job.node());
  }
  auto first = all_next(nodes);
  expect_one_round(first, 3);
  for (const auto& n : nodes) {
    EXPECT_EQ(n->num_nodes_waiting(), 0);
  }
  nodes.push_back(job.node());
  auto late = std::async(
      std::launch::async, [&] { return nodes[3]->next_rendezvous(); });
  // The running nodes see it and restart, as their agents would.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(becomes_waiting(*nodes[static_cast<size_t>(i)], 10s));
  }
  Handlers running;
  std::vector<std::future<RendezvousInfo>> again;
  for (int i = 0; i < 3; ++i) {
    again.push_back(std::async(std::launch::async, [&, i] {
      return nodes[static_cast<size_t>(i)]->next_rendezvous();
    }));
  }
  std::vector<RendezvousInfo> second{late.get()};
  for (auto& f : again) {
    second.push_back(f.get());
  }
  expect_one_round(second, 4);
  EXPECT_GT(second[0].round, first[0].round);
}

TEST(DynamicRendezvous, TheKeepAliveConnectsOnceAndKeepsItAcrossRounds) {
  // Thousands of agents opening a keep-alive connection at once as every
  // round completes overflow the store's accept queue: one per node, kept.
  Job job(2, 3);
  std::vector<std::shared_ptr<std::atomic<int>>> connects;
  Handlers nodes;
  for (int i = 0; i < 2; ++i) {
    connects.push_back(std::make_shared<std::atomic<int>>(0));
    nodes.push_back(job.node(connects.back()));
  }
  expect_one_round(all_next(nodes), 2);
  nodes.push_back(job.node());
  auto late = std::async(
      std::launch::async, [&] { return nodes[2]->next_rendezvous(); });
  std::vector<std::future<RendezvousInfo>> again;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(becomes_waiting(*nodes[static_cast<size_t>(i)], 10s));
    again.push_back(std::async(std::launch::async, [&, i] {
      return nodes[static_cast<size_t>(i)]->next_rendezvous();
    }));
  }
  std::vector<RendezvousInfo> second{late.get()};
  for (auto& f : again) {
    second.push_back(f.get());
  }
  expect_one_round(second, 3);
  // Two rounds each; the second round's keep-alives beat (every 200 ms) and
  // see nothing to restart for.
  for (auto& n : nodes) {
    ASSERT_FALSE(becomes_waiting(*n, 1s));
  }
  for (const auto& c : connects) {
    EXPECT_EQ(c->load(), 1);
  }
}

TEST(DynamicRendezvous, NodeBeyondMaxIsASpareAndTriggersNoRestart) {
  Job job(2, 2);
  Handlers nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(job.node());
  }
  expect_one_round(all_next(nodes), 2);
  auto spare = job.node();
  auto spare_round =
      std::async(std::launch::async, [&] { return spare->next_rendezvous(); });
  // The spare waits without disturbing the full round: several keep-alive
  // intervals pass with nothing waiting.
  EXPECT_EQ(spare_round.wait_for(1s), std::future_status::timeout);
  EXPECT_EQ(nodes[0]->num_nodes_waiting(), 0);
  EXPECT_EQ(nodes[1]->num_nodes_waiting(), 0);
  // Node 1 fails and restarts: the spare takes its place when node 0 joins
  // the restart too.
  auto restart1 = std::async(
      std::launch::async, [&] { return nodes[1]->next_rendezvous(); });
  ASSERT_TRUE(becomes_waiting(*nodes[0], 10s));
  auto restart0 = std::async(
      std::launch::async, [&] { return nodes[0]->next_rendezvous(); });
  std::vector<std::future<RendezvousInfo>*> pending{
      &spare_round, &restart0, &restart1};
  std::vector<RendezvousInfo> infos;
  test::eventually([&] {
    for (auto*& f : pending) {
      if (f && f->wait_for(0s) == std::future_status::ready) {
        infos.push_back(f->get());
        f = nullptr;
      }
    }
    return infos.size() >= 2;
  });
  // Two of the three make the round; the third is the next spare.
  ASSERT_EQ(infos.size(), 2u);
  expect_one_round(infos, 2);
  for (const auto& n : nodes) {
    n->shutdown();
  }
  spare->shutdown();
}

TEST(DynamicRendezvous, SurvivorsNoticeALostNodeAndFormASmallerRound) {
  Job job(2, 4);
  Handlers nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(job.node());
  }
  expect_one_round(all_next(nodes), 3);
  // Node 2 dies: its heartbeats stop without it leaving.
  auto died = Clock::now();
  nodes.pop_back();
  // Each survivor acts as its agent would: restart once something changed.
  std::vector<std::future<std::pair<Clock::duration, RendezvousInfo>>> agents;
  for (auto& n : nodes) {
    agents.push_back(std::async(std::launch::async, [&n, died] {
      EXPECT_TRUE(becomes_waiting(*n, 10s));
      auto noticed = Clock::now() - died;
      return std::make_pair(noticed, n->next_rendezvous());
    }));
  }
  std::vector<RendezvousInfo> infos;
  for (auto& a : agents) {
    auto [noticed, info] = a.get();
    // Its neighbour notices within lost_after plus a keep-alive interval
    // or two; the other sees the neighbour restart at once.
    EXPECT_LT(noticed, job.settings.lost_after() * 4 + 1s);
    infos.push_back(info);
  }
  expect_one_round(infos, 2);
}

TEST(DynamicRendezvous, ShutdownClosesTheJobForEveryone) {
  Job job(2, 2);
  Handlers nodes;
  nodes.push_back(job.node());
  nodes.push_back(job.node());
  expect_one_round(all_next(nodes), 2);
  ASSERT_TRUE(nodes[0]->shutdown());
  EXPECT_TRUE(nodes[1]->is_closed());
  EXPECT_THROW(nodes[1]->next_rendezvous(), RendezvousClosedError);
  auto newcomer = job.node();
  EXPECT_THROW(newcomer->next_rendezvous(), RendezvousClosedError);
}

TEST(DynamicRendezvous, AFinishedNodeLetsOthersFinishAFailedOneStopsThem) {
  for (bool failed : {false, true}) {
    Job job(2, 2, failed ? "failed" : "finished");
    Handlers nodes;
    nodes.push_back(job.node());
    nodes.push_back(job.node());
    expect_one_round(all_next(nodes), 2);
    if (failed) {
      nodes[0]->set_closed();
    } else {
      ASSERT_TRUE(nodes[0]->shutdown());
    }
    // Node 1 sees the record at a keep-alive (every 200 ms): a failed job
    // stops it, which is waited for; a finished one does not, which is
    // watched for several intervals.
    bool stopped = false;
    for (auto until = Clock::now() + (failed ? 30s : 1s);
         Clock::now() < until && !stopped;) {
      try {
        EXPECT_EQ(nodes[1]->num_nodes_waiting(), 0);
      } catch (const RendezvousClosedError&) {
        stopped = true;
      }
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(stopped, failed);
    EXPECT_TRUE(nodes[1]->is_closed());
  }
}

TEST(DynamicRendezvous, ARankZeroThatDiedAfterArrivingIsLeftBehind) {
  Job job(2, 3);
  // Arrival 1 of round 0 joins and dies before publishing anything.
  job.store->add("tide.rdzv/job/r0/count", 1);
  Handlers nodes;
  nodes.push_back(job.node());
  nodes.push_back(job.node());
  auto infos = all_next(nodes);
  expect_one_round(infos, 2);
  EXPECT_EQ(infos[0].round, 1);
}

TEST(DynamicRendezvous, RoundThatNeverFillsTimesOut) {
  Job job(2, 2);
  job.settings.join_timeout = 300ms;
  auto lone = job.node();
  try {
    lone->next_rendezvous();
    FAIL() << "a lone node completed a 2-node round";
  } catch (const RendezvousTimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of at least 2"), std::string::npos)
        << e.what();
  }
}

TEST(DynamicRendezvous, MalformedRecordIsAClearError) {
  Job job(1, 1);
  for (const char* bad :
       {"gARVlWQ=",
        "{\"schema\":\"tide.rendezvous/1\",\"run_id\":\"job\",\"round\":-1,"
        "\"closed\":false}",
        "{\"schema\":\"tide.rendezvous/9\"}",
        "[1,2]"}) {
    job.store->set("tide.rdzv/job/state", bad);
    auto n = job.node();
    try {
      n->next_rendezvous();
      FAIL() << "accepted record " << bad;
    } catch (const RendezvousStateError& e) {
      EXPECT_NE(std::string(e.what()).find("run \"job\""), std::string::npos);
    }
  }
}

TEST(DynamicRendezvous, SettingsReadTorchConfKeys) {
  RendezvousParameters p{
      .backend = "c10d",
      .run_id = "r",
      .min_nodes = 1,
      .max_nodes = 3,
      .config = {
          {"join_timeout", "12"},
          {"last_call_timeout", "0.5"},
          {"close_timeout", "7"},
          {"keep_alive_interval", "2"},
          {"keep_alive_max_attempt", "4"}}};
  auto s = DynamicRendezvousSettings::from(p);
  EXPECT_EQ(s.join_timeout, 12s);
  EXPECT_EQ(s.last_call_timeout, 500ms);
  EXPECT_EQ(s.close_timeout, 7s);
  EXPECT_EQ(s.lost_after(), 8s);
  // torch's etcd name for the join deadline.
  p.config.erase("join_timeout");
  p.config["timeout"] = "45";
  EXPECT_EQ(DynamicRendezvousSettings::from(p).join_timeout, 45s);
  p.config["keep_alive_max_attempt"] = "zero";
  EXPECT_THROW(DynamicRendezvousSettings::from(p), InvalidArgument);
  p.config.erase("keep_alive_max_attempt");
  p.min_nodes = 4;
  EXPECT_THROW(DynamicRendezvousSettings::from(p), InvalidArgument);
}

}  // namespace
}  // namespace tide::rendezvous
