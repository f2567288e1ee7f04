#pragma once

#include <cstdint>

// A server holds a descriptor per client, and the usual soft limit (1024)
// is far below what a job's store needs: tide's servers raise the soft
// limit of their process to its hard limit, as Go's runtime does for every
// program, and give child processes the original back (a program that uses
// select() breaks on descriptors past 1024).
namespace tide {

// Raises the soft RLIMIT_NOFILE to the hard limit, once per process, and
// returns the soft limit now in force (0 when unknown). Thread safe.
uint64_t raise_fd_limit();

// In a child between fork and exec: restores the soft limit this process
// had before raise_fd_limit(). Async-signal-safe.
void restore_fd_limit_in_child() noexcept;

}  // namespace tide
