// The etcd client against real etcd: one member for the calls, three for
// failover, none for the errors; a canned HTTP server for replies etcd would
// never send.
#include "etcd/etcd_client.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <random>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/etcd/etcd_store.h"

#include "support/etcd.h"
#include "support/raw_client.h"

namespace tide::etcd {
namespace {

using namespace std::chrono_literals;
using test::EtcdCluster;
using ::testing::HasSubstr;

constexpr auto kRequestTimeout = 5s;

// One etcd member for every test of the suite; each test works under its
// own key prefix.
class EtcdClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    shared_cluster = std::make_unique<EtcdCluster>(EtcdCluster::start(1));
  }
  static void TearDownTestSuite() {
    shared_cluster.reset();
  }
  void SetUp() override {
    client_ = std::make_unique<EtcdClient>(
        shared_cluster->endpoints(), kRequestTimeout);
    prefix_ = std::string("/test/") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() +
              "/";
  }
  std::string key(const std::string& name) const {
    return prefix_ + name;
  }

  static std::unique_ptr<EtcdCluster> shared_cluster;
  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;
};

std::unique_ptr<EtcdCluster> EtcdClientTest::shared_cluster;

TEST(EtcdBase64Test, RoundTripsEveryLengthAndByte) {
  std::mt19937 rng(7);
  for (size_t len = 0; len < 70; ++len) {
    std::string bytes(len, '\0');
    for (auto& c : bytes) {
      c = static_cast<char>(rng());
    }
    std::string text = base64_encode(bytes);
    EXPECT_EQ(text.size() % 4, 0u);
    EXPECT_EQ(base64_decode(text), bytes);
  }
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("\xff\xfe"), "//4=");
}

TEST(EtcdBase64Test, DecodeRejectsWhatIsNotPaddedBase64) {
  for (std::string_view bad :
       {"Zm9", "Zm9v!A==", "Zg=a", "Z===", "====", "Zm9v\n", "Zm=v"}) {
    EXPECT_THROW(base64_decode(bad), ProtocolError) << bad;
  }
}

TEST(EtcdPrefixRangeTest, EndsAfterEveryKeyWithThePrefix) {
  EXPECT_EQ(prefix_range_end("jobs/"), "jobs0");
  EXPECT_EQ(prefix_range_end(std::string("a\xff", 2)), "b");
  EXPECT_EQ(prefix_range_end(std::string("\xff\xff", 2)), std::string(1, '\0'));
}

TEST_F(EtcdClientTest, PutThenGetReturnsTheKvWithItsRevisions) {
  std::string binary("a\0b\xff", 4);
  int64_t first = client_->put(key("k"), binary);
  auto kv = client_->get(key("k"));
  ASSERT_TRUE(kv);
  EXPECT_EQ(kv->key, key("k"));
  EXPECT_EQ(kv->value, binary);
  EXPECT_EQ(kv->create_revision, first);
  EXPECT_EQ(kv->mod_revision, first);
  EXPECT_EQ(kv->version, 1);
  EXPECT_EQ(kv->lease, 0);

  int64_t second = client_->put(key("k"), "");
  EXPECT_GT(second, first);
  kv = client_->get(key("k"));
  ASSERT_TRUE(kv);
  EXPECT_EQ(kv->value, "");
  EXPECT_EQ(kv->create_revision, first);
  EXPECT_EQ(kv->mod_revision, second);
  EXPECT_EQ(kv->version, 2);

  EXPECT_FALSE(client_->get(key("absent")));
}

TEST_F(EtcdClientTest, RangeReadsAPrefixInKeyOrder) {
  int64_t rev_b = client_->put(key("dir/b"), "2");
  client_->put(key("dir/a"), "1");
  client_->put(key("dir/c"), "3");
  client_->put(key("dirt"), "not under dir/");

  RangeResult all = client_->range(key("dir/"), {.prefix = true});
  ASSERT_EQ(all.kvs.size(), 3u);
  EXPECT_EQ(all.count, 3);
  EXPECT_EQ(all.kvs[0].key, key("dir/a"));
  EXPECT_EQ(all.kvs[1].value, "2");
  EXPECT_EQ(all.kvs[2].key, key("dir/c"));
  EXPECT_GE(all.revision, rev_b + 2);

  RangeResult counted =
      client_->range(key("dir/"), {.prefix = true, .count_only = true});
  EXPECT_TRUE(counted.kvs.empty());
  EXPECT_EQ(counted.count, 3);

  RangeResult keys =
      client_->range(key("dir/"), {.prefix = true, .keys_only = true});
  ASSERT_EQ(keys.kvs.size(), 3u);
  EXPECT_EQ(keys.kvs[1].key, key("dir/b"));
  EXPECT_EQ(keys.kvs[1].value, "");

  RangeResult limited =
      client_->range(key("dir/"), {.prefix = true, .limit = 2});
  EXPECT_EQ(limited.kvs.size(), 2u);
  EXPECT_EQ(limited.count, 3);

  // Only b was created by then.
  RangeResult early = client_->range(
      key("dir/"), {.prefix = true, .max_create_revision = rev_b});
  ASSERT_EQ(early.kvs.size(), 1u);
  EXPECT_EQ(early.kvs[0].key, key("dir/b"));
  RangeResult late = client_->range(
      key("dir/"), {.prefix = true, .min_create_revision = rev_b + 1});
  EXPECT_EQ(late.kvs.size(), 2u);

  RangeResult explicit_end =
      client_->range(key("dir/a"), {.range_end = key("dir/c")});
  EXPECT_EQ(explicit_end.kvs.size(), 2u);
}

TEST_F(EtcdClientTest, GetManyKeepsOrderAndMarksAbsentKeysAcrossTransactions) {
  // More keys than one transaction holds.
  std::vector<std::string> keys;
  std::vector<std::string> values;
  for (int i = 0; i < 300; ++i) {
    keys.push_back(key("many/" + std::to_string(i)));
    values.push_back("v" + std::to_string(i));
  }
  std::vector<std::string> present(keys.begin(), keys.begin() + 290);
  std::vector<std::string> present_values(values.begin(), values.begin() + 290);
  int64_t written = client_->put_many(present, present_values);
  MultiGetResult r = client_->get_many(keys);
  ASSERT_EQ(r.kvs.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i < 290) {
      ASSERT_TRUE(r.kvs[i]) << i;
      EXPECT_EQ(r.kvs[i]->value, values[i]);
    } else {
      EXPECT_FALSE(r.kvs[i]) << i;
    }
  }
  EXPECT_GE(r.revision, written);
  MultiGetResult names = client_->get_many({keys[5]}, /*keys_only=*/true);
  ASSERT_TRUE(names.kvs[0]);
  EXPECT_EQ(names.kvs[0]->value, "");
  EXPECT_THROW(client_->put_many({"a"}, {}), InvalidArgument);
}

TEST_F(EtcdClientTest, PutIfModRevisionSwapsOnlyAtTheExpectedRevision) {
  // 0: only when absent.
  TxnResult created = client_->put_if_mod_revision(key("cas"), 0, "one");
  EXPECT_TRUE(created.succeeded);
  EXPECT_FALSE(created.current);

  TxnResult again = client_->put_if_mod_revision(key("cas"), 0, "other");
  EXPECT_FALSE(again.succeeded);
  ASSERT_TRUE(again.current);
  EXPECT_EQ(again.current->value, "one");
  EXPECT_EQ(again.current->mod_revision, created.revision);
  EXPECT_EQ(again.revision, created.revision);

  TxnResult swapped =
      client_->put_if_mod_revision(key("cas"), created.revision, "two");
  EXPECT_TRUE(swapped.succeeded);
  EXPECT_GT(swapped.revision, created.revision);

  TxnResult stale =
      client_->put_if_mod_revision(key("cas"), created.revision, "three");
  EXPECT_FALSE(stale.succeeded);
  ASSERT_TRUE(stale.current);
  EXPECT_EQ(stale.current->value, "two");
  EXPECT_EQ(client_->get(key("cas"))->value, "two");
}

TEST_F(EtcdClientTest, PutIfValueSwapsOnlyAMatchingValue) {
  client_->put(key("v"), "old");
  TxnResult swapped = client_->put_if_value(key("v"), "old", "new");
  EXPECT_TRUE(swapped.succeeded);

  TxnResult missed = client_->put_if_value(key("v"), "old", "newer");
  EXPECT_FALSE(missed.succeeded);
  ASSERT_TRUE(missed.current);
  EXPECT_EQ(missed.current->value, "new");
  EXPECT_EQ(missed.current->mod_revision, swapped.revision);

  // An absent key matches nothing, not even "".
  TxnResult absent = client_->put_if_value(key("absent"), "", "x");
  EXPECT_FALSE(absent.succeeded);
  EXPECT_FALSE(absent.current);
  EXPECT_FALSE(client_->get(key("absent")));

  client_->put(key("empty"), "");
  EXPECT_TRUE(client_->put_if_value(key("empty"), "", "filled").succeeded);
}

TEST_F(EtcdClientTest, DeleteRangeCountsWhatItDeleted) {
  client_->put(key("d/1"), "");
  client_->put(key("d/2"), "");
  client_->put(key("d/3"), "");
  EXPECT_EQ(client_->delete_range(key("d/1")), 1);
  EXPECT_EQ(client_->delete_range(key("d/1")), 0);
  EXPECT_EQ(client_->delete_range(key("d/"), {.prefix = true}), 2);
  EXPECT_EQ(client_->range(key("d/"), {.prefix = true}).count, 0);
}

TEST_F(EtcdClientTest, LeaseExpiryDeletesItsKeysAndKeepaliveTellsTheTtl) {
  // etcd raises a TTL of 1 s to its minimum, 2 s.
  int64_t lease = client_->lease_grant(1s);
  EXPECT_NE(lease, 0);
  int64_t rev = client_->put(key("alive"), "yes", lease);
  EXPECT_EQ(client_->get(key("alive"))->lease, lease);
  int64_t ttl = client_->lease_keepalive(lease);
  EXPECT_GE(ttl, 1);
  EXPECT_LE(ttl, 2);

  // No more keepalives: the delete is the next event on the key.
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(client_->watch(key("alive"), rev + 1, 15s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_FALSE(client_->get(key("alive")));
  EXPECT_EQ(client_->lease_keepalive(lease), 0);
  // Putting on an expired lease is an error etcd answers; it names the key.
  try {
    client_->put(key("late"), "x", lease);
    FAIL() << "expected RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_THAT(e.what(), HasSubstr("lease not found"));
    EXPECT_THAT(e.what(), HasSubstr(key("late")));
  }
}

TEST_F(EtcdClientTest, LeaseRevokeDeletesItsKeysAndMayBeRepeated) {
  int64_t lease = client_->lease_grant(60s);
  client_->put(key("owned"), "x", lease);
  client_->lease_revoke(lease);
  EXPECT_FALSE(client_->get(key("owned")));
  EXPECT_EQ(client_->lease_keepalive(lease), 0);
  EXPECT_NO_THROW(client_->lease_revoke(lease));
}

TEST_F(EtcdClientTest, WatchWakesOnAPutFromAnotherClient) {
  int64_t rev = client_->put(key("w"), "0");
  auto woke = std::async(std::launch::async, [&] {
    EtcdClient watcher(shared_cluster->endpoints(), kRequestTimeout);
    return watcher.watch(key("w"), rev + 1, 10s);
  });
  // From rev + 1: the put is seen whether it lands before or after the
  // watch starts.
  EXPECT_EQ(woke.wait_for(200ms), std::future_status::timeout);
  client_->put(key("w"), "1");
  ASSERT_EQ(woke.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(woke.get());
}

TEST_F(EtcdClientTest, WatchWithPrefixWakesOnAnyKeyUnderIt) {
  int64_t rev = client_->put(key("other"), "");
  client_->put(key("p/x"), "1");
  EXPECT_TRUE(client_->watch(key("p/"), rev + 1, 10s, /*prefix=*/true));
  EXPECT_FALSE(client_->watch(key("p/"), rev + 10, 100ms, /*prefix=*/true));
}

TEST_F(EtcdClientTest, WatchFromAPastRevisionReturnsAtOnce) {
  int64_t rev = client_->put(key("past"), "1");
  client_->put(key("past"), "2");
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(client_->watch(key("past"), rev, 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST_F(EtcdClientTest, WatchReturnsFalseAtItsTimeoutAndTheClientStaysUsable) {
  int64_t rev = client_->put(key("quiet"), "");
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(client_->watch(key("quiet"), rev + 1, 300ms));
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 3s);
  EXPECT_FALSE(client_->watch(key("quiet"), 0, 1ms));
  client_->put(key("quiet"), "after");
  EXPECT_EQ(client_->get(key("quiet"))->value, "after");
  EXPECT_TRUE(client_->watch(key("quiet"), rev + 1, 10s));
}

TEST_F(EtcdClientTest, ARequestEtcdRefusesIsInvalidArgumentNamingTheKey) {
  // Over the fixture's --max-request-bytes (10 MiB).
  std::string huge(11 * 1024 * 1024, 'x');
  try {
    client_->put(key("huge"), huge);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr(key("huge")));
  }
  EXPECT_THROW(client_->put("", "empty key"), InvalidArgument);
  client_->put(key("fine"), "1");
}

// EtcdStore over this client: what the store conformance suite cannot see.
TEST_F(EtcdClientTest, AnEtcdStoreKeepsKeysUnderItsPrefixWithASlash) {
  EtcdStore s(shared_cluster->endpoints(), prefix_ + "job", 10s);
  EXPECT_EQ(s.key_prefix(), prefix_ + "job/");
  s.set("k", "v");
  EXPECT_EQ(client_->get(prefix_ + "job/k")->value, "v");
  client_->put(prefix_ + "jobless", "not in the store");
  EXPECT_EQ(s.num_keys(), 1);
  EXPECT_EQ(
      EtcdStore(shared_cluster->endpoints(), "/a/", 1s).key_prefix(), "/a/");
  EXPECT_THROW(EtcdStore("", "p", 1s), InvalidArgument);
}

TEST_F(EtcdClientTest, AnEtcdStoreServesOtherThreadsWhileOneWaits) {
  EtcdStore s(shared_cluster->endpoints(), prefix_, 10s);
  auto got = std::async(std::launch::async, [&] { return s.get("late"); });
  // The waiting get holds nothing these calls need.
  for (int i = 0; i < 20; ++i) {
    s.add("n", 1);
  }
  EXPECT_EQ(s.get("n"), "20");
  EXPECT_EQ(got.wait_for(0s), std::future_status::timeout);
  s.set("late", "v");
  ASSERT_EQ(got.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(got.get(), "v");
}

TEST(EtcdClientEndpointsTest, AnEmptyEndpointListIsInvalid) {
  EXPECT_THROW(EtcdClient(" , ", 1s), InvalidArgument);
  EtcdClient client(" http://127.0.0.1:1/ ,127.0.0.1:2", 1s);
  EXPECT_EQ(client.current_endpoint(), "http://127.0.0.1:1");
}

TEST(EtcdClientFailoverTest, ThreeMembersServeOnWhenTheFirstEndpointDies) {
  EtcdCluster cluster = EtcdCluster::start(3);
  // A put that member 1 forwarded to a killed leader is lost and times out
  // (etcd does not re-propose it); then member 2 serves it.
  constexpr auto kAttemptTimeout = 3s;
  EtcdClient client(cluster.endpoints(), kAttemptTimeout);
  int64_t before = client.put("/failover/k", "before");
  EXPECT_EQ(client.current_endpoint(), "http://" + cluster.endpoint(0));

  cluster.kill(0);
  // The kept-alive connection to member 0 is dead: the call moves on (and
  // waits there for a new leader should member 0 have led).
  auto start = std::chrono::steady_clock::now();
  int64_t after = client.put("/failover/k", "after");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 8s);
  EXPECT_GT(after, before);
  EXPECT_NE(client.current_endpoint(), "http://" + cluster.endpoint(0));
  EXPECT_EQ(client.get("/failover/k")->value, "after");
  EXPECT_TRUE(client.put_if_value("/failover/k", "after", "cas").succeeded);

  // A new client starts at the dead member and moves on too.
  EtcdClient fresh(cluster.endpoints(), kAttemptTimeout);
  EXPECT_EQ(fresh.get("/failover/k")->value, "cas");
  auto woke = std::async(std::launch::async, [&] {
    EtcdClient watcher(cluster.endpoints(), kAttemptTimeout);
    return watcher.watch("/failover/k", after + 2, 10s);
  });
  fresh.put("/failover/k", "watched");
  ASSERT_EQ(woke.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(woke.get());
}

TEST(EtcdClientFailoverTest, NetworkErrorNamesEveryEndpointWhenAllAreDead) {
  EtcdCluster cluster = EtcdCluster::start(1);
  std::string endpoints = cluster.endpoints() + ",127.0.0.1:1";
  EtcdClient client(endpoints, kRequestTimeout);
  client.put("/dead/k", "v");
  cluster.kill(0);
  auto start = std::chrono::steady_clock::now();
  try {
    client.get("/dead/k");
    FAIL() << "expected NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/dead/k"));
    EXPECT_THAT(e.what(), HasSubstr(cluster.endpoint(0)));
    EXPECT_THAT(e.what(), HasSubstr("127.0.0.1:1"));
  }
  EXPECT_THROW(client.watch("/dead/k", 0, 5s), NetworkError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// An HTTP server that answers every request with one canned reply, for
// replies a real etcd never sends.
class CannedHttpServer {
 public:
  CannedHttpServer(int status, std::string body)
      : CannedHttpServer({{status, std::move(body)}}) {}
  // Answers the replies in order, then the last one again and again.
  explicit CannedHttpServer(std::vector<std::pair<int, std::string>> replies) {
    fd_ = test::listen_on_loopback(&port_);
    for (const auto& [status, body] : replies) {
      replies_.push_back(
          "HTTP/1.1 " + std::to_string(status) +
          " X\r\nContent-Type: application/json\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    }
    thread_ = std::jthread([this] { serve(); });
  }
  ~CannedHttpServer() {
    // Wakes accept() with an error.
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }

  std::string endpoint() const {
    return "127.0.0.1:" + std::to_string(port_);
  }

 private:
  void serve() {
    for (;;) {
      int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) {
        return;
      }
      // Reads the headers and the body, bounded in time.
      std::string request;
      size_t want = std::string::npos;
      while (request.size() < want) {
        pollfd p{.fd = conn, .events = POLLIN, .revents = 0};
        if (::poll(&p, 1, 5000) <= 0) {
          break;
        }
        char buf[4096];
        ssize_t n = ::recv(conn, buf, sizeof buf, 0);
        if (n <= 0) {
          break;
        }
        request.append(buf, static_cast<size_t>(n));
        auto end = request.find("\r\n\r\n");
        auto cl = request.find("Content-Length: ");
        if (end != std::string::npos && cl != std::string::npos) {
          want = end + 4 + std::stoul(request.substr(cl + 16));
        }
      }
      const std::string& reply =
          replies_[std::min(served_++, replies_.size() - 1)];
      ::send(conn, reply.data(), reply.size(), MSG_NOSIGNAL);
      ::close(conn);
    }
  }

  int fd_ = -1;
  uint16_t port_ = 0;
  std::vector<std::string> replies_;
  size_t served_ = 0;  // serve()'s only
  std::jthread thread_;
};

TEST(EtcdClientBadReplyTest, RepliesEtcdWouldNotSendAreProtocolErrors) {
  struct Case {
    int status;
    std::string body;
    std::string says;
  };
  std::vector<Case> cases = {
      {200, "not json", "not a JSON object"},
      {200, "[1, 2]", "not a JSON object"},
      {404, "<html>", "not a JSON object"},
      {200, R"({"kvs":[{"key":"!!!!"}]})", "bad base64"},
      {200, R"({"kvs":[{"key":"Zm9v","value":"Zm9"}]})", "bad base64"},
      {200, R"({"kvs":[{"key":"Zm9v","mod_revision":"12x"}]})", "int64"},
      {200, R"({"kvs":[{"key":"Zm9v","version":true}]})", "int64"},
      {200, R"({"kvs":[{"key":7}]})", "not a string"},
      {200, R"({"kvs":{"key":"Zm9v"}})", "not an array"},
      {200, R"({"header":"x"})", "not an object"},
      {200, R"({"kvs":["x"]})", "not an object"},
  };
  for (const auto& c : cases) {
    CannedHttpServer server(c.status, c.body);
    EtcdClient client(server.endpoint(), 5s);
    try {
      client.get("some/key");
      ADD_FAILURE() << "expected ProtocolError for " << c.body;
    } catch (const ProtocolError& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.says)) << c.body;
      EXPECT_THAT(e.what(), HasSubstr("some/key")) << c.body;
    }
  }
}

TEST(EtcdClientBadReplyTest, AnErrorBodyIsARemoteErrorWithEtcdsText) {
  CannedHttpServer server(
      403,
      R"({"error":"etcdserver: permission denied",)"
      R"("message":"etcdserver: permission denied","code":7})");
  EtcdClient client(server.endpoint(), 5s);
  try {
    client.put("guarded", "x");
    FAIL() << "expected RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_THAT(e.what(), HasSubstr("permission denied"));
    EXPECT_THAT(e.what(), HasSubstr("PermissionDenied"));
    EXPECT_THAT(e.what(), HasSubstr("guarded"));
  }
}

TEST(EtcdClientBadReplyTest, A5xxMovesToTheNextEndpoint) {
  CannedHttpServer broken(
      503, R"({"error":"etcdserver: no leader","code":14})");
  CannedHttpServer fine(200, R"({"header":{"revision":"42"}})");
  EtcdClient client(broken.endpoint() + "," + fine.endpoint(), 5s);
  EXPECT_EQ(client.put("k", "v"), 42);
  EXPECT_EQ(client.current_endpoint(), "http://" + fine.endpoint());

  CannedHttpServer also_broken(500, R"({"error":"context deadline exceeded"})");
  EtcdClient hopeless(broken.endpoint() + "," + also_broken.endpoint(), 5s);
  try {
    hopeless.put("k", "v");
    FAIL() << "expected NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr("no leader"));
    EXPECT_THAT(e.what(), HasSubstr("context deadline exceeded"));
  }
}

// A cluster electing a leader answers 503 for a while: the call waits for
// the election instead of failing the job.
TEST(EtcdClientBadReplyTest, AMemberWithoutALeaderIsAskedAgainUntilItHasOne) {
  const std::string no_leader =
      R"({"error":"etcdserver: leader changed","code":14})";
  CannedHttpServer electing(
      {{503, no_leader},
       {503, no_leader},
       {503, no_leader},
       {200, R"({"header":{"revision":"7"}})"}});
  EtcdClient client(electing.endpoint(), 5s);
  EXPECT_EQ(client.put("k", "v"), 7);
}

TEST(EtcdClientBadReplyTest, ABrokenWatchStreamIsAProtocolError) {
  CannedHttpServer server(200, "{\"result\":{\"created\":true}}\nnonsense\n");
  EtcdClient client(server.endpoint(), 5s);
  EXPECT_THROW(client.watch("k", 0, 5s), ProtocolError);
}

}  // namespace
}  // namespace tide::etcd
