// One suite, every Store: the contract of tide/store/store.h, for the
// stores of the store part (etcd's:
// tests/etcd/etcd_store_conformance_test.cpp).
#include "store/store_conformance.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/store/hash_store.h"
#include "tide/store/mux_store.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"

namespace tide::store::conformance {
namespace {

using std::chrono::milliseconds;
using namespace std::chrono_literals;

std::shared_ptr<TcpStore> tcp_client(uint16_t port, Dialect d) {
  return std::make_shared<TcpStore>(
      TcpStoreOptions{.port = port, .dialect = d, .timeout = 10s});
}

Backend tcp_backend(Dialect d) {
  auto host = std::make_shared<TcpStore>(TcpStoreOptions{
      .port = 0, .is_server = true, .dialect = d, .timeout = 10s});
  uint16_t port = host->port();
  return {host, [port, d] { return tcp_client(port, d); }};
}

// Every client a handle on one shared connection: its calls are in flight
// together, waits included.
Backend mux_backend() {
  std::shared_ptr<TcpStoreServer> server = TcpStoreServer::start({});
  auto store = std::make_shared<MuxStore>(
      MuxStoreOptions{.port = server->port(), .timeout = 10s});
  // The server lives as long as a client does.
  auto owned =
      std::shared_ptr<MuxStore>(store.get(), [store, server](auto*) {});
  return {owned, [owned] { return owned->with_timeout(10s); }};
}

// Clients of a store fan-in that forwards to a tide server: torch's
// TCPStore semantics through it, in either dialect.
Backend fan_in_backend(Dialect d) {
  std::shared_ptr<TcpStoreServer> root = TcpStoreServer::start({});
  std::shared_ptr<TcpStoreServer> fan_in =
      TcpStoreServer::start({.upstream = StoreUpstream{.port = root->port()}});
  uint16_t port = fan_in->port();
  auto store = tcp_client(port, d);
  auto owned =
      std::shared_ptr<TcpStore>(store.get(), [store, root, fan_in](auto*) {});
  return {owned, [port, d] { return tcp_client(port, d); }};
}

std::vector<BackendKind> backends() {
  return {
      {"HashStore",
       [] {
         auto s = make_hash_store();
         s->set_timeout(10s);
         return Backend{s, [s] { return s; }};
       }},
      {"PrefixStoreOverHashStore",
       [] {
         auto s = make_hash_store();
         s->set_timeout(10s);
         auto p = std::make_shared<PrefixStore>("/worker/attempt_0", s);
         return Backend{p, [p] { return p; }};
       }},
      {"TcpStoreLegacy", [] { return tcp_backend(Dialect::kLegacy); }},
      {"TcpStoreModern", [] { return tcp_backend(Dialect::kModern); }},
      {"MuxStoreOneConnection", mux_backend},
      {"FanInLegacy", [] { return fan_in_backend(Dialect::kLegacy); }},
      {"FanInModern", [] { return fan_in_backend(Dialect::kModern); }},
      {"PrefixStoreOverTcpStore",
       [] {
         Backend b = tcp_backend(Dialect::kLegacy);
         auto make = b.another_client;
         return Backend{
             std::make_shared<PrefixStore>("job", b.store),
             [make, host = b.store] {
               return std::make_shared<PrefixStore>("job", make());
             }};
       }},
  };
}

TEST_P(StoreConformanceTest, SetThenGetReturnsTheBytes) {
  std::string binary("a\0b\xff", 4);
  store_->set("k", binary);
  EXPECT_EQ(store_->get("k"), binary);
  store_->set("k", "");
  EXPECT_EQ(store_->get("k"), "");
}

TEST_P(StoreConformanceTest, GetWaitsForAKeySetByAnotherClient) {
  auto other = backend_.another_client();
  std::string got;
  std::jthread reader([&] { got = store_->get("later"); });
  other->set("later", "v");
  reader.join();
  EXPECT_EQ(got, "v");
}

TEST_P(StoreConformanceTest, GetThrowsTimeoutErrorNamingTheKey) {
  store_->set_timeout(50ms);
  try {
    store_->get("never");
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos)
        << e.what();
  }
  // The store stays usable after a timeout.
  store_->set_timeout(10s);
  store_->set("after", "1");
  EXPECT_EQ(store_->get("after"), "1");
}

TEST_P(StoreConformanceTest, AddCountsFromZeroAndStoresDecimal) {
  EXPECT_EQ(store_->add("c", 3), 3);
  EXPECT_EQ(store_->add("c", -5), -2);
  EXPECT_EQ(store_->get("c"), "-2");
  EXPECT_EQ(store_->add("c", 0), -2);
}

TEST_P(StoreConformanceTest, AddOnANonIntegerFailsAndKeepsTheValue) {
  store_->set("text", "hello");
  EXPECT_THROW(store_->add("text", 1), Error);
  EXPECT_EQ(store_->get("text"), "hello");
  EXPECT_EQ(store_->add("n", 1), 1);
}

TEST_P(StoreConformanceTest, CompareSetFollowsTorchRules) {
  // Absent key, empty expected: sets.
  EXPECT_EQ(store_->compare_set("cs", "", "first"), "first");
  EXPECT_EQ(store_->get("cs"), "first");
  // Present, matching: swaps.
  EXPECT_EQ(store_->compare_set("cs", "first", "second"), "second");
  // Present, not matching: returns the current value, no write.
  EXPECT_EQ(store_->compare_set("cs", "nope", "third"), "second");
  EXPECT_EQ(store_->get("cs"), "second");
  // Absent key, non-empty expected: returns expected, no write.
  EXPECT_EQ(store_->compare_set("absent", "x", "y"), "x");
  EXPECT_FALSE(store_->check({"absent"}));
}

TEST_P(StoreConformanceTest, CheckTellsWhetherAllKeysExist) {
  EXPECT_FALSE(store_->check({"a"}));
  store_->set("a", "1");
  EXPECT_TRUE(store_->check({"a"}));
  EXPECT_FALSE(store_->check({"a", "b"}));
  store_->set("b", "1");
  EXPECT_TRUE(store_->check({"a", "b"}));
  EXPECT_TRUE(store_->check({}));
}

TEST_P(StoreConformanceTest, WaitReturnsOnceAllKeysExist) {
  auto other = backend_.another_client();
  std::jthread writer([&] {
    other->set("w1", "x");
    other->add("w2", 1);
  });
  store_->wait({"w1", "w2"}, 10s);
  EXPECT_TRUE(store_->check({"w1", "w2"}));
}

TEST_P(StoreConformanceTest, WaitThrowsTimeoutErrorNamingOnlyMissingKeys) {
  store_->set("here", "1");
  try {
    store_->wait({"here", "gone1", "gone2"}, 50ms);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("gone1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gone2"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("here"), std::string::npos) << msg;
  }
}

TEST_P(StoreConformanceTest, DeleteKeyReportsWhetherItExisted) {
  store_->set("d", "1");
  EXPECT_TRUE(store_->delete_key("d"));
  EXPECT_FALSE(store_->delete_key("d"));
  EXPECT_FALSE(store_->check({"d"}));
}

TEST_P(StoreConformanceTest, NumKeysCountsKeys) {
  int64_t before = store_->num_keys();
  store_->set("n1", "1");
  store_->set("n2", "1");
  store_->set("n2", "2");
  EXPECT_EQ(store_->num_keys(), before + 2);
  store_->delete_key("n1");
  EXPECT_EQ(store_->num_keys(), before + 1);
}

TEST_P(StoreConformanceTest, AppendCreatesThenExtends) {
  store_->append("log", "a");
  store_->append("log", "bc");
  EXPECT_EQ(store_->get("log"), "abc");
}

TEST_P(StoreConformanceTest, MultiSetAndMultiGetKeepOrder) {
  store_->multi_set({"m1", "m2", "m3"}, {"one", "", "three"});
  EXPECT_EQ(
      store_->multi_get({"m3", "m1", "m2"}),
      (std::vector<std::string>{"three", "one", ""}));
  EXPECT_THROW(store_->multi_set({"x"}, {}), InvalidArgument);
}

TEST_P(StoreConformanceTest, MultiGetWaitsForAllKeys) {
  auto other = backend_.another_client();
  std::vector<std::string> got;
  std::jthread reader([&] { got = store_->multi_get({"p", "q"}); });
  other->set("q", "2");
  other->set("p", "1");
  reader.join();
  EXPECT_EQ(got, (std::vector<std::string>{"1", "2"}));
}

TEST_P(StoreConformanceTest, ConcurrentAddsFromManyClientsSumExactly) {
  constexpr int kClients = 8;
  constexpr int kAdds = 200;
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < kClients; ++i) {
      threads.emplace_back([&] {
        auto c = backend_.another_client();
        for (int j = 0; j < kAdds; ++j) {
          c->add("counter", 1);
        }
      });
    }
  }
  EXPECT_EQ(store_->get("counter"), std::to_string(kClients * kAdds));
}

TEST_P(StoreConformanceTest, OneSetWakesEveryWaiter) {
  constexpr int kWaiters = 6;
  std::atomic<int> woke{0};
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < kWaiters; ++i) {
      threads.emplace_back([&] {
        auto c = backend_.another_client();
        c->wait({"go"}, 10s);
        ++woke;
      });
    }
    store_->set("go", "1");
  }
  EXPECT_EQ(woke.load(), kWaiters);
}

TEST_P(StoreConformanceTest, AddWaitLetsTheLastVoterDecideForTheOthers) {
  constexpr int kVoters = 6;
  std::vector<Store::Tally> got(kVoters);
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < kVoters; ++i) {
      threads.emplace_back([&, i] {
        auto c = backend_.another_client();
        got[i] = c->add_wait("votes", 1, kVoters, "outcome");
        if (got[i].value.empty()) {
          c->set("outcome", "decided by " + std::to_string(got[i].count));
        }
      });
    }
  }
  std::vector<int64_t> counts;
  int deciders = 0;
  for (const auto& t : got) {
    counts.push_back(t.count);
    deciders += t.value.empty() ? 1 : 0;
    if (!t.value.empty()) {
      EXPECT_EQ(t.value, "decided by " + std::to_string(kVoters));
    }
  }
  std::sort(counts.begin(), counts.end());
  EXPECT_EQ(counts, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(deciders, 1);
}

TEST_P(StoreConformanceTest, AddWaitAnswersAtOnceWhenTheOutcomeExists) {
  store_->set("outcome", "abort");
  auto t = store_->add_wait("votes", 1, 100, "outcome");
  EXPECT_EQ(t.count, 1);
  EXPECT_EQ(t.value, "abort");
  EXPECT_EQ(store_->get("votes"), "1");
}

TEST_P(StoreConformanceTest, LargeValuesRoundTrip) {
  std::string big(3 * 1024 * 1024, '\0');
  for (size_t i = 0; i < big.size(); ++i) {
    big[i] = static_cast<char>(i * 131);
  }
  store_->set("big", big);
  EXPECT_EQ(store_->get("big"), big);
}

INSTANTIATE_TEST_SUITE_P(
    AllStores,
    StoreConformanceTest,
    ::testing::ValuesIn(backends()),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace tide::store::conformance
