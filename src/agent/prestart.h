#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tide/common/fd.h"

#include "agent/worker_process.h"

// Prestarted Python interpreters (tiderun --prestart): started before they
// are needed, with the heavy imports done, each waiting on a hand-off
// channel (a Unix socket, its descriptor 3). When an attempt starts, the
// agent hands one its worker's environment, argv, working directory and
// output descriptors, and it runs the script as `python -u script.py` (or
// `-m module`) would. Private to the agent; docs/tiderun.md#prestarted-workers.
namespace tide::agent::detail {

class Janitor;

// How a worker command runs Python, when it does in a way the pool serves:
// `PYTHON -u SCRIPT ARGS...` or `PYTHON -u -m MODULE ARGS...`.
struct PythonCommand {
  std::string python;  // the resolved interpreter
  bool module = false;
  std::string target;  // the script's path, or the module's name
  std::vector<std::string> args;

  // Null, with the reason, for any other command.
  static std::optional<PythonCommand> parse(
      const std::string& resolved_path,
      const std::vector<std::string>& argv,
      std::string* why_not);
};

class PrestartPool {
 public:
  struct Options {
    std::vector<std::string> imports;  // imported before the hand-off
    int spares = 0;                    // interpreters beyond one per rank
    std::string log_dir;               // their output before a hand-off
  };

  PrestartPool(Options options, Janitor* janitor);
  // Kills every waiting interpreter.
  ~PrestartPool();
  PrestartPool(const PrestartPool&) = delete;
  PrestartPool& operator=(const PrestartPool&) = delete;

  // Starts the interpreters missing: one per entry of `slots` (a local
  // rank's launch, its per-attempt variables dropped) and the spares (like
  // local rank 0's). Cheap: the imports run in the new processes; `gated`
  // ones start them only once released (one taken before that imports
  // nothing of its own, as a cold worker).
  void fill(
      const std::string& python,
      const std::vector<LaunchSpec>& slots,
      bool gated = false);
  // Lets the gated interpreters import.
  void release();

  // An interpreter for `spec` (whose argv runs `cmd`), handed its work; null
  // when none can take it (the reason in *why_not): none waits, or its
  // import-time environment or CPU binding differs from the worker's.
  std::unique_ptr<WorkerProcess> take(
      const LaunchSpec& spec, const PythonCommand& cmd, std::string* why_not);

  // Kills the waiting interpreters.
  void drain();

  // Records the exit of a waiting interpreter that was reaped elsewhere
  // (waitpid(-1) of a subreaper); false when `pid` is none of them.
  bool reaped(pid_t pid, int wait_status);

  // The variables that may differ between a prestarted interpreter and its
  // worker: those the agent sets per rank and per attempt. Any other
  // difference sends the worker to a cold start.
  static bool per_attempt(const std::string& name);

 private:
  struct Waiting {
    int local_rank = -1;           // -1: a spare
    std::vector<std::string> env;  // import-time environment, sorted
    std::optional<Binding> binding;
    std::unique_ptr<WorkerProcess> process;
    Fd channel;          // the agent's end
    bool gated = false;  // not yet released
  };

  void start(
      const std::string& python,
      const LaunchSpec& slot,
      int local_rank,
      bool gated);

  Options options_;
  Janitor* janitor_;
  std::vector<Waiting> waiting_;
  int started_ = 0;
};

}  // namespace tide::agent::detail
