#include "tide/rendezvous/static_rendezvous.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <charconv>

#include "tide/common/host.h"
#include "tide/common/logging.h"
#include "tide/events/events.h"
#include "tide/store/prefix_store.h"

#include "rendezvous/conf_keys.h"

namespace tide::rendezvous {

std::pair<std::string, uint16_t> parse_endpoint(
    const std::string& endpoint, uint16_t default_port) {
  std::string host = endpoint;
  std::string port_text;
  if (!endpoint.empty() && endpoint.front() == '[') {
    auto close = endpoint.find(']');
    if (close == std::string::npos) {
      throw InvalidArgument("endpoint \"" + endpoint + "\": missing ']'");
    }
    host = endpoint.substr(1, close - 1);
    if (close + 1 < endpoint.size()) {
      if (endpoint[close + 1] != ':') {
        throw InvalidArgument(
            "endpoint \"" + endpoint + "\": expected ':' after ']'");
      }
      port_text = endpoint.substr(close + 2);
    }
  } else if (auto colon = endpoint.rfind(':');
             colon != std::string::npos &&
             endpoint.find(':') == colon) {  // one colon: host:port
    host = endpoint.substr(0, colon);
    port_text = endpoint.substr(colon + 1);
  }
  if (host.empty()) {
    throw InvalidArgument("endpoint \"" + endpoint + "\" has no host");
  }
  if (port_text.empty()) {
    return {host, default_port};
  }
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(
      port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() ||
      port > 65535) {
    throw InvalidArgument(
        "endpoint \"" + endpoint + "\": port \"" + port_text +
        "\" is not a number from 0 to 65535");
  }
  return {host, static_cast<uint16_t>(port)};
}

namespace {

bool is_loopback(const std::string& host) {
  if (host == "localhost") {
    return true;
  }
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  return host == "::1";
}

}  // namespace

StaticRendezvousHandler::StaticRendezvousHandler(
    const RendezvousParameters& params)
    : run_id_(params.run_id),
      rank_(static_cast<int>(params.get_as_int("rank", 0))),
      world_size_(params.max_nodes),
      timeout_(params.get_as_seconds("timeout", std::chrono::seconds(600))) {
  std::tie(host_, port_) = parse_endpoint(
      params.endpoint.empty() ? "127.0.0.1" : params.endpoint,
      store::kDefaultPort);
  warn_unknown_conf_keys(params, {"rank", "timeout"});
  if (params.min_nodes != params.max_nodes) {
    throw InvalidArgument(
        "the static rendezvous needs a fixed node count, not " +
        std::to_string(params.min_nodes) + ":" +
        std::to_string(params.max_nodes) +
        "; use --rdzv-backend=c10d for an elastic job");
  }
  if (world_size_ < 1 || rank_ < 0 || rank_ >= world_size_) {
    throw InvalidArgument(
        "static rendezvous: node rank " + std::to_string(rank_) +
        " is outside 0.." + std::to_string(world_size_ - 1));
  }
  if (port_ == 0 && world_size_ > 1) {
    throw InvalidArgument(
        "static rendezvous: port 0 only works for a single node; give "
        "--master-port for " +
        std::to_string(world_size_) + " nodes");
  }
}

namespace {

void rdzv_event(
    const std::string& run_id,
    const std::string& message,
    events::NodeState state,
    const std::string& endpoint,
    int rank) {
  if (!events::enabled()) {
    return;
  }
  events::record_rdzv_event(events::RdzvEvent{
      .name = "StaticRendezvousHandler.next_rendezvous",
      .run_id = run_id,
      .message = message,
      .hostname = fqdn(),
      .node_state = state,
      .master_endpoint = endpoint,
      .rank = rank,
  });
}

}  // namespace

RendezvousInfo StaticRendezvousHandler::next_rendezvous() {
  rdzv_event(
      run_id_,
      "joining round " + std::to_string(round_) + " as node " +
          std::to_string(rank_) + " of " + std::to_string(world_size_),
      events::NodeState::kInit,
      host_ + ":" + std::to_string(port_),
      rank_);
  if (!store_) {
    store::TcpStoreOptions opts{
        .host = host_,
        .port = port_,
        .is_server = rank_ == 0,
        .timeout = timeout_,
    };
    if (rank_ == 0 && !is_loopback(host_)) {
      // Other nodes must reach this store: listen on every interface, as
      // torch does, while this node connects through the given address.
      opts.listen_host = "::";
    }
    try {
      store_ = std::make_shared<store::TcpStore>(opts);
    } catch (const NetworkError&) {
      if (opts.listen_host != "::") {
        throw;
      }
      opts.listen_host = "0.0.0.0";  // A host without IPv6.
      store_ = std::make_shared<store::TcpStore>(opts);
    }
    port_ = store_->port();
    TIDE_LOG_INFO(
        "[static rendezvous] node {}/{} {} the store at {}:{}",
        rank_,
        world_size_,
        rank_ == 0 ? "hosts" : "uses",
        host_,
        port_);
  }
  rdzv_event(
      run_id_,
      "round " + std::to_string(round_) + " complete: world size " +
          std::to_string(world_size_),
      events::NodeState::kRunning,
      host_ + ":" + std::to_string(port_),
      rank_);
  ++round_;
  return RendezvousInfo{
      .store = std::make_shared<store::PrefixStore>(run_id_, store_),
      .rank = rank_,
      .world_size = world_size_,
      .bootstrap = {.master_addr = host_, .master_port = port_},
  };
}

bool StaticRendezvousHandler::is_closed() {
  return closed_;
}

void StaticRendezvousHandler::set_closed() {
  closed_ = true;
}

bool StaticRendezvousHandler::shutdown() {
  return true;
}

}  // namespace tide::rendezvous
