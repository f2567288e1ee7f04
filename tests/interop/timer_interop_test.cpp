// tide's FileTimerClient against torch's own FileTimerServer (the other
// direction, a torch client on tide's server, runs under tiderun in
// tiderun_interop_test.cpp).
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "support/subprocess.h"

namespace tide {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

TEST(TimerInteropTest, TorchsFileTimerServerReclaimsATideClient) {
  fs::path dir = fs::temp_directory_path() /
                 ("tide_timer_interop_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string fifo = (dir / "timer").string();
  test::Subprocess server(
      {"/usr/bin/python3", TIDE_INTEROP_DIR "/torch_timer_server.py", fifo},
      {.merge_stderr = true});
  auto ready = server.read_line(60s);
  ASSERT_EQ(ready.value_or("<no output>"), "ready");

  // A tide client arms a 1 s SIGKILL timer and sleeps: a second leaves it
  // room to say "armed" before it is killed, on a loaded machine too.
  test::Subprocess worker({TIDE_TIMER_CHILD, "file", fifo, "step", "1", "9"});
  ASSERT_EQ(worker.read_line(10s).value_or("<none>"), "armed");
  auto status = worker.wait(10s);
  ASSERT_TRUE(status.has_value())
      << "torch's server did not reclaim the worker";
  EXPECT_TRUE(WIFSIGNALED(*status));
  EXPECT_EQ(WTERMSIG(*status), SIGKILL);

  // And a released timer is left alone.
  test::Subprocess released(
      {TIDE_TIMER_CHILD, "file", fifo, "step", "1", "9", "release"});
  ASSERT_EQ(released.read_line(10s).value_or("<none>"), "armed");
  // Long past its deadline.
  EXPECT_FALSE(released.wait(3s).has_value());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tide
