#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tide/autograd/dist_autograd.h"
#include "tide/common/error.h"
#include "tide/rpc/rpc.h"

namespace torch::optim {
struct SGDOptions;
struct AdamOptions;
struct AdamWOptions;
struct AdagradOptions;
struct RMSpropOptions;
}  // namespace torch::optim

// The distributed optimizer (torch.distributed.optim.DistributedOptimizer):
// one libtorch optimizer on each worker that owns some of the parameters,
// stepped with a distributed autograd context's gradients.
//
//   auto params = stage.remote_parameters();          // RRef<at::Tensor>s
//   params.push_back(RRef<at::Tensor>(local_weight)); // owned here
//   DistributedOptimizer opt(params, torch::optim::SGDOptions(0.05));
//   {
//     dist_autograd::Context ctx;
//     ...forward, dist_autograd::backward(ctx.context_id(), {loss});
//     opt.step(ctx.context_id());
//   }
//
// Beyond torch's: every owner's failure is reported, not the last one;
// zero_grad drops a context's gradients of the parameters; the learning
// rate can be set on every owner (StepLR below); the optimizers' state can
// be saved and loaded.
namespace tide::rpc {

namespace detail {
struct DistributedOptimizerImpl;
// Registers the owners' side of the optimizer (dist_autograd::enable()
// calls it).
void register_optimizer_functions();
}  // namespace detail

// A step (or another operation) failed on some owners: the message lists
// each with its error; failures() has them one by one.
class DistributedOptimizerError : public RemoteError {
 public:
  DistributedOptimizerError(
      const std::string& what,
      std::vector<std::pair<std::string, std::exception_ptr>> failures)
      : RemoteError(what), failures_(std::move(failures)) {}

  // (owner's name, its error)
  const std::vector<std::pair<std::string, std::exception_ptr>>& failures()
      const {
    return failures_;
  }

 private:
  std::vector<std::pair<std::string, std::exception_ptr>> failures_;
};

class DistributedOptimizer {
 public:
  // One optimizer of the kind and options given on each owner of `params`,
  // over the parameters it owns (made through the parameters' agent; the
  // constructor waits for them). Throws InvalidArgument when `params` is
  // empty, and what the creation raised on an owner.
  DistributedOptimizer(
      const std::vector<RRef<at::Tensor>>& params,
      const torch::optim::SGDOptions& options);
  DistributedOptimizer(
      const std::vector<RRef<at::Tensor>>& params,
      const torch::optim::AdamOptions& options);
  DistributedOptimizer(
      const std::vector<RRef<at::Tensor>>& params,
      const torch::optim::AdamWOptions& options);
  DistributedOptimizer(
      const std::vector<RRef<at::Tensor>>& params,
      const torch::optim::AdagradOptions& options);
  DistributedOptimizer(
      const std::vector<RRef<at::Tensor>>& params,
      const torch::optim::RMSpropOptions& options);
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Steps every owner's optimizer at once with the gradients context
  // `context_id` holds there (a parameter without one is left as it is).
  // Steps on one owner are serialised; `.grad` is the same after as before.
  // Throws DistributedOptimizerError naming every owner that failed.
  void step(int64_t context_id);

  // Drops the gradients of this optimizer's parameters from context
  // `context_id` on every owner, so that the next backward in it starts
  // from none (contexts start empty: needed only to reuse one).
  void zero_grad(int64_t context_id);

  // The learning rate of every parameter group on every owner.
  void set_lr(double lr);
  double lr() const;

  // Each owner's optimizer state (libtorch's archive of it), by owner name;
  // load_state_dict puts such a map back (same owners and parameters).
  std::map<std::string, std::string> state_dict() const;
  void load_state_dict(const std::map<std::string, std::string>& state);

  // The owners, by name.
  std::vector<std::string> owners() const;

 private:
  std::unique_ptr<detail::DistributedOptimizerImpl> impl_;
};

// torch.optim.lr_scheduler.StepLR for a DistributedOptimizer: every
// `step_size` calls of step(), the learning rate on every owner is
// multiplied by `gamma`.
class StepLR {
 public:
  StepLR(
      DistributedOptimizer& optimizer, int64_t step_size, double gamma = 0.1);
  void step();
  double last_lr() const {
    return lr_;
  }

 private:
  DistributedOptimizer& optimizer_;
  const int64_t step_size_;
  const double gamma_;
  const double base_lr_;
  int64_t epoch_ = 0;
  double lr_;
};

}  // namespace tide::rpc
