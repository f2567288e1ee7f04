#include "tide/rendezvous/static_rendezvous.h"

#include <unistd.h>

#include <charconv>

#include "tide/common/host.h"
#include "tide/common/logging.h"
#include "tide/events/events.h"
#include "tide/store/prefix_store.h"

#include "net/address.h"
#include "net/socket.h"
#include "rendezvous/conf_keys.h"

namespace tide::rendezvous {

StaticRendezvousHandler::StaticRendezvousHandler(
    const RendezvousParameters& params)
    : run_id_(params.run_id),
      rank_(static_cast<int>(params.get_as_int("rank", 0))),
      world_size_(params.max_nodes),
      timeout_(params.get_as_seconds("timeout", std::chrono::seconds(600))),
      agent_store_(params.get_as_bool("agent_store", true)) {
  auto [host, port] = net::parse_host_port(
      params.endpoint.empty() ? "127.0.0.1" : params.endpoint,
      store::kDefaultPort);
  host_ = std::move(host);
  port_ = port;
  if (!agent_store_ && world_size_ == 1) {
    // The workers' store takes the endpoint's port (a script may name it in
    // tcp://); the agents' store, which no other node needs, any other.
    workers_port_ = port;
    port_ = 0;
  }
  warn_unknown_conf_keys(params, {"rank", "timeout", "agent_store"});
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
      net::format_host_port(host_, port_),
      rank_);
  if (!store_) {
    store::TcpStoreOptions opts{
        .host = host_,
        .port = port_,
        .is_server = rank_ == 0,
        .timeout = timeout_,
    };
    if (rank_ == 0 && !net::is_loopback(host_)) {
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
  uint16_t workers_port = agent_store_ ? port_ : workers_store_port();
  if (round_ > 0 && agent_store_) {
    forget_previous_attempt();
  }
  rdzv_event(
      run_id_,
      "round " + std::to_string(round_) + " complete: world size " +
          std::to_string(world_size_),
      events::NodeState::kRunning,
      net::format_host_port(host_, port_),
      rank_);
  ++round_;
  return RendezvousInfo{
      .store = std::make_shared<store::PrefixStore>(run_id_, store_),
      .rank = rank_,
      .world_size = world_size_,
      .bootstrap = {.master_addr = host_, .master_port = workers_port},
  };
}

uint16_t StaticRendezvousHandler::workers_store_port() {
  if (world_size_ == 1) {
    // Each attempt's rank 0 makes the store anew, at the given port or
    // at a free one.
    return workers_port_ != 0 ? workers_port_ : net::free_port();
  }
  // The nodes' rounds are their own: node 0 picks one port for the job and
  // the others read it from the agents' store.
  store::PrefixStore store(run_id_, store_);
  if (rank_ == 0 && round_ == 0) {
    store.set("workers_port", std::to_string(net::free_port()));
  }
  std::string value = store.get("workers_port");
  uint16_t port = 0;
  auto [end, ec] =
      std::from_chars(value.data(), value.data() + value.size(), port);
  if (ec != std::errc() || end != value.data() + value.size() || port == 0) {
    throw RendezvousError(
        "static rendezvous: the workers' port node 0 published is '" + value +
        "', not a port");
  }
  return port;
}

void StaticRendezvousHandler::forget_previous_attempt() {
  if (world_size_ > 1) {
    if (round_ == 1) {
      // No round is shared by the nodes (each restarts on its own), so
      // none can tell when every node's workers have stopped.
      TIDE_LOG_WARN(
          "[static rendezvous] the workers' store keeps what earlier "
          "attempts wrote: torch >= 2.5 no longer puts workers' keys under "
          "their attempt, so a restarted group can read stale addresses; "
          "--rdzv-backend=c10d gives every round a store of its own");
    }
    return;
  }
  // This node's only group restarts: its workers have stopped, and the next
  // attempt's must not read what they wrote (gloo's addresses, NCCL's id).
  // The agents' keys, under the run id, stay.
  size_t erased = store_->server()->erase_outside("/" + run_id_ + "/");
  TIDE_LOG_INFO(
      "[static rendezvous] round {}: erased {} key(s) of the previous "
      "attempt's workers from their store",
      round_,
      erased);
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
