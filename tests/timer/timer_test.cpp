#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tide/timer/file_timer.h"
#include "tide/timer/local_timer.h"

#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace tide::timer {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using test::Subprocess;

// Seconds from arming to expiry of the children's timers: room for a child
// on a loaded machine to say "armed" (and to release) before it is killed.
constexpr double kExpiry = 1.0;

class TimerTest : public ::testing::Test {
 protected:
  // A child that arms a timer; returns once it says so.
  std::unique_ptr<Subprocess> child(
      const std::string& kind,
      const std::string& path,
      double after,
      int sig = SIGKILL,
      bool release = false) {
    std::vector<std::string> argv{
        TIDE_TIMER_CHILD,
        kind,
        path,
        "step",
        std::to_string(after),
        std::to_string(sig)};
    if (release) {
      argv.push_back("release");
    }
    auto p = std::make_unique<Subprocess>(argv);
    auto line = p->read_line(10s);
    EXPECT_EQ(line.value_or("<nothing>"), "armed");
    return p;
  }

  // Writes raw lines to the FIFO as a foreign client would.
  void write_raw(const std::string& path, const std::string& bytes) {
    int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(
        ::write(fd, bytes.data(), bytes.size()),
        static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }

  static std::string request(pid_t pid, double expiration, int sig) {
    return "{\"version\": 1, \"pid\": " + std::to_string(pid) +
           ", \"scope_id\": \"s\", \"expiration_time\": " +
           std::to_string(expiration) + ", \"signal\": " + std::to_string(sig) +
           "}\n";
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
};

TEST_F(TimerTest, AnExpiredWorkerIsKilledWithTheSignalItNamed) {
  FileTimerServer server((dir_ / "fifo").string());
  server.start();
  auto killed = child("file", server.path(), kExpiry, SIGKILL);
  auto termed = child("file", server.path(), kExpiry, SIGTERM);
  auto k = killed->wait(10s);
  auto t = termed->wait(10s);
  ASSERT_TRUE(k && t);
  EXPECT_TRUE(WIFSIGNALED(*k) && WTERMSIG(*k) == SIGKILL);
  EXPECT_TRUE(WIFSIGNALED(*t) && WTERMSIG(*t) == SIGTERM);
  EXPECT_EQ(server.size(), 0u);
}

TEST_F(TimerTest, AReleasedTimerNeverFires) {
  FileTimerServer server((dir_ / "fifo").string());
  server.start();
  auto p = child("file", server.path(), kExpiry, SIGKILL, /*release=*/true);
  // Long past the deadline the child is still alive.
  EXPECT_FALSE(p->wait(3s).has_value());
  EXPECT_EQ(server.size(), 0u);
}

TEST_F(TimerTest, LocalTimersIdentifyTheSenderByItsKernelPid) {
  std::vector<pid_t> reaped;
  std::mutex m;
  LocalTimerServer server(
      (dir_ / "timer.sock").string(), {.on_reap = [&](const ExpiredTimer& e) {
        std::lock_guard lock(m);
        reaped.push_back(e.worker_id);
      }});
  server.start();
  auto p = child("local", server.path(), kExpiry);
  auto status = p->wait(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFSIGNALED(*status));
  std::lock_guard lock(m);
  ASSERT_EQ(reaped.size(), 1u);
  EXPECT_EQ(reaped[0], p->pid());
}

TEST_F(TimerTest, RequestsForProcessesThatAreNotWorkersAreRefused) {
  std::atomic<pid_t> allowed{-1};
  FileTimerServer server(
      (dir_ / "fifo").string(),
      {.allow_pid = [&](pid_t pid) { return pid == allowed; }});
  server.start();
  // A bystander process that nobody allowed, named in a forged request.
  Subprocess bystander({"/bin/sleep", "30"});
  write_raw(server.path(), request(bystander.pid(), timer::now() - 1, SIGKILL));
  // And the server's own process.
  write_raw(server.path(), request(::getpid(), timer::now() - 1, SIGKILL));
  // A request that is accepted shows the earlier ones were processed.
  auto worker = std::make_unique<Subprocess>(
      std::vector<std::string>{"/bin/sleep", "30"});
  allowed = worker->pid();
  write_raw(server.path(), request(worker->pid(), timer::now() - 1, SIGKILL));
  auto status = worker->wait(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFSIGNALED(*status));
  EXPECT_FALSE(bystander.wait(0ms).has_value()) << "a bystander was signalled";
}

TEST_F(TimerTest, MalformedLinesAreSkippedAndTheNextRequestServed) {
  FileTimerServer server((dir_ / "fifo").string());
  server.start();
  write_raw(
      server.path(),
      "not json\n{\"version\": 2}\n[1,2]\n{\"version\": 1, \"pid\": \"x\"}\n");
  // A client that died mid-message: a fragment with no newline...
  write_raw(server.path(), "{\"version\": 1, \"pid\": 12");
  // ...then a worker's request right behind it.
  Subprocess worker({"/bin/sleep", "30"});
  write_raw(server.path(), request(worker.pid(), timer::now() - 1, SIGKILL));
  auto status = worker.wait(10s);
  ASSERT_TRUE(status.has_value()) << "the request after the fragment was lost";
  EXPECT_TRUE(WIFSIGNALED(*status));
  EXPECT_GE(server.malformed_lines(), 5u);
}

TEST_F(TimerTest, ServerApiRegistersExpiresAndClears) {
  FileTimerServer server((dir_ / "fifo").string());  // not started
  Subprocess a({"/bin/sleep", "30"});
  Subprocess b({"/bin/sleep", "30"});
  double t = timer::now();
  EXPECT_EQ(
      server.register_timers({
          {.worker_id = a.pid(),
           .scope_id = "x",
           .expiration_time = t - 2,
           .signal = SIGKILL},
          {.worker_id = a.pid(),
           .scope_id = "y",
           .expiration_time = t - 1,
           .signal = SIGKILL},
          {.worker_id = b.pid(),
           .scope_id = "x",
           .expiration_time = t + 100,
           .signal = SIGKILL},
      }),
      3u);
  auto expired = server.get_expired_timers(t);
  ASSERT_EQ(expired.size(), 1u);
  ASSERT_EQ(expired[a.pid()].size(), 2u);
  EXPECT_EQ(expired[a.pid()][0].scope_id, "x");  // earliest first
  server.register_timers(
      {{.worker_id = a.pid(),
        .scope_id = "x",
        .expiration_time = -1,
        .signal = 0}});
  EXPECT_EQ(server.size(), 2u);
  server.clear_timers({a.pid()});
  EXPECT_EQ(server.size(), 1u);
}

TEST_F(TimerTest, ExpiresGuardsAndWrapsWithTheConfiguredClient) {
  struct Recorder : TimerClient {
    std::vector<std::pair<std::string, double>> calls;
    void acquire(const std::string& scope, double expiration) override {
      calls.emplace_back(scope, expiration);
    }
    void release(const std::string& scope) override {
      calls.emplace_back(scope, -1);
    }
  };
  auto rec = std::make_shared<Recorder>();
  configure(rec);
  {
    auto guard = expires(std::chrono::seconds(60), "step");
    ASSERT_EQ(rec->calls.size(), 1u);
    EXPECT_NEAR(rec->calls[0].second, timer::now() + 60, 1);
  }
  ASSERT_EQ(rec->calls.size(), 2u);
  EXPECT_EQ(rec->calls[1], std::make_pair(std::string("step"), -1.0));
  int v = expires(std::chrono::seconds(1), [] { return 42; });
  EXPECT_EQ(v, 42);
  ASSERT_EQ(rec->calls.size(), 4u);
  EXPECT_NE(rec->calls[2].first.find("timer_test.cpp#"), std::string::npos)
      << "default scope is file#line: " << rec->calls[2].first;
  configure(nullptr);
  EXPECT_THROW((void)expires(std::chrono::seconds(1)), InvalidArgument);
}

TEST_F(TimerTest, AClientWithoutAServerFailsClearly) {
  FileTimerClient c((dir_ / "nothing").string(), SIGKILL, 200ms);
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(c.acquire("s", timer::now() + 1), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

}  // namespace
}  // namespace tide::timer
