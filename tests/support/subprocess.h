#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// A child process for tests: argv exec'd with its stdout on a pipe, read line
// by line with a deadline; killed and reaped when the object goes away.
#include "support/line_reader.h"

extern char** environ;

namespace tide::test {

struct SubprocessOptions {
  // Added to (or replacing in) the parent's environment.
  std::vector<std::pair<std::string, std::string>> env;
  // Send stderr to the same pipe as stdout.
  bool merge_stderr = false;
  // Give the child a pipe as stdin, written by write_line().
  bool pipe_stdin = false;
};

class Subprocess {
 public:
  explicit Subprocess(
      const std::vector<std::string>& argv,
      const SubprocessOptions& options = {}) {
    int out[2];
    int in[2] = {-1, -1};
    if (::pipe2(out, O_CLOEXEC) != 0 ||
        (options.pipe_stdin && ::pipe2(in, O_CLOEXEC) != 0)) {
      throw std::runtime_error("Subprocess: pipe failed");
    }
    // The child's environment, built before fork() (only async-signal-safe
    // calls are allowed in the child of a threaded process).
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv = *e;
      bool replaced = false;
      for (const auto& [k, v] : options.env) {
        replaced = replaced || kv.rfind(k + "=", 0) == 0;
      }
      if (!replaced) {
        env_strings.push_back(kv);
      }
    }
    for (const auto& [k, v] : options.env) {
      env_strings.push_back(k + "=" + v);
    }
    std::vector<char*> envp;
    for (auto& e : env_strings) {
      envp.push_back(e.data());
    }
    envp.push_back(nullptr);
    std::vector<char*> args;
    for (const auto& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) {
      throw std::runtime_error("Subprocess: fork failed");
    }
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      if (options.merge_stderr) {
        ::dup2(out[1], STDERR_FILENO);
      }
      if (in[0] >= 0) {
        ::dup2(in[0], STDIN_FILENO);
      }

      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
    ::close(out[1]);
    out_ = out[0];
    out_reader_.reset(out_);
    if (in[0] >= 0) {
      ::close(in[0]);
      in_ = in[1];
    }
  }
  ~Subprocess() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    if (out_ >= 0) {
      ::close(out_);
    }
    if (in_ >= 0) {
      ::close(in_);
    }
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const {
    return pid_;
  }

  // The next line of the child's stdout, or nullopt on EOF or timeout.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    return out_reader_.read_line(timeout);
  }

  // Closes the child's stdin (pipe_stdin): it reads end of file.
  void close_stdin() {
    if (in_ >= 0) {
      ::close(in_);
      in_ = -1;
    }
  }

  // Writes `line` and a newline to the child's stdin (pipe_stdin).
  void write_line(const std::string& line) {
    std::string all = line + "\n";
    if (in_ < 0 || ::write(in_, all.data(), all.size()) !=
                       static_cast<ssize_t>(all.size())) {
      throw std::runtime_error("Subprocess: cannot write to the child's stdin");
    }
  }

  // Everything the child writes until it closes its output (or timeout).
  std::string read_all(std::chrono::milliseconds timeout) {
    std::string all;
    while (auto line = out_reader_.read_line(timeout)) {
      all += *line + "\n";
    }
    return all;
  }

  // Signals the child unless it was reaped already (its pid may be reused).
  void signal(int sig) {
    if (!status_) {
      ::kill(pid_, sig);
    }
  }

  // The wait status once the child exits within timeout, else nullopt.
  std::optional<int> wait(std::chrono::milliseconds timeout) {
    if (status_) {
      return status_;
    }
    // A pidfd becomes readable when the child exits: no polling loop.
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd < 0) {
      throw std::runtime_error("Subprocess: pidfd_open failed");
    }
    pollfd p{.fd = pidfd, .events = POLLIN, .revents = 0};
    int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
    ::close(pidfd);
    if (r <= 0) {
      return std::nullopt;
    }
    int st = 0;
    ::waitpid(pid_, &st, 0);
    status_ = st;
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  int in_ = -1;
  LineReader out_reader_;
  std::optional<int> status_;
};

}  // namespace tide::test
