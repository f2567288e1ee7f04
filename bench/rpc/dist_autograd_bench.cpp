#include "dist_autograd_bench.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/ops/allclose.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <fmt/format.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "tide/autograd/dist_autograd.h"
#include "tide/autograd/optimizer.h"
#include "tide/rpc/remote_module.h"
#include "tide/rpc/tensor.h"

#include "bench_util.h"

namespace tide::bench {
namespace {

using rpc::RRef;
using LinearPtr = std::shared_ptr<torch::nn::LinearImpl>;

TIDE_RPC_FUNCTION(bench_make_linear, [](int64_t d) {
  return std::make_shared<torch::nn::LinearImpl>(d, d);
});
TIDE_RPC_FUNCTION(bench_forward, [](RRef<LinearPtr> m, at::Tensor x) {
  return (*m.local_value())->forward(x);
});
TIDE_RPC_FUNCTION(bench_param_rrefs, [](RRef<LinearPtr> m) {
  std::vector<RRef<at::Tensor>> out;
  for (const auto& p : (*m.local_value())->parameters()) {
    out.emplace_back(p);
  }
  return out;
});
TIDE_RPC_FUNCTION(bench_weight, [](RRef<LinearPtr> m) {
  return (*m.local_value())->weight.detach().clone();
});
TIDE_RPC_MODULE(torch::nn::LinearImpl, int64_t, int64_t);

}  // namespace

void drive_dist_autograd(
    rpc::RpcAgent& agent,
    int steps,
    int warmup,
    int batch,
    int dim,
    const std::function<void(const std::string&)>& emit) {
  namespace dist_autograd = rpc::dist_autograd;
  const std::string to = "worker1";
  at::manual_seed(0);
  at::Tensor x = at::randn({batch, dim}).requires_grad_();
  torch::nn::Linear local(dim, dim);
  for (const char* variant : {"rref", "remotemod"}) {
    std::vector<RRef<at::Tensor>> params;
    std::function<at::Tensor(const at::Tensor&)> forward;
    std::optional<RRef<LinearPtr>> lin;
    std::unique_ptr<rpc::RemoteModule<torch::nn::LinearImpl>> module;
    if (std::string(variant) == "rref") {
      lin = agent.remote<LinearPtr>(to, "bench_make_linear", int64_t{dim});
      params = agent.rpc_sync<std::vector<RRef<at::Tensor>>>(
          to, "bench_param_rrefs", *lin);
      forward = [&](const at::Tensor& h) {
        return agent.rpc_sync<at::Tensor>(to, "bench_forward", *lin, h);
      };
    } else {
      module = std::make_unique<rpc::RemoteModule<torch::nn::LinearImpl>>(
          agent, to + "/cpu", int64_t{dim}, int64_t{dim});
      params = module->remote_parameters();
      forward = [&](const at::Tensor& h) {
        return module->forward<at::Tensor>(h);
      };
    }
    for (const auto& p : local->parameters()) {
      params.emplace_back(agent, p);
    }
    rpc::DistributedOptimizer opt(params, torch::optim::SGDOptions(0.001));
    auto step = [&] {
      dist_autograd::Context ctx(agent);
      at::Tensor y = forward(local->forward(x));
      dist_autograd::backward(ctx.context_id(), {y.sum()});
      opt.step(ctx.context_id());
    };
    if (std::string(variant) == "rref") {
      // The remote weight after one step is w0 - lr * dL/dW, as computed
      // here.
      at::Tensor w0 = agent.rpc_sync<at::Tensor>(to, "bench_weight", *lin);
      at::Tensor h = local->forward(x).detach();
      at::Tensor expect = w0 - 0.001 * at::ones({batch, dim}).t().mm(h);
      step();
      at::Tensor w1 = agent.rpc_sync<at::Tensor>(to, "bench_weight", *lin);
      emit(fmt::format(
          "\"metric\":\"dist_autograd_check\",\"ok\":{}",
          at::allclose(w1, expect, 1e-5, 1e-5) ? "true" : "false"));
    }
    for (int i = 0; i < warmup; ++i) {
      step();
    }
    std::vector<double> us;
    for (int i = 0; i < steps; ++i) {
      int64_t t0 = mono_ns();
      step();
      us.push_back(static_cast<double>(mono_ns() - t0) / 1e3);
    }
    emit(fmt::format(
        "\"metric\":\"dist_autograd_step_us\",\"variant\":\"{}\",\"batch\":{},"
        "\"dim\":{},\"median\":{:.2f},\"p99\":{:.2f},\"n\":{}",
        variant,
        batch,
        dim,
        median(us),
        percentile(us, 99),
        us.size()));
  }
}

}  // namespace tide::bench
