// tiderun as a user runs it: flags, exit codes, the failure summary, signals
// and what is left in the process table afterwards.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <regex>
#include <set>

#include <gtest/gtest.h>

#include "support/process_checks.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace tide {
namespace {

using namespace std::chrono_literals;
using test::Subprocess;
namespace fs = std::filesystem;

class TiderunTest : public ::testing::Test {
 protected:
  // A shell script as the entrypoint.
  std::string script(const std::string& name, const std::string& body) {
    fs::path p = dir_ / name;
    std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
    fs::permissions(p, fs::perms::owner_all);
    return p.string();
  }

  std::vector<std::string> tiderun(std::vector<std::string> args) {
    args.insert(
        args.begin(), {TIDERUN_BIN, "--log-dir", (dir_ / "logs").string()});
    return args;
  }

  // Runs to the end; returns (exit status, output).
  std::pair<int, std::string> run(
      std::vector<std::string> args,
      test::SubprocessOptions opts = {.merge_stderr = true}) {
    Subprocess p(tiderun(std::move(args)), opts);
    std::string out = p.read_all(60s);
    auto status = p.wait(30s);
    EXPECT_TRUE(status.has_value()) << out;
    return {status ? *status : -1, out};
  }

  static int exit_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
};

TEST_F(TiderunTest, RunsWorkersAndExitsZero) {
  auto s = script("w.sh", "echo \"hello from $RANK of $WORLD_SIZE\"");
  auto [status, out] = run({"--standalone", "--nproc-per-node=3", s});
  EXPECT_EQ(exit_code(status), 0) << out;
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(
        out.find("hello from " + std::to_string(r) + " of 3"),
        std::string::npos)
        << out;
  }
}

// The agent hosting the c10d store raises its soft descriptor limit (the
// store holds a socket per node); its workers get the limit tiderun was
// started with, as a program that uses select() expects.
TEST_F(TiderunTest, WorkersGetTheDescriptorLimitTiderunStartedWith) {
  rlimit lim{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max <= 300) {
    GTEST_SKIP() << "the hard descriptor limit is too low to tell";
  }
  std::string hard = lim.rlim_max == RLIM_INFINITY
                         ? "unlimited"
                         : std::to_string(lim.rlim_max);
  auto s = script("w.sh", "echo \"limit=$(ulimit -n)\"");
  auto args = tiderun({"--standalone", "--nproc-per-node=2", s});
  args.insert(args.begin(), {"/usr/bin/prlimit", "--nofile=300:" + hard});
  Subprocess p(args, {.merge_stderr = true});
  std::string out = p.read_all(60s);
  auto status = p.wait(30s);
  ASSERT_TRUE(status.has_value()) << out;
  EXPECT_EQ(exit_code(*status), 0) << out;
  EXPECT_NE(out.find("limit=300"), std::string::npos) << out;
  EXPECT_EQ(out.find("limit=" + hard), std::string::npos) << out;
}

TEST_F(TiderunTest, AcceptsUnderscoreSpellingsAndPetVariables) {
  auto s =
      script("w.sh", "echo \"rank=$RANK restarts=$TORCHELASTIC_MAX_RESTARTS\"");
  auto [status, out] =
      run({"--standalone", s},
          {.env = {{"PET_NPROC_PER_NODE", "2"}, {"PET_MAX_RESTARTS", "4"}},
           .merge_stderr = true});
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_NE(out.find("rank=1 restarts=4"), std::string::npos) << out;
  auto [status2, out2] =
      run({"--standalone", "--nproc_per_node=2", "--max_restarts=1", s});
  EXPECT_EQ(exit_code(status2), 0) << out2;
  EXPECT_NE(out2.find("rank=1 restarts=1"), std::string::npos) << out2;
}

TEST_F(TiderunTest, BadFlagsExitTwoWithUsage) {
  for (std::vector<std::string> args : {
           std::vector<std::string>{"--no-such-flag", "x"},
           {"--nnodes=3:1", "x"},
           {"--nproc-per-node=zero", "x"},
           {"--redirects=7", "x"},
           {"--rdzv-conf=novalue", "x"},
           {"-m", "--no-python", "x"},
           {"--standalone"},
       }) {
    auto [status, out] = run(args);
    EXPECT_EQ(exit_code(status), 2) << args[0] << "\n" << out;
    EXPECT_NE(out.find("error"), std::string::npos) << out;
  }
  auto [status, out] = run({"--version"});
  EXPECT_EQ(exit_code(status), 0);
  EXPECT_NE(out.find("tiderun "), std::string::npos);
}

// TIDE_LOG_LEVEL (else torchrun's LOGLEVEL) in any case; a value that is no
// level is said, and logging stays at info instead of going silent.
TEST_F(TiderunTest, TheLogLevelIsReadInAnyCaseAndABadOneIsReported) {
  auto s = script("w.sh", "true");
  auto with = [&](const char* var, const char* value) {
    return run(
        {"--standalone", s}, {.env = {{var, value}}, .merge_stderr = true});
  };
  for (const char* var : {"TIDE_LOG_LEVEL", "LOGLEVEL"}) {
    auto [status, out] = with(var, "DEBUG");
    EXPECT_EQ(exit_code(status), 0) << out;
    EXPECT_NE(
        out.find("[debug] [default] rendezvous through"), std::string::npos)
        << var << "\n"
        << out;
  }
  auto [status, out] = with("TIDE_LOG_LEVEL", "WARNING");
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_EQ(out.find("[info]"), std::string::npos) << out;
  auto [status2, out2] = with("TIDE_LOG_LEVEL", "loud");
  EXPECT_EQ(exit_code(status2), 0) << out2;
  EXPECT_NE(
      out2.find("TIDE_LOG_LEVEL=loud is not a log level"), std::string::npos)
      << out2;
  EXPECT_NE(out2.find("[info]"), std::string::npos) << out2;
}

TEST_F(TiderunTest, AFailurePrintsTorchsSummaryAndExitsOne) {
  auto s = script("w.sh", "[ \"$LOCAL_RANK\" = 1 ] && exit 3; sleep 100");
  fs::path error_file = dir_ / "launcher_error.json";
  auto [status, out] =
      run({"--standalone", "--nproc-per-node=2", s},
          {.env = {{"TORCHELASTIC_ERROR_FILE", error_file.string()}},
           .merge_stderr = true});
  EXPECT_EQ(exit_code(status), 1) << out;
  for (const char* piece : {
           "w.sh FAILED",
           "Failures:\n  <NO_OTHER_FAILURES>",
           "Root Cause (first observed failure):\n[0]:",
           "  rank      : 1 (local_rank: 1)",
           "  exitcode  : 3 (pid: ",
           "  error_file: <N/A>",
           "  traceback : To enable traceback see: "
           "https://pytorch.org/docs/stable/elastic/errors.html",
       }) {
    EXPECT_NE(out.find(piece), std::string::npos) << piece << "\n" << out;
  }
  EXPECT_TRUE(fs::exists(error_file));
}

TEST_F(TiderunTest, TeePrefixesConsoleLinesAndTheFilterHidesOtherRanks) {
  auto s = script("w.sh", "echo line-$LOCAL_RANK");
  auto [status, out] = run(
      {"--standalone",
       "--nproc-per-node=3",
       "--tee=3",
       "--local-ranks-filter=0,2",
       s});
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_NE(out.find("[default0]:line-0"), std::string::npos) << out;
  EXPECT_NE(out.find("[default2]:line-2"), std::string::npos) << out;
  EXPECT_EQ(out.find("line-1"), std::string::npos) << out;
}

TEST_F(TiderunTest, TwentyStandaloneJobsAtOnceNeverCollide) {
  // All twenty run at the same time: each worker reports its port, then
  // waits on its own FIFO until every job has reported (a finished job's
  // port could otherwise be handed to a later one).
  constexpr int kJobs = 20;
  auto s =
      script("w.sh", "echo port=$MASTER_PORT\nread line < \"$GO.$LOCAL_RANK\"");
  std::vector<std::unique_ptr<Subprocess>> jobs;
  for (int i = 0; i < kJobs; ++i) {
    std::string go = (dir_ / ("go" + std::to_string(i))).string();
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(::mkfifo((go + "." + std::to_string(r)).c_str(), 0600), 0);
    }
    jobs.push_back(std::make_unique<Subprocess>(
        tiderun({"--standalone", "--nproc-per-node=2", s}),
        test::SubprocessOptions{.env = {{"GO", go}}, .merge_stderr = true}));
  }
  std::set<std::string> ports;
  for (auto& job : jobs) {
    std::string seen;
    while (auto line = job->read_line(60s)) {
      seen += *line + "\n";
      if (line->rfind("port=", 0) == 0) {
        ports.insert(*line);
        break;
      }
    }
    ASSERT_NE(seen.find("port="), std::string::npos) << seen;
  }
  EXPECT_EQ(ports.size(), static_cast<size_t>(kJobs));
  for (int i = 0; i < kJobs; ++i) {
    for (int r = 0; r < 2; ++r) {
      std::ofstream(dir_ / ("go" + std::to_string(i) + "." + std::to_string(r)))
          << "go\n";
    }
  }
  for (auto& job : jobs) {
    std::string out = job->read_all(60s);
    auto status = job->wait(30s);
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(exit_code(*status), 0) << out;
  }
}

// A worker that reports the signal it gets and leaves a grandchild behind.
std::string signal_worker(const fs::path& dir) {
  return "echo $$ > " + (dir / "worker").string() + ".$LOCAL_RANK\n" +
         "sleep 1000 & echo $! > " + (dir / "child").string() +
         ".$LOCAL_RANK\n" +
         "for s in INT TERM HUP QUIT USR1; do trap \"echo $s > " +
         (dir / "got").string() + ".$LOCAL_RANK; exit 1\" $s; done\n" +
         "echo ready\nwhile :; do wait; done";
}

void wait_ready(Subprocess& p, int workers) {
  int ready = 0;
  while (ready < workers) {
    auto line = p.read_line(20s);
    ASSERT_TRUE(line.has_value()) << "workers did not start";
    if (line->find("ready") != std::string::npos) {
      ++ready;
    }
  }
}

void expect_all_gone(const fs::path& dir, int workers) {
  for (int r = 0; r < workers; ++r) {
    for (const char* what : {"worker.", "child."}) {
      pid_t pid = test::read_pid((dir / (what + std::to_string(r))).string());
      ASSERT_GT(pid, 0) << what << r;
      EXPECT_TRUE(test::process_gone_within(pid, 10s))
          << what << r << " pid " << pid;
    }
  }
}

TEST_F(TiderunTest, SignalsAreForwardedAndNothingIsLeftBehind) {
  auto s = script("w.sh", signal_worker(dir_));
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    Subprocess p(
        tiderun({"--standalone", "--nproc-per-node=2", s}),
        {.merge_stderr = true});
    wait_ready(p, 2);
    p.signal(sig);
    std::string out = p.read_all(30s);
    auto status = p.wait(30s);
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(exit_code(*status), 1) << out;
    std::string name = std::string(sigabbrev_np(sig));
    for (int r = 0; r < 2; ++r) {
      std::ifstream got(dir_ / ("got." + std::to_string(r)));
      std::string received;
      got >> received;
      EXPECT_EQ(received, name) << "rank " << r;
    }
    expect_all_gone(dir_, 2);
  }
}

TEST_F(TiderunTest, ExtraSignalsByFlag) {
  auto s = script("w.sh", signal_worker(dir_));
  Subprocess p(
      tiderun({"--standalone", "--signals-to-handle=SIGTERM,SIGUSR1", s}),
      {.merge_stderr = true});
  wait_ready(p, 1);
  p.signal(SIGUSR1);
  std::string out = p.read_all(30s);
  ASSERT_TRUE(p.wait(30s).has_value()) << out;
  std::ifstream got(dir_ / "got.0");
  std::string received;
  got >> received;
  EXPECT_EQ(received, "USR1");
  expect_all_gone(dir_, 1);
}

TEST_F(TiderunTest, AWorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  auto s =
      script("w.sh", "trap '' TERM\necho ready\nwhile :; do sleep 1; done");
  Subprocess p(
      tiderun({"--standalone", "--shutdown-timeout=0.3", s}),
      {.merge_stderr = true});
  wait_ready(p, 1);
  p.signal(SIGTERM);
  std::string out = p.read_all(30s);
  auto status = p.wait(30s);
  ASSERT_TRUE(status.has_value()) << out;
  EXPECT_NE(out.find("sending SIGKILL"), std::string::npos) << out;
}

TEST_F(TiderunTest, KillingTiderunWithSigkillLeavesNoWorkerOrChild) {
  auto s = script("w.sh", signal_worker(dir_));
  Subprocess p(
      tiderun({"--standalone", "--nproc-per-node=2", s}),
      {.merge_stderr = true});
  wait_ready(p, 2);
  p.signal(SIGKILL);
  ASSERT_TRUE(p.wait(10s).has_value());
  expect_all_gone(dir_, 2);
}

TEST_F(TiderunTest, KillingAWorkerRestartsTheGroupAndLeavesNothingBehind) {
  auto s = script(
      "w.sh",
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 1 ]; then exit 0; fi\n" +
          signal_worker(dir_));
  Subprocess p(
      tiderun({"--standalone", "--nproc-per-node=2", "--max-restarts=1", s}),
      {.merge_stderr = true});
  wait_ready(p, 2);
  ::kill(test::read_pid((dir_ / "worker.1").string()), SIGKILL);
  std::string out = p.read_all(30s);
  auto status = p.wait(30s);
  ASSERT_TRUE(status.has_value()) << out;
  EXPECT_EQ(exit_code(*status), 0) << out;
  EXPECT_NE(out.find("restarting the worker group"), std::string::npos) << out;
  expect_all_gone(dir_, 2);
}

TEST_F(TiderunTest, ACppWorkerOverrunningItsTimerIsKilledAndRestarted) {
  auto [status, out] = run(
      {"--standalone",
       "--nproc-per-node=2",
       "--max-restarts=1",
       "--file-timer",
       TIDE_TIMER_WORKER,
       "--hang-once"});
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_NE(out.find("overran timer \"step\""), std::string::npos) << out;
  EXPECT_NE(out.find("restarting the worker group"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 0: 5 steps done"), std::string::npos) << out;
}

TEST_F(TiderunTest, ATimerExpiryIsTheFailureSummarysRootCause) {
  auto [status, out] = run(
      {"--standalone", "--file-timer", TIDE_TIMER_WORKER, "--hang-once"},
      {.env = {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}}, .merge_stderr = true});
  EXPECT_EQ(exit_code(status), 1) << out;
  EXPECT_NE(out.find("exitcode  : -9"), std::string::npos) << out;
  EXPECT_NE(
      out.find("traceback : expiration timer \"step\" expired: the worker was"),
      std::string::npos)
      << out;
}

TEST_F(TiderunTest, AWorkersChildArmsATimerAndIsKilledWhileTheWorkerLivesOn) {
  // A data loader's shape: the worker's own child arms a timer for itself
  // and hangs; the server kills the child, and the worker sees it die and
  // finishes its work.
  auto s = script(
      "w.sh",
      std::string("\"") + TIDE_TIMER_CHILD +
          "\" file \"$TORCHELASTIC_TIMER_FILE\" child_step 0.05 9 &\n"
          "wait $!\n"
          "echo \"child ended with $?\"");
  auto [status, out] =
      run({"--standalone", "--max-restarts=0", "--file-timer", s});
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_NE(out.find("child ended with 137"), std::string::npos) << out;
  EXPECT_NE(out.find("overran timer \"child_step\""), std::string::npos) << out;
  EXPECT_EQ(out.find("refusing a timer"), std::string::npos) << out;
}

TEST_F(TiderunTest, TheTimerFileComesFromTheEnvironmentAsInTorch) {
  fs::path fifo = dir_ / "my_timer";
  auto s = script("w.sh", "echo timer=$TORCHELASTIC_TIMER_FILE");
  auto [status, out] =
      run({"--standalone", s},
          {.env =
               {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"},
                {"TORCHELASTIC_TIMER_FILE", fifo.string()}},
           .merge_stderr = true});
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_NE(out.find("timer=" + fifo.string()), std::string::npos) << out;
}

TEST_F(
    TiderunTest, AnImmediateFailureNeverStallsTheStopOfWorkersStillStarting) {
  // Rank 0 fails at once, while the other workers may still be between
  // fork and exec; stopping them must not wait for the grace period.
  auto s = script(
      "w.sh",
      "[ \"$TORCHELASTIC_RESTART_COUNT\" = 1 ] && exit 0\n"
      "[ \"$LOCAL_RANK\" = 0 ] && exit 1\n"
      "exec sleep 100");
  for (int i = 0; i < 5; ++i) {
    Subprocess p(
        tiderun(
            {"--standalone",
             "--nproc-per-node=8",
             "--max-restarts=1",
             "--shutdown-timeout=60",
             s}),
        {.merge_stderr = true});
    // A stall waits out the 60 s grace: a run and its exit within 30 s on a
    // loaded machine are no stall.
    std::string out = p.read_all(20s);
    auto status = p.wait(10s);
    ASSERT_TRUE(status.has_value()) << "run " << i << " stalled:\n" << out;
    EXPECT_EQ(exit_code(*status), 0) << out;
    EXPECT_EQ(out.find("sending SIGKILL"), std::string::npos) << out;
  }
}

// A stand-in for a torch package on PYTHONPATH: its version file and a
// TCPStore that fails as a torch built without libuv does when asked for it
// (torch >= 2.4's default); importing torch.distributed leaves a line in
// `asked`, so a test sees whether tiderun imported it.
void fake_torch(
    const fs::path& site,
    const std::string& version,
    bool has_libuv,
    const fs::path& asked) {
  fs::create_directories(site / "torch/distributed");
  std::ofstream(site / "torch/__init__.py") << "";
  std::ofstream(site / "torch/version.py")
      << "__version__ = '" << version << "'\n";
  std::ofstream(site / "torch/distributed/__init__.py")
      << "open(" << std::quoted(asked.string()) << ", 'a').write('asked\\n')\n"
      << "class TCPStore:\n"
      << "    def __init__(self, *args, use_libuv=True, **kwargs):\n"
      << "        if use_libuv and not " << (has_libuv ? "True" : "False")
      << ":\n"
      << "            raise RuntimeError('use_libuv was requested but PyTorch "
         "was build without libuv support')\n";
}

// Each worker says what store it was given, in one write (two workers'
// lines never mix); rank 0 fails on attempt 0, once rank 1 has said it (a
// file rank 1 makes after its line).
constexpr const char* kStoreReport =
    "import os, sys, time\n"
    "e = os.environ\n"
    "attempt = e['TORCHELASTIC_RESTART_COUNT']\n"
    "os.write(1, f\"attempt={attempt} rank={e['RANK']} "
    "libuv={e.get('USE_LIBUV', 'unset')} "
    "agent_store={e['TORCHELASTIC_USE_AGENT_STORE']} "
    "port={e['MASTER_PORT']}\\n\".encode())\n"
    "said = os.path.join(os.path.dirname(__file__), 'said_' + attempt)\n"
    "if e['RANK'] == '1':\n"
    "    open(said, 'w').close()\n"
    "elif attempt == '0':\n"
    "    while not os.path.exists(said):\n"
    "        time.sleep(0.01)\n"
    "    sys.exit(1)\n";

// The MASTER_PORT each "attempt=N rank=R" line of `out` names.
std::map<std::string, std::string> store_ports(const std::string& out) {
  std::map<std::string, std::string> ports;
  std::regex line(
      "(attempt=[0-9]+ rank=[0-9]+) libuv=[^ ]+ agent_store=[^ ]+ "
      "port=([0-9]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line);
       it != std::sregex_iterator();
       ++it) {
    ports[(*it)[1].str()] = (*it)[2].str();
  }
  return ports;
}

// Debian's torch 2.6 asks for libuv by default and lacks it: no store a
// worker makes under the agent's store can work. tiderun asks that torch
// once, and its workers host their own store without libuv, at a new port
// each attempt.
TEST_F(TiderunTest, WorkersOfATorchWithoutLibuvHostTheirOwnStoreEachAttempt) {
  fs::path asked = dir_ / "asked";
  fake_torch(dir_ / "site", "2.6.0+debian", false, asked);
  std::ofstream(dir_ / "w.py") << kStoreReport;
  test::SubprocessOptions opts{
      .env =
          {{"PYTHONPATH", (dir_ / "site").string()},
           {"XDG_CACHE_HOME", (dir_ / "cache").string()}},
      .merge_stderr = true};
  for (int run_no = 0; run_no < 2; ++run_no) {
    fs::remove(dir_ / "said_0");
    auto [status, out] =
        run({"--standalone",
             "--nproc-per-node=2",
             "--max-restarts=1",
             (dir_ / "w.py").string()},
            opts);
    ASSERT_EQ(exit_code(status), 0) << out;
    EXPECT_NE(
        out.find(
            "torch 2.6.0+debian (" + (dir_ / "site/torch").string() +
            ") asks for libuv by default and was built without it: "
            "workers get USE_LIBUV=0; rank 0's worker hosts"),
        std::string::npos)
        << out;
    auto ports = store_ports(out);
    ASSERT_EQ(ports.size(), 4u) << out;
    EXPECT_EQ(ports["attempt=0 rank=0"], ports["attempt=0 rank=1"]) << out;
    EXPECT_EQ(ports["attempt=1 rank=0"], ports["attempt=1 rank=1"]) << out;
    EXPECT_NE(ports["attempt=0 rank=0"], ports["attempt=1 rank=0"]) << out;
    EXPECT_NE(
        out.find("rank=1 libuv=0 agent_store=False port="), std::string::npos)
        << out;
    EXPECT_EQ(out.find("agent_store=True"), std::string::npos) << out;
  }
  // Asked in the first run only; the second read the answer kept.
  std::ifstream in(asked);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "asked\n");
  EXPECT_FALSE(fs::is_empty(dir_ / "cache/tide"));
}

// A torch with libuv, and a torch older than 2.4 (no libuv by default; not
// even asked): the workers use the agent's store as they always did.
TEST_F(TiderunTest, WorkersOfATorchThatNeedsNothingUseTheAgentsStore) {
  for (auto [version, has_libuv] :
       {std::pair{"2.6.0", true}, std::pair{"1.13.1", false}}) {
    fs::path site = dir_ / version;
    fs::path asked = dir_ / (std::string(version) + ".asked");
    fake_torch(site, version, has_libuv, asked);
    fs::create_directories(site / "job");
    std::ofstream(site / "job/w.py") << kStoreReport;
    auto [status, out] =
        run({"--standalone",
             "--nproc-per-node=2",
             "--max-restarts=1",
             (site / "job/w.py").string()},
            {.env =
                 {{"PYTHONPATH", site.string()},
                  {"XDG_CACHE_HOME", (dir_ / "cache").string()}},
             .merge_stderr = true});
    ASSERT_EQ(exit_code(status), 0) << version << "\n" << out;
    EXPECT_EQ(out.find("asks for libuv"), std::string::npos) << out;
    auto ports = store_ports(out);
    ASSERT_EQ(ports.size(), 4u) << out;
    EXPECT_EQ(ports["attempt=0 rank=0"], ports["attempt=1 rank=0"]) << out;
    EXPECT_NE(
        out.find("rank=1 libuv=unset agent_store=True"), std::string::npos)
        << out;
    EXPECT_EQ(fs::exists(asked), has_libuv) << version;
  }
}

TEST_F(TiderunTest, TheRpcHelloExampleRunsUnderTiderun) {
  // examples/rpc_hello.cpp: typed calls between three processes, no
  // libtorch; rank 0 exits 1 on a wrong answer.
  auto [status, out] = run(
      {"--standalone", "--nproc-per-node=3", "--no-python", RPC_HELLO_EXAMPLE});
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_NE(
      out.find("worker2: add(2, 40) = 42; hello driver from worker2"),
      std::string::npos)
      << out;
}

TEST_F(TiderunTest, TheRRefEmbeddingServerExampleTrainsThroughProxies) {
  // examples/rref_embedding_server.cpp: a table made with remote(), its
  // RRef passed to another trainer, proxies only; trainer1 exits 1 unless
  // the table's norm fell. The graceful shutdown deletes every RRef.
  auto [status, out] = run(
      {"--standalone", "--nproc-per-node=3", "--no-python", RREF_PS_EXAMPLE});
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_NE(
      out.find("40 steps from 2 trainers on one table owned by 'ps'"),
      std::string::npos)
      << out;
  EXPECT_EQ(out.find("leak"), std::string::npos) << out;
}

// The examples with tensors, where the build has them (not the sanitizer
// builds, nor one without libtorch).
#ifdef MODEL_PARALLEL_EXAMPLE
TEST_F(TiderunTest, TheRemoteModulePipelineMatchesTheLocalComputation) {
  // examples/remote_module_pipeline.cpp: two RemoteModule stages on two
  // workers, one passed to the other in an rpc; rank 0 exits 1 unless the
  // output equals the pipeline rebuilt from remote_parameters().
  auto [status, out] = run(
      {"--standalone",
       "--nproc-per-node=3",
       "--no-python",
       REMOTE_MODULE_EXAMPLE});
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_NE(
      out.find("pipeline over worker1 and worker2: output 5x3, equal to the "
               "local computation"),
      std::string::npos)
      << out;
}

TEST_F(TiderunTest, TheModelParallelExampleTrainsLikeTheLocalModel) {
  // examples/model_parallel_train.cpp: a local layer and a RemoteModule,
  // distributed backward and optimizer, next to the same model trained
  // locally; rank 0 exits 1 unless it converged to the local model's loss.
  auto [status, out] = run(
      {"--standalone",
       "--nproc-per-node=2",
       "--no-python",
       MODEL_PARALLEL_EXAMPLE});
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_NE(out.find("trained over trainer and worker1"), std::string::npos)
      << out;
  EXPECT_NE(
      out.find("converged, equal to the local model's"), std::string::npos)
      << out;
}

TEST_F(TiderunTest, TheRpcParameterServerExampleTrainsUnderTiderun) {
  // examples/rpc_parameter_server.cpp: init_rpc through the agent's store
  // (env://, TORCHELASTIC_USE_AGENT_STORE), two trainers, a batch of async
  // calls, a graceful shutdown; rank 0 exits 1 unless the weights converged.
  auto [status, out] = run(
      {"--standalone", "--nproc-per-node=3", "--no-python", RPC_PS_EXAMPLE});
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_NE(out.find("100 async calls answered"), std::string::npos) << out;
  EXPECT_NE(out.find("100 updates from 2 trainers"), std::string::npos) << out;
}
#endif  // MODEL_PARALLEL_EXAMPLE

}  // namespace
}  // namespace tide
