#include "rpc/extensions.h"

#include <atomic>

namespace tide::rpc::detail {

namespace {

std::atomic<AutogradHooks*> g_autograd_hooks{nullptr};

}  // namespace

void set_autograd_hooks(AutogradHooks* hooks) {
  g_autograd_hooks.store(hooks);
}

GradsPtr autograd_call(RpcAgent& agent, int to) {
  AutogradHooks* hooks = g_autograd_hooks.load(std::memory_order_acquire);
  return hooks != nullptr ? hooks->call(agent, to) : nullptr;
}

AutogradHooks* autograd_hooks() {
  return g_autograd_hooks.load(std::memory_order_acquire);
}

std::optional<std::pair<uint64_t, uint64_t>> read_autograd_ids(Decoder& d) {
  if (d.remaining() == 0 || d.peek_tag() != Tag::kAutograd) {
    return std::nullopt;
  }
  d.read_tag();
  uint64_t context = d.read_varint();
  uint64_t message = d.read_varint();
  return std::pair{context, message};
}

}  // namespace tide::rpc::detail
