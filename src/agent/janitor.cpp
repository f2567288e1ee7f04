#include "agent/janitor.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tide/common/error.h"

namespace tide::agent::detail {

namespace {

constexpr int kMaxGroups = 65536;

// Runs in the forked child: only async-signal-safe calls from here on, since
// the agent may have had other threads when it forked.
[[noreturn]] void janitor_main(int fd) {
  // Not part of the agent's session: a Ctrl-C to the terminal's foreground
  // group must not take the janitor with the agent.
  ::setsid();
  for (int sig :
       {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE}) {
    ::signal(sig, SIG_IGN);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Keep nothing of the agent's open (listening sockets, log files).
  if (fd != 3) {
    ::dup2(fd, 3);
    fd = 3;
  }
  int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
  }
  ::syscall(SYS_close_range, 4U, ~0U, 0U);

  static pid_t groups[kMaxGroups];
  int count = 0;
  for (;;) {
    int value = 0;
    ssize_t n = ::read(fd, &value, sizeof value);
    if (n == sizeof value) {
      if (value > 0 && count < kMaxGroups) {
        groups[count++] = value;
      } else if (value < 0) {
        for (int i = 0; i < count; ++i) {
          if (groups[i] == -value) {
            groups[i] = groups[--count];
            break;
          }
        }
      }
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    break;  // EOF: the agent is gone.
  }
  for (int i = 0; i < count; ++i) {
    ::kill(-groups[i], SIGKILL);
  }
  ::_exit(0);
}

}  // namespace

Janitor::Janitor() {
  // A socket pair rather than a pipe: writes to a janitor that died must
  // not raise SIGPIPE in the agent (MSG_NOSIGNAL).
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw Error(
        std::string("janitor: socketpair failed: ") + std::strerror(errno));
  }
  Fd theirs(fds[0]);
  Fd ours(fds[1]);
  sigset_t all;
  sigset_t old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);  // Until the child ignores them.
  pid_ = ::fork();
  if (pid_ != 0) {
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  if (pid_ < 0) {
    throw Error(std::string("janitor: fork failed: ") + std::strerror(errno));
  }
  if (pid_ == 0) {
    ours.reset();
    janitor_main(theirs.get());
  }
  fd_ = std::move(ours);
}

Janitor::~Janitor() {
  fd_.reset();
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

void Janitor::tell(int value) const {
  ssize_t n = 0;
  do {
    n = ::send(fd_.get(), &value, sizeof value, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
}

void Janitor::watch_self_from_child() const {
  tell(::getpid());
}

void Janitor::forget(pid_t pgid) {
  tell(-pgid);
}

}  // namespace tide::agent::detail
