// The gate both rpc front ends hold early requests at (rpc_core/
// request_gate.h): held in order and bounded before it opens, served in
// that order when it does, before any request that comes meanwhile.
#include "rpc_core/request_gate.h"

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tide/common/error.h"

#include "transport/workers.h"

namespace tide::rpc_core {
namespace {

transport::Message message(uint64_t id) {
  return transport::Message{.id = id};
}

// Requests 1, 2 and 3, held by a gate not yet open.
void hold_three(RequestGate& gate, const transport::Pipe& pipe) {
  for (uint64_t id = 1; id <= 3; ++id) {
    auto m = message(id);
    ASSERT_TRUE(gate.hold(pipe, m));
  }
}

TEST(RequestGateTest, HoldsRequestsUntilItOpensThenServesThemInOrder) {
  RequestGate gate;
  transport::Pipe pipe;
  hold_three(gate, pipe);
  std::vector<uint64_t> served;
  gate.open(
      [&](const transport::Pipe&, transport::Message m) {
        served.push_back(m.id);
      },
      "w0");
  EXPECT_EQ(served, (std::vector<uint64_t>{1, 2, 3}));
  auto later = message(4);
  EXPECT_FALSE(gate.hold(pipe, later));  // the caller serves it itself
  EXPECT_EQ(later.id, 4u);               // untouched
}

TEST(RequestGateTest, ARequestArrivingWhileItOpensComesAfterTheHeldOnes) {
  RequestGate gate;
  transport::Pipe pipe;
  hold_three(gate, pipe);
  std::vector<uint64_t> served;
  std::mutex served_mutex;
  auto record = [&](uint64_t id) {
    std::lock_guard lock(served_mutex);
    served.push_back(id);
  };
  std::atomic<bool> arriving{false};
  std::thread late;
  gate.open(
      [&](const transport::Pipe&, transport::Message m) {
        if (m.id == 1) {
          // The transport's loop delivers request 4 while 1 is served.
          late = std::thread([&] {
            auto m4 = message(4);
            arriving = true;
            if (!gate.hold(pipe, m4)) {
              record(m4.id);
            }
          });
          while (!arriving) {
            std::this_thread::yield();
          }
        }
        record(m.id);
      },
      "w0");
  late.join();
  EXPECT_EQ(served, (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST(RequestGateTest, ARequestThatFailsToBeServedIsDroppedAndTheOthersGoOn) {
  RequestGate gate;
  transport::Pipe pipe;
  hold_three(gate, pipe);
  std::vector<uint64_t> served;
  gate.open(
      [&](const transport::Pipe&, transport::Message m) {
        if (m.id == 2) {
          throw ProtocolError("bad request");
        }
        served.push_back(m.id);
      },
      "w0");
  EXPECT_EQ(served, (std::vector<uint64_t>{1, 3}));
}

TEST(RequestGateTest, HoldsNoMoreThanTheWorkersQueueAndDropsThemOnStop) {
  RequestGate gate;
  transport::Pipe pipe;
  for (size_t i = 0; i < transport::Workers::kMaxQueuedRequests; ++i) {
    auto m = message(i);
    ASSERT_TRUE(gate.hold(pipe, m));
  }
  auto one_more = message(0);
  EXPECT_THROW(gate.hold(pipe, one_more), ProtocolError);
  gate.drop();
  size_t served = 0;
  gate.open(
      [&](const transport::Pipe&, transport::Message) { ++served; }, "w0");
  EXPECT_EQ(served, 0u);
}

}  // namespace
}  // namespace tide::rpc_core
