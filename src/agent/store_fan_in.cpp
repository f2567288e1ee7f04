#include "agent/store_fan_in.h"

#include "tide/common/error.h"
#include "tide/common/logging.h"
#include "tide/store/tcp_store.h"

namespace tide::agent::detail {

StoreFanIn::StoreFanIn(const AgentView& view) : view_(view) {}

StoreFanIn::~StoreFanIn() = default;

void StoreFanIn::add_env(std::map<std::string, std::string>& env) const {
  if (!fan_in_) {
    return;
  }
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(fan_in_->port());
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
}

void StoreFanIn::entered(const Transition& t) {
  if (!view_.spec.store_fan_in || t.event != GroupEvent::kStarted) {
    return;
  }
  // The last attempt's workers are gone: so are its store and fan-in, and
  // the new attempt finds none of their keys.
  fan_in_.reset();
  store_.reset();
  const auto& master = view_.rdzv.bootstrap;
  if (!view_.spec.rdzv_handler->use_agent_store() &&
      view_.group.group_rank == 0) {
    store_ = store::TcpStoreServer::start(
        {.host = "0.0.0.0", .port = master.master_port});
  }
  try {
    fan_in_ = store::TcpStoreServer::start(
        {.host = "127.0.0.1",
         .port = 0,
         .upstream = store::StoreUpstream{
             .host = master.master_addr, .port = master.master_port}});
  } catch (const Error& e) {
    throw Error(
        "the workers' store fan-in cannot reach the job's store at " +
        master.master_addr + ":" + std::to_string(master.master_port) + ": " +
        e.what());
  }
  TIDE_LOG_INFO(
      "[{}] the workers reach the job's store at {}:{} through this node's "
      "fan-in on 127.0.0.1:{}{}",
      view_.spec.role,
      master.master_addr,
      master.master_port,
      fan_in_->port(),
      store_ ? " (this agent serves that store for the attempt)" : "");
}

}  // namespace tide::agent::detail
