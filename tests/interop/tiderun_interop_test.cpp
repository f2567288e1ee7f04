// tiderun as a drop-in for torchrun, with Debian's real PyTorch 1.13
// (python3-torch) in the workers: a DDP script written for torchrun runs
// unchanged, a failing rank restarts the group or ends the run with torch's
// failure summary, and workers see every variable torchrun gives them.
// Where torchrun itself is the reference it runs too, through
// bench/peers/torchrun.py (stock torchrun 1.13 crashes on Python
// 3.11; 1.13 only takes underscore flag spellings).
//
// Every launcher runs with an explicit, small environment (PYTHON_EXEC is
// /usr/bin/python3: the python3 first on PATH may lack torch), in its own
// process group, with its stdout and stderr in files of a temporary
// directory. This process is a child subreaper: whatever a launcher leaves
// behind is re-parented here, reported, killed and reaped.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "interop/torch_peer.h"
#include "net/socket.h"
#include "support/temp_dir.h"

namespace tide::launcher {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using std::chrono::milliseconds;
using test::Fd;
using test::kSystemPython;

// Importing torch takes a few seconds, many more on a loaded machine; a
// test runs at most two launchers within ctest's 180 s.
constexpr milliseconds kLaunchTimeout = 75s;

constexpr const char* kDdpScript = TIDE_INTEROP_DIR "/ddp_train.py";
const std::string kTimerScript =
    std::string(TIDE_INTEROP_DIR) + "/torch_timer_worker.py";
constexpr const char* kPrintEnvScript = TIDE_INTEROP_DIR "/print_env.py";
constexpr const char* kInitMethodScript =
    TIDE_INTEROP_DIR "/init_method_worker.py";
constexpr const char* kAttemptStoreScript =
    TIDE_INTEROP_DIR "/attempt_store_worker.py";
constexpr const char* kInjectedFailure =
    "RuntimeError: injected failure: rank 1 on attempt 0";

using Env = std::map<std::string, std::string>;

// What torch 1.13's torchrun sets for each worker (reference §1.3).
const std::vector<std::string> kTorch113WorkerVariables = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
};

// Variables whose values may differ between the launchers, and why. Every
// other variable torchrun gives must have the same value under tiderun.
const std::map<std::string, std::string> kExpectedToDiffer = {
    {"MASTER_ADDR",
     "torch 1.13 c10d publishes the agent's FQDN; tiderun's agent store "
     "listens on 127.0.0.1"},
    {"MASTER_PORT", "a free port, chosen per run"},
    {"TORCHELASTIC_RUN_ID", "a new id per run"},
    {"TORCHELASTIC_ERROR_FILE", "under <log_dir>/<run id>_<random>/"},
    {"TORCHELASTIC_USE_AGENT_STORE",
     "torch 1.13 c10d: False (worker rank 0 hosts a store); tiderun: True "
     "(workers use the agent's store, as torch 2.x's c10d does)"},
};

using test::TempDir;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
  }
  return lines;
}

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) {
    out += l + "\n";
  }
  return out;
}

// The processes re-parented to this one (it is a child subreaper) that were
// still running, as "pid: cmdline"; all of them are killed and reaped.
std::vector<std::string> kill_and_reap_orphans() {
  std::vector<std::string> alive;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    std::string stat = read_file(entry.path() / "stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos) {
      continue;
    }
    char state = 0;
    int ppid = 0;
    std::istringstream fields(stat.substr(close + 1));
    if (!(fields >> state >> ppid) || ppid != ::getpid()) {
      continue;
    }
    pid_t pid = std::stoi(name);
    if (state != 'Z') {
      std::string cmdline = read_file(entry.path() / "cmdline");
      std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
      alive.push_back(name + ": " + cmdline);
    }
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  return alive;
}

// How one launcher run ended, and what it printed.
struct Outcome {
  std::string command;
  bool timed_out = false;
  int exit_code = -1;  // 128 + N when killed by signal N
  std::string out;
  std::string err;
  // Processes still running after it exited (they are killed by now).
  std::vector<std::string> leftovers;

  std::string describe() const {
    std::string s = "`" + command + "` ";
    s += timed_out ? "did not exit in time (killed)"
                   : "exited " + std::to_string(exit_code);
    for (const auto& l : leftovers) {
      s += "\n  left running: " + l;
    }
    return s + "\n--- stdout ---\n" + out + "--- stderr ---\n" + err +
           "--- end ---";
  }
};

// A child running argv with exactly env, leading a new process group, stdin
// from /dev/null, stdout and stderr to files. The destructor SIGKILLs the
// group and reaps the leader unless it was reaped already.
class Child {
 public:
  Child(
      const std::vector<std::string>& argv,
      const Env& env,
      const fs::path& out,
      const fs::path& err) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(
        &actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(
        &actions,
        STDOUT_FILENO,
        out.c_str(),
        O_WRONLY | O_CREAT | O_TRUNC,
        0644);
    posix_spawn_file_actions_addopen(
        &actions,
        STDERR_FILENO,
        err.c_str(),
        O_WRONLY | O_CREAT | O_TRUNC,
        0644);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Its own group, so a hung launcher goes down with its workers; default
    // signal handling (this test ignores SIGPIPE), nothing blocked.
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(
        &attr,
        POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

    std::vector<char*> args;
    for (const auto& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : env) {
      env_strings.push_back(k + "=" + v);
    }
    std::vector<char*> envp;
    for (auto& e : env_strings) {
      envp.push_back(e.data());
    }
    envp.push_back(nullptr);
    int rc = ::posix_spawn(
        &pid_, args[0], &actions, &attr, args.data(), envp.data());
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      throw std::runtime_error(
          "cannot run " + argv[0] + ": " + std::strerror(rc));
    }
  }
  ~Child() {
    if (!reaped_) {
      ::killpg(pid_, SIGKILL);
      reap();
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // Its exit code (128 + N for signal N) once it exits within timeout; else
  // nullopt, having killed its group and reaped it.
  std::optional<int> wait(milliseconds timeout) {
    // A pidfd becomes readable when the child exits.
    Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    if (pidfd.get() < 0) {
      throw std::runtime_error(
          "pidfd_open failed: " + std::string(std::strerror(errno)));
    }
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{.fd = pidfd.get(), .events = POLLIN, .revents = 0};
      int r =
          ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      if (r < 0 && errno == EINTR) {
        continue;
      }
      if (r <= 0) {
        ::killpg(pid_, SIGKILL);
        reap();
        return std::nullopt;
      }
      int st = reap();
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
  }

 private:
  int reap() {
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return st;
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
};

// Runs argv with env until it exits or timeout passes; name names its
// output files in dir.
Outcome run(
    const std::vector<std::string>& argv,
    const Env& env,
    const fs::path& dir,
    const std::string& name,
    milliseconds timeout = kLaunchTimeout) {
  // Orphans of the launcher (workers, their children) come here, not to
  // init, so none outlives the test unnoticed.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  Outcome r;
  for (const auto& a : argv) {
    r.command += (r.command.empty() ? "" : " ") + a;
  }
  fs::path out = dir / (name + ".stdout");
  fs::path err = dir / (name + ".stderr");
  {
    Child child(argv, env, out, err);
    std::optional<int> code = child.wait(timeout);
    r.timed_out = !code;
    r.exit_code = code.value_or(-1);
  }
  r.leftovers = kill_and_reap_orphans();
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

// The environment both launchers start with: small and explicit, so that
// what a launcher adds for its workers stands out.
Env parent_env(const TempDir& dir) {
  return {
      {"PATH", "/usr/local/bin:/usr/bin:/bin"},
      {"HOME", dir.path().string()},
      {"TMPDIR", dir.path().string()},
      {"LANG", "C.UTF-8"},
      {"PYTHON_EXEC", kSystemPython},
      {"TIDE_INTEROP_PARENT_MARKER", "inherited as is"},
  };
}

std::vector<std::string> tiderun(std::vector<std::string> args) {
  args.insert(args.begin(), TIDERUN_BIN);
  return args;
}

// A port nobody listens on now (bound, read back, closed).
uint16_t free_port() {
  return net::free_port("127.0.0.1");
}

std::string random_run_id() {
  std::random_device rd;
  std::uniform_int_distribution<int> digit(0, 15);
  std::string id = "torchrun-";
  for (int i = 0; i < 16; ++i) {
    id.push_back("0123456789abcdef"[digit(rd)]);
  }
  return id;
}

// torchrun 1.13 with --standalone's settings, spelt out: --standalone
// means c10d on localhost:29400 with a random run id, and other runs on
// this machine (benchmarks, other tests) use 29400 too; a torchrun that
// finds it taken joins the other run's store and fails when that run ends.
// So: the same backend and a random id, on a free port.
std::vector<std::string> torchrun_standalone(
    const std::string& run_id, std::vector<std::string> args) {
  std::vector<std::string> argv = {
      kSystemPython,
      TIDE_TORCHRUN_PY,
      "--rdzv_backend=c10d",
      "--rdzv_endpoint=localhost:" + std::to_string(free_port()),
      "--rdzv_id=" + run_id,
  };
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// The one directory <log_dir>/<run id>_<random> a launcher made; fails the
// test when there is not exactly one.
fs::path run_log_dir(const fs::path& log_dir) {
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(log_dir)) {
    dirs.push_back(e.path());
  }
  EXPECT_EQ(dirs.size(), 1u) << "entries in --log-dir " << log_dir;
  return dirs.empty() ? log_dir / "missing" : dirs.front();
}

std::set<std::string> markers(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    names.insert(e.path().filename().string());
  }
  return names;
}

// The markers, without rank 0's start marker of attempt 0: when rank 1
// fails, rank 0 is stopped wherever it is, perhaps before writing it.
std::set<std::string> markers_but_first_rank_0(const fs::path& dir) {
  std::set<std::string> names = markers(dir);
  names.erase("attempt_0_rank_0");
  return names;
}

// "DDP OK rank=R world=W attempt=A checksum=C" of each rank, by rank. Two
// workers share one console and python -u writes a line and its newline
// separately, so the lines can run together: matched anywhere.
std::map<int, std::smatch> ddp_ok_lines(const std::string& out) {
  static const std::regex kOk(
      "DDP OK rank=([0-9]+) world=([0-9]+) attempt=([0-9]+) "
      "checksum=(-?[0-9]+\\.[0-9]+)");
  std::map<int, std::smatch> by_rank;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), kOk);
       it != std::sregex_iterator();
       ++it) {
    by_rank[std::stoi((*it)[1])] = *it;
  }
  return by_rank;
}

// The summary block of a failed run: from the first line of '=' to the
// last, inclusive (torchrun prefixes it with the exception's name, tiderun
// with "tiderun: worker group failed:"). Empty when there is none.
std::vector<std::string> failure_summary(const std::string& err) {
  std::vector<std::string> lines = split_lines(err);
  auto is_border = [](const std::string& l) {
    return l.size() >= 10 && l.find_first_not_of('=') == std::string::npos;
  };
  auto first = std::find_if(lines.begin(), lines.end(), is_border);
  auto last = std::find_if(lines.rbegin(), lines.rend(), is_border);
  if (first == lines.end() || last.base() - 1 <= first) {
    return {};
  }
  return {first, last.base()};
}

// The value of the summary line "  <key>: value" (key padded to 10).
std::optional<std::string> summary_field(
    const std::vector<std::string>& summary, const std::string& key) {
  std::string padded = key;
  padded.resize(std::max<size_t>(padded.size(), 10), ' ');
  std::string prefix = "  " + padded + ": ";
  for (const auto& l : summary) {
    if (l.starts_with(prefix)) {
      return l.substr(prefix.size());
    }
  }
  return std::nullopt;
}

// The summary with what differs between any two runs replaced: the time,
// host, pid, and the log directory and run id in error_file.
std::vector<std::string> normalized_summary(
    std::vector<std::string> summary, const fs::path& log_dir) {
  static const std::regex kTime(
      "^(  time      : "
      ")[0-9]{4}-[0-9]{2}-[0-9]{2}_[0-9]{2}:[0-9]{2}:[0-9]{2}$");
  static const std::regex kHost("^(  host      : ).+$");
  static const std::regex kPid("^(  exitcode  : -?[0-9]+ \\(pid: )[0-9]+\\)$");
  const std::regex error_file(
      "^(  error_file: )" +
      std::regex_replace(
          log_dir.string(), std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
      "/[^/]+(/attempt_[0-9]+/[0-9]+/error\\.json)$");
  for (auto& l : summary) {
    l = std::regex_replace(l, kTime, "$1<TIME>");
    l = std::regex_replace(l, kHost, "$1<HOST>");
    l = std::regex_replace(l, kPid, "$1<PID>)");
    l = std::regex_replace(l, error_file, "$1<LOG_DIR>/<RUN_ID>_<RANDOM>$2");
  }
  return summary;
}

Env read_env_json(const fs::path& path) {
  Env env;
  nlohmann::json j = nlohmann::json::parse(read_file(path));
  for (const auto& [k, v] : j.items()) {
    env[k] = v.get<std::string>();
  }
  return env;
}

// What a launcher gave a worker: variables not in parent, or changed.
Env given_by_launcher(const Env& worker, const Env& parent) {
  Env given;
  for (const auto& [k, v] : worker) {
    auto p = parent.find(k);
    if (p == parent.end() || p->second != v) {
      given[k] = v;
    }
  }
  return given;
}

std::string value_or_unset(const Env& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? "<unset>" : "\"" + it->second + "\"";
}

// Checks on the variables whose values may differ between the launchers:
// each must still have the shape torch gives it.
void expect_well_formed(
    const std::string& launcher, const Env& env, const fs::path& log_dir) {
  SCOPED_TRACE(launcher + " rank " + value_or_unset(env, "RANK"));
  const std::string port =
      env.count("MASTER_PORT") ? env.at("MASTER_PORT") : "";
  EXPECT_TRUE(std::regex_match(port, std::regex("[1-9][0-9]{0,4}")))
      << "MASTER_PORT=" << port;
  EXPECT_FALSE(env.count("MASTER_ADDR") && env.at("MASTER_ADDR").empty());
  EXPECT_TRUE(
      env.count("TORCHELASTIC_USE_AGENT_STORE") &&
      (env.at("TORCHELASTIC_USE_AGENT_STORE") == "True" ||
       env.at("TORCHELASTIC_USE_AGENT_STORE") == "False"))
      << value_or_unset(env, "TORCHELASTIC_USE_AGENT_STORE");
  if (env.count("TORCHELASTIC_ERROR_FILE") &&
      env.count("TORCHELASTIC_RUN_ID") && env.count("LOCAL_RANK")) {
    std::string want = log_dir.string() + "/" + env.at("TORCHELASTIC_RUN_ID") +
                       "_*/attempt_0/" + env.at("LOCAL_RANK") + "/error.json";
    const std::string& got = env.at("TORCHELASTIC_ERROR_FILE");
    fs::path p = got;
    EXPECT_TRUE(
        p.parent_path().parent_path().parent_path() == run_log_dir(log_dir) &&
        p.filename() == "error.json" &&
        p.parent_path().filename() == env.at("LOCAL_RANK") &&
        p.parent_path().parent_path().filename() == "attempt_0" &&
        run_log_dir(log_dir).filename().string().starts_with(
            env.at("TORCHELASTIC_RUN_ID") + "_"))
        << "TORCHELASTIC_ERROR_FILE=" << got << ", want " << want;
  }
}

TEST(TiderunInteropTest, DdpScriptWrittenForTorchrunRunsUnchanged) {
  TempDir tmp;
  fs::path log_dir = tmp.make("logs");
  fs::path marker_dir = tmp.make("markers");
  Outcome r =
      run(tiderun({
              "--standalone",
              "--nproc-per-node=2",
              "--log-dir=" + log_dir.string(),
              kDdpScript,
              "--marker-dir",
              marker_dir.string(),
          }),
          parent_env(tmp),
          tmp.path(),
          "tiderun");
  ASSERT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(r.leftovers.empty()) << r.describe();

  auto ok = ddp_ok_lines(r.out);
  ASSERT_EQ(ok.size(), 2u) << "want DDP OK from ranks 0 and 1\n"
                           << r.describe();
  for (const auto& [rank, m] : ok) {
    EXPECT_EQ(m[2], "2") << "world size seen by rank " << rank;
    EXPECT_EQ(m[3], "0") << "attempt of rank " << rank;
  }
  ASSERT_TRUE(ok.count(0) && ok.count(1)) << r.describe();
  EXPECT_EQ(ok.at(0)[4], ok.at(1)[4]) << "checksums of the final parameters";
  EXPECT_EQ(
      markers(marker_dir),
      (std::set<std::string>{
          "attempt_0_rank_0",
          "attempt_0_rank_0_done",
          "attempt_0_rank_1",
          "attempt_0_rank_1_done"}));
}

// Two nodes of a c10d job, each with --store-fan-in: every worker's
// MASTER_ADDR:MASTER_PORT is its own node's fan-in, group rank 0's agent
// serves the workers' store (a tide store, fresh each attempt), and the DDP
// script, unchanged, trains through them, restart included.
TEST(TiderunInteropTest, DdpTrainsThroughEachNodesStoreFanInAcrossARestart) {
  TempDir tmp;
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto node = [&](int n) {
    std::string cmd = std::string(TIDERUN_BIN) +
                      " --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d"
                      " --rdzv-endpoint=" +
                      endpoint +
                      " --rdzv-id=fanin --max-restarts=1 --store-fan-in"
                      " --log-dir=" +
                      (tmp.path() / ("logs" + std::to_string(n))).string() +
                      " " + kDdpScript + " --fail-rank 3 --fail-attempt 0";
    return cmd;
  };
  // Both agents under one shell, so that run() reaps them together.
  Outcome r = run(
      {"/bin/sh",
       "-c",
       node(0) + " & a=$!; " + node(1) + "; b=$?; wait $a; exit $(($? | b))"},
      parent_env(tmp),
      tmp.path(),
      "tiderun");
  ASSERT_FALSE(r.timed_out) << r.describe();
  // A torch that asks for libuv without having it (Debian 13's 2.6) cannot
  // make a client of an agent's store: tiderun says so before any worker.
  if (r.err.find("asks for libuv by default and was built without it") !=
      std::string::npos) {
    EXPECT_EQ(r.exit_code, 2) << r.describe();
    EXPECT_NE(
        r.err.find("its workers cannot reach a fan-in"), std::string::npos)
        << r.describe();
    EXPECT_TRUE(ddp_ok_lines(r.out).empty()) << r.describe();
    return;
  }
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  auto ok = ddp_ok_lines(r.out);
  ASSERT_EQ(ok.size(), 4u) << r.describe();
  for (const auto& [rank, m] : ok) {
    EXPECT_EQ(m[2], "4") << "world size seen by rank " << rank;
    EXPECT_EQ(m[3], "1") << "attempt of rank " << rank;
    EXPECT_EQ(m[4], ok.begin()->second[4]) << "checksum of rank " << rank;
  }
  // Each node's agent, each start (the failure's and the membership's
  // restarts): its own fan-in; group rank 0's serves the store.
  std::regex fan_in("through this node's fan-in on 127\\.0\\.0\\.1:");
  EXPECT_GE(
      std::distance(
          std::sregex_iterator(r.err.begin(), r.err.end(), fan_in),
          std::sregex_iterator()),
      4)
      << r.describe();
  EXPECT_NE(r.err.find("this agent serves that store"), std::string::npos)
      << r.describe();
}

// torch >= 2.5's workers put their keys in the agent's store as they are:
// a restarted group must find none of the previous attempt's there (a stale
// gloo address or NCCL id makes init_process_group fail or hang). Torch's
// own TCPStore client, as such a worker uses it.
TEST(
    TiderunInteropTest,
    ARestartedGroupFindsNothingOfThePreviousAttemptInTheStore) {
  TempDir tmp;
  Outcome r =
      run(tiderun(
              {"--standalone",
               "--nproc-per-node=1",
               "--max-restarts=1",
               kAttemptStoreScript}),
          parent_env(tmp),
          tmp.path(),
          "tiderun");
  ASSERT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(
      r.out.find("attempt 0 wrote its address and fails"), std::string::npos)
      << r.describe();
  EXPECT_NE(
      r.out.find("attempt 1 found nothing of attempt 0"), std::string::npos)
      << r.describe();
  // The agent's store emptied between attempts; for a torch without
  // libuv, a store of the workers' own, made anew each attempt, instead.
  if (r.err.find("asks for libuv by default and was built without it") ==
      std::string::npos) {
    EXPECT_TRUE(std::regex_search(
        r.err,
        std::regex("round 1: erased [1-9][0-9]* key\\(s\\) of the previous")))
        << r.describe();
  } else {
    EXPECT_NE(
        r.err.find("rank 0's worker hosts the workers' store, made anew "
                   "each attempt"),
        std::string::npos)
        << r.describe();
  }
}

// torch's own launcher tests (test_init_method_{env,tcp}_with_torchelastic):
// four workers meet through env:// or through tcp:// at the launcher's
// --master-port, all_reduce once and end. With destroy_process_group()
// before exit (without it torch 2.6 on Python 3.13 may abort at exit under
// any launcher: init_method_worker.py says why), every run ends cleanly.
TEST(TiderunInteropTest, TorchsLauncherTestCaseEndsCleanlyEveryTime) {
  TempDir tmp;
  Env env = parent_env(tmp);
  for (int i = 0; i < 2; ++i) {
    for (bool tcp : {false, true}) {
      uint16_t port = free_port();
      std::string init_method =
          tcp ? "tcp://localhost:" + std::to_string(port) : "env://";
      Outcome r =
          run(tiderun({
                  "--run-path",
                  "--nnodes=1",
                  "--nproc-per-node=4",
                  "--master-addr=localhost",
                  "--master-port=" + std::to_string(port),
                  "--monitor-interval=1",
                  kInitMethodScript,
                  "--init-method=" + init_method,
                  "--destroy",
              }),
              env,
              tmp.path(),
              "tiderun");
      ASSERT_FALSE(r.timed_out) << r.describe();
      EXPECT_EQ(r.exit_code, 0) << init_method << "\n" << r.describe();
      for (int rank = 0; rank < 4; ++rank) {
        EXPECT_NE(
            r.out.find("rank " + std::to_string(rank) + ": Done"),
            std::string::npos)
            << r.describe();
      }
      EXPECT_TRUE(r.leftovers.empty()) << r.describe();
    }
  }
}

TEST(
    TiderunInteropTest,
    RankFailingOnFirstAttemptRestartsTheGroupWhichThenFinishes) {
  TempDir tmp;
  fs::path log_dir = tmp.make("logs");
  fs::path marker_dir = tmp.make("markers");
  Outcome r =
      run(tiderun({
              "--standalone",
              "--nproc-per-node=2",
              "--max-restarts=1",
              "--log-dir=" + log_dir.string(),
              kDdpScript,
              "--marker-dir",
              marker_dir.string(),
              "--fail-rank",
              "1",
              "--fail-attempt",
              "0",
          }),
          parent_env(tmp),
          tmp.path(),
          "tiderun");
  ASSERT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(r.leftovers.empty()) << r.describe();

  // Attempt 0 finished no rank; attempt 1 finished both.
  EXPECT_EQ(
      markers_but_first_rank_0(marker_dir),
      (std::set<std::string>{
          "attempt_0_rank_1",
          "attempt_1_rank_0",
          "attempt_1_rank_0_done",
          "attempt_1_rank_1",
          "attempt_1_rank_1_done"}));
  auto ok = ddp_ok_lines(r.out);
  ASSERT_EQ(ok.size(), 2u) << r.describe();
  for (const auto& [rank, m] : ok) {
    EXPECT_EQ(m[3], "1") << "attempt of rank " << rank;
  }

  // torch's log layout: <log_dir>/<run id>_<random>/attempt_<n>/<local rank>/
  // with rank 1's error file, written by @record, in attempt_0 only.
  fs::path run_dir = run_log_dir(log_dir);
  EXPECT_TRUE(std::regex_match(
      run_dir.filename().string(),
      std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                 "[0-9a-f]{12}_[^/]+")))
      << run_dir;
  for (const char* d :
       {"attempt_0/0", "attempt_0/1", "attempt_1/0", "attempt_1/1"}) {
    EXPECT_TRUE(fs::is_directory(run_dir / d)) << run_dir / d;
  }
  fs::path error_file = run_dir / "attempt_0/1/error.json";
  ASSERT_TRUE(fs::exists(error_file)) << error_file;
  EXPECT_NE(read_file(error_file).find(kInjectedFailure), std::string::npos)
      << read_file(error_file);
  EXPECT_FALSE(fs::exists(run_dir / "attempt_1/1/error.json"));
}

TEST(
    TiderunInteropTest,
    RankFailingWithNoRestartsLeftExitsOneWithTorchsFailureSummary) {
  TempDir tmp;
  fs::path log_dir = tmp.make("logs");
  fs::path marker_dir = tmp.make("markers");
  Env env = parent_env(tmp);
  // As for torchrun: the launcher's own error file gets the root cause.
  fs::path launcher_error_file = tmp.path() / "launcher_error.json";
  env["TORCHELASTIC_ERROR_FILE"] = launcher_error_file.string();
  Outcome r =
      run(tiderun({
              "--standalone",
              "--nproc-per-node=2",
              "--max-restarts=0",
              "--log-dir=" + log_dir.string(),
              kDdpScript,
              "--marker-dir",
              marker_dir.string(),
              "--fail-rank",
              "1",
          }),
          env,
          tmp.path(),
          "tiderun");
  ASSERT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_TRUE(r.leftovers.empty()) << r.describe();
  EXPECT_EQ(
      markers_but_first_rank_0(marker_dir),
      (std::set<std::string>{"attempt_0_rank_1"}))
      << "no restart, nobody finished";

  std::vector<std::string> summary = failure_summary(r.err);
  ASSERT_FALSE(summary.empty()) << "no failure summary\n" << r.describe();
  auto has_line = [&](const std::string& line) {
    return std::find(summary.begin(), summary.end(), line) != summary.end();
  };
  // The script as given (torch: the first argument of the interpreter).
  EXPECT_TRUE(has_line(std::string(kDdpScript) + " FAILED")) << join(summary);
  EXPECT_TRUE(has_line("Failures:")) << join(summary);
  EXPECT_TRUE(has_line("  <NO_OTHER_FAILURES>")) << join(summary);
  EXPECT_TRUE(has_line("Root Cause (first observed failure):"))
      << join(summary);
  EXPECT_TRUE(has_line("[0]:")) << join(summary);
  EXPECT_TRUE(has_line("  rank      : 1 (local_rank: 1)")) << join(summary);
  EXPECT_TRUE(has_line("  " + std::string(kInjectedFailure))) << join(summary);
  EXPECT_TRUE(std::regex_match(
      summary_field(summary, "exitcode").value_or(""),
      std::regex("1 \\(pid: [0-9]+\\)")))
      << join(summary);
  fs::path error_file = run_log_dir(log_dir) / "attempt_0/1/error.json";
  EXPECT_EQ(summary_field(summary, "error_file"), error_file.string())
      << join(summary);
  EXPECT_TRUE(summary_field(summary, "traceback")
                  .value_or("")
                  .starts_with("Traceback (most recent call last):"))
      << join(summary);

  // torchrun copies the root cause's error file, adding its exit code.
  ASSERT_TRUE(fs::exists(launcher_error_file)) << r.describe();
  nlohmann::json launcher_error =
      nlohmann::json::parse(read_file(launcher_error_file));
  EXPECT_EQ(launcher_error["message"]["message"], kInjectedFailure)
      << launcher_error.dump(2);
  EXPECT_EQ(launcher_error["message"]["errorCode"], 1)
      << launcher_error.dump(2);
  EXPECT_NE(
      launcher_error["message"]["extraInfo"]["py_callstack"]
          .get<std::string>()
          .find(kInjectedFailure),
      std::string::npos)
      << launcher_error.dump(2);
}

// A Python worker using torch's own FileTimerClient, served by tiderun's
// timer server: its hang is ended by the timer and the group restarts.
TEST(TiderunInteropTest, TorchFileTimerClientsAreServedAndAHangIsReclaimed) {
  TempDir tmp;
  fs::path out = tmp.make("out");
  Outcome r =
      run(tiderun({
              "--standalone",
              "--nproc-per-node=2",
              "--max-restarts=1",
              "--file-timer",
              "--log-dir=" + tmp.make("logs").string(),
              kTimerScript,
              out.string(),
          }),
          parent_env(tmp),
          tmp.path(),
          "tiderun");
  ASSERT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.err.find("overran timer \"train_step\""), std::string::npos)
      << r.describe();
  EXPECT_NE(
      r.err.find("expiration timer \"train_step\" expired"), std::string::npos)
      << r.describe();
  EXPECT_TRUE(fs::exists(out / "done.1.0")) << r.describe();
  EXPECT_TRUE(fs::exists(out / "done.1.1")) << r.describe();
  EXPECT_FALSE(fs::exists(out / "done.0.0")) << r.describe();
  EXPECT_TRUE(r.leftovers.empty()) << r.describe();
}

// torch's FileTimerTest.test_timer shape: a worker's multiprocessing child
// arms torch's timer and hangs; tiderun's server kills that child, and the
// worker lives on to see it die. A request naming a pid outside the job
// (this test's own process, with a deadline already past) is refused: were
// it honoured, this test would be killed.
TEST(TiderunInteropTest, AWorkersChildIsReapedByItsTimerAndStrangersAreNot) {
  TempDir tmp;
  fs::path out = tmp.make("out");
  std::string me = std::to_string(::getpid());
  Outcome r =
      run(tiderun({
              "--standalone",
              "--nproc-per-node=1",
              "--max-restarts=0",
              "--file-timer",
              "--log-dir=" + tmp.make("logs").string(),
              std::string(TIDE_INTEROP_DIR) + "/torch_timer_child_worker.py",
              out.string(),
              me,
          }),
          parent_env(tmp),
          tmp.path(),
          "tiderun");
  ASSERT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(read_file(out / "child_exitcode"), "-9") << r.describe();
  EXPECT_NE(r.err.find("overran timer \"child_step\""), std::string::npos)
      << r.describe();
  EXPECT_NE(
      r.err.find("refusing a timer for pid " + me + " (scope \"foreign\")"),
      std::string::npos)
      << r.describe();
  EXPECT_TRUE(r.leftovers.empty()) << r.describe();
}

// torchrun of a torch >= 2.4 built without libuv (Debian 13's 2.6) makes
// its rendezvous store with libuv, whatever USE_LIBUV says, and stops
// there: it is no reference on that torch.
bool torchrun_cannot_make_its_store(const Outcome& torch_run) {
  return torch_run.err.find(
             "use_libuv was requested but PyTorch was build without libuv "
             "support") != std::string::npos;
}
constexpr const char* kNoTorchrun =
    "torchrun of this torch cannot make its rendezvous store (built without "
    "libuv, which its TCPStore asks for): nothing to compare with";

TEST(TiderunInteropTest, FailureSummaryMatchesTorchrunsLineForLine) {
  TempDir tmp;
  Env env = parent_env(tmp);
  fs::path torch_logs = tmp.make("torchrun_logs");
  fs::path tide_logs = tmp.make("tiderun_logs");
  Outcome torch_run =
      run(torchrun_standalone(
              random_run_id(),
              {
                  "--nproc_per_node=2",
                  "--monitor_interval=0.1",
                  "--max_restarts=0",
                  "--log_dir=" + torch_logs.string(),
                  kDdpScript,
                  "--fail-rank",
                  "1",
              }),
          env,
          tmp.path(),
          "torchrun");
  ASSERT_FALSE(torch_run.timed_out) << torch_run.describe();
  if (torchrun_cannot_make_its_store(torch_run)) {
    GTEST_SKIP() << kNoTorchrun;
  }
  Outcome tide_run =
      run(tiderun({
              "--standalone",
              "--nproc_per_node=2",
              "--monitor_interval=0.1",
              "--max_restarts=0",
              "--log_dir=" + tide_logs.string(),
              kDdpScript,
              "--fail-rank",
              "1",
          }),
          env,
          tmp.path(),
          "tiderun");
  ASSERT_FALSE(tide_run.timed_out) << tide_run.describe();
  EXPECT_EQ(torch_run.exit_code, 1) << torch_run.describe();
  EXPECT_EQ(tide_run.exit_code, torch_run.exit_code) << tide_run.describe();
  EXPECT_TRUE(tide_run.leftovers.empty()) << tide_run.describe();

  std::vector<std::string> want =
      normalized_summary(failure_summary(torch_run.err), torch_logs);
  std::vector<std::string> got =
      normalized_summary(failure_summary(tide_run.err), tide_logs);
  ASSERT_FALSE(want.empty()) << "torchrun printed no summary\n"
                             << torch_run.describe();
  EXPECT_EQ(join(got), join(want))
      << "(time, host, pid, log dir and run id normalized)";
}

TEST(TiderunInteropTest, FailureSummaryNamesTheHostByTorchsFqdn) {
  TempDir tmp;
  Env env = parent_env(tmp);
  fs::path log_dir = tmp.make("logs");
  // torch's summary shows socket.getfqdn() (errors/__init__.py).
  Outcome fqdn =
      run({kSystemPython, "-c", "import socket; print(socket.getfqdn())"},
          env,
          tmp.path(),
          "fqdn",
          30s);
  ASSERT_EQ(fqdn.exit_code, 0) << fqdn.describe();
  Outcome tide_run =
      run(tiderun({
              "--standalone",
              "--nproc-per-node=2",
              "--log-dir=" + log_dir.string(),
              kDdpScript,
              "--fail-rank",
              "1",
          }),
          env,
          tmp.path(),
          "tiderun");
  ASSERT_FALSE(tide_run.timed_out) << tide_run.describe();
  ASSERT_EQ(tide_run.exit_code, 1) << tide_run.describe();
  std::string want = fqdn.out.substr(0, fqdn.out.find('\n'));
  char hostname[256] = {};
  ::gethostname(hostname, sizeof hostname - 1);
  EXPECT_EQ(summary_field(failure_summary(tide_run.err), "host"), want)
      << "gethostname() is \"" << hostname << "\"\n"
      << join(failure_summary(tide_run.err));
}

TEST(TiderunInteropTest, WorkersGetEveryVariableTorchrunGivesThem) {
  TempDir tmp;
  Env parent = parent_env(tmp);
  fs::path torch_logs = tmp.make("torchrun_logs");
  fs::path tide_logs = tmp.make("tiderun_logs");
  fs::path torch_envs = tmp.make("torchrun_envs");
  fs::path tide_envs = tmp.make("tiderun_envs");
  const std::string torch_run_id = random_run_id();
  Outcome torch_run =
      run(torchrun_standalone(
              torch_run_id,
              {
                  "--nproc_per_node=2",
                  "--monitor_interval=0.1",
                  "--log_dir=" + torch_logs.string(),
                  kPrintEnvScript,
                  torch_envs.string(),
              }),
          parent,
          tmp.path(),
          "torchrun");
  ASSERT_FALSE(torch_run.timed_out) << torch_run.describe();
  if (torchrun_cannot_make_its_store(torch_run)) {
    GTEST_SKIP() << kNoTorchrun;
  }
  ASSERT_EQ(torch_run.exit_code, 0) << torch_run.describe();
  // The same flags, in torchrun's spelling.
  Outcome tide_run =
      run(tiderun({
              "--standalone",
              "--nproc_per_node=2",
              "--monitor_interval=0.1",
              "--log_dir=" + tide_logs.string(),
              kPrintEnvScript,
              tide_envs.string(),
          }),
          parent,
          tmp.path(),
          "tiderun");
  ASSERT_FALSE(tide_run.timed_out) << tide_run.describe();
  ASSERT_EQ(tide_run.exit_code, 0) << tide_run.describe();
  EXPECT_TRUE(tide_run.leftovers.empty()) << tide_run.describe();

  std::ostringstream report;
  report << "worker environment, torchrun vs tiderun (only what differs):\n";
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    std::string file = "env_" + std::to_string(rank) + ".json";
    ASSERT_TRUE(fs::exists(torch_envs / file)) << torch_run.describe();
    ASSERT_TRUE(fs::exists(tide_envs / file)) << tide_run.describe();
    Env torch_env = read_env_json(torch_envs / file);
    Env tide_env = read_env_json(tide_envs / file);
    Env torch_given = given_by_launcher(torch_env, parent);
    Env tide_given = given_by_launcher(tide_env, parent);

    // The harness sees what the reference says torchrun sets.
    for (const auto& k : kTorch113WorkerVariables) {
      EXPECT_TRUE(torch_given.count(k)) << "torchrun did not set " << k;
    }
    EXPECT_EQ(
        value_or_unset(torch_env, "RANK"), "\"" + std::to_string(rank) + "\"");
    EXPECT_EQ(
        value_or_unset(torch_env, "TORCHELASTIC_RUN_ID"),
        "\"" + torch_run_id + "\"");

    for (const auto& [k, v] : torch_given) {
      auto it = tide_env.find(k);
      if (it == tide_env.end()) {
        ADD_FAILURE() << "tiderun does not set " << k << " (torchrun: \"" << v
                      << "\")";
        report << "  rank " << rank << " " << k << ": torchrun \"" << v
               << "\", tiderun <unset>  MISSING\n";
      } else if (it->second != v) {
        auto why = kExpectedToDiffer.find(k);
        if (why == kExpectedToDiffer.end()) {
          ADD_FAILURE() << k << ": torchrun \"" << v << "\", tiderun \""
                        << it->second << "\"";
        }
        report << "  rank " << rank << " " << k << ": torchrun \"" << v
               << "\", tiderun \"" << it->second << "\"  "
               << (why == kExpectedToDiffer.end() ? "UNEXPECTED"
                                                  : "expected: " + why->second)
               << "\n";
      }
    }
    for (const auto& [k, v] : tide_given) {
      if (!torch_given.count(k)) {
        report << "  rank " << rank << " " << k << ": torchrun "
               << value_or_unset(torch_env, k) << ", tiderun \"" << v
               << "\"  (tiderun only)\n";
      }
    }
    // The parent's variables reach the workers unchanged.
    for (const auto& [k, v] : parent) {
      EXPECT_EQ(value_or_unset(torch_env, k), "\"" + v + "\"")
          << "torchrun " << k;
      EXPECT_EQ(value_or_unset(tide_env, k), "\"" + v + "\"")
          << "tiderun " << k;
    }
    expect_well_formed("torchrun", torch_env, torch_logs);
    expect_well_formed("tiderun", tide_env, tide_logs);
  }
  std::cout << report.str();
  RecordProperty("env_differences", report.str());
}

}  // namespace
}  // namespace tide::launcher
