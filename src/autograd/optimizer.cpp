#include "tide/autograd/optimizer.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include "tide/common/error.h"
#include "tide/rpc/tensor.h"

// The distributed optimizer: each owner keeps a LocalOptimizer as the value
// of an RRef the DistributedOptimizer holds, and works on it through
// proxies ("step", "zero_grad", "set_lr", ...). The options travel as
// libtorch's own archive of them.
namespace tide::rpc {
namespace detail {

struct LocalOptimizer {
  std::mutex mutex;  // One operation at a time.
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};
using LocalOptimizerPtr = std::shared_ptr<LocalOptimizer>;

namespace {

constexpr const char* kCreateFn = "tide.optim.create";

std::string save(
    const std::function<void(torch::serialize::OutputArchive&)>& fn) {
  torch::serialize::OutputArchive archive;
  fn(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load(
    const std::string& bytes,
    const std::function<void(torch::serialize::InputArchive&)>& fn) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  fn(archive);
}

template <typename Optimizer, typename Options>
std::unique_ptr<torch::optim::Optimizer> make(
    const std::string& options, std::vector<at::Tensor> params) {
  // libtorch's optimizer constructors are not safe to run at once in one
  // process (ThreadSanitizer sees two of them race inside libtorch): with
  // several agents in a process, one at a time.
  static std::mutex constructing;
  std::lock_guard lock(constructing);
  Options o(0.0);
  load(options, [&o](auto& archive) { o.serialize(archive); });
  return std::make_unique<Optimizer>(std::move(params), o);
}

LocalOptimizerPtr create(
    const std::string& kind,
    const std::string& options,
    const std::vector<RRef<at::Tensor>>& params) {
  auto local = std::make_shared<LocalOptimizer>();
  for (const auto& p : params) {
    local->params.push_back(*p.local_value());
  }
  using namespace torch::optim;
  if (kind == "SGD") {
    local->optimizer = make<SGD, SGDOptions>(options, local->params);
  } else if (kind == "Adam") {
    local->optimizer = make<Adam, AdamOptions>(options, local->params);
  } else if (kind == "AdamW") {
    local->optimizer = make<AdamW, AdamWOptions>(options, local->params);
  } else if (kind == "Adagrad") {
    local->optimizer = make<Adagrad, AdagradOptions>(options, local->params);
  } else if (kind == "RMSprop") {
    local->optimizer = make<RMSprop, RMSpropOptions>(options, local->params);
  } else {
    throw InvalidArgument(
        "no optimizer '" + kind +
        "'; the distributed optimizer knows SGD, Adam, AdamW, Adagrad and "
        "RMSprop");
  }
  return local;
}

// The context's gradients as the parameters' .grad for one step; their own
// .grad back afterwards.
void step(LocalOptimizer& o, int64_t context_id) {
  dist_autograd::Gradients grads = dist_autograd::get_gradients(context_id);
  std::lock_guard lock(o.mutex);
  std::vector<at::Tensor> own;
  for (auto& p : o.params) {
    own.push_back(p.grad());
    p.mutable_grad() = grads.at(p);
  }
  auto restore = [&] {
    for (size_t i = 0; i < o.params.size(); ++i) {
      o.params[i].mutable_grad() = own[i];
    }
  };
  try {
    o.optimizer->step();
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

}  // namespace

void register_optimizer_functions() {
  register_global_function(kCreateFn, &create);
  using Ptr = LocalOptimizerPtr;
  register_method_of<Ptr>(
      "step", [](Ptr& o, int64_t context_id) { step(*o, context_id); });
  register_method_of<Ptr>("zero_grad", [](Ptr& o, int64_t context_id) {
    std::lock_guard lock(o->mutex);
    dist_autograd::zero_gradients(context_id, o->params);
  });
  register_method_of<Ptr>("set_lr", [](Ptr& o, double lr) {
    std::lock_guard lock(o->mutex);
    for (auto& group : o->optimizer->param_groups()) {
      group.options().set_lr(lr);
    }
  });
  register_method_of<Ptr>("lr", [](Ptr& o) {
    std::lock_guard lock(o->mutex);
    return o->optimizer->param_groups().at(0).options().get_lr();
  });
  register_method_of<Ptr>("state_dict", [](Ptr& o) {
    std::lock_guard lock(o->mutex);
    return save([&o](auto& archive) { o->optimizer->save(archive); });
  });
  register_method_of<Ptr>("load_state_dict", [](Ptr& o, std::string bytes) {
    std::lock_guard lock(o->mutex);
    load(bytes, [&o](auto& archive) { o->optimizer->load(archive); });
  });
}

struct DistributedOptimizerImpl {
  std::vector<std::string> owners;
  std::vector<RRef<LocalOptimizerPtr>> optimizers;

  template <typename R>
  using Results = std::vector<std::conditional_t<std::is_void_v<R>, bool, R>>;

  // Starts call(i) for every owner i at once and waits for all; throws
  // DistributedOptimizerError naming each owner that failed.
  template <typename R, typename Call>
  Results<R> gather(const std::string& what, Call call) const {
    std::vector<Future<R>> pending;
    for (size_t i = 0; i < optimizers.size(); ++i) {
      pending.push_back(call(i));
    }
    Results<R> out;
    std::vector<std::pair<std::string, std::exception_ptr>> failures;
    std::string why;
    for (size_t i = 0; i < pending.size(); ++i) {
      try {
        RpcAgent& agent = rref_agent(*optimizers[i].node());
        if constexpr (std::is_void_v<R>) {
          agent.wait(pending[i]);
          out.push_back(true);
        } else {
          out.push_back(agent.wait(pending[i]));
        }
      } catch (const std::exception& e) {
        failures.emplace_back(owners[i], std::current_exception());
        why += (why.empty() ? "" : "; ") + owners[i] + ": " + e.what();
      }
    }
    if (!failures.empty()) {
      std::string message = "DistributedOptimizer " + what + " failed on " +
                            std::to_string(failures.size()) + " of " +
                            std::to_string(pending.size()) + " owners: " + why;
      throw DistributedOptimizerError(message, std::move(failures));
    }
    return out;
  }

  // `method`(args...) on every owner's optimizer.
  template <typename R, typename... A>
  Results<R> on_all(const std::string& method, const A&... args) const {
    return gather<R>(method, [&](size_t i) {
      return optimizers[i].rpc_async().template call<R>(method, args...);
    });
  }
};

}  // namespace detail

namespace {

template <typename Options>
std::unique_ptr<detail::DistributedOptimizerImpl> make_impl(
    const std::vector<RRef<at::Tensor>>& params,
    const std::string& kind,
    const Options& options) {
  if (params.empty()) {
    throw InvalidArgument("a DistributedOptimizer needs parameters");
  }
  dist_autograd::enable();
  std::string archive =
      detail::save([&options](auto& a) { options.serialize(a); });
  std::map<int, std::vector<RRef<at::Tensor>>> by_owner;
  for (const auto& p : params) {
    by_owner[p.owner().id].push_back(p);
  }
  RpcAgent& agent = detail::rref_agent(*params.front().node());
  auto impl = std::make_unique<detail::DistributedOptimizerImpl>();
  // This worker's own optimizer last: step() runs it here, after sending
  // the others theirs.
  int self = agent.get_worker_info().id;
  if (auto mine = by_owner.extract(self)) {
    by_owner.emplace(std::numeric_limits<int>::max(), std::move(mine.mapped()));
  }
  for (const auto& [owner, mine] : by_owner) {
    std::string name = mine.front().owner_name();
    impl->owners.push_back(name);
    impl->optimizers.push_back(agent.remote<detail::LocalOptimizerPtr>(
        name, detail::kCreateFn, kind, archive, mine));
  }
  impl->on_all<double>("lr");  // made everywhere, or why not
  return impl;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(
    const std::vector<RRef<at::Tensor>>& params,
    const torch::optim::SGDOptions& options)
    : impl_(make_impl(params, "SGD", options)) {}
DistributedOptimizer::DistributedOptimizer(
    const std::vector<RRef<at::Tensor>>& params,
    const torch::optim::AdamOptions& options)
    : impl_(make_impl(params, "Adam", options)) {}
DistributedOptimizer::DistributedOptimizer(
    const std::vector<RRef<at::Tensor>>& params,
    const torch::optim::AdamWOptions& options)
    : impl_(make_impl(params, "AdamW", options)) {}
DistributedOptimizer::DistributedOptimizer(
    const std::vector<RRef<at::Tensor>>& params,
    const torch::optim::AdagradOptions& options)
    : impl_(make_impl(params, "Adagrad", options)) {}
DistributedOptimizer::DistributedOptimizer(
    const std::vector<RRef<at::Tensor>>& params,
    const torch::optim::RMSpropOptions& options)
    : impl_(make_impl(params, "RMSprop", options)) {}

DistributedOptimizer::~DistributedOptimizer() = default;

void DistributedOptimizer::step(int64_t context_id) {
  impl_->gather<void>("step", [&](size_t i) {
    const auto& o = impl_->optimizers[i];
    if (!o.is_owner()) {
      return o.rpc_async().call<void>("step", context_id);
    }
    try {
      detail::step(**o.local_value(), context_id);  // no round trip to self
      return Future<void>::make_ready();
    } catch (...) {
      return Future<void>::make_failed(std::current_exception());
    }
  });
}

void DistributedOptimizer::zero_grad(int64_t context_id) {
  impl_->on_all<void>("zero_grad", context_id);
}

void DistributedOptimizer::set_lr(double lr) {
  impl_->on_all<void>("set_lr", lr);
}

double DistributedOptimizer::lr() const {
  return impl_->on_all<double>("lr").front();
}

std::map<std::string, std::string> DistributedOptimizer::state_dict() const {
  auto states = impl_->on_all<std::string>("state_dict");
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < states.size(); ++i) {
    out[impl_->owners[i]] = std::move(states[i]);
  }
  return out;
}

void DistributedOptimizer::load_state_dict(
    const std::map<std::string, std::string>& state) {
  for (const auto& owner : impl_->owners) {
    if (!state.contains(owner)) {
      throw InvalidArgument(
          "load_state_dict: no state for owner '" + owner + "'");
    }
  }
  impl_->gather<void>("load_state_dict", [&](size_t i) {
    return impl_->optimizers[i].rpc_async().call<void>(
        "load_state_dict", state.at(impl_->owners[i]));
  });
}

std::vector<std::string> DistributedOptimizer::owners() const {
  return impl_->owners;
}

StepLR::StepLR(DistributedOptimizer& optimizer, int64_t step_size, double gamma)
    : optimizer_(optimizer),
      step_size_(step_size),
      gamma_(gamma),
      base_lr_(optimizer.lr()),
      lr_(base_lr_) {
  if (step_size < 1) {
    throw InvalidArgument(
        "StepLR step_size must be at least 1, got " +
        std::to_string(step_size));
  }
}

void StepLR::step() {
  ++epoch_;
  double lr =
      base_lr_ * std::pow(gamma_, static_cast<double>(epoch_ / step_size_));
  if (lr != lr_) {
    optimizer_.set_lr(lr);
    lr_ = lr;
  }
}

}  // namespace tide::rpc
