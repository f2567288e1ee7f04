#include "tide/agent/local_elastic_agent.h"

#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "tide/rendezvous/registry.h"
#include "tide/store/hash_store.h"

#include "support/agent_fixture.h"
#include "support/eventually.h"
#include "support/process_checks.h"
#include "support/temp_dir.h"

namespace tide::agent {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

using LocalElasticAgentTest = test::AgentTest;

// This node of a two-node job whose other node never shows up in the exit
// barrier; the test closes the rendezvous when it likes.
class LonelyPairHandler : public rendezvous::RendezvousHandler {
 public:
  std::string get_backend() const override {
    return "lonely-pair";
  }
  rendezvous::RendezvousInfo next_rendezvous() override {
    // The absent node's share of the rank assignment.
    store->set("torchelastic/round0/role_info/1", "1");
    return {.store = store, .rank = 0, .world_size = 2};
  }
  bool is_closed() override {
    return closed;
  }
  void set_closed() override {
    closed = true;
  }
  int num_nodes_waiting() override {
    return 0;
  }
  std::string get_run_id() const override {
    return "lonely";
  }
  bool shutdown() override {
    return true;
  }

  std::shared_ptr<store::Store> store = store::make_hash_store();
  std::atomic<bool> closed{false};
};

// Runs a one-worker agent of a LonelyPairHandler until its exit barrier
// counted this node in, calls `then`, and returns how the run ended and
// how long it took after `then`.
template <typename Then>
std::pair<RunResult, std::chrono::steady_clock::duration> run_into_the_barrier(
    WorkerSpec spec, LonelyPairHandler& handler, Then then) {
  spec.exit_barrier_timeout = 20s;  // a hang fails the test, not ctest
  LocalElasticAgent agent(std::move(spec));
  auto result = std::async(std::launch::async, [&] { return agent.run(); });
  handler.store->wait({"torchelastic/agent/terminal_state/num_members"}, 30s);
  auto at = std::chrono::steady_clock::now();
  then(agent);
  EXPECT_EQ(result.wait_for(10s), std::future_status::ready);
  RunResult r = result.get();
  return {r, std::chrono::steady_clock::now() - at};
}

TEST_F(
    LocalElasticAgentTest, AClosedRendezvousEndsTheExitBarrierWithinASecond) {
  auto handler = std::make_shared<LonelyPairHandler>();
  auto s = spec(sh("exit 0"), 1);
  s.rdzv_handler = handler;
  auto [r, took] =
      run_into_the_barrier(std::move(s), *handler, [&](LocalElasticAgent&) {
        handler->closed = true;
      });
  EXPECT_EQ(r.state, WorkerState::kSucceeded);
  // The barrier sees the close when its 1 s slice ends; the bound leaves a
  // loaded machine room and stays far below the barrier's 20 s timeout.
  EXPECT_LT(took, 5s);
}

TEST_F(LocalElasticAgentTest, AStopRequestInTheExitBarrierReturnsTheSuccess) {
  auto handler = std::make_shared<LonelyPairHandler>();
  auto s = spec(sh("exit 0"), 1);
  s.rdzv_handler = handler;
  auto [r, took] = run_into_the_barrier(
      std::move(s), *handler, [](LocalElasticAgent& agent) {
        agent.request_stop(SIGTERM);
      });
  EXPECT_EQ(r.state, WorkerState::kSucceeded);
  // Seen when the barrier's 1 s slice ends, as the close above.
  EXPECT_LT(took, 5s);
  EXPECT_FALSE(handler->closed);
}

TEST_F(LocalElasticAgentTest, AFailedNodeCountsInWithoutWaiting) {
  // Its peers in the barrier learn at once that it is over.
  auto handler = std::make_shared<LonelyPairHandler>();
  auto s = spec(sh("exit 4"), 1);
  s.rdzv_handler = handler;
  LocalElasticAgent agent(std::move(s));
  RunResult r = agent.run();
  EXPECT_EQ(r.state, WorkerState::kFailed);
  EXPECT_TRUE(handler->closed);
  const std::string base = "torchelastic/agent/terminal_state/";
  EXPECT_EQ(handler->store->get(base + "num_members"), "1");
  EXPECT_EQ(handler->store->get(base + "failed"), "0");
  EXPECT_FALSE(handler->store->check({base + "last_member"}));
}

TEST_F(LocalElasticAgentTest, FunctionWorkersReturnValuesByGlobalRank) {
  for (StartMethod method : {StartMethod::kFork, StartMethod::kSpawn}) {
    auto s = spec(FunctionCall{"rank", {}}, 3);
    s.start_method = method;
    LocalElasticAgent agent(std::move(s));
    RunResult r = agent.run();
    ASSERT_EQ(r.state, WorkerState::kSucceeded);
    EXPECT_FALSE(r.is_failed());
    EXPECT_TRUE(r.failures.empty());
    EXPECT_EQ(r.return_values.size(), 3u);
    EXPECT_EQ(r.return_values[0], "0/3/0");
    EXPECT_EQ(r.return_values[2], "2/3/0");
  }
}

TEST_F(LocalElasticAgentTest, CommandWorkersGetTorchrunsEnvironment) {
  auto out = dir_ / "env";
  LocalElasticAgent agent(
      spec(sh("env > " + out.string() + ".$LOCAL_RANK"), 2));
  ASSERT_EQ(agent.run().state, WorkerState::kSucceeded);
  std::ifstream in(out.string() + ".1");
  std::map<std::string, std::string> env;
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  EXPECT_EQ(env["RANK"], "1");
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["WORLD_SIZE"], "2");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
  EXPECT_EQ(env["GROUP_RANK"], "0");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "1");
  EXPECT_EQ(env["ROLE_NAME"], "default");
  EXPECT_EQ(env["ROLE_RANK"], "1");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "2");
  EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
  EXPECT_NE(env["MASTER_PORT"], "0");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "0");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "test");
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
  EXPECT_NE(
      env["TORCHELASTIC_ERROR_FILE"].find("attempt_0/1/error.json"),
      std::string::npos);
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "1");
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  }
}

TEST_F(LocalElasticAgentTest, AFailureReportsExitCodeErrorFileAndRank) {
  // Worker 1 writes a torch-style error file, then fails.
  std::string script =
      "if [ \"$LOCAL_RANK\" = 1 ]; then "
      "printf '%s' '{\"message\": {\"message\": \"ValueError: boom\", "
      "\"extraInfo\": "
      "{\"py_callstack\": \"Traceback: here\", \"timestamp\": "
      "\"1700000000\"}}}' "
      "> \"$TORCHELASTIC_ERROR_FILE\"; exit 7; fi; exec sleep 100";
  LocalElasticAgent agent(spec(sh(script), 2));
  RunResult r = agent.run();
  ASSERT_TRUE(r.is_failed());
  ASSERT_EQ(r.failures.size(), 1u)
      << "the worker the agent stopped is not a failure";
  const ProcessFailure& f = r.failures.at(1);
  EXPECT_EQ(f.exitcode, 7);
  EXPECT_EQ(f.local_rank, 1);
  EXPECT_EQ(f.message, "ValueError: boom");
  EXPECT_EQ(f.traceback, "Traceback: here");
  EXPECT_EQ(f.timestamp, 1700000000);
  EXPECT_NE(f.error_file_data.find("boom"), std::string::npos);
  EXPECT_EQ(r.root_cause(), &f);
  EXPECT_TRUE(r.return_values.empty());
}

TEST_F(LocalElasticAgentTest, AWorkerKilledByASignalIsReportedAsSuch) {
  LocalElasticAgent agent(spec(sh("kill -9 $$"), 1));
  RunResult r = agent.run();
  ASSERT_TRUE(r.is_failed());
  const ProcessFailure& f = r.failures.at(0);
  EXPECT_EQ(f.exitcode, -SIGKILL);
  EXPECT_EQ(f.signal_name(), "SIGKILL");
  EXPECT_NE(
      f.message.find("Signal 9 (SIGKILL) received by PID"), std::string::npos)
      << f.message;
}

TEST_F(LocalElasticAgentTest, AFunctionThatThrowsFailsWithItsTypeAndMessage) {
  LocalElasticAgent agent(spec(FunctionCall{"throw", {}}, 1));
  RunResult r = agent.run();
  ASSERT_TRUE(r.is_failed());
  EXPECT_EQ(r.failures.at(0).exitcode, 1);
  EXPECT_EQ(r.failures.at(0).message, "std::invalid_argument: bad input");
}

TEST_F(LocalElasticAgentTest, RestartsAfterAFailureAndKeepsEveryAttemptsLogs) {
  auto s = spec(FunctionCall{"fail_first_attempt", {}}, 2);
  s.max_restarts = 2;
  s.redirects = StdSpec{.all = Std::kAll};
  LocalElasticAgent agent(std::move(s));
  RunResult r = agent.run();
  ASSERT_EQ(r.state, WorkerState::kSucceeded);
  EXPECT_EQ(r.return_values.at(1), "ok");
  EXPECT_EQ(agent.remaining_restarts(), 1);
  fs::path run = agent.run_log_dir();
  EXPECT_TRUE(fs::exists(run / "attempt_0" / "1" / "stderr.log"));
  EXPECT_TRUE(fs::exists(run / "attempt_1" / "1" / "stderr.log"));
  std::ifstream err(run / "attempt_0" / "1" / "stderr.log");
  std::string text((std::istreambuf_iterator<char>(err)), {});
  EXPECT_NE(text.find("failing on purpose"), std::string::npos) << text;
}

TEST_F(LocalElasticAgentTest, GivesUpWhenRestartsRunOut) {
  auto s = spec(sh("exit 3"), 2);
  s.max_restarts = 2;
  LocalElasticAgent agent(std::move(s));
  RunResult r = agent.run();
  ASSERT_TRUE(r.is_failed());
  EXPECT_EQ(agent.remaining_restarts(), 0);
  ASSERT_FALSE(r.failures.empty());
  for (const auto& [rank, f] : r.failures) {
    EXPECT_EQ(f.exitcode, 3) << "rank " << rank;
  }
}

TEST_F(LocalElasticAgentTest, RedirectsAndTeeWriteTheLogFiles) {
  auto s = spec(sh("echo out-$LOCAL_RANK; echo err-$LOCAL_RANK >&2"), 2);
  s.redirects = parse_std_spec("0:1", "-r");
  s.tee = parse_std_spec("1:3", "-t");
  LocalElasticAgent agent(std::move(s));
  ASSERT_EQ(agent.run().state, WorkerState::kSucceeded);
  fs::path a = fs::path(agent.run_log_dir()) / "attempt_0";
  auto read = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  EXPECT_EQ(read(a / "0" / "stdout.log"), "out-0\n");
  EXPECT_FALSE(fs::exists(a / "0" / "stderr.log"));
  EXPECT_EQ(read(a / "1" / "stdout.log"), "out-1\n");
  EXPECT_EQ(read(a / "1" / "stderr.log"), "err-1\n");
}

TEST_F(LocalElasticAgentTest, StoppingKillsWorkersAndTheirChildren) {
  // Each worker starts a grandchild that ignores SIGTERM, records both
  // pids, and waits.
  std::string script = "trap '' TERM; sleep 1000 & echo $! > " +
                       (dir_ / "child").string() + ".$LOCAL_RANK; echo $$ > " +
                       (dir_ / "worker").string() + ".$LOCAL_RANK; wait";
  auto s = spec(sh(script), 2);
  s.shutdown_grace = 200ms;
  LocalElasticAgent agent(std::move(s));
  auto run = std::async(std::launch::async, [&] { return agent.run(); });
  // Wait for both workers to report in: each writes its own pid last.
  auto reported = [&] {
    for (int r = 0; r < 2; ++r) {
      auto file = dir_ / ("worker." + std::to_string(r));
      if (test::read_pid(file.string()) <= 0) {
        return false;
      }
    }
    return true;
  };
  bool ended = false;
  const bool in = test::eventually([&] {
                    ended = run.wait_for(0s) == std::future_status::ready;
                    return ended || reported();
                  }) &&
                  !ended;
  ASSERT_FALSE(ended) << "agent ended early";
  agent.request_stop(SIGTERM);
  ASSERT_TRUE(in) << "the workers did not report in within 30 s";
  ASSERT_EQ(run.wait_for(20s), std::future_status::ready);
  EXPECT_THROW(run.get(), SignalException);
  for (int r = 0; r < 2; ++r) {
    for (const char* what : {"child.", "worker."}) {
      pid_t pid = test::read_pid((dir_ / (what + std::to_string(r))).string());
      ASSERT_GT(pid, 0);
      EXPECT_TRUE(test::process_gone_within(pid, 5s))
          << what << r << " pid " << pid;
    }
  }
}

TEST_F(LocalElasticAgentTest, AnUnknownExecutableIsAClearError) {
  LocalElasticAgent agent(spec(Command{{"no-such-program-tide"}}, 1));
  EXPECT_THROW(agent.run(), InvalidArgument);
}

TEST_F(LocalElasticAgentTest, InvalidSpecsAreRejected) {
  auto s = spec(sh("true"), 0);
  EXPECT_THROW(LocalElasticAgent{s}, InvalidArgument);
  auto f = spec(FunctionCall{"not-registered", {}}, 1);
  EXPECT_THROW(LocalElasticAgent{f}, InvalidArgument);
  auto n = spec(sh("true"), 1);
  n.rdzv_handler = nullptr;
  EXPECT_THROW(LocalElasticAgent{n}, InvalidArgument);
}

TEST(StdSpecTest, ParsesTorchsSyntax) {
  EXPECT_EQ(parse_std_spec("3", "-r").all, Std::kAll);
  auto s = parse_std_spec("0:1,1:2", "-t");
  EXPECT_EQ(s.for_rank(0), Std::kOut);
  EXPECT_EQ(s.for_rank(1), Std::kErr);
  EXPECT_EQ(s.for_rank(2), Std::kNone);
  EXPECT_THROW(parse_std_spec("4", "-r"), InvalidArgument);
  EXPECT_THROW(parse_std_spec("0:x", "-r"), InvalidArgument);
}

}  // namespace
}  // namespace tide::agent
