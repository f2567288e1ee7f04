#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/common/fd.h"

#include "support/line_reader.h"

extern char** environ;

// A Python process running tests/interop/torch_store_peer.py with Debian's
// PyTorch, driven over pipes: its stdin takes command lines, its stdout and
// stderr come back as one stream read line by line, each read with a
// deadline. Closing its stdin makes it exit; the destructor kills and reaps
// it in any case. Errors are std::runtime_error quoting everything the peer
// printed, so a failing test shows why.
//
// Thread safety: none; one thread drives one peer.
namespace tide::test {

using std::chrono::milliseconds;

// Always the system interpreter: the python3 first on PATH may lack torch.
inline constexpr const char* kSystemPython = "/usr/bin/python3";
inline constexpr const char* kPeerScript =
    TIDE_INTEROP_DIR "/torch_store_peer.py";

using tide::Fd;

class TorchPeer {
 public:
  // Starts `python3 -u torch_store_peer.py args...`; started() then waits
  // for it to import torch. Throws when python cannot be started.
  explicit TorchPeer(const std::vector<std::string>& args)
      : name_("torch_store_peer.py") {
    for (const auto& a : args) {
      name_ += " " + a;
    }
    std::vector<std::string> argv = {kSystemPython, "-u", kPeerScript};
    argv.insert(argv.end(), args.begin(), args.end());
    spawn(argv);
  }

  // Closes its stdin, then kills (SIGKILL) and reaps it if still running.
  ~TorchPeer() {
    stdin_.reset();
    if (!status_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
    }
  }

  // Waits up to timeout for its HELLO line: torch imported. Throws, saying
  // so, when /usr/bin/python3 cannot import torch.
  void started(milliseconds timeout) {
    torch_version_ = expect("HELLO torch ", timeout);
  }

  TorchPeer(const TorchPeer&) = delete;
  TorchPeer& operator=(const TorchPeer&) = delete;

  // torch.__version__ as the peer reported it.
  const std::string& torch_version() const {
    return torch_version_;
  }

  // Everything the peer printed so far.
  const std::string& transcript() const {
    return out_.transcript();
  }

  // Reads lines until one starts with prefix and returns the rest of it.
  // Other lines (warnings, INFO) only go to the transcript. Throws when the
  // peer prints FAIL, exits, or stays silent past timeout.
  std::string expect(std::string_view prefix, milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      std::optional<std::string> line = read_line(deadline);
      if (!line) {
        fail(
            "expected a line starting with \"" + std::string(prefix) +
            "\" within " + std::to_string(timeout.count()) + " ms");
      }
      if (line->starts_with(prefix)) {
        return line->substr(prefix.size());
      }
      if (line->starts_with("FAIL ") || line->starts_with("NOTORCH ")) {
        // Collect the other failed checks too, briefly.
        auto drain = std::min(
            deadline,
            std::chrono::steady_clock::now() + std::chrono::seconds(5));
        for (auto more = read_line(drain);
             more && !more->starts_with("FAILED ");
             more = read_line(drain)) {
        }
        fail("expected \"" + std::string(prefix) + "\", got \"" + *line + "\"");
      }
    }
  }

  void send_line(std::string_view line) {
    std::string bytes = std::string(line) + "\n";
    std::string_view rest = bytes;
    while (!rest.empty()) {
      ssize_t n = ::write(stdin_.get(), rest.data(), rest.size());
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n <= 0) {
        fail(
            "writing to its stdin failed: " +
            std::string(std::strerror(errno)));
      }
      rest.remove_prefix(static_cast<size_t>(n));
    }
  }

  // One command of server mode and its reply line; throws on "ERROR ...".
  std::string call(std::string_view command, milliseconds timeout) {
    send_line(command);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    std::optional<std::string> line = read_line(deadline);
    if (!line || line->starts_with("ERROR")) {
      fail(
          "command \"" + std::string(command).substr(0, 100) + "\" got " +
          (line ? "\"" + *line + "\"" : "no reply in time"));
    }
    return *line;
  }

  // Waits up to timeout for the peer to exit by itself (reading what it
  // prints meanwhile); returns its exit code, or 128 + signal. Throws on
  // timeout.
  int wait_exit(milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!out_.eof()) {
      if (!read_line(deadline) && !out_.eof()) {
        fail("did not exit within " + std::to_string(timeout.count()) + " ms");
      }
    }
    // Its output closed; the exit follows. A pidfd becomes readable then.
    Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    if (pidfd.get() < 0) {
      fail("pidfd_open failed: " + std::string(std::strerror(errno)));
    }
    if (!poll_readable(pidfd.get(), deadline)) {
      fail("closed its output but did not exit in time");
    }
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    status_ = st;
    stdin_.reset();
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

  // Closes its stdin: the peer exits (server mode: cleanly, with 0).
  void close_stdin() {
    stdin_.reset();
  }

 private:
  void spawn(const std::vector<std::string>& argv) {
    int in[2];
    int out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      throw std::runtime_error("TorchPeer: pipe2 failed");
    }
    Fd in_read(in[0]);
    stdin_ = Fd(in[1]);
    Fd out_write(out[1]);
    stdout_ = Fd(out[0]);
    out_.reset(stdout_.get());
    // A test that dies between writes must not be killed by SIGPIPE.
    ::signal(SIGPIPE, SIG_IGN);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in_read.get(), STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out_write.get(), STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out_write.get(), STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    int rc =
        ::posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      throw std::runtime_error(
          std::string("TorchPeer: cannot run ") + kSystemPython + ": " +
          std::strerror(rc) +
          "; install python3-torch (scripts/setup.sh does)");
    }
  }

  // The next whole line, or nullopt at EOF (eof() set) or the deadline.
  std::optional<std::string> read_line(
      std::chrono::steady_clock::time_point deadline) {
    return out_.read_line(deadline);
  }

  [[noreturn]] void fail(const std::string& what) const {
    std::string msg = "torch peer `" + name_ + "` (pid " +
                      std::to_string(pid_) + "): " + what;
    if (out_.transcript().find("NOTORCH") != std::string::npos) {
      msg +=
          "\n" + std::string(kSystemPython) +
          " cannot import torch: install python3-torch (scripts/setup.sh does)";
    }
    std::string shown =
        out_.transcript().size() > 16384
            ? "..." + out_.transcript().substr(out_.transcript().size() - 16384)
            : out_.transcript();
    throw std::runtime_error(
        msg + "\n--- it printed ---\n" + shown + "--- end ---");
  }

  std::string name_;
  pid_t pid_ = -1;
  Fd stdin_;
  Fd stdout_;
  LineReader out_;
  std::string torch_version_;
  std::optional<int> status_;
};

}  // namespace tide::test
