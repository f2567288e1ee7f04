#pragma once

// tide's RPC, all of it: the agent and its calls (tide/rpc/agent.h) and
// remote references (tide/rpc/rref.h); tensors are tide/rpc/tensor.h.
#include "tide/rpc/agent.h"  // IWYU pragma: export
#include "tide/rpc/rref.h"   // IWYU pragma: export

// Registers a callable as `name` (an identifier) for every agent of the
// process, at static-initialisation time: TIDE_RPC_FUNCTION(add, &add);
// (variadic so that a lambda with commas needs no parentheses). Put it in a
// file the linker keeps (one with other code the program uses).
#define TIDE_RPC_FUNCTION(name, ...)                               \
  [[maybe_unused]] static const bool tide_rpc_function_##name##_ = \
      ::tide::rpc::detail::register_global_function(#name, __VA_ARGS__)
