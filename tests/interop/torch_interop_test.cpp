// tide's TCP store against Debian's real PyTorch (python3-torch: 1.13 on
// Debian 12, 2.6 on Debian 13), both ways: torch clients on a tide server, and
// tide clients on a torch server. The torch side is
// tests/interop/torch_store_peer.py, run as a child.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <future>
#include <iterator>
#include <latch>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/store/tcp_store.h"

#include "interop/torch_peer.h"

namespace tide::store {
namespace {

using namespace std::chrono_literals;
using test::TorchPeer;

// Importing torch takes about a second; much more on a loaded machine.
constexpr milliseconds kStartTimeout = 60s;
// A whole scenario, or one command, of a peer.
constexpr milliseconds kRunTimeout = 60s;
constexpr milliseconds kExitTimeout = 30s;
// Store timeout of both sides: far above any expected wait.
constexpr milliseconds kStoreTimeout = 30s;
constexpr const char* kStoreTimeoutSeconds = "30";

// Values both sides know; torch_store_peer.py has the same ones.
const std::string kTideStr = "hello from tide";
const std::string kTorchStr = "hello from torch";
constexpr size_t kBigLen = size_t{1} << 20;

std::string all_bytes(bool reversed) {
  std::string s(256, '\0');
  for (size_t i = 0; i < s.size(); ++i) {
    s[i] = static_cast<char>(reversed ? 255 - i : i);
  }
  return s;
}

std::string big_value(size_t seed) {
  std::string s(kBigLen, '\0');
  for (size_t i = 0; i < s.size(); ++i) {
    s[i] = static_cast<char>((i * 7 + seed) % 251);
  }
  return s;
}

std::string hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string unhex(std::string_view text) {
  std::string out(text.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    unsigned v = 0;
    std::from_chars(text.data() + 2 * i, text.data() + 2 * i + 2, v, 16);
    out[i] = static_cast<char>(v);
  }
  return out;
}

int64_t to_int(std::string_view text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw std::runtime_error("not an integer: \"" + std::string(text) + "\"");
  }
  return v;
}

// "1,2,3" -> {1, 2, 3}
std::vector<int64_t> to_ints(std::string_view csv) {
  std::vector<int64_t> out;
  while (!csv.empty()) {
    size_t comma = std::min(csv.find(','), csv.size());
    out.push_back(to_int(csv.substr(0, comma)));
    csv.remove_prefix(std::min(comma + 1, csv.size()));
  }
  return out;
}

// The protocol a torch of this version serves: 1.13 to 2.1 the legacy one,
// 2.2 on the modern one.
Dialect dialect_of(const std::string& torch_version) {
  int major = 0;
  int minor = 0;
  std::sscanf(torch_version.c_str(), "%d.%d", &major, &minor);
  return major > 2 || (major == 2 && minor >= 2) ? Dialect::kModern
                                                 : Dialect::kLegacy;
}

std::unique_ptr<TcpStore> tide_client(
    uint16_t port, Dialect dialect, milliseconds timeout = kStoreTimeout) {
  return std::make_unique<TcpStore>(TcpStoreOptions{
      .host = "127.0.0.1",
      .port = port,
      .is_server = false,
      .dialect = dialect,
      .timeout = timeout});
}

// Every value in 1..n exactly once: n atomic increments of one counter.
void expect_each_of_one_to_n_once(std::vector<int64_t> values, int64_t n) {
  std::sort(values.begin(), values.end());
  std::vector<int64_t> want(static_cast<size_t>(n));
  std::iota(want.begin(), want.end(), 1);
  std::vector<int64_t> missing;
  std::vector<int64_t> extra;
  std::set_difference(
      want.begin(),
      want.end(),
      values.begin(),
      values.end(),
      std::back_inserter(missing));
  std::set_difference(
      values.begin(),
      values.end(),
      want.begin(),
      want.end(),
      std::back_inserter(extra));
  auto first = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 10; ++i) {
      s += std::to_string(v[i]) + " ";
    }
    return s + (v.size() > 10 ? "..." : "");
  };
  EXPECT_TRUE(missing.empty() && extra.empty())
      << values.size() << " adds returned values; " << missing.size()
      << " of 1.." << n << " missing: " << first(missing) << "; "
      << extra.size() << " duplicates or out of range: " << first(extra);
}

// Runs body(thread index) on n threads that start together once go() is
// called; join() waits for them with a timeout.
class ThreadGang {
 public:
  template <typename F>
  ThreadGang(int n, F body) : start_(1) {
    for (int i = 0; i < n; ++i) {
      std::packaged_task<void()> task([this, body, i] {
        start_.wait();
        body(i);
      });
      done_.push_back(task.get_future());
      threads_.emplace_back(std::move(task));
    }
  }
  ~ThreadGang() {
    go();
  }
  void go() {
    if (!started_) {
      started_ = true;
      start_.count_down();
    }
  }
  // Rethrows the first exception a thread threw; fails on timeout (the
  // destructor then blocks until the threads end: a hang shows as the ctest
  // timeout).
  void join(milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    for (auto& f : done_) {
      ASSERT_EQ(f.wait_until(deadline), std::future_status::ready)
          << "a thread did not finish in time";
      f.get();
    }
  }

 private:
  std::latch start_;
  bool started_ = false;
  std::vector<std::future<void>> done_;
  std::vector<std::jthread> threads_;
};

// A client scenario passed every check and its peer exited 0.
void expect_pass(TorchPeer& peer) {
  peer.expect("PASS", kRunTimeout);
  EXPECT_EQ(peer.wait_exit(kExitTimeout), 0) << peer.transcript();
}

// The tests run beside Debian 12's torch 1.13 and Debian 13's 2.6 (the
// dialect a tide client speaks to a torch server follows the version).
TEST(TorchInteropTest, SystemPythonImportsATorchOfAKnownDialect) {
  TorchPeer peer({"version"});
  peer.started(kStartTimeout);
  const std::string& v = peer.torch_version();
  EXPECT_TRUE(v.starts_with("1.13") || v.starts_with("2."))
      << "/usr/bin/python3 has torch " << v;
  EXPECT_EQ(peer.wait_exit(kExitTimeout), 0) << peer.transcript();
}

// ---------------------------------------------------------------------------
// torch clients -> tide server

// Torch's clients reach the tide server directly, or through a store fan-in
// (a node's agent's, docs/store-fan-in.md) while tide's client reaches the
// server itself: torch's TCPStore semantics through the fan-in.
class TorchClientOnTideServerTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    root_ = TcpStoreServer::start({.host = "127.0.0.1", .port = 0});
    if (GetParam()) {
      server_ = TcpStoreServer::start(
          {.upstream = StoreUpstream{.port = root_->port()}});
    }
  }

  std::unique_ptr<TcpStore> tide() {
    // tide's server speaks both; the legacy one is torch 1.13's clients'.
    return tide_client(root_->port(), Dialect::kLegacy);
  }

  // A peer running a client scenario of torch_store_peer.py; not yet started.
  std::unique_ptr<TorchPeer> spawn_torch(
      const std::string& scenario, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "client",
        scenario,
        "--port",
        std::to_string((server_ ? server_ : root_)->port()),
        "--timeout-s",
        kStoreTimeoutSeconds};
    args.insert(args.end(), extra.begin(), extra.end());
    return std::make_unique<TorchPeer>(args);
  }

  std::unique_ptr<TorchPeer> torch(const std::string& scenario) {
    auto peer = spawn_torch(scenario);
    peer->started(kStartTimeout);
    return peer;
  }

  std::unique_ptr<TcpStoreServer> root_;
  std::unique_ptr<TcpStoreServer> server_;  // the fan-in, if any
};

INSTANTIATE_TEST_SUITE_P(
    DirectOrThroughAFanIn,
    TorchClientOnTideServerTest,
    ::testing::Bool(),
    [](const auto& info) { return info.param ? "ThroughAFanIn" : "Direct"; });

TEST_P(
    TorchClientOnTideServerTest,
    TorchClientSeesKeysSetByTideClientAndViceVersa) {
  auto store = tide();
  store->set("tide/str", kTideStr);
  store->set("tide/bin", all_bytes(false));
  store->set("tide/empty", "");
  store->set("tide/big", big_value(1));
  EXPECT_EQ(store->add("tide/counter", 7), 7);

  auto peer = torch("exchange");
  expect_pass(*peer);

  EXPECT_EQ(store->get("torch/str"), kTorchStr);
  EXPECT_EQ(store->get("torch/bin"), all_bytes(true));
  EXPECT_EQ(store->get("torch/empty"), "");
  EXPECT_EQ(store->get("torch/big"), big_value(2));
  EXPECT_EQ(store->get("torch/counter"), "42");
  EXPECT_EQ(store->get("tide/counter"), "10");
}

TEST_P(
    TorchClientOnTideServerTest,
    TorchCompareSetAddDeleteAndNumKeysBehaveAsOnATorchServer) {
  auto peer = torch("semantics");
  expect_pass(*peer);

  auto store = tide();
  EXPECT_EQ(store->get("sem/cas"), "third");
  EXPECT_EQ(store->get("sem/n"), "-5");
  EXPECT_FALSE(store->check({"sem/absent"}));
  EXPECT_FALSE(store->check({"sem/a"}));
  EXPECT_TRUE(store->check({"sem/cas", "sem/n", "sem/w1", "sem/w2"}));
  // Those four, and the "init/" a torch client with a world size adds.
  EXPECT_EQ(store->num_keys(), 5);
}

TEST_P(
    TorchClientOnTideServerTest,
    TorchWaitAndGetOfAMissingKeyRaiseAfterTheirTimeout) {
  auto peer = torch("timeouts");
  expect_pass(*peer);

  auto store = tide();
  EXPECT_EQ(store->get("timeouts/after_wait"), "ok");
  EXPECT_EQ(store->get("timeouts/after_get"), "ok");
  EXPECT_FALSE(store->check({"timeouts/never"}));
}

TEST_P(
    TorchClientOnTideServerTest,
    TorchGetAndWaitBlockUntilTideOrAnotherTorchClientSetsTheKeys) {
  auto store = tide();
  auto peer = torch("late");

  EXPECT_EQ(peer->expect("WAITING ", kRunTimeout), "late/from_tide");
  // Not there yet: a short tide wait times out, meanwhile torch blocks.
  EXPECT_THROW(store->wait({"late/from_tide"}, 200ms), TimeoutError);
  store->set("late/from_tide", "tide was here");

  EXPECT_EQ(peer->expect("WAITING ", kRunTimeout), "late/a late/b");
  store->set("late/a", "a");
  EXPECT_THROW(store->wait({"late/b"}, 200ms), TimeoutError);
  store->set("late/b", "b");

  expect_pass(*peer);
  EXPECT_EQ(store->get("late/from_torch"), "torch was here");
}

TEST_P(
    TorchClientOnTideServerTest,
    ConcurrentTorchAndTideAddsToOneCounterAreAllCounted) {
  constexpr int kPeers = 3;
  constexpr int kThreadsPerPeer = 2;
  constexpr int kTideThreads = 2;
  constexpr int kAdds = 200;

  std::vector<std::unique_ptr<TorchPeer>> peers;
  for (int i = 0; i < kPeers; ++i) {
    peers.push_back(spawn_torch(
        "adder",
        {"--key",
         "shared/counter",
         "--count",
         std::to_string(kAdds),
         "--threads",
         std::to_string(kThreadsPerPeer)}));
  }
  for (auto& p : peers) {
    p->started(kStartTimeout);
    p->expect("READY", kRunTimeout);
  }

  std::vector<std::vector<int64_t>> tide_values(kTideThreads);
  std::vector<std::unique_ptr<TcpStore>> stores;
  for (int i = 0; i < kTideThreads; ++i) {
    stores.push_back(tide());
  }
  ThreadGang gang(kTideThreads, [&](int t) {
    for (int i = 0; i < kAdds; ++i) {
      tide_values[t].push_back(stores[t]->add("shared/counter", 1));
    }
  });
  for (auto& p : peers) {
    p->send_line("GO");
  }
  gang.go();

  std::vector<int64_t> values;
  for (auto& p : peers) {
    auto mine = to_ints(p->expect("VALUES ", kRunTimeout));
    values.insert(values.end(), mine.begin(), mine.end());
    expect_pass(*p);
  }
  gang.join(kRunTimeout);
  for (const auto& v : tide_values) {
    values.insert(values.end(), v.begin(), v.end());
  }
  constexpr int64_t kTotal = (kPeers * kThreadsPerPeer + kTideThreads) * kAdds;
  expect_each_of_one_to_n_once(values, kTotal);
  EXPECT_EQ(tide()->get("shared/counter"), std::to_string(kTotal));
}

// ---------------------------------------------------------------------------
// tide clients -> torch server

class TideClientOnTorchServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TorchPeer>(std::vector<std::string>{
        "server", "--timeout-s", kStoreTimeoutSeconds});
    server_->started(kStartTimeout);
    port_ =
        static_cast<uint16_t>(to_int(server_->expect("PORT ", kStartTimeout)));
  }

  void TearDown() override {
    if (port_ == 0) {
      return;  // SetUp failed and said why
    }
    server_->close_stdin();
    EXPECT_EQ(server_->wait_exit(kExitTimeout), 0) << server_->transcript();
  }

  std::unique_ptr<TcpStore> tide(milliseconds timeout = kStoreTimeout) {
    return tide_client(port_, dialect_of(server_->torch_version()), timeout);
  }

  // Through the torch server's own TCPStore client. torch's get waits for
  // the key, so a tide set that is still in flight is seen.
  std::string torch_get(const std::string& key) {
    std::string reply = server_->call("get " + key, kRunTimeout);
    EXPECT_TRUE(reply.starts_with("VALUE ")) << reply;
    return unhex(
        std::string_view(reply).substr(std::min<size_t>(6, reply.size())));
  }
  void torch_set(const std::string& key, std::string_view value) {
    EXPECT_EQ(
        server_->call("set " + key + " " + hex(value), kRunTimeout), "OK");
  }
  int64_t torch_int(const std::string& command) {
    std::string reply = server_->call(command, kRunTimeout);
    EXPECT_TRUE(reply.starts_with("INT ")) << reply;
    return to_int(
        std::string_view(reply).substr(std::min<size_t>(4, reply.size())));
  }

  std::unique_ptr<TorchPeer> server_;
  uint16_t port_ = 0;
};

TEST_F(
    TideClientOnTorchServerTest,
    TideClientSeesKeysSetByTorchAndTorchSeesKeysSetByTide) {
  auto store = tide();
  store->set("tide/str", kTideStr);
  store->set("tide/bin", all_bytes(false));
  store->set("tide/empty", "");
  store->set("tide/big", big_value(1));
  EXPECT_EQ(torch_get("tide/str"), kTideStr);
  EXPECT_EQ(torch_get("tide/bin"), all_bytes(false));
  EXPECT_EQ(torch_get("tide/empty"), "");
  EXPECT_EQ(torch_get("tide/big"), big_value(1));

  torch_set("torch/str", kTorchStr);
  torch_set("torch/bin", all_bytes(true));
  torch_set("torch/empty", "");
  torch_set("torch/big", big_value(2));
  EXPECT_EQ(store->get("torch/str"), kTorchStr);
  EXPECT_EQ(store->get("torch/bin"), all_bytes(true));
  EXPECT_EQ(store->get("torch/empty"), "");
  EXPECT_EQ(store->get("torch/big"), big_value(2));

  EXPECT_EQ(store->add("counter", 7), 7);
  EXPECT_EQ(torch_int("add counter 3"), 10);
  EXPECT_EQ(store->get("counter"), "10");
  EXPECT_EQ(store->add("counter", -12), -2);
  EXPECT_EQ(torch_get("counter"), "-2");
}

TEST_F(
    TideClientOnTorchServerTest,
    TideCompareSetCheckDeleteAndNumKeysKeepTheStoreContract) {
  auto store = tide();
  EXPECT_EQ(store->compare_set("cas", "", "first"), "first");
  EXPECT_EQ(store->compare_set("cas", "wrong", "second"), "first");
  EXPECT_EQ(store->compare_set("cas", "first", "third"), "third");
  EXPECT_EQ(store->compare_set("absent", "x", "y"), "x");
  EXPECT_FALSE(store->check({"absent"}));
  EXPECT_EQ(torch_get("cas"), "third");

  EXPECT_TRUE(store->check({"cas"}));
  EXPECT_FALSE(store->check({"cas", "absent"}));
  EXPECT_TRUE(store->check({}));

  int64_t n0 = store->num_keys();
  EXPECT_EQ(n0, 1);
  store->set("a", "1");
  store->set("a", "2");
  EXPECT_EQ(store->num_keys(), n0 + 1);
  // tide's round trip above ordered its sets before torch's request.
  EXPECT_EQ(torch_int("num_keys"), n0 + 1);
  EXPECT_TRUE(store->delete_key("a"));
  EXPECT_FALSE(store->delete_key("a"));
  EXPECT_FALSE(store->check({"a"}));
  EXPECT_EQ(store->num_keys(), n0);

  torch_set("from_torch", "x");
  EXPECT_TRUE(store->delete_key("from_torch"));
  EXPECT_EQ(torch_int("num_keys"), n0);
  EXPECT_EQ(torch_int("delete cas"), 1);
  EXPECT_FALSE(store->check({"cas"}));
}

TEST_F(
    TideClientOnTorchServerTest,
    TideWaitReturnsOnceTorchSetsTheKeysElseThrowsTimeoutError) {
  auto store = tide();
  store->set("w/present", "x");
  store->wait({"w/present"}, 5s);

  auto waiter = tide();
  auto waited = std::async(std::launch::async, [&] {
    waiter->wait({"w/a", "w/b"}, kStoreTimeout);
    return waiter->get("w/b");
  });
  torch_set("w/a", "a");
  EXPECT_NE(waited.wait_for(200ms), std::future_status::ready);
  torch_set("w/b", "b");
  ASSERT_EQ(waited.wait_for(kRunTimeout), std::future_status::ready);
  EXPECT_EQ(waited.get(), "b");

  auto start = Clock::now();
  try {
    store->wait({"w/a", "w/never"}, 300ms);
    ADD_FAILURE() << "wait for a key nobody sets returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("w/never"), std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find("w/a"), std::string::npos) << e.what();
  }
  auto took = Clock::now() - start;
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 5s);

  auto impatient = tide(300ms);
  start = Clock::now();
  EXPECT_THROW(impatient->get("w/never"), TimeoutError);
  took = Clock::now() - start;
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 5s);

  // Both clients go on (on a new connection), and the torch server survives
  // setting a key that closed connections were waiting for.
  torch_set("w/never", "late");
  EXPECT_EQ(store->get("w/never"), "late");
  EXPECT_EQ(impatient->get("w/never"), "late");
  EXPECT_EQ(torch_get("w/never"), "late");
}

TEST_F(
    TideClientOnTorchServerTest,
    TideAppendMultiSetAndMultiGetWorkWithoutThoseCommands) {
  auto store = tide();
  store->append("log", "a");
  EXPECT_EQ(torch_get("log"), "a");
  store->append("log", "bc");
  EXPECT_EQ(torch_get("log"), "abc");
  torch_set("torch_log", "x");
  store->append("torch_log", std::string("\0y", 2));
  EXPECT_EQ(torch_get("torch_log"), std::string("x\0y", 3));

  store->multi_set({"ms/1", "ms/2", "ms/3"}, {"one", all_bytes(false), ""});
  EXPECT_EQ(torch_get("ms/1"), "one");
  EXPECT_EQ(torch_get("ms/2"), all_bytes(false));
  EXPECT_EQ(torch_get("ms/3"), "");

  torch_set("mg/1", "first");
  torch_set("mg/2", big_value(3));
  EXPECT_EQ(
      store->multi_get({"mg/2", "ms/3", "mg/1", "mg/2"}),
      (std::vector<std::string>{big_value(3), "", "first", big_value(3)}));
  EXPECT_EQ(store->multi_get({}), std::vector<std::string>{});
}

TEST_F(
    TideClientOnTorchServerTest,
    ConcurrentTideAndTorchClientsLoseNoAddOrAppend) {
  constexpr int kTideThreads = 4;
  constexpr int kTorchThreads = 2;
  constexpr int kAdds = 200;
  constexpr int kAppends = 50;

  auto peer = std::make_unique<TorchPeer>(std::vector<std::string>{
      "client",
      "adder",
      "--port",
      std::to_string(port_),
      "--timeout-s",
      kStoreTimeoutSeconds,
      "--key",
      "shared/counter",
      "--count",
      std::to_string(kAdds),
      "--threads",
      std::to_string(kTorchThreads)});
  peer->started(kStartTimeout);
  peer->expect("READY", kRunTimeout);

  std::vector<std::vector<int64_t>> tide_values(kTideThreads);
  std::vector<std::unique_ptr<TcpStore>> stores;
  for (int i = 0; i < kTideThreads; ++i) {
    stores.push_back(tide());
  }
  // Each thread appends its own letter, so a lost append shows as a count.
  ThreadGang gang(kTideThreads, [&](int t) {
    std::string letter(1, static_cast<char>('a' + t));
    for (int i = 0; i < std::max(kAdds, kAppends); ++i) {
      if (i < kAdds) {
        tide_values[t].push_back(stores[t]->add("shared/counter", 1));
      }
      if (i < kAppends) {
        stores[t]->append("shared/log", letter);
      }
    }
  });
  peer->send_line("GO");
  gang.go();

  std::vector<int64_t> values = to_ints(peer->expect("VALUES ", kRunTimeout));
  expect_pass(*peer);
  gang.join(kRunTimeout);
  for (const auto& v : tide_values) {
    values.insert(values.end(), v.begin(), v.end());
  }
  constexpr int64_t kTotal = (kTideThreads + kTorchThreads) * kAdds;
  expect_each_of_one_to_n_once(values, kTotal);
  EXPECT_EQ(torch_get("shared/counter"), std::to_string(kTotal));

  std::string log = torch_get("shared/log");
  EXPECT_EQ(log.size(), size_t{kTideThreads * kAppends});
  for (int t = 0; t < kTideThreads; ++t) {
    EXPECT_EQ(std::count(log.begin(), log.end(), 'a' + t), kAppends) << log;
  }
}

}  // namespace
}  // namespace tide::store
