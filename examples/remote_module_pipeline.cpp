// A two-stage pipeline of RemoteModules: each stage (a linear layer and a
// ReLU) lives on its own worker; the driver sends a batch through both.
//
//   tiderun --standalone --nproc-per-node=3 --no-python
//   build/examples/remote_module_pipeline
//
// Rank 0 ("driver") builds stage 1 on worker1 and stage 2 on worker2, runs
// a batch through them (stage 1's output goes from the driver to stage 2),
// then hands stage 1 to worker2 inside an rpc, where it is the same module.
// It rebuilds the pipeline locally from the stages' parameters (fetched
// through remote_parameters()) and exits 1 unless both give the same
// output.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/linear.h>

#include "tide/rpc/remote_module.h"
#include "tide/rpc/rpc.h"

namespace {

namespace rpc = tide::rpc;

struct Stage : torch::nn::Module {
  Stage(int64_t in, int64_t out)
      : fc(register_module("fc", torch::nn::Linear(in, out))) {}

  at::Tensor forward(at::Tensor x) {
    return at::relu(fc(x));
  }

  torch::nn::Linear fc;
};

TIDE_RPC_MODULE(Stage, int64_t, int64_t);

// On worker2: runs stage 1 (a RemoteModule it was sent) and then its own
// stage 2, without the driver in between.
TIDE_RPC_FUNCTION(
    run_both,
    [](rpc::RemoteModule<Stage> first,
       rpc::RemoteModule<Stage> second,
       at::Tensor x) {
      return second.forward<at::Tensor>(first.forward<at::Tensor>(x));
    });

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    std::fprintf(stderr, "%s is not set; run me under tiderun\n", name);
    std::exit(2);
  }
  return std::atoi(v);
}

}  // namespace

int main() {
  int rank = env_int("RANK");
  int world = env_int("WORLD_SIZE");
  if (world != 3) {
    std::fprintf(stderr, "run me with 3 processes\n");
    return 2;
  }
  rpc::init_rpc(
      rank == 0 ? "driver" : "worker" + std::to_string(rank), rank, world);
  int status = 0;
  if (rank == 0) {
    rpc::RemoteModule<Stage> first("worker1/cpu", int64_t{4}, int64_t{8});
    rpc::RemoteModule<Stage> second("rank:2/cpu", int64_t{8}, int64_t{3});
    at::Tensor x = at::randn({5, 4});
    at::Tensor y = second.forward<at::Tensor>(first.forward<at::Tensor>(x));
    at::Tensor y2 =
        rpc::rpc_sync<at::Tensor>("worker2", "run_both", first, second, x);

    // The same computation, locally, from the stages' parameters.
    auto fetch = [](const rpc::RemoteModule<Stage>& s) {
      std::vector<at::Tensor> out;
      for (auto& p : s.remote_parameters()) {
        out.push_back(p.to_here());
      }
      return out;  // weight, bias
    };
    auto p1 = fetch(first);
    auto p2 = fetch(second);
    at::Tensor local = at::relu(torch::nn::functional::linear(
        at::relu(torch::nn::functional::linear(x, p1[0], p1[1])),
        p2[0],
        p2[1]));
    bool same = at::allclose(y, local) && at::allclose(y2, local);
    first.eval();
    std::printf(
        "pipeline over %s and %s: output %lldx%lld, %s the local computation\n",
        first.owner().name.c_str(),
        second.owner().name.c_str(),
        static_cast<long long>(y.size(0)),
        static_cast<long long>(y.size(1)),
        same ? "equal to" : "DIFFERENT from");
    status = same ? 0 : 1;
  }
  rpc::shutdown();
  return status;
}
