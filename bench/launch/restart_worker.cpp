// The worker of launch_bench's restart cases, run under both tiderun and
// torchrun (--no_python), so that only the launcher differs.
//
// It stamps CLOCK_MONOTONIC nanoseconds (one clock for all processes of the
// machine, and the one launch_bench times the launcher with) into files in
// $TIDE_BENCH_RESTART_OUT:
//   start_a<TORCHELASTIC_RESTART_COUNT>_r<LOCAL_RANK>  at entry, every worker
//   fail                                               attempt 0, local rank 1
// On attempt 0, local rank 1 then exits 1 at once and the other ranks sleep,
// as if still training, until their launcher stops them (at most
// kSleepBoundS). Every worker of a later attempt exits 0.
//
// With TIDE_BENCH_HANG_TIMEOUT=T (the hang cases), local rank 1 of attempt 0
// hangs instead of exiting, after declaring its liveness the launcher's way:
// under tiderun --heartbeat-timeout=T, heartbeats on $TIDE_HEARTBEAT_SOCKET
// ("fail" stamps the last one); under torchrun with torch's file timer
// (TORCHELASTIC_ENABLE_FILE_TIMER=1), a timer expiring T s ahead, armed on
// $TORCHELASTIC_TIMER_FILE in torch's format ("fail" stamps the arming), the
// nearest thing torch 1.13 has.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// As the peer's worker: far longer than either launcher takes to stop a
// failed group (and than tiderun's 30 s shutdown grace, so that a worker that
// misses its SIGTERM shows as such), yet bounded for orphans of a killed
// launcher.
constexpr int kSleepBoundS = 60;

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// Written aside and renamed into place: a worker stopped mid-way (its launcher
// saw another fail) leaves no stamp rather than an empty one. Exits 3 if the
// stamp cannot be written: a run without its stamps is void.
void write_stamp(const std::string& path, int64_t ns) {
  std::string aside = path + ".tmp";
  int fd =
      ::open(aside.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror(aside.c_str());
    std::_Exit(3);
  }
  std::string text = std::to_string(ns) + "\n";
  ssize_t n = ::write(fd, text.data(), text.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size()) ||
      ::rename(aside.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::_Exit(3);
  }
}

void sleep_bound() {
  timespec left{.tv_sec = kSleepBoundS, .tv_nsec = 0};
  while (::nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
}

[[noreturn]] void fail(const char* what) {
  std::perror(what);
  std::_Exit(3);
}

// Declares liveness as the launcher expects it, stamps `stamp`, and hangs.
[[noreturn]] void hang(const std::string& stamp, double timeout_s) {
  if (const char* sock = std::getenv("TIDE_HEARTBEAT_SOCKET")) {
    int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, sock, sizeof addr.sun_path - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      fail("heartbeat socket");
    }
    int64_t last = 0;
    for (int i = 0; i < 3; ++i) {
      if (::send(fd, ".", 1, 0) != 1) {
        fail("heartbeat");
      }
      last = now_ns();
    }
    write_stamp(stamp, last);
  } else if (const char* fifo = std::getenv("TORCHELASTIC_TIMER_FILE")) {
    timespec wall{};
    ::clock_gettime(CLOCK_REALTIME, &wall);
    int64_t armed = now_ns();
    double expires = static_cast<double>(wall.tv_sec) +
                     static_cast<double>(wall.tv_nsec) * 1e-9 + timeout_s;
    char line[256];
    int n = std::snprintf(
        line,
        sizeof line,
        "{\"version\": 1, \"pid\": %d, \"scope_id\": \"step\", "
        "\"expiration_time\": %.6f, \"signal\": 9}\n",
        static_cast<int>(::getpid()),
        expires);
    int fd = ::open(fifo, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ::write(fd, line, static_cast<size_t>(n)) != n) {
      fail(fifo);
    }
    ::close(fd);
    write_stamp(stamp, armed);
  } else {
    std::fprintf(
        stderr,
        "restart_worker: TIDE_BENCH_HANG_TIMEOUT needs TIDE_HEARTBEAT_SOCKET "
        "or TORCHELASTIC_TIMER_FILE\n");
    std::_Exit(2);
  }
  for (;;) {
    sleep_bound();
  }
}

}  // namespace

int main() {
  int64_t start = now_ns();
  const char* out = std::getenv("TIDE_BENCH_RESTART_OUT");
  if (out == nullptr || *out == '\0') {
    std::fprintf(stderr, "restart_worker: set TIDE_BENCH_RESTART_OUT\n");
    return 2;
  }
  std::string dir = out;
  std::string attempt = env_or("TORCHELASTIC_RESTART_COUNT", "?");
  std::string local_rank = env_or("LOCAL_RANK", "?");
  write_stamp(dir + "/start_a" + attempt + "_r" + local_rank, start);
  if (attempt != "0") {
    return 0;
  }
  if (local_rank == "1") {
    if (const char* t = std::getenv("TIDE_BENCH_HANG_TIMEOUT")) {
      hang(dir + "/fail", std::atof(t));
    }
    write_stamp(dir + "/fail", now_ns());
    std::_Exit(1);
  }
  sleep_bound();
  return 0;
}
