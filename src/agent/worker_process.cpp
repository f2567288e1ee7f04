#include "agent/worker_process.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/mempolicy.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

#include "tide/agent/numa.h"
#include "tide/common/error.h"
#include "tide/common/fd_limit.h"
#include "tide/common/logging.h"

#include "agent/entrypoint_run.h"
#include "agent/janitor.h"
#include "common/clock.h"

extern char** environ;

namespace tide::agent::detail {

namespace {

void write_all(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t n = ::write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return;  // A closed console or a full disk: the output is lost, not the
               // run.
    }
    data += n;
    len -= static_cast<size_t>(n);
  }
}

// Bit id of word id / bits-per-word set, for each id.
std::vector<unsigned long> bit_mask(const std::vector<int>& ids) {
  constexpr size_t kWordBits = sizeof(unsigned long) * CHAR_BIT;
  std::vector<unsigned long> mask;
  for (int id : ids) {
    auto bit = static_cast<size_t>(id);
    if (mask.size() <= bit / kWordBits) {
      mask.resize(bit / kWordBits + 1, 0);
    }
    mask[bit / kWordBits] |= 1UL << (bit % kWordBits);
  }
  return mask;
}

// Child side: async-signal-safe. A failure is reported as a failed exec is.
[[noreturn]] void exit_in_child(
    const char* what, const std::string& list, int err) {
  for (const char* piece : std::initializer_list<const char*>{
           "tide: cannot bind the worker to ",
           what,
           " ",
           list.c_str(),
           " (--numa-binding): ",
           std::strerror(err),
           "\n"}) {
    write_all(STDERR_FILENO, piece, std::strlen(piece));
  }
  ::_exit(127);
}

void apply_binding_in_child(const Binding& b) {
  if (::sched_setaffinity(
          0,
          b.cpus.size() * sizeof(unsigned long),
          reinterpret_cast<const cpu_set_t*>(b.cpus.data())) != 0) {
    exit_in_child("CPUs", b.cpus_text, errno);
  }
  // maxnode counts one more than the mask's bits: the kernel drops one.
  if (!b.mem_nodes.empty() &&
      ::syscall(
          SYS_set_mempolicy,
          MPOL_BIND,
          b.mem_nodes.data(),
          b.mem_nodes.size() * sizeof(unsigned long) * CHAR_BIT + 1) != 0) {
    exit_in_child("memory nodes", b.mem_nodes_text, errno);
  }
}

// Child side of fork(): async-signal-safe calls only until exec.
[[noreturn]] void child_exec_or_run(
    const Janitor& janitor,
    pid_t parent,
    int out_fd,
    int err_fd,
    const LaunchSpec& spec,
    char* const* argv,
    char* const* envp) {
  ::setsid();
  restore_fd_limit_in_child();
  // Registered here rather than by the parent after fork(): the parent may
  // not run again before this worker has started children of its own.
  janitor.watch_self_from_child();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) {
    ::_exit(1);  // The agent died before we could arm the death signal.
  }
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) {
      ::signal(sig, SIG_DFL);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (out_fd >= 0) {
    ::dup2(out_fd, STDOUT_FILENO);
  }
  if (err_fd >= 0) {
    ::dup2(err_fd, STDERR_FILENO);
  }
  if (spec.binding) {
    apply_binding_in_child(*spec.binding);
  }
  unsigned first_closed = 3;
  if (spec.keep_fd >= 0) {
    if (spec.keep_fd != 3) {
      ::dup2(spec.keep_fd, 3);  // the copy is not close-on-exec
    } else {
      ::fcntl(3, F_SETFD, 0);
    }
    first_closed = 4;
  }
  if (!spec.path.empty()) {
    // Nothing of the agent's (its store's sockets, the janitor's channel)
    // leaks into the worker.
    ::syscall(SYS_close_range, first_closed, ~0U, CLOSE_RANGE_CLOEXEC);
    ::execve(spec.path.c_str(), argv, envp);
    const char* msg = "tide: exec failed: ";
    write_all(STDERR_FILENO, msg, std::strlen(msg));
    const char* err = std::strerror(errno);
    write_all(STDERR_FILENO, err, std::strlen(err));
    write_all(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  // Fork start method: the function runs in this copy of the agent, without
  // the agent's descriptors (a copy of the janitor's channel would keep the
  // janitor from noticing the agent's death).
  ::syscall(SYS_close_range, 3U, ~0U, 0U);
  environ = const_cast<char**>(envp);
  int code = run_function(spec.function, spec.function_args, spec.result_file);
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace

Fd open_log(const std::string& path) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!fd) {
    throw Error("cannot open log file " + path + ": " + std::strerror(errno));
  }
  return fd;
}

Binding Binding::make(
    const std::vector<int>& cpus, const std::vector<int>& mem_nodes) {
  if (cpus.empty()) {
    throw InvalidArgument("a NUMA binding needs at least one CPU");
  }
  auto negative = [](int id) { return id < 0; };
  if (std::ranges::any_of(cpus, negative) ||
      std::ranges::any_of(mem_nodes, negative)) {
    throw InvalidArgument("a NUMA binding names a negative CPU or node");
  }
  return Binding{
      .cpus = bit_mask(cpus),
      .mem_nodes = bit_mask(mem_nodes),
      .cpus_text = format_cpulist(cpus),
      .mem_nodes_text = format_cpulist(mem_nodes),
  };
}

std::string find_executable(
    const std::string& file, const std::string& path_env) {
  if (file.find('/') != std::string::npos) {
    return ::access(file.c_str(), X_OK) == 0 ? file : "";
  }
  // A string, not a string_view of the conditional: that would view a
  // temporary.
  const std::string path =
      path_env.empty() ? std::string("/usr/local/bin:/usr/bin:/bin") : path_env;
  std::string_view rest = path;
  while (true) {
    auto colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    std::string candidate = (dir.empty() ? "." : dir) + "/" + file;
    if (::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    if (colon == std::string_view::npos) {
      return "";
    }
    rest.remove_prefix(colon + 1);
  }
}

bool DuplicateSink::matches(std::string_view line) const {
  // torch's test: a plain substring, case-sensitive ("" matches all).
  return std::any_of(filters.begin(), filters.end(), [&](const auto& f) {
    return line.find(f) != std::string_view::npos;
  });
}

TeePump::TeePump(
    Fd read_fd,
    Fd file_fd,
    int console_fd,
    std::string prefix,
    std::shared_ptr<const DuplicateSink> duplicate)
    : read_fd_(std::move(read_fd)),
      file_fd_(std::move(file_fd)),
      console_fd_(console_fd),
      prefix_(std::move(prefix)),
      duplicate_(std::move(duplicate)) {
  ::fcntl(
      read_fd_.get(), F_SETFL, ::fcntl(read_fd_.get(), F_GETFL) | O_NONBLOCK);
}

bool TeePump::pump() {
  if (!read_fd_) {
    return false;
  }
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(read_fd_.get(), buf, sizeof buf);
    if (n > 0) {
      write_all(file_fd_.get(), buf, static_cast<size_t>(n));
      partial_.append(buf, static_cast<size_t>(n));
      emit_lines(false);
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return true;
    }
    emit_lines(true);
    read_fd_.reset();
    return false;
  }
}

void TeePump::finish() {
  while (read_fd_) {
    pollfd p{.fd = read_fd_.get(), .events = POLLIN, .revents = 0};
    // What the process wrote before it exited is in the pipe already;
    // anything still open by its children is not waited for.
    if (::poll(&p, 1, 0) <= 0) {
      emit_lines(true);
      return;
    }
    pump();
  }
}

void TeePump::emit(std::string_view text) {
  std::string line = prefix_;
  line += text;
  write_all(console_fd_, line.data(), line.size());
  if (duplicate_ && duplicate_->matches(text)) {
    // One write per line: the ranks' lines never interleave inside one.
    write_all(duplicate_->fd.get(), line.data(), line.size());
  }
}

void TeePump::emit_lines(bool flush_partial) {
  size_t start = 0;
  for (;;) {
    size_t nl = partial_.find('\n', start);
    if (nl == std::string::npos) {
      break;
    }
    emit(std::string_view(partial_).substr(start, nl - start + 1));
    start = nl + 1;
  }
  partial_.erase(0, start);
  if (flush_partial && !partial_.empty()) {
    partial_ += '\n';
    emit(partial_);
    partial_.clear();
  }
}

std::pair<Fd, Fd> WorkerProcess::open_targets(const LaunchSpec& spec) {
  // Descriptors the child gets as stdout/stderr. None: inherit.
  Fd child_fds[2];
  auto setup = [&](const StreamTarget& t, int index, int console) {
    if (t.mode == StreamTarget::Mode::kInherit) {
      return;
    }
    Fd file = open_log(t.path);
    if (t.mode == StreamTarget::Mode::kFile) {
      child_fds[index] = std::move(file);
      return;
    }
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
      throw Error(std::string("pipe failed: ") + std::strerror(errno));
    }
    child_fds[index].reset(p[1]);
    pumps_.emplace_back(
        Fd(p[0]), std::move(file), console, spec.console_prefix, t.duplicate);
  };
  setup(spec.out, 0, STDOUT_FILENO);
  setup(spec.err, 1, STDERR_FILENO);
  return {std::move(child_fds[0]), std::move(child_fds[1])};
}

std::pair<Fd, Fd> WorkerProcess::retarget(const LaunchSpec& spec) {
  for (TeePump& p : pumps_) {
    p.finish();
  }
  pumps_.clear();
  local_rank_ = spec.local_rank;
  return open_targets(spec);
}

WorkerProcess::WorkerProcess(const LaunchSpec& spec, Janitor* janitor)
    : local_rank_(spec.local_rank), janitor_(janitor) {
  // Closed in the parent after the fork.
  auto [child_out, child_err] = open_targets(spec);
  Fd child_fds[2] = {std::move(child_out), std::move(child_err)};

  // Everything the child needs is built before fork().
  std::vector<char*> argv;
  for (const auto& a : spec.argv) {
    argv.push_back(const_cast<char*>(a.c_str()));
  }
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.env) {
    envp.push_back(const_cast<char*>(e.c_str()));
  }
  envp.push_back(nullptr);

  pid_t parent = ::getpid();
  std::fflush(nullptr);
  // Signals stay blocked from fork() until the child has reset their
  // handlers: a signal in between must not run the agent's handler (which
  // would write to the agent's wake-up descriptor) inside the child.
  sigset_t all;
  sigset_t old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_ = ::fork();
  if (pid_ != 0) {
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  if (pid_ < 0) {
    int err = errno;
    throw Error(std::string("fork failed: ") + std::strerror(err));
  }
  if (pid_ == 0) {
    child_exec_or_run(
        *janitor_,
        parent,
        child_fds[0].get(),
        child_fds[1].get(),
        spec,
        argv.data(),
        envp.data());
  }
  for (Fd& fd : child_fds) {
    fd.reset();
  }
  pidfd_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
  if (!pidfd_) {
    int err = errno;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    janitor_->forget(pid_);
    throw Error(std::string("pidfd_open failed: ") + std::strerror(err));
  }
}

WorkerProcess::~WorkerProcess() {
  if (!status_ && !abandoned_) {
    signal(SIGKILL);
    pollfd p{.fd = pidfd_.get(), .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 1000) > 0) {
      poll_exit();
    }
  }
}

bool WorkerProcess::poll_exit() {
  if (status_) {
    return true;
  }
  siginfo_t info{};
  // Peek without reaping: while the process is a zombie its group id cannot
  // be reused, so the group can be cleared safely first.
  if (::waitid(
          P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) !=
          0 ||
      info.si_pid != pid_) {
    return false;
  }
  ::kill(-pid_, SIGKILL);
  int st = 0;
  if (::waitpid(pid_, &st, 0) == pid_) {
    on_exit(st);
  }
  return status_.has_value();
}

void WorkerProcess::set_status(int wait_status) {
  if (!status_) {
    on_exit(wait_status);
  }
}

void WorkerProcess::on_exit(int wait_status) {
  status_ = wait_status;
  exit_time_ = now_seconds();
  janitor_->forget(pid_);
}

int WorkerProcess::exitcode() const {
  int st = *status_;
  if (WIFEXITED(st)) {
    return WEXITSTATUS(st);
  }
  if (WIFSIGNALED(st)) {
    return -WTERMSIG(st);
  }
  return -1;
}

void WorkerProcess::signal(int sig) const {
  if (status_ || abandoned_) {
    return;
  }
  if (::kill(-pid_, sig) != 0) {
    ::kill(pid_, sig);
  }
}

void WorkerProcess::abandon() {
  abandoned_ = true;
}

}  // namespace tide::agent::detail
