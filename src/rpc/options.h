#pragma once

#include <memory>

#include "tide/rpc/rpc.h"
#include "tide/store/store.h"

#include "rpc_core/options.h"

// RpcBackendOptions as the agent uses them: defaults filled in and checked,
// and the rendezvous store they name.
namespace tide::rpc::detail {

// The options the rpc front ends share, checked once for both
// (rpc_core/options.h): throws InvalidArgument for one out of range.
rpc_core::Options core_options(const RpcBackendOptions& options);

// options, with the token from TIDE_RPC_TOKEN when it has none; throws as
// core_options().
RpcBackendOptions with_defaults(RpcBackendOptions options);

// The store of options.init_method (env:// or tcp://host:port): rank 0
// hosts it, or, under tiderun with TORCHELASTIC_USE_AGENT_STORE, every
// worker is a client of the agent's.
std::shared_ptr<store::Store> make_store(
    const RpcBackendOptions& options, int rank);

}  // namespace tide::rpc::detail
