#pragma once

#include <chrono>
#include <string>
#include <vector>

// Runs a helper program to its end, with a deadline: a health check's
// command, a stack dump of a hung worker. Private to the agent.
namespace tide::agent::detail {

struct CommandResult {
  // Exit code, or minus the signal; -1 when it could not start.
  int exitcode = -1;
  bool timed_out = false;
  // stdout and stderr, interleaved, cut at max_output bytes.
  std::string output;
};

// Runs argv (argv[0] looked up in PATH) in a session of its own, stdin
// from /dev/null. At `timeout` its process group is killed. Blocks the
// caller until the program ended and its output was read; never throws
// for the program's failures (they are in the result).
CommandResult run_command(
    const std::vector<std::string>& argv,
    std::chrono::milliseconds timeout,
    size_t max_output = 64 * 1024);

}  // namespace tide::agent::detail
