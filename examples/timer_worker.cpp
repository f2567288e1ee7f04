// A worker that guards each training step with an expiration timer. Run it
// under tiderun with file timers on:
//
//   tiderun --standalone --file-timer --max-restarts=1 timer_worker --hang-once
//
// With --hang-once, step 3 of the first attempt "hangs"; the agent's timer
// server kills the worker when the step's timer expires, and the group
// restarts and finishes.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "tide/timer/file_timer.h"

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  bool hang_once = argc > 1 && std::strcmp(argv[1], "--hang-once") == 0;
  const char* timer_file = std::getenv("TORCHELASTIC_TIMER_FILE");
  if (timer_file == nullptr) {
    std::fprintf(
        stderr,
        "timer_worker: no TORCHELASTIC_TIMER_FILE; run under tiderun "
        "--file-timer\n");
    return 2;
  }
  tide::timer::configure(
      std::make_shared<tide::timer::FileTimerClient>(timer_file));
  bool first_attempt =
      std::strcmp(std::getenv("TORCHELASTIC_RESTART_COUNT"), "0") == 0;
  for (int step = 0; step < 5; ++step) {
    auto guard = tide::timer::expires(200ms, "step");
    if (hang_once && first_attempt && step == 3) {
      std::fprintf(
          stderr, "rank %s: step %d hangs\n", std::getenv("RANK"), step);
      std::this_thread::sleep_for(1h);
    }
    std::this_thread::sleep_for(10ms);  // the step's work
  }
  std::printf("rank %s: 5 steps done\n", std::getenv("RANK"));
  return 0;
}
