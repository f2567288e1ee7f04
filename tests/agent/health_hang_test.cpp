// Node health checks and hang detection in the agent's C++ API: the
// built-in checks, the policy (retry, give up), heartbeats from C++ workers
// and what the agent does with a worker whose heartbeats stop.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tide/agent/health_check.h"
#include "tide/agent/local_elastic_agent.h"
#include "tide/timer/heartbeat.h"

#include "support/agent_fixture.h"
#include "support/temp_dir.h"

namespace tide::agent {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class HealthHangTest : public test::AgentTest {
 protected:
  HealthCheckContext context(std::chrono::milliseconds timeout = 10s) const {
    return {.log_dir = dir_.string(), .timeout = timeout};
  }
};

TEST_F(HealthHangTest, ACommandCheckPassesOnExitZeroAndFailsWithItsOutput) {
  auto ok = command_health_check("echo all good");
  auto r = ok->run(context());
  EXPECT_TRUE(r.healthy) << r.detail;
  EXPECT_EQ(r.detail, "all good");

  auto bad = command_health_check("echo NIC eth1 is down >&2; exit 3");
  r = bad->run(context());
  EXPECT_FALSE(r.healthy);
  EXPECT_NE(r.detail.find("exited with 3"), std::string::npos) << r.detail;
  EXPECT_NE(r.detail.find("NIC eth1 is down"), std::string::npos) << r.detail;
  EXPECT_EQ(bad->name(), "command");
  EXPECT_THROW(command_health_check(""), InvalidArgument);
}

TEST_F(HealthHangTest, ACommandPastItsTimeoutFailsAndLeavesNothingBehind) {
  // The shell's child holds the output pipe: the whole group must go.
  auto slow = command_health_check(
      "echo started; sleep 100 & echo $! > " + (dir_ / "child").string() +
      "; wait");
  // Long enough for the shell to say "started" and write the child's pid
  // on a loaded machine before it is killed.
  auto r = slow->run(context(2s));
  EXPECT_FALSE(r.healthy);
  EXPECT_NE(r.detail.find("did not finish within 2000 ms"), std::string::npos)
      << r.detail;
  EXPECT_NE(r.detail.find("started"), std::string::npos) << r.detail;
  std::ifstream in(dir_ / "child");
  pid_t child = 0;
  ASSERT_TRUE(in >> child);
  // Killed with its group: the child ends (a pidfd turns readable once it
  // has exited; none can be opened when it is already reaped).
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, child, 0));
  if (pidfd >= 0) {
    pollfd p{.fd = pidfd, .events = POLLIN, .revents = 0};
    EXPECT_EQ(::poll(&p, 1, 10'000), 1) << "the check's child outlived it";
    ::close(pidfd);
  }
}

TEST_F(HealthHangTest, TheDiskCheckComparesTheFreeSpaceOfTheLogDirectory) {
  auto r = disk_space_health_check(1)->run(context());
  EXPECT_TRUE(r.healthy) << r.detail;
  EXPECT_NE(r.detail.find("free in " + dir_.string()), std::string::npos)
      << r.detail;
  r = disk_space_health_check(parse_size("1000000T", "x"))->run(context());
  EXPECT_FALSE(r.healthy);
  EXPECT_NE(r.detail.find("need 976.6 PiB"), std::string::npos) << r.detail;
  r = disk_space_health_check(1, "/no/such/dir")->run(context());
  EXPECT_FALSE(r.healthy);
  EXPECT_NE(r.detail.find("cannot stat /no/such/dir"), std::string::npos);
}

TEST_F(HealthHangTest, TheEndpointCheckConnects) {
  // A listening socket is reachable; the same port closed is not.
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(
      ::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr),
      0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  std::string endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  auto check = endpoint_health_check(endpoint);
  auto r = check->run(context());
  EXPECT_TRUE(r.healthy) << r.detail;
  listener.reset();
  r = check->run(context(2s));
  EXPECT_FALSE(r.healthy);
  EXPECT_NE(
      r.detail.find("cannot reach the rendezvous endpoint " + endpoint),
      std::string::npos)
      << r.detail;
  EXPECT_THROW(endpoint_health_check("no-port"), InvalidArgument);
}

TEST_F(HealthHangTest, SizesParseWithBinaryUnits) {
  EXPECT_EQ(parse_size("512", "x"), 512u);
  EXPECT_EQ(parse_size("4K", "x"), 4096u);
  EXPECT_EQ(parse_size("1.5G", "x"), 1536ull << 20);
  EXPECT_EQ(parse_size("2GiB", "x"), 2ull << 30);
  EXPECT_EQ(parse_size("1t", "x"), 1ull << 40);
  for (const char* bad : {"", "G", "-1G", "10X", "1e30", "nan"}) {
    EXPECT_THROW(parse_size(bad, "--size"), InvalidArgument) << bad;
  }
}

TEST_F(HealthHangTest, AFailingNodeRetriesThenGivesUpWithoutStartingWorkers) {
  auto count = dir_ / "checks";
  auto s = spec(sh("touch " + (dir_ / "ran").string()), 1);
  s.health.checks.push_back(command_health_check(
      "echo . >> " + count.string() + "; echo no GPU found; exit 1"));
  s.health.retries = 2;
  s.health.backoff = 10ms;
  LocalElasticAgent agent(std::move(s));
  try {
    agent.run();
    FAIL() << "a node failing its checks ran";
  } catch (const HealthCheckError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("3 attempt(s)"), std::string::npos) << what;
    EXPECT_NE(what.find("no GPU found"), std::string::npos) << what;
  }
  std::ifstream in(count);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(all, ".\n.\n.\n");
  EXPECT_FALSE(fs::exists(dir_ / "ran"));
}

TEST_F(HealthHangTest, ANodeThatRecoversJoins) {
  // Unhealthy until the third check.
  auto count = dir_ / "checks";
  auto s = spec(sh("exit 0"), 1);
  s.health.checks.push_back(command_health_check(
      "echo . >> " + count.string() + "; [ $(wc -l < " + count.string() +
      ") -ge 3 ]"));
  s.health.retries = -1;
  s.health.backoff = 10ms;
  LocalElasticAgent agent(std::move(s));
  EXPECT_FALSE(agent.run().is_failed());
}

TEST(HeartbeatTest, TheReceiverLearnsEachSendersPidFromTheKernel) {
  test::TempDir tmp;
  timer::HeartbeatReceiver receiver(tmp.path().string() + "/hb.sock");
  timer::HeartbeatClient client(receiver.path());
  client.beat();
  client.beat();
  pid_t child = ::fork();
  if (child == 0) {
    timer::HeartbeatClient(receiver.path()).beat();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  // A datagram too long to be a beat is skipped; the receiver goes on.
  Fd raw = Fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, receiver.path().c_str());
  std::string big(1000, 'x');
  ASSERT_EQ(
      ::sendto(
          raw.get(),
          big.data(),
          big.size(),
          0,
          reinterpret_cast<sockaddr*>(&addr),
          sizeof addr),
      static_cast<ssize_t>(big.size()));
  client.beat();
  std::vector<pid_t> senders;
  for (const auto& b : receiver.drain()) {
    senders.push_back(b.pid);
  }
  EXPECT_EQ(
      senders, (std::vector<pid_t>{::getpid(), ::getpid(), child, ::getpid()}));
  EXPECT_TRUE(receiver.drain().empty());
}

TEST(HeartbeatTest, ABeatCarriesTheStepNumberOrNothingElse) {
  test::TempDir tmp;
  timer::HeartbeatReceiver receiver(tmp.path().string() + "/hb.sock");
  timer::HeartbeatClient client(receiver.path());
  client.beat(41);
  client.beat();
  client.beat(0);
  // What Python's helpers send by hand; anything that is not the digits
  // alone is a beat without a step.
  Fd raw = Fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, receiver.path().c_str());
  for (std::string text : {"7", "-3", "12x", " 5", "99999999999999999999"}) {
    ASSERT_EQ(
        ::sendto(
            raw.get(),
            text.data(),
            text.size(),
            0,
            reinterpret_cast<sockaddr*>(&addr),
            sizeof addr),
        static_cast<ssize_t>(text.size()));
  }
  std::vector<std::optional<int64_t>> steps;
  for (const auto& b : receiver.drain()) {
    steps.push_back(b.step);
  }
  EXPECT_EQ(
      steps,
      (std::vector<std::optional<int64_t>>{
          41,
          std::nullopt,
          0,
          7,
          std::nullopt,
          std::nullopt,
          std::nullopt,
          std::nullopt}));
  EXPECT_THROW(client.beat(-1), InvalidArgument);
}

TEST(HeartbeatTest, WithoutAnAgentABeatIsANoOpOrAClearError) {
  ASSERT_EQ(std::getenv(timer::kHeartbeatSocketEnv), nullptr);
  EXPECT_FALSE(timer::heartbeat());
  test::TempDir tmp;
  timer::HeartbeatClient client(tmp.path().string() + "/nobody.sock");
  EXPECT_THROW(client.beat(), Error);
  EXPECT_THROW(timer::HeartbeatClient(std::string(200, 'x')), InvalidArgument);
}

TEST_F(HealthHangTest, AWorkerWhoseHeartbeatsStopIsKilledWithItsStackReported) {
  auto s = spec(FunctionCall{"heartbeat_then_hang", {}}, 1);
  s.start_method = StartMethod::kSpawn;
  s.heartbeat_timeout = 300ms;
  LocalElasticAgent agent(std::move(s));
  RunResult r = agent.run();
  ASSERT_TRUE(r.is_failed());
  const ProcessFailure& f = r.failures.at(0);
  EXPECT_EQ(f.exitcode, -SIGKILL);
  const std::string hung = "hung: rank 0 (local rank 0, pid " +
                           std::to_string(f.pid) + ") sent no heartbeat for ";
  auto at = f.message.find(hung);
  ASSERT_NE(at, std::string::npos) << f.message;
  // Judged once the timeout passed, not before; how soon after depends on
  // the machine's load: the upper bound only says it was not forgotten.
  double age = std::stod(f.message.substr(at + hung.size()));
  EXPECT_GE(age, 0.3) << f.message;
  EXPECT_LT(age, 10.0) << f.message;
  EXPECT_NE(f.message.find("(--heartbeat-timeout 0.300 s)"), std::string::npos)
      << f.message;
  // The stack, by eu-stack or gdb (scripts/setup.sh installs both).
  EXPECT_NE(
      f.traceback.find(" -p " + std::to_string(f.pid) + ":\n"),
      std::string::npos)
      << f.traceback;
  EXPECT_NE(f.traceback.find("pause"), std::string::npos) << f.traceback;
  EXPECT_NE(f.error_file_data.find("hung: rank 0"), std::string::npos);
}

TEST_F(HealthHangTest, WorkersThatNeverBeatAreNotJudgedByHeartbeats) {
  // Silent for three timeouts, then a success.
  auto s = spec(sh("sleep 0.9"), 2);
  s.heartbeat_timeout = 300ms;
  LocalElasticAgent agent(std::move(s));
  RunResult r = agent.run();
  EXPECT_FALSE(r.is_failed());
}

}  // namespace
}  // namespace tide::agent
