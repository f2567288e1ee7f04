#include "agent/checkpoint_memory.h"

#include "tide/common/logging.h"
#include "tide/common/strings.h"

#include "checkpoint/region.h"

namespace tide::agent::detail {

CheckpointMemory::CheckpointMemory(const AgentView& view, std::string dir)
    : view_(view), dir_(std::move(dir)) {}

CheckpointMemory::~CheckpointMemory() = default;

void CheckpointMemory::start() {
  const WorkerSpec& spec = view_.spec;
  if (spec.checkpoint_memory == 0 || region_) {
    return;
  }
  if (int stale = checkpoint::remove_stale(dir_); stale > 0) {
    TIDE_LOG_INFO(
        "[{}] removed {} checkpoint memory region(s) of agents that died from "
        "{}",
        spec.role,
        stale,
        dir_);
  }
  region_ = std::make_unique<checkpoint::Region>(
      dir_, spec.checkpoint_memory, spec.local_world_size);
  const checkpoint::Layout& l = region_->layout();
  TIDE_LOG_INFO(
      "[{}] checkpoint memory: {} in {}, two snapshots of up to {} per local "
      "rank",
      spec.role,
      human_bytes(l.bytes),
      region_->path(),
      human_bytes(l.slot_bytes - checkpoint::kHeaderBytes));
}

void CheckpointMemory::add_env(std::map<std::string, std::string>& env) const {
  if (region_) {
    env["TIDE_CHECKPOINT_REGION"] = region_->path();
  }
}

}  // namespace tide::agent::detail
