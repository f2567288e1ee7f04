// One connection many callers share (MuxStore) and the tagged frames it
// speaks: a wait holds up no other caller, a wait's bound is kept by the
// server, a batch's calls go together, an asynchronous wait ends once, a lost
// server fails the calls in flight and the next call reconnects, a store that
// is not tide's is named, and bad frames close only their own connection.
#include "tide/store/mux_store.h"

#include <atomic>
#include <future>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/store/tcp_store.h"

#include "store/mux_connection.h"
#include "store/wire.h"
#include "support/raw_client.h"
#include "support/torch_store_stand_in.h"

namespace tide::store {
namespace {

using namespace std::chrono_literals;
using test::RawClient;
using ::testing::HasSubstr;
using wire::Op;

std::shared_ptr<MuxStore> mux_client(
    uint16_t port, milliseconds timeout = 10s) {
  return std::make_shared<MuxStore>(
      MuxStoreOptions{.port = port, .timeout = timeout});
}

std::string hello() {
  std::string out;
  wire::encode_request(
      {.op = Op::kValidate, .number = wire::kValidateMagic},
      Dialect::kModern,
      out);
  return out;
}

std::string tagged(wire::Request req, uint64_t tag, uint64_t wait_ms = 0) {
  std::string out;
  wire::Tagged t{.tag = tag, .wait_ms = wait_ms};
  wire::encode_request(req, Dialect::kModern, out, &t);
  return out;
}

TEST(MuxStoreTest, AWaitHoldsUpNoOtherCallerOnTheConnection) {
  auto server = TcpStoreServer::start({});
  auto store = mux_client(server->port());
  auto other = store->with_timeout(10s);
  std::atomic<bool> waiting_done{false};
  std::jthread waiter([&] {
    store->wait({"later"}, 30s);
    waiting_done = true;
  });
  // While the wait is in flight, the same connection serves the rest.
  for (int i = 0; i < 50; ++i) {
    other->set("k" + std::to_string(i), "v");
    EXPECT_EQ(other->get("k" + std::to_string(i)), "v");
    EXPECT_EQ(other->add("n", 1), i + 1);
  }
  EXPECT_FALSE(waiting_done.load());
  other->set("later", "1");
  waiter.join();
  EXPECT_TRUE(waiting_done.load());
}

TEST(MuxStoreTest, AWaitsBoundIsKeptByTheServerAndTheConnectionStays) {
  auto server = TcpStoreServer::start({});
  auto store = mux_client(server->port());
  auto start = std::chrono::steady_clock::now();
  try {
    store->wait({"never"}, 200ms);
    FAIL() << "the wait returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos)
        << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
  EXPECT_EQ(store->connection()->pending(), 0u);
  store->set("after", "1");
  EXPECT_EQ(store->get("after"), "1");
}

TEST(MuxStoreTest, ManyThreadsAtOnceGetTheirOwnReplies) {
  auto server = TcpStoreServer::start({});
  auto store = mux_client(server->port());
  std::vector<std::jthread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto mine = store->with_timeout(10s);
      for (int i = 0; i < 200; ++i) {
        std::string k = "t" + std::to_string(t) + "/" + std::to_string(i);
        mine->set(k, k);
        if (mine->multi_get({k, k}) != std::vector<std::string>{k, k}) {
          ++wrong;
        }
      }
    });
  }
  threads.clear();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(MuxStoreTest, ALostServerFailsTheCallsInFlightAndTheNextCallReconnects) {
  auto server = TcpStoreServer::start({});
  uint16_t port = server->port();
  auto store = mux_client(port);
  auto pending =
      std::async(std::launch::async, [&] { store->wait({"never"}, 30s); });
  while (store->connection()->pending() == 0) {
    std::this_thread::yield();
  }
  server.reset();  // stops and joins: every connection closes
  EXPECT_THROW(pending.get(), NetworkError);
  EXPECT_THROW(store->add("n", 1), NetworkError);  // nobody listens
  server = TcpStoreServer::start({.port = port});
  EXPECT_EQ(store->add("n", 1), 1);
}

TEST(MuxStoreTest, ABatchSendsItsCallsTogetherAndReadsEachResult) {
  auto server = TcpStoreServer::start({});
  auto store = mux_client(server->port());
  store->set("beats", "41");
  auto batch = store->batch();
  size_t beat = batch.add("beats", 1);
  size_t created = batch.compare_set("record", "", "v1");
  size_t absent = batch.compare_set("missing", "-", "-");
  size_t peer = batch.add("peer", 0);
  batch.run();
  EXPECT_EQ(batch.number(beat), 42);
  EXPECT_EQ(batch.value(created), "v1");
  EXPECT_EQ(batch.value(absent), "-");  // torch's rule: expected comes back
  EXPECT_EQ(batch.number(peer), 0);
  EXPECT_FALSE(store->check({"missing"}));  // read, not written
  EXPECT_EQ(store->get("record"), "v1");
  // Run again, the same calls: each result is the new one.
  batch.run();
  EXPECT_EQ(batch.number(beat), 43);
  EXPECT_THROW(static_cast<void>(batch.number(9)), std::out_of_range);
}

TEST(MuxStoreTest, ABatchToALostServerThrowsAndTheNextReconnects) {
  auto server = TcpStoreServer::start({});
  uint16_t port = server->port();
  auto store = mux_client(port, 2s);
  server.reset();
  auto batch = store->batch();
  batch.add("n", 1);
  EXPECT_THROW(batch.run(), NetworkError);
  server = TcpStoreServer::start({.port = port});
  batch.run();
  EXPECT_EQ(batch.number(0), 1);
}

TEST(MuxStoreTest, AnAsyncWaitEndsMetTimedOutOrFailedAndHoldsNoThread) {
  auto server = TcpStoreServer::start({});
  auto store = mux_client(server->port());
  using End = MuxStore::WaitEnd;
  auto ended = [&](const std::string& key, milliseconds bound) {
    auto p = std::make_shared<std::promise<End>>();
    store->wait_async({key}, bound, [p](End end) { p->set_value(end); });
    return p->get_future();
  };
  auto met = ended("later", 60s);
  auto timed_out = ended("never", 100ms);
  // Both are at the store; this thread goes on.
  EXPECT_EQ(timed_out.get(), End::kTimedOut);
  EXPECT_EQ(met.wait_for(0s), std::future_status::timeout);
  store->set("later", "1");
  EXPECT_EQ(met.get(), End::kMet);
  auto failed = ended("never", 60s);
  while (store->connection()->pending() == 0) {
    std::this_thread::yield();
  }
  server.reset();
  EXPECT_EQ(failed.get(), End::kFailed);
}

TEST(MuxStoreTest, AStoreThatIsNotTidesIsNamed) {
  test::TorchStoreStandIn torch;
  EXPECT_THAT(
      [&] { mux_client(torch.port(), 5s); },
      ::testing::ThrowsMessage<NetworkError>(HasSubstr("tide store")));
}

TEST(MuxStoreTest, ATaggedWaitIsAnsweredAfterItsTagAndOthersGoFirst) {
  auto server = TcpStoreServer::start({});
  RawClient raw(server->port());
  ASSERT_TRUE(raw.send(
      hello() + tagged({.op = Op::kWait, .keys = {"/w"}}, 7) +
      tagged({.op = Op::kAdd, .keys = {"/n"}, .delta = 5}, 8)));
  // The ADD behind the WAIT is answered first.
  std::string add = raw.read(16);
  EXPECT_EQ(wire::load<uint64_t>(add.data()), 8u);
  EXPECT_EQ(wire::load<int64_t>(add.data() + 8), 5);
  auto setter = mux_client(server->port());
  setter->set("w", "1");
  std::string wait = raw.read(9);
  EXPECT_EQ(wire::load<uint64_t>(wait.data()), 7u);
  EXPECT_EQ(static_cast<uint8_t>(wait[8]), wire::kStopWaiting);
  // A bound: answered WAIT_TIMED_OUT under its tag.
  ASSERT_TRUE(raw.send(tagged({.op = Op::kWait, .keys = {"/x"}}, 9, 50)));
  std::string timed_out = raw.read(9);
  EXPECT_EQ(wire::load<uint64_t>(timed_out.data()), 9u);
  EXPECT_EQ(static_cast<uint8_t>(timed_out[8]), wire::kWaitTimedOut);
}

TEST(MuxStoreTest, BadFramesCloseOnlyTheirConnection) {
  auto server = TcpStoreServer::start({});
  auto good = mux_client(server->port());
  auto cases = {
      // A frame holding CANCEL_WAIT (a tagged WAIT ends at its bound).
      hello() + tagged({.op = Op::kCancelWait}, 1),
      // A frame in a frame.
      hello() + std::string(1, static_cast<char>(wire::kTaggedCode)) +
          std::string(16, '\0') + tagged({.op = Op::kNumKeys}, 2),
      // A frame on a legacy connection (torch 1.13's codes have none).
      tagged({.op = Op::kNumKeys}, 3),
  };
  for (const auto& bytes : cases) {
    RawClient raw(server->port());
    ASSERT_TRUE(raw.send(bytes));
    EXPECT_TRUE(raw.closed_within(5s));
    good->set("still", "here");
    EXPECT_EQ(good->get("still"), "here");
  }
}

}  // namespace
}  // namespace tide::store
