#include "rpc/options.h"

#include <cstdlib>
#include <string>
#include <string_view>

#include "tide/common/error.h"
#include "tide/store/prefix_store.h"
#include "tide/store/tcp_store.h"

#include "net/address.h"

namespace tide::rpc::detail {

namespace {

// "tcp://host:port" or "env://" (MASTER_ADDR, MASTER_PORT) -> host, port.
net::HostPort parse_init_method(const std::string& init) {
  if (init == "env://") {
    const char* a = std::getenv("MASTER_ADDR");
    const char* p = std::getenv("MASTER_PORT");
    if (a == nullptr || p == nullptr) {
      throw InvalidArgument(
          "init_method env:// needs MASTER_ADDR and MASTER_PORT set; got " +
          std::string(a ? "" : "no MASTER_ADDR ") +
          std::string(p ? "" : "no MASTER_PORT"));
    }
    return {a, net::parse_port(p, "MASTER_PORT")};
  }
  if (init.rfind("tcp://", 0) == 0) {
    try {
      return net::parse_host_port(std::string_view(init).substr(6));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(
          "init_method '" + init + "': " + e.what() +
          " (expected tcp://host:port)");
    }
  }
  throw InvalidArgument(
      "init_method '" + init +
      "' is not supported; expected env:// or tcp://host:port");
}

}  // namespace

rpc_core::Options core_options(const RpcBackendOptions& o) {
  return rpc_core::checked(rpc_core::Options{
      o.num_worker_threads,
      o.transports,
      o.tcp_lanes,
      o.token,
      o.poll_us,
      o.listen_host});
}

RpcBackendOptions with_defaults(RpcBackendOptions options) {
  options.token = core_options(options).token;
  return options;
}

std::shared_ptr<store::Store> make_store(
    const RpcBackendOptions& raw_options, int rank) {
  RpcBackendOptions options = with_defaults(raw_options);
  auto [host, port] = parse_init_method(options.init_method);
  // Under tiderun (or torchrun) with TORCHELASTIC_USE_AGENT_STORE=True the
  // agent serves MASTER_ADDR:MASTER_PORT already: every worker is a client,
  // under /worker/attempt_<restart count> so a restart starts clean (torch's
  // env:// rule).
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  bool use_agent_store = options.init_method == "env://" &&
                         agent_store != nullptr &&
                         std::string(agent_store) == "True";
  store::TcpStoreOptions o;
  o.host = host;
  o.port = port;
  o.is_server = rank == 0 && !use_agent_store;
  o.timeout = options.rpc_timeout;
  if (!use_agent_store) {
    o.token = options.token;
  }
  auto tcp = std::make_shared<store::TcpStore>(o);
  if (!use_agent_store) {
    return tcp;
  }
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return std::make_shared<store::PrefixStore>(
      std::string("/worker/attempt_") + (attempt ? attempt : "0"), tcp);
}

}  // namespace tide::rpc::detail
