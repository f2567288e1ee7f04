#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"

// A store server under test, run as a child process of store_bench.
namespace tide::bench {

// A server child: exec'd with its stdin and stdout on pipes, asked for its
// port (the number ending its first line of stdout), and stopped with SIGTERM,
// then SIGKILL, and reaped. It dies with this process (PR_SET_PDEATHSIG), and
// the torch peer also exits when its stdin closes.
//
// Thread safety: none; used from the main thread only (which must be the
// thread that constructs it: PR_SET_PDEATHSIG follows the forking thread).
class ServerProcess {
 public:
  // Starts argv (argv[0] is a path) and waits up to start_timeout for its
  // port. Throws std::runtime_error, naming `name`, when it cannot be started
  // or exits or stays silent, Interrupted; the child is then stopped and
  // reaped.
  ServerProcess(
      std::string name,
      const std::vector<std::string>& argv,
      std::chrono::milliseconds start_timeout);
  // stop().
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  const std::string& name() const {
    return name_;
  }
  uint16_t port() const {
    return port_;
  }

  // False once the child has exited (it is then reaped). Never blocks.
  bool alive();

  // CPU seconds (user + system, all threads) the child has used so far; 0
  // when it cannot be read.
  double cpu_seconds() const;
  // Its resident memory in KiB; 0 when it cannot be read.
  uint64_t rss_kb() const;
  // Its open descriptors (a server's: its connections, plus a few).
  size_t open_fds() const;

  // Closes the child's stdin and sends SIGTERM; after stop_timeout, SIGKILL;
  // reaps it. Blocks at most twice stop_timeout. Idempotent; never throws.
  void stop() noexcept;

  static constexpr std::chrono::milliseconds kStopTimeout{5'000};

 private:
  uint16_t read_port(std::chrono::milliseconds timeout);

  std::string name_;
  Child child_;
  uint16_t port_ = 0;
};

}  // namespace tide::bench
