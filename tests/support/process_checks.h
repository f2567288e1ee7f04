#pragma once

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <string>

namespace tide::test {

// True when process `pid` has ended (or is a zombie) within `timeout`. Works
// for processes that are not our children: a pidfd turns readable at exit.
inline bool process_gone_within(pid_t pid, std::chrono::milliseconds timeout) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    return errno == ESRCH;
  }
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
  ::close(fd);
  return r > 0;
}

// The first integer in a file, or -1.
inline pid_t read_pid(const std::string& path) {
  std::ifstream in(path);
  pid_t pid = -1;
  in >> pid;
  return in ? pid : -1;
}

}  // namespace tide::test
