#pragma once

#include <functional>
#include <string>

#include "tide/rpc/rpc.h"

namespace tide::bench {

// The model-parallel training step of shared/peers/rpc/dist_autograd_bench.py
// (torch's side: bench/peers/torch_rpc_peer.py, measure_dist_autograd), on
// tide: a local Linear(D, D), then a Linear(D, D) on worker1, loss = sum,
// distributed backward, a DistributedOptimizer(SGD) step over both layers'
// parameters, all inside one context. Two ways to reach the remote layer:
// "rref" (remote() makes it, rpc_sync runs it with the RRef) and
// "remotemod" (a RemoteModule). emit() gets each variant's JSON fields.
void drive_dist_autograd(
    rpc::RpcAgent& agent,
    int steps,
    int warmup,
    int batch,
    int dim,
    const std::function<void(const std::string&)>& emit);

}  // namespace tide::bench
