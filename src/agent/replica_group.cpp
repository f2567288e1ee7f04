#include "agent/replica_group.h"

#include "tide/common/logging.h"
#include "tide/ft/quorum.h"

#include "common/random.h"

namespace tide::agent::detail {

namespace {
// The agent's requests to the quorum's store wait at most this long: it
// declares a member out on its own thread, before it acts.
constexpr std::chrono::milliseconds kStoreTimeout{5'000};
}  // namespace

ReplicaGroup::ReplicaGroup(const AgentView& view)
    : view_(view), nonce_(random_id(8)) {}

ReplicaGroup::~ReplicaGroup() = default;

void ReplicaGroup::add_env(std::map<std::string, std::string>& env) const {
  const auto& g = view_.spec.replica_group;
  if (g.store.empty()) {
    return;
  }
  env["TIDE_FT_STORE"] = g.store;
  env["REPLICA_GROUP_ID"] = g.id;
  env["NUM_REPLICA_GROUPS"] = std::to_string(g.groups);
  env["TIDE_FT_MIN_REPLICA_SIZE"] = std::to_string(g.min_size);
  env["TIDE_FT_INCARNATION"] = incarnation_;
}

void ReplicaGroup::entered(const Transition& t) {
  const auto& g = view_.spec.replica_group;
  if (g.store.empty()) {
    return;
  }
  if (t.event == GroupEvent::kStarted) {
    incarnation_ = nonce_ + "." + std::to_string(view_.restarts.used);
    return;
  }
  if (incarnation_.empty()) {
    return;
  }
  std::string member = ft::QuorumClient::member_id(g.id, incarnation_);
  incarnation_.clear();
  std::string why =
      t.event == GroupEvent::kSucceeded
          ? "left: its workers finished"
          : "its agent saw: " +
                (t.reason.empty() ? std::string(to_string(t.event)) : t.reason);
  try {
    if (!store_) {
      store_ = ft::connect_quorum_store(g.store, kStoreTimeout);
    }
    ft::QuorumClient::declare_dead(*store_, member, why);
    TIDE_LOG_INFO("replica group member {} declared out: {}", member, why);
  } catch (const std::exception& e) {
    store_.reset();  // a new connection next time
    TIDE_LOG_WARN(
        "replica group member {} could not be declared out ({}); the other "
        "groups will see it by its heartbeat",
        member,
        e.what());
  }
}

}  // namespace tide::agent::detail
