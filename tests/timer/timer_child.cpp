// A worker process for the timer tests.
//   tide_timer_child file|local PATH SCOPE AFTER_SECONDS SIGNAL [release]
// arms a timer expiring AFTER_SECONDS from now (with `release`, disarms it
// at once), prints "armed" and then sleeps until killed, or exits 0 after
// 30 s.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "tide/timer/file_timer.h"
#include "tide/timer/local_timer.h"

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(
        stderr,
        "usage: %s file|local PATH SCOPE AFTER SIGNAL [release]\n",
        argv[0]);
    return 2;
  }
  std::shared_ptr<tide::timer::TimerClient> client;
  int sig = std::atoi(argv[5]);
  if (std::strcmp(argv[1], "file") == 0) {
    client = std::make_shared<tide::timer::FileTimerClient>(argv[2], sig);
  } else {
    client = std::make_shared<tide::timer::LocalTimerClient>(argv[2], sig);
  }
  double after = std::atof(argv[4]);
  client->acquire(argv[3], tide::timer::now() + after);
  if (argc > 6 && std::strcmp(argv[6], "release") == 0) {
    client->release(argv[3]);
  }
  std::printf("armed\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(30));
  return 0;
}
