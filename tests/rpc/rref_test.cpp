#include "tide/rpc/rref.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/rpc/rpc.h"
#include "tide/store/tcp_store.h"

#include "support/eventually.h"
#include "support/rpc_child.h"
#include "support/subprocess.h"

namespace tide::rpc {
namespace {

using namespace std::chrono_literals;
using store::TcpStore;
using store::TcpStoreOptions;
using ::testing::HasSubstr;

struct Counter {
  int64_t total = 0;

  int64_t add(int64_t v) {
    total += v;
    return total;
  }
  int64_t get() const {
    return total;
  }
  void serialize(Encoder& e) const {
    encode(e, total);
  }
  static Counter deserialize(Decoder& d) {
    return Counter{decode<int64_t>(d)};
  }
};

// A value that cannot travel: only proxies reach it.
struct Table {
  std::vector<float> rows;
  std::vector<float> lookup(const std::vector<int64_t>& ids) const {
    std::vector<float> out;
    for (int64_t i : ids) {
      out.push_back(rows.at(static_cast<size_t>(i)));
    }
    return out;
  }
};

TIDE_RPC_FUNCTION(rref_make_counter, [](int64_t start) {
  return Counter{start};
});
TIDE_RPC_FUNCTION(rref_make_table, [](int64_t n) {
  Table t;
  for (int64_t i = 0; i < n; ++i) {
    t.rows.push_back(static_cast<float>(i) / 2);
  }
  return t;
});
TIDE_RPC_FUNCTION(rref_add, [](int64_t a, int64_t b) { return a + b; });
TIDE_RPC_FUNCTION(rref_fail, [](int64_t) -> int64_t {
  throw std::domain_error("no value today");
});
TIDE_RPC_FUNCTION(rref_value, [](RRef<int64_t> r) { return r.to_here(); });
TIDE_RPC_FUNCTION(rref_confirmed, [](RRef<int64_t> r) {
  return r.confirmed_by_owner();
});
TIDE_RPC_FUNCTION(rref_sum, [](std::vector<RRef<int64_t>> rs) {
  int64_t s = 0;
  for (auto& r : rs) {
    s += r.to_here();
  }
  return s;
});
TIDE_RPC_FUNCTION(rref_echo, [](RRef<int64_t> r) { return r; });
// Calls that stay pending until release_hung() (the fixture's TearDown).
std::mutex hung_mutex;
std::vector<Promise<int64_t>> hung;

Future<int64_t> hang() {
  std::lock_guard lock(hung_mutex);
  hung.emplace_back();
  return hung.back().get_future();
}

void release_hung() {
  std::vector<Promise<int64_t>> all;
  {
    std::lock_guard lock(hung_mutex);
    all.swap(hung);
  }
  for (auto& p : all) {
    p.set_value(-1);
  }
}

TIDE_RPC_FUNCTION(rref_hang, hang);

TIDE_RPC_METHOD(Counter, add, &Counter::add);
TIDE_RPC_METHOD(Counter, get, &Counter::get);
TIDE_RPC_METHOD(Counter, twice, [](Counter& c) { return 2 * c.total; });
TIDE_RPC_METHOD(Counter, hang, [](Counter&) { return hang(); });
TIDE_RPC_METHOD(Table, lookup, &Table::lookup);

class RRefTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TcpStore>(TcpStoreOptions{
        .host = "127.0.0.1", .port = 0, .is_server = true, .timeout = 10s});
  }

  std::shared_ptr<store::Store> client() {
    return std::make_shared<TcpStore>(TcpStoreOptions{
        .host = "127.0.0.1", .port = server_->port(), .timeout = 10s});
  }

  // n agents w0..w{n-1}; each can pass an RRef on: pass(r, to) calls
  // rref_value(r) on `to` from this worker.
  void start(int n, RpcBackendOptions options = {}) {
    options.fail_on_rref_leak = true;
    std::vector<std::future<std::unique_ptr<RpcAgent>>> starting;
    for (int r = 0; r < n; ++r) {
      starting.push_back(std::async(std::launch::async, [&, r] {
        return std::make_unique<RpcAgent>(
            "w" + std::to_string(r), r, n, options, client());
      }));
    }
    for (auto& s : starting) {
      agents_.push_back(s.get());
    }
    for (auto& agent : agents_) {
      RpcAgent* a = agent.get();
      a->register_function("pass", [a](RRef<int64_t> r, std::string to) {
        return a->rpc_sync<int64_t>(to, "rref_value", r);
      });
      a->register_function(
          "pass_chain", [a](RRef<int64_t> r, std::vector<std::string> path) {
            if (path.empty()) {
              return r.to_here();
            }
            std::string next = path.front();
            path.erase(path.begin());
            return a->rpc_sync<int64_t>(next, "pass_chain", r, path);
          });
      a->register_function("keep", [this](RRef<int64_t> r) {
        std::lock_guard lock(kept_mutex_);
        kept_.push_back(r);
      });
    }
  }

  RpcAgent& w(int i) {
    return *agents_[static_cast<size_t>(i)];
  }

  // Every agent owns and holds nothing (the deletes are asynchronous).
  void expect_all_released() {
    std::string state;
    EXPECT_TRUE(test::eventually(
        [&] {
          state.clear();
          for (auto& a : agents_) {
            auto r = a->rrefs();
            if (!r.owned.empty() || !r.held.empty() || !r.passing.empty()) {
              state += a->get_worker_info().name + ":\n" + r.str();
            }
          }
          return state.empty();
        },
        10s))
        << "references left:\n"
        << state;
  }

  void TearDown() override {
    release_hung();
    {
      std::lock_guard lock(kept_mutex_);
      kept_.clear();
    }
    std::vector<std::future<void>> stopping;
    for (auto& a : agents_) {
      stopping.push_back(
          std::async(std::launch::async, [&a] { a->shutdown(true); }));
    }
    for (auto& s : stopping) {
      s.get();  // throws on a leak (fail_on_rref_leak)
    }
  }

  std::unique_ptr<TcpStore> server_;
  std::vector<std::unique_ptr<RpcAgent>> agents_;
  std::mutex kept_mutex_;
  std::vector<RRef<int64_t>> kept_;
};

TEST_F(RRefTest, RemoteReturnsAtOnceAndToHereFetchesTheValue) {
  start(2);
  {
    RRef<int64_t> r = w(0).remote<int64_t>("w1", "rref_add", 2, 40);
    EXPECT_FALSE(r.is_owner());
    EXPECT_EQ(r.owner_name(), "w1");
    EXPECT_EQ(r.owner().id, 1);
    EXPECT_EQ(r.to_here(), 42);
    EXPECT_EQ(r.to_here(), 42);  // again: the value stays on the owner
    auto owned = w(1).rrefs().owned;
    ASSERT_EQ(owned.size(), 1u);
    EXPECT_EQ(owned[0].users.size(), 1u);
    EXPECT_EQ(owned[0].users[0].second, "w0");
    EXPECT_TRUE(r.confirmed_by_owner());
    EXPECT_THAT(
        [&] { r.local_value(); },
        testing::ThrowsMessage<InvalidArgument>(HasSubstr("lives on 'w1'")));
  }
  expect_all_released();
}

TEST_F(RRefTest, RemoteToSelfAndALocalRRefAreOwnedHere) {
  start(2);
  {
    RRef<int64_t> r = w(0).remote<int64_t>("w0", "rref_add", 1, 2);
    EXPECT_TRUE(r.is_owner());
    EXPECT_EQ(*r.local_value(), 3);
    EXPECT_EQ(r.to_here(), 3);
    RRef<int64_t> local(w(0), int64_t{7});
    EXPECT_TRUE(local.is_owner());
    EXPECT_TRUE(local.confirmed_by_owner());
    // Passed to a user and read there.
    EXPECT_EQ(w(0).rpc_sync<int64_t>("w1", "rref_value", local), 7);
    EXPECT_EQ(w(0).rpc_sync<int64_t>("w1", "rref_value", r), 3);
    // Back to itself (owner -> owner).
    EXPECT_EQ(w(0).rpc_sync<int64_t>("w0", "rref_value", local), 7);
  }
  expect_all_released();
}

TEST_F(RRefTest, UserToUserChainsAndBackToTheOwnerEndWithNoReference) {
  start(4);
  {
    RRef<int64_t> r = w(0).remote<int64_t>("w1", "rref_add", 20, 1);
    // w0 -> w2 -> w3 -> w1 (the owner) -> w0 (the creator) -> w2.
    EXPECT_EQ(
        w(0).rpc_sync<int64_t>(
            "w2",
            "pass_chain",
            r,
            std::vector<std::string>{"w3", "w1", "w0", "w2"}),
        21);
    // A user passing to itself.
    EXPECT_EQ(w(0).rpc_sync<int64_t>("w0", "pass", r, std::string("w0")), 21);
  }
  expect_all_released();
}

TEST_F(RRefTest, RRefsInContainersAndResults) {
  start(3);
  {
    std::vector<RRef<int64_t>> rs;
    for (int64_t i = 1; i <= 5; ++i) {
      rs.push_back(w(0).remote<int64_t>(i % 2 ? "w1" : "w2", "rref_add", i, 0));
    }
    rs.push_back(RRef<int64_t>(w(0), int64_t{100}));
    EXPECT_EQ(w(0).rpc_sync<int64_t>("w2", "rref_sum", rs), 115);
    // An RRef returned: owner -> user, and user -> user -> back.
    RRef<int64_t> back = w(0).rpc_sync<RRef<int64_t>>("w1", "rref_echo", rs[0]);
    EXPECT_EQ(back.id(), rs[0].id());
    EXPECT_EQ(back.to_here(), 1);
    RRef<int64_t> mine =
        w(0).rpc_sync<RRef<int64_t>>("w2", "rref_echo", rs.back());
    EXPECT_TRUE(mine.is_owner());
    EXPECT_EQ(*mine.local_value(), 100);
  }
  expect_all_released();
}

TEST_F(RRefTest, AFunctionReceivingAnRRefRunsAfterTheOwnerConfirmedIt) {
  start(3);
  {
    RRef<int64_t> r = w(0).remote<int64_t>("w1", "rref_add", 1, 1);
    for (int i = 0; i < 20; ++i) {
      EXPECT_TRUE(w(0).rpc_sync<bool>("w2", "rref_confirmed", r));
    }
  }
  expect_all_released();
}

TEST_F(RRefTest, OneRRefPassedToTwoUsersAtOnce) {
  start(4);
  {
    RRef<int64_t> r = w(0).remote<int64_t>("w1", "rref_add", 5, 5);
    std::vector<Future<int64_t>> fs;
    for (int i = 0; i < 10; ++i) {
      fs.push_back(w(0).rpc_async<int64_t>("w2", "rref_value", r));
      fs.push_back(w(0).rpc_async<int64_t>("w3", "rref_value", r));
    }
    for (auto& f : fs) {
      EXPECT_EQ(f.wait(10s), 10);
    }
  }
  expect_all_released();
}

TEST_F(RRefTest, AFetchOrAPassRacingTheCreationWaitsForIt) {
  start(3);
  for (int i = 0; i < 50; ++i) {
    RRef<int64_t> r = w(0).remote<int64_t>("w1", "rref_add", i, 1);
    Future<int64_t> passed = w(0).rpc_async<int64_t>("w2", "rref_value", r);
    EXPECT_EQ(r.to_here(), i + 1);
    EXPECT_EQ(passed.wait(10s), i + 1);
  }
  expect_all_released();
}

TEST_F(RRefTest, TheFunctionsErrorSurfacesOnEveryUse) {
  start(3);
  {
    RRef<int64_t> r = w(0).remote<int64_t>("w1", "rref_fail", int64_t{1});
    EXPECT_THAT(
        [&] { r.to_here(); },
        testing::ThrowsMessage<RemoteError>(HasSubstr("no value today")));
    EXPECT_THROW(w(0).rpc_sync<int64_t>("w2", "rref_value", r), RemoteError);
    RRef<int64_t> self = w(0).remote<int64_t>("w0", "rref_fail", int64_t{1});
    EXPECT_THROW(self.to_here(), RemoteError);
    RRef<int64_t> unknown = w(0).remote<int64_t>("w1", "no_such_function");
    EXPECT_THAT(
        [&] { unknown.to_here(); },
        testing::ThrowsMessage<RemoteError>(HasSubstr("no_such_function")));
  }
  expect_all_released();
}

TEST_F(RRefTest, ProxiesRunRegisteredMethodsOnTheOwner) {
  start(2);
  {
    RRef<Counter> c = w(0).remote<Counter>("w1", "rref_make_counter", 10);
    EXPECT_EQ(c.rpc_sync().call<int64_t>("add", 5), 15);
    Future<int64_t> f = c.rpc_async().call<int64_t>("add", 1);
    EXPECT_EQ(f.wait(10s), 16);
    EXPECT_EQ(c.rpc_sync().call<int64_t>("twice"), 32);
    RRef<int64_t> got = c.remote().call<int64_t>("get");
    EXPECT_EQ(got.owner_name(), "w1");
    EXPECT_EQ(got.to_here(), 16);
    EXPECT_EQ(c.to_here().total, 16);
    EXPECT_THAT(
        [&] { c.rpc_sync().call<int64_t>("nope"); },
        testing::ThrowsMessage<RemoteError>(HasSubstr("no method 'nope'")));
    EXPECT_THAT(
        [&] { c.rpc_sync(50ms).call<int64_t>("hang"); },
        testing::Throws<TimeoutError>());
    // A value that cannot travel: proxies only.
    RRef<Table> t = w(0).remote<Table>("w1", "rref_make_table", 8);
    EXPECT_EQ(
        t.rpc_sync().call<std::vector<float>>(
            "lookup", std::vector<int64_t>{1, 6}),
        (std::vector<float>{0.5f, 3.0f}));
    // On the owner, a proxy works too.
    RRef<Counter> own = w(1).remote<Counter>("w1", "rref_make_counter", 1);
    EXPECT_EQ(own.rpc_sync().call<int64_t>("add", 1), 2);
    EXPECT_EQ(own.local_value()->total, 2);
  }
  expect_all_released();
}

TEST_F(RRefTest, ToHereTimesOutAndRepeatedControlMessagesAreIgnored) {
  start(2);
  {
    RRef<int64_t> r = w(0).remote<int64_t>("w1", "rref_hang");
    EXPECT_THROW(r.to_here(50ms), TimeoutError);
    RRef<int64_t> v = w(0).remote<int64_t>("w1", "rref_add", 1, 1);
    ASSERT_EQ(v.to_here(), 2);
    auto held = w(0).rrefs().held;
    auto mine = std::find_if(held.begin(), held.end(), [&](const auto& h) {
      return h.id == v.id();
    });
    ASSERT_NE(mine, held.end());
    // A fork request repeated: the owner's books do not change.
    for (int i = 0; i < 2; ++i) {
      w(0).rpc_sync<void>(
          "w1",
          "tide.rref.fork",
          v.id().worker,
          v.id().local,
          mine->fork.worker,
          mine->fork.local);
    }
    auto owned = w(1).rrefs().owned;
    auto entry = std::find_if(owned.begin(), owned.end(), [&](const auto& o) {
      return o.id == v.id();
    });
    ASSERT_NE(entry, owned.end());
    EXPECT_EQ(entry->users.size(), 1u);
    // A child accept for a fork nobody passed, twice: ignored.
    for (int i = 0; i < 2; ++i) {
      w(1).rpc_sync<void>("w0", "tide.rref.accept", 0, int64_t{999999});
    }
    EXPECT_EQ(v.to_here(), 2);
  }
  // The hanging creation, once answered, is deleted like any other.
  release_hung();
  expect_all_released();
}

TEST_F(RRefTest, OnlyAForksHolderMayDeleteIt) {
  start(3);
  RRef<int64_t> v = w(0).remote<int64_t>("w1", "rref_add", 2, 3);
  ASSERT_EQ(v.to_here(), 5);
  auto held = w(0).rrefs().held;
  auto mine = std::find_if(
      held.begin(), held.end(), [&](const auto& h) { return h.id == v.id(); });
  ASSERT_NE(mine, held.end());
  // w2 names w0's fork: refused, and w1 still holds the value for w0.
  try {
    w(2).rpc_sync<void>(
        "w1",
        "tide.rref.delete",
        v.id().worker,
        v.id().local,
        mine->fork.worker,
        mine->fork.local);
    FAIL() << "expected the delete to be refused";
  } catch (const RemoteError& e) {
    EXPECT_THAT(e.what(), HasSubstr("which worker 0 holds"));
  }
  auto owned = w(1).rrefs().owned;
  auto entry = std::find_if(owned.begin(), owned.end(), [&](const auto& o) {
    return o.id == v.id();
  });
  ASSERT_NE(entry, owned.end());
  EXPECT_EQ(entry->users.size(), 1u);
  EXPECT_EQ(v.to_here(), 5);
}

TEST_F(RRefTest, AFunctionMakesLocalRRefsOnTheAgentServingIt) {
  start(3);
  for (int i = 1; i < 3; ++i) {
    // Several agents in this process and no process agent: RRef<T>(value)
    // inside a function belongs to the agent running it.
    w(i).register_function(
        "make_local", [](int64_t v) { return RRef<int64_t>(v * 2); });
  }
  {
    RRef<int64_t> r = w(0).rpc_sync<RRef<int64_t>>("w2", "make_local", 21);
    EXPECT_EQ(r.owner_name(), "w2");
    EXPECT_EQ(r.to_here(), 42);
    EXPECT_EQ(w(0).rpc_sync<int64_t>("w1", "rref_value", r), 42);
  }
  EXPECT_THROW(current_agent(), InvalidArgument);
  expect_all_released();
}

TEST_F(RRefTest, AControlMessageThatTimesOutIsRetriedAndItsRepeatIsHarmless) {
  // w1 has one worker thread, which the test blocks: w2's fork request for
  // an RRef it receives times out (3 s) and is sent again; once w1 is
  // free, both the first request and its retry run there. (The timeout is
  // every call's, the rendezvous' too: 3 s leaves those room on a loaded
  // machine.)
  start(3, RpcBackendOptions{.num_worker_threads = 1, .rpc_timeout = 3000ms});
  std::promise<void> unblock;
  std::shared_future<void> unblocked = unblock.get_future().share();
  w(1).register_function("block", [unblocked] { unblocked.wait(); });
  {
    RRef<int64_t> r = w(0).remote<int64_t>("w1", "rref_add", 40, 2);
    ASSERT_EQ(r.to_here(), 42);
    Future<void> blocking = w(0).rpc_async<void>("w1", "block", 30000ms);
    Future<int64_t> passed =
        w(0).rpc_async<int64_t>("w2", "rref_value", 30000ms, r);
    ASSERT_TRUE(
        test::eventually([&] { return w(2).rrefs().control_retries > 0; }, 20s))
        << "w2 never retried its fork request";
    unblock.set_value();
    blocking.wait(10s);
    EXPECT_EQ(passed.wait(20s), 42);
    EXPECT_GE(w(2).rrefs().control_retries, 1u);
  }
  expect_all_released();
}

TEST_F(RRefTest, AnRRefOfAnotherTypeIsRefusedNamingBoth) {
  start(2);
  RRef<int64_t> r = w(0).remote<int64_t>("w1", "rref_add", 1, 1);
  w(1).register_function(
      "want_string", [](RRef<std::string> s) { return s.is_owner(); });
  EXPECT_THAT(
      [&] { w(0).rpc_sync<bool>("w1", "want_string", r); },
      testing::ThrowsMessage<RemoteError>(HasSubstr("RRef<std::")));
}

TEST_F(RRefTest, ShutdownDeletesTheRRefsStillHeld) {
  start(3);
  // Held by the test and by w2 at shutdown: TearDown's graceful shutdown
  // deletes them, and fail_on_rref_leak would throw otherwise.
  RRef<int64_t> r = w(0).remote<int64_t>("w1", "rref_add", 3, 4);
  w(0).rpc_sync<void>("w2", "keep", r);
  auto report = w(1).rrefs();
  ASSERT_EQ(report.owned.size(), 1u);
  EXPECT_EQ(report.owned[0].users.size(), 2u) << report.str();
  kept_.clear();
  std::vector<std::future<void>> stopping;
  for (auto& a : agents_) {
    stopping.push_back(
        std::async(std::launch::async, [&a] { a->shutdown(true); }));
  }
  for (auto& s : stopping) {
    EXPECT_NO_THROW(s.get());
  }
  EXPECT_THROW(r.to_here(), NetworkError);  // the agent is gone
}

// Owner and user deaths, with a child process of this binary (the
// TIDE_RREF_TEST_CHILD branch at the end of this file).
class RRefDeathTest : public RRefTest {
 protected:
  std::unique_ptr<test::Subprocess> child(const std::string& role) {
    return std::make_unique<test::Subprocess>(
        std::vector<std::string>{"/proc/self/exe"},
        test::SubprocessOptions{
            .env = {
                {"TIDE_RREF_TEST_CHILD",
                 std::to_string(server_->port()) + ":" + role}}});
  }

  // Agents 0 and 2 here; 1 is the child.
  void start_around_child() {
    std::vector<std::future<std::unique_ptr<RpcAgent>>> starting;
    for (int r : {0, 2}) {
      starting.push_back(std::async(std::launch::async, [&, r] {
        return std::make_unique<RpcAgent>(
            "w" + std::to_string(r), r, 3, RpcBackendOptions{}, client());
      }));
    }
    for (auto& s : starting) {
      agents_.push_back(s.get());
    }
    RpcAgent* third = agents_[1].get();
    third->register_function("keep_counter", [this](RRef<Counter> r) {
      std::lock_guard lock(kept_mutex_);
      kept_counter_ = r;
    });
    (void)third;
  }

  void TearDown() override {
    release_hung();
    kept_counter_.reset();
    for (auto& a : agents_) {
      a->shutdown(false);
    }
  }

  std::optional<RRef<Counter>> kept_counter_;
};

TEST_F(RRefDeathTest, AKilledOwnerFailsEveryUseOfItsRRefsAtOnce) {
  auto owner = child("owner");
  start_around_child();
  ASSERT_EQ(owner->read_line(30s), "ready");
  RpcAgent& me = *agents_[0];
  RRef<Counter> c = me.remote<Counter>("w1", "rref_make_counter", 1);
  ASSERT_EQ(c.rpc_sync().call<int64_t>("add", 1), 2);
  me.rpc_sync<void>("w2", "keep_counter", c);  // a second user
  RRef<int64_t> never = me.remote<int64_t>("w1", "rref_hang");
  Future<int64_t> fetch = never.to_here_async(60s);
  Future<int64_t> proxy = c.rpc_async(60s).call<int64_t>("hang");
  auto killed = std::chrono::steady_clock::now();
  owner->signal(SIGKILL);
  for (auto* f : {&fetch, &proxy}) {
    try {
      f->wait(30s);
      FAIL() << "expected OwnerLostError";
    } catch (const OwnerLostError& e) {
      EXPECT_THAT(e.what(), HasSubstr("'w1'"));
    }
  }
  auto took = std::chrono::steady_clock::now() - killed;
  EXPECT_LT(took, 5s) << "the rpc timeout is 60 s";
  std::printf(
      "pending RRef uses failed %lld ms after the owner's SIGKILL\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  EXPECT_THROW(c.to_here(), OwnerLostError);
  EXPECT_THROW(c.rpc_sync().call<int64_t>("get"), OwnerLostError);
  EXPECT_THROW(me.rpc_sync<void>("w2", "keep_counter", c), OwnerLostError);
  // The other user hears it too.
  std::optional<RRef<Counter>> kept;
  {
    std::lock_guard lock(kept_mutex_);
    kept = kept_counter_;
  }
  ASSERT_TRUE(kept.has_value());
  EXPECT_TRUE(test::eventually(
      [&] {
        try {
          kept->to_here(10s);
        } catch (const OwnerLostError&) {
          return true;
        } catch (const NetworkError&) {
          // Not yet told: this use's connection broke first.
        }
        return false;
      },
      10s));
}

TEST_F(RRefDeathTest, AKilledUsersForksAreDroppedByTheOwner) {
  auto user = child("user");
  start_around_child();
  ASSERT_EQ(user->read_line(30s), "ready");
  RpcAgent& me = *agents_[0];
  RRef<Counter> mine(me, Counter{5});
  RRef<Counter> made = me.remote<Counter>("w0", "rref_make_counter", 9);
  me.rpc_sync<void>("w1", "keep_counter", mine);
  me.rpc_sync<void>("w1", "keep_counter", made);
  ASSERT_EQ(me.rrefs().owned.size(), 2u) << me.rrefs().str();
  user->signal(SIGKILL);
  auto killed = std::chrono::steady_clock::now();
  // The values stay (this worker holds them), without the dead user's
  // forks.
  auto forks_left = [&] {
    size_t n = 0;
    for (const auto& o : me.rrefs().owned) {
      n += o.users.size();
    }
    return n;
  };
  ASSERT_TRUE(test::eventually([&] { return forks_left() == 0; }, 10s))
      << me.rrefs().str();
  std::printf(
      "the owner dropped the dead user's forks %lld ms after its SIGKILL\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(
              std::chrono::steady_clock::now() - killed)
              .count()));
  // Its own handles still work; without them, nothing is left.
  EXPECT_EQ(mine.local_value()->total, 5);
  EXPECT_EQ(made.to_here().total, 9);
  mine = RRef<Counter>(me, Counter{0});
  made = mine;
  EXPECT_EQ(me.rrefs().owned.size(), 1u);
}

}  // namespace
}  // namespace tide::rpc

namespace tide::test {

// The child of RRefDeathTest: worker w1 of 3. "owner" makes values for the
// parent; "user" keeps the RRefs it is sent. Prints "ready", then waits to
// be killed.
void run_rref_child_if_requested() {
  const char* spec = std::getenv("TIDE_RREF_TEST_CHILD");
  if (spec == nullptr) {
    return;
  }
  using namespace std::chrono_literals;
  std::string s(spec);
  auto colon = s.find(':');
  auto store = std::make_shared<store::TcpStore>(store::TcpStoreOptions{
      .host = "127.0.0.1",
      .port = static_cast<uint16_t>(std::atoi(s.substr(0, colon).c_str())),
      .timeout = 30s});
  rpc::RpcAgent agent("w1", 1, 3, {}, store);
  static std::mutex mutex;
  static std::vector<rpc::RRef<rpc::Counter>> kept;
  agent.register_function("keep_counter", [](rpc::RRef<rpc::Counter> r) {
    std::lock_guard lock(mutex);
    kept.push_back(r);
  });
  std::printf("ready\n");
  std::fflush(stdout);
  ::pause();
  std::_Exit(0);
}

}  // namespace tide::test
