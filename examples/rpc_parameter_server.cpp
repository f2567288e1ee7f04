// The parameter-server pattern over tide's RPC: rank 0 ("ps") holds the
// weights; every other rank is a trainer that fetches them, computes a
// gradient and pushes it back. Then trainer 1 sends a batch of async calls
// and waits for all of them.
//
//   tiderun --standalone --nproc-per-node=3 --no-python
//           build/examples/rpc_parameter_server
//
// The model is a least-squares fit: minimise |w - target|^2, so each
// gradient is 2 (w - target) and the weights converge to the target. The
// weights and gradients are at::Tensors (tide/rpc/tensor.h): they travel as
// their bytes, through shared memory between processes of one host.
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include "tide/rpc/rpc.h"
#include "tide/rpc/tensor.h"

namespace {

using namespace std::chrono_literals;
namespace rpc = tide::rpc;

constexpr int kSteps = 50;

at::Tensor target() {
  return at::tensor(std::vector<double>{1.0, -2.0, 3.0, 0.5}, at::kDouble);
}

// The parameter server's state (used on rank 0 only).
std::mutex g_mutex;
at::Tensor g_weights = at::zeros({4}, at::kDouble);
int64_t g_updates = 0;

at::Tensor get_weights() {
  std::lock_guard lock(g_mutex);
  return g_weights.clone();  // A snapshot: the update below is in place.
}

// Applies one trainer's gradient; returns the number of updates so far.
int64_t push_gradient(at::Tensor grad, double lr) {
  std::lock_guard lock(g_mutex);
  if (grad.sizes() != g_weights.sizes()) {
    throw std::invalid_argument(
        "gradient has " + std::to_string(grad.numel()) + " values, want " +
        std::to_string(g_weights.numel()));
  }
  g_weights.sub_(grad.mul(lr));
  return ++g_updates;
}

int64_t updates() {
  std::lock_guard lock(g_mutex);
  return g_updates;
}

TIDE_RPC_FUNCTION(get_weights, &get_weights);
TIDE_RPC_FUNCTION(push_gradient, &push_gradient);
TIDE_RPC_FUNCTION(updates, &updates);

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    std::fprintf(stderr, "%s is not set; run me under tiderun\n", name);
    std::exit(2);
  }
  return std::atoi(v);
}

void train(int rank) {
  at::Tensor goal = target();
  for (int step = 0; step < kSteps; ++step) {
    auto w = rpc::rpc_sync<at::Tensor>("ps", "get_weights");
    at::Tensor grad = w.sub(goal).mul(2);
    rpc::rpc_sync<int64_t>("ps", "push_gradient", grad, 0.05);
  }
  if (rank == 1) {
    // A batch of async calls in flight at once, then one wait for each.
    std::vector<tide::Future<int64_t>> batch;
    for (int i = 0; i < 100; ++i) {
      batch.push_back(rpc::rpc_async<int64_t>("ps", "updates"));
    }
    int64_t last = 0;
    for (auto& f : batch) {
      last = std::max(last, f.wait(30s));
    }
    std::printf(
        "trainer1: 100 async calls answered; ps saw %lld updates\n",
        static_cast<long long>(last));
  }
}

}  // namespace

int main() {
  int rank = env_int("RANK");
  int world = env_int("WORLD_SIZE");
  std::string name = rank == 0 ? "ps" : "trainer" + std::to_string(rank);
  rpc::init_rpc(name, rank, world);
  if (rank > 0) {
    train(rank);
  }
  // Waits until every worker is done (the ps serves until then).
  rpc::shutdown();
  if (rank == 0) {
    double loss = g_weights.sub(target()).pow(2).sum().item().toDouble();
    auto w = g_weights.accessor<double, 1>();
    std::printf(
        "ps: %lld updates from %d trainers, loss %.2e, weights %.3f %.3f "
        "%.3f %.3f\n",
        static_cast<long long>(g_updates),
        world - 1,
        loss,
        w[0],
        w[1],
        w[2],
        w[3]);
    return loss < 1e-3 ? 0 : 1;
  }
  return 0;
}
