// What both rpc front ends share to drain and to name their group
// (rpc_core/in_flight.h, rpc_core/peer_table.h): the count of work in
// flight and its wait, and the table of the group's workers.
#include "rpc_core/in_flight.h"

#include <atomic>
#include <future>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "rpc_core/peer_table.h"

namespace tide::rpc_core {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(InFlightTest, AWaiterIsWokenWhenTheLastPieceOfWorkEnds) {
  InFlight work;
  work.add(1);
  work.add(1);
  EXPECT_EQ(work.count(), 2);
  auto waiter = std::async(std::launch::async, [&] {
    return work.wait_idle(Clock::time_point::max());
  });
  work.add(-1);
  EXPECT_EQ(waiter.wait_for(50ms), std::future_status::timeout);
  work.add(-1);
  ASSERT_EQ(waiter.wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(waiter.get());
  EXPECT_EQ(work.count(), 0);
}

TEST(InFlightTest, AWaitPastItsDeadlineSaysSo) {
  InFlight work;
  work.add(1);
  EXPECT_FALSE(work.wait_idle(Clock::now() + 20ms));
  EXPECT_TRUE(InFlight().wait_idle(Clock::now()));  // idle: at once
}

TEST(InFlightTest, WorkCountedElsewhereIsPolledUntilItEnds) {
  InFlight work;
  std::atomic<int64_t> pending{1};
  std::thread ender([&] {
    std::this_thread::sleep_for(20ms);  // ends after the wait began, or not
    pending = 0;
  });
  EXPECT_TRUE(
      work.wait_idle(Clock::now() + 30s, [&] { return pending.load(); }));
  ender.join();
  pending = 1;
  EXPECT_FALSE(
      work.wait_idle(Clock::now() + 20ms, [&] { return pending.load(); }));
}

TEST(PeerTableTest, WorkersAreFoundByNameAndIdAndListedInIdOrder) {
  struct Info {
    std::string name;
    int id;
  };
  PeerTable<Info> peers;
  peers.add("trainer", Info{"trainer", 0});
  peers.add("ps", Info{"ps", 1});
  ASSERT_NE(peers.find("ps"), nullptr);
  EXPECT_EQ(peers.find("ps")->id, 1);
  EXPECT_EQ(peers.find(0)->name, "trainer");
  EXPECT_EQ(peers.find("nobody"), nullptr);
  EXPECT_EQ(peers.find(2), nullptr);
  EXPECT_EQ(peers.find(-1), nullptr);
  EXPECT_EQ(peers.all().size(), 2u);
  EXPECT_EQ(peers.names(), "trainer, ps");
}

}  // namespace
}  // namespace tide::rpc_core
