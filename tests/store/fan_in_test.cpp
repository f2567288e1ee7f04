// The store fan-in (TcpStoreServerOptions::upstream, tide-store --upstream):
// what it shares and sums, and what it does when its own process is slow,
// its upstream connection is lost, a client sends bad frames, or a node's
// fan-in is killed while forwarding. Its torch semantics are the store
// conformance suite's (FanIn*) and the torch peer's scenarios through it
// (tests/interop/torch_interop_test.cpp). StoreFanInAppTest runs
// tide-store processes (tide_app_tests); the rest run in this process.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <latch>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "tide/common/error.h"
#include "tide/store/tcp_store.h"

#include "net/socket.h"
#include "support/eventually.h"
#include "support/raw_client.h"
#include "support/subprocess.h"

namespace tide::store {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<TcpStore> store_client(
    uint16_t port, Dialect d = Dialect::kLegacy, milliseconds timeout = 30s) {
  return std::make_shared<TcpStore>(
      TcpStoreOptions{.port = port, .dialect = d, .timeout = timeout});
}

std::unique_ptr<TcpStoreServer> fan_in(uint16_t upstream) {
  return TcpStoreServer::start(
      {.upstream = StoreUpstream{.port = upstream, .connect_timeout = 10s}});
}

// A tide-store process (with --upstream, a fan-in): its port.
uint16_t listening_port(test::Subprocess& app) {
  auto line = app.read_line(30s);
  if (!line || line->rfind(':') == std::string::npos) {
    throw std::runtime_error("tide-store did not start: " + line.value_or(""));
  }
  return static_cast<uint16_t>(std::stoi(line->substr(line->rfind(':') + 1)));
}

// Whether every thread of pid is stopped (SIGSTOP has taken effect).
bool stopped(pid_t pid) {
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(dir)) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    std::getline(stat, line);
    auto close = line.rfind(')');
    if (close == std::string::npos || close + 2 >= line.size() ||
        line[close + 2] != 'T') {
      return false;
    }
  }
  return true;
}

// A TCP proxy to `port` on 127.0.0.1 whose connections can lose what is
// sent to the store (a link that went quiet) and be cut.
class Proxy {
 public:
  explicit Proxy(uint16_t port) : to_(port) {
    listener_ = test::listen_on_loopback(&port_);
    thread_ = std::jthread([this](std::stop_token stop) { run(stop); });
  }
  ~Proxy() {
    thread_.request_stop();
    thread_.join();
    ::close(listener_);
    cut();
  }
  uint16_t port() const {
    return port_;
  }
  // While on, bytes towards the store are dropped (and counted).
  void drop(bool on) {
    dropping_ = on;
  }
  size_t dropped() const {
    return dropped_;
  }
  // Closes the connections made so far; new ones are still accepted.
  void cut() {
    std::lock_guard lock(mutex_);
    for (auto& [a, b] : pairs_) {
      ::shutdown(a, SHUT_RDWR);
      ::shutdown(b, SHUT_RDWR);
    }
  }
  int accepted() const {
    return accepted_;
  }

 private:
  void run(const std::stop_token& stop) {
    while (!stop.stop_requested()) {
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      {
        std::lock_guard lock(mutex_);
        for (auto& [a, b] : pairs_) {
          fds.push_back({a, POLLIN, 0});
          fds.push_back({b, POLLIN, 0});
        }
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) {
        continue;
      }
      if (fds[0].revents & POLLIN) {
        int a = ::accept(listener_, nullptr, nullptr);
        std::string error;
        Fd b = net::connect_tcp("127.0.0.1", to_, Clock::now() + 5s, error);
        std::lock_guard lock(mutex_);
        pairs_.emplace_back(a, b.release());
        ++accepted_;
      }
      char buf[64 * 1024];
      std::lock_guard lock(mutex_);
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) {
          continue;
        }
        auto& [a, b] = pairs_[(i - 1) / 2];
        int from = i % 2 == 1 ? a : b;
        int to = i % 2 == 1 ? b : a;
        ssize_t n = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0 && from == a && dropping_) {
          dropped_ += static_cast<size_t>(n);
        } else if (n > 0) {
          size_t sent = 0;
          while (sent < static_cast<size_t>(n)) {
            ssize_t w = ::send(to, buf + sent, n - sent, MSG_NOSIGNAL);
            if (w <= 0) {
              break;
            }
            sent += static_cast<size_t>(w);
          }
        } else if (n == 0) {
          ::shutdown(to, SHUT_RDWR);
        }
      }
    }
  }

  uint16_t to_;
  uint16_t port_ = 0;
  int listener_ = -1;
  std::atomic<bool> dropping_{false};
  std::atomic<size_t> dropped_{0};
  std::atomic<int> accepted_{0};
  std::mutex mutex_;
  std::vector<std::pair<int, int>> pairs_;
  std::jthread thread_;
};

TEST(StoreFanInTest, IdenticalWaitsOfManyClientsAreAskedOnce) {
  auto root = TcpStoreServer::start({});
  auto node = fan_in(root->port());
  constexpr int kClients = 8;
  std::vector<std::future<void>> waits;
  for (int i = 0; i < kClients; ++i) {
    waits.push_back(std::async(std::launch::async, [&, i] {
      store_client(node->port(), i % 2 ? Dialect::kModern : Dialect::kLegacy)
          ->wait({"go"});
    }));
  }
  ASSERT_TRUE(test::eventually(
      [&] { return node->fan_in_counts().requests == kClients; }));
  // Eight WAITs, one of them upstream.
  EXPECT_EQ(node->fan_in_counts().frames, 1u);
  store_client(root->port())->set("go", "1");
  for (auto& w : waits) {
    ASSERT_EQ(w.wait_for(30s), std::future_status::ready);
    w.get();
  }
}

TEST(StoreFanInTest, AddsOfManyClientsAtOnceReturnEveryValueOnce) {
  auto root = TcpStoreServer::start({});
  auto node = fan_in(root->port());
  constexpr int kClients = 8;
  constexpr int kAdds = 100;
  std::latch start(kClients);
  std::mutex mutex;
  std::multiset<int64_t> seen;
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < kClients; ++i) {
      threads.emplace_back([&] {
        auto c = store_client(node->port());
        start.arrive_and_wait();
        for (int j = 0; j < kAdds; ++j) {
          int64_t v = c->add("n", 1);
          std::lock_guard lock(mutex);
          seen.insert(v);
        }
      });
    }
  }
  std::set<int64_t> distinct(seen.begin(), seen.end());
  EXPECT_EQ(seen.size(), distinct.size())
      << "an ADD's value was returned twice";
  EXPECT_EQ(*distinct.begin(), 1);
  EXPECT_EQ(*distinct.rbegin(), kClients * kAdds);
  EXPECT_EQ(
      store_client(root->port())->get("n"), std::to_string(kClients * kAdds));
  auto counts = node->fan_in_counts();
  std::printf(
      "%llu requests, %llu frames upstream\n",
      static_cast<unsigned long long>(counts.requests),
      static_cast<unsigned long long>(counts.frames));
}

TEST(StoreFanInAppTest, AFanInStoppedAWhileLosesNoWakeUp) {
  test::Subprocess root({TIDE_STORE_BIN, "--port", "0"});
  uint16_t root_port = listening_port(root);
  test::Subprocess node(
      {TIDE_STORE_BIN,
       "--port",
       "0",
       "--upstream",
       "127.0.0.1:" + std::to_string(root_port)});
  uint16_t node_port = listening_port(node);
  auto waiter = store_client(node_port);
  auto done = std::async(std::launch::async, [&] { waiter->wait({"k"}); });
  auto direct = store_client(root_port);
  // The WAIT is upstream once the root holds a waiter for it: a CHECK
  // through the fan-in is answered after it on the one connection.
  store_client(node_port)->check({"k"});
  node.signal(SIGSTOP);
  ASSERT_TRUE(test::eventually([&] { return stopped(node.pid()); }));
  direct->set("k", "v");
  EXPECT_EQ(done.wait_for(300ms), std::future_status::timeout);
  node.signal(SIGCONT);
  ASSERT_EQ(done.wait_for(30s), std::future_status::ready);
  done.get();
}

TEST(StoreFanInTest, ALostUpstreamAsksWaitsAgainAndNeverDoublesAnAdd) {
  auto root = TcpStoreServer::start({});
  Proxy proxy(root->port());
  auto node = fan_in(proxy.port());
  auto waiter = store_client(node->port());
  auto wait = std::async(std::launch::async, [&] { waiter->wait({"k"}); });
  ASSERT_TRUE(
      test::eventually([&] { return node->fan_in_counts().frames >= 1; }));
  // An ADD sent when the link goes quiet (the store never gets it), then
  // the connection is cut: the fan-in cannot know whether it was applied,
  // so its client is disconnected rather than the ADD sent again.
  auto adder = store_client(node->port(), Dialect::kLegacy, 30s);
  proxy.drop(true);
  auto add = std::async(std::launch::async, [&] { return adder->add("n", 1); });
  ASSERT_TRUE(test::eventually([&] { return proxy.dropped() > 0; }));
  proxy.drop(false);  // before the cut: the fan-in reconnects at once
  proxy.cut();
  EXPECT_THROW(add.get(), NetworkError);
  ASSERT_TRUE(test::eventually([&] { return proxy.accepted() == 2; }));
  // The WAIT was asked again on the new connection.
  store_client(root->port())->set("k", "v");
  ASSERT_EQ(wait.wait_for(30s), std::future_status::ready);
  wait.get();
  EXPECT_EQ(store_client(root->port())->add("n", 0), 0);
  EXPECT_EQ(store_client(node->port())->add("n", 1), 1);
}

TEST(StoreFanInTest, BadFramesFromAClientCloseOnlyItsConnection) {
  auto root = TcpStoreServer::start({});
  auto node = fan_in(root->port());
  auto good = store_client(node->port());
  good->set("before", "1");
  auto waiting = std::async(
      std::launch::async, [&] { store_client(node->port())->wait({"after"}); });
  for (const std::string& bytes :
       {std::string("\xEE garbage", 9),
        // A legacy SET whose key length is over every limit.
        std::string("\x00\xFF\xFF\xFF\xFF\xFF\xFF\x00\x00", 9)}) {
    test::RawClient raw(node->port());
    ASSERT_TRUE(raw.send(bytes));
    EXPECT_TRUE(raw.closed_within(10s));
  }
  EXPECT_EQ(good->get("before"), "1");
  good->set("after", "1");
  ASSERT_EQ(waiting.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(store_client(root->port())->get("after"), "1");
}

TEST(StoreFanInAppTest, ANodeKilledWhileForwardingLeavesTheOtherNodesRunning) {
  test::Subprocess root({TIDE_STORE_BIN, "--port", "0"});
  uint16_t root_port = listening_port(root);
  auto node = [&] {
    return std::make_unique<test::Subprocess>(std::vector<std::string>{
        TIDE_STORE_BIN,
        "--port",
        "0",
        "--upstream",
        "127.0.0.1:" + std::to_string(root_port)});
  };
  auto a = node();
  auto b = node();
  uint16_t a_port = listening_port(*a);
  uint16_t b_port = listening_port(*b);
  // Node a's ranks are mid-way: one waits, one writes a stream of keys.
  auto a_waiter = store_client(a_port);
  auto a_wait = std::async(std::launch::async, [&] {
    try {
      a_waiter->wait({"never"});
    } catch (const Error&) {
    }
  });
  std::atomic<bool> stop{false};
  auto a_writer = std::async(std::launch::async, [&] {
    try {
      auto c = store_client(a_port);
      for (int i = 0; !stop; ++i) {
        c->set("a/" + std::to_string(i), std::string(4096, 'x'));
      }
    } catch (const Error&) {
    }
  });
  store_client(a_port)->check({"never"});
  a->signal(SIGKILL);
  // Node b's ranks still meet at a barrier of their own.
  constexpr int kRanks = 4;
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto c = store_client(b_port);
      c->set("b/addr/" + std::to_string(r), "x");
      if (c->add("b/count", 1) == kRanks) {
        c->set("b/last", "1");
      }
      c->wait({"b/last"});
    }));
  }
  for (auto& f : ranks) {
    ASSERT_EQ(f.wait_for(30s), std::future_status::ready);
    f.get();
  }
  stop = true;
  ASSERT_EQ(a_wait.wait_for(30s), std::future_status::ready);
  ASSERT_EQ(a_writer.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(store_client(root_port)->get("b/count"), std::to_string(kRanks));
}

}  // namespace
}  // namespace tide::store
