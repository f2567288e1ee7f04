// The static backend's workers' store: the agents' (the default), or, with
// agent_store=0, one rank 0's worker hosts at the port the round names.
#include "tide/rendezvous/static_rendezvous.h"

#include <future>

#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/store/tcp_store.h"

#include "net/socket.h"

namespace tide::rendezvous {
namespace {

using namespace std::chrono_literals;

RendezvousParameters params(
    int nodes, int rank, uint16_t port, const char* agent_store) {
  RendezvousParameters p{
      .backend = "static",
      .endpoint = "127.0.0.1:" + std::to_string(port),
      .run_id = "job",
      .min_nodes = nodes,
      .max_nodes = nodes,
      .config = {{"rank", std::to_string(rank)}, {"timeout", "30"}},
  };
  if (agent_store != nullptr) {
    p.config["agent_store"] = agent_store;
  }
  return p;
}

TEST(StaticRendezvousTest, WorkersUseTheAgentsStoreByDefault) {
  StaticRendezvousHandler h(params(1, 0, 0, nullptr));
  EXPECT_TRUE(h.use_agent_store());
  auto first = h.next_rendezvous();
  auto second = h.next_rendezvous();
  EXPECT_EQ(first.bootstrap.master_port, second.bootstrap.master_port);
  first.store->set("k", "v");  // The agents' store itself.
  EXPECT_EQ(second.store->get("k"), "v");
}

TEST(StaticRendezvousTest, OnOneNodeTheWorkersStoreMovesToANewPortEachRound) {
  StaticRendezvousHandler h(params(1, 0, 0, "0"));
  EXPECT_FALSE(h.use_agent_store());
  auto first = h.next_rendezvous();
  auto second = h.next_rendezvous();
  EXPECT_NE(first.bootstrap.master_port, second.bootstrap.master_port);
  EXPECT_NE(first.bootstrap.master_port, 0);
  EXPECT_EQ(first.bootstrap.master_addr, "127.0.0.1");
}

// A script may name the launcher's --master-port in tcp://: on one node
// that port goes to the workers' store, made anew by each attempt's rank 0.
TEST(StaticRendezvousTest, OnOneNodeTheWorkersStoreTakesTheGivenPort) {
  uint16_t port = net::free_port("127.0.0.1");
  StaticRendezvousHandler h(params(1, 0, port, "0"));
  auto first = h.next_rendezvous();
  EXPECT_EQ(first.bootstrap.master_port, port);
  EXPECT_EQ(h.next_rendezvous().bootstrap.master_port, port);
  // Free for rank 0's worker: the agents' store listens elsewhere.
  auto workers =
      store::TcpStore({.host = "127.0.0.1", .port = port, .is_server = true});
  first.store->set("k", "v");
  EXPECT_FALSE(workers.check({"k", "job/k", "/job/k"}));
}

TEST(StaticRendezvousTest, OnSeveralNodesNodeZeroNamesTheWorkersPort) {
  uint16_t port = net::free_port("127.0.0.1");
  StaticRendezvousHandler node0(params(2, 0, port, "0"));
  StaticRendezvousHandler node1(params(2, 1, port, "false"));
  auto first0 = std::async([&] { return node0.next_rendezvous(); });
  auto first1 = node1.next_rendezvous();
  uint16_t workers = first0.get().bootstrap.master_port;
  EXPECT_NE(workers, port);
  EXPECT_EQ(first1.bootstrap.master_port, workers);
  // Node 1 restarts on its own and finds the same port.
  EXPECT_EQ(node1.next_rendezvous().bootstrap.master_port, workers);
}

TEST(StaticRendezvousTest, AWorkersPortThatIsNoPortIsAClearError) {
  uint16_t port = net::free_port("127.0.0.1");
  StaticRendezvousHandler node0(params(2, 0, port, nullptr));
  StaticRendezvousHandler node1(params(2, 1, port, "0"));
  auto first0 = std::async([&] { return node0.next_rendezvous(); });
  // Node 1's store connects (and finds garbage) once node 0 hosts it.
  first0.get().store->set("workers_port", "http");
  try {
    node1.next_rendezvous();
    FAIL() << "no error";
  } catch (const RendezvousError& e) {
    EXPECT_NE(
        std::string(e.what()).find("'http', not a port"), std::string::npos)
        << e.what();
  }
}

TEST(StaticRendezvousTest, AnAgentStoreSettingThatIsNoBooleanIsRefused) {
  EXPECT_THROW(
      StaticRendezvousHandler(params(1, 0, 0, "sometimes")), InvalidArgument);
}

}  // namespace
}  // namespace tide::rendezvous
