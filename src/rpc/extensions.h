#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "tide/rpc/rpc.h"

// What other parts of tide add to the rpc agent: distributed autograd
// (src/autograd) through these hooks and a per-agent extension.
namespace tide::rpc::detail {

// What distributed autograd (tide/autograd/dist_autograd.h) adds to the
// rpc agent: it records the calls made inside a context and the calls
// that carry one. Installed once per process; none until then.
struct AutogradHooks {
  virtual ~AutogradHooks() = default;
  // A call `agent` makes to worker `to` on this thread: its record, or null
  // when the thread is in no context of that agent.
  virtual GradsPtr call(RpcAgent& agent, int to) = 0;
  // A call worker `from` made to `agent` inside `context_id`: its record
  // (the context is made on this worker if new).
  virtual GradsPtr serve(
      RpcAgent& agent, int from, uint64_t context_id, uint64_t message_id) = 0;
};
void set_autograd_hooks(AutogradHooks* hooks);
// The hooks installed (null: none).
AutogradHooks* autograd_hooks();

// Per-agent state of an extension (distributed autograd's contexts): made
// on first use (agent_extension), closed when the agent stops, freed with
// it.
struct AgentExtension {
  virtual ~AgentExtension() = default;
  virtual void close() = 0;
};
// The agent's extension, made by `make` on first use (rpc_agent.cpp).
std::shared_ptr<AgentExtension> agent_extension(
    RpcAgent& agent,
    const std::function<std::shared_ptr<AgentExtension>()>& make);
// Calls fn(args) on worker `to`, an idempotent control function, with the
// rpc layers' one retry: again after a timeout or a broken connection to a
// worker that lives, pausing 0.5 s, 0.75 s, ... (5 tries).
Future<void> control_call(
    RpcAgent& agent, int to, const std::string& fn, std::string args);

// Reads what begin_call put before the arguments: the autograd context's
// and message's ids, if any.
std::optional<std::pair<uint64_t, uint64_t>> read_autograd_ids(Decoder& d);

}  // namespace tide::rpc::detail
