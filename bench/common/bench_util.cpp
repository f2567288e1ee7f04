#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>
#include <thread>

#include <fmt/format.h>

namespace tide::bench {

namespace {

std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_interrupt_signal(int) {
  g_interrupted.store(true);
}

double wall_s() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

void close_fd(int& fd) noexcept {
  if (fd >= 0) {
    ::close(fd);
    fd = -1;
  }
}

std::string format_time(const char* format, bool utc) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  if (utc) {
    ::gmtime_r(&t, &tm);
  } else {
    ::localtime_r(&t, &tm);
  }
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

#ifdef TIDE_BENCH_UNOPTIMISED
// Built without optimisation (the test command's
// -DTIDE_BENCH_OPTIMIZATION=-O0): said before anything else, so that no
// figure of this build is taken for a benchmark's.
const bool g_unoptimised_said = [] {
  std::fputs(
      "WARNING: this bench was built without optimisation (to be compiled "
      "by the tests, not measured): its figures mean little. Use "
      "bench/<name>/run.sh (an optimised build).\n",
      stderr);
  return true;
}();
#endif

}  // namespace

// ---------------------------------------------------------------------------
// Interrupts, time, errors.

std::atomic<bool>& interrupt_flag() {
  return g_interrupted;
}

void throw_if_interrupted() {
  if (interrupted()) {
    throw Interrupted();
  }
}

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

int64_t mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int64_t deadline_after(double seconds) {
  return mono_ns() + static_cast<int64_t>(seconds * 1e9);
}

std::string errno_text(std::string_view what, int err) {
  return fmt::format("{}: {}", what, std::strerror(err));
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) {
    return fmt::format("exit code {}", WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    const char* abbrev = sigabbrev_np(WTERMSIG(status));
    return fmt::format("killed by SIG{}", abbrev ? abbrev : "?");
  }
  return fmt::format("wait status {}", status);
}

bool poll_until(int fd, short events, int64_t deadline_ns, int slice_ms) {
  for (;;) {
    throw_if_interrupted();
    int64_t left_ms = (deadline_ns - mono_ns() + 999'999) / 1'000'000;
    if (left_ms <= 0) {
      return false;
    }
    pollfd p{.fd = fd, .events = events, .revents = 0};
    int n =
        ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, slice_ms)));
    if (n > 0) {
      return true;
    }
    if (n < 0 && errno != EINTR) {
      throw std::runtime_error(errno_text("poll", errno));
    }
  }
}

std::optional<std::string> LineReader::next(
    int64_t deadline_ns, std::string_view what) {
  for (;;) {
    if (auto nl = buf_.find('\n'); nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    if (!poll_until(fd_, POLLIN, deadline_ns)) {
      throw DeadlineExceeded(fmt::format("timed out waiting for {}", what));
    }
    char chunk[4096];
    ssize_t n = ::read(fd_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      throw std::runtime_error(errno_text("read", errno));
    }
    if (n == 0) {
      return std::nullopt;
    }
    buf_.append(chunk, static_cast<size_t>(n));
  }
}

// ---------------------------------------------------------------------------
// Child.

Child::Child(const std::vector<std::string>& argv, ChildOptions options)
    : options_(std::move(options)) {
  // Everything the child needs is made before fork: after it, only
  // async-signal-safe calls (the bench may have threads).
  std::vector<char*> cargv;
  for (const auto& a : argv) {
    cargv.push_back(const_cast<char*>(a.c_str()));
  }
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  if (options_.env) {
    for (const auto& e : *options_.env) {
      cenv.push_back(const_cast<char*>(e.c_str()));
    }
    cenv.push_back(nullptr);
  }

  // The child's ends (closed here after fork) and ours.
  int child_in = -1;
  int child_out = -1;
  int child_err = -1;
  int report[2] = {-1, -1};  // exec's errno, if exec fails.
  auto fail = [&](const char* what, int err) {
    for (int* fd : {&child_in, &child_out, &child_err, &in_, &out_}) {
      close_fd(*fd);
    }
    close_fd(report[0]);
    close_fd(report[1]);
    throw std::runtime_error(errno_text(what, err));
  };
  if (options_.pipes) {
    int in[2];
    int out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) {
      fail("pipe2", errno);
    }
    child_in = in[0];
    in_ = in[1];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      fail("pipe2", errno);
    }
    out_ = out[0];
    child_out = out[1];
  } else {
    child_in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    child_out = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (child_in < 0 || child_out < 0) {
      fail("/dev/null", errno);
    }
  }
  if (!options_.stderr_path.empty()) {
    child_err = ::open(
        options_.stderr_path.c_str(),
        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
        0644);
    if (child_err < 0) {
      fail(options_.stderr_path.c_str(), errno);
    }
  }
  if (::pipe2(report, O_CLOEXEC) != 0) {
    fail("pipe2", errno);
  }

  pid_t parent = ::getpid();
  start_ns_ = mono_ns();
  pid_ = ::fork();
  if (pid_ < 0) {
    fail("fork", errno);
  }
  if (pid_ == 0) {
    if (options_.own_group) {
      ::setpgid(0, 0);
    }
    if (options_.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) {
        ::_exit(126);  // The parent died before prctl.
      }
    }
    // Benches block or catch SIGINT/SIGTERM and may ignore SIGPIPE; exec
    // keeps a mask and ignored signals.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::dup2(child_in, STDIN_FILENO);
    ::dup2(child_out, STDOUT_FILENO);
    if (child_err >= 0) {
      ::dup2(child_err, STDERR_FILENO);
    }
    if (options_.env) {
      ::execve(cargv[0], cargv.data(), cenv.data());
    } else {
      ::execv(cargv[0], cargv.data());
    }
    int err = errno;
    ssize_t ignored = ::write(report[1], &err, sizeof err);
    (void)ignored;
    ::_exit(127);
  }
  if (options_.own_group) {
    ::setpgid(pid_, pid_);  // Also here: no window where it has none.
  }
  close_fd(child_in);
  close_fd(child_out);
  close_fd(child_err);
  close_fd(report[1]);
  // End of file once exec succeeded (the pipe is close-on-exec).
  int exec_errno = 0;
  ssize_t n = 0;
  do {
    n = ::read(report[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  close_fd(report[0]);
  if (n == static_cast<ssize_t>(sizeof exec_errno)) {
    stop();
    close_fds();
    throw std::runtime_error(errno_text(argv[0], exec_errno));
  }
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd_ < 0) {
    int err = errno;
    stop();
    throw std::runtime_error(errno_text("pidfd_open", err));
  }
}

Child::~Child() {
  stop();
}

void Child::close_in() {
  close_fd(in_);
}

bool Child::wait_until(int64_t deadline_ns) {
  if (reaped_) {
    return true;
  }
  if (!poll_until(pidfd_, POLLIN, deadline_ns)) {
    return false;
  }
  reap();
  return true;
}

bool Child::running() {
  if (reaped_) {
    return false;
  }
  return !wait_quietly(0);
}

void Child::stop() noexcept {
  int64_t grace_ns = options_.stop_grace_ns;
  close_in();
  if (reaped_ || pid_ <= 0) {
    close_fds();
    return;
  }
  if (grace_ns > 0) {
    ::kill(pid_, SIGTERM);
    if (wait_quietly(grace_ns)) {
      return;
    }
    if (!options_.name.empty()) {
      std::fprintf(
          stderr,
          "%s: %s (pid %d) ignored SIGTERM for %lld ms; killing it\n",
          program_invocation_short_name,
          options_.name.c_str(),
          static_cast<int>(pid_),
          static_cast<long long>(grace_ns / 1'000'000));
    }
  }
  ::kill(options_.own_group ? -pid_ : pid_, SIGKILL);
  if (!wait_quietly(kKillWaitNs)) {
    if (!options_.name.empty()) {
      std::fprintf(
          stderr,
          "%s: %s (pid %d) survived SIGKILL; not reaped\n",
          program_invocation_short_name,
          options_.name.c_str(),
          static_cast<int>(pid_));
    }
    close_fds();
  }
}

bool Child::wait_quietly(int64_t timeout_ns) noexcept {
  if (reaped_) {
    return true;
  }
  int64_t deadline = mono_ns() + timeout_ns;
  if (pidfd_ < 0) {
    // Not watched yet (pidfd_open failed): poll waitpid.
    for (;;) {
      if (::waitpid(pid_, &status_, WNOHANG) == pid_) {
        exit_ns_ = mono_ns();
        exit_wall_s_ = wall_s();
        if (options_.own_group) {
          ::kill(-pid_, SIGKILL);
        }
        reaped_ = true;
        close_fds();
        return true;
      }
      if (mono_ns() >= deadline) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  for (;;) {
    int64_t left_ms =
        std::max<int64_t>((deadline - mono_ns() + 999'999) / 1'000'000, 0);
    pollfd p{.fd = pidfd_, .events = POLLIN, .revents = 0};
    int n = ::poll(&p, 1, static_cast<int>(left_ms));
    if (n > 0) {
      reap();
      return true;
    }
    if (n == 0 || errno != EINTR) {
      return false;
    }
  }
}

void Child::reap() noexcept {
  exit_ns_ = mono_ns();
  exit_wall_s_ = wall_s();
  // A process group outlives its leader's exit until the leader is reaped
  // (the zombie keeps the group id from being reused): sweep it first, so
  // that nothing the child left behind survives.
  if (options_.own_group) {
    ::kill(-pid_, SIGKILL);
  }
  while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  close_fds();
}

void Child::close_fds() noexcept {
  close_fd(in_);
  close_fd(out_);
  close_fd(pidfd_);
}

// ---------------------------------------------------------------------------
// ScratchDir.

ScratchDir::ScratchDir(std::string_view prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" +
      std::string(prefix) + "_XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    throw std::runtime_error(errno_text("mkdtemp", errno));
  }
  path_ = templ;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

// ---------------------------------------------------------------------------
// Statistics and the report.

double median(std::vector<double> v) {
  return stats(std::move(v)).median;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) {
    return NAN;
  }
  std::sort(v.begin(), v.end());
  auto k =
      static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(k, v.size() - 1)];
}

Stats stats(std::vector<double> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) {
    return s;
  }
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  s.median = v.size() % 2 != 0 ? v[m] : (v[m - 1] + v[m]) / 2;
  s.min = v.front();
  s.max = v.back();
  return s;
}

std::string format_duration(double seconds, int ms_digits) {
  if (std::isnan(seconds)) {
    return "-";
  }
  return seconds < 1 ? fmt::format("{:.{}f} ms", seconds * 1e3, ms_digits)
                     : fmt::format("{:.2f} s", seconds);
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) {
      out += sep;
    }
    out += p;
  }
  return out;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = std::min(list.find(',', pos), list.size());
    if (comma > pos) {
      out.push_back(list.substr(pos, comma - pos));
    }
    pos = comma + 1;
  }
  return out;
}

std::vector<size_t> parse_counts(const std::string& list, size_t min) {
  std::vector<size_t> out;
  for (std::string item : split(list)) {
    size_t mult = 1;
    if (item.back() == 'k' || item.back() == 'K') {
      mult = 1024;
      item.pop_back();
    }
    size_t used = 0;
    unsigned long v = 0;
    try {
      v = std::stoul(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v * mult < min) {
      throw std::invalid_argument(fmt::format(
          "\"{}\" is not a count of at least {} (like 4096 or 8k)", item, min));
    }
    out.push_back(v * mult);
  }
  return out;
}

std::string load_average() {
  double l[3] = {0, 0, 0};
  if (::getloadavg(l, 3) != 3) {
    return "?";
  }
  return fmt::format("{:.2f} {:.2f} {:.2f}", l[0], l[1], l[2]);
}

std::string now_utc() {
  return format_time("%Y-%m-%d %H:%M UTC", /*utc=*/true);
}

std::string now_local() {
  return format_time("%Y-%m-%d %H:%M %Z", /*utc=*/false);
}

std::string first_line_of(
    const std::vector<std::string>& argv, double timeout_s) {
  try {
    Child child(argv, ChildOptions{.pipes = true});
    LineReader reader(child.out());
    auto line = reader.next(deadline_after(timeout_s), argv.front());
    return line.value_or("");
  } catch (const Interrupted&) {
    throw;
  } catch (const std::runtime_error&) {
    return "";
  }
}

std::string kernel() {
  utsname u{};
  ::uname(&u);
  return std::string(u.sysname) + " " + u.release;
}

double cpu_seconds_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), {});
  auto paren = stat.rfind(')');
  if (paren == std::string::npos) {
    return 0;
  }
  // After "pid (comm)" come fields 3 (state) onwards; utime and stime are
  // fields 14 and 15, in clock ticks.
  std::istringstream rest(stat.substr(paren + 1));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) {
      ticks += std::strtod(field.c_str(), nullptr);
    }
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

uint64_t rss_kb_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return std::strtoull(line.c_str() + 6, nullptr, 10);
    }
  }
  return 0;
}

size_t open_fds_of(pid_t pid) {
  std::error_code ec;
  size_t n = 0;
  for (std::filesystem::directory_iterator
           it("/proc/" + std::to_string(pid) + "/fd", ec),
       end;
       !ec && it != end;
       it.increment(ec)) {
    ++n;
  }
  return n;
}

}  // namespace tide::bench
