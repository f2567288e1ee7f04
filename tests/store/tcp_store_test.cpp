// The TCP store server under hostile and unusual clients, authentication,
// both dialects, many connections, and the tide-store program.
#include "tide/store/tcp_store.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/common/fd_limit.h"
#include "tide/metrics/registry.h"

#include "store/wire.h"
#include "support/eventually.h"
#include "support/peak_memory.h"
#include "support/raw_client.h"
#include "support/stranger_flood.h"
#include "support/subprocess.h"

namespace tide::store {
namespace {

using namespace std::chrono_literals;
using test::RawClient;
using wire::Op;
using wire::Writer;

std::string encode(Dialect d, Op op) {
  std::string out;
  Writer(out).u8(*wire::op_code(op, d));
  return out;
}

std::string legacy_set(std::string_view key, std::string_view value) {
  std::string out = encode(Dialect::kLegacy, Op::kSet);
  Writer(out).str(key).str(value);
  return out;
}

std::string legacy_get(std::string_view key) {
  std::string out = encode(Dialect::kLegacy, Op::kGet);
  Writer(out).str(key);
  return out;
}

int64_t as_i64(const std::string& bytes) {
  return wire::load<int64_t>(bytes.data());
}

std::string modern_hello() {
  std::string out = encode(Dialect::kModern, Op::kValidate);
  Writer(out).u32(wire::kValidateMagic);
  return out;
}

std::string modern_get(std::string_view key) {
  std::string out = encode(Dialect::kModern, Op::kGet);
  Writer(out).str(key);
  return out;
}

std::string modern_multi_get(const std::vector<std::string>& keys) {
  std::string out = encode(Dialect::kModern, Op::kMultiGet);
  Writer w(out);
  w.u64(keys.size());
  for (const auto& k : keys) {
    w.str(k);
  }
  return out;
}

// One value of a reply: its length, then its bytes.
std::string read_value(RawClient& raw) {
  auto len = static_cast<size_t>(as_i64(raw.read(8)));
  return raw.read(len);
}

// test::PeakMemory: the server runs in this process. (Allocator slack,
// ASan's quarantine and TSan's shadow inflate it: bounds leave room.)
using test::PeakMemory;

constexpr uint64_t kMiB = 1024 * 1024;

class TcpStoreServerTest : public ::testing::Test {
 protected:
  void start(TcpStoreServerOptions options = {}) {
    server_ = TcpStoreServer::start(std::move(options));
  }
  std::unique_ptr<TcpStore> client(TcpStoreOptions options = {}) {
    options.port = server_->port();
    if (options.timeout == Store::kDefaultTimeout) {
      options.timeout = 10s;
    }
    return std::make_unique<TcpStore>(std::move(options));
  }
  // A client of the legacy dialect still gets served, promptly.
  void expect_served() {
    auto c = client();
    c->set("probe", "ok");
    EXPECT_EQ(c->get("probe"), "ok");
  }

  std::unique_ptr<TcpStoreServer> server_;
};

TEST_F(TcpStoreServerTest, GetOfAMissingKeyAnswersEmptyAndKeepsTheConnection) {
  start();
  RawClient raw(server_->port());
  ASSERT_TRUE(raw.send(legacy_get("/missing")));
  EXPECT_EQ(as_i64(raw.read(8)), 0);  // empty value
  ASSERT_TRUE(raw.send(legacy_set("/k", "v") + legacy_get("/k")));
  EXPECT_EQ(raw.read(9).substr(8), "v");
}

TEST_F(TcpStoreServerTest, HostileClientsAreDisconnectedAndNothingIsLost) {
  start();
  auto keeper = client();
  keeper->set("precious", "data");
  keeper->add("counter", 41);

  {  // Unknown command.
    RawClient raw(server_->port());
    raw.send("\x63");
    EXPECT_TRUE(raw.closed_within(5s));
  }
  {  // A port scanner speaking HTTP.
    RawClient raw(server_->port());
    raw.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_TRUE(raw.closed_within(5s));
  }
  {  // An absurd key length: refused from the length alone.
    RawClient raw(server_->port());
    std::string bytes = encode(Dialect::kLegacy, Op::kSet);
    Writer(bytes).u64(uint64_t{1} << 62);
    raw.send(bytes);
    EXPECT_TRUE(raw.closed_within(5s));
  }
  {  // An absurd key count.
    RawClient raw(server_->port());
    std::string bytes = encode(Dialect::kLegacy, Op::kWait);
    Writer(bytes).u64(uint64_t{1} << 40);
    raw.send(bytes);
    EXPECT_TRUE(raw.closed_within(5s));
  }
  {  // A value over the limit.
    RawClient raw(server_->port());
    std::string bytes = encode(Dialect::kLegacy, Op::kSet);
    Writer(bytes).str("/big").u64(StoreLimits{}.max_value_bytes + 1);
    raw.send(bytes);
    EXPECT_TRUE(raw.closed_within(5s));
  }
  {  // A truncated frame, then the client vanishes.
    RawClient raw(server_->port());
    raw.send(legacy_set("/precious", "overwritten").substr(0, 12));
  }
  {  // Connect and leave at once; then random bytes.
    RawClient a(server_->port());
    RawClient b(server_->port());
    b.send(std::string("\x00\xff\x13\x37\xde\xad\xbe\xef\x7f\x01", 10));
    EXPECT_TRUE(b.closed_within(5s));
  }
  expect_served();
  EXPECT_EQ(keeper->get("precious"), "data");
  EXPECT_EQ(keeper->add("counter", 1), 42);
}

TEST_F(
    TcpStoreServerTest,
    AHalfSentRequestStallsNoOneAndIsDroppedAfterTheTimeout) {
  start({.request_timeout = 300ms});
  RawClient slow(server_->port());
  ASSERT_TRUE(slow.send(legacy_set("/slow", "value").substr(0, 5)));
  // torch 1.13's server blocks everyone here; this one serves others at once.
  auto c = client();
  for (int i = 0; i < 100; ++i) {
    c->add("busy", 1);
  }
  EXPECT_EQ(c->get("busy"), "100");
  EXPECT_TRUE(slow.closed_within(5s));
  EXPECT_FALSE(c->check({"slow"}));
}

TEST_F(TcpStoreServerTest, AClientTricklingOneByteAtATimeIsDisconnected) {
  start({.request_timeout = 300ms});
  RawClient slow(server_->port());
  std::string request = legacy_set("/trickle", std::string(64, 'x'));
  std::atomic<bool> refused{false};
  std::jthread trickler([&] {
    for (char ch : request) {
      if (!slow.send(std::string_view(&ch, 1))) {
        refused = true;
        return;
      }
      // Pacing is the scenario under test, not synchronisation.
      std::this_thread::sleep_for(20ms);
    }
  });
  EXPECT_TRUE(slow.closed_within(5s));
  trickler.join();
  expect_served();
  EXPECT_FALSE(client()->check({"trickle"}));
}

TEST_F(TcpStoreServerTest, AddOnANonIntegerClosesOnlyThatConnection) {
  start();
  auto c = client();
  c->set("text", "abc");
  EXPECT_THROW(c->add("text", 1), NetworkError);
  // The same client reconnects for its next call.
  EXPECT_EQ(c->get("text"), "abc");
  EXPECT_EQ(c->add("number", 5), 5);
}

TEST_F(TcpStoreServerTest, AnAddWaitOnANonIntegerClosesOnlyThatConnection) {
  start();
  auto c = client({.dialect = Dialect::kModern});
  c->set("text", "abc");
  EXPECT_THROW(c->add_wait("text", 1, 2, "outcome"), NetworkError);
  EXPECT_EQ(c->get("text"), "abc");
  EXPECT_FALSE(c->check({"outcome"}));
}

TEST_F(TcpStoreServerTest, AnAddWaitPastItsTimeoutThrowsAndItsAddStays) {
  start();
  auto c = client({.dialect = Dialect::kModern});
  c->set_timeout(200ms);
  EXPECT_THROW(c->add_wait("votes", 1, 2, "done"), TimeoutError);
  c->set_timeout(10s);
  // The waiter left with its connection: a later outcome wakes nobody,
  // and the next vote completes the count.
  c->set("done", "late");
  auto t = client({.dialect = Dialect::kModern})->add_wait("votes", 1, 2, "other");
  EXPECT_EQ(t.count, 2);
  EXPECT_EQ(t.value, "");
  expect_served();
}

TEST_F(TcpStoreServerTest, AFullStoreRefusesWritesAndKeepsWhatItHolds) {
  start({.limits = {.max_total_bytes = 1000}});
  auto c = client();
  c->set("first", std::string(600, 'a'));
  // SET has no reply in torch's protocol: the refusal shows as a closed
  // connection on the client's next call.
  c->set("second", std::string(600, 'b'));
  EXPECT_THROW(c->num_keys(), NetworkError);
  EXPECT_EQ(c->get("first"), std::string(600, 'a'));
  EXPECT_FALSE(c->check({"second"}));
}

TEST_F(TcpStoreServerTest, AMultiGetOfOneBigValueManyTimesIsRefusedUnbuilt) {
  start();  // Default limits: 8 MiB values, 64 MiB of pending replies.
  const std::string big(StoreLimits{}.max_value_bytes, 'b');
  auto keeper = client();
  keeper->set("big", big);
  ASSERT_TRUE(keeper->check({"big"}));  // SET has no reply: a round trip.
  PeakMemory memory;
  RawClient raw(server_->port());
  // 48 x 8 MiB: a 384 MiB reply asked for with a 600-byte request.
  ASSERT_TRUE(raw.send(
      modern_hello() + modern_multi_get(std::vector<std::string>(48, "/big"))));
  EXPECT_TRUE(raw.closed_within(5s));
  // Nothing was built (the whole reply built at once was +776 MB).
  EXPECT_LT(memory.growth(), 32 * kMiB);
  expect_served();
  EXPECT_TRUE(keeper->get("big") == big);  // (Not printed: 8 MiB.)
}

TEST_F(TcpStoreServerTest, PipelinedGetsAreAnsweredOnlyAsFastAsTheyAreRead) {
  constexpr uint64_t kBound = kMiB;
  start({.limits = {.max_pending_reply_bytes = kBound}});
  // One value as big as the bound: served, but one reply at a time.
  const std::string value(kBound, 'v');
  auto keeper = client();
  keeper->set("big", value);
  ASSERT_TRUE(keeper->check({"big"}));  // SET has no reply: a round trip.
  PeakMemory memory;
  RawClient raw(server_->port());
  // 200 GETs in one write (2.6 KB, one read): 200 MiB of replies.
  std::string gets = modern_hello();
  for (int i = 0; i < 200; ++i) {
    gets += modern_get("/big");
  }
  ASSERT_TRUE(raw.send(gets));
  // The first reply has left the server, which read all the GETs at once.
  EXPECT_EQ(as_i64(raw.read(8)), static_cast<int64_t>(kBound));
  // The client reads no further; others are served meanwhile.
  expect_served();
  // About the bound plus one value is held (every reply built at once was
  // +398 MB).
  EXPECT_LT(memory.growth(), 32 * kMiB);
  EXPECT_TRUE(keeper->get("big") == value);
}

TEST_F(TcpStoreServerTest, AClientReadingSlowlyGetsEveryPipelinedReplyInOrder) {
  constexpr uint64_t kBound = kMiB;
  start(
      {.limits = {.max_pending_reply_bytes = kBound},
       .request_timeout = 200ms});
  // Eight distinct 256 KiB values: several replies fit the bound at once.
  auto keeper = client();
  std::vector<std::string> values;
  for (int k = 0; k < 8; ++k) {
    values.push_back(std::string(256 * 1024, static_cast<char>('a' + k)));
    keeper->set("v" + std::to_string(k), values.back());
  }
  ASSERT_TRUE(keeper->check({"v7"}));  // SET has no reply: a round trip.
  RawClient raw(server_->port());
  // 300 requests (4.2 KB) in one write, each a GET or a MULTI_GET of three
  // keys (under the bound): 90 MiB of replies.
  std::string requests = modern_hello();
  std::vector<int> expected;
  for (int i = 0; i < 300; ++i) {
    if (i % 10 == 9) {
      std::vector<std::string> keys;
      for (int j = 0; j < 3; ++j) {
        keys.push_back("/v" + std::to_string((i + j) % 8));
        expected.push_back((i + j) % 8);
      }
      requests += modern_multi_get(keys);
    } else {
      requests += modern_get("/v" + std::to_string(i % 8));
      expected.push_back(i % 8);
    }
  }
  ASSERT_TRUE(raw.send(requests));
  for (size_t i = 0; i < expected.size(); ++i) {
    if (i == expected.size() / 2) {
      // A reader slower than request_timeout is the scenario under test (its
      // requests wait on the server, not on it), not synchronisation.
      std::this_thread::sleep_for(500ms);
      expect_served();
    }
    ASSERT_TRUE(read_value(raw) == values[expected[i]]) << "reply " << i;
  }
  // Nothing more: the server answered each request once.
  std::string ping = encode(Dialect::kModern, Op::kPing);
  Writer(ping).u32(9);
  ASSERT_TRUE(raw.send(ping));
  EXPECT_EQ(wire::load<uint32_t>(raw.read(4).data()), 9u);
}

TEST_F(
    TcpStoreServerTest, ARequestCompletedWhileRepliesAreUnreadIsNotTimedOut) {
  // request_timeout also runs on the second request's first five bytes
  // until the rest is sent, one round trip later: 1 s leaves that round
  // trip room on a loaded machine.
  start({.limits = {.max_pending_reply_bytes = kMiB}, .request_timeout = 1s});
  // A reply far over the bound and the kernel's buffers: it stays pending.
  // Stored in pieces, each quick to send whatever the build (TSan).
  const std::string value(StoreLimits{}.max_value_bytes, 'h');
  auto keeper = client({.dialect = Dialect::kModern});
  for (size_t at = 0; at < value.size(); at += 256 * 1024) {
    keeper->append("huge", std::string_view(value).substr(at, 256 * 1024));
  }
  ASSERT_TRUE(keeper->check({"huge"}));  // APPEND has no reply: a round trip.
  RawClient raw(server_->port());
  std::string second = modern_get("/huge");
  ASSERT_TRUE(
      raw.send(modern_hello() + modern_get("/huge") + second.substr(0, 5)));
  // The server has answered the first GET and holds the second's start.
  EXPECT_EQ(as_i64(raw.read(8)), static_cast<int64_t>(value.size()));
  ASSERT_TRUE(raw.send(second.substr(5)));
  // A reader slower than request_timeout is the scenario under test: the
  // second request arrived whole, so its clock must not run.
  std::this_thread::sleep_for(1500ms);
  EXPECT_TRUE(raw.read(value.size()) == value);
  EXPECT_TRUE(read_value(raw) == value);
}

TEST_F(TcpStoreServerTest, ThousandsOfConcurrentClientsAreServedAndWoken) {
  constexpr int kClients = 2000;
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < 3 * kClients + 100) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 3 * kClients + 100);
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  ASSERT_GE(lim.rlim_cur, 2 * kClients + 100) << "RLIMIT_NOFILE too low";
  start();
  std::vector<std::unique_ptr<RawClient>> raws;
  for (int i = 0; i < kClients; ++i) {
    raws.push_back(std::make_unique<RawClient>(server_->port()));
  }
  // Every client sets its own key, then waits for "go".
  std::string wait_go = encode(Dialect::kLegacy, Op::kWait);
  Writer(wait_go).u64(1).str("/go");
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(
        raws[i]->send(legacy_set("/c" + std::to_string(i), "x") + wait_go));
  }
  auto c = client();
  std::vector<std::string> keys;
  for (int i = 0; i < kClients; ++i) {
    keys.push_back("c" + std::to_string(i));
  }
  // 2000 connections' requests: far more than a round trip on a loaded
  // machine.
  c->wait(keys, 60s);
  EXPECT_EQ(c->num_keys(), kClients);
  c->set("go", "1");
  for (auto& raw : raws) {
    EXPECT_EQ(raw->read(1, 10s)[0], static_cast<char>(wire::kStopWaiting));
  }
}

TEST_F(TcpStoreServerTest, ModernClientsHandshakeAndCanCancelAWait) {
  start();
  RawClient raw(server_->port());
  std::string hello = encode(Dialect::kModern, Op::kValidate);
  Writer(hello).u32(wire::kValidateMagic);
  std::string wait = encode(Dialect::kModern, Op::kWait);
  Writer(wait).u64(1).str("/later");
  ASSERT_TRUE(
      raw.send(hello + wait + encode(Dialect::kModern, Op::kCancelWait)));
  EXPECT_EQ(raw.read(1)[0], static_cast<char>(wire::kWaitCanceled));
  // A set after the cancel wakes nobody: the next bytes are PING's reply.
  auto c = client({.dialect = Dialect::kModern});
  c->set("later", "1");
  std::string ping = encode(Dialect::kModern, Op::kPing);
  Writer(ping).u32(77);
  ASSERT_TRUE(raw.send(ping));
  EXPECT_EQ(wire::load<uint32_t>(raw.read(4).data()), 77u);
}

TEST_F(
    TcpStoreServerTest, WaitsCancelledOverAndOverLeaveOnlyTheLiveOnesToWake) {
  // The keep-alive pattern: many clients wait for one key and cancel, again
  // and again; then some wait for real. Only those are woken, once each, and
  // no cancelled client gets a stray byte.
  start();
  constexpr int kClients = 40;
  constexpr int kLive = 10;
  std::string wait = encode(Dialect::kModern, Op::kWait);
  Writer(wait).u64(1).str("/next");
  std::string cancel = encode(Dialect::kModern, Op::kCancelWait);
  std::vector<std::unique_ptr<RawClient>> raws;
  for (int i = 0; i < kClients; ++i) {
    raws.push_back(std::make_unique<RawClient>(server_->port()));
    ASSERT_TRUE(raws.back()->send(modern_hello()));
  }
  for (int round = 0; round < 5; ++round) {
    for (auto& raw : raws) {
      ASSERT_TRUE(raw->send(wait));
    }
    for (auto& raw : raws) {
      ASSERT_TRUE(raw->send(cancel));
      EXPECT_EQ(raw->read(1)[0], static_cast<char>(wire::kWaitCanceled));
    }
  }
  for (int i = 0; i < kLive; ++i) {
    ASSERT_TRUE(raws[i]->send(wait));
  }
  auto c = client({.dialect = Dialect::kModern});
  c->set("next", "1");
  std::string ping = encode(Dialect::kModern, Op::kPing);
  Writer(ping).u32(5);
  for (int i = 0; i < kClients; ++i) {
    if (i < kLive) {
      EXPECT_EQ(raws[i]->read(1)[0], static_cast<char>(wire::kStopWaiting));
    }
    ASSERT_TRUE(raws[i]->send(ping));
    EXPECT_EQ(wire::load<uint32_t>(raws[i]->read(4).data()), 5u) << i;
  }
}

// Client sockets to `port` in TIME_WAIT: each is a connection this machine
// closed (a reconnect leaves one).
int closed_connections_to(uint16_t port) {
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line);
  int n = 0;
  char want[8];
  std::snprintf(want, sizeof want, ":%04X", port);
  while (std::getline(f, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (remote.size() >= 5 && remote.substr(remote.size() - 5) == want &&
        state == "06") {
      ++n;
    }
  }
  return n;
}

TEST_F(
    TcpStoreServerTest, AWaitThatTimesOutKeepsItsConnectionInTheModernDialect) {
  start();
  // Counted from here: an earlier server on the same port may have left
  // some, which can only expire.
  int before = closed_connections_to(server_->port());
  auto modern = client({.dialect = Dialect::kModern});
  for (int i = 0; i < 3; ++i) {
    EXPECT_THROW(modern->wait({"never"}, 20ms), TimeoutError);
  }
  modern->set("after", "1");
  EXPECT_EQ(modern->get("after"), "1");
  EXPECT_LE(closed_connections_to(server_->port()), before);
  // A wait met just as it times out still counts as met or as a timeout,
  // and leaves the connection usable either way.
  for (int i = 0; i < 20; ++i) {
    std::string key = "race" + std::to_string(i);
    auto setter_store = client();
    std::thread setter([&, key] { setter_store->set(key, "1"); });
    try {
      modern->wait({key}, 1ms);
    } catch (const TimeoutError&) {
    }
    setter.join();
    EXPECT_EQ(modern->get(key), "1");
  }
  // torch 1.13's servers cannot cancel: there the connection is dropped.
  auto legacy = client({.dialect = Dialect::kLegacy});
  int modern_closed = closed_connections_to(server_->port());
  EXPECT_THROW(legacy->wait({"never"}, 20ms), TimeoutError);
  EXPECT_EQ(legacy->get("after"), "1");
  EXPECT_GT(closed_connections_to(server_->port()), modern_closed);
}

TEST_F(TcpStoreServerTest, LegacyAndModernClientsShareOneServer) {
  start();
  auto legacy = client({.dialect = Dialect::kLegacy});
  auto modern = client({.dialect = Dialect::kModern});
  legacy->set("from_legacy", "1");
  modern->set("from_modern", "2");
  EXPECT_EQ(modern->get("from_legacy"), "1");
  EXPECT_EQ(legacy->get("from_modern"), "2");
  modern->ping();
  EXPECT_THROW(legacy->ping(), InvalidArgument);
}

TEST_F(TcpStoreServerTest, QueuesPushPopAndCountInTheModernDialect) {
  start();
  auto c = client({.dialect = Dialect::kModern});
  EXPECT_EQ(c->queue_len("q"), 0);
  EXPECT_EQ(c->queue_pop("q"), std::nullopt);
  c->queue_push("q", "a");
  c->queue_push("q", "b");
  EXPECT_EQ(c->queue_len("q"), 2);
  EXPECT_TRUE(c->check({"q"}));
  EXPECT_EQ(c->queue_pop("q"), "a");
  EXPECT_EQ(c->queue_pop("q"), "b");
  EXPECT_FALSE(c->check({"q"}));
}

// What an agent does between two attempts of its workers: everything
// outside its own prefix goes (keys, counters, queues), its own keys stay,
// a client of the next attempt sees only those, and a stopped server
// answers at once.
TEST_F(TcpStoreServerTest, EraseOutsideAPrefixKeepsOnlyThatPrefix) {
  start();
  auto c = client({.dialect = Dialect::kModern});
  c->set("run/agent", "kept");
  c->set("default_pg/0/rank_0", "stale address");
  c->add("barrier", 2);
  c->queue_push("q", "stale");
  EXPECT_EQ(c->queue_len("q"), 1);  // a reply: the push has been served
  EXPECT_EQ(server_->erase_outside("/run/"), 3u);
  EXPECT_EQ(c->get("run/agent"), "kept");
  EXPECT_FALSE(c->check({"default_pg/0/rank_0"}));
  EXPECT_FALSE(c->check({"q"}));
  EXPECT_EQ(c->add("barrier", 1), 1);  // counted from zero again
  EXPECT_EQ(server_->erase_outside("/run/"), 1u);
  EXPECT_EQ(server_->erase_outside("/run/"), 0u);
  server_->shutdown();
  server_->join();
  EXPECT_EQ(server_->erase_outside("/run/"), 0u);
}

TEST_F(TcpStoreServerTest, WithATokenOnlyClientsThatPresentItGetAnything) {
  start({.token = "s3cret"});
  {
    RawClient raw(server_->port());  // A torch client cannot authenticate.
    raw.send(legacy_set("/intruder", "x"));
    EXPECT_TRUE(raw.closed_within(5s));
  }
  EXPECT_THROW(client({.token = "wrong", .timeout = 2s}), NetworkError);
  EXPECT_THROW(client({.timeout = 2s})->check({"anon"}), NetworkError);
  auto ok = client({.token = "s3cret"});
  ok->set("k", "v");
  EXPECT_EQ(ok->get("k"), "v");
  EXPECT_FALSE(ok->check({"intruder"}));
  auto modern = client({.dialect = Dialect::kModern, .token = "s3cret"});
  EXPECT_EQ(modern->get("k"), "v");
}

TEST_F(
    TcpStoreServerTest, StrangersWithoutTheTokenAreBoundedAndKeepNoClientOut) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "runs the strangers as user nobody: needs root";
  }
  raise_fd_limit();  // the server accepts more than 1,024 connections
  start({.token = "s3cret", .auth_timeout = 60s, .max_unauthenticated = 256});
  // A thousand silent connections and a hundred trickling an AUTH request,
  // reopened as soon as they are closed: more than the server keeps.
  std::string auth;
  Writer(auth).u8(wire::kAuthCode).str("a-guess-that-never-ends");
  auto strangers = test::flood(server_->port(), 1000, 100, auth);
  auto start = std::chrono::steady_clock::now();
  auto ok = client({.token = "s3cret"});
  ok->set("k", "v");
  EXPECT_EQ(ok->get("k"), "v");
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, test::kAdmittedWithin);
  std::printf(
      "a client served in %.1f ms past 1,100 strangers\n",
      std::chrono::duration<double, std::milli>(took).count());
  strangers->close_stdin();
  ASSERT_TRUE(strangers->wait(30s));
}

TEST_F(TcpStoreServerTest, ShutdownFailsAPendingWaitPromptlyWithNetworkError) {
  start();
  auto c = client();
  auto waits = [] {
    return metrics::sample_value("tide_store_requests_total{op=\"wait\"}")
        .value_or(0);
  };
  const double before = waits();
  auto waiting =
      std::async(std::launch::async, [&] { c->wait({"never"}, 60s); });
  // The WAIT must reach the server before it shuts down (a WAIT sent after
  // finds no server and waits to reconnect). The server counts a request
  // once it has handled it: a WAIT counted is a WAIT pending there.
  ASSERT_TRUE(test::eventually([&] { return waits() != before; }))
      << "the WAIT never reached the server";
  server_->shutdown();
  ASSERT_EQ(waiting.wait_for(10s), std::future_status::ready);
  EXPECT_THROW(waiting.get(), NetworkError);
}

TEST_F(TcpStoreServerTest, ClientWaitsForAServerThatStartsLater) {
  // Reserve a port by starting and stopping a server.
  uint16_t port = 0;
  {
    auto probe = TcpStoreServer::start({});
    port = probe->port();
  }
  auto later = std::async(std::launch::async, [port] {
    TcpStore c({.port = port, .timeout = 10s});
    c.set("k", "v");
    return c.get("k");
  });
  auto server = TcpStoreServer::start({.port = port});
  ASSERT_EQ(later.wait_for(15s), std::future_status::ready);
  EXPECT_EQ(later.get(), "v");
}

TEST_F(TcpStoreServerTest, ConnectingToNothingTimesOutNamingTheAddress) {
  uint16_t port = 0;
  {
    auto probe = TcpStoreServer::start({});
    port = probe->port();
  }
  try {
    TcpStore c({.port = port, .timeout = 200ms});
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(
        std::string(e.what()).find(std::to_string(port)), std::string::npos);
  }
}

TEST_F(TcpStoreServerTest, BindingABusyPortThrowsNetworkErrorNamingIt) {
  start();
  try {
    TcpStoreServer::start({.port = server_->port()});
    FAIL() << "expected NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_NE(
        std::string(e.what()).find(std::to_string(server_->port())),
        std::string::npos)
        << e.what();
  }
}

TEST(TideStoreAppTest, ServesUntilSigtermThenExitsZero) {
  test::Subprocess app({TIDE_STORE_BIN, "--port", "0", "--host", "127.0.0.1"});
  auto line = app.read_line(10s);
  ASSERT_TRUE(line.has_value());
  auto colon = line->rfind(':');
  ASSERT_NE(colon, std::string::npos) << *line;
  auto port = static_cast<uint16_t>(std::stoi(line->substr(colon + 1)));
  {
    TcpStore c({.port = port, .timeout = 10s});
    c.set("k", "v");
    EXPECT_EQ(c.get("k"), "v");
  }
  app.signal(SIGTERM);
  auto status = app.wait(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

// A job's store holds a socket per client: tide-store raises its soft
// descriptor limit to the hard one (often 1024 against 500k+), so a store
// started with a soft limit of 256 serves 600 clients.
TEST(
    TideStoreAppTest,
    ServesMoreClientsThanTheSoftDescriptorLimitItStartedWith) {
  constexpr int kClients = 600;
  rlimit lim{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < 2 * kClients + 100) {
    GTEST_SKIP() << "this test needs " << 2 * kClients + 100 << " descriptors";
  }
  std::string hard = lim.rlim_max == RLIM_INFINITY
                         ? "unlimited"
                         : std::to_string(lim.rlim_max);
  test::Subprocess app(
      {"/usr/bin/prlimit",
       "--nofile=256:" + hard,
       TIDE_STORE_BIN,
       "--port",
       "0",
       "--host",
       "127.0.0.1"});
  auto line = app.read_line(10s);
  ASSERT_TRUE(line.has_value());
  auto port =
      static_cast<uint16_t>(std::stoi(line->substr(line->rfind(':') + 1)));
  std::vector<std::unique_ptr<RawClient>> raws;
  for (int i = 0; i < kClients; ++i) {
    raws.push_back(std::make_unique<RawClient>(port));
    ASSERT_TRUE(raws.back()->send(legacy_set("/c" + std::to_string(i), "x")));
  }
  TcpStore c({.port = port, .timeout = 10s});
  std::vector<std::string> keys;
  for (int i = 0; i < kClients; ++i) {
    keys.push_back("c" + std::to_string(i));
  }
  c.wait(keys, 10s);
  EXPECT_EQ(c.num_keys(), kClients);
  app.signal(SIGTERM);
  EXPECT_TRUE(app.wait(10s).has_value());
}

// A bad command line: the usage, then a line naming the problem, and exit
// status 2, as tiderun's (CLI11's own codes, 104-109, and its raw text
// before).
TEST(TideStoreAppTest, RejectsABadFlagWithAClearErrorAndStatusTwo) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--port", "not-a-number"}, "--port"},
      {{"--port=abc"}, "--port"},
      {{"--bogus"}, "--bogus"},
      {{"--request-timeout", "-1"}, "--request-timeout"},
  };
  for (const auto& [args, names] : cases) {
    std::vector<std::string> argv = {TIDE_STORE_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    test::Subprocess app(argv, {.merge_stderr = true});
    std::string out = app.read_all(10s);
    auto status = app.wait(10s);
    ASSERT_TRUE(status.has_value());
    ASSERT_TRUE(WIFEXITED(*status)) << out;
    EXPECT_EQ(WEXITSTATUS(*status), 2) << args[0] << ": " << out;
    auto error = out.find("\ntide-store: error: ");
    ASSERT_NE(error, std::string::npos) << out;
    EXPECT_NE(out.find(names, error), std::string::npos) << out;
    EXPECT_NE(out.find("Usage: "), std::string::npos) << out;
  }
}

TEST(TideStoreAppTest, PrintsItsVersion) {
  test::Subprocess app({TIDE_STORE_BIN, "--version"});
  std::string out = app.read_all(10s);
  auto status = app.wait(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << out;
  EXPECT_EQ(out, std::string("tide-store ") + TIDE_VERSION + "\n");
}

}  // namespace
}  // namespace tide::store
