#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/common/fd.h"

// What the benchmarks under bench/ share: interrupt handling, the monotonic
// clock, child processes with deadlines, scratch directories, statistics and
// the report's formatting. Everything here is for the main thread of a bench
// unless it says otherwise.
namespace tide::bench {

// ---------------------------------------------------------------------------
// Interrupts: SIGINT and SIGTERM set a flag; the bench's loops and waits
// check it and throw Interrupted, and the bench exits 130 after stopping its
// children.

class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("interrupted") {}
};

// The flag, set once SIGINT or SIGTERM arrived. Lock-free: a signal handler
// or another thread may set it.
std::atomic<bool>& interrupt_flag();
inline bool interrupted() {
  return interrupt_flag().load();
}
// Throws Interrupted once the flag is set.
void throw_if_interrupted();
// Installs a SIGINT and SIGTERM handler that sets the flag. (A bench that
// blocks those signals and waits for them on a thread sets the flag itself.)
void install_interrupt_handlers();

// ---------------------------------------------------------------------------
// Time.

// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine.
int64_t mono_ns();
// mono_ns() `seconds` from now.
int64_t deadline_after(double seconds);

// "what: strerror(err)".
std::string errno_text(std::string_view what, int err);

// A wait status as text: "exit code 1", "killed by SIGKILL".
std::string describe_status(int status);

// Thrown by the waits below when their deadline passes.
class DeadlineExceeded : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Polls one descriptor for `events` until `deadline_ns` (mono_ns clock),
// looking at the interrupt flag every `slice_ms`. Returns false on the
// deadline; throws Interrupted.
bool poll_until(int fd, short events, int64_t deadline_ns, int slice_ms = 100);

// Lines from a pipe. Not thread-safe.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}

  // The next line without its newline; nullopt at end of file. Throws
  // DeadlineExceeded ("timed out waiting for `what`") when `deadline_ns`
  // passes first, Interrupted.
  std::optional<std::string> next(int64_t deadline_ns, std::string_view what);

 private:
  int fd_;
  std::string buf_;
};

// A process's CPU seconds (user + system, all threads) so far, resident
// memory in KiB, and open descriptors, from /proc; 0 when unreadable.
double cpu_seconds_of(pid_t pid);
uint64_t rss_kb_of(pid_t pid);
size_t open_fds_of(pid_t pid);

// ---------------------------------------------------------------------------
// Child processes.

struct ChildOptions {
  // NAME=VALUE; nullopt: the bench's own environment.
  std::optional<std::vector<std::string>> env;
  // Its stdin and stdout on pipes (stdin(), out()); else on /dev/null.
  bool pipes = false;
  // Its stderr goes to this file (truncated); empty: the bench's stderr.
  std::string stderr_path;
  // In a process group of its own, killed as a whole when it is reaped.
  bool own_group = false;
  // PR_SET_PDEATHSIG(SIGKILL): it dies with the bench's thread that made it.
  bool die_with_parent = true;
  // How long stop() (and so the destructor) lets it go after SIGTERM; 0:
  // SIGKILL at once.
  int64_t stop_grace_ns = 0;
  // Named in stop()'s warnings; empty: stop() is silent.
  std::string name;
};

// A child process (fork + exec, argv[0] a path) watched through a pidfd. It
// starts with no signal blocked and SIGPIPE at its default. Not thread-safe.
// The destructor stops it, unless it was reaped already.
class Child {
 public:
  // Throws std::runtime_error when it cannot be started (exec failing
  // included).
  Child(const std::vector<std::string>& argv, ChildOptions options = {});
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const {
    return pid_;
  }
  // mono_ns() just before it was started.
  int64_t start_ns() const {
    return start_ns_;
  }
  // The write end of its stdin; -1 once closed (or without pipes).
  int in() const {
    return in_;
  }
  // The read end of its stdout; -1 without pipes, or once it was reaped.
  int out() const {
    return out_;
  }
  // Closing its stdin is the start or stop signal of some children.
  void close_in();

  // Waits until it exits or `deadline_ns` (mono_ns clock) passes; then
  // reaps it. True if it exited: status(), exit_ns() and exit_wall_s() are
  // then set. Throws Interrupted.
  bool wait_until(int64_t deadline_ns);
  // False once it has exited (it is then reaped). Never blocks.
  bool running();

  // Its wait status, once reaped.
  int status() const {
    return status_;
  }
  // When its exit was seen: mono_ns() clock, and the system clock in seconds
  // since the epoch.
  int64_t exit_ns() const {
    return exit_ns_;
  }
  double exit_wall_s() const {
    return exit_wall_s_;
  }

  // Closes its stdin; sends SIGTERM and waits up to stop_grace_ns if that is
  // positive; then SIGKILL (its group if it has its own) and reaps it,
  // waiting at most kKillWaitNs more. Ignores the interrupt flag.
  // Idempotent; never throws.
  void stop() noexcept;

  static constexpr int64_t kKillWaitNs = 5'000'000'000;

 private:
  // Waits up to `timeout_ns` for it to exit, ignoring the interrupt flag;
  // reaps it if it did.
  bool wait_quietly(int64_t timeout_ns) noexcept;
  void reap() noexcept;
  void close_fds() noexcept;

  ChildOptions options_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int in_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  int64_t start_ns_ = 0;
  int64_t exit_ns_ = 0;
  double exit_wall_s_ = 0;
};

// The first line `argv` prints on stdout (the child is then stopped); empty
// when it prints none within `timeout_s` or cannot be started. For asking a
// peer's interpreter about itself (torch's version, a default).
std::string first_line_of(
    const std::vector<std::string>& argv, double timeout_s);

// ---------------------------------------------------------------------------
// Files.

// A fresh directory under $TMPDIR (or /tmp), `prefix`_XXXXXX, removed with
// its contents when this goes out of scope.
class ScratchDir {
 public:
  // Throws std::runtime_error if it cannot be made.
  explicit ScratchDir(std::string_view prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const {
    return path_;
  }

 private:
  std::filesystem::path path_;
};

// ---------------------------------------------------------------------------
// Statistics and the report.

// NaN for no values.
double median(std::vector<double> v);
// The p-th percentile (nearest rank); NaN for no values.
double percentile(std::vector<double> v, double p);

struct Stats {
  double median = NAN;
  double min = NAN;
  double max = NAN;
  size_t n = 0;
};
Stats stats(std::vector<double> v);

// "12.3 ms" under a second (`ms_digits` decimals), else "1.23 s"; "-" for
// NaN.
std::string format_duration(double seconds, int ms_digits);

// `parts` with `sep` between them.
std::string join(const std::vector<std::string>& parts, std::string_view sep);
// A comma-separated list's non-empty items.
std::vector<std::string> split(const std::string& list);
// A comma-separated list of counts, each a number with an optional k
// (x1024): "4096,8k". Throws std::invalid_argument naming an item that is
// not a count of at least `min`.
std::vector<size_t> parse_counts(const std::string& list, size_t min = 1);

// The 1, 5 and 15 minute load averages, "0.12 0.34 0.56"; "?" if unknown.
std::string load_average();
// The time, to the minute: "2024-05-01 12:34 UTC", or in the local zone.
std::string now_utc();
std::string now_local();
// The kernel, "Linux 6.1.0-18-amd64".
std::string kernel();

using tide::Fd;

}  // namespace tide::bench
