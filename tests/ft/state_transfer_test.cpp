// Healing's wire (src/ft/state_transfer): two StateTransfers of this
// process over real TCP on 127.0.0.1.
#include "ft/state_transfer.h"

#include <cstring>
#include <future>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tide/common/error.h"

namespace tide::ft {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

TEST(StateTransferTest, AStateLandsInTheHealersOwnMemory) {
  StateTransfer source("127.0.0.1", ""), healer("127.0.0.1", "");
  std::vector<char> big(3 << 20), small = {'a', 'b', 'c'};
  for (size_t i = 0; i < big.size(); ++i) {
    big[i] = static_cast<char>(i * 7);
  }
  auto sent = std::async(std::launch::async, [&] {
    source.send(
        healer.address(),
        4,
        "{\"meta\":1}",
        {{nullptr, 0}, {big.data(), big.size()}, {small.data(), small.size()}},
        30s);
  });
  EXPECT_EQ(healer.receive_meta(4, 30s), "{\"meta\":1}");
  std::vector<char> big_to(big.size()), small_to(3);
  char* where = big_to.data();
  healer.receive_into(
      4,
      {{nullptr, 0}, {big_to.data(), big_to.size()}, {small_to.data(), 3}},
      30s);
  sent.get();
  EXPECT_EQ(big_to.data(), where);
  EXPECT_EQ(big_to, big);
  EXPECT_EQ(small_to, small);
}

TEST(StateTransferTest, ASourceThatGoesAwayMidwayIsAClearError) {
  StateTransfer healer("127.0.0.1", "");
  {
    StateTransfer source("127.0.0.1", "");
    char byte = 1;
    // The healer never says it is ready: the source gives up and goes.
    EXPECT_THROW(
        source.send(healer.address(), 9, "{}", {{&byte, 1}}, 200ms),
        TimeoutError);
    EXPECT_EQ(healer.receive_meta(9, 30s), "{}");
  }
  char to = 0;
  EXPECT_THAT(
      [&] {
        healer.receive_into(9, {{&to, 1}}, 30s);
      },
      ::testing::ThrowsMessage<NetworkError>(
          HasSubstr("the source went away")));
  EXPECT_EQ(to, 0);
}

TEST(StateTransferTest, PlacesThatDoNotFitTheStateAreRefused) {
  StateTransfer source("127.0.0.1", ""), healer("127.0.0.1", "");
  char a = 1, b = 2;
  auto sent = std::async(std::launch::async, [&] {
    EXPECT_THROW(
        source.send(healer.address(), 1, "{}", {{&a, 1}, {&b, 1}}, 500ms),
        TimeoutError);
  });
  healer.receive_meta(1, 30s);
  char to = 0;
  EXPECT_THAT(
      [&] {
        healer.receive_into(1, {{&to, 1}}, 30s);
      },
      ::testing::ThrowsMessage<InvalidArgument>(
          HasSubstr("1 places for a state of 2 tensors")));
  EXPECT_THAT(
      [&] {
        healer.receive_into(2, {{&to, 1}}, 30s);
      },
      ::testing::ThrowsMessage<InvalidArgument>(
          HasSubstr("before receive_meta")));
  sent.get();
  EXPECT_THAT(
      [&] { source.send("not an address", 3, "{}", {}, 1s); },
      ::testing::Throws<ProtocolError>());
}

}  // namespace
}  // namespace tide::ft
