#include "rpc_core/request_gate.h"

#include <exception>
#include <string>

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "transport/workers.h"

namespace tide::rpc_core {

bool RequestGate::hold(const transport::Pipe& pipe, transport::Message& m) {
  if (open_.load(std::memory_order_acquire)) {
    return false;
  }
  std::lock_guard lock(mutex_);
  if (open_.load(std::memory_order_relaxed)) {
    return false;
  }
  if (held_.size() >= transport::Workers::kMaxQueuedRequests) {
    throw ProtocolError(
        "more than " + std::to_string(transport::Workers::kMaxQueuedRequests) +
        " requests before this worker could serve them");
  }
  held_.emplace_back(pipe, std::move(m));
  return true;
}

void RequestGate::open(const Serve& serve, const std::string& who) {
  std::lock_guard lock(mutex_);
  for (auto& [pipe, m] : std::exchange(held_, {})) {
    try {
      serve(pipe, std::move(m));
    } catch (const std::exception& e) {
      TIDE_LOG_WARN(
          "[{}] a request that came before this worker could serve it was "
          "dropped: {}",
          who,
          e.what());
    }
  }
  open_.store(true, std::memory_order_release);
}

std::string busy_refusal(
    const std::string& worker, size_t queued, const std::string& what) {
  return "worker '" + worker + "' has " + std::to_string(queued) +
         " requests waiting for a thread already; " + what +
         " was refused (retry later)";
}

void RequestGate::drop() {
  std::lock_guard lock(mutex_);
  held_.clear();
}

}  // namespace tide::rpc_core
