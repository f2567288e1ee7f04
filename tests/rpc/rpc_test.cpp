#include "tide/rpc/rpc.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/store/tcp_store.h"

#include "support/raw_client.h"
#include "support/rpc_child.h"
#include "support/rpc_entry.h"
#include "support/subprocess.h"

namespace tide::rpc {
namespace {

using namespace std::chrono_literals;
using store::TcpStore;
using store::TcpStoreOptions;
using ::testing::HasSubstr;

int64_t add(int64_t a, int64_t b) {
  return a + b;
}

std::string shout(const std::string& s) {
  return s + "!";
}

TIDE_RPC_FUNCTION(global_triple, [](int64_t v) { return 3 * v; });

// A rendezvous store on 127.0.0.1 (port 0) and agents over it, each with
// its own store client (a client serialises its calls, and the shutdown
// barrier blocks in one).
class RpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TcpStore>(TcpStoreOptions{
        .host = "127.0.0.1", .port = 0, .is_server = true, .timeout = 10s});
  }

  std::shared_ptr<store::Store> client() {
    return std::make_shared<TcpStore>(TcpStoreOptions{
        .host = "127.0.0.1", .port = server_->port(), .timeout = 10s});
  }

  // Starts `names.size()` agents at once (each blocks until all are in).
  std::vector<std::unique_ptr<RpcAgent>> group(
      const std::vector<std::string>& names, RpcBackendOptions options = {}) {
    std::vector<std::pair<std::string, int>> ranked;
    for (size_t r = 0; r < names.size(); ++r) {
      ranked.emplace_back(names[r], static_cast<int>(r));
    }
    return some_of(ranked, static_cast<int>(names.size()), options);
  }
  // Starts the agents (name, rank) of a group of `world_size` at once; the
  // others are other processes. Returns once the group is complete.
  std::vector<std::unique_ptr<RpcAgent>> some_of(
      const std::vector<std::pair<std::string, int>>& ranked,
      int world_size,
      const RpcBackendOptions& options = {}) {
    std::vector<std::future<std::unique_ptr<RpcAgent>>> starting;
    for (const auto& [name, rank] : ranked) {
      starting.push_back(std::async(std::launch::async, [&, rank] {
        return std::make_unique<RpcAgent>(
            name, rank, world_size, options, client());
      }));
    }
    std::vector<std::unique_ptr<RpcAgent>> agents;
    for (auto& s : starting) {
      agents.push_back(s.get());
    }
    return agents;
  }

  std::unique_ptr<TcpStore> server_;
};

TEST_F(RpcTest, InitPublishesEveryWorkerInfo) {
  auto agents = group({"a", "b", "c"});
  for (const auto& agent : agents) {
    EXPECT_EQ(
        agent->worker_infos(),
        (std::vector<WorkerInfo>{{"a", 0}, {"b", 1}, {"c", 2}}));
  }
  EXPECT_EQ(agents[1]->get_worker_info(), (WorkerInfo{"b", 1}));
  EXPECT_EQ(agents[0]->get_worker_info("c"), (WorkerInfo{"c", 2}));
  try {
    agents[0]->get_worker_info("d");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("no rpc worker named 'd'"));
    EXPECT_THAT(e.what(), HasSubstr("a, b, c"));
  }
}

TEST_F(RpcTest, DuplicateNameFailsNamingTheName) {
  // Rank 0's rendezvous must outlast rank 1's start (which publishes the
  // duplicate) on a loaded machine: it ends as soon as rank 1 is in.
  RpcBackendOptions options{.rpc_timeout = 30000ms};
  auto first = std::async(std::launch::async, [&] {
    return std::make_unique<RpcAgent>("same", 0, 2, options, client());
  });
  // Wait until rank 0 has claimed the name.
  client()->wait({rpc_core::peer_key(0)}, 30s);
  try {
    RpcAgent second("same", 1, 2, options, client());
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("worker name 'same' is taken by rank 0"));
  }
  // Rank 0 finds the duplicate in the entries too.
  EXPECT_THROW(first.get(), InvalidArgument);
}

TEST_F(RpcTest, MismatchedWorldSizeFails) {
  RpcBackendOptions options{.rpc_timeout = 1000ms};
  auto first = std::async(std::launch::async, [&] {
    return std::make_unique<RpcAgent>("x", 0, 2, options, client());
  });
  // Wait until rank 0 has claimed the world size.
  client()->wait({rpc_core::peer_key(0)}, 30s);
  try {
    RpcAgent second("y", 1, 3, options, client());
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("world_size 3"));
    EXPECT_THAT(e.what(), HasSubstr("world_size 2"));
  }
  EXPECT_THROW(first.get(), RendezvousError);
}

TEST_F(RpcTest, BadOptionsFailNamingTheOption) {
  auto refused = [&](RpcBackendOptions options, const std::string& why) {
    EXPECT_THAT(
        [&] { RpcAgent agent("x", 0, 1, options, client()); },
        testing::ThrowsMessage<InvalidArgument>(HasSubstr(why)));
  };
  refused({.num_worker_threads = 0}, "num_worker_threads must be at least 1");
  refused({.tcp_lanes = -1}, "tcp_lanes must be 0 to");
  refused({.poll_us = -1}, "poll_us must be 0 to 100000; got -1");
  refused({.poll_us = 100001}, "poll_us must be 0 to 100000");
}

TEST_F(RpcTest, SyncAndAsyncCallsCarryTypedValues) {
  auto agents = group({"caller", "callee"});
  RpcAgent& callee = *agents[1];
  RpcAgent& caller = *agents[0];
  callee.register_function("add", add);
  callee.register_function("shout", shout);
  callee.register_function("sum", [](const std::vector<int64_t>& v) {
    int64_t s = 0;
    for (int64_t x : v) {
      s += x;
    }
    return s;
  });
  callee.register_function("invert", [](const std::map<std::string, int>& m) {
    std::map<int, std::string> out;
    for (const auto& [k, v] : m) {
      out[v] = k;
    }
    return out;
  });
  callee.register_function("swap", [](const std::tuple<int, std::string>& t) {
    return std::make_tuple(std::get<1>(t), std::get<0>(t));
  });
  callee.register_function("maybe", [](std::optional<int> v) {
    return v ? std::optional<std::string>(std::to_string(*v)) : std::nullopt;
  });
  std::atomic<int> touched{0};
  callee.register_function("touch", [&touched] { touched.fetch_add(1); });

  EXPECT_EQ(caller.rpc_sync<int64_t>("callee", "add", 2, 3), 5);
  EXPECT_EQ(caller.rpc_sync<std::string>("callee", "shout", "hi"), "hi!");
  EXPECT_EQ(
      caller.rpc_sync<int64_t>(
          "callee", "sum", std::vector<int64_t>{1, 2, 3, 4}),
      10);
  EXPECT_EQ(
      (caller.rpc_sync<std::map<int, std::string>>(
          "callee", "invert", std::map<std::string, int>{{"a", 1}, {"b", 2}})),
      (std::map<int, std::string>{{1, "a"}, {2, "b"}}));
  EXPECT_EQ(
      (caller.rpc_sync<std::tuple<std::string, int>>(
          "callee", "swap", std::make_tuple(7, std::string("seven")))),
      std::make_tuple(std::string("seven"), 7));
  EXPECT_EQ(
      caller.rpc_sync<std::optional<std::string>>(
          "callee", "maybe", std::optional<int>(4)),
      "4");
  EXPECT_EQ(
      caller.rpc_sync<std::optional<std::string>>(
          "callee", "maybe", std::optional<int>()),
      std::nullopt);
  caller.rpc_sync<void>("callee", "touch");
  EXPECT_EQ(touched.load(), 1);

  Future<int64_t> f = caller.rpc_async<int64_t>("callee", "add", 40, 2);
  Future<std::string> g =
      caller.rpc_async<std::string>("callee", "shout", 5000ms, "async");
  EXPECT_EQ(f.wait(10s), 42);
  EXPECT_EQ(g.wait(10s), "async!");
  // Both ways, and to itself.
  agents[0]->register_function("add", add);
  EXPECT_EQ(callee.rpc_sync<int64_t>("caller", "add", 1, 1), 2);
  EXPECT_EQ(callee.rpc_sync<std::string>("callee", "shout", "me"), "me!");
}

TEST_F(RpcTest, WrongArgumentTypeNamesFunctionAndArgument) {
  auto agents = group({"caller", "callee"});
  agents[1]->register_function("add", add);
  try {
    agents[0]->rpc_sync<int64_t>("callee", "add", 1, std::string("two"));
    FAIL() << "expected RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_THAT(e.what(), HasSubstr("add(): argument 2: expected i64"));
    EXPECT_THAT(e.what(), HasSubstr("got string"));
    EXPECT_THAT(e.what(), HasSubstr("tide::InvalidArgument"));
  }
  try {
    agents[0]->rpc_sync<std::string>("callee", "add", 1, 2);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("add(): result: expected string"));
  }
  try {
    agents[0]->rpc_sync<int64_t>("callee", "nope", 1);
    FAIL() << "expected RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_THAT(e.what(), HasSubstr("no function 'nope' on worker 'callee'"));
    EXPECT_THAT(e.what(), HasSubstr("add"));
  }
  EXPECT_THROW(
      agents[0]->rpc_async<int64_t>("nobody", "add", 1, 2), InvalidArgument);
}

TEST_F(RpcTest, RemoteExceptionArrivesAsRemoteErrorWithTypeAndMessage) {
  auto agents = group({"caller", "callee"});
  agents[1]->register_function("fail", [](int v) -> int {
    throw std::out_of_range("value " + std::to_string(v) + " is too big");
  });
  Future<int> f = agents[0]->rpc_async<int>("callee", "fail", 99);
  try {
    f.wait(10s);
    FAIL() << "expected RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_THAT(e.what(), HasSubstr("fail()"));
    EXPECT_THAT(e.what(), HasSubstr("callee"));
    EXPECT_THAT(e.what(), HasSubstr("std::out_of_range"));
    EXPECT_THAT(e.what(), HasSubstr("value 99 is too big"));
  }
}

TEST_F(RpcTest, PerCallTimeoutGivesTimeoutErrorAndDropsTheLateReply) {
  auto agents = group({"caller", "callee"});
  Promise<void> release;
  Future<void> released = release.get_future();
  agents[1]->register_function("block", [released] {
    released.wait(30s);
    return 1;
  });
  agents[1]->register_function("add", add);
  auto start = std::chrono::steady_clock::now();
  Future<int> f = agents[0]->rpc_async<int>("callee", "block", 200ms);
  try {
    f.wait(10s);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("block()"));
    EXPECT_THAT(e.what(), HasSubstr("200 ms"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(agents[0]->num_pending_calls(), 0u);
  release.set_value();
  // The late reply is dropped; the connection goes on.
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("callee", "add", 1, 2), 3);
}

TEST_F(RpcTest, AsyncFunctionDoesNotHoldAWorkerThread) {
  auto agents = group({"caller", "callee"}, {.num_worker_threads = 1});
  std::mutex mutex;
  std::vector<Promise<int64_t>> held;
  Promise<void> first_in;
  agents[1]->register_function("later", [&](int64_t v) {
    Promise<int64_t> p;
    {
      std::lock_guard lock(mutex);
      held.push_back(p);
    }
    first_in.set_value();
    return p.get_future().then([v](const int64_t& x) { return x + v; });
  });
  agents[1]->register_function("add", add);
  Future<int64_t> pending = agents[0]->rpc_async<int64_t>("callee", "later", 1);
  first_in.get_future().wait(10s);
  // The only worker thread is free: a plain call goes through meanwhile.
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("callee", "add", 2, 2), 4);
  EXPECT_FALSE(pending.ready());
  std::thread completer([&] {
    std::lock_guard lock(mutex);
    held.at(0).set_value(41);
  });
  completer.join();
  EXPECT_EQ(pending.wait(10s), 42);
}

// A peer that sends requests faster than they run fills a bounded queue:
// past transport::Workers::kMaxQueuedRequests each is answered with an
// error at once, and the queue drains as before once the thread is free.
TEST_F(RpcTest, RequestsPastTheWorkersQueueAreRefusedAtOnce) {
  auto agents = group({"caller", "callee"}, {.num_worker_threads = 1});
  Promise<void> release;
  Future<void> released = release.get_future();
  Promise<void> in;
  agents[1]->register_function("block", [&] {
    in.set_value();
    released.wait(60s);
  });
  agents[1]->register_function("add", add);
  Future<void> blocking = agents[0]->rpc_async<void>("callee", "block");
  in.get_future().wait(10s);
  constexpr size_t kQueue = 65'536;
  std::vector<Future<int64_t>> queued;
  queued.reserve(kQueue + 100);
  for (size_t i = 0; i < kQueue + 100; ++i) {
    queued.push_back(agents[0]->rpc_async<int64_t>(
        "callee", "add", int64_t{1}, static_cast<int64_t>(i)));
  }
  // The last ones were refused while the thread was still held.
  try {
    queued.back().wait(60s);
    FAIL() << "expected the call to be refused";
  } catch (const RemoteError& e) {
    EXPECT_THAT(e.what(), HasSubstr("requests waiting for a thread already"));
  }
  release.set_value();
  blocking.wait(60s);
  size_t served = 0;
  size_t refused = 0;
  for (auto& f : queued) {
    try {
      f.wait(60s);
      ++served;
    } catch (const RemoteError&) {
      ++refused;
    }
  }
  EXPECT_GE(served, kQueue - 1);
  EXPECT_GE(refused, 99u);
  EXPECT_EQ(served + refused, queued.size());
}

TEST_F(RpcTest, AsyncFunctionCompletingAfterTheAgentIsGoneIsHarmless) {
  auto agents = group({"caller", "callee"});
  Promise<int64_t> held;
  Promise<void> in;
  agents[1]->register_function("later", [&] {
    in.set_value();
    return held.get_future();
  });
  Future<int64_t> f = agents[0]->rpc_async<int64_t>("callee", "later");
  in.get_future().wait(10s);
  agents.clear();
  EXPECT_THROW(f.wait(10s), NetworkError);
  held.set_value(1);  // Finds the agent and its transport gone.
}

TEST_F(RpcTest, ThousandCallsInFlight) {
  auto agents = group({"a", "b", "c"});
  agents[1]->register_function("add", add);
  agents[2]->register_function("add", add);
  std::vector<Future<int64_t>> calls;
  for (int64_t i = 0; i < 1000; ++i) {
    calls.push_back(
        agents[0]->rpc_async<int64_t>(i % 2 == 0 ? "b" : "c", "add", i, 1));
  }
  for (int64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(calls[static_cast<size_t>(i)].wait(30s), i + 1);
  }
  EXPECT_EQ(agents[0]->num_pending_calls(), 0u);
}

// Threads waiting in rpc_sync, and pool threads waiting for requests, run
// the I/O loop's handlers themselves (one thread at a time): many waiting
// callers, a burst of async calls with continuations and functions that call
// on must each still get their own reply.
TEST_F(RpcTest, ManyWaitingThreadsShareTheLoop) {
  auto agents = group({"a", "b", "c"});
  agents[2]->register_function("add", add);
  RpcAgent& b = *agents[1];
  b.register_function("add", add);
  b.register_function("add_via_c", [&b](int64_t x, int64_t y) {
    return b.rpc_sync<int64_t>("c", "add", x, y);
  });
  RpcAgent& a = *agents[0];
  std::atomic<int64_t> async_sum{0};
  std::vector<Future<void>> async_calls;
  for (int64_t i = 0; i < 500; ++i) {
    async_calls.push_back(
        a.rpc_async<int64_t>(i % 2 ? "b" : "c", "add", i, 1)
            .then([&](const int64_t& v) { async_sum.fetch_add(v); }));
  }
  constexpr int kThreads = 4;
  constexpr int64_t kCalls = 200;
  std::vector<int64_t> wrong(kThreads, 0);
  std::vector<std::thread> callers;
  for (int t = 0; t < kThreads; ++t) {
    callers.emplace_back([&, t] {
      for (int64_t i = 0; i < kCalls; ++i) {
        const char* fn = i % 3 == 0 ? "add_via_c" : "add";
        const char* to = i % 3 == 1 ? "c" : "b";
        if (a.rpc_sync<int64_t>(to, fn, i, int64_t{t}) != i + t) {
          ++wrong[static_cast<size_t>(t)];
        }
      }
    });
  }
  for (auto& c : callers) {
    c.join();
  }
  for (auto& f : async_calls) {
    f.wait(30s);
  }
  EXPECT_THAT(wrong, ::testing::Each(0));
  EXPECT_EQ(async_sum.load(), 500 * 499 / 2 + 500);
  EXPECT_EQ(a.num_pending_calls(), 0u);
}

TEST_F(RpcTest, GracefulShutdownCompletesCallsInFlight) {
  auto agents = group({"caller", "callee"});
  Promise<void> release;
  Future<void> released = release.get_future();
  agents[1]->register_function("gated", [released](int v) {
    released.wait(30s);
    return v * 2;
  });
  std::vector<Future<int>> calls;
  for (int i = 0; i < 10; ++i) {
    calls.push_back(agents[0]->rpc_async<int>("callee", "gated", i));
  }
  std::vector<std::thread> stopping;
  for (auto& agent : agents) {
    stopping.emplace_back([&agent] { agent->shutdown(true); });
  }
  release.set_value();
  for (auto& t : stopping) {
    t.join();
  }
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(calls[static_cast<size_t>(i)].ready());
    EXPECT_EQ(calls[static_cast<size_t>(i)].wait(0ms), 2 * i);
  }
  EXPECT_THROW(
      agents[0]->rpc_async<int>("callee", "gated", 1).wait(10s), NetworkError);
}

TEST_F(RpcTest, UngracefulShutdownFailsPendingCalls) {
  auto agents = group({"caller", "callee"});
  Promise<void> release;
  Future<void> released = release.get_future();
  agents[1]->register_function("gated", [released] {
    released.wait(30s);
    return 1;
  });
  Future<int> f = agents[0]->rpc_async<int>("callee", "gated");
  agents[0]->shutdown(false);
  EXPECT_THROW(f.wait(10s), NetworkError);
  release.set_value();
}

TEST_F(RpcTest, StaticallyRegisteredFunctionsServeEveryAgent) {
  auto agents = group({"a", "b"});
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("b", "global_triple", 5), 15);
  EXPECT_EQ(agents[1]->rpc_sync<int64_t>("a", "global_triple", 2), 6);
}

TEST_F(RpcTest, GarbageOnTheRpcPortDropsOnlyThatConnection) {
  auto agents = group({"a", "b"});
  agents[1]->register_function("add", add);
  auto entry = test::published_entry(*client(), 1);
  ASSERT_EQ(entry.host, "127.0.0.1");
  test::RawClient garbage(entry.port);
  ASSERT_TRUE(garbage.send("GET / HTTP/1.1\r\n\r\n"));
  EXPECT_TRUE(garbage.closed_within(10s));
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("b", "add", 1, 2), 3);
}

TEST(RpcGlobalTest, InitRpcCallsThroughTheProcessAgent) {
  init_rpc("solo", 0, 1, {.init_method = "tcp://127.0.0.1:0"});
  EXPECT_THROW(init_rpc("again", 0, 1, {}), InvalidArgument);
  current_agent().register_function("add", add);
  EXPECT_EQ(get_worker_info(), (WorkerInfo{"solo", 0}));
  EXPECT_EQ(rpc_sync<int64_t>("solo", "add", 20, 22), 42);
  EXPECT_EQ(rpc_async<int64_t>("solo", "add", 1, 2).wait(10s), 3);
  shutdown();
  EXPECT_THROW(current_agent(), InvalidArgument);
}

TEST(RpcGlobalTest, EnvInitMethodReadsMasterAddrAndPort) {
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
  try {
    init_rpc("solo", 0, 1);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("MASTER_ADDR and MASTER_PORT"));
  }
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "0", 1);
  init_rpc("solo", 0, 1);
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
  EXPECT_EQ(get_worker_info("solo"), (WorkerInfo{"solo", 0}));
  shutdown();
}

TEST_F(RpcTest, AFunctionMayCallOtherWorkers) {
  auto agents = group({"a", "b", "c"});
  agents[2]->register_function("add", add);
  RpcAgent& b = *agents[1];
  b.register_function("add_via_c", [&b](int64_t x, int64_t y) {
    return b.rpc_sync<int64_t>("c", "add", x, y) * 10;
  });
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("b", "add_via_c", 1, 2), 30);
}

// The peer is a re-executed copy of this binary (run_rpc_child_if_requested)
// killed with SIGKILL while a call to it runs.
TEST_F(RpcTest, PeerDeathFailsItsPendingCallsPromptly) {
  test::Subprocess child(
      {"/proc/self/exe"},
      {.env = {{"TIDE_RPC_TEST_CHILD", std::to_string(server_->port())}}});
  auto agents = some_of({{"parent", 0}, {"third", 2}}, 3);
  ASSERT_EQ(child.read_line(30s), "ready");
  agents[1]->register_function("add", add);
  Future<int> slow = agents[0]->rpc_async<int>(
      "child", "slow", std::chrono::milliseconds(60000));
  ASSERT_EQ(child.read_line(30s), "slow started");
  auto killed = std::chrono::steady_clock::now();
  child.signal(SIGKILL);
  try {
    slow.wait(20s);
    FAIL() << "expected NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr("slow()"));
    EXPECT_THAT(e.what(), HasSubstr("child"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 10s);
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("third", "add", 2, 5), 7);
  // A new call to the dead peer fails too (connection refused).
  EXPECT_THROW(
      agents[0]->rpc_sync<int>(
          "child", "slow", std::chrono::milliseconds(10000)),
      NetworkError);
  for (auto& agent : agents) {
    agent->shutdown(false);
  }
}

// ---- Functions that block on the callee (docs/thread_model.md) ----

// The timeout of the calls below, far past the 20 s a blocked function waits.
constexpr std::chrono::milliseconds kCallTimeout{60000};

// Worker "w0" is a child process (run_blocking_child) whose functions wait
// on a condition until released: by a call (release) or by a line on its
// stdin, which also answers questions about its threads while every one of
// them may be blocked. "w1" and "w2" are agents of this process.
class BlockingTest : public RpcTest {
 protected:
  void start(int threads) {
    child_.emplace(
        std::vector<std::string>{"/proc/self/exe"},
        test::SubprocessOptions{
            .env =
                {{"TIDE_RPC_TEST_CHILD", std::to_string(server_->port())},
                 {"TIDE_RPC_TEST_CHILD_THREADS", std::to_string(threads)}},
            .pipe_stdin = true});
    agents_ = some_of({{"w1", 1}, {"w2", 2}}, 3);
    ASSERT_EQ(child_->read_line(30s), "ready");
  }
  // A line to the child and its answer.
  std::string ask(const std::string& line) {
    child_->write_line(line);
    return child_->read_line(30s).value_or("(no answer)");
  }
  void TearDown() override {
    for (auto& agent : agents_) {
      agent->shutdown(false);
    }
  }

  std::optional<test::Subprocess> child_;
  std::vector<std::unique_ptr<RpcAgent>> agents_;
};

// The reproduction of a parameter server's lock over RPC: w1 makes N calls
// that each block on w0 until released, w2 releases them one call at a time
// once all N wait. Each wait gives up (false) after 20 s; a worker that stops
// reading while its functions block would let none of the releases in.
class BlockedFunctionsTest : public BlockingTest,
                             public ::testing::WithParamInterface<int> {};

TEST_P(BlockedFunctionsTest, ReleasesReachAWorkerWhoseFunctionsWait) {
  const int n = GetParam();
  // N waits, and the call that waits for them: N + 1 threads.
  start(n + 1);
  std::vector<Future<bool>> waits;
  for (int i = 0; i < n; ++i) {
    waits.push_back(agents_[0]->rpc_async<bool>(
        "w0", "wait_for", kCallTimeout, int64_t{i + 1}));
  }
  ASSERT_TRUE(
      agents_[1]->rpc_sync<bool>("w0", "waiters", kCallTimeout, int64_t{n}));
  for (int i = 0; i < n; ++i) {
    agents_[1]->rpc_sync<void>("w0", "release", kCallTimeout);
  }
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(waits[static_cast<size_t>(i)].wait(60s)) << "wait " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Waits, BlockedFunctionsTest, ::testing::Values(1, 2, 6, 16));

// T threads, T + 1 blocked functions: the extra one waits for a thread; the
// worker still reads, completes its own calls and lets callers time out.
TEST_F(BlockingTest, TheFunctionPastTheThreadsWaitsAndNothingElseStalls) {
  start(2);
  std::vector<Future<bool>> waits;
  for (int64_t k = 1; k <= 3; ++k) {
    waits.push_back(
        agents_[0]->rpc_async<bool>("w0", "wait_for", kCallTimeout, k));
  }
  // Two run and block; the third is queued.
  EXPECT_EQ(ask("await 2"), "waiters 2 idle 0");
  // A call to w0 needs a thread: it gets its timeout error.
  EXPECT_THROW(
      agents_[1]->rpc_sync<int64_t>("w0", "add", 300ms, int64_t{1}, int64_t{2}),
      TimeoutError);
  // w0's own call to w2 completes: its loop reads the reply.
  agents_[1]->register_function("add", add);
  EXPECT_EQ(ask("call w2"), "w2 says 5");
  EXPECT_FALSE(waits[2].ready());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ask("release"), "released");
  }
  for (auto& w : waits) {
    EXPECT_TRUE(w.wait(60s));
  }
  EXPECT_EQ(
      agents_[1]->rpc_sync<int64_t>(
          "w0", "add", kCallTimeout, int64_t{2}, int64_t{3}),
      5);
}

// A function that blocks until its own worker has served a call that came
// back to it meanwhile (w0 -> w2 -> w0).
TEST_F(BlockingTest, AFunctionWaitsWhileItsWorkerServesACallBackToIt) {
  start(2);
  agents_[1]->register_function("release_w0", [this] {
    agents_[1]->rpc_sync<void>("w0", "release", kCallTimeout);
  });
  EXPECT_TRUE(
      agents_[0]->rpc_sync<bool>("w0", "bounce_then_wait", kCallTimeout));
}

// Continuations of call futures run on a free pool thread: one that blocks
// in another call (on the caller, and in an async function's chain on the
// callee) holds up no other reply.
TEST_F(RpcTest, ContinuationsThatBlockStallNoReply) {
  auto agents = group({"a", "b", "c"});
  RpcAgent& a = *agents[0];
  RpcAgent& b = *agents[1];
  agents[2]->register_function("add", add);
  b.register_function("add", add);
  b.register_function("add_twice_via_c", [&b](int64_t x) {
    return b.rpc_async<int64_t>("c", "add", x, int64_t{1})
        .then([&b](const int64_t& v) {
          return b.rpc_sync<int64_t>("c", "add", v, int64_t{1});
        });
  });
  std::vector<Future<int64_t>> chained;
  for (int64_t i = 0; i < 8; ++i) {
    chained.push_back(a.rpc_async<int64_t>("b", "add", i, int64_t{0})
                          .then([&a](const int64_t& v) {
                            return a.rpc_sync<int64_t>(
                                "c", "add", v, int64_t{100});
                          }));
    chained.push_back(a.rpc_async<int64_t>("b", "add_twice_via_c", i));
  }
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(chained[static_cast<size_t>(2 * i)].wait(30s), i + 100);
    EXPECT_EQ(chained[static_cast<size_t>(2 * i + 1)].wait(30s), i + 2);
  }
  EXPECT_EQ(a.rpc_sync<int64_t>("c", "add", int64_t{1}, int64_t{1}), 2);
}

}  // namespace
}  // namespace tide::rpc

namespace tide::test {

namespace {

// Worker w0 of BlockingTest, with `threads` worker threads. Its functions
// wait on one condition; its stdin takes "release", "await N" (until N
// functions wait), "call w2" (an add on w2, from this side).
[[noreturn]] void run_blocking_child(
    const std::shared_ptr<store::Store>& store, int threads) {
  using namespace std::chrono_literals;
  constexpr std::chrono::milliseconds kCallTimeout{60000};
  rpc::RpcAgent agent(
      "w0", 0, 3, rpc::RpcBackendOptions{.num_worker_threads = threads}, store);
  std::mutex mutex;
  std::condition_variable changed;
  int64_t released = 0;  // Guarded by mutex, as waiting.
  int64_t waiting = 0;
  auto release = [&] {
    {
      std::lock_guard lock(mutex);
      ++released;
    }
    changed.notify_all();
  };
  auto wait_for = [&](int64_t k) {
    std::unique_lock lock(mutex);
    ++waiting;
    changed.notify_all();
    bool ok = changed.wait_for(lock, 20s, [&] { return released >= k; });
    --waiting;
    return ok;
  };
  auto waiters = [&](int64_t n) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, 20s, [&] { return waiting >= n; });
  };
  agent.register_function("wait_for", wait_for);
  agent.register_function("release", release);
  agent.register_function("waiters", waiters);
  agent.register_function("add", [](int64_t a, int64_t b) { return a + b; });
  agent.register_function("bounce_then_wait", [&] {
    int64_t target = 0;
    {
      std::lock_guard lock(mutex);
      target = released + 1;
    }
    Future<void> bounced =
        agent.rpc_async<void>("w2", "release_w0", kCallTimeout);
    bool ok = wait_for(target);
    bounced.wait(60s);
    return ok;
  });
  std::printf("ready\n");
  std::fflush(stdout);
  char line[256];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
    std::string cmd(line);
    if (cmd == "release\n") {
      release();
      std::printf("released\n");
    } else if (cmd.rfind("await ", 0) == 0) {
      int64_t n = std::atoll(cmd.c_str() + 6);
      bool ok = waiters(n);
      std::printf(
          "waiters %lld idle %zu\n",
          static_cast<long long>(ok ? n : -1),
          agent.num_idle_threads());
    } else if (cmd == "call w2\n") {
      std::printf(
          "w2 says %lld\n",
          static_cast<long long>(agent.rpc_sync<int64_t>(
              "w2", "add", kCallTimeout, int64_t{2}, int64_t{3})));
    }
    std::fflush(stdout);
  }
  agent.shutdown(false);
  std::_Exit(0);
}

}  // namespace

void run_rpc_child_if_requested() {
  const char* port = std::getenv("TIDE_RPC_TEST_CHILD");
  if (port == nullptr) {
    return;
  }
  using namespace std::chrono_literals;
  auto store = std::make_shared<store::TcpStore>(store::TcpStoreOptions{
      .host = "127.0.0.1",
      .port = static_cast<uint16_t>(std::atoi(port)),
      .timeout = 30s});
  if (const char* threads = std::getenv("TIDE_RPC_TEST_CHILD_THREADS")) {
    run_blocking_child(store, std::atoi(threads));
  }
  rpc::RpcAgent agent("child", 1, 3, {}, store);
  agent.register_function("slow", [] {
    std::printf("slow started\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(60s);
    return 1;
  });
  std::printf("ready\n");
  std::fflush(stdout);
  ::pause();
  std::_Exit(0);
}

}  // namespace tide::test
