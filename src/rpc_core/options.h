#pragma once

#include <string>
#include <vector>

#include "transport/transport.h"

// The options both rpc front ends take, checked in one place: the C++
// agent's RpcBackendOptions and the torch backend's options (and, through
// them, Python's TideRpcBackendOptions) only name them their way.
namespace tide::rpc_core {

struct Options {
  // Threads running the functions called here, and as many completing the
  // calls this worker makes.
  int num_worker_threads = 16;
  // "shm" and "tcp"; tcp is required.
  std::vector<std::string> transports = {"shm", "tcp"};
  // Extra TCP connections a large buffer is cut over (0 to kMaxLanes).
  int lanes = 2;
  // The group's secret; empty: TIDE_RPC_TOKEN's, when set.
  std::string token;
  // How long idle threads poll before they sleep, in microseconds.
  int poll_us = 300;
  std::string listen_host = "127.0.0.1";
};

// `options` with the token filled in from the environment; throws
// InvalidArgument naming the option that is out of range.
Options checked(Options options);

// The transport's options for worker `rank` called `name`, from checked
// options.
transport::TransportOptions transport_options(
    const Options& options,
    int rank,
    const std::string& name,
    const transport::MessageTypes& types);

}  // namespace tide::rpc_core
