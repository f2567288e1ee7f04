#include "rpc_core/options.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "tide/common/error.h"

namespace tide::rpc_core {

Options checked(Options o) {
  if (o.token.empty()) {
    if (const char* t = std::getenv("TIDE_RPC_TOKEN")) {
      o.token = t;
    }
  }
  if (o.num_worker_threads < 1) {
    throw InvalidArgument(
        "num_worker_threads must be at least 1, got " +
        std::to_string(o.num_worker_threads));
  }
  bool tcp = false;
  for (const auto& t : o.transports) {
    if (t == "tcp") {
      tcp = true;
    } else if (t != "shm") {
      throw InvalidArgument(
          "unknown rpc transport '" + t +
          "'; the transports are 'shm' and 'tcp'");
    }
  }
  if (!tcp) {
    throw InvalidArgument(
        "rpc transports must include tcp (the way to workers of other "
        "hosts, and the fallback of shm); got " +
        std::to_string(o.transports.size()) + " without it");
  }
  if (o.lanes < 0 || o.lanes > static_cast<int>(transport::kMaxLanes)) {
    throw InvalidArgument(
        "tcp_lanes must be 0 to " + std::to_string(transport::kMaxLanes) +
        " (lanes in Python); got " + std::to_string(o.lanes));
  }
  if (o.poll_us < 0 || o.poll_us > 100000) {
    throw InvalidArgument(
        "poll_us must be 0 to 100000; got " + std::to_string(o.poll_us));
  }
  return o;
}

transport::TransportOptions transport_options(
    const Options& o,
    int rank,
    const std::string& name,
    const transport::MessageTypes& types) {
  transport::TransportOptions t;
  t.self_id = rank;
  t.self_name = name;
  t.listen_host = o.listen_host;
  t.shared_memory =
      std::find(o.transports.begin(), o.transports.end(), "shm") !=
      o.transports.end();
  t.token = o.token;
  t.lanes = static_cast<size_t>(o.lanes);
  t.message_types = types;
  t.poll = std::chrono::microseconds(o.poll_us);
  return t;
}

}  // namespace tide::rpc_core
