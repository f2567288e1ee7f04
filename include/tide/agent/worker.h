#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tide/agent/worker_spec.h"

namespace tide::agent {

// The state of a worker group; the group changes state as a unit.
enum class WorkerState {
  kUnknown,
  kInit,
  kHealthy,
  kUnhealthy,
  kStopped,
  kSucceeded,
  kFailed,
};

// torch's names: "UNKNOWN", "INIT", "HEALTHY", ...
const char* to_string(WorkerState s);
inline bool is_running(WorkerState s) {
  return s == WorkerState::kHealthy || s == WorkerState::kUnhealthy;
}

// One worker process of a group. Plain values, copied into results and
// status snapshots: a pid is the process's while the group runs, and may be
// reused once the agent reaped it.
struct Worker {
  int local_rank = 0;
  int global_rank = -1;
  int role_rank = -1;
  int world_size = -1;
  int role_world_size = -1;
  pid_t pid = -1;  // torch's Worker.id
};

// The agent's current group: owned by the agent and changed only by run(),
// on its thread; read it from there (or after run() returned). `store` is
// the round's store, shared with the rendezvous handler; it lives as long
// as someone holds it.
struct WorkerGroup {
  const WorkerSpec* spec = nullptr;
  std::vector<Worker> workers;
  std::shared_ptr<store::Store> store;
  int group_rank = -1;
  int group_world_size = -1;
  WorkerState state = WorkerState::kInit;
};

// Why a worker failed (torch's ProcessFailure).
struct ProcessFailure {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  // The exit code, or minus the signal number when a signal killed it.
  int exitcode = 0;
  std::string host;
  // Seconds since the epoch: from the error file when it has one, else the
  // time the agent saw the exit.
  double timestamp = 0;
  // TORCHELASTIC_ERROR_FILE of the worker, and its contents when written.
  std::string error_file;
  std::string error_file_data;
  // The error's message: from the error file, else "Signal 9 (SIGKILL)
  // received by PID 123" or "exited with code 1".
  std::string message;
  // The traceback from the error file, if any.
  std::string traceback;

  std::string signal_name() const;  // "SIGKILL", or "" for an exit code
};

// What agent.run() returns. Exactly one of return_values and failures is
// filled, by global rank; workers the agent stopped appear in neither.
struct RunResult {
  WorkerState state = WorkerState::kUnknown;
  std::map<int, std::string> return_values;
  std::map<int, ProcessFailure> failures;

  bool is_failed() const {
    return state == WorkerState::kFailed;
  }
  // The first failure observed (smallest timestamp), or null.
  const ProcessFailure* root_cause() const;
};

}  // namespace tide::agent
