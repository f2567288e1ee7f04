#include "server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace tide::bench {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string errno_text(int err) {
  return std::strerror(err);
}

// Waits up to timeout for pid to exit and reaps it: its wait status, or
// nullopt while it still runs.
std::optional<int> wait_exit(pid_t pid, milliseconds timeout) {
  // A pidfd becomes readable when the child exits: no polling loop.
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    pollfd p{.fd = pidfd, .events = POLLIN, .revents = 0};
    auto deadline = Clock::now() + timeout;
    for (;;) {
      auto left =
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      int r =
          ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      if (r >= 0 || errno != EINTR) {
        break;
      }
    }
    ::close(pidfd);
  }
  int status = 0;
  pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == pid) {
    return status;
  }
  if (r < 0 && errno == ECHILD) {
    return 0;  // Already reaped.
  }
  if (pidfd < 0) {
    // No pidfd (kernel before 5.3): poll waitpid until the deadline.
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        return status;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

ServerProcess::ServerProcess(
    std::string name,
    const std::vector<std::string>& argv,
    milliseconds start_timeout)
    : name_(std::move(name)) {
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> args;
  for (const auto& a : argv) {
    args.push_back(const_cast<char*>(a.c_str()));
  }
  args.push_back(nullptr);
  std::string exec_failed = "store_bench: cannot execute " + argv.at(0) + "\n";

  int in[2];
  int out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe: " + errno_text(errno));
  }
  if (::pipe2(out, O_CLOEXEC) != 0) {
    int err = errno;
    ::close(in[0]);
    ::close(in[1]);
    throw std::runtime_error("pipe: " + errno_text(err));
  }
  pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    int err = errno;
    for (int fd : {in[0], in[1], out[0], out[1]}) {
      ::close(fd);
    }
    throw std::runtime_error("fork: " + errno_text(err));
  }
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) {
      ::_exit(1);  // The parent died before prctl.
    }
    // store_bench blocks SIGINT/SIGTERM and ignores SIGPIPE; exec keeps both.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::execv(args[0], args.data());
    ssize_t ignored =
        ::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    (void)ignored;
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  stdin_ = in[1];
  stdout_ = out[0];
  try {
    port_ = read_port(start_timeout);
  } catch (...) {
    stop();
    throw;
  }
}

ServerProcess::~ServerProcess() {
  stop();
}

bool ServerProcess::alive() {
  if (reaped_) {
    return false;
  }
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    reaped_ = true;
    return false;
  }
  return true;
}

double ServerProcess::cpu_seconds() const {
  std::ifstream f("/proc/" + std::to_string(pid_) + "/stat");
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

void ServerProcess::stop() noexcept {
  if (stdin_ >= 0) {
    ::close(stdin_);
    stdin_ = -1;
  }
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGTERM);
    auto status = wait_exit(pid_, kStopTimeout);
    if (!status) {
      std::fprintf(
          stderr,
          "store_bench: %s (pid %d) ignored SIGTERM for %lld ms; killing it\n",
          name_.c_str(),
          static_cast<int>(pid_),
          static_cast<long long>(kStopTimeout.count()));
      ::kill(pid_, SIGKILL);
      status = wait_exit(pid_, kStopTimeout);
    }
    if (status) {
      reaped_ = true;
    } else {
      std::fprintf(
          stderr,
          "store_bench: %s (pid %d) survived SIGKILL; not reaped\n",
          name_.c_str(),
          static_cast<int>(pid_));
    }
  }
  if (stdout_ >= 0) {
    ::close(stdout_);
    stdout_ = -1;
  }
}

uint16_t ServerProcess::read_port(milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::string buf;
  for (;;) {
    auto nl = buf.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf.substr(0, nl);
      size_t end = line.find_last_not_of(" \r\t");
      if (end != std::string::npos) {
        size_t begin = line.find_last_not_of("0123456789", end);
        begin = begin == std::string::npos ? 0 : begin + 1;
        long port = std::strtol(line.c_str() + begin, nullptr, 10);
        if (begin <= end && port > 0 && port < 65536) {
          return static_cast<uint16_t>(port);
        }
      }
      throw std::runtime_error(
          name_ + " printed \"" + line + "\" where its port was expected");
    }
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      throw std::runtime_error(
          name_ + " did not print its port within " +
          std::to_string(timeout.count() / 1000) + " s");
    }
    pollfd p{.fd = stdout_, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      continue;  // EINTR, or the deadline, which the check above reports.
    }
    char chunk[512];
    ssize_t n = ::read(stdout_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      throw std::runtime_error(
          name_ + " exited before printing its port (its stderr is above)");
    }
    buf.append(chunk, static_cast<size_t>(n));
  }
}

}  // namespace tide::bench
