#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/common/fd.h"

// One worker process: how it is started (exec of a command, fork into a
// function), where its output goes, and its exit. Private to the agent.
namespace tide::agent::detail {

class Janitor;

// Where one of a worker's standard streams goes.
// Opens (creates) a log file for appending; Error naming it when it cannot.
Fd open_log(const std::string& path);

// Where a stream's tee'd lines that contain one of `filters` are copied
// too (--duplicate-stdout-filters): one file for every local rank.
struct DuplicateSink {
  Fd fd;
  std::vector<std::string> filters;
  bool matches(std::string_view line) const;
};

struct StreamTarget {
  enum class Mode {
    kInherit,  // the agent's own stream
    kFile,     // the log file only
    kTee,      // the log file, and the console with a prefix
  };
  Mode mode = Mode::kInherit;
  std::string path;
  // kTee: where matching lines are copied too (null: nowhere).
  std::shared_ptr<const DuplicateSink> duplicate;
};

// A NUMA binding (--numa-binding), built before fork() so that the child
// only makes the two system calls between fork and exec.
struct Binding {
  // Builds the masks. Throws InvalidArgument when cpus is empty.
  static Binding make(
      const std::vector<int>& cpus, const std::vector<int>& mem_nodes);

  // sched_setaffinity's mask (bit c of word c / bits-per-word is CPU c).
  std::vector<unsigned long> cpus;
  // set_mempolicy(MPOL_BIND)'s node mask; empty: the memory policy is left
  // alone.
  std::vector<unsigned long> mem_nodes;
  // Both as cpulists, for the child's error message.
  std::string cpus_text;
  std::string mem_nodes_text;
};

struct LaunchSpec {
  int local_rank = 0;
  // The whole environment, "NAME=value".
  std::vector<std::string> env;
  // exec: the program's resolved path and argv (argv[0] included).
  std::string path;
  std::vector<std::string> argv;
  // fork: a registered function instead (path empty).
  std::string function;
  std::vector<std::string> function_args;
  std::string result_file;
  StreamTarget out;
  StreamTarget err;
  std::string console_prefix;  // "[default0]:"
  // Applied in the child before exec (or before the function runs); a
  // failure there is reported as a failed exec is: a line on the worker's
  // stderr, exit code 127.
  std::optional<Binding> binding;
  // When >= 0, a descriptor the program gets as its descriptor 3 (a
  // prestarted interpreter's hand-off channel); every other one of the
  // agent's is closed at exec.
  int keep_fd = -1;
};

// Copies a tee'd stream from its pipe to the log file and, line by line
// with a prefix, to the console.
class TeePump {
 public:
  TeePump(
      Fd read_fd,
      Fd file_fd,
      int console_fd,
      std::string prefix,
      std::shared_ptr<const DuplicateSink> duplicate = nullptr);
  TeePump(TeePump&& other) noexcept = default;
  TeePump& operator=(TeePump&&) = delete;

  // -1 once finished.
  int fd() const {
    return read_fd_.get();
  }
  // Reads what is available; false at EOF (the pump is then finished).
  bool pump();
  // Drains to EOF or until nothing more is readable, then flushes a last
  // partial line.
  void finish();

 private:
  void emit_lines(bool flush_partial);
  void emit(std::string_view text);
  Fd read_fd_;
  Fd file_fd_;
  int console_fd_ = -1;  // not ours
  std::string prefix_;
  std::shared_ptr<const DuplicateSink> duplicate_;
  std::string partial_;
};

class WorkerProcess {
 public:
  // Starts the worker in a new session (its own process group) that dies
  // with the agent's thread (PR_SET_PDEATHSIG). Throws Error when the
  // process or its log files cannot be created.
  WorkerProcess(const LaunchSpec& spec, Janitor* janitor);
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  pid_t pid() const {
    return pid_;
  }
  int local_rank() const {
    return local_rank_;
  }
  // Points a running process's output at `spec`'s targets (files, tee
  // pumps), as the constructor does for a new one: for a prestarted
  // interpreter given its worker's place. Returns the descriptors the
  // process must make its stdout and stderr (-1: the agent's own).
  std::pair<Fd, Fd> retarget(const LaunchSpec& spec);
  // Readable once the process has exited.
  int pidfd() const {
    return pidfd_.get();
  }
  std::vector<TeePump>& pumps() {
    return pumps_;
  }

  // Collects the exit status if the process has exited (never blocks),
  // killing whatever is left in its process group first.
  bool poll_exit();
  // Records a status reaped elsewhere (waitpid(-1)).
  void set_status(int wait_status);
  bool exited() const {
    return status_.has_value();
  }
  // The raw wait status.
  int status() const {
    return *status_;
  }
  // Exit code, or minus the signal.
  int exitcode() const;
  double exit_time() const {
    return exit_time_;
  }

  // Signals the whole process group (the process alone until it has made
  // its group).
  void signal(int sig) const;
  // Stops watching: the process could not be killed (stuck in the kernel).
  void abandon();
  bool abandoned() const {
    return abandoned_;
  }

 private:
  void on_exit(int wait_status);
  // Opens spec's stream targets: the child's ends, and pumps for tee.
  std::pair<Fd, Fd> open_targets(const LaunchSpec& spec);

  int local_rank_ = 0;
  pid_t pid_ = -1;
  Fd pidfd_;
  Janitor* janitor_ = nullptr;
  std::vector<TeePump> pumps_;
  std::optional<int> status_;
  double exit_time_ = 0;
  bool abandoned_ = false;
};

// The first executable named `file` on PATH (or `file` itself when it
// contains a slash); empty when none.
std::string find_executable(
    const std::string& file, const std::string& path_env);

}  // namespace tide::agent::detail
