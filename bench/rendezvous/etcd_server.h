#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "bench_util.h"

// A single-member etcd (3.4, /usr/bin/etcd) for the bench: its own scratch
// data directory, client and peer ports on 127.0.0.1 picked at random (etcd
// cannot advertise port 0), retried when taken.
namespace tide::bench {

class EtcdServer {
 public:
  // Starts `etcd` (a path) and waits up to start_timeout_s for /health to say
  // true. Throws std::runtime_error (with the tail of etcd's log) when it
  // cannot be started, Interrupted.
  EtcdServer(const std::string& etcd, double start_timeout_s);
  // Stops etcd (SIGTERM, then SIGKILL) and removes its directory.
  ~EtcdServer();
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  uint16_t client_port() const {
    return client_port_;
  }
  // "127.0.0.1:PORT", the endpoint handlers connect to.
  std::string endpoint() const;
  // CPU seconds (user + system) etcd has used so far; 0 if unknown.
  double cpu_seconds() const;
  // Stops it (SIGTERM, then SIGKILL after 2 s); every client call fails
  // from then on. Idempotent.
  void stop() noexcept;

 private:
  // One start on the given ports; nullptr if a port was taken, the child
  // (healthy) otherwise. Throws on any other failure.
  std::unique_ptr<Child> try_start(
      const std::string& etcd,
      uint16_t client,
      uint16_t peer,
      double timeout_s);
  std::string log_tail() const;

  ScratchDir dir_;
  std::unique_ptr<Child> child_;
  uint16_t client_port_ = 0;
};

}  // namespace tide::bench
