// Model-parallel training with distributed autograd: the first layer lives
// on the trainer, the second is a RemoteModule on worker1. Each step runs
// the forward pass across both, the backward pass back across them, and a
// DistributedOptimizer step on both owners, inside one context.
//
//   tiderun --standalone --nproc-per-node=2 --no-python
//   build/examples/model_parallel_train
//
// Beside it the trainer trains the same model locally (the same initial
// weights and batch, libtorch's SGD); it exits 1 unless the distributed
// model converged and ended with the local model's loss.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ops/allclose.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "tide/autograd/dist_autograd.h"
#include "tide/autograd/optimizer.h"
#include "tide/rpc/remote_module.h"
#include "tide/rpc/rpc.h"

namespace {

namespace rpc = tide::rpc;
namespace dist_autograd = tide::rpc::dist_autograd;

// The second layer, on worker1.
struct Head : torch::nn::Module {
  explicit Head(int64_t hidden)
      : fc(register_module("fc", torch::nn::Linear(hidden, 1))) {}
  at::Tensor forward(at::Tensor h) {
    return fc(h);
  }
  torch::nn::Linear fc;
};
TIDE_RPC_MODULE(Head, int64_t);

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    std::fprintf(stderr, "%s is not set: run me under tiderun\n", name);
    std::exit(2);
  }
  return std::atoi(v);
}

}  // namespace

int main() {
  int rank = env_int("RANK");
  int world = env_int("WORLD_SIZE");
  if (world != 2) {
    std::fprintf(stderr, "run me with 2 processes\n");
    return 2;
  }
  rpc::init_rpc(rank == 0 ? "trainer" : "worker1", rank, world);
  int status = 0;
  if (rank == 0) {
    constexpr int64_t kIn = 8;
    constexpr int64_t kHidden = 16;
    constexpr int kSteps = 60;
    at::manual_seed(0);
    torch::nn::Linear first(kIn, kHidden);
    rpc::RemoteModule<Head> head("worker1/cpu", kHidden);

    // The local copy: the same initial weights.
    torch::nn::Linear local_first(kIn, kHidden);
    Head local_head(kHidden);
    {
      torch::NoGradGuard no_grad;
      local_first->weight.copy_(first->weight);
      local_first->bias.copy_(first->bias);
      auto remote = head.remote_parameters();
      auto mine = local_head.parameters();
      for (size_t i = 0; i < remote.size(); ++i) {
        mine[i].copy_(remote[i].to_here());
      }
    }

    // Every parameter, wherever it lives, as an RRef.
    std::vector<rpc::RRef<at::Tensor>> params = head.remote_parameters();
    for (const auto& p : first->parameters()) {
      params.emplace_back(p);
    }
    rpc::DistributedOptimizer opt(params, torch::optim::SGDOptions(0.1));
    std::vector<at::Tensor> local_params = local_first->parameters();
    for (const auto& p : local_head.parameters()) {
      local_params.push_back(p);
    }
    torch::optim::SGD local_opt(local_params, torch::optim::SGDOptions(0.1));

    // The task: y = tanh(x v) for a fixed v, one batch of 64 samples.
    at::Tensor x = at::randn({64, kIn});
    at::Tensor y = at::tanh(x.matmul(at::randn({kIn, 1})));
    double first_loss = 0;
    double loss = 0;
    double local_loss = 0;
    for (int step = 0; step < kSteps; ++step) {
      {
        dist_autograd::Context ctx;
        at::Tensor h = at::tanh(first(x));
        at::Tensor out = head.forward<at::Tensor>(h);
        at::Tensor l = at::mse_loss(out, y);
        dist_autograd::backward(ctx.context_id(), {l});
        opt.step(ctx.context_id());
        loss = l.item<double>();
      }
      local_opt.zero_grad();
      at::Tensor l =
          at::mse_loss(local_head.forward(at::tanh(local_first(x))), y);
      l.backward();
      local_opt.step();
      local_loss = l.item<double>();
      if (step == 0) {
        first_loss = loss;
      }
      if (step % 20 == 0 || step == kSteps - 1) {
        std::printf(
            "step %2d: loss %.4f (distributed), %.4f (local)\n",
            step,
            loss,
            local_loss);
      }
    }
    bool converged = loss < first_loss / 4;
    bool same = std::abs(loss - local_loss) < 1e-4 &&
                at::allclose(first->weight, local_first->weight, 1e-4, 1e-5);
    std::printf(
        "trained over %s and %s: loss %.4f -> %.4f, %s, %s the local model's\n",
        rpc::get_worker_info().name.c_str(),
        head.owner().name.c_str(),
        first_loss,
        loss,
        converged ? "converged" : "DID NOT CONVERGE",
        same ? "equal to" : "DIFFERENT from");
    status = converged && same ? 0 : 1;
  }
  rpc::shutdown();
  return status;
}
