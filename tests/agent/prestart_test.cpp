// The prestart pool (src/agent/prestart.h) with real Python interpreters:
// a waiting interpreter runs the script it is handed with the worker's
// argv, environment and output; one whose import-time environment or
// binding differs from its worker's is not used (the reason names the
// variable); a gated interpreter imports only once released; a drained
// pool leaves no process behind.
#include "agent/prestart.h"

#include <poll.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "agent/janitor.h"
#include "agent/worker_process.h"
#include "support/process_checks.h"
#include "support/temp_dir.h"

namespace tide::agent {
namespace {

namespace fs = std::filesystem;
using detail::LaunchSpec;
using detail::PrestartPool;
using detail::PythonCommand;

using test::read_whole;

class PrestartPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(script_) << "import os, sys\n"
                              "print('argv', sys.argv[1:], 'rank', "
                              "os.environ['RANK'], 'foo', "
                              "os.environ.get('FOO'), 'name', __name__)\n";
  }

  // Local rank 0's launch: python -u SCRIPT a b, output to out.log.
  LaunchSpec slot(const std::string& foo, const std::string& rank) const {
    LaunchSpec ls;
    ls.local_rank = 0;
    ls.path = "/usr/bin/python3";
    ls.argv = {"/usr/bin/python3", "-u", script_, "a", "b"};
    ls.env = {
        "PATH=/usr/bin:/bin", "FOO=" + foo, "RANK=" + rank, "LOCAL_RANK=0"};
    ls.out = {
        .mode = detail::StreamTarget::Mode::kFile,
        .path = (dir_ / "out.log").string()};
    ls.err = {
        .mode = detail::StreamTarget::Mode::kFile,
        .path = (dir_ / "err.log").string()};
    return ls;
  }

  PythonCommand command(const LaunchSpec& ls) const {
    std::string why;
    auto c = PythonCommand::parse(ls.path, ls.argv, &why);
    EXPECT_TRUE(c.has_value()) << why;
    return *c;
  }

  test::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
  const std::string script_ = (dir_ / "script.py").string();
  detail::Janitor janitor_;
  PrestartPool pool_{
      {.imports = {"json"}, .log_dir = (dir_ / "pool").string()}, &janitor_};
};

TEST_F(PrestartPoolTest, AWaitingInterpreterRunsTheScriptItIsHanded) {
  pool_.fill("/usr/bin/python3", {slot("x", "0")});
  LaunchSpec ls = slot("x", "7");  // RANK is set per attempt: not compared
  std::string why;
  auto p = pool_.take(ls, command(ls), &why);
  ASSERT_NE(p, nullptr) << why;
  pollfd pfd{.fd = p->pidfd(), .events = POLLIN, .revents = 0};
  ASSERT_EQ(::poll(&pfd, 1, 30'000), 1) << "the worker did not exit";
  ASSERT_TRUE(p->poll_exit());
  EXPECT_EQ(p->exitcode(), 0) << read_whole(dir_ / "err.log");
  EXPECT_EQ(
      read_whole(dir_ / "out.log"),
      "argv ['a', 'b'] rank 7 foo x name __main__\n");
}

TEST_F(PrestartPoolTest, AGatedInterpreterImportsOnlyOnceReleased) {
  std::ofstream(script_, std::ios::trunc)
      << "import sys\nprint('wave' in sys.modules)\n";
  PrestartPool pool{
      {.imports = {"wave"}, .log_dir = (dir_ / "pool").string()}, &janitor_};
  auto run = [&](const std::string& out) {
    LaunchSpec ls = slot("x", "0");
    ls.out.path = (dir_ / out).string();
    std::string why;
    auto p = pool.take(ls, command(ls), &why);
    EXPECT_NE(p, nullptr) << why;
    if (p == nullptr) {
      return std::string();
    }
    pollfd pfd{.fd = p->pidfd(), .events = POLLIN, .revents = 0};
    EXPECT_EQ(::poll(&pfd, 1, 30'000), 1) << "the worker did not exit";
    EXPECT_TRUE(p->poll_exit());
    EXPECT_EQ(p->exitcode(), 0) << read_whole(dir_ / "err.log");
    return read_whole(dir_ / out);
  };
  // Handed its work before it was released: it imported nothing.
  pool.fill("/usr/bin/python3", {slot("x", "0")}, /*gated=*/true);
  EXPECT_EQ(run("first.log"), "False\n");
  // Released first: its imports ran before it read its work.
  pool.fill("/usr/bin/python3", {slot("x", "0")}, /*gated=*/true);
  pool.release();
  EXPECT_EQ(run("second.log"), "True\n");
}

TEST_F(PrestartPoolTest, AnImportTimeVariableThatDiffersSendsTheWorkerCold) {
  pool_.fill("/usr/bin/python3", {slot("x", "0")});
  LaunchSpec ls = slot("y", "0");
  std::string why;
  EXPECT_EQ(pool_.take(ls, command(ls), &why), nullptr);
  EXPECT_EQ(
      why,
      "its environment at start differs from the worker's in FOO, which may "
      "be read at import time");
  // The next fill starts one for the new environment, which is then used.
  pool_.fill("/usr/bin/python3", {ls});
  auto p = pool_.take(ls, command(ls), &why);
  EXPECT_NE(p, nullptr) << why;
}

TEST_F(PrestartPoolTest, ADifferentBindingSendsTheWorkerCold) {
  pool_.fill("/usr/bin/python3", {slot("x", "0")});
  LaunchSpec ls = slot("x", "0");
  ls.binding = detail::Binding::make({0}, {});
  std::string why;
  EXPECT_EQ(pool_.take(ls, command(ls), &why), nullptr);
  EXPECT_EQ(why, "its CPU and memory binding differs from the worker's");
}

TEST_F(PrestartPoolTest, DrainingLeavesNoInterpreter) {
  PrestartPool pool{
      {.spares = 1, .log_dir = (dir_ / "pool").string()}, &janitor_};
  pool.fill("/usr/bin/python3", {slot("x", "0")});
  LaunchSpec ls = slot("x", "0");
  std::string why;
  auto first = pool.take(ls, command(ls), &why);  // the slot's
  ASSERT_NE(first, nullptr) << why;
  auto spare = pool.take(ls, command(ls), &why);  // then the spare
  ASSERT_NE(spare, nullptr) << why;
  EXPECT_EQ(pool.take(ls, command(ls), &why), nullptr);
  EXPECT_EQ(why, "no prestarted interpreter is waiting");
  auto children = [] {
    std::set<pid_t> pids;
    for (const auto& entry : fs::directory_iterator("/proc/self/task")) {
      std::ifstream list(entry.path() / "children");
      pid_t pid;
      while (list >> pid) {
        pids.insert(pid);
      }
    }
    return pids;
  };
  std::set<pid_t> before = children();
  pool.fill("/usr/bin/python3", {slot("x", "0")});  // the slot and a spare
  std::vector<pid_t> started;
  for (pid_t pid : children()) {
    if (before.count(pid) == 0) {
      started.push_back(pid);
    }
  }
  EXPECT_EQ(started.size(), 2u);
  pool.drain();
  // Killed by the drain; how soon the kernel ends them depends on the
  // machine's load.
  for (pid_t pid : started) {
    EXPECT_TRUE(test::process_gone_within(pid, std::chrono::seconds(30)))
        << "pid " << pid << " outlived the drain";
  }
}

TEST(PythonCommandTest, TiderunsFormsAndOthers) {
  std::string why;
  auto s =
      PythonCommand::parse("/usr/bin/python3", {"py", "-u", "t.py", "x"}, &why);
  ASSERT_TRUE(s);
  EXPECT_FALSE(s->module);
  EXPECT_EQ(s->target, "t.py");
  EXPECT_EQ(s->args, std::vector<std::string>{"x"});
  auto m =
      PythonCommand::parse("/usr/bin/python3", {"py", "-u", "-m", "pkg"}, &why);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->module);
  EXPECT_EQ(m->target, "pkg");
  EXPECT_FALSE(PythonCommand::parse("/bin/true", {"/bin/true"}, &why));
  EXPECT_EQ(why, "the workers' command is not a Python script (--no-python?)");
}

}  // namespace
}  // namespace tide::agent
