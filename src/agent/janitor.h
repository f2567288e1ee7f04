#pragma once

#include <sys/types.h>

#include "tide/common/fd.h"

// The janitor: a small process forked when an agent starts, which outlives
// it. Each worker registers its process group as it starts, the agent forgets
// it as it ends; when the agent dies, however it dies (SIGKILL included), its
// end of a pipe closes and the janitor kills the process groups still listed,
// so neither workers nor their children survive the agent. A worker's own
// PR_SET_PDEATHSIG covers the worker; the janitor covers what it started.
namespace tide::agent::detail {

class Janitor {
 public:
  // Forks the janitor. Throws Error when it cannot.
  Janitor();
  // Closes the pipe and reaps the janitor (which finds nothing to kill when
  // the agent stopped its workers itself).
  ~Janitor();
  Janitor(const Janitor&) = delete;
  Janitor& operator=(const Janitor&) = delete;

  // Best effort: a janitor that is gone cannot be told.
  void forget(pid_t pgid);

  // Called in a freshly forked worker, before it runs anything: registers
  // the worker's own process group, so no child of the worker can exist
  // before the janitor knows the group. Async-signal-safe.
  void watch_self_from_child() const;

 private:
  // Async-signal-safe.
  void tell(int value) const;
  Fd fd_;
  pid_t pid_ = -1;
};

}  // namespace tide::agent::detail
