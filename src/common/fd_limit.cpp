#include "tide/common/fd_limit.h"

#include <sys/resource.h>

#include <mutex>

namespace tide {

namespace {

// The limit before raise_fd_limit(); valid once `raised` is set, read by
// children after fork without locking (fork copies it as it was).
rlimit original{};
bool raised = false;

}  // namespace

uint64_t raise_fd_limit() {
  static std::once_flag once;
  static uint64_t now = 0;
  std::call_once(once, [] {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
      return;
    }
    now = rl.rlim_cur;
    if (rl.rlim_cur == rl.rlim_max) {
      return;
    }
    rlimit up = rl;
    up.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &up) == 0) {
      original = rl;
      raised = true;
      now = up.rlim_cur;
    }
  });
  return now == RLIM_INFINITY ? UINT64_MAX : now;
}

void restore_fd_limit_in_child() noexcept {
  if (raised) {
    ::setrlimit(RLIMIT_NOFILE, &original);
  }
}

}  // namespace tide
